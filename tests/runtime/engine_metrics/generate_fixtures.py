"""Records the /metrics fixtures beside this file from vLLM 0.33.0's and SGLang 0.5.23's own code.

Run from the repository root with any Python holding prometheus_client (the project's venv will do;
nothing from the wheels is committed, only this script and the text it writes):

    .venv/bin/python tests/runtime/engine_metrics/generate_fixtures.py [--cache DIR] [--check]

What it does:

1. `pip download --no-deps vllm==0.33.0 sglang==0.5.23` into `--cache` (default
   /tmp/engine-metrics-wheels; wheels already there are reused) and extracts the metric modules:
   vLLM's vllm/v1/metrics/{loggers,stats,utils,buckets,prometheus,cache_hit_source}.py, SGLang's
   sglang/srt/observability/{metrics_collector,utils}.py.
2. Loads them from the extracted files; every other module they import is a stub whose names are
   MagicMocks (vLLM's spec-decode, connector and perf Prometheus helpers, SGLang's runtime context,
   server args...). The Prometheus metric objects are the engines' own: vLLM's
   `PrometheusStatLogger(vllm_config, engine_indexes)` and its `record(scheduler_stats=...)`,
   SGLang's `SchedulerMetricsCollector(labels, server_args)` and its `log_stats(SchedulerStats)`,
   with the labels SGLang's `create_context` builds (model_name, engine_type, tp_rank, pp_rank,
   moe_ep_rank; priority="" with priority scheduling; dp_rank with DP attention).
3. Renders `prometheus_client.generate_latest` of each engine's registry (`_created` samples pinned
   to one timestamp) to `<engine>-<version>/<case>.prom` and writes `manifest.json`: per file, the
   numbers each engine was given (per engine index or dp rank), which the parser must read back.

`--check` only regenerates into memory and fails when a committed file differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any
from unittest import mock

HERE = Path(__file__).resolve().parent
VLLM_VERSION, SGLANG_VERSION = "0.33.0", "0.5.23"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CREATED = 1767225600.0  # every `_created` sample

VLLM_FILES = {
    "vllm.v1.metrics.buckets": "vllm/v1/metrics/buckets.py",
    "vllm.v1.metrics.utils": "vllm/v1/metrics/utils.py",
    "vllm.v1.metrics.cache_hit_source": "vllm/v1/metrics/cache_hit_source.py",
    "vllm.v1.metrics.stats": "vllm/v1/metrics/stats.py",
    "vllm.v1.metrics.loggers": "vllm/v1/metrics/loggers.py",
}
SGLANG_FILES = {
    "sglang.srt.observability.utils": "sglang/srt/observability/utils.py",
    "sglang.srt.observability.metrics_collector": "sglang/srt/observability/metrics_collector.py",
}

# What each engine is told, per engine index (vLLM) or dp rank (SGLang): kv usage, running, waiting.
VLLM_CASES: dict[str, dict[int, tuple[float, int, int]]] = {
    "single-engine": {0: (0.95, 7, 3)},
    "data-parallel-2": {0: (0.25, 2, 0), 1: (0.875, 11, 4)},
}
SGLANG_CASES: dict[str, dict[str, Any]] = {
    "default": {"ranks": {None: (0.95, 7, 3)}, "priority": False},
    "priority-scheduling": {"ranks": {None: (0.5, 6, 5)}, "priority": True},
    "dp-attention-2": {"ranks": {0: (0.125, 1, 0), 1: (0.75, 9, 2)}, "priority": False},
}


class _Stub(types.ModuleType):
    """A module whose every name is a MagicMock (what the engines import but need not run)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder:
    """Stubs every module under `prefixes` that is not loaded from the wheel."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.prefixes:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Stub(spec.name)
        module.__path__ = []  # a package, so that submodules resolve to stubs too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


ENGINES = (("vllm", VLLM_VERSION), ("sglang", SGLANG_VERSION))


def _wheels(cache: Path) -> dict[str, Path]:
    cache.mkdir(parents=True, exist_ok=True)
    found = {n: next(cache.glob(f"{n}-{v}-*.whl"), None) for n, v in ENGINES}
    if not all(found.values()):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(cache),
             f"vllm=={VLLM_VERSION}", f"sglang=={SGLANG_VERSION}"],
            check=True,
        )  # fmt: skip
        found = {n: next(cache.glob(f"{n}-{v}-*.whl")) for n, v in ENGINES}
    return {n: p for n, p in found.items() if p is not None}


def _load(wheel: Path, files: dict[str, str]) -> dict[str, types.ModuleType]:
    """Load `files` from `wheel`, in order, as the named modules."""
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        for name, member in files.items():
            source = zf.read(member).decode()
            module = types.ModuleType(name)
            module.__file__ = f"{wheel.name}/{member}"
            sys.modules[name] = module
            exec(compile(source, module.__file__, "exec"), module.__dict__)  # the engine's own code
            out[name] = module
    return out


def _vllm(wheel: Path) -> dict[str, str]:
    envs = _Stub("vllm.envs")
    envs.VLLM_COMPUTE_NANS_IN_LOGITS = False
    sys.modules["vllm.envs"] = envs
    importlib.import_module("vllm").envs = envs  # `import vllm.envs as envs` reads the package's attribute
    logger = _Stub("vllm.logger")
    logger.init_logger = lambda name: __import__("logging").getLogger(name)
    sys.modules["vllm.logger"] = logger
    modules = _load(wheel, VLLM_FILES)
    loggers, stats = modules["vllm.v1.metrics.loggers"], modules["vllm.v1.metrics.stats"]
    loggers.unregister_vllm_metrics = _unregister_all  # its own only unregisters vllm: collectors
    out = {}
    for case, engines in VLLM_CASES.items():
        _unregister_all()
        config = mock.MagicMock()
        config.model_config.served_model_name = MODEL
        config.model_config.max_model_len = 8192
        config.model_config.is_diffusion = False
        config.observability_config.show_hidden_metrics = False
        config.observability_config.kv_cache_metrics = False
        config.observability_config.custom_histogram_buckets = None
        config.observability_config.cudagraph_metrics = False
        config.observability_config.enable_mfu_metrics = False
        config.speculative_config = None
        config.kv_transfer_config = None
        config.ec_transfer_config = None
        config.watermark_config = None
        config.lora_config = None
        config.cache_config.num_gpu_blocks = 16384
        config.cache_config.metrics_info = lambda: {"block_size": "16", "num_gpu_blocks": "16384"}
        logger_ = loggers.PrometheusStatLogger(config, engine_indexes=list(engines))
        for idx, (usage, running, waiting) in engines.items():
            logger_.record(
                scheduler_stats=stats.SchedulerStats(
                    num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage
                ),
                iteration_stats=None,
                engine_idx=idx,
            )
        out[case] = _render()
    return out


def _sglang(wheel: Path) -> dict[str, str]:
    context = _Stub("sglang.srt.runtime_context")
    schedule = types.SimpleNamespace(
        prefill_delayer_max_delay_passes=30,  # only shapes a histogram's buckets
        prefill_delayer_forward_passes_buckets=None,
        prefill_delayer_wait_seconds_buckets=None,
    )
    context.get_schedule = lambda: schedule
    sys.modules["sglang.srt.runtime_context"] = context
    modules = _load(wheel, SGLANG_FILES)
    collector_module = modules["sglang.srt.observability.metrics_collector"]
    out = {}
    for case, spec in SGLANG_CASES.items():
        _unregister_all()
        collectors = {}
        for rank in spec["ranks"]:
            labels: dict[str, Any] = {
                "model_name": MODEL, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0,
            }  # fmt: skip
            if spec["priority"]:
                labels["priority"] = ""
            if rank is not None:
                labels["dp_rank"] = rank
            server_args = mock.MagicMock()
            server_args.bucket_time_to_first_token = None
            server_args.bucket_inter_token_latency = None
            server_args.bucket_e2e_request_latency = None
            if collectors:
                collectors[rank] = _relabel(collectors, labels)
            else:
                collectors[rank] = collector_module.SchedulerMetricsCollector(
                    labels=labels, server_args=server_args
                )
        for rank, (usage, running, waiting) in spec["ranks"].items():
            by_priority_running = {0: running - running // 2, 1: running // 2} if spec["priority"] else None
            by_priority_waiting = {0: waiting - waiting // 2, 1: waiting // 2} if spec["priority"] else None
            stats_ = collector_module.SchedulerStats(
                num_running_reqs=collector_module.QueueCount(running, by_priority_running),
                num_queue_reqs=collector_module.QueueCount(waiting, by_priority_waiting),
                token_usage=usage,
            )
            collectors[rank].log_stats(stats_)
        out[case] = _render()
    return out


def _relabel(collectors: dict[Any, Any], labels: dict[str, Any]) -> Any:
    """A second scheduler (another dp rank) in the same process shares the metric objects, as
    SGLang's multiprocess collection merges them; only its labels differ."""
    first = next(iter(collectors.values()))
    clone = object.__new__(type(first))
    clone.__dict__.update(first.__dict__)
    clone.labels = labels
    clone._known_priorities = set()
    return clone


