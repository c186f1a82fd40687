"""The router's settings: Dynamo's router flags (and every other spelling accepted) -> `RouterConfig`.

Flag names are Dynamo's frontend's (`--router-mode`, `--router-temperature`, ...); each feeds the
`RouterConfig` field (extproc/router/config.py) named beside it in `read_router`, which also does the
range checks and names the field in its messages. The file section is `router:`. Every spelling of
Dynamo's router guides is accepted (tests/config/test_dynamo_flags.py reads the guides):

    --router-kv-overlap-score-weight  also --kv-overlap-score-weight (flag, DYN_ variable, file key)
    --router-kv-events                also the flag --kv-events (and --no-kv-events), the variables
                                      DYN_ROUTER_USE_KV_EVENTS and DYN_KV_EVENTS
    --router-cuda-to-cpu-ratio        also DYN_ENCODER_CUDA_TO_CPU_RATIO
    --kv-cache-block-size             also --router-block-size (the standalone router's)
    --router-ttl-secs                 also --router-ttl (the older guides')
    --[no-]router-track-active-blocks also --[no-]track-active-blocks (the older guides')
    --[no-]router-assume-kv-reuse     also --[no-]assume-kv-reuse (the older guides')
    --active-decode-blocks-threshold  also --busy-threshold (the older guides' single threshold)
    --router-mode round-robin         also the value round_robin

Tiered KV: --router-host-cache-hit-weight and --router-disk-cache-hit-weight (Dynamo's, with their
DYN_ variables) credit offloaded blocks (extproc/router/tiers.py); approximate mode knows none, and
startup says so when they are given without KV events.

Knobs accepted and reported rather than applied, each in one line at startup (`router_notices`):
--router-event-threads above 1 (the indexer is single-threaded) and the --aic-* flags (they choose
AIConfigurator's database, which cannot run here: --router-prefill-load-model aic predicts each
prefill's duration from the pass-time model instead, and startup says so). Refused, with a message
naming what is accepted: aic without --router-track-prefill-tokens and a queue threshold of 0 or
below (both as Dynamo refuses them).
"""

from __future__ import annotations

from typing import Any

from extproc.config.options import ConfigError, Option, Reader, _float_or_none, _int_or_none, check_positive
from extproc.router import PrefillLoadModel, QueueFairness, QueuePolicy, RouterConfig, RouterMode
from extproc.router.errors import InvalidConfig

SECTION = "router"


def _router_mode(text: str) -> str:
    """A --router-mode word; Dynamo's older spelling round_robin is round-robin."""
    return "round-robin" if text == "round_robin" else text


ROUTER_MODE = Option(
    "--router-mode",
    _router_mode,
    "kv",
    "How to choose a worker: kv (cache overlap and load), round-robin (also round_robin), random, or "
    "device-aware-weighted (share requests between cuda and cpu workers by their throughput ratio, "
    "then choose within a class by kv rules).",
    choices=("kv", "round-robin", "random", "device-aware-weighted"),
)
ROUTER_CUDA_TO_CPU_RATIO = Option(
    "--router-cuda-to-cpu-ratio",
    float,
    8.0,
    "device-aware-weighted: throughput of one accelerator worker over one cpu worker, both "
    "measured at the same latency target; under load each accelerator worker holds this many "
    "requests in flight for each one a cpu worker holds (an idle pool uses the accelerators). "
    "Also read from DYN_ENCODER_CUDA_TO_CPU_RATIO.",
    env_aliases=("DYN_ENCODER_CUDA_TO_CPU_RATIO",),
)
KV_OVERLAP_SCORE_WEIGHT = Option(
    "--router-kv-overlap-score-weight",
    float,
    1.0,
    "Weight of prefill cost against decode load. Higher favours cache hits (TTFT), lower favours "
    "balance (ITL); 0 = pure load balancing, no indexer lookups.",
    aliases=("--kv-overlap-score-weight",),
    dest="kv_overlap_score_weight",
)
ROUTER_TEMPERATURE = Option(
    "--router-temperature",
    float,
    0.0,
    "Softmax sampling temperature over normalised costs; 0 always takes the cheapest worker.",
)
KV_CACHE_BLOCK_SIZE = Option(
    "--kv-cache-block-size",
    int,
    16,
    "Engine KV block size in tokens; must equal the engine's (vLLM default 16) or no prefix ever matches. "
    "Also --router-block-size (Dynamo's standalone router).",
    aliases=("--router-block-size",),
)
ROUTER_KV_EVENTS: Option[bool | None] = Option(
    "--router-kv-events",
    bool,
    None,
    "Use KV events from the engines for exact "
    "cache state. --no-router-kv-events (alias --no-kv-events) predicts the cache from the router's "
    "own decisions instead (TTL + pruning). Default: events when an event source is configured.",
    cli_aliases=("--kv-events",),
    env_aliases=("DYN_ROUTER_USE_KV_EVENTS", "DYN_KV_EVENTS"),
)
ROUTER_TTL_SECS = Option(
    "--router-ttl-secs",
    float,
    120.0,
    "Without KV events: seconds a routed prefix is assumed cached. Also --router-ttl.",
    aliases=("--router-ttl",),
)
ROUTER_MAX_TREE_SIZE = Option(
    "--router-max-tree-size",
    int,
    2**20,
    "Without KV events: (worker, block) entries before pruning least recently used ones.",
)
ROUTER_PRUNE_TARGET_RATIO = Option(
    "--router-prune-target-ratio",
    float,
    0.8,
    "Without KV events: prune down to this fraction of the maximum tree size.",
)
ROUTER_ASSUME_KV_REUSE = Option(
    "--router-assume-kv-reuse",
    bool,
    True,
    "Count blocks shared by in-flight requests on a worker once (engines with prefix caching). "
    "Also --[no-]assume-kv-reuse.",
    aliases=("--assume-kv-reuse",),
)
ROUTER_TRACK_ACTIVE_BLOCKS = Option(
    "--router-track-active-blocks",
    bool,
    True,
    "Track decode blocks of in-flight requests. Also --[no-]track-active-blocks.",
    aliases=("--track-active-blocks",),
)
ROUTER_TRACK_PREFILL_TOKENS = Option(
    "--router-track-prefill-tokens",
    bool,
    True,
    "Track prefill tokens of requests whose first token has not arrived.",
)
ROUTER_TRACK_OUTPUT_BLOCKS = Option(
    "--router-track-output-blocks",
    bool,
    False,
    "Add placeholder blocks as output is generated: the picker counts the tokens of each response "
    "(SSE chunks or usage) and decays them toward nvext.agent_hints.osl (else max_tokens).",
)
ACTIVE_DECODE_BLOCKS_THRESHOLD = Option(
    "--active-decode-blocks-threshold",
    _float_or_none,
    None,
    "Busy when active decode blocks exceed this fraction of the worker's KV cache. Also --busy-threshold "
    "(the older guides' single threshold, the same fraction).",
    aliases=("--busy-threshold",),
)
ACTIVE_PREFILL_TOKENS_THRESHOLD = Option(
    "--active-prefill-tokens-threshold",
    _int_or_none,
    None,
    "Busy when active prefill tokens exceed this count.",
)
ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC = Option(
    "--active-prefill-tokens-threshold-frac",
    _float_or_none,
    None,
    "Busy when active prefill tokens exceed this fraction of max_num_batched_tokens.",
)
ROUTER_QUEUE_THRESHOLD = Option(
    "--router-queue-threshold",
    _float_or_none,
    None,
    "Admission queue: hold a request while every eligible worker has more active prefill tokens "
    "than this fraction of its max_num_batched_tokens; release when one drops to it. Must be > 0; off "
    "when unset or none.",
)
ROUTER_QUEUE_POLICY = Option(
    "--router-queue-policy",
    str,
    "fcfs",
    "Order of the admission queue: fcfs (arrival, moved up by priority), lcfs (newest first) or "
    "wspt (highest (1 + priority) / prompt length first).",
    choices=("fcfs", "lcfs", "wspt"),
)
ROUTER_QUEUE_FAIRNESS = Option(
    "--router-queue-fairness",
    str,
    "global-strict",
    "Between the flows of one priority in the admission queue (a flow: the requests of one "
    "x-gateway-inference-fairness-id header, a tenant's): global-strict (every request in policy "
    "order, whatever its flow) or round-robin (the flows take turns, the one served longest ago "
    "first), as the Inference Extension's flow control policies.",
    choices=("global-strict", "round-robin"),
)
ROUTER_PREFILL_LOAD_MODEL = Option(
    "--router-prefill-load-model",
    str,
    "timing",
    "How a routed prompt loads its worker until its first token: timing (the default) predicts its "
    "time to first token on each worker from the pass-time model (--router-prefill-timing) and lets "
    "the load decay as that time passes; none counts its tokens until the first token (Dynamo's "
    "exact behaviour); aic (Dynamo's) decays only the oldest active prefill on each worker, linearly over "
    "the duration the pass-time model predicts for it at admission (AIConfigurator's database, which "
    "Dynamo asks, cannot run here); it requires --router-track-prefill-tokens.",
    choices=("none", "timing", "aic"),
)
ROUTER_PREFILL_TIMING: Option[str | None] = Option(
    "--router-prefill-timing",
    str,
    None,
    "With --router-prefill-load-model timing: the workers' pass-time polynomials A,B,C[,D2,D1,D0] "
    "(prefill ms = A T^2 + B T + C for T uncached tokens; decode ms = D2 u^2 + D1 u + D0 for KV "
    "usage u). Default: the Dynamo mocker's (REFERENCE section 6); fit your engine's pass times.",
)
ROUTER_LEARN_PREFILL_TIMING = Option(
    "--router-learn-prefill-timing",
    bool,
    True,
    "With --router-prefill-load-model timing: learn each worker's pass-time scale online from its first "
    "tokens against the predictions (a mixed fleet, a model fitted elsewhere); a worker departs from the "
    "fleet's common scale only when its own evidence is significant. --no-router-learn-prefill-timing "
    "predicts every worker with the configured model.",
)
ROUTER_HOST_CACHE_HIT_WEIGHT = Option(
    "--router-host-cache-hit-weight",
    float,
    0.75,
    "Tiered KV: credit of a prompt block a worker holds offloaded in host memory (vLLM's CPU "
    "offloading, SGLang's HiCache, KVBM), as a fraction of a device block's, 0 to 1 (Dynamo's). The "
    "engines report such blocks as KV events of another medium; without KV events none are known.",
)
ROUTER_DISK_CACHE_HIT_WEIGHT = Option(
    "--router-disk-cache-hit-weight",
    float,
    0.25,
    "Tiered KV: credit of a prompt block a worker holds on disk or in an external store, as a "
    "fraction of a device block's, 0 to 1 (Dynamo's).",
)
ROUTER_LOG_FORMULA = Option(
    "--router-log-formula", bool, False, "Log the cost formula of every worker for every decision."
)
ROUTER_EVENT_THREADS = Option(
    "--router-event-threads",
    int,
    1,
    "Dynamo's KV indexer threads. Accepted; the picker's indexer is single-threaded (events are applied "
    "on the event loop), Dynamo's 1: TTL and pruning keep applying whatever the value (in Dynamo, more "
    "than 1 turns them off). Startup says so for more than 1.",
)


