"""Structured output in the runner: grammar engines found by import path, compiled off the MLX thread, one
token mask per decode step. The contract an engine meets is in plugd.runner_api.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import attrs
import mlx.core as mx
import numpy as np

from plugd.protocol import GrammarSpec
from plugd.runner_api import Compiled, Compiler, GrammarRefused, GrammarVocabulary, Matcher


class Grammars:
    """Compiles requests' grammars on a worker thread of its own, so compilation overlaps the prefill.

    One compiler per engine is made for this model, on first use, and kept: it holds the engine's view of the
    vocabulary and its cache of compiled grammars. `engines` are the factories, by engine name.
    """

    def __init__(self, vocabulary: Callable[[], GrammarVocabulary], engines: dict[str, str]):
        self._vocabulary = vocabulary
        self._engines = engines
        self._built: GrammarVocabulary | None = None
        self._compilers: dict[str, Compiler] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")

    def compile(self, spec: GrammarSpec) -> Future[TokenMaskFactory]:
        """Start compiling `spec`; the future's result makes one request's TokenMask, or raises GrammarRefused."""
        return self._worker.submit(self._compile, spec)

    def _compile(self, spec: GrammarSpec) -> TokenMaskFactory:
        """The first of the spec's engines that can enforce its format exactly compiles it; when none can, the
        refusal gives each engine's reasons."""
        if self._built is None:
            self._built = self._vocabulary()
        refusals = []
        for name in spec.engines:
            try:
                compiled = self._compiler(name).compile(spec.kind, spec.format)
            except GrammarRefused as refusal:
                refusals.append(str(refusal))
                continue
            return TokenMaskFactory(compiled, self._built.width, self._built.stop_ids, spec.after)
        raise GrammarRefused("; and ".join(refusals))

    def _compiler(self, engine: str) -> Compiler:
        compiler = self._compilers.get(engine)
        if compiler is None:
            if engine not in self._engines:
                raise GrammarRefused(f"grammar engine {engine!r} is not installed")
            compiler = self._compilers[engine] = _load_factory(self._engines[engine])(self._built)
        return compiler


def _load_factory(path: str) -> Callable[[GrammarVocabulary], Compiler]:
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise GrammarRefused(f"grammar engine {path!r} is not available in the runner: {exc}") from None


@attrs.frozen
class TokenMaskFactory:
    compiled: Compiled
    width: int
    stop_ids: frozenset[int]
    after: str | None

    def __call__(self) -> TokenMask:
        return TokenMask(self.compiled.matcher(), self.width, self.stop_ids, self.after)


class TokenMask:
    """One request's grammar state: which tokens may come next, as a boolean MLX array over the logits.

    With `after`, output is free (except that it may not end) until the text `after` has been generated; the
    grammar applies from the next token on.
    """

    def __init__(self, matcher: Matcher, width: int, stop_ids: frozenset[int], after: str | None = None):
        self._matcher = matcher
        self._width = width
        self._bitmask = np.zeros(math.ceil(width / 32), np.int32)
        self._waiting_for = after
        self._seen = ""
        if after is not None:
            free = np.ones(width, np.bool_)
            free[sorted(stop_ids)] = False
            self._free = mx.array(free)

    @property
    def active(self) -> bool:
        return self._waiting_for is None

    @property
    def rolls_back(self) -> bool:
        """Whether `rollback` can undo tokens accepted while the grammar applies (the engine's matcher can)."""
        return getattr(self._matcher, "rolls_back", hasattr(self._matcher, "rollback"))

    def rollback(self, count: int) -> None:
        """Forget the last `count` tokens accepted, all of them while the grammar applied."""
        self._matcher.rollback(count)

    def allowed(self) -> mx.array:
        """The tokens the next step may choose (lazy), given every token accepted so far."""
        if not self.active:
            return self._free
        self._matcher.fill_mask(self._bitmask)
        bits = np.unpackbits(self._bitmask.view(np.uint8), count=self._width, bitorder="little")
        return mx.array(bits.view(np.bool_))

    def accept(self, token: int, text: str) -> None:
        """Advance past the chosen token, whose text (as detokenized so far) is `text`."""
        if self.active:
            if not self._matcher.accept(token):
                raise RuntimeError(f"the grammar rejected token {token}, which its own mask allowed")
            return
        seen = self._seen + text
        if self._waiting_for in seen:
            self._waiting_for = None
        else:  # only a tail shorter than the marker can still become part of it
            self._seen = seen[len(seen) - len(self._waiting_for) + 1 :]
