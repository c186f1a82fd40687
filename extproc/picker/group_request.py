"""A parsed request and its prompt's tokens -> the `GroupRequest` the router groups decide on.

What the pipeline hands the groups besides the tokens, read from the request and decided here once:
- the prompt limit (`--max-prompt-tokens`): a longer prompt is refused before any group sees it;
- a long prompt's ids as `PromptTokens`, so the router takes the block hashes of a prefix it hashed
  before from its prefix cache;
- the router overrides: none for a prompt that is routed on load alone (no overlap to weigh), else
  the body's `nvext.agent_hints` `kv_overlap_score_weight` and `temperature` (each a finite number
  at least 0; anything else is ignored), unless the caller gave overrides of its own;
- the expected output length: `agent_hints.osl` (a positive integer), else `max_tokens`;
- the prompt's length: its tokens, or for a prompt routed on load alone, its body's bytes / 4.
"""

from __future__ import annotations

from collections.abc import Sequence

from extproc.errors import PromptTooLong
from extproc.groups import GroupRequest
from extproc.request.parse import ParsedRequest
from extproc.router import RouterConfigOverride
from extproc.router.hashing import CHECKPOINT_TOKENS, PromptTokens

__all__ = ["group_request"]


def group_request(
    request: ParsedRequest,
    tokens: Sequence[int] | None,
    *,
    restrictions: list[list[str]],
    override: RouterConfigOverride | None,
    max_prompt_tokens: int | None,
) -> tuple[GroupRequest, int]:
    """The request for the groups, and its prompt's length in tokens (estimated when `tokens` is
    None: the prompt is routed on load alone). Raises `PromptTooLong` over `max_prompt_tokens`."""
    if max_prompt_tokens is not None and tokens is not None and len(tokens) > max_prompt_tokens:
        raise PromptTooLong(len(tokens), max_prompt_tokens)
    if tokens is not None and len(tokens) >= 2 * CHECKPOINT_TOKENS:
        tokens = _prompt_tokens(tokens)
    if tokens is None:
        override = _override(request, load_only=True)
    elif override is None:
        override = _override(request, load_only=False)
    isl = len(tokens) if tokens is not None else max(1, request.body_size // 4)
    grouped = GroupRequest(
        request.model,
        tokens or [],
        lora_name=request.lora_name,
        cache_salt=request.cache_salt,
        overrides=override,
        expected_output_tokens=_expected_output(request),
        restrictions=tuple(tuple(r) for r in restrictions) if restrictions else None,
        isl=None if tokens is not None else isl,
    )
    return grouped, isl


def _prompt_tokens(tokens: Sequence[int]) -> Sequence[int]:
    """A long prompt's ids as `PromptTokens`: the router then takes the block hashes of a prefix it
    hashed before (the earlier turns of a chat) from the prefix cache (`extproc.router.hashing`).
    An array is copied in C (about 10 us for 100k ids); a list costs what hashing would pay anyway.
    Ids outside uint32 stay as they are (hashing refuses them)."""
    if isinstance(tokens, PromptTokens):
        return tokens
    try:
        return PromptTokens("I", tokens)
    except (OverflowError, TypeError):
        return tokens


def _expected_output(request: ParsedRequest) -> int | None:
    osl = request.agent_hints.get("osl")
    if isinstance(osl, int) and not isinstance(osl, bool) and osl > 0:
        return osl
    return request.max_tokens


def _override(request: ParsedRequest, *, load_only: bool) -> RouterConfigOverride | None:
    if load_only:
        return RouterConfigOverride(overlap_score_weight=0.0)
    hints = request.agent_hints
    if not hints:
        return None
    weight = _non_negative(hints.get("kv_overlap_score_weight"))
    temperature = _non_negative(hints.get("temperature"))
    if weight is None and temperature is None:
        return None
    return RouterConfigOverride(overlap_score_weight=weight, temperature=temperature)


def _non_negative(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf"):
        return float(value)
    return None
