"""Every fuzz target, by name: what `benchmarks/fuzz.py` runs (a test checks none is missing)."""

from __future__ import annotations

import importlib

from tests.fuzz.harness import Target

TARGET_MODULES: dict[str, str] = {
    "request": "tests.fuzz.test_request_fuzz",
    "vllm_events": "tests.fuzz.test_vllm_fuzz",
    "dynamo_events": "tests.fuzz.test_dynamo_fuzz",
    "snapshots": "tests.fuzz.test_snapshot_fuzz",
    "replica_sync": "tests.fuzz.test_replica_sync_fuzz",
    "group_api": "tests.fuzz.test_group_api_fuzz",
    "admin_api": "tests.fuzz.test_admin_fuzz",
    "ext_proc": "tests.fuzz.test_ext_proc_fuzz",
    "config_yaml": "tests.fuzz.test_config_fuzz",
    "inference_resources": "tests.fuzz.test_inference_resources_fuzz",
    "paths": "tests.fuzz.test_path_fuzz",
    "trailers": "tests.fuzz.test_trailers_fuzz",
    "sessions": "tests.fuzz.test_session_fuzz",
}


def load(name: str) -> Target:
    """The target called `name` (KeyError for an unknown one)."""
    target = importlib.import_module(TARGET_MODULES[name]).TARGET
    assert isinstance(target, Target) and target.name == name
    return target
