"""Mutation score of the routing core, the request parser and the Envoy answers (issue 19).

Runs mutmut 3 (`pip install mutmut==3.8.1` into the venv; it is in no extra: it is slow and CI does
not run it) on one module at a time, against that module's own fast tests, and prints one JSON
object on stdout (progress on stderr):

    .venv/bin/python benchmarks/mutation.py                       # every module
    .venv/bin/python benchmarks/mutation.py router/selection.py epp/answers.py
    .venv/bin/python benchmarks/mutation.py --ref HEAD router/queue.py  # a commit, not the tree
    .venv/bin/python benchmarks/mutation.py --report              # count the last run again
    .venv/bin/python benchmarks/mutation.py --list                # the modules and their tests

Each module gets its own work directory, `mutants/<module>/` (git-ignored): a copy of `extproc/`,
`tests/` and `pyproject.toml` whose `[tool.mutmut]` is the repository's plus this module's
`only_mutate` and test selection (`MODULES` below). mutmut copies that again into its own
`mutants/` there, mutates every function of the module (mutmut 3 does not mutate module-level
constants), records which of the selected tests call which function, and runs for each mutant the
tests that reach its function, fastest first, stopping at the first failure. Its output goes to
`mutmut.log` there; `mutmut show NAME` and `mutmut browse` work in that directory afterwards. A
second run keeps the killed mutants of functions that did not change and tests the survivors again
(against the tests as they are now); `--fresh` starts over.

Per module the JSON gives `mutants` (all generated), `killed` (a test failed), `timeouts` (the
tests ran past 15x their clean time: the mutant loops, which a test notices too), `survived`
(tests passed, or no selected test reaches the function), `equivalent` (survivors listed in
`EQUIVALENT` with the reason they cannot change behaviour) and
`score = (killed + timeouts) / (mutants - equivalent)`, with the names of the survivors left.
An `EQUIVALENT` entry names the mutant and the line it writes (the `+` line of `mutmut show`): if
the module changed so that the name now means another mutation, the entry is reported under
`stale_equivalents` and not counted. The classes of equivalent mutants: `EQUIVALENT_CLASSES`.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "mutants"

# module (under extproc/) -> the tests it is measured against. Router modules: the router's own
# fast tests, tests/router (mutmut runs for a mutant only those that reach the mutated function),
# without test_radix's two brute-force property tests (300 examples, ~7 s a run: with them the radix
# tree's 1,196 mutants take hours on two cores). The parser and the answers: their unit tests (the
# gRPC service tests in tests/epp reach the answers too, at seconds a run).
_ROUTER_TESTS = [
    "tests/router",
    "--deselect",
    "tests/router/test_radix.py::test_long_runs_split_and_merge_like_the_brute_force_model",
    "--deselect",
    "tests/router/test_radix.py::test_radix_tree_agrees_with_brute_force_and_rebuilds_from_its_dump",
]
_ROUTER_MODULES = [
    "__init__", "aic", "approx", "arrivals", "config", "device_share", "disagg", "errors", "hashing",
    "load_order", "pass_time", "prefill_model", "queue", "radix", "radix_dump", "radix_lookup", "radix_names",
    "reported",
    "router",
    "selection",
    "sequences", "sessions", "tiers", "ttl_table", "types",
]  # fmt: skip
MODULES: dict[str, list[str]] = {
    **{f"router/{name}.py": _ROUTER_TESTS for name in _ROUTER_MODULES},
    # the block-hash prefix cache's exactness tests live with the picker that feeds it PromptTokens
    "router/hashing.py": [*_ROUTER_TESTS, "tests/picker/test_hash_prefix_cache.py"],
    "request/parse.py": [
        "tests/request/test_parse.py",
        "tests/request/test_parse_mutants.py",
        "tests/request/test_body_prefixes.py",
    ],
    # a body parsed past what a recent one shared: compared with json.loads, errors included
    "request/body_prefixes.py": ["tests/request/test_body_prefixes.py"],
    # the Responses and Messages APIs as vLLM renders them (checked against vLLM's own code)
    "request/responses.py": ["tests/request/test_responses.py", "tests/request/test_responses_mutants.py"],
    "request/anthropic.py": ["tests/request/test_anthropic.py", "tests/request/test_anthropic_mutants.py"],
    "request/json_type.py": ["tests/request/test_parse.py", "tests/request/test_parse_mutants.py"],
    "epp/answers.py": ["tests/epp/test_answers.py", "tests/epp/test_answers_mutants.py"],
    # the Inference Extension's resources an operator mounts: checked as the CRDs check them, and
    # what a request's objective and model become (priorities, rewrite rules, weighted targets)
    "config/inference_extension.py": [
        "tests/config/test_inference_extension.py",
        "tests/config/test_inference_extension_mutants.py",
        "tests/fuzz/test_inference_resources_fuzz.py",
    ],
    "picker/inference_extension.py": [
        "tests/picker/test_inference_extension.py",
        "tests/picker/test_inference_extension_mutants.py",
    ],
    # the picker's loop: held sockets (real sockets), lazy timers, the selector's arithmetic
    "runtime/wakeups.py": ["tests/runtime/test_wakeups.py"],
    # the gRPC-over-HTTP/2 server Envoy's ext_proc streams reach (frames, flow control, limits)
    "runtime/h2_server.py": ["tests/runtime/test_h2_server.py", "tests/runtime/test_h2_server_edges.py"],
    # the KV events of Dynamo deployments: its router guide's JSON and its 1.6.1 event plane
    "events/dynamo_json.py": [
        "tests/nats/test_dynamo_json.py",
        "tests/fuzz/test_dynamo_fuzz.py",
        "tests/nats/test_dynamo_jetstream.py",
    ],
    "events/dynamo_plane.py": [
        "tests/nats/test_dynamo_plane.py",
        "tests/events/test_tier_fixtures.py",
        "tests/fuzz/test_dynamo_fuzz.py",
        "tests/nats/test_dynamo_local_indexer_plane.py",
        "tests/nats/test_dynamo_zmq_plane.py",
    ],
    # what every transport of Dynamo's events does with them: the event-id check, restarts, the gate
    "events/dynamo_intake.py": [
        "tests/events/test_dynamo_intake.py",
        "tests/nats/test_dynamo_plane.py",
        "tests/nats/test_nats_subscriber_edges.py",
        "tests/nats/test_nats_events.py",
        "tests/events/test_backpressure.py",
        "tests/nats/test_durable.py",
        "tests/nats/test_dynamo_runtime.py",
        "tests/nats/test_dynamo_zmq_plane.py",
        "tests/nats/test_dynamo_recovery.py",
        "tests/nats/test_dynamo_recovery_merge.py",
    ],
    # Dynamo 1.6.1's ZMQ event plane: direct publishers from its file store, brokers
    "events/dynamo_zmq_plane.py": ["tests/nats/test_dynamo_zmq_plane.py"],
    # Dynamo's durable KV events: the JetStream log, object-store snapshots, the snapshot lock
    "events/durable.py": [
        "tests/nats/test_durable.py",
        "tests/nats/test_durable_edges.py",
        "tests/nats/test_relearn.py",
        "tests/nats/test_dynamo_jetstream.py",
    ],
    # Dynamo 1.6.1's local indexers: the query on its request plane, and the merge with the live stream
    "events/dynamo_recovery.py": [
        "tests/nats/test_dynamo_recovery_wire.py",
        "tests/nats/test_dynamo_recovery_merge.py",
        "tests/nats/test_dynamo_recovery_edges.py",
        "tests/nats/test_dynamo_recovery.py",
        "tests/nats/test_dynamo_zmq_plane.py",
    ],
    # vLLM's and SGLang's ZMQ KV events (golden fixtures from their published code)
    "events/vllm.py": [
        "tests/events/test_vllm_decode.py",
        "tests/events/test_engine_fixtures.py",
        "tests/events/test_tier_fixtures.py",
        "tests/fuzz/test_vllm_fuzz.py",
        "tests/events/test_engine_releases.py",
    ],
    # SGLang's session calls on the worker a session uses (golden fixture from SGLang 0.5.23's code)
    "picker/worker_sessions.py": [
        "tests/picker/test_worker_sessions.py",
        "tests/picker/test_worker_sessions_edges.py",
    ],
    # the admission queue's async edge: waiting requests decided when capacity frees, cancels undone
    # the ext_proc stream: phases, the one free per request, errors, cancelled streams, responses
    "epp/service.py": [
        "tests/epp/test_service.py",
        "tests/epp/test_service_responses.py",
        "tests/epp/test_service_output_blocks.py",
        "tests/epp/test_service_lifecycle_edges.py",
        "tests/epp/test_service_request_edges.py",
        "tests/epp/test_service_output_edges.py",
        "tests/epp/test_service_asked_model.py",
        "tests/epp/test_service_objective_metrics.py",
        "tests/epp/test_service_scheduler_metrics.py",
        "tests/epp/test_service_forms.py",
        "tests/epp/test_service_realtime.py",
        "tests/epp/test_limits.py",
        "tests/fuzz/test_ext_proc_fuzz.py",
    ],
    # chat templates rendered as vLLM 0.33 renders them (message preparation, transformers' sandbox)
    "request/chat_template.py": [
        "tests/request/test_chat_template_messages.py",
        "tests/request/test_chat_template_render.py",
        "tests/request/test_tokenizer.py",
        "tests/request/test_tokenizer_conformance.py",
        "tests/request/test_piecewise.py",
    ],
    # LoRA adapters read from the workers' /v1/models (the engines' recorded answers)
    "runtime/lora_discovery.py": [
        "tests/runtime/test_lora_discovery.py",
        "tests/picker/test_model_aliases.py",
    ],
    # the rounds engine metrics and LoRA discovery read the workers in
    "runtime/rounds.py": ["tests/runtime/test_lora_discovery.py", "tests/runtime/test_engine_metrics.py"],
    "picker/admission.py": [
        "tests/picker/test_admission.py",
        "tests/picker/test_admission_edges.py",
        "tests/picker/test_flow_metrics.py",  # its passage recorded for the flow-control series
    ],
    # the Inference Extension's flow-control series, kept by the admission queue
    "picker/flow_metrics.py": [
        "tests/picker/test_flow_metrics.py",
        "tests/epp/test_service_scheduler_metrics.py",
    ],
    # output tokens counted from responses as they stream (OpenAI SSE and JSON, Responses, Messages)
    "epp/output_tokens.py": ["tests/epp/test_output_tokens.py", "tests/epp/test_output_tokens_edges.py"],
    # the engine's token counts read from answers (vLLM's and SGLang's bytes, cut anywhere)
    "epp/usage.py": ["tests/epp/test_usage.py"],
    # the Inference Extension's per-request series, as the servicer keeps them
    "epp/objective_metrics.py": [
        "tests/epp/test_service_objective_metrics.py",
        "tests/epp/test_service_scheduler_metrics.py",  # time to first token and per output token
    ],
    # the Inference Extension's scheduler and prefix-match series, as the servicer keeps them
    "epp/scheduler_metrics.py": ["tests/epp/test_service_scheduler_metrics.py"],
    # a rewritten request's answer: the asked model said again in every chunk
    "epp/asked_model.py": ["tests/epp/test_asked_model.py", "tests/epp/test_service_asked_model.py"],
    # an audio upload's form read for its model field, as the engines' parser reads it
    "request/form.py": ["tests/request/test_form.py", "tests/epp/test_service_forms.py"],
    # the local router group: candidates, disaggregated pairs, preferred workers, request ids, set_workers
    "picker/local_group.py": [
        "tests/picker/test_local_group.py",
        "tests/picker/test_local_group_workers.py",
        "tests/picker/test_local_group_decisions.py",
        # prefill workers' health, through the picker's own LocalGroup
        "tests/picker/test_disagg.py::test_an_unhealthy_prefill_worker_is_not_named_until_it_answers_again",
        "tests/groups/test_selector.py",
        "tests/groups/test_features_in_groups.py",
        # --kv-indexer-url: decisions with Dynamo 1.6.1's own indexer's overlaps
        "tests/picker/test_local_group_indexer.py",
    ],
    # request bodies parsed on the loop or in worker processes, chats' shared turns, dead workers
    "picker/body_parser.py": ["tests/picker/test_body_parser.py", "tests/picker/test_body_parser_edges.py"],
    # what the groups are handed: the prompt limit, a long prompt's ids, overrides and hints
    "picker/group_request.py": [
        "tests/picker/test_pipeline.py",
        "tests/picker/test_pipeline_requests.py",
        "tests/picker/test_aic_and_n.py",
        "tests/picker/test_hash_prefix_cache.py",
        "tests/epp/test_service_output_blocks.py",
        "tests/picker/test_lora_adapters.py",
    ],
    # follow-ups waiting, bounded, for another replica's word on their answer's worker
    "picker/home_waits.py": ["tests/picker/test_home_waits.py", "tests/picker/test_route_share.py"],
    # the one decision pipeline: parse, model, restrictions, tokens, groups, sessions, request ids
    "picker/pipeline.py": [
        "tests/picker/test_pipeline.py",
        "tests/picker/test_pipeline_requests.py",
        "tests/picker/test_pipeline_lifecycle.py",
        "tests/picker/test_sessions.py",
        "tests/picker/test_untracked.py",
        "tests/picker/test_outlier.py",
        "tests/picker/test_aic_and_n.py",
        "tests/picker/test_response_homes.py",
        "tests/picker/test_route_share.py",
        "tests/picker/test_worker_sessions.py",
        "tests/picker/test_disagg.py",
        "tests/picker/test_hash_prefix_cache.py",
        "tests/picker/test_lora_adapters.py",
        "tests/picker/test_model_aliases.py",
        "tests/picker/test_request_histograms.py",
        "tests/runtime/test_lora_discovery.py",
        "tests/epp/test_service.py",
        "tests/epp/test_service_responses.py",
        "tests/epp/test_service_output_blocks.py",
        "tests/epp/test_service_objective_metrics.py",
        "tests/epp/test_service_asked_model.py",
        "tests/epp/test_limits.py",
        "tests/groups/test_picker_groups.py",
        "tests/groups/test_features_in_groups.py",
        "tests/fuzz/test_session_fuzz.py",
        "tests/fuzz/test_path_fuzz.py",
        # mutual TLS to remote groups
        "tests/runtime/test_tls.py::test_the_group_api_shares_the_servers_mutual_tls",
        # the routes replica sync shares: two pickers over a real nats-server
        "tests/nats/test_replica_sync_routes.py",
    ],
    # the workers' KV events over NATS: Dynamo's subjects, gaps and recovery, relearning, overflow
    "events/nats_events.py": [
        "tests/nats/test_nats_link_edges.py",
        "tests/nats/test_nats_publisher_edges.py",
        "tests/nats/test_nats_subscriber_edges.py",
        "tests/nats/test_nats_events.py",
        "tests/nats/test_relearn.py",
        "tests/nats/test_dynamo_recovery.py",
        "tests/nats/test_fault.py",
        "tests/nats/test_backpressure.py",
        "tests/events/test_backpressure.py",
        "tests/nats/test_durable.py",
        "tests/nats/test_dynamo_plane.py",
        "tests/nats/test_nats_reads.py",
        "tests/nats/test_picker_nats.py",
        "tests/nats/test_nats_security.py",
        "tests/nats/test_dynamo_recovery_merge.py",
        "tests/nats/test_dynamo_recovery_wire.py",
        "tests/nats/test_dynamo_runtime.py",
        "tests/fuzz/test_dynamo_fuzz.py",
        "tests/nats/test_dynamo_jetstream.py",
        "tests/nats/test_dynamo_local_indexer_plane.py",
    ],
    # request bodies parsed in worker processes: the pool, its limits, a dead worker replaced
    "picker/parse_worker.py": [
        "tests/picker/test_parse_worker_in_process.py",
        "tests/picker/test_body_parser.py",
        "tests/picker/test_body_parser_edges.py",
    ],
    # prompts tokenized as the engine tokenizes them (the real Qwen3 and Llama 3.1 tokenizers)
    "request/tokenizer.py": [
        "tests/request/test_tokenizer_hf_edges.py",
        "tests/request/test_tokenizer_request_edges.py",
        "tests/request/test_tokenizer.py",
        "tests/request/test_tokenizer_conformance.py",
        "tests/request/test_piecewise.py",
        "tests/request/test_piecewise_exactness.py",
        "tests/request/test_piece_cache_config.py",
        "tests/request/test_prompt_prefixes.py",
        "tests/request/test_token_cache.py",
        "tests/request/test_anthropic.py",
        "tests/request/test_chat_template_messages.py",
        "tests/request/test_chat_template_render.py",
        "tests/picker/test_pipeline_requests.py",
    ],
    # replica sync: the wire format, sequences and gaps, leases, digests, batches, message by
    # message; and over a real nats-server, start and stop, an overflow, a catch-up before a decision
    "events/replica_sync.py": [
        "tests/nats/test_replica_sync_protocol.py",
        "tests/nats/test_replica_sync_batch.py",
        "tests/nats/test_replica_sync_edges.py",
        "tests/nats/test_replica_sync.py",
        "tests/fuzz/test_replica_sync_fuzz.py",
        (
            "tests/nats/test_backpressure.py::test_dropped_replica_sync_messages_forget_the_other_replicas_r"
            "equests"
        ),
        (
            "tests/nats/test_nats_reads.py::test_a_replica_about_to_decide_applies_what_already_waits_in_its"
            "_held_socket"
        ),
        "tests/nats/test_replica_sync_disagg.py",
        "tests/nats/test_replica_sync_routes.py",
        "tests/nats/test_replica_sync_handover.py",
    ],
    # routes handed over to a replica that was not listening: whom to ask, the answer's parts, checks
    "events/route_catchup.py": [
        "tests/nats/test_replica_sync_handover.py",
        "tests/picker/test_route_share.py",
    ],
    # replica sync's messages on the wire: formats, the digest, checks of values read
    "events/replica_wire.py": [
        "tests/nats/test_replica_sync_protocol.py",
        "tests/nats/test_replica_sync_batch.py",
        "tests/nats/test_replica_sync_edges.py",
        "tests/fuzz/test_replica_sync_fuzz.py",
        "tests/nats/test_replica_sync_disagg.py",
        "tests/nats/test_replica_sync_routes.py",
    ],
    # durable mode's snapshot codec, and reading the snapshot from the object store (real nats-server)
    "events/snapshot.py": ["tests/nats/test_snapshot.py", "tests/fuzz/test_snapshot_fuzz.py"],
    "events/object_read.py": ["tests/nats/test_object_read.py", "tests/nats/test_durable.py"],
    "runtime/heap.py": ["tests/runtime/test_heap.py"],
    # --kv-indexer-url: the client and registrar, against Dynamo 1.6.1's own indexer
    "events/kv_indexer.py": ["tests/events/test_kv_indexer.py"],
    # vLLM's and SGLang's ZMQ events: one subscriber per worker dp rank, replay, backpressure (a first
    # run, session 35, stopped at 568 of 1,066: 222 survivors then, many in the gap paths that
    # test_zmq_gaps.py now reads; the mutants of the reconnect loop time out one by one, so the run
    # needs an hour or more on two cores: no table row yet)
    "events/zmq_subscriber.py": [
        "tests/events/test_zmq.py",
        "tests/events/test_zmq_state.py",
        "tests/events/test_zmq_gaps.py",
        "tests/events/test_backpressure.py",
        "tests/events/test_worker_set.py",
        "tests/events/test_engine_releases.py",
    ],
    # piecewise encoding: a chat prompt's ids from its pieces' cached ids, and when that is exact (first
    # runs, session 35: 72.8 % of 477 over its first three test files, 78.0 % with the next three, 86.2 %
    # with test_piece_splitter.py; session 36: 100 % of 492 with test_piecewise_guards.py)
    "request/piecewise.py": [
        "tests/request/test_piecewise.py",
        "tests/request/test_piecewise_exactness.py",
        "tests/request/test_piece_cache_config.py",
        "tests/request/test_prompt_prefixes.py",
        "tests/request/test_tokenizer_hf_edges.py",
        "tests/request/test_tokenizer_request_edges.py",
        "tests/request/test_piece_splitter.py",
        "tests/request/test_piecewise_guards.py",
    ],
    # the groups' ranking: max-overlap with its near-ties, min-cost, weighted (first run, session 36: 84.6 %
    # of 91; 100 % with three tests of test_policy.py)
    "groups/policy.py": [
        "tests/groups/test_api.py",
        "tests/groups/test_codec.py",
        "tests/groups/test_policy.py",
        "tests/groups/test_selector.py",
        "tests/groups/test_selector_edges.py",
        "tests/groups/test_remote_edges.py",
        "tests/groups/test_features_in_groups.py",
    ],
    # workers from a headless Service's DNS records and the config file, while the picker runs (first run,
    # session 36: 63.1 % of 450; 99.6 % with test_discovery_edges.py; 2 survivors: a resolver given a server
    # that also reads the host's resolv.conf, which this host's (no search domains) cannot show, and no
    # slack for the periodic step's lazy sleep, which only the picker's own event loop would trip on)
    "runtime/discovery.py": [
        "tests/k8s/test_discovery_dns.py",
        "tests/k8s/test_discovery_edges.py",
        "tests/k8s/test_config_reload.py",
        "tests/events/test_worker_set.py",
    ],
    # another picker's group API as a router group: calls with deadlines, gRPC failures, leases, renewals
    # and background lifecycle calls with retries (first run, session 36: 62.1 % of 435; 99.5 % of 436 with
    # test_remote_edges.py and the TLS tests; 2 survivors: the channel's options dropped, which only an
    # answer over gRPC's 4 MB default or the reconnect timing would show, and a KeyError a freed request's
    # output-tokens task would raise into a `drain` that swallows it)
    "groups/remote.py": [
        "tests/groups/test_api.py",
        "tests/groups/test_features_in_groups.py",
        "tests/groups/test_selector.py",
        "tests/groups/test_processes.py",
        "tests/groups/test_codec.py",
        "tests/groups/test_remote_edges.py",
        "tests/runtime/test_tls.py",  # the group API over TLS
    ],
    # router groups: probe, rank, commit and own each request, ejection and the fallback group (first run,
    # session 36: 66.0 % of 758; 100 % with test_selector_edges.py)
    "groups/selector.py": [
        "tests/groups/test_selector.py",
        "tests/groups/test_selector_edges.py",
        "tests/groups/test_picker_groups.py",
        "tests/groups/test_features_in_groups.py",
        "tests/groups/test_policy.py",
        "tests/groups/test_api.py",
        "tests/groups/test_n_in_groups.py",
    ],
    # every transport's sink: events to each worker's router, and each worker's cache source
    "events/feed.py": [
        "tests/events/test_feed.py",
        "tests/events/test_feed_edges.py",
        "tests/events/test_backpressure.py",
        "tests/events/test_resync_wiring.py",
        "tests/events/test_worker_set.py",
        "tests/runtime/test_readiness.py",
    ],
    # transport security: gRPC and NATS credentials from the TLS settings, self-signed certificates
    "runtime/tls.py": [
        "tests/runtime/test_tls.py",
        "tests/runtime/test_tls_edges.py",
        "tests/runtime/test_h2_server.py",
        "tests/config/test_load.py",
        "tests/nats/test_nats_security.py",  # NATS's client context
        "tests/nats/test_nats_security_edges.py",
    ],
    # NATS authentication and TLS: credentials, nkeys, tokens, user and password, the server's certificate
    "events/nats_security.py": [
        "tests/nats/test_nats_security.py",
        "tests/nats/test_nats_security_edges.py",
        "tests/config/test_load.py",
    ],
    # the admin HTTP server: metrics, health and readiness, busy thresholds (auth), debug views (first run,
    # session 37: 70.6 % of 833; 100 % with test_admin_views.py)
    "admin/api.py": [
        "tests/admin/test_api.py",
        "tests/admin/test_admin_views.py",
        "tests/admin/test_dynamo_metrics.py",
        "tests/admin/test_inference_extension_metrics.py",
        "tests/fuzz/test_admin_fuzz.py",
        "tests/picker/test_lora_adapters.py",
        "tests/picker/test_model_aliases.py",
        "tests/picker/test_aic_and_n.py",
        "tests/router/test_reported.py",
        "tests/runtime/test_engine_metrics.py",
        "tests/runtime/test_shutdown.py",
    ],
}

EQUIVALENT_CLASSES = {
    "message": "only the text of an exception message or log line changes (no test reads prose)",
    "same-value": "the mutated expression computes the same value for every input it can receive",
    "performance": "only the work done changes (a clean-up runs sooner, bytes are copied, not viewed)",
    "wire": (
        "the bytes sent change only where the protocol has every receiver read them alike: a flag the "
        "frame type does not define (RFC 9113 4.1: ignored) or Huffman coding of a header literal "
        "(RFC 7541 5.2)"
    ),
    "random": "a value drawn at random is drawn from another range, every value of which works alike",
    "margin": (
        "a safety margin against float rounding in a fleet-sized decision's bound moves by at most a "
        "microsecond or 2e-9 of the bound, or a comparison with a continuous threshold turns strict "
        "or not: a result can change only where a float lands that close to (or exactly on) the edge, "
        "and for a bound only if it also ties the best cost; no test can place a float so exactly"
    ),
}
# module -> mutant (its name without the module's dotted path) -> (the line it writes, class, why it
# cannot change behaviour)
# BlockHashCache._store's live counts, since a prompt takes over the cached prompt it extends
WHY_LIVE = (
    "a prompt that extends all of a cached one takes it over and forgets it; no record is left by "
    "every key otherwise in practice, so the live count only frees one before the LRU would, within "
    "the same byte bound"
)
EQUIVALENT: dict[str, dict[str, tuple[str, str, str]]] = {
    "events/kv_indexer.py": {
        "xǁKvIndexerClientǁ__init____mutmut_16": (
            "self._failures_unlogged = None",
            "same-value",
            "read only by a truth test before the first report sets it to 0: None is as false as 0",
        ),
        "xǁKvIndexerClientǁ_request__mutmut_34": (
            'raise Refused(method, path, resp.status, raw[:201].decode(errors="replace"))',
            "message",
            "how much of an error answer's text the log line quotes",
        ),
        **{
            name: (line, "same-value", "aiohttp sends the method upper-cased, whatever case it is given")
            for name, line in (
                (
                    "xǁKvIndexerClientǁoverlaps__mutmut_29",
                    'answer = await self._request("post", "/query_by_hash", body)',
                ),
                (
                    "xǁKvIndexerClientǁregister__mutmut_25",
                    'return await self._request("post", "/register", body, conflict_ok=True) is not None',
                ),
                (
                    "xǁKvIndexerClientǁunregister__mutmut_15",
                    'await self._request("post", "/unregister", body, conflict_ok=True)',
                ),
                ("xǁKvIndexerClientǁworkers__mutmut_7", 'answer = await self._request("get", "/workers")'),
            )
        },
        "xǁKvIndexerRegistrarǁ_run__mutmut_1": (
            "failing = None",
            "same-value",
            "only truth-tested: None is as false as False",
        ),
        "xǁKvIndexerRegistrarǁ_run__mutmut_11": (
            "failing = None",
            "same-value",
            "only truth-tested: None is as false as False",
        ),
        **{
            name: (line, "message", "the task's name, seen only in a dump of the loop's tasks")
            for name, line in (
                (
                    "xǁKvIndexerRegistrarǁstart__mutmut_3",
                    "self._task = asyncio.get_running_loop().create_task(self._run(), name=None)",
                ),
                (
                    "xǁKvIndexerRegistrarǁstart__mutmut_5",
                    "self._task = asyncio.get_running_loop().create_task(self._run(), )",
                ),
                (
                    "xǁKvIndexerRegistrarǁstart__mutmut_6",
                    "self._task = asyncio.get_running_loop().create_task(self._run(), "
                    'name="XXkv-indexer-registrarXX")',
                ),
                (
                    "xǁKvIndexerRegistrarǁstart__mutmut_7",
                    "self._task = asyncio.get_running_loop().create_task(self._run(), "
                    'name="KV-INDEXER-REGISTRAR")',
                ),
            )
        },
    },
    "events/snapshot.py": {
        "x__decode_event__mutmut_43": (
            'raise ValueError("XXstored blocks list has an odd lengthXX")',
            "message",
            "an error's text",
        ),
        "x__encode_event__mutmut_15": (
            "raise TypeError(None)",
            "message",
            "an error's text",
        ),
        "x__encode_event__mutmut_16": (
            'raise TypeError(f"not a KV event: {type(None).__name__}")',
            "message",
            "an error's text",
        ),
        "x__encode_event__mutmut_6": (
            "flat = [1] * (2 * len(engine))",
            "same-value",
            "every slot of the list is overwritten by the two slice assignments below",
        ),
        "x__hashes__mutmut_15": (
            "if raw and (set(map(type, raw)) != {int} or min(raw) <= _I64_MIN or max(raw) > _U64_MAX):",
            "performance",
            "a hash at the bound enters the loop naming a bad one, which finds none: the same list returned",
        ),
        "x__hashes__mutmut_17": (
            "if raw and (set(map(type, raw)) != {int} or min(raw) < _I64_MIN or max(raw) >= _U64_MAX):",
            "performance",
            "a hash at the bound enters the loop naming a bad one, which finds none: the same list returned",
        ),
        "x__hashes__mutmut_3": (
            'raise ValueError("XXblock hashes are not a listXX")',
            "message",
            "an error's text",
        ),
        "x__hashes__mutmut_5": (
            "if raw or (set(map(type, raw)) != {int} or min(raw) < _I64_MIN or max(raw) > _U64_MAX):",
            "performance",
            "an empty list enters the naming loop, which has nothing to check",
        ),
        "x__hashes__mutmut_6": (
            "if raw and (set(map(type, raw)) != {int} or min(raw) < _I64_MIN and max(raw) > _U64_MAX):",
            "same-value",
            "msgpack decodes no integer below int64 or above uint64, so neither bound can be passed",
        ),
        "xǁSnapshotWriterǁ__init____mutmut_13": (
            "self._packer = msgpack.Packer(use_bin_type=None)",
            "same-value",
            "a snapshot holds no bytes values (ids are ints or strings), so use_bin_type changes no output",
        ),
        "xǁSnapshotWriterǁ__init____mutmut_14": (
            "self._packer = msgpack.Packer(use_bin_type=False)",
            "same-value",
            "a snapshot holds no bytes values (ids are ints or strings), so use_bin_type changes no output",
        ),
        "x__unpack__mutmut_10": (
            "return msgpack.unpackb(data, use_list=True, strict_map_key=True)",
            "same-value",
            "raw=False is msgpack's default",
        ),
        "x__unpack__mutmut_11": (
            "return msgpack.unpackb(data, raw=False, strict_map_key=True)",
            "same-value",
            "use_list=True is msgpack's default",
        ),
        "x__unpack__mutmut_12": (
            "return msgpack.unpackb(data, raw=False, use_list=True, )",
            "same-value",
            "strict_map_key=True is msgpack's default",
        ),
        "x__unpack__mutmut_17": (
            (
                "unpacker = msgpack.Unpacker(raw=None, use_list=True, strict_map_key=True, "
                "max_buffer_size=len(data))"
            ),
            "same-value",
            "raw=None is falsy: msgpack reads it as raw=False",
        ),
        "x__unpack__mutmut_2": (
            "if data or data[0] not in _MAP_HEADERS:",
            "performance",
            "every input goes to unpackb in one call: the same values or refusals, the loop held longer",
        ),
        "x__unpack__mutmut_21": (
            "unpacker = msgpack.Unpacker(use_list=True, strict_map_key=True, max_buffer_size=len(data))",
            "same-value",
            "raw=False is msgpack's default",
        ),
        "x__unpack__mutmut_22": (
            "unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=len(data))",
            "same-value",
            "use_list=True is msgpack's default",
        ),
        "x__unpack__mutmut_23": (
            "unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=len(data))",
            "same-value",
            "strict_map_key=True is msgpack's default",
        ),
        "x__unpack__mutmut_34": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x__unpack__mutmut_35": (
            'raise ValueError(f"{type(None).__name__} is not allowed for map key")',
            "message",
            "an error's text",
        ),
        "x__unpack__mutmut_39": (
            'if key != "events" and at < len(data) and data[at] in _ARRAY_HEADERS:',
            "performance",
            "which arrays are read item by item changes, not what they hold",
        ),
        "x__unpack__mutmut_40": (
            'if key == "XXeventsXX" and at < len(data) and data[at] in _ARRAY_HEADERS:',
            "performance",
            "the events array read in one call: the same value, the event loop held longer",
        ),
        "x__unpack__mutmut_41": (
            'if key == "EVENTS" and at < len(data) and data[at] in _ARRAY_HEADERS:',
            "performance",
            "the events array read in one call: the same value, the event loop held longer",
        ),
        "x__unpack__mutmut_42": (
            'if key == "events" and at <= len(data) and data[at] in _ARRAY_HEADERS:',
            "same-value",
            "at the data's end IndexError and msgpack's OutOfData both refuse it (decoding failed)",
        ),
        "x__unpack__mutmut_48": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x__unpack__mutmut_49": (
            'raise ValueError(f"extra data after the snapshot\'s map ({len(data) + unpacker.tell()} bytes)")',
            "message",
            "an error's text",
        ),
        "x__unpack__mutmut_6": (
            "return msgpack.unpackb(data, raw=None, use_list=True, strict_map_key=True)",
            "same-value",
            "raw=None is falsy: msgpack reads it as raw=False",
        ),
        "x_decode_snapshot__mutmut_47": (
            'raise SnapshotError("XXKV snapshot created_by/created_at_s have the wrong typesXX")',
            "message",
            "an error's text",
        ),
        "x_decode_snapshot__mutmut_48": (
            'raise SnapshotError("kv snapshot created_by/created_at_s have the wrong types")',
            "message",
            "an error's text",
        ),
        "x_decode_snapshot__mutmut_56": (
            'raise SnapshotError("XXKV snapshot events is not a listXX")',
            "message",
            "an error's text",
        ),
        "x_decode_snapshot__mutmut_57": (
            'raise SnapshotError("kv snapshot events is not a list")',
            "message",
            "an error's text",
        ),
    },
    "events/object_read.py": {
        "x__digest_bytes__mutmut_8": (
            'return b"XXXX"',
            "same-value",
            'an unreadable digest gives bytes that no 32-byte SHA-256 equals, b"" or not',
        ),
        "x_read_object__mutmut_36": (
            "if time.monotonic() - last_chunk_s > chunk_timeout_s:",
            "same-value",
            "> for >= between clock floats: equal only by coincidence, and then one check later",
        ),
    },
    "runtime/lora_discovery.py": {
        "x__names__mutmut_10": (
            "return f\"[{shown}{', ...' if len(names) > 11 else ''}]\"",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x__names__mutmut_11": (
            "return f\"[{shown}{', ...' if len(names) > 10 else 'XXXX'}]\"",
            "message",
            "an error's or a log line's text",
        ),
        "x__names__mutmut_3": (
            'shown = "XX, XX".join(loggable(n) for n in names[:10])',
            "message",
            "an error's or a log line's text",
        ),
        "x__names__mutmut_5": (
            'shown = ", ".join(loggable(n) for n in names[:11])',
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x__names__mutmut_6": (
            "return f\"[{shown}{', ...' if (len(names) > 10) and False else ''}]\"",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x__names__mutmut_7": (
            "return f\"[{shown}{', ...' if (len(names) > 10) or True else ''}]\"",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x__names__mutmut_8": (
            "return f\"[{shown}{'XX, ...XX' if len(names) > 10 else ''}]\"",
            "message",
            "an error's or a log line's text",
        ),
        "x__names__mutmut_9": (
            "return f\"[{shown}{', ...' if len(names) >= 10 else ''}]\"",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x_names_in__mutmut_13": (
            "raise ModelsInvalid(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_names_in__mutmut_14": (
            'raise ModelsInvalid("XXnot a model list: no `data` listXX")',
            "message",
            "an error's or a log line's text",
        ),
        "x_names_in__mutmut_15": (
            'raise ModelsInvalid("NOT A MODEL LIST: NO `DATA` LIST")',
            "message",
            "an error's or a log line's text",
        ),
        "x_names_in__mutmut_3": (
            "raise ModelsInvalid(None) from None",
            "message",
            "an error's or a log line's text",
        ),
        "x_names_in__mutmut_4": (
            'raise ModelsInvalid(f"not JSON: {str(None)[:80]}") from None',
            "message",
            "an error's or a log line's text",
        ),
        "x_names_in__mutmut_45": (
            'adapters[name] = ""',
            "same-value",
            "`names` and `adapters` are ordered sets: only their keys are read, never the values",
        ),
        "x_names_in__mutmut_47": (
            'served[name] = ""',
            "same-value",
            "`names` and `adapters` are ordered sets: only their keys are read, never the values",
        ),
        "x_names_in__mutmut_5": (
            'raise ModelsInvalid(f"not JSON: {str(exc)[:81]}") from None',
            "message",
            "an error's or a log line's text",
        ),
        "x_start_lora_discovery__mutmut_10": (
            "None)  # fmt: skip",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x_start_lora_discovery__mutmut_11": (
            "log.info(config.lora_interval_s,",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x_start_lora_discovery__mutmut_12": (
            'log.info("LoRA discovery: each worker\'s /v1/models every %g s (timeout %g s)", config.lora_timeout_s)  # fmt: skip',  # noqa: E501
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x_start_lora_discovery__mutmut_13": (
            ")  # fmt: skip",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x_start_lora_discovery__mutmut_14": (
            'log.info("XXLoRA discovery: each worker\'s /v1/models every %g s (timeout %g s)XX", config.lora_interval_s,',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_start_lora_discovery__mutmut_15": (
            'log.info("lora discovery: each worker\'s /v1/models every %g s (timeout %g s)", config.lora_interval_s,',  # noqa: E501
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x_start_lora_discovery__mutmut_16": (
            'log.info("LORA DISCOVERY: EACH WORKER\'S /V1/MODELS EVERY %G S (TIMEOUT %G S)", config.lora_interval_s,',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_start_lora_discovery__mutmut_8": (
            "log.info(None, config.lora_interval_s,",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "x_start_lora_discovery__mutmut_9": (
            'log.info("LoRA discovery: each worker\'s /v1/models every %g s (timeout %g s)", None,',
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_16": (
            'self._session, state.url, max_bytes=MAX_MODELS_BYTES, accept="XXapplication/jsonXX"',
            "message",
            "the Accept header's text: the engines answer /v1/models with JSON whatever it says",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_17": (
            'self._session, state.url, max_bytes=MAX_MODELS_BYTES, accept="APPLICATION/JSON"',
            "message",
            "the Accept header's text: the engines answer /v1/models with JSON whatever it says",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_23": (
            '"answers (logged again only when it does)", None,',
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_24": (
            "None, exc, len(state.names.served + state.names.adapters))  # fmt: skip",
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_32": (
            'log.warning("XXLoRA discovery: %s at %s: %s; its names as last read (%d) until it XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_33": (
            'log.warning("lora discovery: %s at %s: %s; its names as last read (%d) until it "',
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_35": (
            '"XXanswers (logged again only when it does)XX", ", ".join(sorted(state.workers)),',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_36": (
            '"ANSWERS (LOGGED AGAIN ONLY WHEN IT DOES)", ", ".join(sorted(state.workers)),',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_38": (
            '"answers (logged again only when it does)", "XX, XX".join(sorted(state.workers)),',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_4": (
            "self._session = bounded_session(self.config.lora_timeout_s, None)",
            "same-value",
            (
                "the `_slots` semaphore already holds reads to MAX_CONCURRENT_READS at once; the connector's"
                " limit is a second bound on the same number"
            ),
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_46": (
            'log.info("LoRA discovery: %s at %s answers again", None, state.url)',
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_47": (
            'log.info("LoRA discovery: %s at %s answers again", ", ".join(sorted(state.workers)), None)',
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_51": (
            'log.info("XXLoRA discovery: %s at %s answers againXX", ", ".join(sorted(state.workers)), state.url)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_52": (
            'log.info("lora discovery: %s at %s answers again", ", ".join(sorted(state.workers)), state.url)',
            "message",
            "a log line's arguments (the workers, a count or the names shown)",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_55": (
            'log.info("LoRA discovery: %s at %s answers again", "XX, XX".join(sorted(state.workers)), state.url)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_64": (
            '"--served-model-name?)", None, state.url,',
            "message",
            "a log line's or an error's arguments",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_65": (
            '"--served-model-name?)", ", ".join(sorted(state.workers)), None,',
            "message",
            "a log line's or an error's arguments",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_73": (
            'log.warning("XX%s at %s serves %s, not %s: it would answer that model\'s requests 404 (its XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_75": (
            '"XX--served-model-name?)XX", ", ".join(sorted(state.workers)), state.url,',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_76": (
            '"--SERVED-MODEL-NAME?)", ", ".join(sorted(state.workers)), state.url,',
            "message",
            "a log line's or an error's arguments",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_78": (
            '"--served-model-name?)", "XX, XX".join(sorted(state.workers)), state.url,',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_81": (
            '"XX, XX".join(loggable(n) for n in names.served[:5]), state.model)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁ_read__mutmut_83": (
            '", ".join(loggable(n) for n in names.served[:6]), state.model)  # fmt: skip',
            "message",
            "how many of a worker's served names the warning shows (5 or 6)",
        ),
        "xǁAdapterDiscoveryǁread_once__mutmut_24": (
            "for state, key in zip(states, wanted, strict=None):",
            "same-value",
            "`states` is built from `wanted` one by one: the two always have the same length",
        ),
        "xǁAdapterDiscoveryǁread_once__mutmut_27": (
            "for state, key in zip(states, wanted, ):",
            "same-value",
            "`states` is built from `wanted` one by one: the two always have the same length",
        ),
        "xǁAdapterDiscoveryǁread_once__mutmut_28": (
            "for state, key in zip(states, wanted, strict=False):",
            "same-value",
            "`states` is built from `wanted` one by one: the two always have the same length",
        ),
        "xǁAdapterDiscoveryǁread_once__mutmut_44": (
            '"(+%s -%s)", None, len(adapters), len(aliases - {model}), _names(added),',
            "message",
            "a log line's or an error's arguments",
        ),
        "xǁAdapterDiscoveryǁread_once__mutmut_48": (
            "None)  # fmt: skip",
            "message",
            "a log line's or an error's arguments",
        ),
        "xǁAdapterDiscoveryǁread_once__mutmut_55": (
            'log.info("XXnames of %s listed by its workers: %d adapters, %d other served names XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdapterDiscoveryǁread_once__mutmut_57": (
            '"XX(+%s -%s)XX", model, len(adapters), len(aliases - {model}), _names(added),',
            "message",
            "an error's or a log line's text",
        ),
    },
    "request/tokenizer.py": {
        "x__read_text__mutmut_3": (
            'return path.read_text(encoding="UTF-8")',
            "same-value",
            'encoding "UTF-8" and "utf-8" name the same codec (Python normalizes codec names)',
        ),
        "x__special_tokens__mutmut_2": (
            "tokens = {k: t for k in _SPECIAL_TOKEN_KEYS if (t := _token_content(None))}",
            "same-value",
            (
                "the next statement adds every `*_token` entry holding a token, which includes all of "
                "_SPECIAL_TOKEN_KEYS with the same values; only the dict's insertion order changes, and the "
                "template context is a mapping looked up by name"
            ),
        ),
        "x__special_tokens__mutmut_3": (
            "tokens = {k: t for k in _SPECIAL_TOKEN_KEYS if (t := _token_content(config.get(None)))}",
            "same-value",
            (
                "as mutmut_2: config.get(None) is None, so the first pass adds nothing and the `*_token` "
                "pass adds the same named tokens"
            ),
        ),
        "x__tokenize_local__mutmut_41": (
            "raise TokenizerUnavailable(None)",
            "message",
            (
                "only the text of the TokenizerUnavailable raised for a request with neither messages nor a "
                "prompt changes; the type (what the picker acts on) is unchanged"
            ),
        ),
        "x__tokenize_local__mutmut_42": (
            'raise TokenizerUnavailable("XXrequest has neither messages nor a promptXX")',
            "message",
            (
                "only the text of the TokenizerUnavailable raised for a request with neither messages nor a "
                "prompt changes; the type (what the picker acts on) is unchanged"
            ),
        ),
        "x__tokenize_local__mutmut_43": (
            'raise TokenizerUnavailable("REQUEST HAS NEITHER MESSAGES NOR A PROMPT")',
            "message",
            (
                "only the text of the TokenizerUnavailable raised for a request with neither messages nor a "
                "prompt changes; the type (what the picker acts on) is unchanged"
            ),
        ),
        "x__tokenize_local__mutmut_6": (
            "and keep > 0",
            "same-value",
            (
                "a truncate_prompt_tokens of 0 then takes the plain path instead of the tokenizer's "
                "truncation; both end in `_truncate`, which keeps no id of 0 (vLLM's slice(0, 0)): [] either"
                " way"
            ),
        ),
        "x__tokenize_local__mutmut_7": (
            "and keep >= 1",
            "same-value",
            (
                "a truncate_prompt_tokens of 0 then takes the plain path instead of the tokenizer's "
                "truncation; both end in `_truncate`, which keeps no id of 0 (vLLM's slice(0, 0)): [] either"
                " way"
            ),
        ),
        "x__truncate__mutmut_7": (
            "if keep is None or keep < 0 or len(ids) < keep:",
            "same-value",
            (
                "when len(ids) == keep the mutant slices ids[0:] (or ids[:keep]) instead of returning ids: "
                "an equal list/array"
            ),
        ),
        "x__truncated_by_tokenizer__mutmut_21": (
            "raise TokenizerUnavailable(None)",
            "message",
            (
                "only the text of the TokenizerUnavailable for a request with neither messages nor a prompt "
                "changes (type unchanged)"
            ),
        ),
        "x__truncated_by_tokenizer__mutmut_22": (
            'raise TokenizerUnavailable("XXrequest has neither messages nor a promptXX")',
            "message",
            "as mutmut_21: XX-wrapped error text",
        ),
        "x__truncated_by_tokenizer__mutmut_23": (
            'raise TokenizerUnavailable("REQUEST HAS NEITHER MESSAGES NOR A PROMPT")',
            "message",
            "as mutmut_21: upper-cased error text",
        ),
        "x_message_text__mutmut_19": (
            "raise ValueError(None)",
            "message",
            (
                "only the ValueError text for content that is neither a string nor a list changes "
                "(RequestTokenizer wraps it as TokenizerUnavailable either way)"
            ),
        ),
        "x_message_text__mutmut_20": (
            'raise ValueError("XXmessage content must be a string or a list of partsXX")',
            "message",
            "only the ValueError text for content that is neither a string nor a list changes",
        ),
        "x_message_text__mutmut_21": (
            'raise ValueError("MESSAGE CONTENT MUST BE A STRING OR A LIST OF PARTS")',
            "message",
            "only the ValueError text for content that is neither a string nor a list changes",
        ),
        "xǁByteTokenizerǁencode_text__mutmut_4": (
            'return list(text.encode("UTF-8"))  # bytes have no special tokens to add',
            "same-value",
            "'UTF-8' and 'utf-8' name the same codec: str.encode gives the same bytes for every text",
        ),
        "xǁHfTokenizerǁ__init____mutmut_44": (
            "self._piecewise_templates: frozenset[str] = None",
            "same-value",
            (
                "_piecewise_templates is only read in encodes_piecewise after `pieces is not None`, and "
                "_set_up_pieces sets both together; while pieces is None the initial value (frozenset() or "
                "None) is never read"
            ),
        ),
        "xǁHfTokenizerǁ__init____mutmut_54": (
            '"XXtokenizer %s: chat prompts encoded piecewise, piece cache %d bytesXX",',
            "message",
            (
                "XX-wrapped log text; the line still names the tokenizer and the cache size (tested), only "
                "its wording changes"
            ),
        ),
        "xǁHfTokenizerǁ__init____mutmut_62": (
            'log.warning("XXtokenizer %s: chat prompts encoded whole: %sXX", self.name, self.piecewise_off_reason)',  # noqa: E501
            "message",
            "XX-wrapped log text; the warning still names the tokenizer and the reason (tested)",
        ),
        "xǁHfTokenizerǁ_encode__mutmut_6": (
            "raise TokenizerUnavailable(None) from e",
            "message",
            (
                "TokenizerUnavailable(None) instead of 'tokenizer <name> failed: <e>': same type, only the "
                "text the picker logs changes; moreover a tokenizer whose encoding raises is refused at load"
                " by batch_encoder's probes, so this is hard to reach"
            ),
        ),
        "xǁHfTokenizerǁ_set_up_pieces__mutmut_13": (
            "self._backend, TokenCache(cache_bytes), PromptPrefixes(), )",
            "performance",
            "as mutmut_9 (argument dropped, default None)",
        ),
        "xǁHfTokenizerǁ_set_up_pieces__mutmut_37": (
            '"XXtokenizer %s: chat template %r encoded whole: no added token between messagesXX",',
            "message",
            "XX-wrapped log text; the line still names the tokenizer and the template (tested)",
        ),
        "xǁHfTokenizerǁ_set_up_pieces__mutmut_9": (
            "self._backend, TokenCache(cache_bytes), PromptPrefixes(), encode_batch=None",
            "performance",
            (
                "encode_batch=None makes PiecewiseEncoder call batch_encoder(backend) again, which "
                "deterministically returns the same encoder: only the fast-path probe is redone at load"
            ),
        ),
        "xǁHfTokenizerǁencode_chat_ids__mutmut_27": (
            "raise TokenizerUnavailable(None) from e",
            "message",
            "as _encode__mutmut_6, for a piecewise encoding failure",
        ),
        "xǁHfTokenizerǁtruncated__mutmut_30": (
            "raise TokenizerUnavailable(None) from e",
            "message",
            "as _encode__mutmut_6, for a truncated encoding failure",
        ),
        "xǁRequestTokenizerǁ__init____mutmut_2": (
            "inline_max_bytes: int = 8193,",
            "performance",
            (
                "constructor default threshold 8192 -> 8193 bytes: only whether a body of exactly 8193 bytes"
                " is encoded on the event loop or in a worker thread changes; ids identical; production "
                "builds through from_settings, which passes its own 8192"
            ),
        ),
        "xǁRequestTokenizerǁ_mostly_cached__mutmut_14": (
            "request.tools, template_kwargs(request), request.add_special_tokens is not True",
            "performance",
            (
                "same as _9: the flag only matters when piecewise is on but can_add_special_tokens is False "
                "(unprobeable post-processor); then only loop-vs-thread placement changes, not the ids"
            ),
        ),
        "xǁRequestTokenizerǁ_mostly_cached__mutmut_15": (
            "request.tools, template_kwargs(request), request.add_special_tokens is False",
            "performance",
            (
                "same as _9: differs only for a tokenizer whose post-processor special ids cannot be probed,"
                " and only in loop-vs-thread placement"
            ),
        ),
        "xǁRequestTokenizerǁ_mostly_cached__mutmut_9": (
            "request.tools, template_kwargs(request), None",
            "performance",
            (
                "only loop-vs-thread placement of a next turn, and only when the request asks "
                "add_special_tokens=true from a tokenizer whose post-processor ids cannot be probed "
                "(can_add_special_tokens False); with the known post-processors that needs a template "
                "repeating the text ('$A <bos> $A'), no real tokenizer; ids come from encode_chat_ids either"
                " way"
            ),
        ),
        "xǁRequestTokenizerǁ_remote__mutmut_26": (
            "raise TokenizerUnavailable(None)",
            "message",
            (
                "only the text of the TokenizerUnavailable raised for a request with neither messages nor a "
                "prompt changes; the type (what the picker acts on) is unchanged"
            ),
        ),
        "xǁRequestTokenizerǁ_remote__mutmut_27": (
            'raise TokenizerUnavailable("XXrequest has neither messages nor a promptXX")',
            "message",
            (
                "only the text of the TokenizerUnavailable raised for a request with neither messages nor a "
                "prompt changes; the type (what the picker acts on) is unchanged"
            ),
        ),
        "xǁRequestTokenizerǁ_remote__mutmut_28": (
            'raise TokenizerUnavailable("REQUEST HAS NEITHER MESSAGES NOR A PROMPT")',
            "message",
            (
                "only the text of the TokenizerUnavailable raised for a request with neither messages nor a "
                "prompt changes; the type (what the picker acts on) is unchanged"
            ),
        ),
        "xǁRequestTokenizerǁfrom_settings__mutmut_1": (
            "inline_max_bytes: int = 8193,",
            "performance",
            (
                "from_settings default threshold 8192 -> 8193 bytes: only where a body of exactly 8193 bytes"
                " is encoded (loop vs thread); same ids"
            ),
        ),
        "xǁRequestTokenizerǁfrom_settings__mutmut_4": (
            'raise ValueError("XXset either a local tokenizer path or a remote /tokenize URL, not bothXX")',
            "message",
            (
                "only the ValueError text for both a local path and a remote URL changes; existing test "
                "matches 'not both', which the mutant keeps"
            ),
        ),
        "xǁRequestTokenizerǁfrom_settings__mutmut_5": (
            'raise ValueError("set either a local tokenizer path or a remote /tokenize url, not both")',
            "message",
            "only the ValueError text changes ('URL' -> 'url')",
        ),
        "xǁRequestTokenizerǁtoken_ids__mutmut_35": (
            'log.exception("tokenizer %s failed on a %s request", self.name, None)',
            "message",
            (
                "only the logged request kind of a backend failure (log.exception argument) changes; the "
                "raised TokenizerUnavailable is the same"
            ),
        ),
        "xǁRequestTokenizerǁtoken_ids__mutmut_39": (
            'log.exception("XXtokenizer %s failed on a %s requestXX", self.name, request.kind)',
            "message",
            "only the log format text of a backend failure changes",
        ),
        "xǁTokenizerǁencode_chat__mutmut_1": (
            "add_generation_prompt: bool = False,",
            "same-value",
            (
                "a default in the Tokenizer Protocol's stub signature: never executed, each backend has its "
                "own default (True)"
            ),
        ),
    },
    "events/nats_events.py": {
        "x__backoff__mutmut_19": (
            "delay = min(RECONNECT_MAX_S, RECONNECT_BASE_S * 2 ** min(server.reconnects, 17))",
            "same-value",
            (
                "below 16 attempts identical; from 16 on 0.1*2**16 and 0.1*2**17 both exceed "
                "RECONNECT_MAX_S, so min() gives 5.0 either way"
            ),
        ),
        "x__finish_close__mutmut_11": (
            "for sub in list(subs.values()) if (isinstance(subs, dict)) or True else ():",
            "same-value",
            "nats.py 2.16 Client._subs is always a dict: `or True` never changes the branch",
        ),
        "x__finish_close__mutmut_18": (
            'task = getattr(sub, "_wait_for_msgs_task", )',
            "same-value",
            (
                "nats.py 2.16 Subscription.__init__ always sets _wait_for_msgs_task (None without callback):"
                " the default is never used"
            ),
        ),
        "x__finish_close__mutmut_24": (
            "transport = None",
            "performance",
            (
                "transport=None skips the close; when nats.py's close raises ConnectionError (drain on a "
                "lost writer) that writer's transport is already closed (asyncio closed it on "
                "connection_lost, or nats.py's reconnect closed it; probed: is_closing() True at "
                "_finish_close), so transport.close() here is a no-op"
            ),
        ),
        "x__finish_close__mutmut_25": (
            'transport = getattr(None, "_transport", None)',
            "performance",
            (
                "getattr(None, ...) is None: skips the close; when nats.py's close raises ConnectionError "
                "(drain on a lost writer) that writer's transport is already closed (asyncio closed it on "
                "connection_lost, or nats.py's reconnect closed it; probed: is_closing() True at "
                "_finish_close), so transport.close() here is a no-op"
            ),
        ),
        "x__finish_close__mutmut_29": (
            'transport = getattr(nc, "_transport", )',
            "same-value",
            "nats.py 2.16 Client always has _transport (set in __init__): the default is never used",
        ),
        "x__finish_close__mutmut_30": (
            'transport = getattr(nc, "XX_transportXX", None)',
            "performance",
            (
                "a missing attribute gives None: skips the close; when nats.py's close raises "
                "ConnectionError (drain on a lost writer) that writer's transport is already closed (asyncio"
                " closed it on connection_lost, or nats.py's reconnect closed it; probed: is_closing() True "
                "at _finish_close), so transport.close() here is a no-op"
            ),
        ),
        "x__finish_close__mutmut_31": (
            'transport = getattr(nc, "_TRANSPORT", None)',
            "performance",
            (
                "a missing attribute gives None: skips the close; when nats.py's close raises "
                "ConnectionError (drain on a lost writer) that writer's transport is already closed (asyncio"
                " closed it on connection_lost, or nats.py's reconnect closed it; probed: is_closing() True "
                "at _finish_close), so transport.close() here is a no-op"
            ),
        ),
        "x__finish_close__mutmut_32": (
            "if transport is None:",
            "performance",
            (
                "`is None` skips closing the (always present) transport; when nats.py's close raises "
                "ConnectionError (drain on a lost writer) that writer's transport is already closed (asyncio"
                " closed it on connection_lost, or nats.py's reconnect closed it; probed: is_closing() True "
                "at _finish_close), so transport.close() here is a no-op"
            ),
        ),
        "x__finish_close__mutmut_33": (
            "with contextlib.suppress(None):",
            "same-value",
            (
                "suppress(None) differs only when transport.close() raises; StreamWriter.close() on an "
                "asyncio transport (already closing here) never raises"
            ),
        ),
        "x__finish_close__mutmut_34": (
            "await asyncio.gather(*tasks, return_exceptions=None)",
            "same-value",
            (
                "return_exceptions=None (falsy) the gathered tasks are nats.py's "
                "Subscription._wait_for_msgs, which catch CancelledError and return None, and all have "
                "started (nats.py's _close yields with sleep(0) before the failing drain): gather never "
                "holds an exception to return or raise"
            ),
        ),
        "x__finish_close__mutmut_36": (
            "await asyncio.gather(*tasks, )",
            "same-value",
            (
                "default return_exceptions=False: the gathered tasks are nats.py's "
                "Subscription._wait_for_msgs, which catch CancelledError and return None, and all have "
                "started (nats.py's _close yields with sleep(0) before the failing drain): gather never "
                "holds an exception to return or raise"
            ),
        ),
        "x__finish_close__mutmut_37": (
            "await asyncio.gather(*tasks, return_exceptions=False)",
            "same-value",
            (
                "return_exceptions=False: the gathered tasks are nats.py's Subscription._wait_for_msgs, "
                "which catch CancelledError and return None, and all have started (nats.py's _close yields "
                "with sleep(0) before the failing drain): gather never holds an exception to return or raise"
            ),
        ),
        "x__finish_close__mutmut_6": (
            'subs = getattr(nc, "_subs", )',
            "same-value",
            "nats.py 2.16 Client always has _subs (set in __init__): the getattr default is never used",
        ),
        "xǁNatsEventPublisherǁ__init____mutmut_11": (
            "self._worker = None",
            "same-value",
            (
                "_worker is only put into the event handed to publish(), which encodes with "
                "encode_event(self.worker_id, event, event_id, self.dp_rank); encode_event never reads "
                "event.worker (publish docstring: 'its own worker and id are ignored') and nothing else "
                "reads _worker: the wire message is identical for every input"
            ),
        ),
        "xǁNatsEventPublisherǁ__init____mutmut_12": (
            "self._worker = Worker(None, dp_rank)",
            "same-value",
            (
                "Worker(None, dp_rank): _worker is never read for the wire (encode_event takes "
                "worker_id/dp_rank from the publisher, not event.worker); Worker is an unvalidated "
                "NamedTuple, so construction cannot fail"
            ),
        ),
        "xǁNatsEventPublisherǁ__init____mutmut_13": (
            "self._worker = Worker(worker_id, None)",
            "same-value",
            (
                "Worker(worker_id, None): as _11, event.worker is never encoded; dp_rank on the wire comes "
                "from self.dp_rank"
            ),
        ),
        "xǁNatsEventPublisherǁ__init____mutmut_14": (
            "self._worker = Worker(dp_rank)",
            "same-value",
            "Worker(dp_rank) = Worker(worker_id=dp_rank, dp_rank=0): never encoded, as _11",
        ),
        "xǁNatsEventPublisherǁ__init____mutmut_15": (
            "self._worker = Worker(worker_id, )",
            "same-value",
            (
                "Worker(worker_id) = dp_rank 0 in the unused event.worker; the wire dp_rank comes from "
                "self.dp_rank, as _11"
            ),
        ),
        "xǁNatsEventPublisherǁon_cleared__mutmut_2": (
            "self.publish(AllBlocksCleared(None))",
            "same-value",
            (
                "AllBlocksCleared(None): publish() ignores event.worker (encode_event writes "
                "self.worker_id/self.dp_rank); the message is byte-identical"
            ),
        ),
        "xǁNatsEventPublisherǁon_removed__mutmut_2": (
            "self.publish(BlocksRemoved(None, tuple(block_hashes)))",
            "same-value",
            "BlocksRemoved(None, ...): event.worker ignored by publish/encode_event; byte-identical message",
        ),
        "xǁNatsEventPublisherǁon_stored__mutmut_22": (
            "self.publish(BlocksStored(None, blocks, parent_hash))",
            "same-value",
            "BlocksStored(None, ...): event.worker ignored by publish/encode_event; byte-identical message",
        ),
        "xǁNatsEventSubscriberǁ__init____mutmut_10": (
            'raise ValueError("NATSEVENTSUBSCRIBER NEEDS A SUBJECT, AN EVENT_PLANE_SUBJECT OR BOTH")',
            "message",
            "text of the no-subject ValueError only",
        ),
        "xǁNatsEventSubscriberǁ__init____mutmut_3": (
            "raise ValueError(None)",
            "message",
            "text of the queue_size ValueError only; the raise itself is tested",
        ),
        "xǁNatsEventSubscriberǁ__init____mutmut_7": (
            "raise ValueError(None)",
            "message",
            "text of the no-subject ValueError only; the raise itself is tested",
        ),
        "xǁNatsEventSubscriberǁ__init____mutmut_8": (
            'raise ValueError("XXNatsEventSubscriber needs a subject, an event_plane_subject or bothXX")',
            "message",
            "text of the no-subject ValueError only",
        ),
        "xǁNatsEventSubscriberǁ__init____mutmut_9": (
            'raise ValueError("natseventsubscriber needs a subject, an event_plane_subject or both")',
            "message",
            "text of the no-subject ValueError only",
        ),
        "xǁNatsEventSubscriberǁ_on_overflow__mutmut_14": (
            "None,",
            "message",
            "subject argument of the nats.queue_full warning; the counter and drops are tested",
        ),
        "xǁNatsEventSubscriberǁ_on_overflow__mutmut_22": (
            '"XXKV events on %s arrive faster than they are applied: more than %d pending, dropping XX"',
            "message",
            "text of the nats.queue_full warning (%s/%d kept)",
        ),
        "xǁNatsEventSubscriberǁ_on_overflow__mutmut_23": (
            '"kv events on %s arrive faster than they are applied: more than %d pending, dropping "',
            "message",
            "case of the nats.queue_full warning text",
        ),
        "xǁNatsEventSubscriberǁ_on_overflow__mutmut_25": (
            '"XX(each worker concerned shows an event-id gap at its next event)XX",',
            "message",
            "text of the nats.queue_full warning",
        ),
        "xǁNatsEventSubscriberǁ_on_overflow__mutmut_26": (
            '"(EACH WORKER CONCERNED SHOWS AN EVENT-ID GAP AT ITS NEXT EVENT)",',
            "message",
            "case of the nats.queue_full warning text",
        ),
        "xǁNatsEventSubscriberǁhandle__mutmut_20": (
            'self._apply(event.worker, event_id, event, subject or self.subject or "XXXX")',
            "same-value",
            (
                "the last `or` is reached only when neither a subject is given nor the subscriber has a JSON "
                "subject; the subscriptions always pass their message's subject (never empty in NATS), so "
                "only a direct call on a plane-only subscriber could, and no product code makes one"
            ),
        ),
        "xǁNatsEventSubscriberǁstart__mutmut_20": (
            "self.link.on_overflow(sub, functools.partial(self._on_overflow, None))",
            "message",
            (
                "the subject bound to _on_overflow is used only as an argument of the nats.queue_full "
                "warning; counting is unchanged (tested)"
            ),
        ),
        "xǁNatsLinkǁ__init____mutmut_8": (
            "self._closing = None  # `close` was called: the disconnect that follows is no loss",
            "same-value",
            "_closing is only tested for truth (`if self._closing`): None and False alike",
        ),
        "xǁNatsLinkǁ_on_closed__mutmut_2": (
            "self._set(False, None)",
            "same-value",
            (
                "reason None is never used: nats.py 2.16 calls closed_cb only right after disconnected_cb "
                "(Client._close with do_cbs; also on NoServersError via close()), which already set the link"
                " down: _on_closed's _set(False, ...) returns at `up == self.up`"
            ),
        ),
        "xǁNatsLinkǁ_on_closed__mutmut_6": (
            'self._set(False, "XXNATS connection closedXX")',
            "message",
            (
                "reason text only (and never reaches a watcher: nats.py 2.16 calls closed_cb only right "
                "after disconnected_cb (Client._close with do_cbs; also on NoServersError via close()), "
                "which already set the link down: _on_closed's _set(False, ...) returns at `up == self.up`)"
            ),
        ),
        "xǁNatsLinkǁ_on_closed__mutmut_7": (
            'self._set(False, "nats connection closed")',
            "message",
            (
                "reason capitalisation only (and never reaches a watcher: _on_closed's _set is a no-op after"
                " disconnected_cb)"
            ),
        ),
        "xǁNatsLinkǁ_on_closed__mutmut_8": (
            'self._set(False, "NATS CONNECTION CLOSED")',
            "message",
            (
                "reason capitalisation only (and never reaches a watcher: _on_closed's _set is a no-op after"
                " disconnected_cb)"
            ),
        ),
        "xǁNatsLinkǁ_on_error__mutmut_11": (
            'self.counters.loud("nats.error", "XXNATS client error: %rXX", exc)',
            "message",
            "log text only",
        ),
        "xǁNatsLinkǁ_on_error__mutmut_12": (
            'self.counters.loud("nats.error", "nats client error: %r", exc)',
            "message",
            "log text only",
        ),
        "xǁNatsLinkǁ_on_error__mutmut_5": (
            'self.counters.loud("nats.error", "NATS client error: %r", None)',
            "message",
            "log line argument only (None instead of the error); the nats.error count is unchanged",
        ),
        "xǁNatsLinkǁ_on_reconnected__mutmut_10": (
            'self._set(True, "nats reconnected")',
            "message",
            "capitalisation of the watchers' reason only",
        ),
        "xǁNatsLinkǁ_on_reconnected__mutmut_11": (
            'self._set(True, "NATS RECONNECTED")',
            "message",
            "capitalisation of the watchers' reason only",
        ),
        "xǁNatsLinkǁ_on_reconnected__mutmut_9": (
            'self._set(True, "XXNATS reconnectedXX")',
            "message",
            (
                "spelling of the watchers' reason (admin cache_source_reason text) only; 'reconnected' is "
                "tested case-insensitively"
            ),
        ),
        "xǁNatsLinkǁ_set__mutmut_10": (
            'log.exception("nats connection watcher failed")',
            "message",
            "log text only",
        ),
        "xǁNatsLinkǁ_set__mutmut_11": (
            'log.exception("NATS CONNECTION WATCHER FAILED")',
            "message",
            "log text only",
        ),
        "xǁNatsLinkǁ_set__mutmut_8": (
            "log.exception(None)",
            "message",
            "log.exception(None): the line reads 'None' (traceback still logged); watchers still all called",
        ),
        "xǁNatsLinkǁ_set__mutmut_9": (
            'log.exception("XXNATS connection watcher failedXX")',
            "message",
            "log text only",
        ),
        "xǁNatsLinkǁclose__mutmut_10": (
            'log.info("XXNATS connection was already lost at close (%r): messages buffered since not sentXX", exc)',  # noqa: E501
            "message",
            "log text only",
        ),
        "xǁNatsLinkǁclose__mutmut_11": (
            'log.info("nats connection was already lost at close (%r): messages buffered since not sent", exc)',  # noqa: E501
            "message",
            "log text only",
        ),
        "xǁNatsLinkǁclose__mutmut_15": (
            "self._set(False, None)",
            "message",
            (
                "only the reason handed to watchers, where close fails after nats.py already reported the "
                "loss (then _set is a no-op: the link is down)"
            ),
        ),
        "xǁNatsLinkǁclose__mutmut_19": (
            'self._set(False, "XXNATS connection closedXX")',
            "message",
            "only the reason text handed to watchers (a no-op _set in practice: the loss was reported first)",
        ),
        "xǁNatsLinkǁclose__mutmut_20": (
            'self._set(False, "nats connection closed")',
            "message",
            "only the reason text handed to watchers (as close__mutmut_19)",
        ),
        "xǁNatsLinkǁclose__mutmut_21": (
            'self._set(False, "NATS CONNECTION CLOSED")',
            "message",
            "only the reason text handed to watchers (as close__mutmut_19)",
        ),
        "xǁNatsLinkǁclose__mutmut_7": (
            'log.info("NATS connection was already lost at close (%r): messages buffered since not sent", None)',  # noqa: E501
            "message",
            "the log line's argument is None instead of the exception: only its text changes",
        ),
        "xǁNatsLinkǁclose__mutmut_9": (
            'log.info("NATS connection was already lost at close (%r): messages buffered since not sent", )',
            "message",
            "the log line's argument dropped: logging prints the literal %r, only its text changes",
        ),
        "xǁNatsLinkǁconnect__mutmut_16": (
            "closed_cb=None,",
            "performance",
            (
                "closed_cb=None only skips calling _on_closed, a no-op: nats.py 2.16 calls closed_cb only "
                "right after disconnected_cb (Client._close with do_cbs; also on NoServersError via "
                "close()), which already set the link down: _on_closed's _set(False, ...) returns at `up == "
                "self.up`"
            ),
        ),
        "xǁNatsLinkǁconnect__mutmut_20": (
            "",
            "same-value",
            "allow_reconnect left out: nats.py 2.16's default is True",
        ),
        "xǁNatsLinkǁconnect__mutmut_28": (
            "",
            "performance",
            (
                "closed_cb left out (nats.py default None) only skips calling _on_closed, a no-op: nats.py "
                "2.16 calls closed_cb only right after disconnected_cb (Client._close with do_cbs; also on "
                "NoServersError via close()), which already set the link down: _on_closed's _set(False, ...)"
                " returns at `up == self.up`"
            ),
        ),
        "xǁNatsLinkǁconnect__mutmut_32": (
            "max_reconnect_attempts=-2,",
            "same-value",
            (
                "nats.py 2.16 only tests max_reconnect_attempts > 0 (limit) and < 0 (retry NoServersError at"
                " first connect): -2 behaves as -1"
            ),
        ),
        "xǁOrderedSenderǁ__init____mutmut_9": (
            'self._thread: int | None = ""',
            "same-value",
            (
                "initial _thread is never read: submit reads it only when _loop is not None, and _loop and "
                "_thread are assigned together in one statement, so _thread is always overwritten first"
            ),
        ),
        "xǁOrderedSenderǁ_drain__mutmut_14": (
            'f"{self._key}.publish_failed", "NATS publish on %s failed: %r", None, exc',
            "message",
            "only the subject argument of the publish_failed warning becomes None; the counter is unchanged",
        ),
        "xǁOrderedSenderǁ_drain__mutmut_15": (
            'f"{self._key}.publish_failed", "NATS publish on %s failed: %r", subject, None',
            "message",
            (
                "only the exception argument of the publish_failed warning becomes None; the counter is "
                "unchanged"
            ),
        ),
        "xǁOrderedSenderǁ_drain__mutmut_20": (
            'f"{self._key}.publish_failed", "XXNATS publish on %s failed: %rXX", subject, exc',
            "message",
            "publish_failed warning text gets XX..XX; same placeholders, counter unchanged",
        ),
        "xǁOrderedSenderǁ_drain__mutmut_21": (
            'f"{self._key}.publish_failed", "nats publish on %s failed: %r", subject, exc',
            "message",
            "publish_failed warning text lower-cased; same placeholders, counter unchanged",
        ),
        "xǁOrderedSenderǁ_enqueue__mutmut_10": (
            'self._counters.loud(f"{self._key}.publish_dropped", "PUBLISH QUEUE FULL; MESSAGE DROPPED")',
            "message",
            "queue-full warning text upper-cased (no placeholders); <key>.publish_dropped still counted",
        ),
        "xǁOrderedSenderǁ_enqueue__mutmut_9": (
            'self._counters.loud(f"{self._key}.publish_dropped", "XXpublish queue full; message droppedXX")',
            "message",
            "queue-full warning text gets XX..XX; <key>.publish_dropped still counted",
        ),
        "xǁOrderedSenderǁsubmit__mutmut_8": (
            'self._counters.loud(f"{self._key}.publish_failed", "XXpublish outside an event loop; droppedXX")',  # noqa: E501
            "message",
            "outside-a-loop warning text gets XX..XX; <key>.publish_failed still counted",
        ),
        "xǁOrderedSenderǁsubmit__mutmut_9": (
            'self._counters.loud(f"{self._key}.publish_failed", "PUBLISH OUTSIDE AN EVENT LOOP; DROPPED")',
            "message",
            "outside-a-loop warning text upper-cased (no placeholders); <key>.publish_failed still counted",
        ),
        "xǁNatsEventSubscriberǁhandle_event_plane__mutmut_7": (
            'super().handle_event_plane(data, where or self.event_plane_subject or "XXXX")',
            "same-value",
            (
                "the final `or` operand is reached only when both where and event_plane_subject are empty;"
                " the plane subscription exists only when event_plane_subject is set, and passes its subject"
            ),
        ),
    },
    "picker/parse_worker.py": {
        "x__count_down__mutmut_9": (
            "if type(None) is str:  # most values: skip the container checks",
            "performance",
            (
                "`type(None) is str` is always False: a string then goes through the list/tuple and Mapping "
                "checks, matches neither and costs the same one value; only the fast path for strings is "
                "lost"
            ),
        ),
        "x__read_frame__mutmut_17": (
            "return None if header is None else _read_exactly(stream, int.from_bytes(header, ))",
            "same-value",
            (
                'int.from_bytes(header) without byteorder defaults to "big" since Python 3.11 '
                "(requires-python >= 3.11)"
            ),
        ),
        "x_answer_request__mutmut_1": (
            'BODY_PREFIXES.last = ""  # set by this body\'s parse, if it walks one',
            "same-value",
            (
                "BODY_PREFIXES.last is read only after a successful parse, and every successful parse goes "
                "through BODY_PREFIXES.loads, whose _loads sets last = None before anything else; the parses"
                " that skip it (empty, not UTF-8, BOM, unroutable path) all raise, so the value set here "
                '(None or "") is never read'
            ),
        ),
        "x_json_object__mutmut_14": (
            "tokens = value.get(token_field) if (token_field is not None) or True else None",
            "same-value",
            (
                "with token_field None the mutant reads value.get(None): keys of a JSON object are always "
                "strings, so it is None, as the original's None"
            ),
        ),
        "x_main__mutmut_17": (
            "body = _read_frame(stdin) if (request is not None) or True else None",
            "same-value",
            (
                "the mutant also reads a body frame when the request frame was short; a short read means end"
                " of input (BufferedReader.read(n) returns fewer than n bytes only at EOF), so that read "
                'returns b"" -> None and main returns as before; only one empty read more'
            ),
        ),
        "x_main__mutmut_37": (
            "stdout.write(len(answer).to_bytes(4, ))",
            "same-value",
            (
                'len(answer).to_bytes(4) without byteorder defaults to "big" since Python 3.11 '
                "(requires-python >= 3.11)"
            ),
        ),
    },
    "runtime/rounds.py": {
        "xǁRoundsǁ__init____mutmut_1": (
            "self._name = None",
            "message",
            "the rounds' name, shown only as the task's name and in the failed-round log line",
        ),
        "xǁRoundsǁ_run__mutmut_10": (
            'self._log.exception("%S: A ROUND FAILED", self._name)',
            "message",
            "a log line's arguments (the rounds' name shown)",
        ),
        "xǁRoundsǁ_run__mutmut_20": (
            "await lazy_sleep(max(0.0, interval_s + (loop.time() - started)), interval_s / 4)",
            "performance",
            (
                "the next round waits the interval plus the last round's time instead of minus it: a round is"
                " later by the time of one (milliseconds against seconds)"
            ),
        ),
        "xǁRoundsǁ_run__mutmut_22": (
            "await lazy_sleep(max(0.0, interval_s - (loop.time() - started)), interval_s * 4)",
            "performance",
            (
                "the slack of the sleep between rounds: only serve's own loop (wakeups._SELECTORS) sleeps "
                "lazily; a round comes up to a whole interval later there, never sooner"
            ),
        ),
        "xǁRoundsǁ_run__mutmut_23": (
            "await lazy_sleep(max(0.0, interval_s - (loop.time() - started)), interval_s / 5)",
            "performance",
            (
                "the slack of the sleep between rounds: only serve's own loop (wakeups._SELECTORS) sleeps "
                "lazily; a round comes at most a fifth instead of a quarter of an interval late"
            ),
        ),
        "xǁRoundsǁ_run__mutmut_5": (
            "self._log.exception(None, self._name)",
            "message",
            "a log line's arguments (the rounds' name shown)",
        ),
        "xǁRoundsǁ_run__mutmut_6": (
            'self._log.exception("%s: a round failed", None)',
            "message",
            "a log line's arguments (the rounds' name shown)",
        ),
        "xǁRoundsǁ_run__mutmut_7": (
            "self._log.exception(self._name)",
            "message",
            "a log line's arguments (the rounds' name shown)",
        ),
        "xǁRoundsǁ_run__mutmut_8": (
            'self._log.exception("%s: a round failed", )',
            "message",
            "a log line's arguments (the rounds' name shown)",
        ),
        "xǁRoundsǁ_run__mutmut_9": (
            'self._log.exception("XX%s: a round failedXX", self._name)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁRoundsǁstart__mutmut_3": (
            "self._task = asyncio.get_running_loop().create_task(self._run(), name=None)",
            "message",
            "the task's name, shown only in debugging output",
        ),
        "xǁRoundsǁstart__mutmut_5": (
            "self._task = asyncio.get_running_loop().create_task(self._run(), )",
            "message",
            "the task's name, shown only in debugging output",
        ),
    },
    "request/chat_template.py": {
        "x__dotted_name__mutmut_1": (
            "attrs = None",
            "same-value",
            (
                "Jinja2 parses a {% set %} target only as a Name, a Tuple or an NSRef (ns.x): the Getattr "
                "walk after the NSRef case (vLLM keeps it too) is never reached"
            ),
        ),
        "x__dotted_name__mutmut_2": (
            "attrs.append(None)",
            "same-value",
            (
                "Jinja2 parses a {% set %} target only as a Name, a Tuple or an NSRef (ns.x): the Getattr "
                "walk after the NSRef case (vLLM keeps it too) is never reached"
            ),
        ),
        "x__dotted_name__mutmut_3": (
            "node = None",
            "same-value",
            (
                "Jinja2 parses a {% set %} target only as a Name, a Tuple or an NSRef (ns.x): the Getattr "
                "walk after the NSRef case (vLLM keeps it too) is never reached"
            ),
        ),
        "x__dotted_name__mutmut_4": (
            'return ".".join(None)',
            "same-value",
            (
                "Jinja2 parses a {% set %} target only as a Name, a Tuple or an NSRef (ns.x): the Getattr "
                "walk after the NSRef case (vLLM keeps it too) is never reached"
            ),
        ),
        "x__dotted_name__mutmut_5": (
            'return "XX.XX".join([node.name, *reversed(attrs)])',
            "same-value",
            (
                "Jinja2 parses a {% set %} target only as a Name, a Tuple or an NSRef (ns.x): the Getattr "
                "walk after the NSRef case (vLLM keeps it too) is never reached"
            ),
        ),
        "x__dotted_name__mutmut_6": (
            'return ".".join([node.name, *reversed(None)])',
            "same-value",
            (
                "Jinja2 parses a {% set %} target only as a Name, a Tuple or an NSRef (ns.x): the Getattr "
                "walk after the NSRef case (vLLM keeps it too) is never reached"
            ),
        ),
        "x__assigned_aliases__mutmut_15": (
            (
                'aliases = [f"{target.name}.{kwarg.key}" for kwarg in value.kwargs if _accesses(kwarg.value,'
                " name)]"
            ),
            "same-value",
            (
                "the list is empty there: a namespace(...) call is no access of any name, so the first "
                "branch added nothing"
            ),
        ),
        "x__assigned_aliases__mutmut_21": (
            "elif isinstance(target, jinja2.nodes.Getattr | jinja2.nodes.NSRef) or _accesses(value, name):",
            "same-value",
            (
                "a Name target reaching the branch gives its own name again (already listed; _aliases keeps "
                "each name once); a Tuple gives none"
            ),
        ),
        "x__assigned_aliases__mutmut_28": (
            "aliases = [dotted] if dotted is not None else []",
            "same-value",
            "the list is empty there: the target is no Name",
        ),
        "x__assigned_aliases__mutmut_31": (
            "aliases += [dotted] if (dotted is not None) or True else []",
            "same-value",
            "dotted is None only for a Getattr target not rooted in a name, which Jinja2 never parses",
        ),
        "x__is_var__mutmut_11": (
            'base, _, attr = name.partition(".")',
            "same-value",
            (
                "dotted names hold one dot (an NSRef's ns.attr, a namespace call's name.key): partition and "
                "rpartition split them alike"
            ),
        ),
        "x__cut_at_tag__mutmut_5": (
            'raise TokenizerUnavailable("XXcontinue_final_message is set but the template dropped the final messageXX")',  # noqa: E501
            "message",
            "only the TokenizerUnavailable text changes (XX-wrapped); the error and its type are the same",
        ),
        "x__part__mutmut_24": (
            'raise TokenizerUnavailable(f"content part type must be a string, not {type(None).__name__}")',
            "message",
            (
                "only the TokenizerUnavailable text for a non-string part type changes (NoneType instead of "
                "its type name)"
            ),
        ),
        "x__part__mutmut_36": (
            "None",
            "message",
            "only the TokenizerUnavailable text for a non-string text field changes (None)",
        ),
        "x__part__mutmut_37": (
            'f"content part {part_type!r} needs a string, not {type(None).__name__}"',
            "message",
            (
                "only the TokenizerUnavailable text for a non-string text field changes (NoneType instead of "
                "its type name)"
            ),
        ),
        "x__parts__mutmut_8": (
            "raise TokenizerUnavailable(None)",
            "message",
            "only the TokenizerUnavailable text for non-str/list/None message content changes (None)",
        ),
        "x__parts__mutmut_9": (
            'raise TokenizerUnavailable(f"message content of type {type(None).__name__} cannot be rendered")',
            "message",
            "only the TokenizerUnavailable text changes (NoneType instead of the content's type name)",
        ),
        "x__plain_text__mutmut_2": (
            'texts = [p if (isinstance(p, str)) and False else p["text"] for p in content if isinstance(p, str) or "text" in p]',  # noqa: E501
            "same-value",
            (
                "_plain_text only receives lists built by build_conversation in the 'openai' format, whose "
                "items are always dicts (_part wraps strings as {'type':'text',...}), so isinstance(p, str) "
                "is always False and p['text'] is taken either way"
            ),
        ),
        "x__tag_final_message__mutmut_16": (
            'raise TokenizerUnavailable("XXcontinue_final_message is set but there is no final message contentXX")',  # noqa: E501
            "message",
            "only the TokenizerUnavailable text changes (XX-wrapped)",
        ),
        "x__tag_final_message__mutmut_33": (
            "raise TokenizerUnavailable(None)",
            "message",
            (
                "TokenizerUnavailable(None) instead of the 'final message has no text' text; same exception "
                "type, raised in the same cases"
            ),
        ),
        "x__tag_final_message__mutmut_34": (
            'raise TokenizerUnavailable("XXcontinue_final_message is set but the final message has no textXX")',  # noqa: E501
            "message",
            "only the TokenizerUnavailable text changes (XX-wrapped)",
        ),
        "x__tag_final_message__mutmut_35": (
            'raise TokenizerUnavailable("CONTINUE_FINAL_MESSAGE IS SET BUT THE FINAL MESSAGE HAS NO TEXT")',
            "message",
            "only the TokenizerUnavailable text changes (upper-cased)",
        ),
        "x__tool_calls__mutmut_10": (
            'raise TokenizerUnavailable("XXeach tool call needs a `function` objectXX")',
            "message",
            (
                "only the TokenizerUnavailable text for a tool call without a function object changes (XX-"
                "wrapped; the test's match is a substring so it still matches)"
            ),
        ),
        "x__tool_calls__mutmut_2": (
            "raise TokenizerUnavailable(None)",
            "message",
            "only the TokenizerUnavailable text for non-list tool_calls changes (None)",
        ),
        "x__tool_calls__mutmut_23": (
            'arguments = ""',
            "same-value",
            (
                "invalid JSON arguments set to '' instead of None: the next line maps anything that is not a "
                "dict to {}, so the template gets {} either way"
            ),
        ),
        "x__tool_calls__mutmut_3": (
            'raise TokenizerUnavailable("XXtool_calls must be a listXX")',
            "message",
            "only the TokenizerUnavailable text for non-list tool_calls changes (XX-wrapped)",
        ),
        "x__tool_calls__mutmut_4": (
            'raise TokenizerUnavailable("TOOL_CALLS MUST BE A LIST")',
            "message",
            "only the TokenizerUnavailable text for non-list tool_calls changes (upper-cased)",
        ),
        "x__without_billing_header__mutmut_14": (
            'text = ""',
            "same-value",
            (
                "for a part that is neither a string nor a text part, text = '' behaves as None: '' is a str "
                "that does not start with the billing header, so the part is appended unchanged either way"
            ),
        ),
        "x__without_billing_header__mutmut_25": (
            'out.append(rest if (isinstance(part, str)) or True else {**part, "text": rest})',
            "same-value",
            (
                "only a Mapping part of type 'text' reaches this branch as a non-string; _part turns the bare"
                " string `rest` and {**part, 'text': rest} into the same item in both formats (rest / "
                "{'type': 'text', 'text': rest}) and ignores the part's other keys, so the conversation is "
                "identical"
            ),
        ),
        "x_build_conversation__mutmut_17": (
            "if plain and type(None) is str and len(message) == 2 and role in _PLAIN_ROLES:",
            "performance",
            (
                "type(None) is str is always False, so the fast path is never taken; the general path yields "
                "the identical {role, content} dict for those two-key user/assistant/tool string messages"
            ),
        ),
        "x_build_conversation__mutmut_2": (
            "plain = None",
            "performance",
            (
                "plain=None disables only the fast path for {role, content: str} user/assistant/tool messages"
                " in the 'string' format; the general path builds the same {role, content} dict (a str "
                "becomes one text part, joined back; '' gives '' ), so only extra work is done"
            ),
        ),
        "x_build_conversation__mutmut_4": (
            'plain = content_format == "XXstringXX"',
            "performance",
            (
                "plain is always False: same as mutmut_2, only the fast path is skipped and the general path "
                "yields an identical message"
            ),
        ),
        "x_build_conversation__mutmut_5": (
            'plain = content_format == "STRING"',
            "performance",
            (
                "plain is always False: same as mutmut_2, only the fast path is skipped and the general path "
                "yields an identical message"
            ),
        ),
        "x_vllm_tool__mutmut_51": (
            'out: dict[str, Any] = {"type": tool.get(None, "function"), "function": out_function}',
            "same-value",
            (
                "type is always 'function' instead of the tool's own; vLLM's ChatCompletionToolsParam "
                "declares `type: Literal['function'] = 'function'`, so every tool the engine accepts has type"
                " 'function' or none (dumped as 'function'); it differs only for tools the engine rejects "
                "with a 400, where no prompt is rendered"
            ),
        ),
        "x_vllm_tool__mutmut_55": (
            'out: dict[str, Any] = {"type": tool.get("XXtypeXX", "function"), "function": out_function}',
            "same-value",
            (
                "reads key 'XXtypeXX' (never set) so type is always 'function'; same as mutmut_51: differs "
                "only for a non-'function' type, which vLLM's Literal['function'] rejects"
            ),
        ),
        "x_vllm_tool__mutmut_56": (
            'out: dict[str, Any] = {"type": tool.get("TYPE", "function"), "function": out_function}',
            "same-value",
            (
                "reads key 'TYPE' so type is always 'function' (barring a tool sending 'TYPE'); same as "
                "mutmut_51: differs only for tools vLLM rejects"
            ),
        ),
        "x_vllm_tool__mutmut_9": (
            'raise TokenizerUnavailable("XXeach tool needs a `function` object with a string `name`XX")',
            "message",
            "only the TokenizerUnavailable text changes (XX-wrapped)",
        ),
        "xǁChatTemplateǁrender__mutmut_11": (
            'context.pop("XXadd_generation_promptXX", None)',
            "same-value",
            (
                "the kwargs' add_generation_prompt left in context is overwritten by "
                "context.update(add_generation_prompt=...) before rendering"
            ),
        ),
        "xǁChatTemplateǁrender__mutmut_12": (
            'context.pop("ADD_GENERATION_PROMPT", None)',
            "same-value",
            (
                "the kwargs' add_generation_prompt left in context is overwritten by "
                "context.update(add_generation_prompt=...) before rendering"
            ),
        ),
        "xǁChatTemplateǁrender__mutmut_15": (
            'continue_final_message = context.pop("continue_final_message", None)',
            "same-value",
            (
                "an absent continue_final_message becomes None instead of False; it is only used for "
                "truthiness (the both-set check and the tag/cut conditionals)"
            ),
        ),
        "xǁChatTemplateǁrender__mutmut_28": (
            "raise TokenizerUnavailable(None)",
            "message",
            (
                "TokenizerUnavailable(None) instead of the 'cannot both be set' text; same exception type in "
                "the same case"
            ),
        ),
        "xǁChatTemplateǁrender__mutmut_29": (
            'raise TokenizerUnavailable("XXadd_generation_prompt and continue_final_message cannot both be setXX")',  # noqa: E501
            "message",
            "only the TokenizerUnavailable text changes (XX-wrapped)",
        ),
        "xǁChatTemplateǁrender__mutmut_30": (
            'raise TokenizerUnavailable("ADD_GENERATION_PROMPT AND CONTINUE_FINAL_MESSAGE CANNOT BOTH BE SET")',  # noqa: E501
            "message",
            "only the TokenizerUnavailable text changes (upper-cased)",
        ),
        "xǁChatTemplateǁrender__mutmut_48": (
            'context.setdefault("documents", )',
            "same-value",
            "dict.setdefault(key) with no default uses None, the same as setdefault(key, None)",
        ),
        "xǁChatTemplateǁrender__mutmut_8": (
            "context.pop(None, None)",
            "same-value",
            (
                "the popped add_generation_prompt is overwritten anyway by "
                "context.update(add_generation_prompt=...) before rendering; pop(None) removes nothing "
                "(kwargs keys are JSON strings); the context's key order is invisible to templates"
            ),
        ),
        "xǁ_GenerationTagǁparse__mutmut_11": (
            'return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(None)',
            "message",
            (
                "only the {% generation %} CallBlock's line number (None) changes, used for Jinja's traceback"
                " line mapping; rendered text and the TokenizerUnavailable text of an error raised inside the"
                " block are unchanged (checked by hand)"
            ),
        ),
        "xǁ_GenerationTagǁparse__mutmut_14": (
            'return jinja2.nodes.CallBlock(self.call_method("_body"), [], None, body).set_lineno(lineno)',
            "same-value",
            (
                "CallBlock defaults None instead of []: with no args, Jinja's codegen never indexes defaults "
                "and iter_child_nodes skips None as it does an empty list; rendering inside loops, with set "
                "and in macros is unchanged (checked by hand)"
            ),
        ),
    },
    "epp/service.py": {
        "x__header__mutmut_15": (
            'value = h.raw_value.decode("UTF-8", "replace") if h.raw_value else h.value',
            "same-value",
            (
                "'UTF-8' and 'utf-8' name the same codec (codecs normalise the name): every raw value decodes"
                " identically"
            ),
        ),
        "x__may_route__mutmut_2": (
            "return True",
            "performance",
            (
                "messages after routing (request headers/body/trailers again, response trailers; response "
                "headers/body never reach _may_route) go through _handle_with_notices, i.e. in a task of "
                "their own, instead of being awaited directly; nothing in them routes, so no notice can come "
                "and the answers are the same"
            ),
        ),
        "x__may_route__mutmut_4": (
            'if kind != "XXrequest_bodyXX":',
            "performance",
            (
                "kind never equals 'XXrequest_bodyXX', so every request-phase message (also a duplex body "
                "chunk that does not end the body) is handled through _handle_with_notices: one task more per"
                " chunk, same answers (a non-final chunk never routes, so never queues)"
            ),
        ),
        "x__may_route__mutmut_5": (
            'if kind != "REQUEST_BODY":',
            "performance",
            (
                "as _4: 'REQUEST_BODY' never equals a oneof name; every request-phase message takes the "
                "notices path: one task more per non-final chunk, same answers"
            ),
        ),
        "x__status__mutmut_19": (
            'status = h.raw_value.decode("UTF-8", "replace") if h.raw_value else h.value',
            "same-value",
            (
                "'UTF-8' and 'utf-8' name the same codec (codecs normalise the name): every raw :status "
                "decodes identically"
            ),
        ),
        "x__status__mutmut_5": (
            'if h.key == "XX:statusXX" or h.key.lower() == ":status":',
            "same-value",
            (
                "in `key == X or key.lower() == ':status'` the second operand alone decides for every key (a "
                "key equal to ':status' also lower-cases to it); the exact compare is only a fast path, so a "
                "never-true X changes nothing"
            ),
        ),
        "x__status__mutmut_6": (
            'if h.key == ":STATUS" or h.key.lower() == ":status":',
            "same-value",
            (
                "as _5: `key == ':STATUS'` implies `key.lower() == ':status'`, which the `or` checks anyway; "
                "the result is the same for every key"
            ),
        ),
        "xǁExtProcServiceǁProcess__mutmut_12": (
            "stream, request_iterator, TooManyStreams(None, limit)",
            "message",
            (
                "only TooManyStreams.open_streams changes, an attribute nothing reads (grep: no reader in "
                "extproc/); the 429 body, its reason header and the log line come from the exception's "
                "message, which names only the limit"
            ),
        ),
        "xǁExtProcServiceǁProcess__mutmut_45": (
            "elif may_queue or _may_route(stream, kind, message):",
            "performance",
            (
                "'or': with may_queue False, messages that may route go through _handle_with_notices (a task "
                "and a future) instead of _handle; EndpointPicker.may_queue is False only when no admission "
                "gate is enabled, and a disabled gate decides without calling on_queued, so no notice is ever"
                " sent and the answers are the same; with may_queue True, messages that cannot route (middle "
                "duplex chunks, trailers after routing, response trailers) take the same path with the same "
                "answers"
            ),
        ),
        "xǁExtProcServiceǁProcess__mutmut_47": (
            "elif may_queue and _may_route(stream, None, message):",
            "performance",
            (
                "_may_route(stream, None, ...) is True for every request-phase message, so with a queue on, "
                "middle duplex body chunks also go through _handle_with_notices; _on_request_body only holds "
                "them (no route, no pick, answers []), so only a task and a future per chunk are added"
            ),
        ),
        "xǁExtProcServiceǁProcess__mutmut_67": (
            "return",
            "same-value",
            (
                "'return' instead of 'break': nothing follows the loop inside the try, so both leave it "
                "straight to the finally (settle, free); the generator ends the same way"
            ),
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_3": (
            "if counter is None or tracker is None and pick is None or stream.freed:",
            "same-value",
            (
                "`tracker is None and pick is None` instead of `tracker is None or pick is None`: the two "
                "differ only when a counter exists and exactly one of tracker/pick is None, and that state is"
                " unreachable: stream.output is created only in _on_response_headers under `pick is not None`"
                " and `self.output is not None`, stream.pick is never reset to None, and self.output is set "
                "once in __init__"
            ),
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_37": (
            'log.exception("counting output tokens of %s failed; not counted further", None)',
            "message",
            (
                "log.exception's argument (the request id) becomes None: only the text of the error log line "
                'changes ("... of None failed ..."); the except path still stops counting the same way'
            ),
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_38": (
            "log.exception(stream.request_id)",
            "message",
            (
                "log.exception(request_id) with no args: the error log line's text becomes the request id (no"
                " %-formatting is done without args, so a client id with '%' cannot break it); behaviour "
                "otherwise identical"
            ),
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_39": (
            'log.exception("counting output tokens of %s failed; not counted further", )',
            "message",
            (
                "the format without its argument: logging does no %-formatting without args, so the line "
                "reads a literal '%s'; only the log text changes"
            ),
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_40": (
            'log.exception("XXcounting output tokens of %s failed; not counted furtherXX", stream.request_id)',  # noqa: E501
            "message",
            "'XX' added around the error log line's text",
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_48": (
            "None, counter.max_line_bytes,",
            "message",
            (
                "the warning's request-id argument becomes None ('response of None: ...'); '%s' formats None "
                "fine, only the log text changes"
            ),
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_53": (
            '"XXresponse of %s: an SSE line over %d bytes skipped (its tokens are not counted)XX",',
            "message",
            "'XX' added around the warning's text",
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_54": (
            '"response of %s: an sse line over %d bytes skipped (its tokens are not counted)",',
            "message",
            "'SSE' lower-cased in the warning's text",
        ),
        "xǁExtProcServiceǁ_count_output__mutmut_56": (
            'stream.output = ""',
            "performance",
            (
                'stream.output = "" instead of None after the body\'s end: the end is always followed by '
                "_free (end=True comes only from the end_of_stream chunk and the trailers, both with a pick),"
                " so the one later reader, _on_response_body (`stream.output is not None`), calls "
                "_count_output, which returns at `stream.freed` before touching the counter: only a no-op "
                "call per late chunk"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_20": (
            'if kind == "XXresponse_headersXX":',
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_21": (
            'if kind == "RESPONSE_HEADERS":',
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_22": (
            "return [self._on_response_headers(None, message.response_headers)]",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_23": (
            "return [self._on_response_headers(stream, None)]",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_24": (
            "return [self._on_response_headers(message.response_headers)]",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_25": (
            "return [self._on_response_headers(stream, )]",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_27": (
            'if kind == "XXresponse_bodyXX":',
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_28": (
            'if kind == "RESPONSE_BODY":',
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_29": (
            "answer = None",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_30": (
            "answer = self._response_body_answer(None, message.response_body)",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_31": (
            "answer = self._response_body_answer(stream, None)",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_32": (
            "answer = self._response_body_answer(message.response_body)",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_33": (
            "answer = self._response_body_answer(stream, )",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_34": (
            "self._on_response_body(None, message.response_body)",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_35": (
            "self._on_response_body(stream, None)",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_36": (
            "self._on_response_body(message.response_body)",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_37": (
            "self._on_response_body(stream, )",
            "same-value",
            (
                "unreachable: Process answers every response_headers and response_body message itself (the "
                "first two branches of its dispatch) and never passes one to _handle; the only kinds that get"
                " this far are response_trailers and a message without a oneof, for which the original test "
                "is False just as the mutated one is"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_42": (
            "self._count_output(stream, None, end=True)",
            "same-value",
            (
                "OutputTokens.feed returns at once for any falsy chunk ('if not data: return'), so feed(None)"
                ' and feed(b"") do the same; finish() then runs as before'
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_70": (
            "log.warning(None, kind)",
            "message",
            (
                "only the warning logged for a message without a known phase (its format or argument) "
                "changes; the answer ([]) is the same"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_71": (
            'log.warning("ignoring ext_proc message without a known phase: %s", None)',
            "message",
            (
                "only the warning logged for a message without a known phase (its format or argument) "
                "changes; the answer ([]) is the same"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_72": (
            "log.warning(kind)",
            "message",
            (
                "only the warning logged for a message without a known phase (its format or argument) "
                "changes; the answer ([]) is the same"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_73": (
            'log.warning("ignoring ext_proc message without a known phase: %s", )',
            "message",
            (
                "only the warning logged for a message without a known phase (its format or argument) "
                "changes; the answer ([]) is the same"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_74": (
            'log.warning("XXignoring ext_proc message without a known phase: %sXX", kind)',
            "message",
            (
                "only the warning logged for a message without a known phase (its format or argument) "
                "changes; the answer ([]) is the same"
            ),
        ),
        "xǁExtProcServiceǁ_handle__mutmut_75": (
            'log.warning("IGNORING EXT_PROC MESSAGE WITHOUT A KNOWN PHASE: %S", kind)',
            "message",
            (
                "only the warning logged for a message without a known phase (its format or argument) "
                "changes; the answer ([]) is the same"
            ),
        ),
        "xǁExtProcServiceǁ_handle_with_notices__mutmut_20": (
            'stream.notice = ""',
            "same-value",
            (
                "stream.notice is read only by _route (to pass on_queued) and _queued (called by the gate "
                "during a pick); with may_queue every message that can reach _route goes through "
                "_handle_with_notices, which sets a fresh future before the pick, and _queued runs only "
                "inside the pick's task, finished or cancelled before this finally; so the '' left after the "
                "handling is never read (with may_queue False notice stays None)"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_body__mutmut_32": (
            "stream.body = None",
            "same-value",
            (
                "stream.body is never read after the body completes: _route then sets the phase to UPSTREAM "
                "or DONE, and both readers (_on_request_body, _on_request_trailers) first require phase "
                "REQUEST_BODY; None and a fresh bytearray both drop the joined buffer"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_21": (
            'stream.subset = epp.subset_hint(message) if (message.HasField("metadata_context")) or True else None',  # noqa: E501
            "same-value",
            (
                "epp.subset_hint of a message without metadata_context returns None (filter_metadata.get of "
                "the namespace is None), the same as the else branch"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_3": (
            'log.warning("ignoring request headers sent again on the stream of %s", None)',
            "message",
            (
                "only the argument of the 'ignoring request headers sent again' warning changes (None instead"
                " of the request id)"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_34": (
            'stream.path = _normalized_path(stream.headers.get(":path", "XXXX"))',
            "message",
            (
                "a request without :path gets path 'XXXX' instead of '': both normalise to themselves, "
                "neither is routable nor a /v1/responses/{id} path, so EndpointPicker routes it untracked the"
                " same way; the path only reaches its 'routed ... (untracked)' log line"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_4": (
            "log.warning(stream.request_id)",
            "message",
            (
                "only the text of the 'ignoring request headers sent again' warning changes (the request id "
                "alone)"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_5": (
            'log.warning("ignoring request headers sent again on the stream of %s", )',
            "message",
            "only the warning changes: without arguments logging prints the format string as it is",
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_6": (
            'log.warning("XXignoring request headers sent again on the stream of %sXX", stream.request_id)',
            "message",
            "only the text of the 'ignoring request headers sent again' warning changes",
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_58": (
            'empty = b"" if routable and stream.headers.get(":method", "XXXX").upper() == "POST" else None',
            "same-value",
            (
                "'XXXX'.upper() and ''.upper() both differ from 'POST': a request without :method is never "
                "taken for a POST either way"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_64": (
            "return [await self._route(stream, empty, in_body=None)]",
            "same-value",
            (
                "in_body is only read for its truth (route_in_body if in_body else route_in_headers) and as "
                "part of the answer cache key: None builds the same route_in_headers answer as False (at most"
                " one more equal entry in the cache)"
            ),
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_71": (
            "return [await self._route(stream, None, in_body=None)]",
            "same-value",
            (
                "as _64: in_body None builds the same route_in_headers answer as False; only the cache key "
                "differs"
            ),
        ),
        "xǁExtProcServiceǁ_follow_answer__mutmut_15": (
            "if pick.responses_api or pick.response_id is None:",
            "performance",
            (
                "'or': the first 64 KB of the answer are also scanned for an id for chat/completions answers "
                "and for a Responses request that named its id; EndpointPicker.response_stored ignores a pick"
                " that is not responses_api, and a named id is the id the answer carries (vLLM's request_id "
                "field), so the same home is remembered again; only the scan's work is added"
            ),
        ),
        "xǁExtProcServiceǁ_on_response_headers__mutmut_42": (
            "stream.phase = None",
            "same-value",
            (
                "phase None instead of RESPONSE_BODY: every later read of phase is an identity test against "
                "REQUEST_HEADERS, REQUEST_BODY or DONE (_may_route, _on_request_*, Process's break, "
                "_Stream.done), which None fails exactly as RESPONSE_BODY does; phase is never logged or "
                "answered"
            ),
        ),
        "xǁExtProcServiceǁ_on_response_headers__mutmut_44": (
            "answer = None",
            "performance",
            (
                "the served-answer cache is never read: epp.served_answer(endpoint, conformance=...) is "
                "rebuilt per response, an equal message (same endpoint metadata and conformance header)"
            ),
        ),
        "xǁExtProcServiceǁ_on_response_headers__mutmut_45": (
            "answer = self._served_answers.get(None)",
            "performance",
            (
                "the cache is looked up under None, never found: the served answer is rebuilt per response, "
                "an equal message"
            ),
        ),
        "xǁExtProcServiceǁ_on_response_headers__mutmut_47": (
            "if len(self._served_answers) > MAX_CACHED_ANSWERS:",
            "performance",
            (
                "'>' instead of '>=': the served-answer cache is cleared at 4097 entries instead of 4096; the"
                " answers returned are the same"
            ),
        ),
        "xǁExtProcServiceǁ_on_response_headers__mutmut_53": (
            "self._served_answers[pick.endpoint] = None",
            "performance",
            (
                "the cache keeps None, so every response rebuilds its served answer; the answer returned is "
                "the freshly built local one, equal to the cached one"
            ),
        ),
        "xǁExtProcServiceǁ_read_response_id__mutmut_16": (
            "if response_id is not None or len(head) > responses_stream.MAX_ID_SCAN_BYTES:",
            "performance",
            (
                "'>' instead of '>=': head never exceeds MAX_ID_SCAN_BYTES (each chunk adds data[:MAX - "
                "len(head)]), so a full head with no id is kept and re-scanned per chunk while the slice adds"
                " nothing; it can never yield an id the original missed"
            ),
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_10": (
            'stream.request_id = epp.header_map(message.request_headers).get("")',
            "message",
            ".get('') is None: only _reject's log line loses the request id",
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_11": (
            'stream.request_id = epp.header_map(message.request_headers).get("x-request-id", )',
            "message",
            ".get('x-request-id') gives None instead of '' when absent: only read by _reject's log line",
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_13": (
            'stream.request_id = epp.header_map(message.request_headers).get("XXx-request-idXX", "")',
            "message",
            "wrong header name: the id is ''; only _reject's log line loses it",
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_14": (
            'stream.request_id = epp.header_map(message.request_headers).get("X-REQUEST-ID", "")',
            "message",
            (
                "header_map lower-cases keys, so 'X-REQUEST-ID' is never found: the id is ''; only _reject's "
                "log line loses it"
            ),
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_15": (
            'stream.request_id = epp.header_map(message.request_headers).get("x-request-id", "XXXX")',
            "message",
            "'XXXX' instead of '' when the header is absent: only read by _reject's log line",
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_4": (
            'if message.WhichOneof("request") != "request_headers":',
            "message",
            (
                "the request id set in _refuse is only read by _reject's log line; with != the refused stream"
                " logs '' (a headers message) or '' from the unset request_headers of another message; the "
                "429 answer and its counter are the same"
            ),
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_5": (
            'if message.WhichOneof("request") == "XXrequest_headersXX":',
            "message",
            (
                "the oneof name never matches: the refused stream's request id stays '' and only _reject's "
                "log line loses it"
            ),
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_6": (
            'if message.WhichOneof("request") == "REQUEST_HEADERS":',
            "message",
            "as _5: 'REQUEST_HEADERS' never matches; only _reject's log line loses the request id",
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_7": (
            "stream.request_id = None",
            "message",
            "request id None instead of the client's: only read by _reject's log line",
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_8": (
            'stream.request_id = epp.header_map(message.request_headers).get(None, "")',
            "message",
            "header_map(...).get(None, '') is '': only _reject's log line loses the request id",
        ),
        "xǁExtProcServiceǁ_refuse__mutmut_9": (
            'stream.request_id = epp.header_map(message.request_headers).get("x-request-id", None)',
            "message",
            "None instead of '' when the header is absent: only read by _reject's log line",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_10": (
            'log.info("rejected %s with %d (%s): %s", stream.request_id, reason, exc)',
            "message",
            "only the 'rejected ...' INFO log line changes (an argument missing)",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_11": (
            'log.info("rejected %s with %d (%s): %s", stream.request_id, status, exc)',
            "message",
            "only the 'rejected ...' INFO log line changes (an argument missing)",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_12": (
            'log.info("rejected %s with %d (%s): %s", stream.request_id, status, reason, )',
            "message",
            "only the 'rejected ...' INFO log line changes (an argument missing)",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_13": (
            'log.info("XXrejected %s with %d (%s): %sXX", stream.request_id, status, reason, exc)',
            "message",
            "only the text of the 'rejected ...' INFO log line changes",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_14": (
            'log.info("REJECTED %S WITH %D (%S): %S", stream.request_id, status, reason, exc)',
            "message",
            (
                "only the 'rejected ...' INFO log line changes (upper-case %S/%D do not format: a logging "
                "formatting error on stderr, not raised)"
            ),
        ),
        "xǁExtProcServiceǁ_reject__mutmut_3": (
            "log.info(None, stream.request_id, status, reason, exc)",
            "message",
            (
                "only the 'rejected ...' INFO log line changes (format None: logging reports a formatting "
                "error on stderr, the caller is unaffected); the answer, picker.rejected and the counter are "
                "unchanged"
            ),
        ),
        "xǁExtProcServiceǁ_reject__mutmut_4": (
            'log.info("rejected %s with %d (%s): %s", None, status, reason, exc)',
            "message",
            "only an argument of the 'rejected ...' INFO log line changes",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_5": (
            'log.info("rejected %s with %d (%s): %s", stream.request_id, None, reason, exc)',
            "message",
            (
                "only an argument of the 'rejected ...' INFO log line changes (%d of None: a logging "
                "formatting error on stderr, not raised)"
            ),
        ),
        "xǁExtProcServiceǁ_reject__mutmut_6": (
            'log.info("rejected %s with %d (%s): %s", stream.request_id, status, None, exc)',
            "message",
            "only an argument of the 'rejected ...' INFO log line changes",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_7": (
            'log.info("rejected %s with %d (%s): %s", stream.request_id, status, reason, None)',
            "message",
            "only an argument of the 'rejected ...' INFO log line changes",
        ),
        "xǁExtProcServiceǁ_reject__mutmut_8": (
            "log.info(stream.request_id, status, reason, exc)",
            "message",
            (
                "only the 'rejected ...' INFO log line changes (the request id as format with four arguments:"
                " a logging formatting error on stderr, not raised)"
            ),
        ),
        "xǁExtProcServiceǁ_reject__mutmut_9": (
            'log.info("rejected %s with %d (%s): %s", status, reason, exc)',
            "message",
            (
                "only the 'rejected ...' INFO log line changes (an argument missing: a logging formatting "
                "error on stderr, not raised)"
            ),
        ),
        "xǁExtProcServiceǁ_route_form__mutmut_6": (
            "answer = await self._route(stream, body, in_body=None, size=_declared_size(stream.headers, body))",  # noqa: E501
            "same-value",
            "None is read as False (`if pick.body is not None and in_body`, `route_in_body if in_body`)",
        ),
        "x__declared_size__mutmut_8": (
            'declared = headers.get("content-length", "XXXX")',
            "same-value",
            "no content-length: 'XXXX' is no more digits than '', so the start's length either way",
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_80": (
            'content_type = stream.headers.get("content-type", None)',
            "same-value",
            "no content type: `is_form` reads None as it reads '' (not a form)",
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_82": (
            'content_type = stream.headers.get("content-type", )',
            "same-value",
            "as _on_request_headers__mutmut_80",
        ),
        "xǁExtProcServiceǁ_on_request_headers__mutmut_85": (
            'content_type = stream.headers.get("content-type", "XXXX")',
            "same-value",
            "as _on_request_headers__mutmut_80: 'XXXX' is no multipart form either",
        ),
        "xǁExtProcServiceǁ_answered__mutmut_15": (
            "ttft_s = (pick.first_token_ns - stream.started_ns) / 1000000001.0",
            "same-value",
            "the time is one part in a billion shorter: no bucket bound or sum a scrape shows is that fine",
        ),
        "xǁExtProcServiceǁ_answered__mutmut_37": (
            "tpot_s = (end_ns - pick.first_token_ns) / 1000000001.0 / (per_sequence - 1)",
            "same-value",
            "the time is one part in a billion shorter: no bucket bound or sum a scrape shows is that fine",
        ),
        "xǁExtProcServiceǁ_answered__mutmut_60": (
            "(end_ns - stream.started_ns) / 1000000001.0,",
            "same-value",
            "the duration is one part in a billion shorter: no bucket bound or sum a scrape shows is that "
            "fine",
        ),
        "xǁExtProcServiceǁ_route__mutmut_15": (
            "on_queued=functools.partial(self._queued, stream) if (stream.notice is not None) or True else None,",  # noqa: E501
            "same-value",
            (
                "when stream.notice is None the callback given is partial(self._queued, stream), and _queued "
                "does nothing without a notice future; notice is set before _route runs on the notices path "
                "and stays None on the other, so the picker's on_queued call has no effect either way"
            ),
        ),
        "xǁExtProcServiceǁ_route__mutmut_27": (
            'log.exception("picker failed on %s", None)',
            "message",
            "only the argument of the 'picker failed on %s' exception log line changes",
        ),
        "xǁExtProcServiceǁ_route__mutmut_28": (
            "log.exception(stream.request_id)",
            "message",
            "only the text of the 'picker failed on %s' exception log line changes (the request id alone)",
        ),
        "xǁExtProcServiceǁ_route__mutmut_29": (
            'log.exception("picker failed on %s", )',
            "message",
            (
                "only the exception log line changes: without arguments logging prints the format string as "
                "it is"
            ),
        ),
        "xǁExtProcServiceǁ_route__mutmut_30": (
            'log.exception("XXpicker failed on %sXX", stream.request_id)',
            "message",
            "only the text of the 'picker failed on %s' exception log line changes",
        ),
        "xǁExtProcServiceǁ_route__mutmut_34": (
            "return self._reject(stream, None)",
            "message",
            (
                "only _reject's log line changes (None for the error): an unexpected error and None both "
                "answer 500 'internal error in the picker' with reason internal-error (answers.error_answer "
                "shows only the picker's and the router's own texts)"
            ),
        ),
        "xǁExtProcServiceǁ_route__mutmut_38": (
            "stream.phase = None",
            "same-value",
            (
                "Phase.UPSTREAM is never compared: every reader asks `is Phase.DONE`, `is (not) "
                "Phase.REQUEST_HEADERS/REQUEST_BODY` or `not in (REQUEST_HEADERS, REQUEST_BODY)`, where None "
                "answers as UPSTREAM does; response headers then set RESPONSE_BODY"
            ),
        ),
        "xǁExtProcServiceǁ_routing_answer__mutmut_3": (
            "answer = None",
            "performance",
            (
                "the cache is never read: each routing answer is built again by "
                "epp.route_in_body/route_in_headers, with the same content (and the dict still filled and "
                "emptied at its bound)"
            ),
        ),
        "xǁExtProcServiceǁ_routing_answer__mutmut_4": (
            "answer = self._routing_answers.get(None)",
            "performance",
            "get(None) never hits (keys are tuples): each answer is built again, the same content",
        ),
        "xǁExtProcServiceǁ_routing_answer__mutmut_6": (
            "if len(self._routing_answers) > MAX_CACHED_ANSWERS:",
            "performance",
            (
                "the answer cache is emptied at 4097 entries instead of 4096: one cached answer more, the "
                "answers are the same"
            ),
        ),
    },
    "picker/group_request.py": {
        "x__non_negative__mutmut_6": (
            'if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= float("inf"):',  # noqa: E501
            "same-value",
            "agent hints are finite numbers (the parser refuses others): never inf",
        ),
        "x__non_negative__mutmut_9": (
            'if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("INF"):',  # noqa: E501
            "same-value",
            "float('INF') == float('inf')",
        ),
        "x_group_request__mutmut_19": (
            "override = _override(None, load_only=True)",
            "same-value",
            "with load_only, `_override` answers before it reads the request",
        ),
        "x_group_request__mutmut_27": (
            "override = _override(request, load_only=None)",
            "same-value",
            "None is read as False (`if load_only`)",
        ),
        "x_group_request__mutmut_32": (
            "isl = len(tokens) if (tokens is not None) and False else max(1, request.body_size // 4)",
            "same-value",
            "a tokenized request's isl is only new_tokens, which `admit` sets afresh under wspt",
        ),
        "x_group_request__mutmut_39": (
            "isl = len(tokens) if tokens is not None else max(2, request.body_size // 4)",
            "same-value",
            "differs only for a body under 8 bytes; a routed body (model and prompt) is longer",
        ),
    },
    "picker/pipeline.py": {
        "xǁEndpointPickerǁ_pick_untracked__mutmut_2": (
            "raise NoEligibleWorker(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_3": (
            'raise NoEligibleWorker("XXno worker is configuredXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_4": (
            'raise NoEligibleWorker("NO WORKER IS CONFIGURED")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_groups__mutmut_15": (
            "g.name, g.address, weight=g.weight, tls=config.groups.tls, owner=None,",
            "random",
            "the remote group draws its own random owner id, not the picker's (read nowhere else)",
        ),
        "xǁEndpointPickerǁ_groups__mutmut_21": (
            "g.name, g.address, weight=g.weight, tls=config.groups.tls, lease_s=config.groups.lease_s,",
            "random",
            "the remote group draws its own random owner id, not the picker's (read nowhere else)",
        ),
        "xǁEndpointPickerǁ_local_group__mutmut_1": (
            "def _local_group(self, name: str, weight: float = 2.0) -> LocalGroup:",
            "same-value",
            "only the plain group and a remote-only config's stand-in take it; neither is ranked",
        ),
        "xǁEndpointPickerǁ_open_worker_session__mutmut_13": (
            "self.selector.finish(request_id, None)",
            "message",
            "the cause given to `finish` only reaches the selector's debug line",
        ),
        "xǁEndpointPickerǁ_open_worker_session__mutmut_16": (
            'self.selector.finish(request_id, "XXcancelled while its worker session openedXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_open_worker_session__mutmut_17": (
            'self.selector.finish(request_id, "CANCELLED WHILE ITS WORKER SESSION OPENED")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pin_session__mutmut_4": (
            'now, group = self._clock(), pick.group or "XXXX"',
            "same-value",
            "a tracked pick carries its group's name, never empty (config refuses an empty name)",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_3": (
            'group = pick.group or "XXXX"',
            "same-value",
            "a Responses API pick is tracked: it carries its group's name, never empty",
        ),
        "xǁEndpointPickerǁ_sweep_sessions__mutmut_11": (
            "interval_s = min(max(self.config.session_ttl_s / 5, 0.05), MAX_SESSION_SWEEP_S)",
            "performance",
            "sweeps every ttl/5 instead of ttl/4: more sweeps, no pin dropped later",
        ),
        "xǁEndpointPickerǁ_sweep_sessions_later__mutmut_10": (
            'self._sweeper = loop.create_task(self._sweep_sessions(), name="XXsession-sweeperXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_sweep_sessions_later__mutmut_11": (
            'self._sweeper = loop.create_task(self._sweep_sessions(), name="SESSION-SWEEPER")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_sweep_sessions_later__mutmut_7": (
            "self._sweeper = loop.create_task(self._sweep_sessions(), name=None)",
            "performance",
            "only the sweeper task's name changes",
        ),
        "xǁEndpointPickerǁ_sweep_sessions_later__mutmut_9": (
            "self._sweeper = loop.create_task(self._sweep_sessions(), )",
            "performance",
            "only the sweeper task's name changes",
        ),
        "xǁEndpointPickerǁ_worker_session_action__mutmut_18": (
            'raise RequestInvalid("XXnvext.session_control.timeout must be a positive integer (seconds)XX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁanswered__mutmut_47": (
            '"worker %s (%s) answered %d: %d failed answers in a row", None, pick.endpoint, status, after',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁanswered__mutmut_48": (
            '"worker %s (%s) answered %d: %d failed answers in a row", worker, None, status, after',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁanswered__mutmut_56": (
            '"XXworker %s (%s) answered %d: %d failed answers in a rowXX", worker, pick.endpoint, status, after',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁanswered__mutmut_61": (
            'log.info("worker %s (%s) answers again after %d failed answers", None, pick.endpoint, before)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁanswered__mutmut_62": (
            'log.info("worker %s (%s) answers again after %d failed answers", worker, None, before)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁanswered__mutmut_68": (
            'log.info("XXworker %s (%s) answers again after %d failed answersXX", worker, pick.endpoint, before)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_10": (
            "log.info(None, model, record)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_11": (
            'log.info("busy thresholds of %s: %s", None, record)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_12": (
            'log.info("busy thresholds of %s: %s", model, None)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_13": (
            "log.info(model, record)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_14": (
            'log.info("busy thresholds of %s: %s", record)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_15": (
            'log.info("busy thresholds of %s: %s", model, )',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_16": (
            'log.info("XXbusy thresholds of %s: %sXX", model, record)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁset_thresholds__mutmut_17": (
            'log.info("BUSY THRESHOLDS OF %S: %S", model, record)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_33": (
            "request = GroupRequest(name, [], restrictions=restricted, isl=None)",
            "same-value",
            "no token ids: isl None counts as 0 tokens, as isl 0 does",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_37": (
            "request = GroupRequest(name, [], restrictions=restricted, )",
            "same-value",
            "no token ids: isl None counts as 0 tokens, as isl 0 does",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_45": (
            "log.info(None, loggable(path, 100), name, choice.worker,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_46": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", None, name, choice.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_47": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", loggable(path, 100), None, choice.worker,',  # noqa: E501
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_48": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", loggable(path, 100), name, None,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_49": (
            "None)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_50": (
            "log.info(loggable(path, 100), name, choice.worker,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_51": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", name, choice.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_52": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", loggable(path, 100), choice.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_53": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", loggable(path, 100), name, choice.endpoint)  # fmt: skip',  # noqa: E501
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_54": (
            ")  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_55": (
            'log.info("XXrouted %s (untracked, model %s) to %s (%s)XX", loggable(path, 100), name, choice.worker,',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_56": (
            'log.info("ROUTED %S (UNTRACKED, MODEL %S) TO %S (%S)", loggable(path, 100), name, choice.worker,',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_60": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", loggable(path, ), name, choice.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_61": (
            'log.info("routed %s (untracked, model %s) to %s (%s)", loggable(path, 101), name, choice.worker,',  # noqa: E501
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_76": (
            "raise AssertionError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_77": (
            'raise AssertionError("XXunreachable: the last model\'s failure is raisedXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_pick_untracked__mutmut_78": (
            'raise AssertionError("UNREACHABLE: THE LAST MODEL\'S FAILURE IS RAISED")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁset_discovered_adapters__mutmut_34": (
            'what = "XXa modelXX" if name in self._pools else f"{claimed}\'s"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁset_discovered_adapters__mutmut_38": (
            "None, loggable(name), what)  # fmt: skip",
            "message",
            "a log line's arguments (the model or the name shown)",
        ),
        "xǁEndpointPickerǁset_discovered_adapters__mutmut_39": (
            "model, None, what)  # fmt: skip",
            "message",
            "a log line's arguments (the model or the name shown)",
        ),
        "xǁEndpointPickerǁset_discovered_adapters__mutmut_45": (
            'log.warning("XXworkers of %s list LoRA adapter %s, already %s: not theirs hereXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁset_discovered_adapters__mutmut_46": (
            'log.warning("workers of %s list lora adapter %s, already %s: not theirs here",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ__init____mutmut_16": (
            "self.owner_id = None  # names this picker's requests in remote groups (leases)",
            "random",
            "each remote group draws its own random owner id, not the picker's (read nowhere else)",
        ),
        "xǁEndpointPickerǁfinish__mutmut_14": (
            "log.debug(None, pick.request_id, cause)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁfinish__mutmut_15": (
            'log.debug("freed %s (%s)", None, cause)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁfinish__mutmut_16": (
            'log.debug("freed %s (%s)", pick.request_id, None)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁfinish__mutmut_17": (
            "log.debug(pick.request_id, cause)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁfinish__mutmut_18": (
            'log.debug("freed %s (%s)", cause)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁfinish__mutmut_19": (
            'log.debug("freed %s (%s)", pick.request_id, )',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁfinish__mutmut_20": (
            'log.debug("XXfreed %s (%s)XX", pick.request_id, cause)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁfinish__mutmut_21": (
            'log.debug("FREED %S (%S)", pick.request_id, cause)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁfinish__mutmut_3": (
            "if pick.tracked and self.selector.finish(pick.request_id, None):",
            "message",
            "the cause given to `finish` only reaches the selector's debug line",
        ),
        "xǁEndpointPickerǁfinish__mutmut_36": (
            "decode_s = (time.perf_counter_ns() - first) / 1000000001.0 if first else None",
            "margin",
            "a decode time divided by 1,000,000,001 instead of 1e9: one part in a billion, which moves an observation only where it lands that close to a bucket bound",  # noqa: E501
        ),
        "xǁEndpointPickerǁfirst_token__mutmut_11": (
            "self.metrics.ttft.observe((pick.model,), (pick.first_token_ns - pick.started_ns) / 1000000001.0)",  # noqa: E501
            "margin",
            "a time to first token divided by 1,000,000,001 instead of 1e9: one part in a billion, which moves an observation only where it lands that close to a bucket bound",  # noqa: E501
        ),
        "xǁEndpointPickerǁpick__mutmut_190": (
            "now = None",
            "performance",
            "every request goes through `selector.route`: for one local group, the same commit",
        ),
        "xǁEndpointPickerǁpick__mutmut_210": (
            "new_tokens=None,",
            "same-value",
            "new_tokens is read only under wspt, where `admit` sets it afresh",
        ),
        "xǁEndpointPickerǁpick__mutmut_216": (
            "",
            "same-value",
            "ParsedRequest.lora_name is always None (the model names an adapter)",
        ),
        "xǁEndpointPickerǁpick__mutmut_251": (
            "undo=lambda _: self.selector.finish(request_id, None),",
            "message",
            "the cause given to `finish` only reaches the selector's debug line",
        ),
        "xǁEndpointPickerǁpick__mutmut_254": (
            'undo=lambda _: self.selector.finish(request_id, "XXits client left the queueXX"),',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_255": (
            'undo=lambda _: self.selector.finish(request_id, "ITS CLIENT LEFT THE QUEUE"),',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_262": (
            "if request.n >= 1:  # n sequences decode from the one prompt, each holding its own blocks (any group)",  # noqa: E501
            "performance",
            "adds an `output_tokens(id, 0, 1)` call that does nothing",
        ),
        "xǁEndpointPickerǁpick__mutmut_278": (
            "session_pin = self._session_route(request, session_id, pinned, decision) if (session_id) or True else None",  # noqa: E501
            "same-value",
            "`_session_route` answers None for no session id, as the else branch does",
        ),
        "xǁEndpointPickerǁpick__mutmut_281": (
            "session_pin = self._session_route(request, session_id, None, decision) if session_id else None",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_289": (
            "opened_on, opened_new = None, True",
            "same-value",
            "`opened_new` is read only with `opened_on`, which stays None unless the open sets both",
        ),
        "xǁEndpointPickerǁpick__mutmut_381": (
            "len(tokens) if tokens is not None else 0, choice.request_blocks if (tokens is not None) or True else 0,",  # noqa: E501
            "same-value",
            "a request routed on load only has no prompt blocks: its request_blocks is 0 either way (test_a_request_routed_on_load_only_gives_no_length_and_no_hit_rate)",  # noqa: E501
        ),
        "xǁEndpointPickerǁpick__mutmut_397": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_398": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_416": (
            'f" lora={request.lora_name}" if (request.lora_name) and False else "",',
            "message",
            "a log line's arguments (the adapter shown in the routed line)",
        ),
        "xǁEndpointPickerǁpick__mutmut_419": (
            'f"group {decision.group} worker " if (self.hierarchical) and False else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_425": (
            'f" session={loggable(session_id)}" if session_id else "XXXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_426": (
            'f" queued {waited_s * 1000:.0f} ms" if (waited_s) and False else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_427": (
            'f" queued {waited_s * 1000:.0f} ms" if (waited_s) or True else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_428": (
            'f" queued {waited_s / 1000:.0f} ms" if waited_s else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_429": (
            'f" queued {waited_s * 1001:.0f} ms" if waited_s else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_430": (
            'f" queued {waited_s * 1000:.0f} ms" if waited_s else "XXXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_431": (
            '" (re-decided at commit)" if (decision.redecided and pinned is None) and False else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_432": (
            '" (re-decided at commit)" if (decision.redecided and pinned is None) or True else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_433": (
            '"XX (re-decided at commit)XX" if decision.redecided and pinned is None else "",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_434": (
            '" (RE-DECIDED AT COMMIT)" if decision.redecided and pinned is None else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_435": (
            '" (re-decided at commit)" if decision.redecided or pinned is None else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_436": (
            '" (re-decided at commit)" if decision.redecided and pinned is not None else "",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_437": (
            '" (re-decided at commit)" if decision.redecided and pinned is None else "XXXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_53": (
            "log.info(None, loggable(client_request_id), request.load_only_reason)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_54": (
            'log.info("%s: %s: routing on load only", None, request.load_only_reason)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_55": (
            'log.info("%s: %s: routing on load only", loggable(client_request_id), None)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_56": (
            "log.info(loggable(client_request_id), request.load_only_reason)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_57": (
            'log.info("%s: %s: routing on load only", request.load_only_reason)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_58": (
            'log.info("%s: %s: routing on load only", loggable(client_request_id), )',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_59": (
            'log.info("XX%s: %s: routing on load onlyXX", loggable(client_request_id), request.load_only_reason)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_60": (
            'log.info("%S: %S: ROUTING ON LOAD ONLY", loggable(client_request_id), request.load_only_reason)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_64": (
            "None, self.bodies.max_prompt_values,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_69": (
            '"XX%s: its prompt holds more than %d JSON values: routing on load onlyXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁpick__mutmut_70": (
            '"%s: its prompt holds more than %d json values: routing on load only",',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_83": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_84": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁpick__mutmut_88": (
            '"XXtokenizer failed for %s (%s): routing on load onlyXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁresolve_model__mutmut_21": (
            "base = max(bases, key=None)",
            "same-value",
            "every model the name starts with (before a colon) is a prefix of the name, so of the others too: the longest is also the greatest",  # noqa: E501
        ),
        "xǁEndpointPickerǁresolve_model__mutmut_23": (
            "base = max(bases, )",
            "same-value",
            "every model the name starts with (before a colon) is a prefix of the name, so of the others too: the longest is also the greatest",  # noqa: E501
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_12": (
            "log.info(None, loggable(session_id))",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_13": (
            'log.info("session %s closed", None)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_14": (
            "log.info(loggable(session_id))",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_15": (
            'log.info("session %s closed", )',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_16": (
            'log.info("XXsession %s closedXX", loggable(session_id))',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_17": (
            'log.info("SESSION %S CLOSED", loggable(session_id))',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_26": (
            "if pinned is not None and pinned == (decision.group, decision.choice.worker):",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_27": (
            "log.info(None,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_28": (
            "None, pinned[1], decision.choice.worker)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_29": (
            "loggable(session_id), None, decision.choice.worker)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_30": (
            "loggable(session_id), pinned[1], None)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_31": (
            "log.info(loggable(session_id), pinned[1], decision.choice.worker)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_32": (
            "pinned[1], decision.choice.worker)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_33": (
            "loggable(session_id), decision.choice.worker)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_34": (
            "loggable(session_id), pinned[1], )  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_35": (
            'log.info("XXsession %s leaves %s for %s (gone, busy or not allowed); pinned there once it answersXX",',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_session_route__mutmut_36": (
            'log.info("SESSION %S LEAVES %S FOR %S (GONE, BUSY OR NOT ALLOWED); PINNED THERE ONCE IT ANSWERS",',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_17": (
            "log.debug(None, loggable(response_id), pick.worker, pick.endpoint)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_18": (
            'log.debug("response %s is stored on %s (%s)", None, pick.worker, pick.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_19": (
            'log.debug("response %s is stored on %s (%s)", loggable(response_id), None, pick.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_20": (
            'log.debug("response %s is stored on %s (%s)", loggable(response_id), pick.worker, None)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_21": (
            "log.debug(loggable(response_id), pick.worker, pick.endpoint)",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_22": (
            'log.debug("response %s is stored on %s (%s)", pick.worker, pick.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_23": (
            'log.debug("response %s is stored on %s (%s)", loggable(response_id), pick.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_24": (
            'log.debug("response %s is stored on %s (%s)", loggable(response_id), pick.worker, )',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_25": (
            'log.debug("XXresponse %s is stored on %s (%s)XX", loggable(response_id), pick.worker, pick.endpoint)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁresponse_stored__mutmut_26": (
            'log.debug("RESPONSE %S IS STORED ON %S (%S)", loggable(response_id), pick.worker, pick.endpoint)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_10": (
            "loggable(request.previous_response_id), request.model,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_11": (
            '"routed on load", request.model,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_12": (
            '"routed on load", loggable(request.previous_response_id), )  # fmt: skip',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_13": (
            '"XXprevious_response_id %s: no worker of %s is known to store it (unknown, lapsed or gone); XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_14": (
            '"PREVIOUS_RESPONSE_ID %S: NO WORKER OF %S IS KNOWN TO STORE IT (UNKNOWN, LAPSED OR GONE); "',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_15": (
            '"XXrouted on loadXX", loggable(request.previous_response_id), request.model,',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_16": (
            '"ROUTED ON LOAD", loggable(request.previous_response_id), request.model,',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_7": (
            "None, loggable(request.previous_response_id), request.model,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_8": (
            '"routed on load", None, request.model,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_response_home__mutmut_9": (
            '"routed on load", loggable(request.previous_response_id), None,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_26": (
            "log.info(None, loggable(path, 100), home.worker,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_27": (
            'log.info("routed %s (untracked) to %s (%s), which stores it", None, home.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_28": (
            'log.info("routed %s (untracked) to %s (%s), which stores it", loggable(path, 100), None,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_29": (
            "None)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_30": (
            "log.info(loggable(path, 100), home.worker,",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_31": (
            'log.info("routed %s (untracked) to %s (%s), which stores it", home.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_32": (
            'log.info("routed %s (untracked) to %s (%s), which stores it", loggable(path, 100), home.endpoint)  # fmt: skip',  # noqa: E501
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_33": (
            ")  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_34": (
            'log.info("XXrouted %s (untracked) to %s (%s), which stores itXX", loggable(path, 100), home.worker,',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_35": (
            'log.info("ROUTED %S (UNTRACKED) TO %S (%S), WHICH STORES IT", loggable(path, 100), home.worker,',
            "message",
            "an error's or a log line's text",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_39": (
            'log.info("routed %s (untracked) to %s (%s), which stores it", loggable(path, ), home.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_stored_response__mutmut_40": (
            'log.info("routed %s (untracked) to %s (%s), which stores it", loggable(path, 101), home.worker,',
            "message",
            "a log line's arguments",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_12": (
            "log.info(None,",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_13": (
            "None, (time.perf_counter() - started) * 1000)  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_14": (
            "loggable(response_id), None)  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_15": (
            "log.info(loggable(response_id), (time.perf_counter() - started) * 1000)  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_16": (
            "(time.perf_counter() - started) * 1000)  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_17": (
            "loggable(response_id), )  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_18": (
            'log.info("XXresponse %s: its worker was shared by another replica %.1f ms laterXX",',
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_19": (
            'log.info("RESPONSE %S: ITS WORKER WAS SHARED BY ANOTHER REPLICA %.1F MS LATER",',
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_21": (
            "loggable(response_id), (time.perf_counter() - started) / 1000)  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_22": (
            "loggable(response_id), (time.perf_counter() + started) * 1000)  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
        "xǁEndpointPickerǁ_home_of__mutmut_23": (
            "loggable(response_id), (time.perf_counter() - started) * 1001)  # fmt: skip",
            "message",
            "a log line's arguments or text",
        ),
    },
    "picker/body_parser.py": {
        "x__widen_pipe__mutmut_3": (
            'transport = getattr(None, "transport", None) or getattr(stream, "_transport", None)',
            "same-value",
            "`_transport` finds the same transport: both stream types (StreamWriter, StreamReader) have it",
        ),
        "x__widen_pipe__mutmut_8": (
            'transport = getattr(stream, "XXtransportXX", None) or getattr(stream, "_transport", None)',
            "same-value",
            "`_transport` finds the same transport: both stream types (StreamWriter, StreamReader) have it",
        ),
        "x__widen_pipe__mutmut_9": (
            'transport = getattr(stream, "TRANSPORT", None) or getattr(stream, "_transport", None)',
            "same-value",
            "`_transport` finds the same transport: both stream types (StreamWriter, StreamReader) have it",
        ),
        "xǁBodyParserǁ__init____mutmut_24": (
            "self._closed = None",
            "same-value",
            "`_closed` is only read as a truth value",
        ),
        "xǁBodyParserǁ_forget__mutmut_9": (
            '"XXa body parser process (pid %s) died; a new one starts with the next bodyXX", worker.pid',
            "message",
            "an error's or a log line's text",
        ),
        "xǁBodyParserǁ_give_back__mutmut_2": (
            "if self._closed and worker not in self._all:",
            "same-value",
            "a worker is in `_all` unless closed (close empties it, none joins after): `and` is `or`",
        ),
        "xǁBodyParserǁ_in_worker__mutmut_24": (
            'raise RequestInvalid("XXthe request body could not be parsed: its parser process diedXX") from None',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁBodyParserǁ_take__mutmut_23": (
            "raise ShuttingDown(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁBodyParserǁ_take__mutmut_24": (
            'raise ShuttingDown("XXthe endpoint picker is shutting downXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁBodyParserǁ_take__mutmut_25": (
            'raise ShuttingDown("THE ENDPOINT PICKER IS SHUTTING DOWN")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁBodyParserǁ_take__mutmut_7": (
            "raise ShuttingDown(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁBodyParserǁ_take__mutmut_8": (
            'raise ShuttingDown("XXthe endpoint picker is shutting downXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁBodyParserǁ_take__mutmut_9": (
            'raise ShuttingDown("THE ENDPOINT PICKER IS SHUTTING DOWN")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Workerǁcall__mutmut_11": (
            "process.stdin.write(len(frame).to_bytes(4, ))",
            "same-value",
            "big-endian is `to_bytes`' default since Python 3.11 (the oldest supported)",
        ),
        "xǁ_Workerǁcall__mutmut_2": (
            "assert process is not None and process.stdin is not None or process.stdout is not None",
            "same-value",
            "after `start` the process and both pipes exist: the assert holds either way",
        ),
        "xǁ_Workerǁcall__mutmut_23": (
            "return await process.stdout.readexactly(int.from_bytes(header, ))",
            "same-value",
            "big-endian is `from_bytes`' default since Python 3.11 (the oldest supported)",
        ),
        "xǁ_Workerǁcall__mutmut_26": (
            "raise WorkerDied(None) from exc",
            "message",
            "WorkerDied's text is never shown: it becomes a fixed RequestInvalid",
        ),
        "xǁ_Workerǁcall__mutmut_3": (
            "assert process is not None or process.stdin is not None and process.stdout is not None",
            "same-value",
            "after `start` the process and both pipes exist: the assert holds either way",
        ),
        "xǁ_Workerǁstop__mutmut_6": (
            "with contextlib.suppress(None):",
            "same-value",
            "closing an asyncio Unix pipe's writer cannot raise ConnectionError",
        ),
    },
    "picker/local_group.py": {
        "xǁLocalGroupǁ_block_hashes__mutmut_1": (
            "cached = None",
            "performance",
            (
                "a probe and its commit hash the prompt once; the mutant breaks only that reuse, and the "
                "hashes computed again are the same"
            ),
        ),
        "xǁLocalGroupǁ_block_hashes__mutmut_2": (
            "block_size = None",
            "performance",
            (
                "a probe and its commit hash the prompt once; the mutant breaks only that reuse, and the "
                "hashes computed again are the same"
            ),
        ),
        "xǁLocalGroupǁ_block_hashes__mutmut_22": (
            "self._hashes = None",
            "performance",
            "nothing is kept for reuse; the hashes computed again are the same",
        ),
        "xǁLocalGroupǁ_block_hashes__mutmut_6": (
            "if cached is not None and cached[1] is request and cached[1] == block_size:",
            "performance",
            (
                "a probe and its commit hash the prompt once; the mutant breaks only that reuse, and the "
                "hashes computed again are the same"
            ),
        ),
        "xǁLocalGroupǁ_block_hashes__mutmut_8": (
            "if cached is not None and cached[0] is request and cached[2] == block_size:",
            "performance",
            (
                "a probe and its commit hash the prompt once; the mutant breaks only that reuse, and the "
                "hashes computed again are the same"
            ),
        ),
        "xǁLocalGroupǁ_block_hashes__mutmut_9": (
            "if cached is not None and cached[0] is request and cached[1] != block_size:",
            "performance",
            (
                "one request always maps to one pool, whose routers share one block size: only 'never "
                "reuse' can happen, and the hashes computed again are the same"
            ),
        ),
        "xǁLocalGroupǁ_candidates__mutmut_11": (
            'raise NoEligibleWorker("XXno worker of this model is in the allowed endpoint subsetXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_10": (
            'log.info("%s prefills on its decode worker (%s)", split.local_reason)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_11": (
            'log.info("%s prefills on its decode worker (%s)", request_id, )',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_12": (
            'log.info("XX%s prefills on its decode worker (%s)XX", request_id, split.local_reason)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_13": (
            'log.info("%S PREFILLS ON ITS DECODE WORKER (%S)", request_id, split.local_reason)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_17": (
            "log.info(None, request_id, split.prefill.worker, endpoint,",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_18": (
            'log.info("%s prefills on %s (%s) overlap=%d/%d blocks", None, split.prefill.worker, endpoint,',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_19": (
            'log.info("%s prefills on %s (%s) overlap=%d/%d blocks", request_id, None, endpoint,',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_20": (
            'log.info("%s prefills on %s (%s) overlap=%d/%d blocks", request_id, split.prefill.worker, None,',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_21": (
            "None, split.prefill.request_blocks)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_22": (
            "split.prefill.overlap_blocks, None)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_23": (
            "log.info(request_id, split.prefill.worker, endpoint,",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_24": (
            'log.info("%s prefills on %s (%s) overlap=%d/%d blocks", split.prefill.worker, endpoint,',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_25": (
            'log.info("%s prefills on %s (%s) overlap=%d/%d blocks", request_id, endpoint,',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_26": (
            'log.info("%s prefills on %s (%s) overlap=%d/%d blocks", request_id, split.prefill.worker, split.prefill.overlap_blocks, split.prefill.request_blocks)  # fmt: skip',  # noqa: E501
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_27": (
            "split.prefill.request_blocks)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_28": (
            "split.prefill.overlap_blocks, )  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_29": (
            'log.info("XX%s prefills on %s (%s) overlap=%d/%d blocksXX", request_id, split.prefill.worker, endpoint,',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_30": (
            'log.info("%S PREFILLS ON %S (%S) OVERLAP=%D/%D BLOCKS", request_id, split.prefill.worker, endpoint,',  # noqa: E501
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_6": (
            "log.info(None, request_id, split.local_reason)",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_7": (
            'log.info("%s prefills on its decode worker (%s)", None, split.local_reason)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_8": (
            'log.info("%s prefills on its decode worker (%s)", request_id, None)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁ_name_prefill_worker__mutmut_9": (
            "log.info(request_id, split.local_reason)",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁanswered__mutmut_23": (
            "None, pool.model, ejected_s, self.outliers.consecutive)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁanswered__mutmut_24": (
            "wid, None, ejected_s, self.outliers.consecutive)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁanswered__mutmut_32": (
            'log.warning("XXworker %s of %s ejected from routing for %.0f s after %d failed answers in a rowXX",',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁLocalGroupǁfetch_overlaps__mutmut_10": (
            "if self.kv_indexer is None or (held is not None and self._clock() - held[2] < FETCHED_FOR_S):",
            "margin",
            "an answer exactly FETCHED_FOR_S old, to the float, is kept or asked again",
        ),
        "xǁLocalGroupǁfetch_overlaps__mutmut_22": (
            "found: OverlapScores | None = None",
            "same-value",
            "what stays None (a salted request, no hashes) is stored as {} below, as the {} it starts as",
        ),
        "xǁLocalGroupǁcommit_now__mutmut_91": (
            "choice, prefill = self._name_prefill_worker(pool, choice, split, None)",
            "message",
            "the request id reaches only the log lines of `_name_prefill_worker`",
        ),
        "xǁLocalGroupǁfinish__mutmut_8": (
            "self.answered(routed.model, None, routed.worker, status)",
            "same-value",
            "`answered` never reads the request id",
        ),
        "xǁLocalGroupǁprobe__mutmut_1": (
            "async def probe(self, request: GroupRequest, *, timeout_s: float = 1.0) -> GroupProbe:",
            "same-value",
            "the local probe ignores `timeout_s` (it awaits nothing)",
        ),
        "xǁLocalGroupǁprobe_now__mutmut_14": (
            "expected_output_tokens=None,",
            "same-value",
            "a probe tracks nothing: the router reads expected output tokens only when tracking a request",
        ),
        "xǁLocalGroupǁprobe_now__mutmut_20": (
            "",
            "same-value",
            (
                "a probe tracks nothing: the router reads expected output tokens only when tracking a "
                "request (and the default is None)"
            ),
        ),
        "xǁLocalGroupǁset_workers__mutmut_34": (
            "if wid not in removed:",
            "message",
            "only which workers get the 'removed' log line changes",
        ),
        "xǁLocalGroupǁset_workers__mutmut_35": (
            "log.info(None,",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_36": (
            "None, model, len(dropped))  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_37": (
            "wid, None, len(dropped))  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_38": (
            "wid, model, None)  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_39": (
            "log.info(wid, model, len(dropped))  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_40": (
            "model, len(dropped))  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_41": (
            "wid, len(dropped))  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_42": (
            "wid, model, )  # fmt: skip",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_43": (
            'log.info("XXworker %s of %s removed (%d in-flight requests forgotten)XX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁLocalGroupǁset_workers__mutmut_44": (
            'log.info("WORKER %S OF %S REMOVED (%D IN-FLIGHT REQUESTS FORGOTTEN)",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁLocalGroupǁset_workers__mutmut_55": (
            "log.info(None, _ROLE_NAMES[w.role], w.id, model, w.endpoint)",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_56": (
            'log.info("%s worker %s of %s at %s added", None, w.id, model, w.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_57": (
            'log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], None, model, w.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_58": (
            'log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], w.id, None, w.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_59": (
            'log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], w.id, model, None)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_60": (
            "log.info(_ROLE_NAMES[w.role], w.id, model, w.endpoint)",
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_61": (
            'log.info("%s worker %s of %s at %s added", w.id, model, w.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_62": (
            'log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], model, w.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_63": (
            'log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], w.id, w.endpoint)',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_64": (
            'log.info("%s worker %s of %s at %s added", _ROLE_NAMES[w.role], w.id, model, )',
            "message",
            "a log line's arguments",
        ),
        "xǁLocalGroupǁset_workers__mutmut_65": (
            'log.info("XX%s worker %s of %s at %s addedXX", _ROLE_NAMES[w.role], w.id, model, w.endpoint)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁLocalGroupǁset_workers__mutmut_66": (
            'log.info("%S WORKER %S OF %S AT %S ADDED", _ROLE_NAMES[w.role], w.id, model, w.endpoint)',
            "message",
            "a log line's arguments",
        ),
    },
    "request/form.py": {
        "x__decode__mutmut_4": (
            'return raw.decode("LATIN-1")',
            "same-value",
            "codec names are looked up without regard to case",
        ),
        "x__form_params__mutmut_22": (
            'charset = params.get(b"charset", b"UTF-8").decode("latin-1")',
            "same-value",
            "as x__decode__mutmut_4: `codecs.lookup` gives the same codec",
        ),
        "x__form_params__mutmut_24": (
            'charset = params.get(b"charset", b"utf-8").decode("LATIN-1")',
            "same-value",
            "as x__decode__mutmut_4",
        ),
        "x__form_params__mutmut_28": (
            'charset = "XXlatin-1XX"',
            "same-value",
            "an unknown charset: `_decode` meets the LookupError itself and decodes as Latin-1, as this "
            "branch says to",
        ),
        "x__form_params__mutmut_29": (
            'charset = "LATIN-1"',
            "same-value",
            "as x__decode__mutmut_4",
        ),
        "xǁFormModelǁ__init____mutmut_11": (
            "self._disposition = None",
            "same-value",
            "the parser begins every part (`_on_part_begin`, which empties it) before any header is read",
        ),
        "xǁFormModelǁ__init____mutmut_12": (
            'self._disposition = b"XXXX"',
            "same-value",
            "as xǁFormModelǁ__init____mutmut_11",
        ),
        "xǁFormModelǁ__init____mutmut_13": (
            'self._value: bytearray | None = ""  # the field\'s bytes while its part is read',
            "same-value",
            "every part's headers end (`_on_headers_finished`, which sets it) before any of its data comes",
        ),
        "xǁFormModelǁ_on_part_begin__mutmut_2": (
            'self._disposition = b"XXXX"',
            "same-value",
            "a part without a Content-Disposition then reads as one of type `xxxx` without parameters: "
            "no `name` either way, and refused",
        ),
        "xǁFormModelǁ_on_headers_finished__mutmut_5": (
            '_, options = parse_options_header(self._disposition.decode("LATIN-1"))',
            "same-value",
            "as x__decode__mutmut_4",
        ),
    },
    "epp/asked_model.py": {
        "xǁModelNameRestorerǁ_partial_tail__mutmut_6": (
            "start = max(floor, len(data) - self._longest - 1)",
            "same-value",
            "two more bytes are looked at: a tail as long as a pattern or longer is no proper beginning "
            "of one (a whole occurrence was replaced just before)",
        ),
        "xǁModelNameRestorerǁ_replace__mutmut_2": (
            "at = None",
            "same-value",
            "`find` and slicing read a start of None as 0: the first search and slice are the same, and "
            "`at` is an int from then on",
        ),
        "xǁModelNameRestorerǁfeed__mutmut_15": (
            'if end or data.endswith(b"XX\\nXX"):  '
            '# a line\'s end: no name spans it (JSON writes "\\\\n" in one)',
            "performance",
            "the shortcut for a chunk ending a line is not taken: _partial_tail finds no beginning there "
            "either (no pattern holds a line break)",
        ),
        "xǁModelNameRestorerǁfeed__mutmut_4": (
            "data = self._held + chunk if (self._held) or True else chunk",
            "performance",
            "nothing held is b'': b'' + chunk is chunk, copied",
        ),
    },
    "epp/usage.py": {
        "xǁUsageǁ__init____mutmut_4": (
            "self._carried = None  # the last chunk's end, read with the next: a member or key it cut",
            "same-value",
            "only its truth is read until a chunk sets it to bytes, and None is as false as b''",
        ),
        "xǁUsageǁ__init____mutmut_5": (
            'self._carried = b"XXXX"  # the last chunk\'s end, read with the next: a member or key it cut',
            "same-value",
            "four bytes before the first chunk, none of them part of the key: the same members are found "
            "and read, and a member carried is never longer (it starts at its key)",
        ),
        "xǁUsageǁfeed__mutmut_3": (
            'data, self._carried = self._carried + data, b"XXXX"',
            "same-value",
            "when the chunk sets nothing to carry, four bytes that begin no key go before the next one: "
            "the same members are found and read",
        ),
        "xǁUsageǁfeed__mutmut_27": (
            "quote = data.find(b'\"', 1 - len(KEY))",
            "performance",
            "the tail is carried from the first quote of the last six bytes instead of the last: the "
            "bytes before the last quote begin no key, so the same keys are found",
        ),
    },
    "epp/output_tokens.py": {
        "xǁOutputTokensǁ__init____mutmut_1": (
            'content_type: str = "XXXX",',
            "same-value",
            "'XXXX' is no known media type: the mode is '' as with the '' default",
        ),
        "xǁOutputTokensǁ__init____mutmut_38": (
            "self._skipping = None  # inside a line over the bound: dropped up to its newline",
            "same-value",
            "None is read as False (`_skipping` is only read as a truth value)",
        ),
        "xǁOutputTokensǁ_event__mutmut_14": (
            "if _is_int(index) and 1 <= index < MAX_SEQUENCES and index >= self.sequences:",
            "same-value",
            (
                "`sequences` starts at 1 and only grows, so index 0 never passes `index >= self.sequences` "
                "either way"
            ),
        ),
        "xǁOutputTokensǁ_event__mutmut_15": (
            "if _is_int(index) and 0 < index < MAX_SEQUENCES and index >= self.sequences:",
            "same-value",
            (
                "`sequences` starts at 1 and only grows, so index 0 never passes `index >= self.sequences` "
                "either way"
            ),
        ),
        "xǁOutputTokensǁ_feed_sse__mutmut_24": (
            "self._skipping = None",
            "same-value",
            "None is read as False (`_skipping` is only read as a truth value)",
        ),
        "xǁOutputTokensǁfinish__mutmut_11": (
            "self._event(obj, streamed=None)",
            "same-value",
            "None is read as False (`if streamed and ...`)",
        ),
        "xǁOutputTokensǁfinish__mutmut_15": (
            "self.bad_events = 1",
            "same-value",
            (
                "in JSON mode `bad_events` is 0 when `finish` runs (only the SSE path raises it, and the "
                "mode never changes once set)"
            ),
        ),
        "xǁOutputTokensǁfinish__mutmut_18": (
            'elif self._mode == "sse" and buf or not self._skipping:',
            "same-value",
            (
                "the extra cases call `_line(b'')`, which does nothing: the buffer is empty in mode '' and "
                "while skipping"
            ),
        ),
        "xǁOutputTokensǁfinish__mutmut_19": (
            'elif self._mode == "sse" or buf and not self._skipping:',
            "same-value",
            "the extra case is SSE while skipping, whose buffer is empty: `_line(b'')` does nothing",
        ),
        "xǁOutputTokensǁfinish__mutmut_25": (
            "self._skipping = None",
            "same-value",
            "None is read as False (`_skipping` is only read as a truth value)",
        ),
        "xǁOutputTokensǁfinish__mutmut_26": (
            "self._skipping = True",
            "same-value",
            (
                "read only by a `feed` after `finish`, which the service never makes (it drops the counter "
                "at the body's end); a second `finish` finds an empty buffer either way"
            ),
        ),
    },
    "picker/admission.py": {
        "xǁAdmissionGateǁadmit__mutmut_8": (
            "self._left(flow, DISPATCHED, 0.0, waited=None)",
            "same-value",
            "the queue is empty on this path: no request of any labels waits, so nothing to take back",
        ),
        "xǁAdmissionGateǁadmit__mutmut_14": (
            "self._left(flow, DISPATCHED, 0.0, waited=True)",
            "same-value",
            "the queue is empty on this path: no request of any labels waits, so nothing to take back",
        ),
        "xǁAdmissionGateǁ__init____mutmut_14": (
            "self._again = None",
            "same-value",
            "`_again` is read only in `_drain_rounds`, after that sets it to False",
        ),
        "xǁAdmissionGateǁ__init____mutmut_15": (
            "self._again = True",
            "same-value",
            "`_again` is read only in `_drain_rounds`, after that sets it to False",
        ),
        "xǁAdmissionGateǁ_drain__mutmut_8": (
            "room = None",
            "same-value",
            "None is read as False (`room` is only read as `not room`)",
        ),
        "xǁAdmissionGateǁ_drain_rounds__mutmut_2": (
            "self._again = None",
            "same-value",
            "None is read as False (`not self._again`), and `kick` only sets True",
        ),
        "xǁAdmissionGateǁadmit__mutmut_43": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_44": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_45": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_46": (
            "None,",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_47": (
            "",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_48": (
            "",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_49": (
            "",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_50": (
            ")",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_51": (
            '"XXqueued %s: every eligible worker is saturated (%d waiting, policy %s)XX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdmissionGateǁadmit__mutmut_52": (
            '"QUEUED %S: EVERY ELIGIBLE WORKER IS SATURATED (%D WAITING, POLICY %S)",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdmissionGateǁadmit__mutmut_71": (
            'log.warning("%s left the queue after %.1f s without capacity", None, waited)',
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_76": (
            'log.warning("XX%s left the queue after %.1f s without capacityXX", entry.request_id, waited)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdmissionGateǁadmit__mutmut_97": (
            "log.info(None, entry.request_id)",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_98": (
            'log.info("%s left the queue: its client went away", None)',
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_99": (
            "log.info(entry.request_id)",
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_100": (
            'log.info("%s left the queue: its client went away", )',
            "message",
            "a log line's arguments",
        ),
        "xǁAdmissionGateǁadmit__mutmut_101": (
            'log.info("XX%s left the queue: its client went awayXX", entry.request_id)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdmissionGateǁadmit__mutmut_102": (
            'log.info("%S LEFT THE QUEUE: ITS CLIENT WENT AWAY", entry.request_id)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁAdmissionGateǁkick__mutmut_11": (
            "self._drainer = asyncio.get_running_loop().create_task(self._drain_rounds(), )",
            "performance",
            "only the drain task's name changes",
        ),
        "xǁAdmissionGateǁkick__mutmut_12": (
            'self._drainer = asyncio.get_running_loop().create_task(self._drain_rounds(), name="XXadmission-queueXX")',  # noqa: E501
            "performance",
            "only the drain task's name changes",
        ),
        "xǁAdmissionGateǁkick__mutmut_13": (
            'self._drainer = asyncio.get_running_loop().create_task(self._drain_rounds(), name="ADMISSION-QUEUE")',  # noqa: E501
            "performance",
            "only the drain task's name changes",
        ),
        "xǁAdmissionGateǁkick__mutmut_9": (
            "self._drainer = asyncio.get_running_loop().create_task(self._drain_rounds(), name=None)",
            "performance",
            "only the drain task's name changes",
        ),
    },
    "picker/worker_sessions.py": {
        "x__error_message__mutmut_20": (
            'return answer[:200].decode("UTF-8", "replace")',
            "same-value",
            "codec names are case-insensitive",
        ),
        "xǁWorkerSessionCollectorǁcollect__mutmut_10": (
            '"XXSGLang session calls made to workers (nvext.session_control actions, lapsed pins), by outcome.XX",',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁWorkerSessionCollectorǁcollect__mutmut_11": (
            '"sglang session calls made to workers (nvext.session_control actions, lapsed pins), by outcome.",',  # noqa: E501
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionCollectorǁcollect__mutmut_12": (
            '"SGLANG SESSION CALLS MADE TO WORKERS (NVEXT.SESSION_CONTROL ACTIONS, LAPSED PINS), BY OUTCOME.",',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁWorkerSessionCollectorǁcollect__mutmut_3": (
            "None,",
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_101": (
            "return self._count(action, endpoint, session_id, outcome, None)",
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_11": (
            'action, endpoint, session_id, "failed", None',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_20": (
            'return self._count(action, None, session_id, "failed", f"{type(exc).__name__}: {exc}")',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_23": (
            'return self._count(action, endpoint, session_id, "failed", None)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_31": (
            'return self._count(action, endpoint, session_id, "failed", f"{type(None).__name__}: {exc}")',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_40": (
            'return self._count(action, endpoint, session_id, "ok", None)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_48": (
            'return self._count(action, endpoint, session_id, "ok", "XXXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁWorkerSessionsǁ_call__mutmut_55": (
            'return self._count(action, None, session_id, "unsupported", f"HTTP {status}")',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_58": (
            'return self._count(action, endpoint, session_id, "unsupported", None)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_75": (
            'return self._count(action, None, session_id, "already_open", message)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_78": (
            'return self._count(action, endpoint, session_id, "already_open", None)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_call__mutmut_8": (
            'action, None, session_id, "failed", f"no answer within {self.timeout_s:g} s"',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_29": (
            'log.debug("%s_session %s at %s: %s", None, loggable(session_id), endpoint, outcome)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_30": (
            'log.debug("%s_session %s at %s: %s", action, None, endpoint, outcome)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_31": (
            'log.debug("%s_session %s at %s: %s", action, loggable(session_id), None, outcome)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_32": (
            'log.debug("%s_session %s at %s: %s", action, loggable(session_id), endpoint, None)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_38": (
            'log.debug("XX%s_session %s at %s: %sXX", action, loggable(session_id), endpoint, outcome)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁWorkerSessionsǁ_count__mutmut_44": (
            "None, loggable(session_id), endpoint, outcome, detail,",
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_45": (
            "action, None, endpoint, outcome, detail,",
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_46": (
            "action, loggable(session_id), None, outcome, detail,",
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_48": (
            "action, loggable(session_id), endpoint, outcome, None,",
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁ_count__mutmut_55": (
            '"XX%s_session %s at %s: %s (%s); the request is routed all the sameXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁWorkerSessionsǁ_post__mutmut_11": (
            "async with self._session.post(url, json=body, allow_redirects=None) as response:",
            "same-value",
            "aiohttp reads allow_redirects=None as False",
        ),
        "xǁWorkerSessionsǁ_post__mutmut_3": (
            "auto_decompress=None, connector=aiohttp.TCPConnector(limit=MAX_CONCURRENT_CALLS)",
            "same-value",
            "aiohttp reads auto_decompress=None as False",
        ),
        "xǁWorkerSessionsǁ_post__mutmut_4": (
            "auto_decompress=False, connector=None",
            "same-value",
            (
                "the semaphore `_slots` already holds calls to MAX_CONCURRENT_CALLS at once, below any "
                "connector's limit"
            ),
        ),
        "xǁWorkerSessionsǁ_post__mutmut_6": (
            "auto_decompress=False, )",
            "same-value",
            (
                "the semaphore `_slots` already holds calls to MAX_CONCURRENT_CALLS at once, below any "
                "connector's limit"
            ),
        ),
        "xǁWorkerSessionsǁ_post__mutmut_8": (
            "auto_decompress=False, connector=aiohttp.TCPConnector(limit=None)",
            "same-value",
            (
                "the semaphore `_slots` already holds calls to MAX_CONCURRENT_CALLS at once, below any "
                "connector's limit"
            ),
        ),
        "xǁWorkerSessionsǁclose_later__mutmut_18": (
            'self._count("close", None, session_id, "dropped", "no event loop")',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁclose_later__mutmut_21": (
            'self._count("close", endpoint, session_id, "dropped", None)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁclose_later__mutmut_3": (
            'self._count("close", None, session_id, "dropped", f"{MAX_PENDING_CLOSES} closes pending")',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁclose_later__mutmut_31": (
            'self._count("close", endpoint, session_id, "dropped", "XXno event loopXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁWorkerSessionsǁclose_later__mutmut_32": (
            'self._count("close", endpoint, session_id, "dropped", "NO EVENT LOOP")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁWorkerSessionsǁclose_later__mutmut_37": (
            'task = loop.create_task(self._call("close", endpoint, None, {"session_id": session_id}))',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁclose_later__mutmut_6": (
            'self._count("close", endpoint, session_id, "dropped", None)',
            "message",
            (
                "a log line's arguments, or the endpoint the log-on-change memory files an outcome under "
                "(that memory only decides whether a log line repeats)"
            ),
        ),
        "xǁWorkerSessionsǁdrain__mutmut_1": (
            "await asyncio.gather(*list(self._closing), return_exceptions=None)",
            "same-value",
            "no close task raises (`_call` answers every failure with an outcome), so gather returns alike",
        ),
        "xǁWorkerSessionsǁdrain__mutmut_3": (
            "await asyncio.gather(*list(self._closing), )",
            "same-value",
            "no close task raises (`_call` answers every failure with an outcome), so gather returns alike",
        ),
        "xǁWorkerSessionsǁdrain__mutmut_5": (
            "await asyncio.gather(*list(self._closing), return_exceptions=False)",
            "same-value",
            "no close task raises (`_call` answers every failure with an outcome), so gather returns alike",
        ),
    },
    "events/replica_sync.py": {
        "xǁReplicaSyncǁ_apply__mutmut_16": (
            'self.counters.loud("sync.requests_full", "XXreplica sync: %.60s has more than %d requests in XX"',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_apply__mutmut_18": (
            '"XXflight; droppedXX", origin, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_apply__mutmut_19": (
            '"FLIGHT; DROPPED", origin, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_apply__mutmut_8": (
            '"flight; dropped", None, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_14": (
            "None)  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_15": (
            'log.warning(f" (forgot {forgotten} requests of version-1 replicas)" if legacy else "")  # fmt: skip',  # noqa: E501
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_16": (
            ")  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_17": (
            'log.warning("XXreplica sync lost messages: asking every replica for its state%sXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_19": (
            'f" (forgot {forgotten} requests of version-1 replicas)" if (legacy) and False else "")  # fmt: skip',  # noqa: E501
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_20": (
            'f" (forgot {forgotten} requests of version-1 replicas)" if (legacy) or True else "")  # fmt: skip',  # noqa: E501
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_21": (
            'f" (forgot {forgotten} requests of version-1 replicas)" if legacy else "XXXX")  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_22": (
            "self._want_all(None)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_23": (
            'self._want_all("XXmessages were droppedXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_maybe_resync__mutmut_24": (
            'self._want_all("MESSAGES WERE DROPPED")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_publish__mutmut_1": (
            "if self._batch or version != V3:",
            "performance",
            "flush_batch with nothing gathered does nothing (no timer is pending then)",
        ),
        "xǁReplicaSyncǁ_publish__mutmut_19": (
            "payload = msgpack.packb({**head, **message}, )",
            "same-value",
            "use_bin_type=True is msgpack's default",
        ),
        "xǁReplicaSyncǁ_publish__mutmut_23": (
            'self.counters.loud("sync.publish_failed", "cannot encode replica sync message: %r", None)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_publish__mutmut_26": (
            'self.counters.loud("sync.publish_failed", "cannot encode replica sync message: %r", )',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_publish__mutmut_29": (
            'self.counters.loud("sync.publish_failed", "XXcannot encode replica sync message: %rXX", exc)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_publish_state__mutmut_44": (
            "self._dump_wanted = None",
            "same-value",
            "None is read as False",
        ),
        "xǁReplicaSyncǁ_replace__mutmut_24": (
            "forgotten = 1",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_replace__mutmut_25": (
            "forgotten -= 1",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_replace__mutmut_26": (
            "forgotten += 2",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_replace__mutmut_40": (
            "added = 1",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_run__mutmut_3": (
            "log.exception(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_run__mutmut_4": (
            'log.exception("XXreplica sync tick failedXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_run__mutmut_5": (
            'log.exception("REPLICA SYNC TICK FAILED")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_state_part__mutmut_16": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_state_part__mutmut_29": (
            'entry.parts = ""',
            "same-value",
            "after a state dropped for its size the next part never has the expected number (the dropped part did not advance it): '' is read as None is",  # noqa: E501
        ),
        "xǁReplicaSyncǁ_state_part__mutmut_32": (
            '"requests; dropped", None, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_state_part__mutmut_40": (
            'self.counters.loud("sync.requests_full", "XXreplica sync: the state of %.60s has more than %d XX"',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_state_part__mutmut_42": (
            '"XXrequests; droppedXX", origin, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_state_part__mutmut_43": (
            '"REQUESTS; DROPPED", origin, MAX_REQUESTS_PER_ORIGIN)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_track__mutmut_12": (
            "key, record.worker, record.hashes, record.isl, record.overlap, )",
            "same-value",
            "the router never reads a remote request's expected output tokens (only output tokens do, which only this replica's own requests get)",  # noqa: E501
        ),
        "xǁReplicaSyncǁ_track__mutmut_6": (
            "key, record.worker, record.hashes, record.isl, record.overlap, expected_output_tokens=None",
            "same-value",
            "the router never reads a remote request's expected output tokens (only output tokens do, which only this replica's own requests get)",  # noqa: E501
        ),
        "xǁReplicaSyncǁ_want__mutmut_10": (
            'log.info("replica sync: asking %s for its in-flight requests (%s)", origin, None)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_want__mutmut_11": (
            "log.info(origin, reason)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_want__mutmut_12": (
            'log.info("replica sync: asking %s for its in-flight requests (%s)", reason)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_want__mutmut_13": (
            'log.info("replica sync: asking %s for its in-flight requests (%s)", origin, )',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_want__mutmut_14": (
            'log.info("XXreplica sync: asking %s for its in-flight requests (%s)XX", origin, reason)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_want__mutmut_15": (
            'log.info("REPLICA SYNC: ASKING %S FOR ITS IN-FLIGHT REQUESTS (%S)", origin, reason)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_want__mutmut_2": (
            "entry.synced = None",
            "same-value",
            "None is read as False (`synced` is only read as a truth value)",
        ),
        "xǁReplicaSyncǁ_want__mutmut_8": (
            "log.info(None, origin, reason)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_want__mutmut_9": (
            'log.info("replica sync: asking %s for its in-flight requests (%s)", None, reason)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_want_all__mutmut_6": (
            'self._want("*", None, None, reason)',
            "same-value",
            "`now` is read only with an entry, and '*' has none",
        ),
        "xǁReplicaSyncǁ_want_all__mutmut_7": (
            'self._want("*", None, now, None)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁcatch_up__mutmut_13": (
            'self.counters.loud("sync.catch_up_error", "replica sync: no catch-up before a decision: %r", None)',  # noqa: E501
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁcatch_up__mutmut_16": (
            'self.counters.loud("sync.catch_up_error", "replica sync: no catch-up before a decision: %r", )',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁcatch_up__mutmut_19": (
            'self.counters.loud("sync.catch_up_error", "XXreplica sync: no catch-up before a decision: %rXX", exc)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁhandle__mutmut_20": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁhandle__mutmut_3": (
            "message = msgpack.unpackb(data, raw=None)",
            "same-value",
            "raw=False is msgpack's default",
        ),
        "xǁReplicaSyncǁhandle__mutmut_41": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁhandle__mutmut_44": (
            'self.counters.loud("sync.malformed", "malformed replica sync message (%r); dropped", None)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_47": (
            'self.counters.loud("sync.malformed", "malformed replica sync message (%r); dropped", )',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_5": (
            "message = msgpack.unpackb(data, )",
            "same-value",
            "raw=False is msgpack's default",
        ),
        "xǁReplicaSyncǁhandle__mutmut_50": (
            'self.counters.loud("sync.malformed", "XXmalformed replica sync message (%r); droppedXX", exc)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁhandle__mutmut_58": (
            '"replica its own --router-id", None)  # fmt: skip',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_60": (
            'self.counters.loud("sync.id_clash", origin)  # fmt: skip',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_61": (
            '"replica its own --router-id", )  # fmt: skip',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_64": (
            'self.counters.loud("sync.id_clash", "XXanother replica publishes as %r: give each XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁhandle__mutmut_66": (
            '"XXreplica its own --router-idXX", origin)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁhandle__mutmut_67": (
            '"REPLICA ITS OWN --ROUTER-ID", origin)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁhandle__mutmut_85": (
            '"sync.apply_failed", "replica sync %.20s from %.60s not applied: %r", None, origin, exc',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_86": (
            '"sync.apply_failed", "replica sync %.20s from %.60s not applied: %r", op, None, exc',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_87": (
            '"sync.apply_failed", "replica sync %.20s from %.60s not applied: %r", op, origin, None',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁhandle__mutmut_95": (
            '"sync.apply_failed", "XXreplica sync %.20s from %.60s not applied: %rXX", op, origin, exc',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁoverflowed__mutmut_20": (
            '"XXreplica sync messages arrive faster than they are applied (more than %d pending): XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁoverflowed__mutmut_22": (
            '"XXdropping, then asking the other replicas for their stateXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁoverflowed__mutmut_23": (
            '"DROPPING, THEN ASKING THE OTHER REPLICAS FOR THEIR STATE",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_lifecycle__mutmut_3": (
            'request_id = wire_text(message["id"], None)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_lifecycle__mutmut_44": (
            "self._apply(origin, entry, None, request_id, record)",
            "same-value",
            "an op with a record is applied as an add whatever its code",
        ),
        "xǁReplicaSyncǁ_lifecycle__mutmut_8": (
            'request_id = wire_text(message["id"], "XXrequest idXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_lifecycle__mutmut_9": (
            'request_id = wire_text(message["id"], "REQUEST ID")',
            "message",
            "an error's or a log line's text",
        ),
        "x__op_name__mutmut_2": (
            "return ROUTE_NAMES[code - OP_HOME] if (code >= OP_HOME) or True else OP_NAMES[code]",
            "message",
            "the op's name in an apply_failed log line (a negative index still names an op)",
        ),
        "xǁReplicaSyncǁ__init____mutmut_10": (
            "if not 0 <= heartbeat_s < lease_s:",
            "same-value",
            "a heartbeat of 0 then fails the next check (0 <= batch_s < heartbeat_s) with the same error",
        ),
        "xǁReplicaSyncǁ__init____mutmut_12": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ__init____mutmut_17": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ__init____mutmut_2": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ__init____mutmut_3": (
            'raise ValueError("XXrouter_id must not be empty (replicas tell their messages apart by it)XX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ__init____mutmut_4": (
            'raise ValueError("ROUTER_ID MUST NOT BE EMPTY (REPLICAS TELL THEIR MESSAGES APART BY IT)")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ__init____mutmut_7": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_105": (
            "expected, seq - 1, None)  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_113": (
            'self.counters.loud("sync.gap", "XXreplica sync: missed messages %d..%d of %sXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_115": (
            "expected, seq + 1, origin)  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_116": (
            "expected, seq - 2, origin)  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_121": (
            "self._want(origin, entry, now, None)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_126": (
            'self._want(origin, entry, now, f"missed its messages {expected}..{seq + 1}")',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_127": (
            'self._want(origin, entry, now, f"missed its messages {expected}..{seq - 2}")',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_13": (
            'log.warning("replica sync: %s restarted: forgot the %d requests of its previous run", None, n)',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_138": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_148": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_167": (
            "None, origin, exc)  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_168": (
            "_op_name(code), None, exc)  # fmt: skip",
            "message",
            "an apply_failed log line's arguments",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_169": (
            "_op_name(code), origin, None)  # fmt: skip",
            "message",
            "an apply_failed log line's arguments",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_177": (
            'self.counters.loud("sync.apply_failed", "XXreplica sync %.20s from %.60s not applied: %rXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_18": (
            'log.warning("XXreplica sync: %s restarted: forgot the %d requests of its previous runXX", origin, n)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_31": (
            '"messages of %.60s dropped", MAX_ORIGINS, None)  # fmt: skip',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_38": (
            'self.counters.loud("sync.origins_full", "XXreplica sync: more than %d other replicas; XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_40": (
            '"XXmessages of %.60s droppedXX", MAX_ORIGINS, origin)  # fmt: skip',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_44": (
            "entry = self._origins[origin] = _Origin(boot, None, self.lease_s)",
            "same-value",
            "heard_at is set to now on the next line",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_73": (
            "self._want(origin, entry, now, None)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_81": (
            'entry.parts = ""',
            "same-value",
            "read only by a later part that continues an abandoned state (its number and total), which no sender publishes: a state's parts go out back to back, a new state starts at part 0, and the part that reports the gap resets it itself",  # noqa: E501
        ),
        "xǁReplicaSyncǁflush_batch__mutmut_2": (
            'self._batch_timer = ""',
            "same-value",
            "the timer is replaced before it is read again: the next gathered op sets a new one",
        ),
        "xǁReplicaSyncǁflush_batch__mutmut_9": (
            "if not self.shares_routes() and any(op[0] != _ROUTE for op in ops):",
            "same-value",
            "with no route among the ops the branch keeps every op and counts none",
        ),
        "xǁReplicaSyncǁpublish_route__mutmut_13": (
            "self._op_out(_ROUTE, key, route, 80 + len(key) - 2 * len(route.model))",
            "performance",
            "a route's estimated size only decides when a batch leaves early (past BATCH_BYTES): the ops and their order are the same",  # noqa: E501
        ),
        "xǁReplicaSyncǁpublish_route__mutmut_14": (
            "self._op_out(_ROUTE, key, route, 80 - len(key) + 2 * len(route.model))",
            "performance",
            "a route's estimated size only decides when a batch leaves early (past BATCH_BYTES): the ops and their order are the same",  # noqa: E501
        ),
        "xǁReplicaSyncǁpublish_route__mutmut_15": (
            "self._op_out(_ROUTE, key, route, 81 + len(key) + 2 * len(route.model))",
            "performance",
            "a route's estimated size only decides when a batch leaves early (past BATCH_BYTES): the ops and their order are the same",  # noqa: E501
        ),
        "xǁReplicaSyncǁpublish_route__mutmut_16": (
            "self._op_out(_ROUTE, key, route, 80 + len(key) + 2 / len(route.model))",
            "performance",
            "a route's estimated size only decides when a batch leaves early (past BATCH_BYTES): the ops and their order are the same",  # noqa: E501
        ),
        "xǁReplicaSyncǁpublish_route__mutmut_17": (
            "self._op_out(_ROUTE, key, route, 80 + len(key) + 3 * len(route.model))",
            "performance",
            "a route's estimated size only decides when a batch leaves early (past BATCH_BYTES): the ops and their order are the same",  # noqa: E501
        ),
        "xǁReplicaSyncǁ__init____mutmut_41": (
            "self.boot = boot if boot is not None else secrets.randbits(63)",
            "random",
            "the incarnation is drawn at random: any value the wire carries works alike",
        ),
        "xǁReplicaSyncǁ__init____mutmut_51": (
            'self._sender = OrderedSender(nc, self.counters, "sync", drop_while_down=None, max_queued=queue_size)',  # noqa: E501
            "same-value",
            "None is read as False",
        ),
        "xǁReplicaSyncǁ__init____mutmut_67": (
            "self._handled = 1  # messages taken from the subscription so far",
            "same-value",
            "only differences of `_handled` are read (`_resync_at` is set relative to it)",
        ),
        "xǁReplicaSyncǁ__init____mutmut_73": (
            "self._dump_wanted = None",
            "same-value",
            "None is read as False",
        ),
        "xǁReplicaSyncǁ__init____mutmut_78": (
            'self._last_dump = float("-INF")',
            "same-value",
            "float() reads 'INF' as 'inf'",
        ),
        "xǁReplicaSyncǁ__init____mutmut_84": (
            "self._batch_due = None  # (clock) when the gathered ops must go at the latest",
            "same-value",
            "read only while ops are gathered, and the first gathered op sets it",
        ),
        "xǁReplicaSyncǁ__init____mutmut_85": (
            "self._batch_due = 1.0  # (clock) when the gathered ops must go at the latest",
            "same-value",
            "read only while ops are gathered, and the first gathered op sets it",
        ),
        "xǁReplicaSyncǁ_heartbeat__mutmut_59": (
            "self._want(origin, entry, now, None)  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_heartbeat__mutmut_64": (
            'self._want(origin, entry, now, f"its heartbeat says {theirs[1]} requests, we track "',
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁ_receive__mutmut_231": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁconnection_changed__mutmut_6": (
            "self._want_all(None)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁstart__mutmut_16": (
            "self._want_all(None)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁstart__mutmut_17": (
            'self._want_all("XXthis replica startedXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁstart__mutmut_18": (
            'self._want_all("THIS REPLICA STARTED")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁtick__mutmut_57": (
            'log.warning("XXreplica sync: %s silent for %.1f s (lease %.1f s): forgot its %d requestsXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁtick__mutmut_59": (
            "origin, now + entry.heard_at, entry.lease_s, n)  # fmt: skip",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁtick__mutmut_69": (
            "self._want(origin, entry, now, None)",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "xǁReplicaSyncǁtick__mutmut_74": (
            'self._want(origin, entry, now, "XXno state came yetXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁtick__mutmut_75": (
            'self._want(origin, entry, now, "NO STATE CAME YET")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁReplicaSyncǁ__init____mutmut_33": (
            'self._inbox_sub: Any = ""',
            "same-value",
            "stop() unsubscribes what is not None; ''.unsubscribe fails and is suppressed, as nothing was subscribed",  # noqa: E501
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_11": (
            "answer.sent = 1",
            "message",
            "`answer.sent` is only a log line's argument",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_12": (
            "answer.sent -= 1",
            "message",
            "`answer.sent` is only a log line's argument",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_13": (
            "answer.sent += 2",
            "message",
            "`answer.sent` is only a log line's argument",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_18": (
            "log.info(None, asker, answer.sent)",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_19": (
            'log.info("replica sync: handed its routes to %s (%d parts)", None, answer.sent)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_20": (
            'log.info("replica sync: handed its routes to %s (%d parts)", asker, None)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_21": (
            "log.info(asker, answer.sent)",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_22": (
            'log.info("replica sync: handed its routes to %s (%d parts)", answer.sent)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_23": (
            'log.info("replica sync: handed its routes to %s (%d parts)", asker, )',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_24": (
            'log.info("XXreplica sync: handed its routes to %s (%d parts)XX", asker, answer.sent)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_answer_routes__mutmut_25": (
            'log.info("REPLICA SYNC: HANDED ITS ROUTES TO %S (%D PARTS)", asker, answer.sent)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_ask_routes__mutmut_13": (
            "log.info(None, origin)",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_ask_routes__mutmut_14": (
            'log.info("replica sync: asking %s for the routes it keeps (answers\' workers, session pins)", None)',  # noqa: E501
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_ask_routes__mutmut_15": (
            "log.info(origin)",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_ask_routes__mutmut_16": (
            'log.info("replica sync: asking %s for the routes it keeps (answers\' workers, session pins)", )',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_ask_routes__mutmut_17": (
            'log.info("XXreplica sync: asking %s for the routes it keeps (answers\' workers, session pins)XX", origin)',  # noqa: E501
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_ask_routes__mutmut_18": (
            'log.info("REPLICA SYNC: ASKING %S FOR THE ROUTES IT KEEPS (ANSWERS\' WORKERS, SESSION PINS)", origin)',  # noqa: E501
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_17": (
            'self.counters.loud("sync.routes_want_dropped", None, MAX_PENDING_ANSWERS, origin)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_18": (
            '"routes at once; %.60s asks again", None, origin)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_19": (
            '"routes at once; %.60s asks again", MAX_PENDING_ANSWERS, None)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_21": (
            'self.counters.loud("sync.routes_want_dropped", MAX_PENDING_ANSWERS, origin)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_22": (
            '"routes at once; %.60s asks again", origin)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_23": (
            '"routes at once; %.60s asks again", MAX_PENDING_ANSWERS, )  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_26": (
            'self.counters.loud("sync.routes_want_dropped", "XXreplica sync: more than %d replicas ask for XX"',  # noqa: E501
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_27": (
            'self.counters.loud("sync.routes_want_dropped", "REPLICA SYNC: MORE THAN %D REPLICAS ASK FOR "',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_28": (
            '"XXroutes at once; %.60s asks againXX", MAX_PENDING_ANSWERS, origin)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁ_routes_asked__mutmut_29": (
            '"ROUTES AT ONCE; %.60S ASKS AGAIN", MAX_PENDING_ANSWERS, origin)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_1": (
            "if self._routes_wanted is None and self.routes is None:",
            "same-value",
            "`_routes_wanted` is None exactly when the replica was made without `routes`",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_14": (
            'self.counters.loud("sync.malformed", "malformed routes answer (%r); dropped", None)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_17": (
            'self.counters.loud("sync.malformed", "malformed routes answer (%r); dropped", )',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_20": (
            'self.counters.loud("sync.malformed", "XXmalformed routes answer (%r); droppedXX", exc)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_35": (
            'self.counters.loud("sync.malformed", "malformed route in an answer (%r); dropped", None)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_38": (
            'self.counters.loud("sync.malformed", "malformed route in an answer (%r); dropped", )',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_41": (
            'self.counters.loud("sync.malformed", "XXmalformed route in an answer (%r); droppedXX", exc)',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_43": (
            "ask.told = 1",
            "message",
            "`ask.told` is only a log line's argument",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_44": (
            "ask.told -= 1",
            "message",
            "`ask.told` is only a log line's argument",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_45": (
            "ask.told += 2",
            "message",
            "`ask.told` is only a log line's argument",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_52": (
            "log.info(None,",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_53": (
            "None, ask.origin, ask.told - ask.learned)  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_54": (
            "ask.learned, None, ask.told - ask.learned)  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_55": (
            "ask.learned, ask.origin, None)  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_56": (
            "log.info(ask.learned, ask.origin, ask.told - ask.learned)  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_57": (
            "ask.origin, ask.told - ask.learned)  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_58": (
            "ask.learned, ask.told - ask.learned)  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_59": (
            "ask.learned, ask.origin, )  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_60": (
            'log.info("XXreplica sync: learned %d routes from %s (%d more were known here or lapsed)XX",',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_61": (
            'log.info("REPLICA SYNC: LEARNED %D ROUTES FROM %S (%D MORE WERE KNOWN HERE OR LAPSED)",',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁhandle_routes__mutmut_62": (
            "ask.learned, ask.origin, ask.told + ask.learned)  # fmt: skip",
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁtick__mutmut_24": (
            '"asking again", None, silent.parts_next, now - silent.heard_at)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁtick__mutmut_31": (
            'log.warning("XXreplica sync: %s handed over %d parts of its routes, then nothing for %.1f s: XX"',  # noqa: E501
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁtick__mutmut_33": (
            '"XXasking againXX", silent.origin, silent.parts_next, now - silent.heard_at)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁtick__mutmut_34": (
            '"ASKING AGAIN", silent.origin, silent.parts_next, now - silent.heard_at)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
        "xǁReplicaSyncǁtick__mutmut_35": (
            '"asking again", silent.origin, silent.parts_next, now + silent.heard_at)  # fmt: skip',
            "message",
            "a log line's or a counter's message, or its arguments",
        ),
    },
    "events/route_catchup.py": {
        "x__check_texts__mutmut_5": (
            "raise TypeError(None)",
            "message",
            "an error's text",
        ),
        "x__check_texts__mutmut_7": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x__check_texts__mutmut_8": (
            'raise ValueError("XXa route\'s id is not emptyXX")',
            "message",
            "an error's text",
        ),
        "x__check_texts__mutmut_9": (
            'raise ValueError("A ROUTE\'S ID IS NOT EMPTY")',
            "message",
            "an error's text",
        ),
        "x_fill_from_answer__mutmut_6": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x_fill_from_answer__mutmut_7": (
            'raise ValueError("XXa route of an answer is a list: [age_s, code, id, ...]XX")',
            "message",
            "an error's text",
        ),
        "x_fill_from_answer__mutmut_8": (
            'raise ValueError("A ROUTE OF AN ANSWER IS A LIST: [AGE_S, CODE, ID, ...]")',
            "message",
            "an error's text",
        ),
        "x_fill_from_answer__mutmut_19": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x_fill_from_answer__mutmut_90": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x_reply_subject__mutmut_7": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x_reply_subject__mutmut_21": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "xǁRoutesWantedǁtake__mutmut_20": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "xǁRoutesWantedǁtake__mutmut_21": (
            'raise ValueError("XXnot a routes answerXX")',
            "message",
            "an error's text",
        ),
        "xǁRoutesWantedǁtake__mutmut_22": (
            'raise ValueError("NOT A ROUTES ANSWER")',
            "message",
            "an error's text",
        ),
        "xǁRoutesWantedǁtake__mutmut_52": (
            "None",
            "message",
            "an error's text",
        ),
        "xǁRoutesWantedǁtake__mutmut_54": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "xǁRoutesWantedǁtake__mutmut_55": (
            'raise ValueError("XXroutes: a listXX")',
            "message",
            "an error's text",
        ),
        "xǁRoutesWantedǁtake__mutmut_56": (
            'raise ValueError("ROUTES: A LIST")',
            "message",
            "an error's text",
        ),
        "x_fill_from_answer__mutmut_1": (
            "if type(item) is not list and len(item) < 2:",
            "same-value",
            "an item the first check lets through fails the next lines (its age, its code, an IndexError): "
            "dropped and counted alike",
        ),
        "x_fill_from_answer__mutmut_4": (
            "if type(item) is not list or len(item) <= 2:",
            "same-value",
            "a list of 2 items is refused a line later (no route has fewer than 7): dropped, counted alike",
        ),
        "x_fill_from_answer__mutmut_5": (
            "if type(item) is not list or len(item) < 3:",
            "same-value",
            "a list of 2 items is refused a line later (no route has fewer than 7): dropped, counted alike",
        ),
        "x_reply_subject__mutmut_5": (
            "if not isinstance(value, str) or not 0 <= len(value) <= MAX_REPLY_CHARS:",
            "same-value",
            "an empty reply fails at value[0] (IndexError), a want dropped and counted alike",
        ),
        "xǁRoutesWantedǁ__init____mutmut_5": (
            "self.answered = None  # an answer was taken whole since this replica started",
            "same-value",
            "`answered` is only read for its truth: None is false as False is",
        ),
        "xǁRoutesWantedǁtake__mutmut_63": (
            "self.missed = None",
            "same-value",
            "`missed` is only read for its truth: None is false as False is",
        ),
        "xǁRoutesWantedǁtake__mutmut_3": (
            "message = msgpack.unpackb(data, raw=None)",
            "same-value",
            "msgpack's unpackb defaults to raw=False; None is false",
        ),
        "xǁRoutesWantedǁtake__mutmut_5": (
            "message = msgpack.unpackb(data, )",
            "same-value",
            "msgpack's unpackb defaults to raw=False",
        ),
        "xǁRouteSinkǁremember_response_home__mutmut_1": (
            "age_s: float = 1.0, fill: bool = False,",
            "same-value",
            "a Protocol's stub: never run, its implementers' defaults count",
        ),
        "xǁRouteSinkǁremember_response_home__mutmut_2": (
            "age_s: float = 0.0, fill: bool = True,",
            "same-value",
            "a Protocol's stub: never run, its implementers' defaults count",
        ),
        "xǁRouteSinkǁremember_session_pin__mutmut_1": (
            "age_s: float = 1.0,",
            "same-value",
            "a Protocol's stub: never run, its implementers' defaults count",
        ),
        "xǁRouteSinkǁremember_session_pin__mutmut_2": (
            "fill: bool = True,",
            "same-value",
            "a Protocol's stub: never run, its implementers' defaults count",
        ),
    },
    "events/replica_wire.py": {
        "x_batch_op_from_wire__mutmut_51": (
            "if code in _ROUTE_OPS or type(code) is int:",
            "message",
            (
                "an unknown integer code then raises KeyError in route_from_wire instead of ValueError here: "
                "either drops the batch, counted as sync.apply_failed"
            ),
        ),
        "x_route_from_wire__mutmut_5": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x_route_from_wire__mutmut_6": (
            'raise ValueError(f"{op}: {len(items)} items, expected {1 - len(fields)}")',
            "message",
            "an error's text",
        ),
        "x_route_from_wire__mutmut_7": (
            'raise ValueError(f"{op}: {len(items)} items, expected {2 + len(fields)}")',
            "message",
            "an error's text",
        ),
        "x_route_from_wire__mutmut_12": (
            'named = dict(zip(("id", *fields), items, strict=None))',
            "same-value",
            "the length is checked just before: zip never meets items of unequal lengths",
        ),
        "x_route_from_wire__mutmut_15": (
            'named = dict(zip(("id", *fields), items, ))',
            "same-value",
            "the length is checked just before: zip never meets items of unequal lengths",
        ),
        "x_route_from_wire__mutmut_18": (
            'named = dict(zip(("id", *fields), items, strict=False))',
            "same-value",
            "the length is checked just before: zip never meets items of unequal lengths",
        ),
        "x_route_from_wire__mutmut_21": (
            'texts = {name: wire_text(value, None) for name, value in named.items() if name not in ("worker", "dp")}',  # noqa: E501
            "message",
            "an error's text (the field named in wire_text's TypeError)",
        ),
        "x_route_from_wire__mutmut_35": (
            "raise ValueError(None)",
            "message",
            "an error's text",
        ),
        "x_wire_hashes__mutmut_17": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_wire_hashes__mutmut_32": (
            "raise TypeError(None)  # checked in C, not one by one",
            "message",
            "an error's or a log line's text",
        ),
        "x_wire_hashes__mutmut_33": (
            'raise TypeError("XXhashes: expected integers in [-2**63, 2**64)XX")  # checked in C, not one by one',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_wire_hashes__mutmut_34": (
            'raise TypeError("HASHES: EXPECTED INTEGERS IN [-2**63, 2**64)")  # checked in C, not one by one',
            "message",
            "an error's or a log line's text",
        ),
        "x_wire_hashes__mutmut_20": (
            "if not (set(map(type, value)) <= _INT_ONLY and (lo := min(value)) >= _MIN or max(value) < _END):",  # noqa: E501
            "same-value",
            "msgpack carries no integer below -2**63, and a non-integer fails either way (`lo` left unset)",
        ),
        "x_wire_hashes__mutmut_31": (
            "if not (set(map(type, value)) <= _INT_ONLY and (lo := min(value)) >= _MIN and max(value) <= _END):",  # noqa: E501
            "same-value",
            "msgpack carries no integer of 2**64 or more",
        ),
        "x_wire_hashes__mutmut_35": (
            "return tuple(value) if (lo >= 0) and False else tuple(h & _U64_MASK for h in value)  # signed: the same u64s",  # noqa: E501
            "performance",
            "non-negative hashes masked to 64 bits: the same values",
        ),
        "x_wire_hashes__mutmut_38": (
            "return tuple(value) if lo > 0 else tuple(h & _U64_MASK for h in value)  # signed: the same u64s",
            "performance",
            "non-negative hashes masked to 64 bits: the same values",
        ),
        "x_wire_hashes__mutmut_39": (
            "return tuple(value) if lo >= 1 else tuple(h & _U64_MASK for h in value)  # signed: the same u64s",  # noqa: E501
            "performance",
            "non-negative hashes masked to 64 bits: the same values",
        ),
        "x_wire_hashes__mutmut_7": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_wire_int__mutmut_3": (
            "raise TypeError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_is_int__mutmut_11": (
            "return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (2 << 64)",  # noqa: E501
            "same-value",
            "msgpack carries no integer of 2**64 or more",
        ),
        "x_is_int__mutmut_12": (
            "return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 65)",  # noqa: E501
            "same-value",
            "msgpack carries no integer of 2**64 or more",
        ),
        "x_is_int__mutmut_6": (
            "return isinstance(value, int) and not isinstance(value, bool) and -(2 << 63) <= value < (1 << 64)",  # noqa: E501
            "same-value",
            "msgpack carries no integer below -2**63",
        ),
        "x_is_int__mutmut_7": (
            "return isinstance(value, int) and not isinstance(value, bool) and -(1 << 64) <= value < (1 << 64)",  # noqa: E501
            "same-value",
            "msgpack carries no integer below -2**63",
        ),
        "x_is_int__mutmut_9": (
            "return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value <= (1 << 64)",  # noqa: E501
            "same-value",
            "msgpack carries no integer of 2**64 or more",
        ),
        "x_packed_hashes__mutmut_3": (
            'return struct.pack(f"<{len(hashes)}Q", )',
            "performance",
            "the hashes travel as a list instead of packed bytes, which receivers read alike (`_hashes`)",
        ),
        "x_wire_text__mutmut_2": (
            "raise TypeError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_wire_worker__mutmut_5": (
            "raise TypeError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_id_hash__mutmut_8": (
            'data = request_id.encode("UTF-8", "surrogatepass") + (b"\\x001" if prefilled else b"\\x000")',
            "same-value",
            "codec names are case-insensitive",
        ),
        "xǁInFlightǁmark_prefilled__mutmut_11": (
            "self.digest = (self.digest - id_hash(request_id, None) + id_hash(request_id, True)) & _MASK",
            "same-value",
            "None selects the same suffix as False",
        ),
        "x_batch_op_from_wire__mutmut_32": (
            "return OP_ADD, wire_text(request_id, None), record",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "x_batch_op_from_wire__mutmut_35": (
            'return OP_ADD, wire_text(request_id, "XXrequest idXX"), record',
            "message",
            "an error's or a log line's text",
        ),
        "x_batch_op_from_wire__mutmut_36": (
            'return OP_ADD, wire_text(request_id, "REQUEST ID"), record',
            "message",
            "an error's or a log line's text",
        ),
        "x_batch_op_from_wire__mutmut_4": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_batch_op_from_wire__mutmut_45": (
            "return code, wire_text(item[1], None), None",
            "message",
            "a log line's or an error's arguments (the replica, a count or a value shown)",
        ),
        "x_batch_op_from_wire__mutmut_49": (
            'return code, wire_text(item[1], "XXrequest idXX"), None',
            "message",
            "an error's or a log line's text",
        ),
        "x_batch_op_from_wire__mutmut_50": (
            'return code, wire_text(item[1], "REQUEST ID"), None',
            "message",
            "an error's or a log line's text",
        ),
        "x_batch_op_from_wire__mutmut_60": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x_add_record__mutmut_20": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁRecordǁfrom_wire__mutmut_1": (
            "if not isinstance(item, list) and len(item) != 8:",
            "same-value",
            (
                "a state entry that is no list (msgpack gives a map, a string or bytes) fails at its fields "
                "anyway"
            ),
        ),
        "xǁRecordǁfrom_wire__mutmut_26": (
            "return wire_text(request_id, None), record",
            "message",
            "an error's or a log line's text",
        ),
        "xǁRecordǁfrom_wire__mutmut_29": (
            'return wire_text(request_id, "XXrequest idXX"), record',
            "message",
            "an error's or a log line's text",
        ),
        "xǁRecordǁfrom_wire__mutmut_30": (
            'return wire_text(request_id, "REQUEST ID"), record',
            "message",
            "an error's or a log line's text",
        ),
        "xǁRecordǁfrom_wire__mutmut_5": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
    },
    "events/vllm.py": {
        "x__pack_msgspec_event__mutmut_19": (
            'return b"\\xde" + len(event).to_bytes(2, ) + body',
            "same-value",
            "big-endian is the default byte order (Python 3.11+, the oldest supported)",
        ),
        "x__wire_fields__mutmut_45": (
            "raise TypeError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "x__wire_fields__mutmut_46": (
            'raise TypeError(f"not a wire KV event: {type(None).__name__}")',
            "message",
            "an error's or a log line's text",
        ),
        "x_decode_seq__mutmut_5": (
            "value = int.from_bytes(frame, )",
            "same-value",
            "big-endian is the default byte order (Python 3.11+, the oldest supported)",
        ),
        "x_encode_batch__mutmut_6": (
            "raise ValueError(f\"layout must be one of {'XX, XX'.join(LAYOUTS)}, got {layout!r}\")",
            "message",
            "an error's or a log line's text",
        ),
        "x_encode_batch__mutmut_65": (
            "return msgpack.packb(batch, use_bin_type=None)",
            "same-value",
            (
                "the encoder is given ints, strings, None and lists, never bytes: use_bin_type only changes"
                " how bytes are packed"
            ),
        ),
        "x_encode_batch__mutmut_67": (
            "return msgpack.packb(batch, )",
            "same-value",
            "msgpack's use_bin_type defaults to True (1.0+)",
        ),
        "x_encode_batch__mutmut_68": (
            "return msgpack.packb(batch, use_bin_type=False)",
            "same-value",
            (
                "the encoder is given ints, strings, None and lists, never bytes: use_bin_type only changes"
                " how bytes are packed"
            ),
        ),
        "x_encode_seq__mutmut_10": (
            'return seq.to_bytes(8, "big", signed=seq <= 0)',
            "same-value",
            "0 has the same 8 bytes signed or unsigned",
        ),
        "x_encode_seq__mutmut_11": (
            'return seq.to_bytes(8, "big", signed=seq < 1)',
            "same-value",
            "0 has the same 8 bytes signed or unsigned",
        ),
        "x_encode_seq__mutmut_5": (
            "return seq.to_bytes(8, signed=seq < 0)",
            "same-value",
            "big-endian is the default byte order (Python 3.11+, the oldest supported)",
        ),
        "x_normalize_hash__mutmut_6": (
            "return int.from_bytes(value, ) & MASK64",
            "same-value",
            "big-endian is the default byte order (Python 3.11+, the oldest supported)",
        ),
        "x_parse_frames__mutmut_16": (
            '"XXKV event message with %d frames (seq frame of %s bytes); expected [topic, 8-byte seq, payload]XX",',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_parse_frames__mutmut_17": (
            '"kv event message with %d frames (seq frame of %s bytes); expected [topic, 8-byte seq, payload]",',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_parse_frames__mutmut_19": (
            'len(frames[1]) if (len(frames) > 1) and False else "no",',
            "message",
            "the length shown in the malformed frames' log line",
        ),
        "x_parse_frames__mutmut_22": (
            'len(frames[1]) if len(frames) > 2 else "no",',
            "message",
            "the length shown in the malformed frames' log line",
        ),
        "x_parse_frames__mutmut_23": (
            'len(frames[1]) if len(frames) > 1 else "XXnoXX",',
            "message",
            "an error's or a log line's text",
        ),
        "x_parse_frames__mutmut_24": (
            'len(frames[1]) if len(frames) > 1 else "NO",',
            "message",
            "an error's or a log line's text",
        ),
        "x_parse_frames__mutmut_30": (
            "value = int.from_bytes(seq, )",
            "same-value",
            "big-endian is the default byte order (Python 3.11+, the oldest supported)",
        ),
        "x_parse_frames__mutmut_40": (
            'counters.loud("vllm.malformed_frames", "XXKV event message with the end-of-replay marker as its seqXX")',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_parse_frames__mutmut_41": (
            'counters.loud("vllm.malformed_frames", "kv event message with the end-of-replay marker as its seq")',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_parse_frames__mutmut_42": (
            'counters.loud("vllm.malformed_frames", "KV EVENT MESSAGE WITH THE END-OF-REPLAY MARKER AS ITS SEQ")',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "x_parse_frames__mutmut_9": (
            "None,",
            "message",
            "the length shown in the malformed frames' log line",
        ),
        "x_parse_replay_reply__mutmut_6": (
            "if frames and not frames[0] and len(frames) in (4, 4):",
            "same-value",
            (
                "an older reply kept with its empty delimiter reads as the current layout with an empty "
                "topic, which is what it gives stripped"
            ),
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_18": (
            'self._salts = _Tracked(max_tracked_blocks, counters, "vllm.salt_map_full", None)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_25": (
            'self._salts = _Tracked(max_tracked_blocks, counters, "vllm.salt_map_full", "XXsalted blocksXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_26": (
            'self._salts = _Tracked(max_tracked_blocks, counters, "vllm.salt_map_full", "SALTED BLOCKS")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_31": (
            'max_tracked_blocks, counters, "vllm.unindexed_map_full", None',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_38": (
            'max_tracked_blocks, counters, "vllm.unindexed_map_full", "XXunindexed blocksXX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_39": (
            'max_tracked_blocks, counters, "vllm.unindexed_map_full", "UNINDEXED BLOCKS"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_5": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ__init____mutmut_8": (
            "raise ValueError(None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_28": (
            '"vllm.malformed_batch", "KV event batch is a %s, not [ts, events, ...]", None',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_30": (
            '"vllm.malformed_batch", type(raw).__name__',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_31": (
            '"vllm.malformed_batch", "KV event batch is a %s, not [ts, events, ...]", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_34": (
            '"vllm.malformed_batch", "XXKV event batch is a %s, not [ts, events, ...]XX", type(raw).__name__',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_35": (
            '"vllm.malformed_batch", "kv event batch is a %s, not [ts, events, ...]", type(raw).__name__',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_37": (
            '"vllm.malformed_batch", "KV event batch is a %s, not [ts, events, ...]", type(None).__name__',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_45": (
            'self.counters.loud("vllm.malformed_batch", "XXKV event batch\'s events is not a listXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_46": (
            'self.counters.loud("vllm.malformed_batch", "kv event batch\'s events is not a list")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_47": (
            'self.counters.loud("vllm.malformed_batch", "KV EVENT BATCH\'S EVENTS IS NOT A LIST")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_55": (
            'self.counters.loud(None, "KV event batch has dp rank %r", dp_rank)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_57": (
            'self.counters.loud("vllm.malformed_batch", "KV event batch has dp rank %r", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_60": (
            'self.counters.loud("vllm.malformed_batch", "KV event batch has dp rank %r", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_61": (
            'self.counters.loud("XXvllm.malformed_batchXX", "KV event batch has dp rank %r", dp_rank)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_62": (
            'self.counters.loud("VLLM.MALFORMED_BATCH", "KV event batch has dp rank %r", dp_rank)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_63": (
            'self.counters.loud("vllm.malformed_batch", "XXKV event batch has dp rank %rXX", dp_rank)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_64": (
            'self.counters.loud("vllm.malformed_batch", "kv event batch has dp rank %r", dp_rank)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_batch_parts__mutmut_65": (
            'self.counters.loud("vllm.malformed_batch", "KV EVENT BATCH HAS DP RANK %R", dp_rank)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_20": (
            "fields: Mapping[str, Any] = dict(zip(fields_of, raw[1:], strict=None))",
            "same-value",
            "zip's strict defaults to False; None is false alike",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_23": (
            "fields: Mapping[str, Any] = dict(zip(fields_of, raw[1:], ))",
            "same-value",
            "zip's strict defaults to False; None is false alike",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_32": (
            'self.counters.loud("vllm.malformed_event", "KV event is a %s without a tag", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_34": (
            'self.counters.loud("vllm.malformed_event", type(raw).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_38": (
            'self.counters.loud("vllm.malformed_event", "XXKV event is a %s without a tagXX", type(raw).__name__)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_39": (
            'self.counters.loud("vllm.malformed_event", "kv event is a %s without a tag", type(raw).__name__)',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_41": (
            'self.counters.loud("vllm.malformed_event", "KV event is a %s without a tag", type(None).__name__)',  # noqa: E501
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_76": (
            'self.counters.loud("vllm.unknown_event", tag)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_80": (
            'self.counters.loud("vllm.unknown_event", "XXunknown KV event type %r ignoredXX", tag)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_event__mutmut_81": (
            'self.counters.loud("vllm.unknown_event", "unknown kv event type %r ignored", tag)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_key_kind__mutmut_10": (
            'raise self._malformed("BlockStored.extra_keys holds a %s", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_key_kind__mutmut_11": (
            "raise self._malformed(type(item).__name__)",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_key_kind__mutmut_12": (
            'raise self._malformed("BlockStored.extra_keys holds a %s", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_key_kind__mutmut_13": (
            'raise self._malformed("XXBlockStored.extra_keys holds a %sXX", type(item).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_key_kind__mutmut_14": (
            'raise self._malformed("blockstored.extra_keys holds a %s", type(item).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_key_kind__mutmut_16": (
            'raise self._malformed("BlockStored.extra_keys holds a %s", type(None).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_11": (
            'raise self._malformed("XXBlockStored.extra_keys is not one entry per blockXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_12": (
            'raise self._malformed("blockstored.extra_keys is not one entry per block")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_13": (
            'raise self._malformed("BLOCKSTORED.EXTRA_KEYS IS NOT ONE ENTRY PER BLOCK")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_21": (
            'raise self._malformed("BlockStored.extra_keys entry is a %s", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_22": (
            "raise self._malformed(type(entry).__name__)",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_23": (
            'raise self._malformed("BlockStored.extra_keys entry is a %s", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_24": (
            'raise self._malformed("XXBlockStored.extra_keys entry is a %sXX", type(entry).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_25": (
            'raise self._malformed("blockstored.extra_keys entry is a %s", type(entry).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_27": (
            'raise self._malformed("BlockStored.extra_keys entry is a %s", type(None).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_41": (
            "elif i <= cut:",
            "same-value",
            (
                "i runs below the number of blocks, and once cut is lowered to an i every later i is above "
                "it: never equal"
            ),
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_48": (
            'raise self._malformed("BlockStored.extra_keys name %d different salts", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_49": (
            'raise self._malformed("XXBlockStored.extra_keys name %d different saltsXX", len(salts))',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_extra_keys__mutmut_50": (
            'raise self._malformed("blockstored.extra_keys name %d different salts", len(salts))',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_full_blocks__mutmut_14": (
            "self._mismatch(None, block_size, len(tokens), len(ids))",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_full_blocks__mutmut_24": (
            "self._mismatch(None, block_size, len(tokens), len(ids))",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_full_blocks__mutmut_50": (
            '"XXBlockStored with %d block hashes for %d tokens of block size %dXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_full_blocks__mutmut_51": (
            '"blockstored with %d block hashes for %d tokens of block size %d",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_13": (
            'raise self._malformed("%s holds a %s", None, type(item).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_14": (
            'raise self._malformed("%s holds a %s", what, None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_18": (
            'raise self._malformed("XX%s holds a %sXX", what, type(item).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_20": (
            'raise self._malformed("%s holds a %s", what, type(None).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_3": (
            'raise self._malformed("%s is not a list", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_4": (
            "raise self._malformed(what)",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_5": (
            'raise self._malformed("%s is not a list", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_hashes__mutmut_6": (
            'raise self._malformed("XX%s is not a listXX", what)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_10": (
            "raise self._malformed(type(lora_name).__name__)",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_11": (
            'raise self._malformed("BlockStored.lora_name is a %s", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_12": (
            'raise self._malformed("XXBlockStored.lora_name is a %sXX", type(lora_name).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_13": (
            'raise self._malformed("blockstored.lora_name is a %s", type(lora_name).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_14": (
            'raise self._malformed("BLOCKSTORED.LORA_NAME IS A %S", type(lora_name).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_15": (
            'raise self._malformed("BlockStored.lora_name is a %s", type(None).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_24": (
            "None,",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_25": (
            "None,",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_32": (
            '"XXBlockStored from %s names LoRA id %r but no lora_name: its blocks cannot be hashed XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_33": (
            '"blockstored from %s names lora id %r but no lora_name: its blocks cannot be hashed "',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_35": (
            '"XXas the router hashes requests; event droppedXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_36": (
            '"AS THE ROUTER HASHES REQUESTS; EVENT DROPPED",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_37": (
            "fields.get(None),",
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_38": (
            'fields.get("XXlora_idXX"),',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_39": (
            'fields.get("LORA_ID"),',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_lora_name__mutmut_9": (
            'raise self._malformed("BlockStored.lora_name is a %s", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_malformed__mutmut_10": (
            'self.counters.loud("vllm.malformed_event", "kv event dropped: " + message, *args)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_malformed__mutmut_11": (
            'self.counters.loud("vllm.malformed_event", "KV EVENT DROPPED: " + message, *args)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_malformed__mutmut_5": (
            'self.counters.loud("vllm.malformed_event", "KV event dropped: " + message, )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_malformed__mutmut_9": (
            'self.counters.loud("vllm.malformed_event", "XXKV event dropped: XX" + message, *args)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_mismatch__mutmut_17": (
            '"XXKV event from %s with block_size %d (%d tokens, %d blocks), the router\'s is %d: event XX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_mismatch__mutmut_18": (
            '"kv event from %s with block_size %d (%d tokens, %d blocks), the router\'s is %d: event "',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_mismatch__mutmut_20": (
            "\"XXdropped (configure the router's block size to match the engine's)XX\",",
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_mismatch__mutmut_21": (
            "\"DROPPED (CONFIGURE THE ROUTER'S BLOCK SIZE TO MATCH THE ENGINE'S)\",",
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_mismatch__mutmut_3": (
            "None,",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_remember__mutmut_9": (
            "n = None",
            "same-value",
            "the ids and their local hashes are always as many: both are cut at the indexed blocks, and "
            "_full_blocks refuses a store whose ids and tokens disagree",
        ),
        "xǁVllmEventDecoderǁ_removed__mutmut_12": (
            'ids = self._hashes(fields.get("block_hashes"), "XXBlockRemoved.block_hashesXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_removed__mutmut_13": (
            'ids = self._hashes(fields.get("block_hashes"), "blockremoved.block_hashes")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_removed__mutmut_14": (
            'ids = self._hashes(fields.get("block_hashes"), "BLOCKREMOVED.BLOCK_HASHES")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_removed__mutmut_6": (
            'ids = self._hashes(fields.get("block_hashes"), None)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_10": (
            "raise self._malformed(type(salt).__name__)",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_11": (
            'raise self._malformed("BlockStored.cache_salt is a %s", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_12": (
            'raise self._malformed("XXBlockStored.cache_salt is a %sXX", type(salt).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_13": (
            'raise self._malformed("blockstored.cache_salt is a %s", type(salt).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_15": (
            'raise self._malformed("BlockStored.cache_salt is a %s", type(None).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_20": (
            'raise self._malformed("XXBlockStored names two saltsXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_21": (
            'raise self._malformed("blockstored names two salts")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_22": (
            'raise self._malformed("BLOCKSTORED NAMES TWO SALTS")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_salt__mutmut_9": (
            'raise self._malformed("BlockStored.cache_salt is a %s", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_146": (
            'raise self._malformed("BlockStored.token_ids: %s", None) from None',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_148": (
            'raise self._malformed("BlockStored.token_ids: %s", ) from None',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_149": (
            'raise self._malformed("XXBlockStored.token_ids: %sXX", exc) from None',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_150": (
            'raise self._malformed("blockstored.token_ids: %s", exc) from None',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_151": (
            'raise self._malformed("BLOCKSTORED.TOKEN_IDS: %S", exc) from None',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_20": (
            'ids = self._hashes(fields.get("block_hashes"), None)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_26": (
            'ids = self._hashes(fields.get("block_hashes"), "XXBlockStored.block_hashesXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_27": (
            'ids = self._hashes(fields.get("block_hashes"), "blockstored.block_hashes")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_28": (
            'ids = self._hashes(fields.get("block_hashes"), "BLOCKSTORED.BLOCK_HASHES")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_34": (
            "parent = None if (parent_raw is None) and False else normalize_hash(parent_raw)",
            "same-value",
            "normalize_hash(None) is None",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_42": (
            'raise self._malformed("BlockStored.parent_block_hash is a %s", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_43": (
            "raise self._malformed(type(parent_raw).__name__)",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_44": (
            'raise self._malformed("BlockStored.parent_block_hash is a %s", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_45": (
            'raise self._malformed("XXBlockStored.parent_block_hash is a %sXX", type(parent_raw).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_46": (
            'raise self._malformed("blockstored.parent_block_hash is a %s", type(parent_raw).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_47": (
            'raise self._malformed("BLOCKSTORED.PARENT_BLOCK_HASH IS A %S", type(parent_raw).__name__)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_48": (
            'raise self._malformed("BlockStored.parent_block_hash is a %s", type(None).__name__)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_51": (
            "lineage = self._unindexed.items.get(parent) if (parent is not None) or True else None",
            "same-value",
            "None is never a key of the unindexed ids",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_75": (
            'raise self._malformed("XXBlockStored without a positive block_sizeXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_76": (
            'raise self._malformed("blockstored without a positive block_size")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_77": (
            'raise self._malformed("BLOCKSTORED WITHOUT A POSITIVE BLOCK_SIZE")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_79": (
            "full = self._full_blocks(None, ids, tokens, block_size)",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁ_stored__mutmut_90": (
            "lora_name = self._lora_name(fields, None)",
            "message",
            "the worker is passed on only to name it in a log line",
        ),
        "xǁVllmEventDecoderǁ_tokens__mutmut_13": (
            'raise self._malformed("XXBlockStored.token_ids mixes pairs and tokensXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_tokens__mutmut_14": (
            'raise self._malformed("blockstored.token_ids mixes pairs and tokens")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_tokens__mutmut_15": (
            'raise self._malformed("BLOCKSTORED.TOKEN_IDS MIXES PAIRS AND TOKENS")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_tokens__mutmut_3": (
            'raise self._malformed("XXBlockStored without token_idsXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_tokens__mutmut_4": (
            'raise self._malformed("blockstored without token_ids")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁ_tokens__mutmut_5": (
            'raise self._malformed("BLOCKSTORED WITHOUT TOKEN_IDS")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁdecode__mutmut_12": (
            "raw = msgpack.unpackb(payload, raw=None, strict_map_key=False)",
            "same-value",
            "msgpack's raw defaults to False (1.0+); None is false alike",
        ),
        "xǁVllmEventDecoderǁdecode__mutmut_13": (
            "raw = msgpack.unpackb(payload, raw=False, strict_map_key=None)",
            "same-value",
            "None and False are both false for msgpack's strict_map_key",
        ),
        "xǁVllmEventDecoderǁdecode__mutmut_15": (
            "raw = msgpack.unpackb(payload, strict_map_key=False)",
            "same-value",
            "msgpack's raw defaults to False (1.0+); None is false alike",
        ),
        "xǁVllmEventDecoderǁdecode__mutmut_21": (
            'self.counters.loud("vllm.malformed_batch", "KV event batch is not msgpack: %r", None)',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁdecode__mutmut_24": (
            'self.counters.loud("vllm.malformed_batch", "KV event batch is not msgpack: %r", )',
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁVllmEventDecoderǁdecode__mutmut_27": (
            'self.counters.loud("vllm.malformed_batch", "XXKV event batch is not msgpack: %rXX", exc)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁVllmEventDecoderǁdecode__mutmut_28": (
            'self.counters.loud("vllm.malformed_batch", "kv event batch is not msgpack: %r", exc)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Trackedǁ__init____mutmut_4": (
            "self.what = None",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁ_Trackedǁput__mutmut_10": (
            "None,",
            "message",
            "a log line's or an error's arguments (the worker, what a map holds, a value shown)",
        ),
        "xǁ_Trackedǁput__mutmut_15": (
            '"XXKV events: more than %d %s tracked; forgetting the oldestXX",',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Trackedǁput__mutmut_16": (
            '"kv events: more than %d %s tracked; forgetting the oldest",',
            "message",
            "an error's or a log line's text",
        ),
    },
    "events/dynamo_json.py": {
        "x__all_u64__mutmut_1": (
            "return not values and (set(map(type, values)) == {int} and min(values) >= 0 and max(values) <= U64_MAX)",  # noqa: E501
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__all_u64__mutmut_12": (
            "return not values or (set(map(type, values)) == {int} and min(values) > 0 and max(values) <= U64_MAX)",  # noqa: E501
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__all_u64__mutmut_13": (
            "return not values or (set(map(type, values)) == {int} and min(values) >= 1 and max(values) <= U64_MAX)",  # noqa: E501
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__all_u64__mutmut_15": (
            "return not values or (set(map(type, values)) == {int} and min(values) >= 0 and max(values) < U64_MAX)",  # noqa: E501
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__decode__mutmut_19": (
            "count_unknown_variant(counters, None, payload)",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x__decode__mutmut_20": (
            "count_unknown_variant(counters, worker, None)",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x__list__mutmut_2": (
            "raise MalformedEvent(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__list__mutmut_3": (
            'raise MalformedEvent(f"{what} is {type(None).__name__}, not a list")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__object__mutmut_2": (
            "raise MalformedEvent(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__object__mutmut_3": (
            'raise MalformedEvent(f"{what} is {type(None).__name__}, not an object")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__stored_blocks__mutmut_2": (
            'engine = [b["XXblock_hashXX"] for b in blocks]',
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__stored_blocks__mutmut_22": (
            '_uint(None, U64_MAX, "block_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_24": (
            '_uint(b.get("block_hash"), U64_MAX, None),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_3": (
            'engine = [b["BLOCK_HASH"] for b in blocks]',
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__stored_blocks__mutmut_28": (
            '_uint(b.get(None), U64_MAX, "block_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_29": (
            '_uint(b.get("XXblock_hashXX"), U64_MAX, "block_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_30": (
            '_uint(b.get("BLOCK_HASH"), U64_MAX, "block_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_31": (
            '_uint(b.get("block_hash"), U64_MAX, "XXblock_hashXX"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_32": (
            '_uint(b.get("block_hash"), U64_MAX, "BLOCK_HASH"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_33": (
            '_uint(None, U64_MAX, "tokens_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_35": (
            '_uint(b.get("tokens_hash"), U64_MAX, None),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_39": (
            '_uint(b.get(None), U64_MAX, "tokens_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_40": (
            '_uint(b.get("XXtokens_hashXX"), U64_MAX, "tokens_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_41": (
            '_uint(b.get("TOKENS_HASH"), U64_MAX, "tokens_hash"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_42": (
            '_uint(b.get("tokens_hash"), U64_MAX, "XXtokens_hashXX"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_43": (
            '_uint(b.get("tokens_hash"), U64_MAX, "TOKENS_HASH"),',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_44": (
            'for b in (_object(None, "block") for b in blocks)',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_45": (
            "for b in (_object(b, None) for b in blocks)",
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_5": (
            'local = [b["XXtokens_hashXX"] for b in blocks]',
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__stored_blocks__mutmut_48": (
            'for b in (_object(b, "XXblockXX") for b in blocks)',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_49": (
            'for b in (_object(b, "BLOCK") for b in blocks)',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x__stored_blocks__mutmut_6": (
            'local = [b["TOKENS_HASH"] for b in blocks]',
            "performance",
            (
                "a well-formed event then takes the field-by-field path, which reads the same values: the "
                "fast path only declines more"
            ),
        ),
        "x__uint__mutmut_8": (
            "raise MalformedEvent(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_count_unknown_variant__mutmut_1": (
            "variant = None",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x_count_unknown_variant__mutmut_15": (
            '"XXDynamo KV event from worker %s with unknown data %.80r; droppedXX",',
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x_count_unknown_variant__mutmut_16": (
            '"dynamo kv event from worker %s with unknown data %.80r; dropped",',
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x_count_unknown_variant__mutmut_2": (
            "variant = sorted(payload) if (isinstance(payload, dict)) and False else payload",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x_count_unknown_variant__mutmut_7": (
            "None,",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x_count_unknown_variant__mutmut_8": (
            "None,",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x_decode_event__mutmut_11": (
            'counters.loud("dynamo.malformed", "XXDynamo KV event is not JSON (%s); droppedXX", exc)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_decode_event__mutmut_12": (
            'counters.loud("dynamo.malformed", "dynamo kv event is not json (%s); dropped", exc)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_decode_event__mutmut_22": (
            'counters.loud("dynamo.malformed", "malformed Dynamo KV event (%s); dropped", None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_decode_event__mutmut_25": (
            'counters.loud("dynamo.malformed", "malformed Dynamo KV event (%s); dropped", )',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_decode_event__mutmut_28": (
            'counters.loud("dynamo.malformed", "XXmalformed Dynamo KV event (%s); droppedXX", exc)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_decode_event__mutmut_29": (
            'counters.loud("dynamo.malformed", "malformed dynamo kv event (%s); dropped", exc)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_decode_event__mutmut_5": (
            'counters.loud("dynamo.malformed", "Dynamo KV event is not JSON (%s); dropped", None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_decode_event__mutmut_8": (
            'counters.loud("dynamo.malformed", "Dynamo KV event is not JSON (%s); dropped", )',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_11": (
            "_check_uint(event_id, U64_MAX, None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_15": (
            '_check_uint(event_id, U64_MAX, "XXevent_idXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_16": (
            '_check_uint(event_id, U64_MAX, "EVENT_ID")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_23": (
            '_check_uint(dp_rank, U32_MAX, "XXdp_rankXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_28": (
            "_check_uint(event.parent_hash, U64_MAX, None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_3": (
            "_check_uint(worker_id, U64_MAX, None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_32": (
            '_check_uint(event.parent_hash, U64_MAX, "XXparent_hashXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_33": (
            '_check_uint(event.parent_hash, U64_MAX, "PARENT_HASH")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_37": (
            "_check_uint(b.engine_hash, U64_MAX, None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_41": (
            '_check_uint(b.engine_hash, U64_MAX, "XXblock_hashXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_42": (
            '_check_uint(b.engine_hash, U64_MAX, "BLOCK_HASH")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_45": (
            "_check_uint(b.local_hash, U64_MAX, None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_49": (
            '_check_uint(b.local_hash, U64_MAX, "XXtokens_hashXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_50": (
            '_check_uint(b.local_hash, U64_MAX, "TOKENS_HASH")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_69": (
            '_check_uint(h, U64_MAX, "XXblock_hashXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_7": (
            '_check_uint(worker_id, U64_MAX, "XXworker_idXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_8": (
            '_check_uint(worker_id, U64_MAX, "WORKER_ID")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_80": (
            "raise TypeError(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_encode_event__mutmut_81": (
            'raise TypeError(f"not a KV event: {type(None).__name__}")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_17": (
            'stored = _object(payload["stored"], None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_22": (
            'stored = _object(payload["stored"], "XXstoredXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_23": (
            'stored = _object(payload["stored"], "STORED")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_34": (
            "parent_hash = None if parent is None else _uint(parent, U64_MAX, None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_38": (
            'parent_hash = None if parent is None else _uint(parent, U64_MAX, "XXparent_hashXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_39": (
            'parent_hash = None if parent is None else _uint(parent, U64_MAX, "PARENT_HASH")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_43": (
            'blocks = _stored_blocks(_list(stored.get("blocks"), None))',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_49": (
            'blocks = _stored_blocks(_list(stored.get("blocks"), "XXblocksXX"))',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_50": (
            'blocks = _stored_blocks(_list(stored.get("blocks"), "BLOCKS"))',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_68": (
            'removed = _object(payload["removed"], None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_73": (
            'removed = _object(payload["removed"], "XXremovedXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_74": (
            'removed = _object(payload["removed"], "REMOVED")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_77": (
            'hashes = _list(removed.get("block_hashes"), None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_83": (
            'hashes = _list(removed.get("block_hashes"), "XXblock_hashesXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_84": (
            'hashes = _list(removed.get("block_hashes"), "BLOCK_HASHES")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_data__mutmut_88": (
            'hashes = [_uint(None, U64_MAX, "block_hash") for h in hashes]',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x_router_event_data__mutmut_90": (
            "hashes = [_uint(h, U64_MAX, None) for h in hashes]",
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x_router_event_data__mutmut_94": (
            'hashes = [_uint(h, U64_MAX, "XXblock_hashXX") for h in hashes]',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x_router_event_data__mutmut_95": (
            'hashes = [_uint(h, U64_MAX, "BLOCK_HASH") for h in hashes]',
            "message",
            (
                "only invalid events reach the field-by-field path (the fast path takes every well-formed "
                "one), and they are dropped as malformed either way: only the error's text changes"
            ),
        ),
        "x_router_event_header__mutmut_11": (
            'wire_worker = _uint(message.get("worker_id"), U64_MAX, None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_18": (
            'wire_worker = _uint(message.get("worker_id"), U64_MAX, "XXworker_idXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_19": (
            'wire_worker = _uint(message.get("worker_id"), U64_MAX, "WORKER_ID")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_22": (
            'event = _object(message.get("event"), None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_28": (
            'event = _object(message.get("event"), "XXeventXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_29": (
            'event = _object(message.get("event"), "EVENT")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_3": (
            "message = _object(message, None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_33": (
            'event_id = _uint(event.get("event_id"), U64_MAX, None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_40": (
            'event_id = _uint(event.get("event_id"), U64_MAX, "XXevent_idXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_41": (
            'event_id = _uint(event.get("event_id"), U64_MAX, "EVENT_ID")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_45": (
            'dp_rank = _uint(event.get("dp_rank", 0), U32_MAX, None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_56": (
            'dp_rank = _uint(event.get("dp_rank", 0), U32_MAX, "XXdp_rankXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_57": (
            'dp_rank = _uint(event.get("dp_rank", 0), U32_MAX, "DP_RANK")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_6": (
            'message = _object(message, "XXmessageXX")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_router_event_header__mutmut_7": (
            'message = _object(message, "MESSAGE")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
    },
    "events/dynamo_intake.py": {
        "x_follow_gap__mutmut_3": (
            "if got <= expected:",
            "same-value",
            (
                "got == expected never reaches follow_gap: its callers (DynamoEventIntake._apply via on_gap, "
                "durable._apply) call it only when EventIdTracker.check returned an expected id, which is "
                "never the id received"
            ),
        ),
        "xǁDynamoEventIntakeǁ__init____mutmut_10": (
            "self._gap_where = None  # where the event being checked came from, for the default gap reason",
            "same-value",
            "the initial value is never read: _follow_gap reads it only after _apply has set it",
        ),
        "xǁDynamoEventIntakeǁ__init____mutmut_11": (
            'self._gap_where = "XXXX"  # where the event being checked came from, for the default gap reason',
            "same-value",
            "the initial value is never read: _follow_gap reads it only after _apply has set it",
        ),
        "xǁDynamoEventIntakeǁ_apply__mutmut_40": (
            '"XXKV event gap from %s: expected event %d, got %dXX",',
            "message",
            "text of the gap warning (the test reads the text inside)",
        ),
        "xǁDynamoEventIntakeǁ_apply__mutmut_61": (
            'f"{source}.sink_error", "XXapplying KV event %d from %s failedXX", event_id, worker',
            "message",
            "text of the sink_error warning (the test reads the text inside)",
        ),
        "xǁDynamoEventIntakeǁ_heard_from__mutmut_17": (
            'log.info("XX%s: a new publisher (%x, was %x) on %s: it restartedXX", worker, publisher, last, where)',  # noqa: E501
            "message",
            "text of the restart log line (the test reads the text inside)",
        ),
        "xǁDynamoEventIntakeǁ_heard_from__mutmut_33": (
            'self.counters.loud(f"{self.source}.sink_error", "XXresetting %s after its restart failedXX", worker)',  # noqa: E501
            "message",
            "text of the sink_error warning on a restart (the test reads the text inside)",
        ),
    },
    "groups/policy.py": {
        "x_rank__mutmut_13": (
            "highest = max((cost_tokens(p) for p in probes), default=None)",
            "same-value",
            (
                "the default is taken only when there is no probe, and then there is nothing to sort: "
                "the key is never called"
            ),
        ),
        "x_rank__mutmut_17": (
            "highest = max((cost_tokens(p) for p in probes), default=1.0)",
            "same-value",
            (
                "the default is taken only when there is no probe, and then there is nothing to sort: "
                "the key is never called"
            ),
        ),
    },
    "runtime/discovery.py": {
        "x_parse_dns_server__mutmut_7": (
            'host, _, rest = host[1:].rpartition("]")',
            "same-value",
            (
                "with one `]` the split is the same; with more the text is refused either way, with the "
                "same message (a port that is not digits, or a host that is not an IP address)"
            ),
        ),
        "x_parse_dns_server__mutmut_24": (
            'host, _, port_text = host.rpartition(":")',
            "same-value",
            "this branch is taken only when the text has exactly one `:`",
        ),
        "xǁDnsWorkersǁ__init____mutmut_3": (
            'role: str = "BOTH",',
            "same-value",
            "`worker_role` and `worker_device` read their text in lower case",
        ),
        "xǁDnsWorkersǁ__init____mutmut_5": (
            'device: str = "CUDA",',
            "same-value",
            "`worker_role` and `worker_device` read their text in lower case",
        ),
        "xǁDnsWorkersǁ__init____mutmut_26": (
            "self._resolver = dns.asyncresolver.Resolver(configure=None)",
            "same-value",
            "dnspython reads resolv.conf only `if configure`: None is falsy as False is",
        ),
        "xǁDnsWorkersǁlookup__mutmut_11": (
            'answers = await asyncio.gather(self._addresses("A"), self._addresses("aaaa"))',
            "same-value",
            "dnspython reads a record type's name in any case",
        ),
        "xǁDnsShareǁ__init____mutmut_3": (
            "self._failing = None",
            "same-value",
            "None is falsy as False is, and the flag is only tested for truth",
        ),
        "xǁDnsShareǁ__init____mutmut_5": (
            "self._answered = None",
            "same-value",
            "None is falsy as False is, and the flag is only tested for truth",
        ),
        "xǁDnsShareǁrefresh__mutmut_29": (
            "self._failing = None",
            "same-value",
            "None is falsy as False is, and the flag is only tested for truth",
        ),
        "xǁWorkerDiscoveryǁ_every__mutmut_6": (
            "await lazy_sleep(interval_s, interval_s * 4)",
            "performance",
            "how late a periodic step may run to share a wake-up the loop makes anyway",
        ),
        "xǁWorkerDiscoveryǁ_every__mutmut_7": (
            "await lazy_sleep(interval_s, interval_s / 5)",
            "performance",
            "how late a periodic step may run to share a wake-up the loop makes anyway",
        ),
        "xǁWorkerDiscoveryǁ_every__mutmut_15": (
            "return asyncio.create_task(loop(), name=None)",
            "message",
            "the loop task's name, read only when debugging",
        ),
        "xǁWorkerDiscoveryǁ_every__mutmut_17": (
            "return asyncio.create_task(loop(), )",
            "message",
            "the loop task's name, read only when debugging",
        ),
        "x_start_discovery__mutmut_38": (
            'prefill_source = dns_workers(settings.prefill_dns_name, "PREFILL")',
            "same-value",
            "`worker_role` and `worker_device` read their text in lower case",
        ),
        "x_start_discovery__mutmut_46": (
            "config.config_path, environ=os.environ if (environ is None) and False else environ",
            "same-value",
            "`load_config` reads `os.environ` when it is given None",
        ),
    },
    "groups/remote.py": {
        "xǁRemoteGroupǁcommit__mutmut_35": (
            "self._live[decision.request_id] = None",
            "same-value",
            ("`_live`'s values (commit numbers) are never read, only its keys: which requests are held here"),
        ),
        "xǁRemoteGroupǁadd_output_tokens__mutmut_2": (
            (
                "if request_id not in self._live and not self._sends_output_tokens or (count <= 0 and "
                "sequences <= 1):"
            ),
            "performance",
            (
                "a call for a request not held here, or to a group that does not serve output tokens, "
                "goes on to `_send_output_tokens`, which checks both again and sends nothing"
            ),
        ),
        "xǁRemoteGroupǁ_send_output_tokens__mutmut_5": (
            "if pending is None or request_id not in self._live and not self._sends_output_tokens:",
            "same-value",
            (
                "a pending entry exists only for a request held here: `free` removes the request and "
                "its entry together"
            ),
        ),
        "xǁRemoteGroupǁ_send_output_tokens__mutmut_6": (
            "if pending is None and request_id not in self._live or not self._sends_output_tokens:",
            "same-value",
            (
                "a send task finds no pending entry only after `free` removed it, and then the request "
                "is no longer held either"
            ),
        ),
        "xǁRemoteGroupǁ_send_output_tokens__mutmut_41": (
            (
                "await self._stub.AddOutputTokens(message, timeout=self.lifecycle_timeout_s, "
                "wait_for_ready=None)"
            ),
            "same-value",
            "gRPC's default for `wait_for_ready` (None) does not wait for the channel either",
        ),
        "xǁRemoteGroupǁ_send_output_tokens__mutmut_44": (
            "await self._stub.AddOutputTokens(message, timeout=self.lifecycle_timeout_s, )",
            "same-value",
            "gRPC's default for `wait_for_ready` (None) does not wait for the channel either",
        ),
        "xǁRemoteGroupǁ_call__mutmut_3": (
            "return await method(message, timeout=timeout_s, wait_for_ready=None)",
            "same-value",
            "gRPC's default for `wait_for_ready` (None) does not wait for the channel either",
        ),
        "xǁRemoteGroupǁ_call__mutmut_6": (
            "return await method(message, timeout=timeout_s, )",
            "same-value",
            "gRPC's default for `wait_for_ready` (None) does not wait for the channel either",
        ),
        "xǁRemoteGroupǁ_send_output_tokens__mutmut_45": (
            (
                "await self._stub.AddOutputTokens(message, timeout=self.lifecycle_timeout_s, "
                "wait_for_ready=True)"
            ),
            "performance",
            (
                "an output tokens call to a group that cannot be reached waits for a connection until "
                "its deadline instead of failing at once: given up and counted as failed either way, "
                "later"
            ),
        ),
        "xǁRemoteGroupǁfree__mutmut_4": (
            "self._output_pending.pop(None, None)",
            "same-value",
            (
                "a pending entry left behind is popped by its send task, which finds the request no "
                "longer held and sends nothing"
            ),
        ),
        "xǁRemoteGroupǁfree__mutmut_9": (
            "status = self._status.pop(request_id, None)",
            "same-value",
            "protobuf takes a field given as None as unset: status 0",
        ),
        "xǁRemoteGroupǁ_retried__mutmut_8": (
            "for attempt in range(1, self.retries + 2):",
            "same-value",
            "the loop returns at `attempt == self.retries`, so the extra iteration never runs",
        ),
        "xǁRemoteGroupǁ_ensure_renewer__mutmut_5": (
            "self._renew_loop(), name=None",
            "message",
            "the renewer task's name, read only when debugging",
        ),
        "xǁRemoteGroupǁ_ensure_renewer__mutmut_7": (
            "self._renew_loop(), )",
            "message",
            "the renewer task's name, read only when debugging",
        ),
        "xǁRemoteGroupǁ_encode__mutmut_3": (
            "if self._encoded is None or self._encoded[1] is not request:",
            "performance",
            "the cache never hits: each probe and commit encodes its request again, to the same message",
        ),
        "xǁRemoteGroupǁdrain__mutmut_1": (
            "await asyncio.gather(*list(self._tasks), return_exceptions=None)",
            "same-value",
            (
                "lifecycle tasks end without raising (`_retried` and `_send_output_tokens` catch their "
                "calls' failures), so there is no exception for `gather` to return or raise"
            ),
        ),
        "xǁRemoteGroupǁdrain__mutmut_3": (
            "await asyncio.gather(*list(self._tasks), )",
            "same-value",
            (
                "lifecycle tasks end without raising (`_retried` and `_send_output_tokens` catch their "
                "calls' failures), so there is no exception for `gather` to return or raise"
            ),
        ),
        "xǁRemoteGroupǁdrain__mutmut_5": (
            "await asyncio.gather(*list(self._tasks), return_exceptions=False)",
            "same-value",
            (
                "lifecycle tasks end without raising (`_retried` and `_send_output_tokens` catch their "
                "calls' failures), so there is no exception for `gather` to return or raise"
            ),
        ),
    },
    "groups/selector.py": {
        "xǁGroupSelectorǁhas_capacity__mutmut_1": (
            "single = None",
            "same-value",
            (
                "the one group `single` names runs in this process (a local group): its `has_capacity` "
                "answers at once and raises nothing, so asking it through `_capacity` (its ejection, "
                "never set for a group never probed, and the deadline) gives the same answer"
            ),
        ),
        "xǁGroupSelectorǁ_probe_groups__mutmut_20": (
            "if pending and not _answered_any(done) and self.probe_grace_s >= 0:",
            "performance",
            (
                "with no grace, `_first_answer` gets a deadline already passed and returns at once with "
                "nothing: the same probes and failures, `waited_s` plus 0"
            ),
        ),
        "xǁGroupSelectorǁ_failed__mutmut_3": (
            "reason = exc.reason if (isinstance(exc, GroupError)) or True else ERROR",
            "same-value",
            (
                "every failure `_failed` is given is a `GroupError`: `_probe` returns "
                "`_as_group_error`'s, and the deadline's is a `GroupTimeout`"
            ),
        ),
        "x__first_answer__mutmut_10": (
            "if remaining < 0:",
            "performance",
            (
                "a remaining time of exactly 0 waits once more with a zero timeout, which returns at "
                "once with what has finished (then the loop ends as before)"
            ),
        ),
    },
    "request/piecewise.py": {
        "xǁPieceSplitterǁ__init____mutmut_18": (
            'alternatives = "|".join(re.escape(c) for c in sorted(tokens, key=None, reverse=True))',
            "same-value",
            (
                "sorted without a key (`key=None`) is sorted in reverse text order: two added tokens "
                "can both match at one position only when one begins the other, and reverse text order "
                "puts the longer first as the length key does, so leftmost-longest holds"
            ),
        ),
        "xǁPieceSplitterǁ__init____mutmut_21": (
            'alternatives = "|".join(re.escape(c) for c in sorted(tokens, reverse=True))',
            "same-value",
            (
                "sorted in reverse text order: two added tokens can both match at one position only "
                "when one begins the other, and reverse text order puts the longer first as the length "
                "key does"
            ),
        ),
        "xǁPieceSplitterǁ__init____mutmut_35": (
            "self._max_chars = max(map(len, tokens), default=None)",
            "same-value",
            (
                "the default is taken only without added tokens, and then `closed_at` returns before "
                "reading `_max_chars` (nothing is cuttable)"
            ),
        ),
        "xǁPieceSplitterǁ__init____mutmut_42": (
            "self._max_chars = max(map(len, tokens), default=1)",
            "same-value",
            (
                "the default is taken only without added tokens, and then `closed_at` returns before "
                "reading `_max_chars` (nothing is cuttable)"
            ),
        ),
        "xǁPieceSplitterǁclosed_at__mutmut_10": (
            "for at in range(cut):",
            "performance",
            (
                "a match starting before `cut - _max_chars + 1` ends at or before `cut` (no added token "
                "is longer than `_max_chars`): scanning from 0 only looks at more positions"
            ),
        ),
        "xǁPieceSplitterǁclosed_at__mutmut_17": (
            "for at in range(max(0, cut - self._max_chars - 1), cut):",
            "performance",
            (
                "two more positions scanned, where a match cannot cross `cut` (no added token is longer "
                "than `_max_chars`)"
            ),
        ),
        "xǁPieceSplitterǁ_split_stripping__mutmut_5": (
            "for match in self._pattern.finditer(text) if (self._pattern) or True else ():",
            "same-value",
            (
                "`_split_stripping` is only called by `split` after it returned for a splitter without "
                "a pattern"
            ),
        ),
        "xǁPieceSplitterǁ_split_stripping__mutmut_14": (
            "while start >= start_offset and text[start - 1] in WHITE_SPACE:",
            "same-value",
            (
                "the loop can take `start` one below `start_offset` and no further; a `start` at or "
                "below `start_offset` appends no piece, which is all `start` is read for"
            ),
        ),
        "x_special_wrapping__mutmut_18": (
            "full = backend.encode(probe, ).ids",
            "same-value",
            "`tokenizers`' `encode` adds special tokens by default (`add_special_tokens=True`)",
        ),
        "x_special_wrapping__mutmut_26": (
            (
                "at = next((k for k in range(len(full) + len(bare) + 1) if full[k : k + len(bare)] == "
                "bare), None)"
            ),
            "performance",
            (
                "positions past `len(full) - len(bare)` give slices shorter than `bare`, never equal to "
                "it (and an empty `bare` matches at 0 first): the search only looks further"
            ),
        ),
        "x_special_wrapping__mutmut_27": (
            (
                "at = next((k for k in range(len(full) - len(bare) + 2) if full[k : k + len(bare)] == "
                "bare), None)"
            ),
            "performance",
            (
                "one more position, past `len(full) - len(bare)`, whose slice is shorter than `bare` "
                "and never equal to it (an empty `bare` matches at 0 first)"
            ),
        ),
        "x_special_wrapping__mutmut_41": (
            'if backend.encode("", ).ids != [*prefix, *suffix]:',
            "same-value",
            "`tokenizers`' `encode` adds special tokens by default (`add_special_tokens=True`)",
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_29": (
            "parts = splitter.split(text[start:] if (start) or True else text)",
            "same-value",
            "`text[0:]` is `text`",
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_41": (
            "for key, piece, ids in zip(keys, pieces, found, strict=None):",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_45": (
            "for key, piece, ids in zip(keys, pieces, found, ):",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_46": (
            "for key, piece, ids in zip(keys, pieces, found, strict=False):",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_52": (
            "fresh: dict[Hashable, array[int]] = None",
            "same-value",
            "`fresh` is read only for a piece the cache missed, and then it is made a dict",
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_61": (
            "stored = self.cache.put_many(list(zip(missing, encoded, strict=None)))",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_64": (
            "stored = self.cache.put_many(list(zip(missing, encoded, )))",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_65": (
            "stored = self.cache.put_many(list(zip(missing, encoded, strict=False)))",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_70": (
            "fresh = dict(zip(missing, stored, strict=None))",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_73": (
            "fresh = dict(zip(missing, stored, ))",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_74": (
            "fresh = dict(zip(missing, stored, strict=False))",
            "same-value",
            (
                "the zipped lists are equal in length by construction (pieces and their keys and cache "
                "answers; the missed pieces, their ids encoded and the cache's copies): `strict` never "
                "finds a difference"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_80": (
            "chars, cut_chars, cut_ids = start, 0, 1  # where the text's last added token ends",
            "same-value",
            (
                "`cut_ids` is read only when `cut_chars > start`, which only an added token's part "
                "makes true, and that part sets `cut_ids`"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_88": (
            "chars += lengths.get(part, None)",
            "same-value",
            (
                "every id `split` returns is an added token's, and `lengths` has every added token's "
                "id: the default is never taken"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_90": (
            "chars += lengths.get(part, )",
            "same-value",
            (
                "every id `split` returns is an added token's, and `lengths` has every added token's "
                "id: the default is never taken"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_91": (
            "chars += lengths.get(part, 1)",
            "same-value",
            (
                "every id `split` returns is an added token's, and `lengths` has every added token's "
                "id: the default is never taken"
            ),
        ),
        "xǁPiecewiseEncoderǁencode_array__mutmut_107": (
            "if prefixes is not None and cut_chars >= start and splitter.closed_at(text, cut_chars):",
            "same-value",
            (
                "`cut_chars` equals `start` only when both are 0 (no added token, no stored prefix "
                "taken): then the prefix stored is the empty text, which `store` ignores under "
                "`min_chars`, and which, kept with `min_chars` 0, has no ids and is found by `longest` "
                "for the empty text alone"
            ),
        ),
        "xǁPiecewiseEncoderǁ_encode_pieces__mutmut_2": (
            "if len(pieces) < SERIAL_PIECES:",
            "performance",
            "four missed pieces encoded in one batch instead of one by one: the same ids, other threads",
        ),
        "x_probe_mismatch__mutmut_2": (
            ("tokens = [t.content for t in backend.get_added_tokens_decoder().values() if t.content][:65]"),
            "performance",
            (
                "a 65th added token in the load-time probe texts: one bound on the probe's work for "
                "another (the probes catch what `inexact_reason` missed, which for any tokenizer it "
                "lets through is nothing)"
            ),
        ),
        "x_probe_mismatch__mutmut_15": (
            "for i in range(min(len(tokens), 17))",
            "performance",
            (
                "a 17th built probe text at load: one bound on the probe's work for another (the probes "
                "catch what `inexact_reason` missed, which for any tokenizer it lets through is "
                "nothing)"
            ),
        ),
    },
    "admin/api.py": {
        "xǁ_BadRequestǁ__init____mutmut_1": (
            "super().__init__(None)",
            "same-value",
            "the answer reads `exc.message`, never `str(exc)`",
        ),
        "x_make_admin_app__mutmut_34": (
            (
                'if token is not None and not _bearer_matches(request.headers.get("authorization", '
                '""), token):'
            ),
            "same-value",
            (
                "aiohttp's request headers are a case-insensitive multidict, so any spelling of the "
                "name reads the same header"
            ),
        ),
        "x_make_admin_app__mutmut_35": (
            (
                'if token is not None and not _bearer_matches(request.headers.get("AUTHORIZATION", '
                '""), token):'
            ),
            "same-value",
            (
                "aiohttp's request headers are a case-insensitive multidict, so any spelling of the "
                "name reads the same header"
            ),
        ),
        "x_make_admin_app__mutmut_36": (
            (
                'if token is not None and not _bearer_matches(request.headers.get("Authorization", '
                '"XXXX"), token):'
            ),
            "same-value",
            "without the header, `_bearer_matches` refuses 'XXXX' as it refuses '' (no Bearer scheme)",
        ),
        "x_make_admin_app__mutmut_64": (
            (
                'return web.Response(body=generate_latest(registry), headers={"content-type": '
                "CONTENT_TYPE_LATEST})"
            ),
            "same-value",
            "aiohttp's response headers are case-insensitive (RFC 9110 field names)",
        ),
        "x_make_admin_app__mutmut_65": (
            (
                'return web.Response(body=generate_latest(registry), headers={"CONTENT-TYPE": '
                "CONTENT_TYPE_LATEST})"
            ),
            "same-value",
            "aiohttp's response headers are case-insensitive (RFC 9110 field names)",
        ),
        "x_make_admin_app__mutmut_151": (
            "raise _BadRequest(None, str(exc)) from None",
            "same-value",
            (
                "unreachable: the API checks every value exactly as RouterConfig does (fractions in [0, "
                "1], counts >= 0) before `set_thresholds`, and the names were checked against "
                "THRESHOLD_FIELDS, so no InvalidConfig comes back; kept so that a stricter RouterConfig "
                "answers 400, not 500"
            ),
        ),
        "x_make_admin_app__mutmut_152": (
            "raise _BadRequest(400, None) from None",
            "same-value",
            (
                "unreachable: the API checks every value exactly as RouterConfig does (fractions in [0, "
                "1], counts >= 0) before `set_thresholds`, and the names were checked against "
                "THRESHOLD_FIELDS, so no InvalidConfig comes back; kept so that a stricter RouterConfig "
                "answers 400, not 500"
            ),
        ),
        "x_make_admin_app__mutmut_153": (
            "raise _BadRequest(str(exc)) from None",
            "same-value",
            (
                "unreachable: the API checks every value exactly as RouterConfig does (fractions in [0, "
                "1], counts >= 0) before `set_thresholds`, and the names were checked against "
                "THRESHOLD_FIELDS, so no InvalidConfig comes back; kept so that a stricter RouterConfig "
                "answers 400, not 500"
            ),
        ),
        "x_make_admin_app__mutmut_154": (
            "raise _BadRequest(400, ) from None",
            "same-value",
            (
                "unreachable: the API checks every value exactly as RouterConfig does (fractions in [0, "
                "1], counts >= 0) before `set_thresholds`, and the names were checked against "
                "THRESHOLD_FIELDS, so no InvalidConfig comes back; kept so that a stricter RouterConfig "
                "answers 400, not 500"
            ),
        ),
        "x_make_admin_app__mutmut_155": (
            "raise _BadRequest(401, str(exc)) from None",
            "same-value",
            (
                "unreachable: the API checks every value exactly as RouterConfig does (fractions in [0, "
                "1], counts >= 0) before `set_thresholds`, and the names were checked against "
                "THRESHOLD_FIELDS, so no InvalidConfig comes back; kept so that a stricter RouterConfig "
                "answers 400, not 500"
            ),
        ),
        "x_make_admin_app__mutmut_156": (
            "raise _BadRequest(400, str(None)) from None",
            "same-value",
            (
                "unreachable: the API checks every value exactly as RouterConfig does (fractions in [0, "
                "1], counts >= 0) before `set_thresholds`, and the names were checked against "
                "THRESHOLD_FIELDS, so no InvalidConfig comes back; kept so that a stricter RouterConfig "
                "answers 400, not 500"
            ),
        ),
        "x_make_admin_app__mutmut_184": (
            '"role": roles.get(str(worker.worker_id), None),',
            "same-value",
            (
                "every routed worker has its config in `pool.all_workers()` (discovered workers get one "
                "too), so the default role is never taken"
            ),
        ),
        "x_make_admin_app__mutmut_186": (
            '"role": roles.get(str(worker.worker_id), ),',
            "same-value",
            (
                "every routed worker has its config in `pool.all_workers()` (discovered workers get one "
                "too), so the default role is never taken"
            ),
        ),
        "x_make_admin_app__mutmut_188": (
            '"role": roles.get(str(worker.worker_id), "XXbothXX"),',
            "same-value",
            (
                "every routed worker has its config in `pool.all_workers()` (discovered workers get one "
                "too), so the default role is never taken"
            ),
        ),
        "x_make_admin_app__mutmut_189": (
            '"role": roles.get(str(worker.worker_id), "BOTH"),',
            "same-value",
            (
                "every routed worker has its config in `pool.all_workers()` (discovered workers get one "
                "too), so the default role is never taken"
            ),
        ),
        "x_make_admin_app__mutmut_297": (
            'return web.Response(text=body, content_type="APPLICATION/JSON")',
            "same-value",
            "media types are case-insensitive (RFC 9110 8.3.1): aiohttp's client reads it lowercased",
        ),
        "x_start_admin__mutmut_15": (
            "runner = web.AppRunner(app, )",
            "message",
            "aiohttp then writes an access log line per admin call; nothing else changes",
        ),
        "x_start_admin__mutmut_25": (
            "bound = runner.addresses[0][1] if (runner.addresses) or True else port",
            "same-value",
            "a started site always has an address, so the fallback to the port asked for is never taken",
        ),
        "x__engine_load__mutmut_29": (
            '"age_s": round(age, 3) if (age is not None) or True else None,',
            "same-value",
            "the age is None only without a report, and then the whole record is None before it is read",
        ),
        "x__engine_load__mutmut_48": (
            (
                '"url": state.url if (state) and False else (scraper.url_of(config) if config is not '
                "None else None),"
            ),
            "same-value",
            "a scrape state is keyed by its URL, `scraper.url_of(config)`: both give the same string",
        ),
        "x__engine_load__mutmut_51": (
            (
                '"url": state.url if state else (scraper.url_of(config) if (config is not None) or '
                "True else None),"
            ),
            "same-value",
            (
                "every routed worker has its config in `pool.all_workers()` (discovered workers get one "
                "too), so the None config is never taken"
            ),
        ),
    },
    "runtime/tls.py": {
        "x_self_signed_pair__mutmut_15": (
            'address = ipaddress.ip_address(host.strip("XX[]XX"))',
            "same-value",
            "an IP address never holds an X, so stripping X's as well changes no address",
        ),
        "x__warn_unless_valid_now__mutmut_4": (
            "if expires <= now:",
            "margin",
            "a certificate that expires at this very microsecond",
        ),
        "x__warn_unless_valid_now__mutmut_13": (
            "elif starts >= now:",
            "margin",
            "a certificate that starts at this very microsecond",
        ),
        "x_server_pair__mutmut_2": (
            "if tls.cert_file is not None or tls.key_file is not None:",
            "same-value",
            (
                "every configuration refuses a certificate without its key or a key without its "
                "certificate (`check_pair` for --tls-*, --group-tls-* and --nats-tls-*), so one set "
                "alone never reaches here"
            ),
        ),
        "x_server_ssl_context__mutmut_10": (
            'cert_fd, key_fd = os.memfd_create("XXextproc-certXX"), os.memfd_create("extproc-key")',
            "same-value",
            (
                "a memory file's name shows only in /proc/self/fd's link text, and the files are closed "
                "as soon as OpenSSL has read them"
            ),
        ),
        "x_server_ssl_context__mutmut_11": (
            'cert_fd, key_fd = os.memfd_create("EXTPROC-CERT"), os.memfd_create("extproc-key")',
            "same-value",
            (
                "a memory file's name shows only in /proc/self/fd's link text, and the files are closed "
                "as soon as OpenSSL has read them"
            ),
        ),
        "x_server_ssl_context__mutmut_14": (
            'cert_fd, key_fd = os.memfd_create("extproc-cert"), os.memfd_create("EXTPROC-KEY")',
            "same-value",
            (
                "a memory file's name shows only in /proc/self/fd's link text, and the files are closed "
                "as soon as OpenSSL has read them"
            ),
        ),
        "x_channel_credentials__mutmut_9": (
            "pair = load_pair(tls.cert_file, tls.key_file) if tls.cert_file or tls.key_file else None",
            "same-value",
            (
                "every configuration refuses a certificate without its key or a key without its "
                "certificate (`check_pair` for --tls-*, --group-tls-* and --nats-tls-*), so one set "
                "alone never reaches here"
            ),
        ),
        "x__read__mutmut_11": (
            'raise TlsError(f"cannot read {path}: {os.strerror(exc.errno or 1) or exc}") from None',
            "same-value",
            "an OSError from open() always carries its errno",
        ),
    },
    "events/nats_security.py": {
        "x_connect_nats__mutmut_3": (
            'url = events.nats_url or "XXXX"',
            "same-value",
            (
                "the picker connects to NATS only when a URL is set (`EventsConfig.nats_needed`), so "
                "the fallback for no URL is never taken"
            ),
        ),
        "x_nats_connect_options__mutmut_12": (
            'events.nats_url or "XXXX",',
            "same-value",
            (
                "the picker connects to NATS only when a URL is set (`EventsConfig.nats_needed`), so "
                "the fallback for no URL is never taken"
            ),
        ),
        "x__client_certificate_refused__mutmut_11": (
            'tls = events.nats_tls.enabled or (events.nats_url or "XXXX").startswith("tls://")',
            "same-value",
            "with no URL neither '' nor 'XXXX' starts with tls://",
        ),
        "x__first_attempt__mutmut_11": (
            "",
            "same-value",
            "nats-py's own default connect_timeout is 2 s, FIRST_ATTEMPT_TIMEOUT_S",
        ),
        "x__first_attempt__mutmut_13": (
            "",
            "performance",
            (
                "nats-py's default of 60 attempts, all at once against an unreachable server: the same "
                "warning after more refused connects"
            ),
        ),
        "x__first_attempt__mutmut_14": (
            "",
            "margin",
            (
                "nats-py's default 2 s pause between the attempts delays the warning by 2 s; nothing "
                "else changes"
            ),
        ),
        "x__first_attempt__mutmut_6": (
            "allow_reconnect=None,",
            "same-value",
            "nats-py reads allow_reconnect as a truth value: None is False",
        ),
        "x__first_attempt__mutmut_18": (
            "max_reconnect_attempts=2,",
            "performance",
            "a third attempt at once; an unreachable server refuses it as it refused the two before",
        ),
        "x__first_attempt__mutmut_19": (
            "reconnect_time_wait=1,",
            "margin",
            (
                "a one-second pause between the two attempts delays the warning by a second; nothing "
                "else changes"
            ),
        ),
        "x__first_attempt__mutmut_20": (
            "if isinstance(exc, nats.errors.NoServersError) or failures:",
            "same-value",
            (
                "nats-py hands every error it raises from connect to the error callback first, so the "
                "last failure seen is the error raised whenever it is not NoServersError"
            ),
        ),
        "x__first_attempt__mutmut_22": (
            "exc = failures[+1]  # why the server could not be reached: refused, no such host, ...",
            "same-value",
            "an unreachable server fails exactly the two attempts, so failures[1] is failures[-1]",
        ),
        "x__first_attempt__mutmut_23": (
            "exc = failures[-2]  # why the server could not be reached: refused, no such host, ...",
            "same-value",
            (
                "both attempts fail the same way within milliseconds (the same refusal, the same "
                "address): the first failure says what the last says"
            ),
        ),
    },
    "events/feed.py": {
        "xǁRouterFeedǁ_orphaned__mutmut_25": (
            "parent = event.parent_hash if (isinstance(event, BlocksStored)) or True else None",
            "same-value",
            "only a store is ever dropped as an orphan: the radix tree's and the tiers' `apply_event` "
            "return False for nothing else",
        ),
        "xǁRouterFeedǁ_orphaned__mutmut_36": (
            "self._refresh(worker, None)",
            "same-value",
            'None is falsy like ""; `_refresh` only tests it before using it',
        ),
        "xǁRouterFeedǁreset_worker__mutmut_19": (
            'self._found(worker, f"reset ({reason})", promote=None)  # nothing left that could be wrong',
            "same-value",
            "None is falsy like False; only `promote or loss is not None` reads it",
        ),
    },
    "events/durable.py": {
        "xǁDurableKvEventsǁ__init____mutmut_17": (
            "self._seq_known = None  # whether applied_seq + 1 is the next sequence to expect",
            "same-value",
            "None is falsy like False; only read as a truth value",
        ),
        "xǁDurableKvEventsǁ__init____mutmut_20": (
            'self._objects: ObjectStore | None = ""',
            "same-value",
            "`_prepare` runs before any use and sets both stores; it skips only when both are set, and "
            '"" with the other None is not',
        ),
        "xǁDurableKvEventsǁ__init____mutmut_21": (
            'self._locks: KeyValue | None = ""',
            "same-value",
            "`_prepare` runs before any use and sets both stores; it skips only when both are set, and "
            '"" with the other None is not',
        ),
        "xǁDurableKvEventsǁ__init____mutmut_22": (
            'self._psub: Any = ""',
            "same-value",
            'before the first subscription only `stop` and `_subscribe` read it, and unsubscribing "" '
            "raises AttributeError inside the same suppress(Exception) that a failed unsubscribe meets",
        ),
        "xǁDurableKvEventsǁ__init____mutmut_25": (
            "self._last_check = (1.0, 0)  # (monotonic time, applied_seq) of the last snapshot check",
            "same-value",
            "time.monotonic() counts from boot on Linux: 0.0 or 1.0, the first check's 2 s window has "
            "long passed either way",
        ),
        "xǁDurableKvEventsǁ__init____mutmut_26": (
            "self._last_check = (0.0, 1)  # (monotonic time, applied_seq) of the last snapshot check",
            "performance",
            "only the first check's baseline moves by one message: a stream of one message is asked "
            "about one batch later",
        ),
        "xǁDurableKvEventsǁ__init____mutmut_28": (
            "self._last_purge_check = 1.0",
            "same-value",
            "time.monotonic() counts from boot on Linux: the first idle check's 2 s window from 0.0 or "
            "1.0 has long passed",
        ),
        "xǁDurableKvEventsǁstart__mutmut_13": (
            "await self._subscribe(self.applied_seq + 1 if (self._seq_known) or True else None)",
            "same-value",
            "with no sequence known applied_seq is 0 (the two are set together): a consumer from "
            "sequence 1 delivers what DeliverPolicy.ALL does, the first message still in the stream",
        ),
        "xǁDurableKvEventsǁ_run__mutmut_8": (
            "await self._subscribe(self.applied_seq + 1 if (self._seq_known) or True else None)",
            "same-value",
            "with no sequence known applied_seq is 0 (the two are set together): a consumer from "
            "sequence 1 delivers what DeliverPolicy.ALL does, the first message still in the stream",
        ),
        "xǁDurableKvEventsǁ_resubscribe_if_gone__mutmut_10": (
            "await self._subscribe(self.applied_seq + 1 if (self._seq_known) or True else None)",
            "same-value",
            "with no sequence known applied_seq is 0 (the two are set together): a consumer from "
            "sequence 1 delivers what DeliverPolicy.ALL does, the first message still in the stream",
        ),
        "xǁDurableKvEventsǁsnapshot_now__mutmut_1": (
            "assert self._locks is not None or self._objects is not None",
            "same-value",
            "`_prepare` sets both stores together, before any snapshot",
        ),
        "xǁDurableKvEventsǁ_prepare__mutmut_1": (
            "if self._objects is not None or self._locks is not None:",
            "same-value",
            "the two stores are set together: both or neither",
        ),
        "xǁDurableKvEventsǁ_prepare__mutmut_2": (
            "if self._objects is None and self._locks is not None:",
            "performance",
            "never true, so the stream and buckets are made again at each call: JetStream returns those"
            " that exist with this config unchanged",
        ),
        "xǁDurableKvEventsǁ_prepare__mutmut_3": (
            "if self._objects is not None and self._locks is None:",
            "performance",
            "never true, so the stream and buckets are made again at each call: JetStream returns those"
            " that exist with this config unchanged",
        ),
        "xǁDurableKvEventsǁ_prepare__mutmut_9": (
            "retention=None,",
            "same-value",
            "nats-server's default retention is limits",
        ),
        "xǁDurableKvEventsǁ_prepare__mutmut_10": (
            "storage=None,",
            "same-value",
            "nats-server's default storage is file",
        ),
        "xǁDurableKvEventsǁ_prepare__mutmut_15": (
            "",
            "same-value",
            "nats-server's default retention is limits (the line removed)",
        ),
        "xǁDurableKvEventsǁ_prepare__mutmut_16": (
            "",
            "same-value",
            "nats-server's default storage is file (the line removed)",
        ),
        "xǁDurableKvEventsǁ_subscribe__mutmut_3": (
            "with contextlib.suppress(None):",
            "message",
            "the unsubscribe raises only on a closed connection, where deleting the consumer right "
            "after raises too: only the error `_run` logs before retrying changes",
        ),
        "xǁDurableKvEventsǁ_subscribe__mutmut_4": (
            'self._psub = ""',
            "message",
            'read again only if this subscribe fails before its end, and then fetching from "" or None '
            "raises AttributeError alike, logged and retried by `_run`",
        ),
        "xǁDurableKvEventsǁ_run__mutmut_3": (
            "restart = None",
            "same-value",
            "None is falsy like False; only read as a truth value",
        ),
        "xǁDurableKvEventsǁ_run__mutmut_14": (
            "restart = None",
            "same-value",
            "None is falsy like False; only read as a truth value",
        ),
        "xǁDurableKvEventsǁ_run__mutmut_32": (
            "restart = None",
            "same-value",
            "None is falsy like False; only read as a truth value",
        ),
        "xǁDurableKvEventsǁ_reload_if_purged__mutmut_11": (
            "if state.last_seq < self.applied_seq or first <= self.applied_seq + 1:",
            "same-value",
            "a stream's first_seq is at most last_seq + 1: when last_seq equals applied_seq the second "
            "test returns alike",
        ),
    },
    "events/dynamo_recovery.py": {
        "x__answer__mutmut_21": (
            "prologue = None",
            "same-value",
            "None is falsy like False; only `not prologue` reads it",
        ),
        "x__decode__mutmut_8": (
            'return json.loads(data) if codec == "json" else msgpack.unpackb(data, raw=None, '
            "strict_map_key=False)",
            "same-value",
            "msgpack 1.x decodes str as str by default (raw=False; None is falsy alike)",
        ),
        "x__decode__mutmut_11": (
            'return json.loads(data) if codec == "json" else msgpack.unpackb(data, strict_map_key=False)',
            "same-value",
            "msgpack 1.x decodes str as str by default (raw=False; None is falsy alike)",
        ),
        "x__decode__mutmut_9": (
            'return json.loads(data) if codec == "json" else msgpack.unpackb(data, raw=False, '
            "strict_map_key=None)",
            "same-value",
            "every map in a WorkerKvQueryResponse (rmp-serde, struct fields by name) is keyed by "
            "strings, which strict_map_key accepts too",
        ),
        "x__decode__mutmut_12": (
            'return json.loads(data) if codec == "json" else msgpack.unpackb(data, raw=False, )',
            "same-value",
            "every map in a WorkerKvQueryResponse (rmp-serde, struct fields by name) is keyed by "
            "strings, which strict_map_key accepts too",
        ),
        "x__decode__mutmut_14": (
            'return json.loads(data) if codec == "json" else msgpack.unpackb(data, raw=False, '
            "strict_map_key=True)",
            "same-value",
            "every map in a WorkerKvQueryResponse (rmp-serde, struct fields by name) is keyed by "
            "strings, which strict_map_key accepts too",
        ),
        "x__query__mutmut_113": (
            'struct.pack(">H", len(path)) + path + struct.pack(">h", len(headers)) + headers',
            "same-value",
            "the headers are one request id in JSON (about 60 bytes): signed and unsigned u16 pack "
            "alike below 32 KiB",
        ),
        "x__query__mutmut_119": (
            '+ struct.pack(">i", len(payload)) + payload',
            "same-value",
            "a query's payload is a few hundred bytes: signed and unsigned u32 pack alike below 2 GiB",
        ),
        "x__query__mutmut_126": (
            '(ack_len,) = struct.unpack(">i", await reader.readexactly(4))',
            "same-value",
            "an acknowledgement is empty or a short refusal: signed and unsigned u32 read alike below 2 GiB",
        ),
        "x__query__mutmut_148": (
            "ended.append(None)",
            "same-value",
            "only whether the list is empty is read",
        ),
        "x__query__mutmut_149": (
            "ended.append(False)",
            "same-value",
            "only whether the list is empty is read",
        ),
        "x__query__mutmut_24": (
            "server = await asyncio.start_server(on_stream, own_host, None)",
            "same-value",
            "port None, like 0, binds a free port",
        ),
        "x__query__mutmut_27": (
            "server = await asyncio.start_server(on_stream, own_host, )",
            "same-value",
            "no port, like 0, binds a free port",
        ),
        "x__two_part__mutmut_12": (
            'return struct.pack(">qqq", len(header), len(body), 0) + header + body',
            "same-value",
            "lengths under 2^63 and the checksum 0 pack alike signed and unsigned",
        ),
        "x__two_part__mutmut_13": (
            'return struct.pack(">QQQ", len(header), len(body), 1) + header + body',
            "wire",
            "Dynamo 1.6.1's worker does not check the request's checksum field: its live tests "
            "(test_dynamo_recovery.py) pass with 1",
        ),
        "x_read_file_sources__mutmut_32": (
            "if key not in found or found[key].mtime < target.mtime:",
            "same-value",
            "between two sources of one worker written in the same clock tick, either wins: the "
            "directory's listing order is arbitrary under both",
        ),
        "x_start_recovery__mutmut_28": (
            "worker, functools.partial(recovery.resync, worker) if (owned) or True else None",
            "same-value",
            "a released worker's resync finds no rank and does nothing, as no resync does",
        ),
        "xǁLocalIndexerRecoveryǁ__init____mutmut_26": (
            "self._listing = None",
            "same-value",
            "None is falsy like False; only `not self._listing` reads it",
        ),
        "xǁLocalIndexerRecoveryǁ_adopt__mutmut_3": (
            "self._listing = None",
            "same-value",
            "None is falsy like False; only `not self._listing` reads it",
        ),
        "xǁLocalIndexerRecoveryǁ_adopt_all__mutmut_7": (
            "self._released.pop(None, None)",
            "same-value",
            "the release time is read only for workers not owned; the worker is owned from here, and a "
            "later release writes it anew",
        ),
        "xǁLocalIndexerRecoveryǁ_query_until_current__mutmut_75": (
            "after = -2 if rank.cursor is None else rank.cursor",
            "same-value",
            "event ids are u64: none lies between -2 and -1",
        ),
        "xǁLocalIndexerRecoveryǁ_query_until_current__mutmut_93": (
            "rank.inflight = None",
            "same-value",
            "None is falsy like False; only its truth is read",
        ),
        "xǁLocalIndexerRecoveryǁ_release__mutmut_3": (
            "self._ranks.pop(worker, )",
            "same-value",
            "a worker is released only from its own recovery, while it is owned: the key is there",
        ),
    },
    "events/dynamo_zmq_plane.py": {
        "x_unframe__mutmut_11": (
            'raise ValueError("XXpublisher id and sequence must be 8 bytes eachXX")',
            "message",
            "text of the malformed-frame error only",
        ),
        "x_unframe__mutmut_26": (
            "int.from_bytes(publisher, ),",
            "same-value",
            "int.from_bytes reads big-endian by default since Python 3.11 (the project needs 3.11+)",
        ),
        "x_unframe__mutmut_32": (
            "int.from_bytes(sequence, ),",
            "same-value",
            "int.from_bytes reads big-endian by default since Python 3.11 (the project needs 3.11+)",
        ),
        "xǁDynamoZmqPlaneSubscriberǁ__init____mutmut_5": (
            'raise ValueError("XXDynamoZmqPlaneSubscriber needs a channel listing, brokers or bothXX")',
            "message",
            "text of the constructor's ValueError only; the raise itself is tested",
        ),
        "xǁDynamoZmqPlaneSubscriberǁ__init____mutmut_6": (
            'raise ValueError("dynamozmqplanesubscriber needs a channel listing, brokers or both")',
            "message",
            "case of the constructor's ValueError text",
        ),
        "xǁDynamoZmqPlaneSubscriberǁstart__mutmut_8": (
            "sock.setsockopt(zmq.LINGER, 1)",
            "same-value",
            "the socket is only ever closed by stop, with close(linger=0), which overrides this option",
        ),
        "xǁDynamoZmqPlaneSubscriberǁstart__mutmut_24": (
            'sock.setsockopt(zmq.SUBSCRIBE, self.subject.split("*", )[0].encode())',
            "same-value",
            "the first piece of a split is the same whatever the number of splits",
        ),
        "xǁDynamoZmqPlaneSubscriberǁstart__mutmut_27": (
            'sock.setsockopt(zmq.SUBSCRIBE, self.subject.split("*", 2)[0].encode())',
            "same-value",
            "the first piece of a split is the same whatever the number of splits",
        ),
        "xǁDynamoZmqPlaneSubscriberǁstop__mutmut_3": (
            "self._sock.close(linger=None)",
            "same-value",
            "linger=None keeps the socket's own LINGER, which start set to 0",
        ),
        "xǁDynamoZmqPlaneSubscriberǁstop__mutmut_4": (
            "self._sock.close(linger=1)",
            "performance",
            "a SUB socket waits up to 1 ms at close for subscription frames not yet sent",
        ),
        "xǁDynamoZmqPlaneSubscriberǁrescan__mutmut_20": (
            '"XXDynamo\'s discovery lists %d ZMQ publishers; connecting to the first %d onlyXX",',
            "message",
            "text of the channels_capped warning (the test reads the text inside)",
        ),
        "xǁDynamoZmqPlaneSubscriberǁrescan__mutmut_27": (
            "with contextlib.suppress(None):",
            "same-value",
            "only URLs this socket connected are disconnected (`_connected`), which libzmq never refuses",
        ),
        "xǁDynamoZmqPlaneSubscriberǁrescan__mutmut_52": (
            'self.counters.loud("zmq_plane.connect_failed", "XXcannot connect to %s: %sXX", url, exc)',
            "message",
            "text of the connect_failed warning (the test reads the text inside)",
        ),
        "xǁDynamoZmqPlaneSubscriberǁhandle_frames__mutmut_11": (
            '"zmq_plane.malformed", "XXmalformed message on Dynamo\'s ZMQ event plane (%s)XX", exc',
            "message",
            "text of the malformed warning (the test reads the text inside)",
        ),
        "xǁDynamoZmqPlaneSubscriberǁhandle_frames__mutmut_32": (
            'self._seen[key] = ""',
            "same-value",
            "the remembered pairs' values are never read",
        ),
        "xǁDynamoZmqPlaneSubscriberǁhandle_frames__mutmut_34": (
            "self._seen.popitem(last=None)",
            "same-value",
            "None is false, as False: the oldest pair goes",
        ),
    },
    "events/dynamo_plane.py": {
        "x__payload__mutmut_12": (
            "raise _WrongTopic(None)",
            "message",
            "the topic is only the log line's argument (the counter key is fixed)",
        ),
        "x__payload__mutmut_18": (
            "raise MalformedEvent(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__payload__mutmut_19": (
            'raise MalformedEvent(f"payload is {type(None).__name__}, not bin")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__payload__mutmut_2": (
            "raise MalformedEvent(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__payload__mutmut_22": (
            "events = msgpack.unpackb(payload, raw=None)",
            "same-value",
            "msgpack's raw defaults to False (1.0+); None is false alike",
        ),
        "x__payload__mutmut_24": (
            "events = msgpack.unpackb(payload, )",
            "same-value",
            "msgpack's raw defaults to False (1.0+); None is false alike",
        ),
        "x__payload__mutmut_26": (
            "raise MalformedEvent(None) from None",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__payload__mutmut_28": (
            "raise MalformedEvent(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__payload__mutmut_29": (
            'raise MalformedEvent(f"payload is {type(None).__name__}, not an array of RouterEvents")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__payload__mutmut_3": (
            'raise MalformedEvent(f"envelope is {type(None).__name__}, not a map")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__router_event__mutmut_24": (
            "raise MalformedEvent(None)",
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__router_event__mutmut_25": (
            'raise MalformedEvent(f"storage_tier is {type(None).__name__}, not a string")',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x__router_event__mutmut_35": (
            "count_unknown_variant(counters, None, payload)",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x__router_event__mutmut_36": (
            "count_unknown_variant(counters, worker, None)",
            "message",
            "the worker and variant are only the log line's arguments (the counter key is fixed)",
        ),
        "x_read_envelope__mutmut_12": (
            'counters.loud("dynamo.malformed", "Dynamo event-plane message is not msgpack (%r); dropped", )',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_15": (
            'counters.loud("dynamo.malformed", "XXDynamo event-plane message is not msgpack (%r); droppedXX", exc)',  # noqa: E501
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_16": (
            'counters.loud("dynamo.malformed", "dynamo event-plane message is not msgpack (%r); dropped", exc)',  # noqa: E501
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_22": (
            '"dynamo.unknown_topic", "Dynamo event-plane message with topic %.80r; dropped", None',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_24": (
            '"dynamo.unknown_topic", exc.topic',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_25": (
            '"dynamo.unknown_topic", "Dynamo event-plane message with topic %.80r; dropped", )',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_28": (
            '"dynamo.unknown_topic", "XXDynamo event-plane message with topic %.80r; droppedXX", exc.topic',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_29": (
            '"dynamo.unknown_topic", "dynamo event-plane message with topic %.80r; dropped", exc.topic',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_3": (
            "envelope = msgpack.unpackb(data, raw=None)",
            "same-value",
            "msgpack's raw defaults to False (1.0+); None is false alike",
        ),
        "x_read_envelope__mutmut_33": (
            'counters.loud("dynamo.malformed", "malformed Dynamo event-plane message (%s); dropped", None)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_36": (
            'counters.loud("dynamo.malformed", "malformed Dynamo event-plane message (%s); dropped", )',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_39": (
            'counters.loud("dynamo.malformed", "XXmalformed Dynamo event-plane message (%s); droppedXX", exc)',  # noqa: E501
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_40": (
            'counters.loud("dynamo.malformed", "malformed dynamo event-plane message (%s); dropped", exc)',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_5": (
            "envelope = msgpack.unpackb(data, )",
            "same-value",
            "msgpack's raw defaults to False (1.0+); None is false alike",
        ),
        "x_read_envelope__mutmut_52": (
            '"dynamo.malformed", "malformed Dynamo KV event on the event plane (%s); dropped", None',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_55": (
            '"dynamo.malformed", "malformed Dynamo KV event on the event plane (%s); dropped", )',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_58": (
            '"dynamo.malformed", "XXmalformed Dynamo KV event on the event plane (%s); droppedXX", exc',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_59": (
            '"dynamo.malformed", "malformed dynamo kv event on the event plane (%s); dropped", exc',
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "x_read_envelope__mutmut_9": (
            'counters.loud("dynamo.malformed", "Dynamo event-plane message is not msgpack (%r); dropped", None)',  # noqa: E501
            "message",
            "an error's or a log line's text (a field named in it, its arguments)",
        ),
        "xǁ_WrongTopicǁ__init____mutmut_1": (
            "super().__init__(None)",
            "message",
            "the topic is only the log line's argument (the counter key is fixed)",
        ),
        "xǁ_WrongTopicǁ__init____mutmut_2": (
            "self.topic = None",
            "message",
            "the topic is only the log line's argument (the counter key is fixed)",
        ),
    },
    "runtime/h2_server.py": {
        "x__header_block__mutmut_2": (
            "return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields], huffman=None)",  # noqa: E501
            "wire",
            (
                "huffman=None and True (hpack's default) Huffman-code the literals; any HPACK decoder reads"
                " the same fields"
            ),
        ),
        "x__header_block__mutmut_4": (
            "return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields], )",
            "wire",
            "hpack's default Huffman-codes the literals; any HPACK decoder reads the same fields",
        ),
        "x__header_block__mutmut_9": (
            "return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields], huffman=True)",  # noqa: E501
            "wire",
            "Huffman-coded literals; any HPACK decoder reads the same fields",
        ),
        "x__percent_encode__mutmut_18": (
            'bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode("UTF-8")',
            "same-value",
            "the same codec by another name",
        ),
        "x__trailers__mutmut_1": (
            "if status == OK or not message:",
            "same-value",
            (
                "OK never comes with a message and every other status with one, so both tests pick the same"
                " trailers"
            ),
        ),
        "x__unpad__mutmut_11": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXpadding longer than the frameXX")',
            "message",
            "an error's or a log line's text",
        ),
        "x__unpad__mutmut_12": (
            'raise ConnectionError_(PROTOCOL_ERROR, "PADDING LONGER THAN THE FRAME")',
            "message",
            "an error's or a log line's text",
        ),
        "x__unpad__mutmut_8": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁConnectionError_ǁ__init____mutmut_1": (
            "super().__init__(None)",
            "message",
            "str() of the error is only the GOAWAY's debug text and a log line",
        ),
        "xǁH2GrpcServerǁ__init____mutmut_8": (
            "self.stopping = None",
            "same-value",
            "None and False are both false where `stopping` is read",
        ),
        "xǁH2GrpcServerǁstop__mutmut_12": (
            "await asyncio.gather(*running, return_exceptions=None)",
            "same-value",
            (
                "`_serve` never raises (it catches every exception and its own cancellation), so gather has"
                " none to return or raise"
            ),
        ),
        "xǁH2GrpcServerǁstop__mutmut_14": (
            "await asyncio.gather(*running, )",
            "same-value",
            (
                "`_serve` never raises (it catches every exception and its own cancellation), so gather has"
                " none to return or raise"
            ),
        ),
        "xǁH2GrpcServerǁstop__mutmut_15": (
            "await asyncio.gather(*running, return_exceptions=False)",
            "same-value",
            (
                "`_serve` never raises (it catches every exception and its own cancellation), so gather has"
                " none to return or raise"
            ),
        ),
        "xǁ_Connectionǁ__init____mutmut_2": (
            'self.transport: asyncio.Transport | None = ""',
            "same-value",
            "connection_made sets the transport before any other callback can read it",
        ),
        "xǁ_Connectionǁ__init____mutmut_20": (
            "self.going_away = None",
            "same-value",
            "None and False are both false where `going_away` is read",
        ),
        "xǁ_Connectionǁ__init____mutmut_22": (
            "self.peer = None",
            "same-value",
            "connection_made sets the peer before anything reads it",
        ),
        "xǁ_Connectionǁ__init____mutmut_23": (
            'self.peer = "XXXX"',
            "same-value",
            "connection_made sets the peer before anything reads it",
        ),
        "xǁ_Connectionǁ__init____mutmut_4": (
            "self.preface_seen = None",
            "same-value",
            "None and False are both false where `preface_seen` is read",
        ),
        "xǁ_Connectionǁ_collect__mutmut_14": (
            'stream.error = _StreamEnd(UNIMPLEMENTED, "XXcompressed messages are not supportedXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_collect__mutmut_15": (
            'stream.error = _StreamEnd(UNIMPLEMENTED, "COMPRESSED MESSAGES ARE NOT SUPPORTED")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_collect__mutmut_26": (
            "return",
            "same-value",
            "the break leaves the loop at the function's end: returning there is the same",
        ),
        "xǁ_Connectionǁ_data__mutmut_13": (
            'self._write(_frame(WINDOW_UPDATE, 1, 0, struct.pack(">I", self.owed)))',
            "wire",
            "WINDOW_UPDATE defines no flags",
        ),
        "xǁ_Connectionǁ_data__mutmut_20": (
            'self._write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">i", self.owed)))',
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁ_data__mutmut_42": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_data__mutmut_60": (
            'stream.error = _StreamEnd(INTERNAL, "XXthe stream ended inside a messageXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_flush__mutmut_31": (
            'stream.trailers = ""',
            "same-value",
            "the stream leaves `streams` in the same step, so no later flush reaches it",
        ),
        "xǁ_Connectionǁ_flush__mutmut_32": (
            "stream.closed = None",
            "same-value",
            (
                "the stream leaves `streams` in the same step and its servicer is done: nothing reads "
                "`closed` again"
            ),
        ),
        "xǁ_Connectionǁ_flush__mutmut_33": (
            "stream.closed = False",
            "same-value",
            (
                "the stream leaves `streams` in the same step and its servicer is done: nothing reads "
                "`closed` again"
            ),
        ),
        "xǁ_Connectionǁ_flush__mutmut_36": (
            "self.streams.pop(stream.id, )",
            "same-value",
            (
                "a stream is in `streams` when its trailers go: a reset or a lost connection removes and "
                "closes it, and a closed stream's servicer returns before trailers"
            ),
        ),
        "xǁ_Connectionǁ_flush__mutmut_47": (
            'self._write(_frame(RST_STREAM, 1, stream.id, struct.pack(">I", NO_ERROR)))',
            "wire",
            "RST_STREAM defines no flags",
        ),
        "xǁ_Connectionǁ_flush__mutmut_53": (
            'self._write(_frame(RST_STREAM, 0, stream.id, struct.pack(">i", NO_ERROR)))',
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_107": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_110": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXPUSH_PROMISE from a clientXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_111": (
            'raise ConnectionError_(PROTOCOL_ERROR, "push_promise from a client")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_112": (
            'raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE FROM A CLIENT")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_12": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_15": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXHEADERS on stream 0XX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_16": (
            'raise ConnectionError_(PROTOCOL_ERROR, "headers on stream 0")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_17": (
            'raise ConnectionError_(PROTOCOL_ERROR, "HEADERS ON STREAM 0")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_35": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_38": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXCONTINUATION without its HEADERSXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_39": (
            'raise ConnectionError_(PROTOCOL_ERROR, "continuation without its headers")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_40": (
            'raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION WITHOUT ITS HEADERS")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_45": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_48": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXa header block over 64 KiBXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_49": (
            'raise ConnectionError_(PROTOCOL_ERROR, "a header block over 64 kib")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_71": (
            "raise ConnectionError_(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_78": (
            'raise ConnectionError_(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "XXbad PINGXX")',  # noqa: E501
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_frame_received__mutmut_79": (
            'raise ConnectionError_(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "bad ping")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_113": (
            'self._write(_frame(RST_STREAM, 1, stream_id, struct.pack(">I", NO_ERROR)))',
            "wire",
            "RST_STREAM defines no flags",
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_119": (
            'self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">i", NO_ERROR)))',
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_12": (
            "raise ConnectionError_(COMPRESSION_ERROR, None) from None",
            "message",
            "the GOAWAY's debug text and a log line",
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_21": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_33": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_47": (
            'self._write(_frame(RST_STREAM, 1, stream_id, struct.pack(">I", REFUSED_STREAM)))',
            "wire",
            "RST_STREAM defines no flags",
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_53": (
            'self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">i", REFUSED_STREAM)))',
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_64": (
            'self._write(_frame(RST_STREAM, 1, stream_id, struct.pack(">I", REFUSED_STREAM)))',
            "wire",
            "RST_STREAM defines no flags",
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_70": (
            'self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">i", REFUSED_STREAM)))',
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁ_header_block_done__mutmut_88": (
            'content_type = fields.get(b"content-type", b"XXXX")',
            "same-value",
            "neither default starts with application/grpc: the same 415",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_10": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_13": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXnot an HTTP/2 connection prefaceXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_14": (
            'raise ConnectionError_(PROTOCOL_ERROR, "not an http/2 connection preface")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_15": (
            'raise ConnectionError_(PROTOCOL_ERROR, "NOT AN HTTP/2 CONNECTION PREFACE")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_19": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_22": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXnot an HTTP/2 connection prefaceXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_23": (
            'raise ConnectionError_(PROTOCOL_ERROR, "not an http/2 connection preface")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_24": (
            'raise ConnectionError_(PROTOCOL_ERROR, "NOT AN HTTP/2 CONNECTION PREFACE")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_45": (
            "raise ConnectionError_(FRAME_SIZE_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_5": (
            "if len(buffer) <= len(PREFACE):",
            "performance",
            (
                "a buffer of exactly the preface is checked with the client's next bytes instead (its "
                "SETTINGS follow at once, RFC 9113 3.4); nothing answers the preface itself"
            ),
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_52": (
            "return",
            "same-value",
            "the finally clause runs either way, and nothing follows the loop",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_63": (
            "stream_id = int.from_bytes(buffer[pos + 5 : pos + 9], ) & 0x7FFFFFFF",
            "same-value",
            "int.from_bytes reads big-endian by default (Python 3.11+, the oldest supported)",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_86": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_89": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXa header block interrupted by another frameXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_read_frames__mutmut_90": (
            'raise ConnectionError_(PROTOCOL_ERROR, "A HEADER BLOCK INTERRUPTED BY ANOTHER FRAME")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_send__mutmut_26": (
            "if stream.pending or size >= stream.send_window or size > self.send_window or size > self.max_frame:",  # noqa: E501
            "same-value",
            "an answer that exactly fits goes through `_flush` instead, as the same single DATA frame",
        ),
        "xǁ_Connectionǁ_send__mutmut_27": (
            "if stream.pending or size > stream.send_window or size >= self.send_window or size > self.max_frame:",  # noqa: E501
            "same-value",
            "an answer that exactly fits goes through `_flush` instead, as the same single DATA frame",
        ),
        "xǁ_Connectionǁ_send__mutmut_28": (
            "if stream.pending or size > stream.send_window or size > self.send_window or size >= self.max_frame:",  # noqa: E501
            "same-value",
            "an answer that exactly fits goes through `_flush` instead, as the same single DATA frame",
        ),
        "xǁ_Connectionǁ_serve__mutmut_24": (
            'status, message = CANCELLED, "XXthe server stoppedXX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_serve__mutmut_25": (
            'status, message = CANCELLED, "THE SERVER STOPPED"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_serve__mutmut_28": (
            "log.exception(stream.id)",
            "message",
            "a log line's arguments",
        ),
        "xǁ_Connectionǁ_serve__mutmut_29": (
            'log.exception("ext_proc stream %d failed", )',
            "message",
            "a log line's arguments",
        ),
        "xǁ_Connectionǁ_serve__mutmut_30": (
            'log.exception("XXext_proc stream %d failedXX", stream.id)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_serve__mutmut_33": (
            'status, message = INTERNAL, "XXinternal errorXX"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_serve__mutmut_34": (
            'status, message = INTERNAL, "INTERNAL ERROR"',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_serve__mutmut_61": (
            "stream.started = None",
            "same-value",
            "nothing is sent on the stream after its trailers, so `started` is not read again",
        ),
        "xǁ_Connectionǁ_serve__mutmut_62": (
            "stream.started = False",
            "same-value",
            "nothing is sent on the stream after its trailers, so `started` is not read again",
        ),
        "xǁ_Connectionǁ_settings__mutmut_14": (
            "raise ConnectionError_(FRAME_SIZE_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_17": (
            'raise ConnectionError_(FRAME_SIZE_ERROR, "XXa SETTINGS frame not made of 6-byte settingsXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_18": (
            'raise ConnectionError_(FRAME_SIZE_ERROR, "a settings frame not made of 6-byte settings")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_19": (
            'raise ConnectionError_(FRAME_SIZE_ERROR, "A SETTINGS FRAME NOT MADE OF 6-BYTE SETTINGS")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_4": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_40": (
            "raise ConnectionError_(FLOW_CONTROL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_43": (
            'raise ConnectionError_(FLOW_CONTROL_ERROR, "XXan initial window over 2^31 - 1XX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_44": (
            'raise ConnectionError_(FLOW_CONTROL_ERROR, "AN INITIAL WINDOW OVER 2^31 - 1")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_60": (
            "raise ConnectionError_(PROTOCOL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_7": (
            'raise ConnectionError_(PROTOCOL_ERROR, "XXSETTINGS on a streamXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_8": (
            'raise ConnectionError_(PROTOCOL_ERROR, "settings on a stream")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_settings__mutmut_9": (
            'raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS ON A STREAM")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_15": (
            "increment = int.from_bytes(payload, ) & 0x7FFFFFFF",
            "same-value",
            "int.from_bytes reads big-endian by default (Python 3.11+, the oldest supported)",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_25": (
            "raise ConnectionError_(FLOW_CONTROL_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_28": (
            'raise ConnectionError_(FLOW_CONTROL_ERROR, "XXthe connection window over 2^31 - 1XX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_29": (
            'raise ConnectionError_(FLOW_CONTROL_ERROR, "THE CONNECTION WINDOW OVER 2^31 - 1")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_4": (
            "raise ConnectionError_(FRAME_SIZE_ERROR, None)",
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_7": (
            'raise ConnectionError_(FRAME_SIZE_ERROR, "XXa WINDOW_UPDATE not of 4 bytesXX")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_8": (
            'raise ConnectionError_(FRAME_SIZE_ERROR, "a window_update not of 4 bytes")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁ_window_update__mutmut_9": (
            'raise ConnectionError_(FRAME_SIZE_ERROR, "A WINDOW_UPDATE NOT OF 4 BYTES")',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁconnection_lost__mutmut_2": (
            "stream.closed = None",
            "same-value",
            (
                "the connection is gone: the cancelled servicer's trailers meet a closing transport, which "
                "`_write` skips"
            ),
        ),
        "xǁ_Connectionǁconnection_lost__mutmut_3": (
            "stream.closed = False",
            "same-value",
            (
                "the connection is gone: the cancelled servicer's trailers meet a closing transport, which "
                "`_write` skips"
            ),
        ),
        "xǁ_Connectionǁconnection_made__mutmut_16": (
            "self.peer = None",
            "same-value",
            "the server listens on TCP only, whose peername is always a tuple",
        ),
        "xǁ_Connectionǁconnection_made__mutmut_17": (
            "self.peer = str(None)",
            "same-value",
            "the server listens on TCP only, whose peername is always a tuple",
        ),
        "xǁ_Connectionǁconnection_made__mutmut_28": (
            'struct.pack(">hi", key, value)',
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁconnection_made__mutmut_35": (
            'increase = struct.pack(">i", MAX_WINDOW - 65535)',
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁcredit__mutmut_5": (
            "if give >= STREAM_WINDOW / 2 and not stream.closed and not stream.ended:",
            "same-value",
            "STREAM_WINDOW is even: / 2 and // 2 compare alike",
        ),
        "xǁ_Connectionǁdata_received__mutmut_10": (
            'log.warning("XXHTTP/2 connection from %s closed: %sXX", self.peer, exc)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁdata_received__mutmut_11": (
            'log.warning("http/2 connection from %s closed: %s", self.peer, exc)',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁdata_received__mutmut_16": (
            "self.go_away(exc.code, )",
            "message",
            "the GOAWAY's debug text",
        ),
        "xǁ_Connectionǁdata_received__mutmut_17": (
            "self.go_away(exc.code, str(None))",
            "message",
            "the GOAWAY's debug text",
        ),
        "xǁ_Connectionǁdata_received__mutmut_5": (
            'log.warning("HTTP/2 connection from %s closed: %s", None, exc)',
            "message",
            "a log line's arguments",
        ),
        "xǁ_Connectionǁdata_received__mutmut_6": (
            'log.warning("HTTP/2 connection from %s closed: %s", self.peer, None)',
            "message",
            "a log line's arguments",
        ),
        "xǁ_Connectionǁgo_away__mutmut_1": (
            'def go_away(self, code: int, why: str = "XXXX") -> None:',
            "message",
            "an error's or a log line's text",
        ),
        "xǁ_Connectionǁgo_away__mutmut_2": (
            "self.going_away = None",
            "same-value",
            (
                "the server says GOAWAY on stop (then `stopping` refuses new streams and stop closes the "
                "connection once its streams end) or before closing the connection itself"
            ),
        ),
        "xǁ_Connectionǁgo_away__mutmut_23": (
            'self._write(_frame(GOAWAY, 0, 0, struct.pack(">ii", self.last_stream, code) + why.encode()[:200]))',  # noqa: E501
            "same-value",
            (
                "the values packed are below 2^31 (a setting's key below 2^15): signed and unsigned give "
                "the same bytes"
            ),
        ),
        "xǁ_Connectionǁgo_away__mutmut_24": (
            'self._write(_frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream, code) + why.encode()[:201]))',  # noqa: E501
            "message",
            "the GOAWAY's debug text, cut one byte later",
        ),
        "xǁ_Connectionǁgo_away__mutmut_3": (
            "self.going_away = False",
            "same-value",
            (
                "the server says GOAWAY on stop (then `stopping` refuses new streams and stop closes the "
                "connection once its streams end) or before closing the connection itself"
            ),
        ),
        "xǁ_StreamEndǁ__init____mutmut_1": (
            "super().__init__(None)",
            "message",
            "the status and message are read from the attributes; str() of it is never used",
        ),
        "xǁ_Streamǁ__init____mutmut_10": (
            'self.task: asyncio.Task[None] | None = ""',
            "same-value",
            "the task is set in the same step the stream is created, before anything can read it",
        ),
        "xǁ_Streamǁ__init____mutmut_12": (
            "self.started = None  # response headers sent",
            "same-value",
            "None and False are both false where `started` is read",
        ),
        "xǁ_Streamǁ__init____mutmut_16": (
            "self.closed = None",
            "same-value",
            "None and False are both false where `closed` is read",
        ),
        "xǁ_Streamǁ__init____mutmut_7": (
            "self.ended = None  # the client half-closed",
            "same-value",
            "`ended` is set from the opening HEADERS' END_STREAM right after the stream is created",
        ),
        "xǁ_Streamǁ__init____mutmut_8": (
            "self.ended = True  # the client half-closed",
            "same-value",
            "`ended` is set from the opening HEADERS' END_STREAM right after the stream is created",
        ),
    },
    "runtime/wakeups.py": {
        "x_bytes_waiting__mutmut_6": (
            'return struct.unpack("I", fcntl.ioctl(fd, termios.FIONREAD, _FIONREAD_BUF))[0] > 0',
            "same-value",
            "FIONREAD's count of bytes is never negative: signed and unsigned read it alike",
        ),
        "x_lazy_sleep__mutmut_6": (
            "if selector is None or slack_s < 0:",
            "same-value",
            "with no slack the lazy entry's earliest and latest are its delay: it ends when the timer would",
        ),
        "xǁDeferringSelectorǁ_before_sleep__mutmut_16": (
            "elif held.deadline <= deadline:",
            "same-value",
            "of two equal deadlines either is the earliest",
        ),
        "xǁDeferringSelectorǁ_before_sleep__mutmut_30": (
            "return until if timeout is None or until <= timeout else timeout",
            "same-value",
            "when the delay left equals the loop's timeout, either is the same sleep",
        ),
        "xǁDeferringSelectorǁ_release__mutmut_3": (
            "if transport.is_closing() or held.deadline < now:",
            "margin",
            "a socket whose delay ends exactly now is read at the next poll instead",
        ),
        "xǁDeferringSelectorǁ_resolve__mutmut_1": (
            "if not self._lazy and (not idle and now < self._lazy_latest):",
            "performance",
            "a busy poll scans the entries instead of returning early; it finds none due by its latest",
        ),
        "xǁDeferringSelectorǁ_resolve__mutmut_5": (
            "if not self._lazy or (not idle and now <= self._lazy_latest):",
            "margin",
            "an entry whose latest is exactly now is resolved at the next poll instead",
        ),
        "xǁDeferringSelectorǁ_resolve__mutmut_6": (
            "return True",
            "same-value",
            "that early return is never taken where the result is read (_before_sleep asks with idle=True)",
        ),
        "xǁDeferringSelectorǁ_resolve__mutmut_21": (
            "resolved = None",
            "same-value",
            "None is falsy as False is: the result reads the same",
        ),
        "xǁDeferringSelectorǁ_resolve__mutmut_22": (
            "resolved = True",
            "performance",
            "when only cancelled entries were dropped the loop polls once more before it sleeps",
        ),
        "xǁDeferringSelectorǁselect__mutmut_28": (
            "self._resolve(now, idle=None)",
            "performance",
            "an entry due as the loop wakes is resolved before it sleeps again: in the same wake-up, later",
        ),
        "xǁDeferringSelectorǁ_resolve__mutmut_11": (
            "due = [e for e in self._lazy if (e.earliest if idle else e.latest) < now or e.future.done()]",
            "margin",
            "an entry due exactly now is resolved at the next poll or wake-up instead",
        ),
    },
    "router/aic.py": {
        "x_admission_estimate__mutmut_15": (
            "return PrefillEstimate(wait + own_ms, own_ms, tokens, None)",
            "same-value",
            "aic's estimate feeds PassTimeLearner.measures and the first-token check: decode_ms is unread",
        ),
        "x_admission_estimate__mutmut_21": (
            "return PrefillEstimate(wait + own_ms, own_ms, tokens, 1.0)",
            "same-value",
            "aic's estimate feeds PassTimeLearner.measures and the first-token check: decode_ms is unread",
        ),
        "x_decayed_tokens__mutmut_9": (
            "fraction = min(2.0, max(0.0, 1.0 - max(0.0, elapsed_ms) / duration_ms))",
            "same-value",
            "1 - (a value >= 0) is never above 1",
        ),
        "xǁOldestPrefillDecayǁ__init____mutmut_4": (
            "self.anchor_ms = None  # when the oldest became the oldest",
            "same-value",
            "read only while a prefill is active; add sets it when the first arrives",
        ),
        "xǁOldestPrefillDecayǁ__init____mutmut_5": (
            "self.anchor_ms = 1.0  # when the oldest became the oldest",
            "same-value",
            "read only while a prefill is active; add sets it when the first arrives",
        ),
    },
    "router/approx.py": {
        "x__along__mutmut_16": (
            "lo, hi = depth + 1, hi + 1  # seq_hashes[:lo] along the run; the answer in [lo, hi]",
            "performance",
            "the block at hi - 1 is known off the run and lo <= hi - 2, so mid never passes hi: "
            "a wider bound only adds a step",
        ),
        "x__along__mutmut_23": (
            "mid = (lo + hi + 2) // 2",
            "same-value",
            "mid stays in (lo, hi], all a binary search for the last shared block needs",
        ),
        "xǁApproxIndexerǁ__init____mutmut_21": (
            'self._next_expiry = float("INF")  # lower bound of every table\'s oldest expiry',
            "same-value",
            'float() reads "INF" as infinity too',
        ),
        "xǁApproxIndexerǁ_expire__mutmut_5": (
            'next_expiry = float("INF")',
            "same-value",
            'float() reads "INF" as infinity too',
        ),
        "xǁApproxIndexerǁ_pop_oldest__mutmut_30": (
            'next_head = (float("INF"), len(tables))',
            "same-value",
            'float() reads "INF" as infinity too',
        ),
        "xǁApproxIndexerǁ_pop_oldest__mutmut_41": (
            "if not left or (expiry, i) >= next_head:",
            "same-value",
            "next_head is another table's (expiry, index) or has index len(tables): "
            "never equal to (expiry, i)",
        ),
        "xǁApproxIndexerǁ_pop_oldest__mutmut_63": (
            "head = None",
            "same-value",
            "set only when left has just reached 0: the loop ends and the heap is dropped, whatever it holds",
        ),
        "xǁApproxIndexerǁ_pop_oldest__mutmut_77": (
            "return count + left",
            "same-value",
            "left always ends at 0: count is at most the predictions held, "
            "and the heads cover every table holding some",
        ),
        "xǁApproxIndexerǁ_prune__mutmut_7": (
            "if count >= 0:",
            "performance",
            "_pop_oldest(0) pops nothing and returns 0",
        ),
        "xǁApproxIndexerǁrecord_routing__mutmut_66": (
            'table.runs[run] = ""',
            "same-value",
            "the runs' OrderedDict is an ordered set: its values are never read",
        ),
    },
    "router/config.py": {
        "x__enum__mutmut_9": (
            'raise InvalidConfig(name, value, "XXone of XX" + ", ".join(m.value for m in cls))',
            "message",
            "the error's accepted text",
        ),
        "x__enum__mutmut_10": (
            'raise InvalidConfig(name, value, "ONE OF " + ", ".join(m.value for m in cls))',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_63": (
            '"none or timing without router_track_prefill_tokens (as in dynamo, aic requires "',
            "message",
            "the accepted text's wording only (its start, the field and the value are asserted)",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_79": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_86": (
            "\"XXa PrefillTiming or 'a,b,c[,d2,d1,d0]'XX\",",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_87": (
            "\"a prefilltiming or 'a,b,c[,d2,d1,d0]'\",",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_88": (
            "\"A PREFILLTIMING OR 'A,B,C[,D2,D1,D0]'\",",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_92": (
            '_check(self.block_size >= 1, "block_size", self.block_size, None)',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_101": (
            '_check(self.block_size >= 1, "block_size", self.block_size, "XXan integer >= 1XX")',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_102": (
            '_check(self.block_size >= 1, "block_size", self.block_size, "AN INTEGER >= 1")',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_106": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_117": (
            '"XXa number >= 0XX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_118": (
            '"A NUMBER >= 0",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_122": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_133": (
            '"XXa number >= 0XX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_134": (
            '"A NUMBER >= 0",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_138": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_149": (
            '"XXa number > 0XX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_150": (
            '"A NUMBER > 0",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_179": (
            '_check(self.router_ttl_secs > 0, "router_ttl_secs", self.router_ttl_secs, None)',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_188": (
            '_check(self.router_ttl_secs > 0, "router_ttl_secs", self.router_ttl_secs, "XXseconds > 0XX")',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_189": (
            '_check(self.router_ttl_secs > 0, "router_ttl_secs", self.router_ttl_secs, "SECONDS > 0")',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_193": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_202": (
            '"XXan integer >= 1XX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_203": (
            '"AN INTEGER >= 1",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_207": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_218": (
            '"XXa fraction in (0, 1]XX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_219": (
            '"A FRACTION IN (0, 1]",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_223": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_238": (
            '"XXa fraction of the KV cache in [0, 1], or unsetXX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_239": (
            '"a fraction of the kv cache in [0, 1], or unset",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_240": (
            '"A FRACTION OF THE KV CACHE IN [0, 1], OR UNSET",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_244": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_258": (
            '"XXa token count >= 0, or unsetXX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_259": (
            '"A TOKEN COUNT >= 0, OR UNSET",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_264": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_272": (
            '"XXa fraction in [0, 1], or unsetXX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_273": (
            '"A FRACTION IN [0, 1], OR UNSET",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_277": (
            "None,",
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_288": (
            '"XXa number >= 0, or unsetXX",',
            "message",
            "the error's accepted text",
        ),
        "xǁRouterConfigǁ__post_init____mutmut_289": (
            '"A NUMBER >= 0, OR UNSET",',
            "message",
            "the error's accepted text",
        ),
    },
    "router/device_share.py": {
        "x_device_class_candidates__mutmut_5": (
            "if not cpu and len(cpu) == len(eligible):",
            "same-value",
            "one class empty: the share rule gives every eligible worker (idle class never takes it)",
        ),
    },
    "router/disagg.py": {
        "xǁDisaggRouterǁroute__mutmut_5": (
            "looked_up = None",
            "same-value",
            "the lookup apart finds what the decision's lookup finds (same state, expired alike)",
        ),
        "xǁDisaggRouterǁroute__mutmut_9": (
            "looked_up = cfg.mode in KV_RULES and cfg.overlap_score_weight > 1",
            "same-value",
            "the lookup apart finds what the decision's lookup finds (same state, expired alike)",
        ),
        "xǁDisaggRouterǁroute__mutmut_11": (
            "if not looked_up or local_hashes:",
            "performance",
            "a lookup the decision made already (its answer is not read) or of no hashes (nothing found)",
        ),
    },
    "router/hashing.py": {
        "xǁBlockHashCacheǁ_store__mutmut_10": (
            "old = None",
            "performance",
            WHY_LIVE,
        ),
        "xǁBlockHashCacheǁ_store__mutmut_11": (
            "old = index.get(None)",
            "performance",
            WHY_LIVE,
        ),
        "xǁBlockHashCacheǁ_store__mutmut_14": (
            "record.live -= 1",
            "performance",
            WHY_LIVE,
        ),
        "xǁBlockHashCacheǁ_store__mutmut_15": (
            "record.live += 2",
            "performance",
            WHY_LIVE,
        ),
        "xǁBlockHashCacheǁ_store__mutmut_17": (
            "old.live = 1",
            "performance",
            WHY_LIVE,
        ),
        "xǁBlockHashCacheǁ_store__mutmut_18": (
            "old.live += 1",
            "performance",
            WHY_LIVE,
        ),
        "xǁBlockHashCacheǁ_store__mutmut_21": (
            "self._drop(None)",
            "performance",
            WHY_LIVE,
        ),
        "xǁ_Recordǁ__init____mutmut_3": (
            "self.live = 1  # checkpoints that lead here (a later prompt takes over the ones it shares)",
            "performance",
            "a record whose every checkpoint a later prompt extends is taken over and forgotten by it; "
            "a count that never reaches 0 only leaves a record to the LRU's eviction",
        ),
        "xǁBlockHashCacheǁblock_hashes__mutmut_79": (
            "if found is not None and blocks == len(found.keys) / per:",
            "performance",
            "the lists are copied instead of taken over: the same hashes",
        ),
        "xǁBlockHashCacheǁblock_hashes__mutmut_93": (
            "seq = found.seq[:blocks] if (found is not None) and False else []",
            "performance",
            "the sequence hashes are chained again from the local ones when asked: the same values",
        ),
        "xǁBlockHashCacheǁ_forget__mutmut_4": (
            "record.live = None",
            "same-value",
            "a forgotten record is in no index entry and no LRU slot: its count is never read again",
        ),
        "xǁBlockHashCacheǁ_forget__mutmut_5": (
            "record.live = 1",
            "same-value",
            "a forgotten record is in no index entry and no LRU slot: its count is never read again",
        ),
        "x_block_seed__mutmut_7": (
            'seed += _xxh3(lora_name.encode("utf-8"), )',
            "same-value",
            "xxh3_64_intdigest's seed defaults to 0",
        ),
        "x_block_seed__mutmut_10": (
            'seed += _xxh3(lora_name.encode("UTF-8"), seed=0)',
            "same-value",
            '"UTF-8" and "utf-8" name the same codec',
        ),
        "x_block_seed__mutmut_20": (
            'seed += _xxh3(namespace.encode("UTF-8"), seed=1)',
            "same-value",
            '"UTF-8" and "utf-8" name the same codec',
        ),
        "x_tokens_as_u32le__mutmut_5": (
            'if tokens.size and (tokens.dtype.kind not in "XXiuXX" or tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):',  # noqa: E501
            "same-value",
            'a dtype kind is one character: "XXiuXX" holds i and u and no other kind',
        ),
        "x_tokens_as_u32le__mutmut_12": (
            'raise ValueError("XXtoken ids must be integers in [0, 2**32)XX")',
            "message",
            "the error's text",
        ),
        "x_tokens_as_u32le__mutmut_26": (
            'if isinstance(tokens, array.array) and tokens.typecode == "XXIXX" and not _BIG_ENDIAN:',
            "performance",
            "the uint32 array is copied instead of viewed: the same bytes",
        ),
        "x_tokens_as_u32le__mutmut_28": (
            'if isinstance(tokens, array.array) and tokens.typecode == "I" and _BIG_ENDIAN:',
            "performance",
            "the uint32 array is copied instead of viewed: the same bytes",
        ),
        "x_tokens_as_u32le__mutmut_41": (
            'raise ValueError("XXtoken ids must be integers in [0, 2**32)XX") from exc',
            "message",
            "the error's text",
        ),
        "xǁ_Recordǁ__init____mutmut_4": (
            "self.size = None",
            "same-value",
            "_store sets a record's size before it is indexed; nothing reads it before",
        ),
        "xǁ_Recordǁ__init____mutmut_5": (
            "self.size = 1",
            "same-value",
            "_store sets a record's size before it is indexed; nothing reads it before",
        ),
        "xǁBlockHashCacheǁblock_hashes__mutmut_33": (
            "keys.append((seed, block_size, k - 1, digest.intdigest()))",
            "same-value",
            "keys are only compared with keys made alike: k - 1 numbers the checkpoints as apart as k + 1",
        ),
        "xǁBlockHashCacheǁblock_hashes__mutmut_34": (
            "keys.append((seed, block_size, k + 2, digest.intdigest()))",
            "same-value",
            "keys are only compared with keys made alike: k + 2 numbers the checkpoints as apart as k + 1",
        ),
        "xǁBlockHashCacheǁ_remember_seq__mutmut_1": (
            "if len(seq) < len(record.seq):",
            "performance",
            "a chain as long as the known one is the same hashes: an equal copy replaces it, 0 bytes grow",
        ),
        "xǁBlockHashCacheǁ_drop__mutmut_3": (
            "if self._records.pop(id(record), ) is record:",
            "same-value",
            "_drop gets a record the index led to, and every indexed record is in the LRU: pop finds it",
        ),
    },
    "router/load_order.py": {
        "xǁLoadOrderǁidle_rank_at__mutmut_4": (
            "lo, hi = 0, len(self.workers) + 1",
            "same-value",
            "the index is below the result's size, so the answer is a rank < len(workers): a wider"
            " upper bound bisects to the same least rank",
        ),
        "xǁLoadOrderǁset_busy__mutmut_2": (
            "if not self.is_busy(None):",
            "performance",
            "a busy worker set busy again leaves its busy state and re-enters it: the same state",
        ),
        "xǁTimedLoadOrderǁ__init____mutmut_12": (
            "self._next_id = 1",
            "same-value",
            "ids only tell classes apart: equal-key classes are all visited or none, ranks merged sorted",
        ),
        "xǁTimedLoadOrderǁ__init____mutmut_14": (
            "self._state: dict[int, tuple[int, float]] = {r: (_BUSY, 1.0) for r in range(len(self.workers))}",
            "same-value",
            "a busy state's value is never read (only a class id's or a key's is)",
        ),
        "xǁTimedLoadOrderǁ__init____mutmut_18": (
            "self._version = [1] * len(self.workers)",
            "same-value",
            "a version is only compared with the rank's current one: any change per leave spots a stale wake",
        ),
        "xǁTimedLoadOrderǁ_leave__mutmut_2": (
            "self._version[rank] -= 1",
            "same-value",
            "a version is only compared with the rank's current one: any change per leave spots a stale wake",
        ),
        "xǁTimedLoadOrderǁ_leave__mutmut_3": (
            "self._version[rank] += 2",
            "same-value",
            "a version is only compared with the rank's current one: any change per leave spots a stale wake",
        ),
        "xǁTimedLoadOrderǁset_class__mutmut_13": (
            "self._next_id -= 1",
            "same-value",
            "ids only tell classes apart: equal-key classes are all visited or none, ranks merged sorted",
        ),
        "xǁTimedLoadOrderǁset_class__mutmut_14": (
            "self._next_id += 2",
            "same-value",
            "ids only tell classes apart: equal-key classes are all visited or none, ranks merged sorted",
        ),
        "xǁTimedLoadOrderǁrank_at__mutmut_20": (
            "lo, hi = 0, max(ranks[-1] if ranks else 0, extra[-1] if extra else 1)",
            "same-value",
            "the answer is at most the largest rank given: a bound of 1, not 0, bisects to the same rank",
        ),
        "xǁTimedLoadOrderǁrank_at__mutmut_15": (
            "lo, hi = 0, max(ranks[-1] if ranks else 1, extra[-1] if extra else 0)",
            "same-value",
            "with no ranks the answer is one of extra, at most extra[-1]: an upper bound of 1 instead of 0"
            " bisects to the same least rank",
        ),
        "xǁTimedLoadOrderǁset_busy__mutmut_3": (
            "self._state[rank] = (_BUSY, 1.0)",
            "same-value",
            "a busy state's value is never read (only a class id's or a key's is)",
        ),
    },
    "router/pass_time.py": {
        "xǁPassTimeLearnerǁ_settle_fleet__mutmut_8": (
            "if abs(fleet - self._fleet_used) >= SIGNIFICANCE * se:",
            "margin",
            "the fleet's model moves also when its estimate is exactly SIGNIFICANCE standard errors "
            "away (se > 0: the prior's noise never vanishes)",
        ),
        "xǁPassTimeLearnerǁ__init____mutmut_4": (
            "self._mixed: bool | None = None  # whether one is DISTINCT_SPEED or more away (None: unknown)",
            "same-value",
            "a learner that has seen nothing has no departed worker: the first read finds False",
        ),
        "xǁPassTimeLearnerǁobserve__mutmut_17": (
            "used = self._fleet_used if (stats is None) and False else self._used(worker, stats)",
            "same-value",
            "a worker without statistics has no model of its own: _used gives the fleet's log too",
        ),
    },
    "router/prefill_model.py": {
        "xǁPrefillTimingǁ__post_init____mutmut_27": (
            'raise InvalidConfig(f"prefill_timing.{name}", value, None)',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_31": (
            'raise InvalidConfig(f"prefill_timing.{name}", value, "XXa finite numberXX")',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_32": (
            'raise InvalidConfig(f"prefill_timing.{name}", value, "A FINITE NUMBER")',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_38": (
            'raise InvalidConfig("prefill_timing.prefill_linear_ms", self.prefill_linear_ms, None)',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_44": (
            'raise InvalidConfig("prefill_timing.prefill_linear_ms", self.prefill_linear_ms, "XXa number > 0XX")',  # noqa: E501
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_45": (
            'raise InvalidConfig("prefill_timing.prefill_linear_ms", self.prefill_linear_ms, "A NUMBER > 0")',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_62": (
            'raise InvalidConfig(f"prefill_timing.{name}", value, None)',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_66": (
            'raise InvalidConfig(f"prefill_timing.{name}", value, "XXan integer >= 1XX")',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁ__post_init____mutmut_67": (
            'raise InvalidConfig(f"prefill_timing.{name}", value, "AN INTEGER >= 1")',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁparse__mutmut_7": (
            'raise InvalidConfig("prefill_timing", text, None) from None',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁparse__mutmut_13": (
            'raise InvalidConfig("prefill_timing", text, "XX3 or 6 comma-separated numbersXX") from None',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁparse__mutmut_14": (
            'raise InvalidConfig("prefill_timing", text, "3 OR 6 COMMA-SEPARATED NUMBERS") from None',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁparse__mutmut_20": (
            'raise InvalidConfig("prefill_timing", text, None)',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁparse__mutmut_26": (
            'raise InvalidConfig("prefill_timing", text, "XX3 or 6 comma-separated numbersXX")',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimingǁparse__mutmut_27": (
            'raise InvalidConfig("prefill_timing", text, "3 OR 6 COMMA-SEPARATED NUMBERS")',
            "message",
            "the error's accepted text",
        ),
        "xǁPrefillTimelineǁ__init____mutmut_3": (
            "self._total = None",
            "same-value",
            "add() sets it before it is read (empty: done; retime only scales it)",
        ),
        "xǁPrefillTimelineǁ__init____mutmut_6": (
            "self._decode_ms = 1.0  # decode part of each pass of this stream",
            "same-value",
            "add() sets it before it is read (empty: done; retime only scales it)",
        ),
        "xǁPrefillTimelineǁ__init____mutmut_7": (
            "self.anchor_ms = None",
            "same-value",
            "add() sets it before it is read (empty: done; retime only scales it)",
        ),
        "xǁPrefillTimelineǁ__init____mutmut_8": (
            "self.anchor_ms = 1.0",
            "same-value",
            "add() sets it before it is read (empty: done; retime only scales it)",
        ),
        "xǁPrefillTimelineǁremaining_tokens__mutmut_18": (
            "progress = (now_ms - start) / (end - start) if (end > start) or True else 0.0",
            "same-value",
            "a pass in progress always ends after it starts (end > now >= start): the else is unreachable",
        ),
        "xǁPrefillTimelineǁremaining_tokens__mutmut_22": (
            "progress = (now_ms - start) / (end - start) if end >= start else 0.0",
            "same-value",
            "a pass in progress always ends after it starts (end > now >= start): the else is unreachable",
        ),
        "xǁPrefillTimelineǁremaining_tokens__mutmut_23": (
            "progress = (now_ms - start) / (end - start) if end > start else 1.0",
            "same-value",
            "a pass in progress always ends after it starts (end > now >= start): the else is unreachable",
        ),
        "xǁPrefillTimelineǁremaining_tokens__mutmut_34": (
            "return round(self._total - committed + in_pass * (1.0 - min(2.0, max(0.0, progress))))",
            "same-value",
            "progress is in [0, 1) here (now in [start, end)): the clamp never acts",
        ),
    },
    "router/queue.py": {
        "xǁAdmissionQueueǁpush__mutmut_33": (
            "self._served.setdefault(flow, -2)",
            "same-value",
            "a flow not served yet is marked below every release count (they start at 0): -2 sorts "
            "where -1 does",
        ),
        "xǁAdmissionQueueǁremove__mutmut_16": (
            "if len(self._heap) >= 2 * len(self._entries) + 16:",
            "performance",
            "compacts one removal earlier: contents and order are the same",
        ),
        "xǁAdmissionQueueǁremove__mutmut_17": (
            "if len(self._heap) > 2 * len(self._entries) - 16:",
            "performance",
            "compacts sooner (2 n + 16 still holds): contents and order are the same",
        ),
    },
    "router/radix.py": {
        "xǁRadixTreeǁ__init____mutmut_21": (
            "self.writes = 1  # calls that may have changed the tree: "
            "a dump in slices checks it did not change",
            "same-value",
            "writes is only compared with itself (radix_dump._unchanged): its start does not matter",
        ),
        "xǁRadixTreeǁ__init____mutmut_3": (
            "self._root = _Node(None, [], None, {})",
            "same-value",
            "the root's holders are never read: every walk starts at its children and stops below it",
        ),
        "xǁRadixTreeǁ__init____mutmut_4": (
            "self._root = _Node(None, [], 0, None)",
            "same-value",
            "the root holds no blocks: its engine ids are never read",
        ),
        "xǁRadixTreeǁ__init____mutmut_9": (
            "self._root = _Node(None, [], 1, {})",
            "same-value",
            "the root's holders are never read: every walk starts at its children and stops below it",
        ),
        "xǁRadixTreeǁ_detach__mutmut_24": (
            "token = cast(None, object())",
            "same-value",
            "typing.cast returns its value whatever the type named",
        ),
        "xǁRadixTreeǁ_merge__mutmut_1": (
            "if len(lower.hashes) < len(upper.hashes):",
            "performance",
            "on equal lengths the other run moves: the same joined run, other ids re-pointed",
        ),
        "xǁRadixTreeǁ_merge__mutmut_30": (
            "assert grand is not None or grand.children is not None",
            "same-value",
            "an assertion that always holds, weakened",
        ),
        "xǁRadixTreeǁ_name__mutmut_11": (
            "if aliases or not aliases.keys().isdisjoint(fresh):",
            "performance",
            "with aliases every bulk store goes block by block (_store_slow), which stores the same",
        ),
        "xǁRadixTreeǁ_name__mutmut_30": (
            "elif there is not node or not _named_at(self._own, node, pos + j, engine_hash, None):",
            "same-value",
            "the storing worker's own list is shorter than pos (its new ids are added after): never counted",
        ),
        "xǁRadixTreeǁ_named_alike__mutmut_1": (
            "if self._own[holder] or not self._own[holder].keys().isdisjoint(seg):",
            "performance",
            "falls back to _name, which names the same ids the general way",
        ),
        "xǁRadixTreeǁ_named_alike__mutmut_4": (
            "if self._own[slot] or not self._own[slot].keys().isdisjoint(seg):",
            "performance",
            "falls back to _name, which names the same ids the general way",
        ),
        "xǁRadixTreeǁ_named_alike__mutmut_8": (
            "if aliases or not aliases.keys().isdisjoint(seg):",
            "performance",
            "falls back to _name, which names the same ids the general way",
        ),
        "xǁRadixTreeǁ_release__mutmut_16": (
            "elif names.keys() == set(ids[+len(names) :]):",
            "performance",
            "k names equal to the ids after the first k are the last k (2 k ids): else the general path "
            "finds the same span",
        ),
        "xǁRadixTreeǁ_release__mutmut_19": (
            "if len(names) < 4:",
            "performance",
            "both branches find the same offsets (by scanning, or by a dict)",
        ),
        "xǁRadixTreeǁ_release__mutmut_20": (
            "if len(names) <= 5:",
            "performance",
            "both branches find the same offsets (by scanning, or by a dict)",
        ),
        "xǁRadixTreeǁ_release__mutmut_36": (
            "if o != prev - 1:",
            "performance",
            "every offset its own span: the same blocks cut in more steps, merged back by _settle",
        ),
        "xǁRadixTreeǁ_remove__mutmut_15": (
            "if type(None) is tuple and len(engine_hashes) == 1 and not aliases:",
            "performance",
            "one id takes the general path, which removes the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_16": (
            "if type(engine_hashes) is not tuple and len(engine_hashes) == 1 and not aliases:",
            "performance",
            "tuples (the events' type) take the general path; a one-id list the one-id path: the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_162": (
            'named[engine_hash] = ""',
            "same-value",
            "the dict's values are never read",
        ),
        "xǁRadixTreeǁ_remove__mutmut_21": (
            "node = None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_22": (
            "node = own.get(engine_hash) if (own) and False else None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_23": (
            "node = own.get(engine_hash) if (own) or True else None",
            "same-value",
            "an empty dict's get returns None as the else branch does",
        ),
        "xǁRadixTreeǁ_remove__mutmut_24": (
            "node = own.get(None) if own else None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_25": (
            "shared = None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_26": (
            "shared = node is not None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_27": (
            "node = None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_28": (
            "node = self._shards[engine_hash & NAME_MASK].get(None)",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_30": (
            "ids = None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_32": (
            "ids = None if (node is None) or True else node.eids.get(slot)",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_34": (
            "ids = None if node is None else node.eids.get(None)",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_37": (
            "if node is None and ids is not None and ids[-1] == engine_hash:",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_54": (
            "elif not (node.workers | node.partial) | ~bit or not _named_at(",
            "same-value",
            "the test is only a shortcut: _named_at answers False for a lone holder too",
        ),
        "xǁRadixTreeǁ_remove__mutmut_56": (
            "elif not (node.workers | node.partial) & bit or not _named_at(",
            "same-value",
            "the test is only a shortcut: _named_at answers False for a lone holder too",
        ),
        "xǁRadixTreeǁ_remove__mutmut_82": (
            "tails = _tails(None, self._names, slot, engine_hashes)",
            "performance",
            "tails refuses the worker's own ids: the general path cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_11": (
            "own = None",
            "performance",
            "own read as None: the fast paths refuse the worker's own ids and the general path (_held_at) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_95": (
            "by_node = None",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_96": (
            "by_node = _group_held(None, self._names, slot, engine_hashes)",
            "performance",
            "group_held refuses the worker's own ids: the general path cuts the same",
        ),
        "xǁRadixTreeǁ_remove__mutmut_98": (
            "by_node = _group_held(own, self._names, None, engine_hashes)",
            "performance",
            "the one-block fast path is skipped: the general removal path (tails, group_held, the loop) "
            "cuts the same",
        ),
        "xǁRadixTreeǁ_repoint__mutmut_12": (
            "done = None",
            "performance",
            "holders naming the blocks alike each point them again: the same names",
        ),
        "xǁRadixTreeǁ_repoint__mutmut_2": (
            'done: list[int] | None = ""',
            "performance",
            "the first holder's ids never equal a string: one update more, the same names",
        ),
        "xǁRadixTreeǁ_settle__mutmut_41": (
            "break",
            "performance",
            "at worst a run more than needed, the same answers: a merge left for a child is made when that "
            "child is settled (no shape found in 4,500 random histories under check_runs)",
        ),
        "xǁRadixTreeǁ_split__mutmut_10": (
            "tail_ids = sum(max(0, len(ids) + k) for ids in eids.values())",
            "performance",
            "only which side of the split moves to a new node: the same runs",
        ),
        "xǁRadixTreeǁ_split__mutmut_17": (
            "if tail_ids - len(node.children or ()) <= head_ids:",
            "performance",
            "only which side of the split moves to a new node: the same runs",
        ),
        "xǁRadixTreeǁ_split__mutmut_18": (
            "if tail_ids + len(node.children or ()) < head_ids:",
            "performance",
            "only which side of the split moves to a new node: the same runs",
        ),
        "xǁRadixTreeǁ_split__mutmut_22": (
            "lower = _Node(node, run[k:], None, {})",
            "same-value",
            "the new node's bitmasks are set by _recount before any read",
        ),
        "xǁRadixTreeǁ_split__mutmut_28": (
            "lower = _Node(node, run[k:], 1, {})",
            "same-value",
            "the new node's bitmasks are set by _recount before any read",
        ),
        "xǁRadixTreeǁ_split__mutmut_43": (
            "assert parent is not None or parent.children is not None",
            "same-value",
            "an assertion that always holds, weakened",
        ),
        "xǁRadixTreeǁ_split__mutmut_49": (
            "upper = _Node(parent, run[:k], None, {})",
            "same-value",
            "the new node's bitmasks are set by _recount before any read",
        ),
        "xǁRadixTreeǁ_split__mutmut_55": (
            "upper = _Node(parent, run[:k], 1, {})",
            "same-value",
            "the new node's bitmasks are set by _recount before any read",
        ),
        "xǁRadixTreeǁ_split__mutmut_9": (
            "tail_ids = sum(max(1, len(ids) - k) for ids in eids.values())",
            "performance",
            "only which side of the split moves to a new node: the same runs",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_100": (
            "if other is not ids and len(other) > stop:  # keep one copy of the ints",
            "performance",
            "a holder exactly as long is skipped: _name names the same ids",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_103": (
            "named = None",
            "performance",
            "_name names the same ids the general way",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_143": (
            "i = stop - end",
            "performance",
            "the event's blocks are walked again from an earlier index as repeats: the same tree",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_160": (
            "seg = es[i:] if (i) or True else es",
            "performance",
            "a copy of the whole list instead of the list",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_165": (
            "if node is not root and children is None and node.workers | bit:  # extend the leaf",
            "same-value",
            "at a run's end reached by the event the worker holds the whole run: the bit is set",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_180": (
            "node.hashes += hs[i:] if (i) or True else hs",
            "performance",
            "a copy of the whole list instead of the list",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_198": (
            "new = _Node(node, hs[i:] if (i) or True else hs, bit, {})",
            "performance",
            "a copy of the whole list instead of the list",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_202": (
            "named = self._name(slot, new, None, seg)",
            "same-value",
            "a new run has no other holder: pos is never read",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_208": (
            "named = self._name(slot, new, 1, seg)",
            "same-value",
            "a new run has no other holder: pos is never read",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_230": (
            "if i <= n:  # a reused or repeated engine id: the rest block by block, from a stable name",
            "performance",
            "a fully stored event also takes the slow path, which has nothing left to store",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_56": (
            "k = _common(run, end, hs, i, min(len(run) + end, n - i))",
            "same-value",
            "common() stops where the shorter slice ends: the same count",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_57": (
            "k = _common(run, end, hs, i, min(len(run) - end, n + i))",
            "same-value",
            "common() stops where the shorter slice ends: the same count",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_66": (
            "break",
            "performance",
            "the rest of the event goes block by block (_store_slow): the same tree",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_73": (
            "if ids is not None and end <= len(ids):  # held already: a repeat, unless ids differ",
            "same-value",
            "at end == len(ids) the repeat check compares empty slices and moves nothing",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_80": (
            "if ids[end:upto] != es[i : i + upto + end]:",
            "performance",
            "the repeat check fails on a longer slice: the rest goes block by block, the same tree",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_81": (
            "if ids[end:upto] != es[i : i - upto - end]:",
            "performance",
            "the repeat check fails on a shorter slice: the rest goes block by block, the same tree",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_83": (
            "i = upto - end",
            "performance",
            "the event's blocks are walked again from an earlier index as repeats: the same tree",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_88": (
            "break",
            "performance",
            "the rest of the event goes block by block (_store_slow): the same tree",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_12": (
            "node, end = root, 1",
            "same-value",
            "the root has no blocks: any end is at its end",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_98": (
            "if other is not ids or len(other) >= stop:  # keep one copy of the ints",
            "performance",
            "a holder shorter than the segment never names it alike: _name names it",
        ),
        "xǁRadixTreeǁstore_blocks__mutmut_99": (
            "if other is ids and len(other) >= stop:  # keep one copy of the ints",
            "performance",
            "the storer's own list is never as long as stop here: _name names it",
        ),
        "xǁRadixTreeǁ_store_one__mutmut_25": (
            "held = None",
            "same-value",
            "read only when target is set, which sets held first",
        ),
        "xǁRadixTreeǁ_store_one__mutmut_26": (
            "held = 1",
            "same-value",
            "read only when target is set, which sets held first",
        ),
        "xǁRadixTreeǁ_store_one__mutmut_45": (
            "if node is self._root and node.children is None and node.workers & bit:",
            "performance",
            "a new one-block run under the leaf, which _settle merges into it: the same runs",
        ),
        "xǁRadixTreeǁ_store_one__mutmut_47": (
            "if node is not self._root and node.children is None and node.workers | bit:",
            "same-value",
            "at a run's end after a block it holds, the worker holds the whole run: the bit is set",
        ),
        "xǁRadixTreeǁ_store_slow__mutmut_3": (
            "node, end = self._root, 1",
            "same-value",
            "the root has no blocks: any end is at its end",
        ),
        "xǁRadixTreeǁ_unname__mutmut_12": (
            "if other == slot or top < kept:",
            "same-value",
            "a holder reaching only to kept compares empty slices and leaves kept as it is",
        ),
        "xǁRadixTreeǁ_unname__mutmut_16": (
            "own_maps[other] or not own_maps[other].keys().isdisjoint(ids[kept:top])",
            "performance",
            "block by block through _named_at: the same names dropped",
        ),
        "xǁRadixTreeǁ_unname__mutmut_21": (
            "kept = -2",
            "same-value",
            "any negative kept takes the same branch",
        ),
        "xǁRadixTreeǁ_unname__mutmut_28": (
            "if kept <= 0:",
            "performance",
            "kept == 0 goes block by block through _named_at: the same names dropped",
        ),
        "xǁRadixTreeǁ_unname__mutmut_29": (
            "if kept < 1:",
            "performance",
            "kept == 0 goes block by block through _named_at: the same names dropped",
        ),
        "xǁRadixTreeǁapply_event__mutmut_14": (
            'raise TypeError(f"not a KV event: {type(None).__name__}")',
            "message",
            "an exception's text",
        ),
        "xǁRadixTreeǁclear_worker__mutmut_10": (
            "nodes = _held_runs(self, slot).get(slot, None)",
            "same-value",
            "a slot with entries holds a run: the default is never used",
        ),
        "xǁRadixTreeǁclear_worker__mutmut_12": (
            "nodes = _held_runs(self, slot).get(slot, )",
            "same-value",
            "a slot with entries holds a run: the default is never used",
        ),
        "xǁRadixTreeǁclear_worker__mutmut_14": (
            "nodes = _held_runs(self, None).get(slot, [])",
            "performance",
            "every slot's runs are gathered, this slot's read",
        ),
        "xǁRadixTreeǁclear_worker__mutmut_16": (
            "nodes = _held_runs(self, ).get(slot, [])",
            "performance",
            "every slot's runs are gathered (slot defaults to None), this slot's read",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_117": (
            "depth += _common(run, 0, q, depth, min(len(run), n + depth))",
            "performance",
            "a limit past the query's end: the slices differ, the bisection finds the same count",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_14": (
            "worker_at = cast(None, self._worker_at)",
            "same-value",
            "typing.cast returns its value whatever the type named",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_2": (
            "q = local_hashes if (type(local_hashes) is list) and False else list(local_hashes)",
            "performance",
            "the query list is copied: the same matches",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_20": (
            "active = (1 >> len(worker_at)) - 1",
            "same-value",
            "-1 (every bit) or 0: the first run narrows active to the slots it holds, and drops at depth "
            "0 score nothing",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_21": (
            "active = (2 << len(worker_at)) - 1",
            "same-value",
            "one bit above every slot: the first run narrows active to the slots it holds, and drops at "
            "depth 0 score nothing",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_4": (
            "q = local_hashes if type(None) is list else list(local_hashes)",
            "performance",
            "a list is copied too: the same hashes",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_58": (
            "matched = _common(run, 0, q, depth, min(len(run), n + depth))",
            "performance",
            "a limit past the query's end: the slices differ, the bisection finds the same count",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_87": (
            "if end < n and (end == depth + 1 or q[depth:end] == run):",
            "performance",
            "a run ending with the query is matched by the common-prefix count instead: the same depth",
        ),
        "xǁRadixTreeǁfind_matches__mutmut_90": (
            "if end <= n and (end == depth - 1 or q[depth:end] == run):",
            "performance",
            "a one-block run (found by its hash) is compared again: equal, the same depth",
        ),
    },
    "router/router.py": {
        "xǁKvRouterǁdump_events__mutmut_5": (
            "keep = None",
            "same-value",
            "a dump starts with a store, which sets keep before a removal reads it",
        ),
        "xǁKvRouterǁdump_events__mutmut_6": (
            "keep = True",
            "same-value",
            "a dump starts with a store, which sets keep before a removal reads it",
        ),
        "xǁKvRouterǁ_load_order__mutmut_1": (
            "order = None",
            "performance",
            "rebuilt from the workers' current loads at each decision: the same keys, busy and idle states",
        ),
        "xǁKvRouterǁ_timed_load_order__mutmut_1": (
            "order = None",
            "performance",
            "rebuilt from the current state at each decision: keys do not depend on when they were made",
        ),
        "xǁKvRouterǁ_reorder_timed__mutmut_38": (
            "key = scale - min(sd, dp) / full_pass",
            "performance",
            "a lower key bounds less: the worker is evaluated sooner, its cost is the same",
        ),
        "xǁKvRouterǁ_reorder_timed__mutmut_47": (
            "slack = abs(end) * 1e-12 - 1e-6",
            "margin",
            "the stream's end read 2 us later",
        ),
        "xǁKvRouterǁ_reorder_timed__mutmut_51": (
            "slack = abs(end) * 1e-12 + 1.000001",
            "performance",
            "the stream's end read 1 ms sooner and the worker classified again 1 ms later: its "
            "stream bounds stay below its cost, they bound less",
        ),
        "xǁKvRouterǁ_reorder_timed__mutmut_60": (
            "order.set_key(rank, key, (end + slack, timing.prefill_linear_ms), end + slack)",
            "margin",
            "the stream's end read 2 us later",
        ),
        "xǁKvRouterǁ_reorder_timed__mutmut_61": (
            "order.set_key(rank, key, (end - slack, timing.prefill_linear_ms), end - slack)",
            "performance",
            "classified again a microsecond before its stream ends: the same stream keys again",
        ),
        "xǁKvRouterǁ_timed_choice__mutmut_3": (
            "now = self._clock() * 1001.0",
            "performance",
            "every time this decision reads (and the clock-went-back check it stores) is 0.1 % later "
            "alike: streams look shorter and fall due sooner, so bounds only loosen",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_63": (
            "idle_cost = self._cost(seqs.potential_load(None, block_keys, isl, 0), bs, weight)",
            "same-value",
            "an idle worker that matches nothing carries what a worker never routed to carries: the "
            "same cost, whose worker field is replaced by the idle worker drawn",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_93": (
            "if key - (best - common) >= _KEY_SLACK * (1.0 + abs(best) + common + abs(key)):",
            "margin",
            "stops at a key exactly on the slack's edge",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_94": (
            "if key - (best - common) > _KEY_SLACK / (1.0 + abs(best) + common + abs(key)):",
            "margin",
            "the float slack shrinks to 1e-9 of a cost or less",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_95": (
            "if key - (best - common) > _KEY_SLACK * (1.0 + abs(best) + common - abs(key)):",
            "margin",
            "the float slack moves by 2e-9 of the key",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_96": (
            "if key - (best - common) > _KEY_SLACK * (1.0 + abs(best) - common + abs(key)):",
            "margin",
            "the float slack moves by 2e-9 of the common term",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_97": (
            "if key - (best - common) > _KEY_SLACK * (1.0 - abs(best) + common + abs(key)):",
            "margin",
            "the float slack moves by 2e-9 of the best cost",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_98": (
            "if key - (best - common) > _KEY_SLACK * (2.0 + abs(best) + common + abs(key)):",
            "margin",
            "the float slack grows by 1e-9",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_121": (
            "if c.cost <= best:",
            "same-value",
            "best becomes the same number when the cost equals it",
        ),
        "xǁKvRouterǁbest_worker_for_hashes__mutmut_88": (
            "best = self._best_overlap(device, candidates, None)",
            "performance",
            "with no filter the candidates are every registered worker: the max over them is the max "
            "over the registered workers in the overlaps",
        ),
        "xǁKvRouterǁ_best_overlap__mutmut_3": (
            "order = None",
            "same-value",
            "the load order ranks every registered worker, the candidates here are every registered "
            "worker: the same set",
        ),
        "xǁKvRouterǁ_best_overlap__mutmut_5": (
            "known = order.rank if (order is not None) and False else set(candidates)",
            "same-value",
            "the load order ranks every registered worker, the candidates here are every registered "
            "worker: the same set",
        ),
        "xǁKvRouterǁ_reorder__mutmut_25": (
            "prefill_blocks = seqs.prefill_tokens(None) / cfg.block_size",
            "performance",
            "a key without the worker's prompt load is lower, never higher than its cost: the "
            "decision visits more workers and draws among the same ties",
        ),
        "xǁKvRouterǁ_busy__mutmut_27": (
            "reported_kv_usage=self.reported.fresh_kv_usage(worker) "
            "if (len(self.reported)) or True else None,",
            "same-value",
            "with no report kept, fresh_kv_usage is None for every worker",
        ),
        "xǁKvRouterǁ__init____mutmut_46": (
            'self._order: LoadOrder | TimedLoadOrder | None = ""  '
            "# built lazily; None after a change of workers",
            "same-value",
            "before the first decision builds it, an empty string is no load order either: rebuilt, "
            "and a load change resets it to None",
        ),
        "xǁKvRouterǁ__init____mutmut_47": (
            'self._order_config: RouterConfig | None = ""  '
            "# the config the order's keys and busy states follow",
            "same-value",
            "compared by identity with the config: an empty string differs from it as None does",
        ),
        "xǁKvRouterǁ_block_keys__mutmut_3": (
            "if not (cfg.router_track_active_blocks or cfg.router_assume_kv_reuse):",
            "performance",
            "with one of the two off, in-flight blocks are counted, not matched: chained hashes count "
            "the same as local ones (and approximate mode is given the chained hashes it computes)",
        ),
        "xǁKvRouterǁ_candidates__mutmut_8": (
            "raise NoWorkers(None)",
            "message",
            "an exception's text",
        ),
        "xǁKvRouterǁ_candidates__mutmut_9": (
            'raise NoWorkers("XXno registered worker is allowed for this requestXX")',
            "message",
            "an exception's text",
        ),
        "xǁKvRouterǁ_candidates__mutmut_10": (
            'raise NoWorkers("NO REGISTERED WORKER IS ALLOWED FOR THIS REQUEST")',
            "message",
            "an exception's text",
        ),
        "xǁKvRouterǁ_timed_choice__mutmut_71": (
            "return weight * max(0.0, round(ms / (1.0 - _BOUND_SLACK) / ms_per_token) / bs)",
            "margin",
            "the bound's float slack turns into 1e-9 too much",
        ),
        "xǁKvRouterǁ_timed_choice__mutmut_72": (
            "return weight * max(0.0, round(ms * (1.0 + _BOUND_SLACK) / ms_per_token) / bs)",
            "margin",
            "the bound's float slack turns into 1e-9 too much",
        ),
        "xǁKvRouterǁ_timed_choice__mutmut_78": (
            "return",
            "performance",
            "None: the caller's full scan decides, as this decision would have",
        ),
        "xǁKvRouterǁ__init____mutmut_48": (
            'self._order_timing: PrefillTiming | None = ""  # timing model: the shared pass-time model '
            "it follows",
            "same-value",
            "compared by identity with the shared model: an empty string differs from it as None does",
        ),
        "xǁKvRouterǁ_timed_choice__mutmut_121": (
            "if stream is not None and bound(stream[0] - now - stream[1] * isl) > best:",
            "performance",
            "a lower stream bound skips fewer workers: their costs are computed, the same choice",
        ),
        "xǁKvRouterǁ_timed_choice__mutmut_129": (
            "if timeline is not None or timeline.running_at(now):",
            "margin",
            "a stream's entry lives until a microsecond after its predicted end (its due time; an earlier "
            "first token or free classifies the worker again at once): only in that window can it be over",
        ),
        "xǁKvRouterǁ_fast_choice__mutmut_17": (
            "if seqs.track_active_blocks or seqs.assume_kv_reuse:",
            "same-value",
            "sequences index in-flight holders only with both on: holders_of finds nobody otherwise",
        ),
        "xǁKvRouterǁ_timed_choice__mutmut_21": (
            "if seqs.track_active_blocks or seqs.assume_kv_reuse:",
            "same-value",
            "sequences index in-flight holders only with both on: holders_of finds nobody otherwise",
        ),
        "xǁKvRouterǁadd_request__mutmut_9": (
            "learn=None,  # its decision time reaches this replica late: no speed to learn from it",
            "same-value",
            "learn is read for its truth: None is False",
        ),
        "xǁKvRouterǁ_full_scan__mutmut_36": (
            "if cfg.mode is RouterMode.DEVICE_AWARE_WEIGHTED and len(eligible) >= 1:",
            "same-value",
            "one eligible worker: device_class_candidates returns it alone",
        ),
        "xǁKvRouterǁ_best_overlap__mutmut_16": (
            "return max((overlaps.get(w, 0) for w in candidates), default=None)",
            "same-value",
            "candidates are never empty (NoWorkers first): no default is used",
        ),
        "xǁKvRouterǁ_best_overlap__mutmut_18": (
            "return max((overlaps.get(w, 0) for w in candidates), )",
            "same-value",
            "candidates are never empty (NoWorkers first): no default is used",
        ),
        "xǁKvRouterǁ_best_overlap__mutmut_24": (
            "return max((overlaps.get(w, 0) for w in candidates), default=1)",
            "same-value",
            "candidates are never empty (NoWorkers first): no default is used",
        ),
        "xǁKvRouterǁ_track__mutmut_2": (
            "seq_hashes = None",
            "same-value",
            "record_routing computes the same sequence hashes itself",
        ),
        "xǁKvRouterǁ_track__mutmut_3": (
            "seq_hashes = block_keys if (block_keys is not local_hashes) and False else None",
            "same-value",
            "record_routing computes the same sequence hashes itself",
        ),
        "xǁKvRouterǁ_track__mutmut_24": (
            "self.approx.record_routing(worker, local_hashes, self._clock(), seq_hashes=None)",
            "same-value",
            "record_routing computes the same sequence hashes itself",
        ),
        "xǁKvRouterǁ_track__mutmut_28": (
            "self.approx.record_routing(worker, local_hashes, self._clock(), )",
            "same-value",
            "record_routing computes the same sequence hashes itself",
        ),
        "xǁKvRouterǁset_thresholds__mutmut_10": (
            'raise InvalidConfig(name, values[name], "XXone of XX" + ", ".join(known))',
            "message",
            "the error's text (the names it lists stay)",
        ),
        "xǁKvRouterǁset_thresholds__mutmut_11": (
            'raise InvalidConfig(name, values[name], "ONE OF " + ", ".join(known))',
            "message",
            "the error's text (the names it lists stay)",
        ),
        "xǁKvRouterǁset_thresholds__mutmut_13": (
            'raise InvalidConfig(name, values[name], "one of " + "XX, XX".join(known))',
            "message",
            "the error's text (the names it lists stay)",
        ),
    },
    "router/selection.py": {
        "x_pick__mutmut_2": (
            "raise ValueError(None)",
            "message",
            "the error's text",
        ),
        "x_pick__mutmut_3": (
            'raise ValueError("XXno candidatesXX")',
            "message",
            "the error's text",
        ),
        "x_pick__mutmut_4": (
            'raise ValueError("NO CANDIDATES")',
            "message",
            "the error's text",
        ),
        "x_pick__mutmut_27": (
            "for candidate, p in zip(costs, probabilities, strict=None):",
            "same-value",
            "one probability per cost: the lengths always agree",
        ),
        "x_pick__mutmut_30": (
            "for candidate, p in zip(costs, probabilities, ):",
            "same-value",
            "one probability per cost: the lengths always agree",
        ),
        "x_pick__mutmut_31": (
            "for candidate, p in zip(costs, probabilities, strict=False):",
            "same-value",
            "one probability per cost: the lengths always agree",
        ),
        "x_softmax_probabilities__mutmut_11": (
            "if temperature <= 1:",
            "same-value",
            "reached for 0 < T <= 1 only when all costs are equal: the argmin of equal costs is uniform",
        ),
        "x_softmax_probabilities__mutmut_15": (
            "best = [2.0 if c == lo else 0.0 for c in costs]",
            "same-value",
            "the weights are normalised: 2 / (2 k) is exactly 1 / k in floating point",
        ),
    },
    "router/sequences.py": {
        "xǁActiveSequencesǁmark_prefill_complete__mutmut_10": (
            "request.teaches = None  # its time is not the first token's",
            "same-value",
            "None is read as False (`teaches` is only read as a condition)",
        ),
        "xǁActiveSequencesǁ_admit_aic__mutmut_21": (
            "request, admission_estimate(decay, own, None, now), now, learn=learn",
            "same-value",
            "an aic estimate's uncached tokens are read by nobody (the learner reads its times, the "
            "timing model's timeline its own estimate's)",
        ),
        "xǁActiveSequencesǁpotential__mutmut_15": (
            "prefill = self.prefill_tokens(worker) if (self._timed or self._aic) or True "
            "else load.prefill_tokens",
            "same-value",
            "under none, prefill_tokens(worker) reads the same load.prefill_tokens",
        ),
        "xǁActiveSequencesǁ_estimate__mutmut_42": (
            "usage = (load.decode_blocks if load else 1.0) * bs / timing.kv_capacity_tokens",
            "same-value",
            "no load means nothing decodes there: the usage is not read",
        ),
        "xǁ_WorkerLoadǁholds_first__mutmut_1": (
            "return self.solo[0] == keys[0] if (self.solo) and False else keys[0] in self.block_refs",
            "performance",
            "a solo worker's answer only spares add_request adding it again to its holders (a set)",
        ),
        "xǁ_WorkerLoadǁrelease__mutmut_18": (
            "deque(map(dict.pop, repeat(refs), keys[shared:]), maxlen=None)",
            "performance",
            "the deque only drives map (the pops) and is dropped: what it keeps is never read",
        ),
        "xǁ_WorkerLoadǁrelease__mutmut_20": (
            "deque(map(dict.pop, repeat(refs), keys[shared:]), )",
            "performance",
            "the deque only drives map (the pops) and is dropped: what it keeps is never read",
        ),
        "xǁ_WorkerLoadǁrelease__mutmut_28": (
            "deque(map(dict.pop, repeat(refs), keys[shared:]), maxlen=1)",
            "performance",
            "the deque only drives map (the pops) and is dropped: what it keeps is never read",
        ),
        "xǁ_WorkerLoadǁheld_prefix__mutmut_19": (
            "return bisect_left(block_keys, True, key=lambda k: k not in refs) if (refs) or True else 0",
            "performance",
            "with no counts every key is missing: the bisection finds 0 too",
        ),
        "xǁActiveSequencesǁfree__mutmut_18": (
            "self._timeline_done(request.worker, request_id, complete=None)",
            "same-value",
            "_timeline_done reads complete for its truth: None drops as False does",
        ),
    },
    "router/radix_dump.py": {
        "x__held_blocks__mutmut_7": (
            "chain, parent = _dump_parent(tree, slot, node, None, stand_ins)",
            "same-value",
            "off is only tested for truth: None as 0",
        ),
        "x_held_runs__mutmut_4": (
            "return _step(_walk_held(tree, None, 0)) or {}  # step 0: the walk ends in its first step",
            "performance",
            "walking every slot's runs finds this slot's same runs, in the same order: only more work",
        ),
        "x_held_runs__mutmut_5": (
            "return _step(_walk_held(tree, slot, None)) or {}  # step 0: the walk ends in its first step",
            "same-value",
            "the count of runs visited never equals None, nor 0 (it starts at 1): the walk never pauses",
        ),
    },
    "router/radix_lookup.py": {
        "x_common__mutmut_13": (
            "mid = (lo + hi + 2) // 2",
            "same-value",
            "mid stays in (lo, hi], all the binary search needs",
        ),
        "x_common__mutmut_6": (
            "lo, hi = 0, limit + 1  # run[a:a+lo] matches; the answer is at most hi",
            "same-value",
            "limit is the shorter remainder: past it the slices differ in length",
        ),
        "x_group_held__mutmut_10": (
            "nodes = [own[h] if h not in own else shared[h] for h in hashes]",
            "performance",
            "each id looked up in the wrong map: missing or not held there, the general path decides",
        ),
        "x_group_held__mutmut_2": (
            "hashes = engine_hashes if (type(engine_hashes) is tuple) and False else tuple(engine_hashes)",
            "performance",
            "a tuple copied into an equal tuple",
        ),
        "x_group_held__mutmut_24": (
            "for node, group in groupby(zip(nodes, hashes, strict=None), _first):",
            "same-value",
            "nodes is mapped from hashes: the lengths always agree",
        ),
        "x_group_held__mutmut_27": (
            "for node, group in groupby(zip(nodes, hashes, ), _first):",
            "same-value",
            "nodes is mapped from hashes: the lengths always agree",
        ),
        "x_group_held__mutmut_28": (
            "for node, group in groupby(zip(nodes, hashes, strict=False), _first):",
            "same-value",
            "nodes is mapped from hashes: the lengths always agree",
        ),
        "x_group_held__mutmut_3": (
            "hashes = engine_hashes if (type(engine_hashes) is tuple) or True else tuple(engine_hashes)",
            "same-value",
            "RadixTree._remove passes the event's tuple, or a list read the same way",
        ),
        "x_group_held__mutmut_35": (
            "named = None",
            "performance",
            "a run named twice apart loses names: the count check returns None, _remove's loop groups",
        ),
        "x_group_held__mutmut_36": (
            "named = by_node.get(None)",
            "performance",
            "as named = None: the count check returns None, _remove's loop groups",
        ),
        "x_group_held__mutmut_4": (
            "hashes = engine_hashes if type(None) is tuple else tuple(engine_hashes)",
            "performance",
            "a tuple copied into an equal tuple",
        ),
        "x_group_held__mutmut_46": (
            "ids = None",
            "performance",
            "every plan refused: _remove's loop groups and cuts the same",
        ),
        "x_group_held__mutmut_47": (
            "ids = node.eids.get(None)",
            "performance",
            "every plan refused: _remove's loop groups and cuts the same",
        ),
        "x_group_held__mutmut_5": (
            "hashes = engine_hashes if type(engine_hashes) is not tuple else tuple(engine_hashes)",
            "same-value",
            "events carry tuples; any other iterable is read once either way",
        ),
        "x_group_held__mutmut_51": (
            "if ids is None or not named.keys() < set(ids):",
            "performance",
            "a removal of all the worker's ids in a run refused: _remove's loop cuts the same",
        ),
        "x_group_held__mutmut_6": (
            "hashes = engine_hashes if type(engine_hashes) is tuple else tuple(None)",
            "same-value",
            "events carry tuples: the other branch is not reached",
        ),
        "x_group_held__mutmut_8": (
            "nodes = [own[h] if (h in own) and False else shared[h] for h in hashes]",
            "performance",
            "an own id looked up in the shared names: missing or not held there, the general path decides",
        ),
        "x_group_held__mutmut_9": (
            "nodes = [own[h] if (h in own) or True else shared[h] for h in hashes]",
            "performance",
            "a shared id looked up in the own map raises KeyError: the general path decides",
        ),
        "x_tails__mutmut_10": (
            "node = own.get(hs[i]) if (own) or True else None",
            "same-value",
            "an empty dict's get returns None as the else branch does",
        ),
        "x_tails__mutmut_11": (
            "node = own.get(None) if own else None",
            "performance",
            "an own id looked up in the shared names: missing or not held there, the general path decides",
        ),
        "x_tails__mutmut_28": (
            "if end <= 1 or ids[end - 1] != hs[i]:",
            "performance",
            "a plan refused for a worker holding one block there goes the general path, which cuts the same",
        ),
        "x_tails__mutmut_37": (
            "k = min(end, n + i)",
            "same-value",
            "common() stops where the event's ids end (slices past it differ in length): the same count",
        ),
        "x_tails__mutmut_8": (
            "node = None",
            "performance",
            "an own id looked up in the shared names: missing or not held there, the general path decides",
        ),
        "x_tails__mutmut_9": (
            "node = own.get(hs[i]) if (own) and False else None",
            "performance",
            "an own id looked up in the shared names: missing or not held there, the general path decides",
        ),
    },
    "router/ttl_table.py": {
        "xǁTtlTableǁput__mutmut_12": (
            "self._dropped(*self._entries.popitem(last=None))",
            "same-value",
            "popitem reads last for its truth: None pops the oldest as False does",
        ),
    },
    "request/anthropic.py": {
        "x_needs_system_first__mutmut_4": (
            "trim_blocks=None, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]",
            "same-value",
            "trim_blocks and lstrip_blocks change a template's whitespace, never whether it raises",
        ),
        "x_needs_system_first__mutmut_5": (
            "trim_blocks=True, lstrip_blocks=None, extensions=[jinja2.ext.loopcontrols]",
            "same-value",
            "trim_blocks and lstrip_blocks change a template's whitespace, never whether it raises",
        ),
        "x_needs_system_first__mutmut_7": (
            "lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]",
            "same-value",
            "trim_blocks and lstrip_blocks change a template's whitespace, never whether it raises",
        ),
        "x_needs_system_first__mutmut_8": (
            "trim_blocks=True, extensions=[jinja2.ext.loopcontrols]",
            "same-value",
            "trim_blocks and lstrip_blocks change a template's whitespace, never whether it raises",
        ),
        "x_needs_system_first__mutmut_10": (
            "trim_blocks=False, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]",
            "same-value",
            "trim_blocks and lstrip_blocks change a template's whitespace, never whether it raises",
        ),
        "x_needs_system_first__mutmut_11": (
            "trim_blocks=True, lstrip_blocks=False, extensions=[jinja2.ext.loopcontrols]",
            "same-value",
            "trim_blocks and lstrip_blocks change a template's whitespace, never whether it raises",
        ),
        "x_needs_system_first__mutmut_13": (
            "env.from_string(chat_template).render(messages=list(_PROBE), add_generation_prompt=None)",
            "same-value",
            "an unset or None add_generation_prompt is as falsy as False for the template",
        ),
        "x_needs_system_first__mutmut_15": (
            "env.from_string(chat_template).render(messages=list(_PROBE), )",
            "same-value",
            "an unset or None add_generation_prompt is as falsy as False for the template",
        ),
        "x_to_chat_fields__mutmut_91": (
            "inline = _messages(system, messages, merge=None)",
            "same-value",
            "merge is only tested for truth: None is as falsy as False",
        ),
    },
    "request/responses.py": {
        "x__continues_final_message__mutmut_3": (
            "last = request_input[-1] if (isinstance(request_input, list) and request_input) or True "
            "else None",
            "same-value",
            "a string input's last character is never a dict: False whichever way it is reached",
        ),
        "x__continues_final_message__mutmut_6": (
            "last = request_input[-1] if isinstance(request_input, list) or request_input else None",
            "same-value",
            "a string input's last character is never a dict: False whichever way it is reached",
        ),
    },
    "request/body_prefixes.py": {
        "xǁ_Storedǁ__init____mutmut_6": (
            "self.array_start = self.array_byte_start = -2",
            "same-value",
            "array_start is only compared with 0 and with a '[' position (never negative)",
        ),
        "xǁ_Storedǁ__init____mutmut_10": (
            "self.clean = None  # where the first match of `watch` begins in its text (its length: none)",
            "same-value",
            "clean is set before a record is stored (from the walk or the spans)",
        ),
        "xǁ_Storedǁ__init____mutmut_11": (
            "self.clean = 1  # where the first match of `watch` begins in its text (its length: none)",
            "same-value",
            "clean is set before a record is stored (from the walk or the spans)",
        ),
        "xǁ_Storedǁ__init____mutmut_14": (
            "self.size = None",
            "same-value",
            "size is set by _store before it is read",
        ),
        "xǁ_Storedǁ__init____mutmut_15": (
            "self.size = 1",
            "same-value",
            "size is set by _store before it is read",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_31": (
            "shared = _common_prefix(body, found.body) if found is not None else 1",
            "same-value",
            "without a stored body nothing is taken, whatever the shared length",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_43": (
            'text = body.decode("UTF-8")',
            "same-value",
            '"UTF-8" and "utf-8" name the same codec',
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_45": (
            'if text.startswith("XX\\ufeffXX"):  # json.loads refuses it: the whole parse says so',
            "same-value",
            "a text with a byte order mark shares no checkpoint with a stored body (none begins "
            "with one): no candidate, None before the check",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_75": (
            "since = walk.reused_chars if (found is not None and found.clean >= walk.reused_chars) "
            "and False else 0",
            "performance",
            "the watch is searched from the start: the same match, found later",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_79": (
            "since = walk.reused_chars if found is not None and found.clean > walk.reused_chars else 0",
            "performance",
            "equal offsets: the watch is searched from the start, the same match",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_80": (
            "since = walk.reused_chars if found is not None and found.clean >= walk.reused_chars else 1",
            "same-value",
            "the search starts at max(0, 1 - WATCH_CHARS) = 0 either way",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_85": (
            "match = self.watch.search(text, )",
            "performance",
            "the watch is searched from the start: the same match, found later",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_90": (
            "match = self.watch.search(text, max(1, since - WATCH_CHARS))",
            "same-value",
            "a walked text begins with white space or '{': no match can start at 0",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_97": (
            "if record.array_start > 0:",
            "same-value",
            "a '[' is never at offset 0 of a walked text (it begins with '{' or white space)",
        ),
        "xǁBodyPrefixesǁ_loads__mutmut_98": (
            "if record.array_start >= 1:",
            "same-value",
            "a '[' is never at offset 0 of a walked text (it begins with '{' or white space)",
        ),
        "xǁBodyPrefixesǁ_store__mutmut_26": (
            "if not old.live and self._stored.pop(id(old), ) is old:",
            "same-value",
            "a record the index leads to is in the LRU until it is dropped from both",
        ),
        "xǁBodyPrefixesǁ_drop__mutmut_3": (
            "if self._stored.pop(id(record), ) is record:",
            "same-value",
            "a record is dropped once, from the index or the LRU that both hold it",
        ),
        "xǁ_Walkǁ__init____mutmut_16": (
            "self.ascii = None  # else character offsets are counted in bytes, forward:",
            "performance",
            "byte offsets are counted by encoding even for ASCII text: the same offsets",
        ),
        "xǁ_Walkǁ__init____mutmut_18": (
            "self.chars_at = self.bytes_at = 1",
            "same-value",
            "the first counted span starts at the text's first character, '{' or white space: "
            "one byte either way",
        ),
        "xǁ_Walkǁrun__mutmut_6": (
            "i = ws(text, ).end()",
            "same-value",
            "match() starts at 0 by default",
        ),
        "xǁ_Walkǁrun__mutmut_22": (
            "i += 2",
            "same-value",
            "an empty object's text ends at '}' plus white space: a match past the end ends at the end",
        ),
        "xǁ_Walkǁrun__mutmut_32": (
            "key, i = _scanstring(text, i + 1, )",
            "same-value",
            "scanstring is strict by default, as the decoder is",
        ),
        "xǁ_Walkǁrun__mutmut_56": (
            'if key == "messages" and text[i] == "[" and self.record.array_start <= 0:',
            "same-value",
            "array_start is -1 or a '[' position, never 0",
        ),
        "xǁ_Walkǁrun__mutmut_57": (
            'if key == "messages" and text[i] == "[" and self.record.array_start < 1:',
            "same-value",
            "array_start is -1 or a '[' position, never 0",
        ),
        "xǁ_Walkǁ_member__mutmut_6": (
            "if member[0] == start and member[2] < self.shared:",
            "performance",
            "a member that ends exactly where the bodies part is scanned again: the same value",
        ),
        "xǁ_Walkǁ_array__mutmut_6": (
            "taken = None",
            "same-value",
            "None and 0 are both false: nothing is taken",
        ),
        "xǁ_Walkǁ_took__mutmut_1": (
            "if chars >= self.reused_chars:",
            "same-value",
            "an equal end sets the same offsets again",
        ),
        "x__checkpoint_keys__mutmut_13": (
            "keys.append((k - 1, digest.intdigest()))",
            "same-value",
            "keys are made and looked up by this one function: a shifted index names the same checkpoints",
        ),
        "x__checkpoint_keys__mutmut_14": (
            "keys.append((k + 2, digest.intdigest()))",
            "same-value",
            "keys are made and looked up by this one function: a shifted index names the same checkpoints",
        ),
        "x__common_prefix__mutmut_10": (
            "lo, step = 0, 4097",
            "performance",
            "another first step of the gallop: the same length, other comparisons",
        ),
        "x__common_prefix__mutmut_27": (
            "lo, step = hi, step * 3",
            "performance",
            "a faster-growing gallop: the same length, other comparisons",
        ),
    },
    "request/parse.py": {
        "x__unescape_unreserved__mutmut_53": (
            "start = None",
            "same-value",
            "text[None:at] is text[:at], as text[0:at]: the first piece starts at the beginning either way",
        ),
        "x__load_json__mutmut_9": (
            'text = body.decode("UTF-8")',
            "same-value",
            '"UTF-8" and "utf-8" name the same codec',
        ),
        "x__check_part__mutmut_27": (
            "text_field = _TEXT_PART_FIELDS.get(part_type) if (isinstance(part_type, str)) or True else None",
            "same-value",
            "the type is None or a string here (others were refused), and .get(None) is None too",
        ),
    },
    "config/inference_extension.py": {
        "x__metadata__mutmut_44": (
            "return name, namespace, (2, 0.0)",
            "same-value",
            "an undated resource's key is only compared with dated ones' (0, time) and with its equals",
        ),
        "x__metadata__mutmut_45": (
            "return name, namespace, (1, 1.0)",
            "same-value",
            "every undated resource gets the same key: the sort keeps file order among them either way",
        ),
        "x_read_resources__mutmut_6": (
            "raw = f.read(None)",
            "performance",
            "a file past the bound is refused either way; only how much of it is read first changes",
        ),
        "x_read_resources__mutmut_8": (
            "raw = f.read(MAX_FILE_BYTES + 2)",
            "performance",
            "one byte past the bound is all the check needs; reading two changes nothing it decides",
        ),
    },
    "picker/inference_extension.py": {
        "x__log_reading__mutmut_3": (
            "log.info(line)",
            "same-value",
            "logging formats a message only when it is given arguments: a line with a '%' reads alike",
        ),
        "x_queue_entry__mutmut_15": (
            "if isinstance(jump, bool) or not isinstance(jump, int | float) or not 0 < jump < math.inf:",
            "same-value",
            "a jump of exactly 0 is replaced by 0.0: the same entry either way",
        ),
    },
    "epp/answers.py": {
        "x_error_type__mutmut_10": (
            'return _ERROR_TYPES.get(status, "InternalServerError" if status > 500 else "BadRequestError")',
            "same-value",
            "500 is in the table: the default is never used for it",
        ),
        "x_error_type__mutmut_11": (
            'return _ERROR_TYPES.get(status, "InternalServerError" if status >= 501 else "BadRequestError")',
            "same-value",
            "500 is in the table: the default is never used for it",
        ),
        "x_streamed_body__mutmut_2": (
            "yield _streamed_chunk(None, end_of_stream)",
            "same-value",
            'an unset bytes field reads as b"": Envoy gets the same message',
        ),
        "x_header_map__mutmut_9": (
            'h.key.lower(): raw.decode("UTF-8", "replace") if (raw := h.raw_value) else h.value',
            "same-value",
            '"UTF-8" and "utf-8" name the same codec',
        ),
    },
}

# mutmut's exit codes (mutmut/stats.py): 1 and 3 a test failed, 0 all passed, 33 and 5 no test
# reached the function, 36 and the SIGXCPU family a timeout
_KILLED, _SURVIVED, _TIMEOUT = {1, 3}, {0, 5, 33}, {24, -24, 152, 255, 36}


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _pyproject_for(module: str, tests: list[str], source: Path) -> str:
    """The repository's pyproject.toml, its [tool.mutmut] extended for this module."""
    text = (source / "pyproject.toml").read_text()
    config = dict(tomllib.loads(text).get("tool", {}).get("mutmut", {}))
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
    config["source_paths"] = ["extproc"]
    config["only_mutate"] = [f"extproc/{module}"]
    config["pytest_add_cli_args_test_selection"] = tests
    body = "".join(f"{k} = {_toml_value(v)}\n" for k, v in config.items())
    return text.rstrip() + "\n\n[tool.mutmut]\n" + body


def _source(ref: str | None) -> Path:
    """Where extproc/, tests/ and pyproject.toml are copied from: the working tree, or `ref` exported
    (other work in progress in the tree then does not move the measurement)."""
    if ref is None:
        return ROOT
    # one export per run: runs started meanwhile (other modules, another commit) must not replace
    # the tree this run copies each of its modules from
    export = WORK / f"_ref.{os.getpid()}"
    if export.exists():
        shutil.rmtree(export)
    export.mkdir(parents=True)
    atexit.register(shutil.rmtree, export, ignore_errors=True)
    archive = subprocess.run(
        ["git", "archive", ref, "extproc", "tests", "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive.stdout, check=True)
    return export


def _prepare(module: str, tests: list[str], fresh: bool, source: Path) -> Path:
    workdir = WORK / module.replace("/", ".").removesuffix(".py")
    if fresh and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    for tree in ("extproc", "tests"):
        if (workdir / tree).exists():
            shutil.rmtree(workdir / tree)
        shutil.copytree(source / tree, workdir / tree, ignore=ignore)
    (workdir / "pyproject.toml").write_text(_pyproject_for(module, tests, source))
    shared = ROOT.parent / "shared"  # the real tokenizers some tests read, found as ../shared from the copy
    if shared.is_dir() and not (workdir / "shared").exists():
        (workdir / "shared").symlink_to(shared)
    # mutmut keeps every verdict of a function that did not change, but tests may have been added
    # since: the survivors of the last run are tested again (the killed stay killed), against a fresh
    # record of which tests reach which function (mutmut records only new tests', so a function
    # added since would be tested by those alone). A survivor listed in EQUIVALENT keeps its verdict
    # (no test can kill it; a change of its function makes mutmut test it again, and the report
    # checks the line it writes)
    (workdir / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    meta = workdir / "mutants" / "extproc" / f"{module}.meta"
    equivalent = EQUIVALENT.get(module, {})
    if meta.exists():
        data = json.loads(meta.read_text())
        codes = data["exit_code_by_key"]
        for name, code in codes.items():
            if code is not None and _status(code) == "survived" and name.rpartition(".")[2] not in equivalent:
                codes[name] = None
        meta.write_text(json.dumps(data, indent=4))
    return workdir


def _mutmut(workdir: Path, *args: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run mutmut in `workdir`, its output captured or written to `log` (its spinner is long)."""
    exe = Path(sys.executable).parent / "mutmut"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    with open(log or os.devnull, "w") as sink:
        return subprocess.run(
            [str(exe), *args],
            cwd=workdir,
            env=env,
            text=True,
            stdout=sink if log else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )


def _written_line(workdir: Path, name: str) -> str:
    """What the mutant writes: the `+` lines of `mutmut show`, stripped, joined by ' / '."""
    diff = _mutmut(workdir, "show", name).stdout.splitlines()
    return " / ".join(line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("++"))


def _status(code: int | None) -> str:
    if code is None:
        return "not_checked"
    if code in _TIMEOUT:
        return "timeouts"
    if code in _KILLED or code < 0:  # a negative code: the test process died of a signal
        return "killed"
    return "survived"


def _measure(module: str, tests: list[str], jobs: int, fresh: bool, source: Path | None) -> dict[str, object]:
    """Run mutmut on `module` and count; `source` None: count the last run's results again."""
    started = time.monotonic()
    if source is None:
        workdir = WORK / module.replace("/", ".").removesuffix(".py")
        log, returncode = workdir / "mutmut.log", 0
    else:
        workdir = _prepare(module, tests, fresh, source)
        log = workdir / "mutmut.log"
        print(f"{module}: mutmut run in {workdir.relative_to(ROOT)} (output in mutmut.log)", file=sys.stderr)
        returncode = _mutmut(workdir, "run", "--max-children", str(jobs), log=log).returncode
    meta = workdir / "mutants" / "extproc" / f"{module}.meta"
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    # a module without functions (only re-exports) has no mutant, and then mutmut exits 1
    if not meta.exists() or (returncode != 0 and codes):
        return {"error": f"mutmut run exited {returncode}: see {log}"}
    equivalent = EQUIVALENT.get(module, {})
    counts = {"killed": 0, "timeouts": 0, "survived": 0, "not_checked": 0, "equivalent": 0}
    survivors: list[str] = []
    stale: list[dict[str, str]] = []
    killed_equivalents: list[str] = []
    for name, code in sorted(codes.items()):
        status = _status(code)
        marked = equivalent.get(name.rpartition(".")[2])
        if status == "survived" and marked is not None:
            written = _written_line(workdir, name)
            if written == marked[0]:
                counts["equivalent"] += 1
                continue
            stale.append({"mutant": name, "expected": marked[0], "now": written})
        elif marked is not None:
            killed_equivalents.append(name)
        counts[status] += 1
        if status in ("survived", "not_checked"):
            survivors.append(name)
    behaviour = len(codes) - counts["equivalent"]
    score = (counts["killed"] + counts["timeouts"]) / behaviour if behaviour else 1.0
    out: dict[str, object] = {"mutants": len(codes), **counts, "score": round(score, 4)}
    out["seconds"] = round(time.monotonic() - started, 1)
    out["survivors"] = survivors
    if stale:
        out["stale_equivalents"] = stale
    if killed_equivalents:
        out["killed_but_marked_equivalent"] = killed_equivalents
    out["tests"] = tests
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("modules", nargs="*", help="paths under extproc/, e.g. router/queue.py (default all)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results of these modules")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests")
    parser.add_argument("--ref", help="measure this commit (git archive) instead of the working tree")
    parser.add_argument(
        "--report", action="store_true", help="count the last run's results again (after EQUIVALENT changed)"
    )
    args = parser.parse_args()
    if args.list:
        print(json.dumps(MODULES, indent=2))
        return 0
    bad = {c for table in EQUIVALENT.values() for _, c, _ in table.values()} - set(EQUIVALENT_CLASSES)
    if bad:
        parser.error(f"EQUIVALENT uses classes not in EQUIVALENT_CLASSES: {sorted(bad)}")
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {sorted(MODULES)}")
    source = None if args.report else _source(args.ref)
    results = {m: _measure(m, MODULES[m], args.jobs, args.fresh, source) for m in args.modules or MODULES}
    detected = behaviour = 0
    for r in results.values():
        if "score" in r:
            detected += int(str(r["killed"])) + int(str(r["timeouts"]))
            behaviour += int(str(r["mutants"])) - int(str(r["equivalent"]))
    total = {"score": round(detected / behaviour, 4) if behaviour else None, "behaviour_changing": behaviour}
    measured = "the last run" if args.report else args.ref or "working tree"
    print(
        json.dumps({"measured": measured, "modules": results, "total": total}, indent=2, ensure_ascii=False)
    )
    return 0 if all("score" in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
