"""A checkpoint's tokenizer (tokenizer.json through the `tokenizers` library) and a streaming detokenizer.

Special tokens are text like any other: `encode` turns `<|im_start|>` written in
the prompt into its id, and `decode` / `Detokenizer` write special tokens back
as their text, so that output parsers can see markers such as `<think>`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

SPM_SPACE = "\u2581"
SPM_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """Text <-> token ids for one model, with the ids that end generation."""

    def __init__(self, tokenizer: HFTokenizer, eos_ids: Iterable[int], bos_id: int | None = None):
        self._tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.bos_id = bos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._added_texts = {id_: added.content for id_, added in tokenizer.get_added_tokens_decoder().items()}
        self._piece_bytes = _piece_decoder(json.loads(tokenizer.to_str()).get("decoder"))
        self._bytes_by_id: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, model_dir: Path) -> Tokenizer:
        """The tokenizer of a checkpoint in the Hugging Face layout."""
        names = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")
        return cls.from_files({name: Path(model_dir) / name for name in names})

    @classmethod
    def from_files(cls, files: Mapping[str, Path]) -> Tokenizer:
        """The tokenizer of a checkpoint whose files (by their names in the Hugging Face layout) lie at these paths,
        as a model's blobs do in the store."""
        tokenizer = HFTokenizer.from_file(str(files["tokenizer.json"]))
        config = _read_json(files.get("tokenizer_config.json"))
        eos_ids = {
            *_ids(_read_json(files.get("generation_config.json")).get("eos_token_id")),
            *_ids(_read_json(files.get("config.json")).get("eos_token_id")),
        }
        if (eos := _token_id(tokenizer, config.get("eos_token"))) is not None:
            eos_ids.add(eos)
        bos_id = _token_id(tokenizer, config.get("bos_token")) if config.get("add_bos_token") else None
        return cls(tokenizer, eos_ids, bos_id)

    @property
    def added_ids(self) -> frozenset[int]:
        """Ids of the added tokens (control tokens such as <|im_end|> and <think>), which plain text never holds."""
        return frozenset(self._added_texts)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special tokens written in it included; the BOS first when the model wants one."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    def encode_standalone(self, text: str, max_tokens: int | None = None) -> list[int]:
        """Token ids of `text` as transformers' tokenizer encodes one text by default (and so sentence-transformers
        an input): the tokenizer's own post-processor adds its special tokens (an EOS, for Qwen3-Embedding), and a
        cut to `max_tokens` shortens the text, keeping them."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        if max_tokens is not None:
            encoding.truncate(max(max_tokens - self._tokenizer.num_special_tokens_to_add(False), 0))
        return self._tokenizer.post_process(encoding).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for, maybe part of a character; b"" for ids off the vocabulary."""
        cached = self._bytes_by_id.get(token_id)
        if cached is None:
            cached = self._bytes_by_id[token_id] = self._token_bytes(token_id)
        return cached

    def token_text(self, token_id: int) -> str:
        """The token's text, with U+FFFD for an incomplete UTF-8 character."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def _token_bytes(self, token_id: int) -> bytes:
        if token_id in self._added_texts:
            return self._added_texts[token_id].encode()
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self._piece_bytes is None:
            return self._tokenizer.decode([token_id], skip_special_tokens=False).encode()
        return self._piece_bytes(piece)


class Detokenizer:
    """Turns generated token ids into text as they come, never splitting a UTF-8 character.

    Bytes of a character that is spread over several tokens are held until the
    character is complete, so each step costs only that token's bytes.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._pending = b""

    def add(self, token_id: int) -> str:
        """The text completed by `token_id` (possibly empty)."""
        self._pending += self._tokenizer.token_bytes(token_id)
        complete = len(self._pending) - _incomplete_tail_length(self._pending)
        text = self._pending[:complete].decode("utf-8", errors="replace")
        self._pending = self._pending[complete:]
        return text

    def flush(self) -> str:
        """Whatever is still held, an unfinished character written as U+FFFD."""
        text = self._pending.decode("utf-8", errors="replace")
        self._pending = b""
        return text


def _incomplete_tail_length(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character that more bytes could still complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0b1100_0000 == 0b1000_0000:
            continue  # a continuation byte: its lead byte is further back
        needed = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return back if back < needed else 0
    return 0


def _piece_decoder(decoder: Mapping[str, Any] | None) -> Callable[[str], bytes] | None:
    """How a vocabulary piece turns into bytes under tokenizer.json's decoder; None: ask the library per token."""
    if decoder is None:
        return None
    if decoder.get("type") == "ByteLevel":
        return _byte_level_bytes
    parts = decoder.get("decoders") or [decoder]
    if any(part.get("type") in ("ByteFallback", "Metaspace") for part in parts):
        return _sentencepiece_bytes
    return None


def _byte_level_bytes(piece: str) -> bytes:
    if all(char in BYTE_LEVEL_CHARS for char in piece):
        return bytes(BYTE_LEVEL_CHARS[char] for char in piece)
    return piece.encode()


def _sentencepiece_bytes(piece: str) -> bytes:
    if byte := SPM_BYTE_PIECE.fullmatch(piece):
        return bytes([int(byte.group(1), 16)])
    return piece.replace(SPM_SPACE, " ").encode()


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as a printable character; this maps the characters back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    code_points = {byte: byte for byte in printable}
    unprintable = [byte for byte in range(256) if byte not in code_points]
    code_points |= {byte: 256 + i for i, byte in enumerate(unprintable)}
    return {chr(code_point): byte for byte, code_point in code_points.items()}


BYTE_LEVEL_CHARS = _byte_level_alphabet()


def _read_json(path: Path | None) -> dict[str, Any]:
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}


def _ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def _token_id(tokenizer: HFTokenizer, token: str | Mapping[str, Any] | None) -> int | None:
    """The id of a token given as tokenizer_config.json writes it: its text, or an AddedToken object."""
    if isinstance(token, Mapping):
        token = token.get("content")
    return tokenizer.token_to_id(token) if token else None
