from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouterOverrides(_message.Message):
    __slots__ = ("overlap_score_weight", "temperature")
    OVERLAP_SCORE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    overlap_score_weight: float
    temperature: float
    def __init__(self, overlap_score_weight: _Optional[float] = ..., temperature: _Optional[float] = ...) -> None: ...

class EndpointList(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, endpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class RoutingRequest(_message.Message):
    __slots__ = ("model", "token_ids", "lora_name", "overrides", "expected_output_tokens", "restrictions", "isl", "cache_salt")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESTRICTIONS_FIELD_NUMBER: _ClassVar[int]
    ISL_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    model: str
    token_ids: bytes
    lora_name: str
    overrides: RouterOverrides
    expected_output_tokens: int
    restrictions: _containers.RepeatedCompositeFieldContainer[EndpointList]
    isl: int
    cache_salt: str
    def __init__(self, model: _Optional[str] = ..., token_ids: _Optional[bytes] = ..., lora_name: _Optional[str] = ..., overrides: _Optional[_Union[RouterOverrides, _Mapping]] = ..., expected_output_tokens: _Optional[int] = ..., restrictions: _Optional[_Iterable[_Union[EndpointList, _Mapping]]] = ..., isl: _Optional[int] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ("worker_id", "dp_rank")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    dp_rank: int
    def __init__(self, worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ...) -> None: ...

class GroupLoad(_message.Message):
    __slots__ = ("workers", "active_requests", "active_prefill_tokens", "active_decode_blocks")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_DECODE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    workers: int
    active_requests: int
    active_prefill_tokens: int
    active_decode_blocks: float
    def __init__(self, workers: _Optional[int] = ..., active_requests: _Optional[int] = ..., active_prefill_tokens: _Optional[int] = ..., active_decode_blocks: _Optional[float] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("worker", "endpoint", "headers", "overlap_blocks", "request_blocks", "cost", "best_overlap_blocks", "prefill_worker", "prefill_endpoint", "predicted_ttft_ms")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    BEST_OVERLAP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    worker: Worker
    endpoint: str
    headers: _containers.ScalarMap[str, str]
    overlap_blocks: int
    request_blocks: int
    cost: float
    best_overlap_blocks: int
    prefill_worker: Worker
    prefill_endpoint: str
    predicted_ttft_ms: float
    def __init__(self, worker: _Optional[_Union[Worker, _Mapping]] = ..., endpoint: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., overlap_blocks: _Optional[int] = ..., request_blocks: _Optional[int] = ..., cost: _Optional[float] = ..., best_overlap_blocks: _Optional[int] = ..., prefill_worker: _Optional[_Union[Worker, _Mapping]] = ..., prefill_endpoint: _Optional[str] = ..., predicted_ttft_ms: _Optional[float] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: RoutingRequest
    def __init__(self, request: _Optional[_Union[RoutingRequest, _Mapping]] = ...) -> None: ...

class ProbeResponse(_message.Message):
    __slots__ = ("choice", "load", "block_size", "saturated")
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    SATURATED_FIELD_NUMBER: _ClassVar[int]
    choice: Choice
    load: GroupLoad
    block_size: int
    saturated: bool
    def __init__(self, choice: _Optional[_Union[Choice, _Mapping]] = ..., load: _Optional[_Union[GroupLoad, _Mapping]] = ..., block_size: _Optional[int] = ..., saturated: _Optional[bool] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("request", "request_id", "probed_worker", "owner", "owner_seq", "lease_s")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROBED_WORKER_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    OWNER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    request: RoutingRequest
    request_id: str
    probed_worker: Worker
    owner: str
    owner_seq: int
    lease_s: float
    def __init__(self, request: _Optional[_Union[RoutingRequest, _Mapping]] = ..., request_id: _Optional[str] = ..., probed_worker: _Optional[_Union[Worker, _Mapping]] = ..., owner: _Optional[str] = ..., owner_seq: _Optional[int] = ..., lease_s: _Optional[float] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("choice", "request_id", "redecided")
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REDECIDED_FIELD_NUMBER: _ClassVar[int]
    choice: Choice
    request_id: str
    redecided: bool
    def __init__(self, choice: _Optional[_Union[Choice, _Mapping]] = ..., request_id: _Optional[str] = ..., redecided: _Optional[bool] = ...) -> None: ...

class LifecycleRequest(_message.Message):
    __slots__ = ("model", "request_id", "status", "after_first_token")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    model: str
    request_id: str
    status: int
    after_first_token: bool
    def __init__(self, model: _Optional[str] = ..., request_id: _Optional[str] = ..., status: _Optional[int] = ..., after_first_token: _Optional[bool] = ...) -> None: ...

class LifecycleResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class OutputTokensRequest(_message.Message):
    __slots__ = ("model", "request_id", "tokens", "sequences")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    model: str
    request_id: str
    tokens: int
    sequences: int
    def __init__(self, model: _Optional[str] = ..., request_id: _Optional[str] = ..., tokens: _Optional[int] = ..., sequences: _Optional[int] = ...) -> None: ...

class PotentialLoadsRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: RoutingRequest
    def __init__(self, request: _Optional[_Union[RoutingRequest, _Mapping]] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("worker", "endpoint", "prefill_tokens", "decode_blocks", "overlap_blocks", "overlap_credit")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_CREDIT_FIELD_NUMBER: _ClassVar[int]
    worker: Worker
    endpoint: str
    prefill_tokens: int
    decode_blocks: float
    overlap_blocks: int
    overlap_credit: float
    def __init__(self, worker: _Optional[_Union[Worker, _Mapping]] = ..., endpoint: _Optional[str] = ..., prefill_tokens: _Optional[int] = ..., decode_blocks: _Optional[float] = ..., overlap_blocks: _Optional[int] = ..., overlap_credit: _Optional[float] = ...) -> None: ...

class PotentialLoadsResponse(_message.Message):
    __slots__ = ("loads", "load", "block_size")
    LOADS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    loads: _containers.RepeatedCompositeFieldContainer[WorkerLoad]
    load: GroupLoad
    block_size: int
    def __init__(self, loads: _Optional[_Iterable[_Union[WorkerLoad, _Mapping]]] = ..., load: _Optional[_Union[GroupLoad, _Mapping]] = ..., block_size: _Optional[int] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("owner", "lease_s", "live", "up_to_seq")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    UP_TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    owner: str
    lease_s: float
    live: _containers.RepeatedScalarFieldContainer[str]
    up_to_seq: int
    def __init__(self, owner: _Optional[str] = ..., lease_s: _Optional[float] = ..., live: _Optional[_Iterable[str]] = ..., up_to_seq: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("freed",)
    FREED_FIELD_NUMBER: _ClassVar[int]
    freed: int
    def __init__(self, freed: _Optional[int] = ...) -> None: ...
