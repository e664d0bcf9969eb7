"""A small byte-level BPE tokenizer trained on the spot, in the Hugging Face layout Qwen models use."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# A ChatML template of our own (not any vendor's) that exercises roles, tools and thinking.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{%- if messages[0].role == 'system' %}
{{ messages[0].content }}
{%- endif %}
# Tools
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}
<|im_start|>{{ message.role }}
{% if message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>
{% endif %}{{ message.content }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "Local models answer questions, call tools and write code.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ' \" ! ? _ # @ $ % ^ & |",
    "Grüße aus Köln — naïve café, 東京, Привет, emoji 🙂",
]


@lru_cache(maxsize=4)
def train(vocab_size: int = 512) -> Tokenizer:
    """A deterministic byte-level BPE with the special tokens above at the end of the vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 8, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def write(path: Path, vocab_size: int = 512) -> Tokenizer:
    """Write tokenizer.json and tokenizer_config.json into `path`; returns the tokenizer."""
    tok = train(vocab_size)
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok
