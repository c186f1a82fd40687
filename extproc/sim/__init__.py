"""Simulated LLM engine: timing model, block-level prefix cache, vLLM-style scheduler core, the
OpenAI-compatible mock worker that drives them in real time (`python -m extproc mock-worker`), and
the trace replayer that drives them in virtual time with the real router (`python -m extproc replay`)."""
