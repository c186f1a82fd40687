"""Local stacks of real processes for the demo, the tests and the benchmarks (not used by `serve`).

procs.py         starting and stopping child processes by pid; nats-server and Envoy
envoy_config.py  rendering the Envoy templates in `envoy/` (package data, what `extproc
                 envoy-config` prints)
stack.py         Envoy + the picker + mock workers, as a user runs them
groups.py        router groups, a top-level picker and Envoy as child processes
demo.py          `extproc demo`: KV routing against round robin on that stack
"""
