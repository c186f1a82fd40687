"""Differential fuzzing: random, often malformed, chat bodies through vLLM's own request code and the picker.

    /tmp/vllmvenv/bin/pip install xxhash  # the venv of `generate.py --check-vllm`, plus what extproc imports
    /tmp/vllmvenv/bin/python tests/request_goldens/differential.py --seed 1 --bodies 3000

For each real tokenizer (all of generate.py's families, or those named with --families) it counts the bodies
both accept with the same ids, those whose ids differ (the bug class the goldens guard against, printed),
and those only one side refuses: vLLM answers 400 where the picker routes (harmless), or the picker refuses
what vLLM serves. Half the bodies alternate user and assistant turns, which strict templates (Gemma 3,
Mistral) demand. Seeds 1-4 (1,500-2,000 bodies per tokenizer) over the seven families: no ids differed; the
picker alone refused 4-8% of the bodies: text parts whose text is null or missing, which vLLM skips, and
non-string message names, which vLLM ignores; `extproc/request/parse.py` rejects both by design
(tests/request/test_parse.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import generate  # this folder is the script's sys.path[0]
from corpus import CHAT

sys.path.insert(0, str(generate.REPO))

from extproc.errors import RequestInvalid, TokenizerUnavailable
from extproc.request import chat_template
from extproc.request.parse import parse_openai_body
from extproc.request.tokenizer import HfTokenizer, _tokenize_local

TEXTS = [
    "hi",
    "",
    " ",
    "<|im_start|>",
    "x-anthropic-billing-header: a\nb",
    "</think>a",
    "<think>\nr\n</think>\n\nc",
]
ROLES = ["system", "user", "assistant", "tool", "developer", "user", "assistant", "function", "ipython"]
ARGUMENTS = ['{"a": 1}', "", "{}", "[1]", "nope", None, '{"x": "<|im_end|>"}']


class Bodies:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def content(self) -> Any:
        r = self.r
        if r.random() < 0.5:
            return r.choice([*TEXTS, None])
        choices = [
            lambda: {"type": "text", "text": r.choice(TEXTS)},
            lambda: r.choice(TEXTS),
            lambda: {"type": "refusal", "refusal": "no"},
            lambda: {"type": "thinking", "thinking": "hm"},
            lambda: {"type": "text", "text": None},
            lambda: {"type": "text"},
            lambda: {"type": "tool_reference", "name": "t"},
            lambda: {"text": "untyped"},
            # what an "openai"-format template (Gemma 3's) sees differently from a "string" one
            lambda: {"type": "text", "text": r.choice(TEXTS), "cache_control": {"type": "ephemeral"}},
            lambda: {"type": r.choice(["input_text", "output_text"]), "text": r.choice(TEXTS)},
            lambda: {
                "type": r.choice(["thinking", "input_text", "refusal"]),
                r.choice(["thinking", "x"]): None,
            },
            lambda: {"type": "text", "text": "with uuid", "uuid": "u1"},
        ]
        return [r.choice(choices)() for _ in range(r.randint(0, 3))]

    def call(self, i: int) -> dict[str, Any]:
        r = self.r
        function: dict[str, Any] = {"name": r.choice(["f", "g<|im_start|>"])}
        if (arguments := r.choice(ARGUMENTS)) is not None:
            function["arguments"] = arguments
        call = {"id": f"c{i}", "type": "function", "function": function}
        if r.random() < 0.1:
            del call["id"]
        if r.random() < 0.1:
            call["type"] = "custom"
        return call

    def message(self) -> dict[str, Any]:
        r = self.r
        role = r.choice(ROLES)
        message: dict[str, Any] = {"role": role}
        if r.random() < 0.9:
            message["content"] = self.content()
        if role == "assistant" and r.random() < 0.4:
            message["tool_calls"] = [self.call(j) for j in range(r.randint(0, 2))]
        if role == "assistant" and r.random() < 0.3:
            message[r.choice(["reasoning", "reasoning_content"])] = r.choice(["why", "", None])
        if role == "tool" and r.random() < 0.7:
            message["tool_call_id"] = r.choice(["c0", None])
        if r.random() < 0.1:
            message["name"] = r.choice(["n", None, 3])
        if role == "developer" and r.random() < 0.5:
            message["tools"] = [{"type": "function", "function": {"name": "d"}}]
        return message

    def tool(self) -> dict[str, Any]:
        r = self.r
        function: dict[str, Any] = {"name": r.choice(["t", "u"])}
        for key, values in (
            ("description", ["d", None, ""]),
            ("parameters", [{"type": "object"}, None, {}]),
            ("strict", [True, None]),
            ("defer_loading", [False, None]),
        ):
            if r.random() < 0.5:
                function[key] = r.choice(values)
        tool = {"type": "function", "function": function}
        if r.random() < 0.1:
            tool["defer_loading"] = True
        if r.random() < 0.1:
            tool["extra"] = 1
        return tool

    def alternating(self) -> list[dict[str, Any]]:
        """An optional system message, then user and assistant in turn: what strict templates accept."""
        r = self.r
        messages = [{"role": "system", "content": self.content()}] if r.random() < 0.3 else []
        for i in range(r.randint(1, 5)):
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": self.content()})
        return messages

    def body(self, model: str) -> dict[str, Any]:
        r = self.r
        if r.random() < 0.5:
            messages = self.alternating()
        else:
            messages = [self.message() for _ in range(r.randint(1, 6))]
        body: dict[str, Any] = {"model": model, "messages": messages}
        options = {
            "tools": lambda: [self.tool() for _ in range(r.randint(0, 2))],
            "add_generation_prompt": lambda: r.choice([True, False]),
            "continue_final_message": lambda: r.choice([True, False]),
            "chat_template_kwargs": lambda: r.choice([{"enable_thinking": False}, {"tools": None}, {}]),
            "add_special_tokens": lambda: r.choice([True, False]),
            "reasoning_effort": lambda: r.choice(["none", "high"]),
            "truncate_prompt_tokens": lambda: r.choice([1, 4, 20]),
            "truncation_side": lambda: r.choice(["left", "right"]),
        }
        for key, value in options.items():
            if r.random() < 0.2:
                body[key] = value()
        return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bodies", type=int, default=3000, help="per tokenizer")
    parser.add_argument("--families", nargs="+", choices=generate.FAMILIES, default=generate.FAMILIES)
    args = parser.parse_args()
    chat_template.datetime = generate._FrozenClock  # type: ignore[misc]  # vLLM's side sees that instant too
    check = generate.VllmCheck()
    bodies = Bodies(args.seed)
    for family in args.families:
        directory: Path = generate.family_dir(family)
        backend = HfTokenizer(directory)
        outcomes: collections.Counter[str] = collections.Counter()
        for _ in range(args.bodies):
            body = bodies.body(family)
            vllm_ids = check(family, directory, CHAT, body)
            try:
                request = parse_openai_body(json.dumps(body).encode(), CHAT, max_bytes=1 << 24)
                ours, refusal = list(_tokenize_local(backend, request)), ""  # an array("I") there
            except (RequestInvalid, TokenizerUnavailable) as e:
                ours, refusal = None, re.sub(r"\[\d+\]", "[i]", e.message)
            if vllm_ids is None:
                outcomes["vLLM refuses" + (", the picker too" if ours is None else "")] += 1
            elif ours is None:
                outcomes[f"only the picker refuses: {refusal}"] += 1
            else:
                outcomes["same ids" if ours == vllm_ids else "IDS DIFFER"] += 1
                if ours != vllm_ids:
                    print(json.dumps(body, ensure_ascii=False))
        print(family, dict(outcomes.most_common()))


if __name__ == "__main__":
    main()
