"""The checkpoint tokenizer and the streaming detokenizer."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from plugd.testing.checkpoints import write_checkpoint
from plugd.tokenizer import BYTE_LEVEL_CHARS, Detokenizer, Tokenizer

TEXT = "Grüße 東京 🙂"


def streamed(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    detokenizer = Detokenizer(tokenizer)
    return [detokenizer.add(token) for token in ids] + [detokenizer.flush()]


def byte_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """`text` spelled one byte-level token per UTF-8 byte, so that every multi-byte character is split."""
    byte_to_char = {byte: char for char, byte in BYTE_LEVEL_CHARS.items()}
    return [tokenizer._tokenizer.token_to_id(byte_to_char[byte]) for byte in text.encode()]


def test_special_tokens_written_in_the_text_become_their_ids(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == tokenizer._tokenizer.token_to_id("<|im_start|>")
    assert ids[-1] == tokenizer._tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.decode(ids) == "<|im_start|>user\nHi<|im_end|>"


def test_end_of_sequence_ids_gather_every_config(tmp_path):
    path = write_checkpoint(tmp_path, "qwen3")
    tokenizer = Tokenizer.from_dir(path)
    vocab = tokenizer._tokenizer
    assert tokenizer.eos_ids == {vocab.token_to_id("<|im_end|>"), vocab.token_to_id("<|endoftext|>")}
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"eos_token_id": [7, 8]}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    token_config = json.loads((path / "tokenizer_config.json").read_text())
    token_config["eos_token"] = {"content": "</think>", "special": True}
    (path / "tokenizer_config.json").write_text(json.dumps(token_config))
    assert Tokenizer.from_dir(path).eos_ids == {7, 8, 9, vocab.token_to_id("</think>")}


def test_byte_level_alphabet_matches_the_tokenizers_library():
    assert set(BYTE_LEVEL_CHARS) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(BYTE_LEVEL_CHARS.values()) == list(range(256))
    assert BYTE_LEVEL_CHARS["Ġ"] == ord(" ") and BYTE_LEVEL_CHARS["!"] == ord("!")


def test_every_token_reads_as_the_library_decodes_it(tokenizer):
    for token in range(tokenizer.vocab_size):
        assert tokenizer.token_text(token) == tokenizer.decode([token]), token
    assert tokenizer.token_bytes(tokenizer.vocab_size + 5) == b""


@pytest.mark.parametrize("spelling", ["byte per token", "trained merges"])
def test_streamed_text_never_splits_a_character(tokenizer, spelling):
    ids = byte_tokens(tokenizer, TEXT) if spelling == "byte per token" else tokenizer.encode(TEXT)
    pieces = streamed(tokenizer, ids)
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == TEXT == tokenizer.decode(ids)
    if spelling == "byte per token":
        assert len(ids) == len(TEXT.encode()) and pieces[2:4] == ["", "\u00fc"]  # "ü" is two bytes


def test_a_character_cut_off_or_invalid_bytes_come_out_as_replacement_characters(tokenizer):
    tokyo = byte_tokens(tokenizer, "東")
    assert streamed(tokenizer, tokyo[:2]) == ["", "", "\ufffd"]
    stray_continuation = tokyo[1:2]
    assert streamed(tokenizer, stray_continuation + byte_tokens(tokenizer, "a")) == ["\ufffd", "a", ""]
    ids = tokyo[:2] + byte_tokens(tokenizer, "x")
    assert "".join(streamed(tokenizer, ids)) == tokenizer.decode(ids)


def sentencepiece_dir(tmp_path):
    """A byte-fallback sentencepiece-style tokenizer (the Llama / Gemma kind) whose config asks for a BOS."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    vocab |= {"\u2581": 259, "a": 260, "\u2581a": 261, "b": 262}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[("\u2581", "a")], byte_fallback=True, unk_token="<unk>"))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    hf.add_special_tokens(["<s>", "</s>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    config = {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_sentencepiece_byte_fallback_pieces_stream_as_whole_characters(tmp_path):
    tokenizer = Tokenizer.from_dir(sentencepiece_dir(tmp_path))
    ids = tokenizer.encode("a ab 東")
    assert ids[0] == 1 and ids[1:3] == [261, 261] and ids[-3:] == [3 + 0xE6, 3 + 0x9D, 3 + 0xB1]
    assert tokenizer.encode("<s>a") == [1, 261]  # a BOS written in the text is not doubled
    assert tokenizer.eos_ids == {2}
    pieces = streamed(tokenizer, ids[1:])
    assert pieces[-4:] == ["", "", "東", ""]
    assert "".join(pieces) == " a ab 東" == tokenizer.decode(ids[1:])