def _aic(flag: str, kind: Any, what: str) -> Option[Any]:
    return Option(
        flag,
        kind,
        None,
        f"Dynamo's aic prefill load model: {what}, for AIConfigurator's database. Accepted, no meaning "
        "here: aic predicts from the pass-time model (startup says so).",
    )


AIC_OPTIONS: tuple[Option[Any], ...] = (
    _aic("--aic-backend", str, "the modeled engine (vllm, sglang, trtllm)"),
    _aic("--aic-system", str, "the GPU system (h200_sxm, ...)"),
    _aic("--aic-model-path", str, "the model"),
    _aic("--aic-backend-version", str, "the AIC database version"),
    _aic("--aic-tp-size", _int_or_none, "tensor-parallel size"),
    _aic("--aic-moe-tp-size", _int_or_none, "MoE tensor-parallel size"),
    _aic("--aic-moe-ep-size", _int_or_none, "MoE expert-parallel size"),
    _aic("--aic-attention-dp-size", _int_or_none, "attention data-parallel size"),
)

ROUTER_OPTIONS: tuple[Option[Any], ...] = (
    ROUTER_MODE,
    ROUTER_CUDA_TO_CPU_RATIO,
    KV_OVERLAP_SCORE_WEIGHT,
    ROUTER_TEMPERATURE,
    KV_CACHE_BLOCK_SIZE,
    ROUTER_KV_EVENTS,
    ROUTER_TTL_SECS,
    ROUTER_MAX_TREE_SIZE,
    ROUTER_PRUNE_TARGET_RATIO,
    ROUTER_ASSUME_KV_REUSE,
    ROUTER_TRACK_ACTIVE_BLOCKS,
    ROUTER_TRACK_PREFILL_TOKENS,
    ROUTER_TRACK_OUTPUT_BLOCKS,
    ACTIVE_DECODE_BLOCKS_THRESHOLD,
    ACTIVE_PREFILL_TOKENS_THRESHOLD,
    ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC,
    ROUTER_QUEUE_THRESHOLD,
    ROUTER_QUEUE_POLICY,
    ROUTER_QUEUE_FAIRNESS,
    ROUTER_PREFILL_LOAD_MODEL,
    ROUTER_PREFILL_TIMING,
    ROUTER_LEARN_PREFILL_TIMING,
    ROUTER_HOST_CACHE_HIT_WEIGHT,
    ROUTER_DISK_CACHE_HIT_WEIGHT,
    ROUTER_LOG_FORMULA,
    ROUTER_EVENT_THREADS,
    *AIC_OPTIONS,
)


def read_router(reader: Reader, *, kv_events_source: bool) -> RouterConfig:
    """The router's config. KV events default to on when `kv_events_source` (some event source is
    configured). Raises ConfigError naming the RouterConfig field, the value and what is accepted."""
    read = reader.read
    # read in ROUTER_OPTIONS order, so that of two bad values the first one listed is the one named
    mode = read(ROUTER_MODE)
    cuda_to_cpu_ratio = read(ROUTER_CUDA_TO_CPU_RATIO)
    overlap_score_weight = read(KV_OVERLAP_SCORE_WEIGHT)
    temperature = read(ROUTER_TEMPERATURE)
    block_size = read(KV_CACHE_BLOCK_SIZE)
    use_kv_events = read(ROUTER_KV_EVENTS)
    ttl_secs = read(ROUTER_TTL_SECS)
    max_tree_size = read(ROUTER_MAX_TREE_SIZE)
    prune_target_ratio = read(ROUTER_PRUNE_TARGET_RATIO)
    assume_kv_reuse = read(ROUTER_ASSUME_KV_REUSE)
    track_active_blocks = read(ROUTER_TRACK_ACTIVE_BLOCKS)
    track_prefill_tokens = read(ROUTER_TRACK_PREFILL_TOKENS)
    track_output_blocks = read(ROUTER_TRACK_OUTPUT_BLOCKS)
    decode_blocks_threshold = read(ACTIVE_DECODE_BLOCKS_THRESHOLD)
    prefill_tokens_threshold = read(ACTIVE_PREFILL_TOKENS_THRESHOLD)
    prefill_tokens_threshold_frac = read(ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC)
    queue_threshold = read(ROUTER_QUEUE_THRESHOLD)
    queue_policy = read(ROUTER_QUEUE_POLICY)
    queue_fairness = read(ROUTER_QUEUE_FAIRNESS)
    prefill_load_model = read(ROUTER_PREFILL_LOAD_MODEL)
    prefill_timing = read(ROUTER_PREFILL_TIMING)
    learn_prefill_timing = read(ROUTER_LEARN_PREFILL_TIMING)
    host_cache_hit_weight = read(ROUTER_HOST_CACHE_HIT_WEIGHT)
    disk_cache_hit_weight = read(ROUTER_DISK_CACHE_HIT_WEIGHT)
    log_formula = read(ROUTER_LOG_FORMULA)
    check_positive("router-event-threads", read(ROUTER_EVENT_THREADS))
    for opt in AIC_OPTIONS:  # checked for their type only: router_notices says they are ignored
        read(opt)
    if queue_threshold is not None and not queue_threshold > 0:
        raise ConfigError(
            f"invalid router-queue-threshold={queue_threshold}: expected > 0 (as Dynamo requires), "
            "or none to turn the queue off"
        )
    if prefill_load_model == "aic" and not track_prefill_tokens:
        raise ConfigError(
            "invalid router-prefill-load-model='aic' with --no-router-track-prefill-tokens: aic decays "
            "the prompt load it tracks (Dynamo: router_prefill_load_model requires "
            "router_track_prefill_tokens=true); use none, or track prefill tokens"
        )
    # the words are among the options' choices (argparse and `convert` check them), which are the enums'
    # values; RouterConfig parses the timing text and checks the rest, naming the field it refuses
    timing: dict[str, Any] = {} if prefill_timing is None else {"prefill_timing": prefill_timing}
    try:
        return RouterConfig(
            mode=RouterMode(mode),
            cuda_to_cpu_ratio=cuda_to_cpu_ratio,
            overlap_score_weight=overlap_score_weight,
            temperature=temperature,
            block_size=block_size,
            use_kv_events=kv_events_source if use_kv_events is None else use_kv_events,
            router_ttl_secs=ttl_secs,
            router_max_tree_size=max_tree_size,
            router_prune_target_ratio=prune_target_ratio,
            router_assume_kv_reuse=assume_kv_reuse,
            router_track_active_blocks=track_active_blocks,
            router_track_prefill_tokens=track_prefill_tokens,
            router_track_output_blocks=track_output_blocks,
            active_decode_blocks_threshold=decode_blocks_threshold,
            active_prefill_tokens_threshold=prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac=prefill_tokens_threshold_frac,
            router_queue_threshold=queue_threshold,
            router_queue_policy=QueuePolicy(queue_policy),
            router_queue_fairness=QueueFairness(queue_fairness),
            prefill_load_model=PrefillLoadModel(prefill_load_model),
            learn_prefill_timing=learn_prefill_timing,
            host_cache_hit_weight=host_cache_hit_weight,
            disk_cache_hit_weight=disk_cache_hit_weight,
            log_formula=log_formula,
            **timing,
        )
    except InvalidConfig as exc:
        raise ConfigError(str(exc)) from exc


