"""The runner-side contract for plugins: what a cache policy and a grammar engine are given and must provide.

Plugins whose code runs in the runner (hooks `plugd_cache_policies`, `plugd_grammar_engines`) import from here,
from `plugd.nn`, `plugd.json_schema`, `plugd.schema_rewrites` and `plugd.testing`, and from nothing else of
plugd's: the rest may change. This module imports no MLX, so the daemon can read the descriptors' contract
without it.

## Cache policies

The engine owns generation; a policy owns the model's caches (`layers`) and the
tokens they hold (`tokens`). Per completion the engine calls, in order:

- `resume(prompt)`: bring `layers` to the longest prefix of `prompt` (short of
  its last token) the policy can give back, and return its length;
- `capture_points(start, end)`: positions in (start, end) where the prefill
  should pause so the policy can take a restore point; the engine ends a chunk
  at each;
- `prefilled()` after every prefill chunk: `layers` hold exactly `tokens`, the
  moment to capture what a retry after a cancellation can resume from;
- `finished()` once the prefill is over, however it ends: the completion
  decodes in a batch row of its own, copied from `layers`, and the next
  completion's prefill may begin;
- `adopt(layers, tokens)` when a completion's batch row leaves (its output
  done or cancelled): its own caches, which hold `tokens` (its prompt and
  the output fed back), to become the live caches, so that a conversation's
  next turn resumes after the output. Never during a prefill.

A policy is made by a factory `module:callable` named by a `CachePolicy` hook
descriptor, called with the loaded model (whose `make_cache()` gives fresh
caches) and, for a policy that declares a budget, `budget=` the bytes the
scheduler granted it. plugd.cache_policies says which policy runs.

## Grammar engines

A grammar engine plugin (hook `plugd_grammar_engines`) names a factory `module:callable`. The daemon never
imports it; the runner calls it once per model with the model's `GrammarVocabulary` and gets a compiler:

    compiler.compile(kind, format) -> compiled    # kind "json" or "json_schema"; raises GrammarRefused,
                                                  # naming what it cannot enforce, instead of ignoring it
    compiled.matcher() -> matcher                 # one per request:
        matcher.fill_mask(bitmask)                # bit t of bitmask[t // 32] set <=> token t may come next;
                                                  # stop ids only once the output is complete
        matcher.accept(token) -> bool             # False: the token breaks the grammar
        matcher.rollback(count)                   # optional: forget the last `count` tokens accepted; a request
                                                  # decoding speculatively drafts under its grammar only with it

The bitmask is numpy int32, ceil(width / 32) words, little-endian bit order within each word. A JSON Schema
engine can leave the format's checks and a cache of what it compiled to `SchemaCache`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs

if TYPE_CHECKING:
    import mlx.nn as nn
    import numpy as np

    from plugd.tokenizer import Tokenizer


class RunnerCachePolicy(Protocol):
    layers: list[Any]
    tokens: list[int]

    def resume(self, prompt: Sequence[int]) -> int: ...

    def reserve(self, positions: int, expected: int = 0) -> None: ...

    def capture_points(self, start: int, end: int) -> Sequence[int]: ...

    def prefilled(self) -> None: ...

    def finished(self) -> None: ...

    def adopt(self, layers: list[Any], tokens: list[int]) -> None: ...

    def reset(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


class LiveCache:
    """The model's caches and the tokens they hold; the part every policy shares.

    Invariant between steps: every layer's offset equals len(tokens).
    """

    def __init__(self, model: nn.Module):
        self._model = model
        self._reserved = (0, 0)
        self.reset()

    def reset(self) -> None:
        self.layers = self._model.make_cache()
        self.tokens: list[int] = []
        self.reserve(*self._reserved)

    def trim_to(self, length: int) -> bool:
        """Forget every token past `length`; False (caches untouched past `length` not guaranteed) when a layer
        cannot forget that much."""
        excess = len(self.tokens) - length
        if any(layer.trim(excess) != excess for layer in self.layers):
            return False
        del self.tokens[length:]
        return True

    def reserve(self, positions: int, expected: int = 0) -> None:
        """Tell the caches the context's size (`positions`, which they never grow past, as the fit check counts)
        and what the completion under way should reach (`expected`, allocated at once at their next growth, so
        that memory stays flat while it decodes); beyond that they double as they fill."""
        self._reserved = (positions, expected)
        for layer in self.layers:
            if hasattr(layer, "reserve"):
                layer.reserve(positions, expected)

    def capture_points(self, start: int, end: int) -> Sequence[int]:
        return ()

    def prefilled(self) -> None:
        pass

    def finished(self) -> None:
        pass

    def adopt(self, layers: list[Any], tokens: list[int]) -> None:
        """Take a finished completion's caches as the live ones (what they replace is dropped)."""
        self.layers, self.tokens = layers, tokens
        self.reserve(*self._reserved)

    def stats(self) -> dict[str, int]:
        return {"bytes": 0, "nodes": 0}


