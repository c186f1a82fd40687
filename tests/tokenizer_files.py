"""Test helper: write a small, real Hugging Face tokenizer directory (trained in-process, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|begin_of_text|>"
EOS = "<|eot_id|>"
HEADER_START = "<|start_header_id|>"
HEADER_END = "<|end_header_id|>"
SPECIAL_TOKENS = [BOS, EOS, HEADER_START, HEADER_END]

# A Llama-3-like template: bos_token, loops, tools with tojson, tool-call arguments as objects,
# raise_exception for unknown roles, add_generation_prompt, a chat_template_kwargs switch, indentation
# that only trim_blocks/lstrip_blocks remove.
LLAMA_TEMPLATE = """{{- bos_token }}
{% if tools is not none %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools:\\n' }}
    {% for tool in tools %}
        {{- tool | tojson(indent=2) + '\\n' }}
    {% endfor %}
    {{- '<|eot_id|>' }}
{% endif %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('unsupported role: ' + message['role']) }}
    {% endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {% if message.tool_calls is defined %}
        {% for call in message.tool_calls %}
            {{- call.function.name + '(' + call.function.arguments | tojson + ')' }}
        {% endfor %}
    {% else %}
        {{- message['content'] | trim }}
    {% endif %}
    {{- '<|eot_id|>' }}
{% endfor %}
{% if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
    {% if enable_thinking is defined and not enable_thinking %}
        {{- '<think></think>' }}
    {% endif %}
{% endif %}
"""

# A template that loops over message['content'] parts: vLLM's "openai" content format.
PARTS_TEMPLATE = """{% for message in messages %}
{{ message['role'] }}:{% for part in message['content'] %}{% if part['type'] == 'text' %}[{{ part['text'] }}]\
{% else %}<{{ part['type'] }}>{% endif %}{% endfor %}

{% endfor %}"""

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today?",
    "system user assistant tool tools weather city paris",
    '{"name": "get_weather", "arguments": {"city": "paris"}}',
    "you are a helpful assistant. answer briefly.",
]


def train_tokenizer() -> Tokenizer:
    """A byte-level BPE over a tiny corpus whose post-processor prepends BOS, like Llama 3's."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def write_tokenizer_dir(
    root: Path,
    *,
    chat_template: str | list[dict[str, str]] | None = LLAMA_TEMPLATE,
    template_file: str | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write tokenizer.json and tokenizer_config.json (and chat_template.jinja if given) under `root`.

    bos_token is stored as an AddedToken dict and eos_token as a plain string, the two forms found on the Hub.
    """
    root.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(root / "tokenizer.json"))
    tokenizer_config: dict[str, Any] = {
        "bos_token": {"__type": "AddedToken", "content": BOS, "lstrip": False, "rstrip": False},
        "eos_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    tokenizer_config.update(config or {})
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    if template_file is not None:
        (root / "chat_template.jinja").write_text(template_file, encoding="utf-8")
    return root