def router_notices(reader: Reader, *, kv_events: bool = True) -> tuple[str, ...]:
    """One line per router knob that is accepted but does nothing here (or less than in Dynamo), for
    the log at startup; read after `read_router` accepted the values. `kv_events`: whether the router
    uses KV events (else the tier credits have no effect)."""
    notices: list[str] = []
    threads = reader.read(ROUTER_EVENT_THREADS)
    if threads > 1:
        notices.append(
            f"{reader.source(ROUTER_EVENT_THREADS)}={threads}: the picker's KV indexer is single-threaded "
            "(Dynamo's 1); unlike Dynamo with more than 1, TTL and pruning (--router-ttl-secs, "
            "--router-max-tree-size, --router-prune-target-ratio) still apply"
        )
    tier_flags = [
        str(s) for s in map(reader.source, (ROUTER_HOST_CACHE_HIT_WEIGHT, ROUTER_DISK_CACHE_HIT_WEIGHT)) if s
    ]
    if tier_flags and not kv_events:
        notices.append(
            f"{', '.join(tier_flags)}: no effect without KV events (approximate mode): offloaded KV (host "
            "memory, disk) is known only from the engines' KV events, so no tier is credited"
        )
    aic = [str(reader.source(opt)) for opt in AIC_OPTIONS if reader.source(opt) is not None]
    model = reader.read(ROUTER_PREFILL_LOAD_MODEL)
    if model == "aic":
        learned = ", scaled per worker as learned" if reader.read(ROUTER_LEARN_PREFILL_TIMING) else ""
        unused = f"; {', '.join(aic)}: accepted from Dynamo, no meaning here" if aic else ""
        notices.append(
            "--router-prefill-load-model aic: each prefill's expected duration comes from the pass-time "
            f"model (--router-prefill-timing{learned}), not from AIConfigurator's database, which cannot "
            f"run here (the --aic-* flags choose it){unused}"
        )
    elif aic:
        notices.append(
            f"{', '.join(aic)}: accepted from Dynamo, no effect here: they configure the aic prefill load "
            f"model (--router-prefill-load-model is {model})"
        )
    return tuple(notices)