def _render() -> str:
    """The registry as a scrape answers it, with each `_created` timestamp pinned to CREATED so
    that the files reproduce (the engines serve them; only their values change run to run)."""
    import prometheus_client

    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    return re.sub(r"^(\S+_created(?:\{[^}\n]*\})?) \S+$", rf"\1 {CREATED!r}", text, flags=re.M)


def _unregister_all() -> None:
    import prometheus_client

    registry = prometheus_client.REGISTRY
    for collector in list(registry._collector_to_names):
        registry.unregister(collector)


def _manifest() -> dict[str, Any]:
    keys = ("kv_usage", "running", "waiting")
    vllm = {
        case: {str(i): dict(zip(keys, v, strict=True)) for i, v in engines.items()}
        for case, engines in VLLM_CASES.items()
    }
    sglang = {
        case: {
            ("" if r is None else str(r)): dict(zip(keys, v, strict=True)) for r, v in spec["ranks"].items()
        }
        for case, spec in SGLANG_CASES.items()
    }
    return {
        "vllm": {"version": VLLM_VERSION, "rank_label": "engine", "cases": vllm},
        "sglang": {"version": SGLANG_VERSION, "rank_label": "dp_rank", "cases": sglang},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/engine-metrics-wheels"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    wheels = _wheels(args.cache)
    sys.meta_path.append(_StubFinder(("vllm", "sglang", "msgspec")))
    files = {f"vllm-{VLLM_VERSION}/{c}.prom": t for c, t in _vllm(wheels["vllm"]).items()}
    files |= {f"sglang-{SGLANG_VERSION}/{c}.prom": t for c, t in _sglang(wheels["sglang"]).items()}
    files["manifest.json"] = json.dumps(_manifest(), indent=2, sort_keys=True) + "\n"
    stale = [n for n, text in files.items() if not (HERE / n).exists() or (HERE / n).read_text() != text]
    if args.check:
        if stale:
            sys.exit(f"differs from the engines' code: {', '.join(stale)}")
        print("fixtures match")
        return
    for name, text in files.items():
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_text(text)
    print(f"wrote {len(files)} files ({len(stale)} changed)")


if __name__ == "__main__":
    main()