class GrammarRefused(ValueError):
    """The request's format cannot be enforced (an unsupported schema feature, a malformed grammar spec)."""


class GrammarDeadEnd(RuntimeError):
    """The format allows no token after what was written: the request's schema cannot be completed from there
    (a matcher raises it from `fill_mask`, and the request ends with its message as the client's error)."""


@attrs.frozen
class GrammarVocabulary:
    """What a grammar engine needs to know of a model's tokens.

    `token_bytes[t]` is the text token `t` adds to the output; it is b"" for ids that never belong in
    structured text: control and other added tokens (`<|im_end|>`, `<think>`) and ids past the tokenizer's
    vocabulary (the model's logits may be wider). `stop_ids` end generation.
    """

    token_bytes: list[bytes]
    stop_ids: frozenset[int]

    @property
    def width(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def of(cls, tokenizer: Tokenizer, width: int) -> GrammarVocabulary:
        """The vocabulary of `tokenizer` over a model whose logits have `width` entries."""
        added = tokenizer.added_ids
        usable = min(width, tokenizer.vocab_size)
        token_bytes = [b"" if t in added else tokenizer.token_bytes(t) for t in range(usable)]
        token_bytes += [b""] * (width - usable)
        return cls(token_bytes, frozenset(t for t in tokenizer.eos_ids if t < width))


class Matcher(Protocol):
    def fill_mask(self, bitmask: np.ndarray) -> None: ...

    def accept(self, token: int) -> bool: ...

    # Optional: def rollback(self, count: int) -> None


class Compiled(Protocol):
    def matcher(self) -> Matcher: ...


class Compiler(Protocol):
    def compile(self, kind: str, format: Any) -> Compiled: ...


_Compiled = TypeVar("_Compiled")


class SchemaCache(Generic[_Compiled]):
    """The last `size` schemas a JSON Schema engine compiled, and the ones it refused, by their JSON.

    `compile(kind, format)` is a `Compiler`'s: format "json" is the schema of any JSON object, a `json_schema`
    must be an object or a boolean, and anything else gets `compile_schema(schema)` (which raises GrammarRefused
    for what it will not enforce) once while it stays among the last `size` asked for.
    """

    ANY_JSON_OBJECT = {"type": "object"}

    def __init__(self, compile_schema: Callable[[dict | bool], _Compiled], size: int = 64):
        self._compile_schema, self._size = compile_schema, size
        self._results: OrderedDict[str, _Compiled | GrammarRefused] = OrderedDict()

    def compile(self, kind: str, format: Any) -> _Compiled:
        schema = self.ANY_JSON_OBJECT if kind == "json" else format
        if not isinstance(schema, dict | bool):
            raise GrammarRefused(f"a JSON schema must be an object or a boolean, not {type(schema).__name__}")
        key = json.dumps(schema, sort_keys=True)
        if (result := self._results.pop(key, None)) is None:
            try:
                result = self._compile_schema(schema)
            except GrammarRefused as refusal:
                result = refusal
        self._results[key] = result
        while len(self._results) > self._size:
            self._results.popitem(last=False)
        if isinstance(result, GrammarRefused):
            raise result
        return result
