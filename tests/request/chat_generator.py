"""Seeded multi-turn conversations, as a chat client sends them: every turn re-sends the whole history.

Used by `test_piecewise_exactness.py` (and, with a larger count, by its opt-in run) to show that piecewise
encoding gives the ids of a whole-prompt encoding. The texts aim at piece boundaries: white space and
newlines at message edges, messages cut mid-word or mid-grapheme, empty messages, unicode, special-token
strings written literally (and near misses), tool definitions, tool calls and their results, reasoning.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tests.request_goldens.corpus import (
    ARGUMENTS,
    CJK,
    COMBINING,
    EMOJI,
    NEAR_SPECIALS,
    OTHER,
    RTL,
    SPACES,
    SPECIALS,
    TOOLS,
    WORDS,
    ZERO_WIDTH,
)

EDGES = [*SPACES, "", "", "", " \u00a0", "\u3000", "\n \n", "\t\n"]


@dataclass
class Conversation:
    """One client's conversation: the messages of each request it sends, in order, and what they share."""

    family: str
    index: int
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] | None = None


class ChatGenerator:
    """Conversations for one tokenizer family; each is a function of (seed, family, index)."""

    def __init__(self, family: str, seed: int) -> None:
        self.family = family
        self.seed = seed

    def conversations(self, count: int) -> list[Conversation]:
        return [self.conversation(i) for i in range(count)]

    def conversation(self, index: int) -> Conversation:
        rng = random.Random(f"{self.seed}:{self.family}:{index}")
        conv = Conversation(self.family, index)
        if rng.random() < 0.3:
            conv.tools = rng.sample(TOOLS, rng.randint(1, 3))
        if self.family == "qwen3" and rng.random() < 0.4:
            conv.kwargs = {"enable_thinking": rng.random() < 0.5}
        messages: list[dict[str, Any]] = []
        if rng.random() < 0.6:
            messages.append({"role": "system", "content": self.text(rng)})
        for turn in range(rng.randint(1, 7)):
            messages.append({"role": "user", "content": self.content(rng)})
            conv.requests.append([dict(m) for m in messages])
            if conv.tools and rng.random() < 0.4:
                self.tool_round(rng, conv, messages, turn)
            messages.append(self.assistant(rng))
        return conv

    def tool_round(
        self, rng: random.Random, conv: Conversation, messages: list[dict[str, Any]], turn: int
    ) -> None:
        # Llama 3.1's template takes one call per message; Qwen3's several
        count = 1 if self.family == "llama3_1" else rng.randint(1, 2)
        assert conv.tools is not None
        calls = [
            {
                "id": f"call_{conv.index}_{turn}_{k}",
                "type": "function",
                "function": {
                    "name": rng.choice(conv.tools)["function"]["name"],
                    "arguments": rng.choice(ARGUMENTS),
                },
            }
            for k in range(count)
        ]
        messages.append(
            {"role": "assistant", "content": rng.choice([None, "", "Let me check."]), "tool_calls": calls}
        )
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": self.text(rng)})
        conv.requests.append([dict(m) for m in messages])

    def assistant(self, rng: random.Random) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text(rng)}
        if self.family == "qwen3" and rng.random() < 0.3:
            message["reasoning_content"] = self.text(rng)
        return message

    def content(self, rng: random.Random) -> Any:
        if rng.random() < 0.15:
            return [{"type": "text", "text": self.text(rng)} for _ in range(rng.randint(1, 3))]
        return self.text(rng)

    def text(self, rng: random.Random) -> str:
        """A message text: words, unicode, specials, long paragraphs; edged, cut mid-word, or empty."""
        shape = rng.random()
        if shape < 0.06:
            return ""
        if shape < 0.12:
            return rng.choice(EDGES + SPECIALS[self.family] + NEAR_SPECIALS)
        pools = [CJK, EMOJI, COMBINING, RTL, ZERO_WIDTH, OTHER, SPACES, SPECIALS[self.family], NEAR_SPECIALS]
        out = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.6:
                out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))))
            else:
                out.append(rng.choice(rng.choice(pools)))
            out.append(rng.choice(["", " ", " ", "\n", "\n\n", ". ", ", "]))
        if rng.random() < 0.05:  # a long paragraph: a piece of about a thousand tokens
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 1000))))
        text = "".join(out)
        if rng.random() < 0.3:  # a message that ends in a partial word (or grapheme)
            text = text[: rng.randint(0, len(text))]
        return rng.choice(EDGES) + text + rng.choice(EDGES)
