"""The typed boundary between the daemon and its runners: MLX-free, read by both sides through one converter.

A runner is started with a RunnerConfig. Each /completion body is a Completion; the answer is NDJSON, one event a
line (`event_line`, `read_event`): PrefillEvents as the prefill starts and after each chunk, a TokenEvent per
generated token, one DoneEvent; an ErrorEvent if generation fails once the answer has begun. An embedding
model's runner takes an Embed at /embed instead, and answers Embedded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from attrs import Factory, define, frozen

from plugd.constants import DRAFT_TOKENS, EMBED_BATCH_TOKENS
from plugd.runner_api import GrammarRefused
from plugd.store.sentence_layout import EmbeddingLayout
from plugd.types import converter

GRAMMAR_KINDS = ("json", "json_schema")


# The daemon's pid, given to a group's ranks: their parent is the group's launcher, not the daemon.
DAEMON_PID_VARIABLE = "PLUGD_DAEMON_PID"
GROUP_BACKEND = "ring"  # the MLX distributed backend a runner group's ranks talk over
# How a group splits its model: each layer's heads and hidden units shared out among the ranks (plugd.nn.sharding),
# or consecutive layers to each rank (plugd.nn.pipeline).
TENSOR, PIPELINE = "tensor", "pipeline"


def stage_layers(layers: int, ranks: int, rank: int) -> range:
    """The layers rank `rank` runs when `layers` layers split into `ranks` consecutive stages: as evenly as they
    go, the first ranks taking one more where they do not divide (empty where there are fewer layers than ranks)."""
    base, extra = divmod(layers, ranks)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


@define(frozen=True)
class GroupLayout:
    """Where a runner group's ranks run: MLX's host file, rank 0 on this machine (plugd.runner.group)."""

    hostfile: str
    ranks: int
    # The model's files by name, as paths into the store; a rank on a host without the daemon's model folder
    # links its own from them, so each host must hold the model at the same path (pulled there, or shared).
    files: dict[str, str] = Factory(dict)
    split: str | None = None  # TENSOR or PIPELINE; None: tensor where the architecture declares it, else pipeline


@define(frozen=True)
class RunnerConfig:
    """What a runner is started with: every runner-side choice, made by the daemon from the plugins' descriptors,
    so that the runner loads no plugins of its own."""

    module: str  # the architecture's model module (Architecture.module)
    cache_policy: str  # the cache policy's factory, "module:callable" (CachePolicy.factory)
    cache_budget: int | None = None  # the bytes the policy may keep beyond the live caches; None: it has no budget
    grammar_engines: dict[str, str] = Factory(dict)  # the installed engines' factories, by name (GrammarEngine)
    log_level: str = "INFO"
    embedding: EmbeddingLayout | None = None  # an embedding model's pipeline: the runner embeds, and generates not
    num_parallel: int = 1  # the completions the daemon sends at once, which decode together
    group: GroupLayout | None = None  # served by a group of ranks, not one process
    draft_module: str | None = None  # the model's draft's architecture module (plugd.runner.draft), where it has one

    def to_json(self) -> str:
        return json.dumps(converter.unstructure(self))

    @classmethod
    def from_json(cls, text: str) -> RunnerConfig:
        return converter.structure(json.loads(text), cls)


@frozen
class SamplingParams:
    """Sampling settings with Ollama's defaults. A seed of None (or negative) draws a fresh one."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalizes(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )

    def penalty_window(self, num_ctx: int) -> int:
        """How many recent tokens the penalties look at; repeat_last_n -1 means the whole context."""
        return num_ctx if self.repeat_last_n < 0 else self.repeat_last_n


@frozen
class GrammarSpec:
    """A completion body's "grammar": which engines may enforce it, what to enforce, and from which text on."""

    engines: tuple[str, ...]  # GrammarEngines' names, tried in this order; their factories are in the RunnerConfig
    kind: str
    format: Any
    after: str | None = None  # enforce only once the output contains this text (the end of a thinking block)

    def check(self) -> None:
        """GrammarRefused when the spec cannot be followed: the runner refuses it before any output."""
        if self.kind not in GRAMMAR_KINDS:
            raise GrammarRefused(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, not {self.kind!r}")
        if not self.engines:
            raise GrammarRefused("grammar 'engines' must name at least one engine")
        if self.after is not None and not self.after:
            raise GrammarRefused("grammar 'after' must be a non-empty string")


@define(kw_only=True)
class MediaSpan:
    """An image of a prompt: the positions [start, end) of its run of image tokens, the sha256 (hex) of its bytes,
    which keys the run in the cache, and the file the daemon wrote them to for the runner to read."""

    start: int
    end: int
    digest: str
    path: str = ""


@define(kw_only=True)
class Completion:
    """A /completion body: the prompt as token ids, each of its images a span of them, and how to generate."""

    tokens: list[int] = Factory(list)
    media: list[MediaSpan] = Factory(list)
    sampling: SamplingParams = Factory(SamplingParams)
    num_predict: int = -1  # any negative: until the context is full
    num_ctx: int = 2048  # prompt and generated tokens together
    num_keep: int = 0  # prompt tokens kept from the start when the prompt must be truncated
    stop: list[str] = Factory(list)
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: GrammarSpec | None = None
    truncate: bool = True  # False: a prompt over the context is refused (kind "context_exceeded"), not cut
    draft_tokens: int = DRAFT_TOKENS  # the most tokens drafted per speculative round, where the model drafts; 0: none


@define(kw_only=True)
class Embed:
    """An /embed body: inputs as token ids, each embedded apart (batched as the runner sees fit)."""

    inputs: list[list[int]]


def embed_batches(lengths: Sequence[int]) -> list[list[int]]:
    """The indices of inputs of these lengths, shortest first, cut into batches of at most EMBED_BATCH_TOKENS
    padded positions (one input alone when it is longer): how the daemon cuts its requests and the runner its
    forward passes."""
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batches and (len(batches[-1]) + 1) * lengths[index] <= EMBED_BATCH_TOKENS:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


@define(kw_only=True)
class Embedded:
    """The /embed answer: one vector per input, in order, and the time the model took."""

    embeddings: list[list[float]]
    duration: int  # nanoseconds


@define
class TokenEvent:
    """One generated token and the text it completed (empty while text is held back)."""

    text: str
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = Factory(list)


@define
class PrefillEvent:
    """How far the prefill is: reported as it starts (evaluated 0) and after each chunk, before any token comes."""

    prompt_tokens: int  # after truncation
    cached_tokens: int  # restored from the cache: the prefill does not evaluate them
    evaluated: int  # prompt tokens evaluated so far


@define
class DoneEvent:
    done_reason: str  # "stop" (end-of-sequence or stop string), "length" (num_predict or context full), "cancel"
    prompt_tokens: int  # after truncation
    prompt_eval_count: int  # prompt tokens evaluated, the reused prefix not included
    prompt_eval_duration: int  # nanoseconds, as every duration here
    eval_count: int  # generated tokens, an end-of-sequence token included
    eval_duration: int
    text: str = ""  # text still held when generation ended
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    context_full: bool = False  # "length" because prompt and output filled num_ctx, not because num_predict ran out


@define
class ErrorEvent:
    """Generation failed after the answer had begun; `kind` "grammar_dead_end" where the request's format
    could not be completed (the client's to mend), None for a failure of plugd's own."""

    error: str
    kind: str | None = None


RunnerEvent = PrefillEvent | TokenEvent | DoneEvent | ErrorEvent
_EVENT_TYPES: dict[str, type] = {"prefill": PrefillEvent, "token": TokenEvent, "done": DoneEvent, "error": ErrorEvent}
_TYPE_NAMES = {kind: name for name, kind in _EVENT_TYPES.items()}


def event_line(event: RunnerEvent) -> bytes:
    """One NDJSON line: the event's fields and its `type`."""
    return json.dumps({"type": _TYPE_NAMES[type(event)], **converter.unstructure(event)}).encode() + b"\n"


def read_event(line: str | bytes) -> RunnerEvent:
    """The event an `event_line` wrote; ValueError for anything else."""
    data: dict[str, Any] = json.loads(line)
    kind = _EVENT_TYPES.get(data.pop("type", None)) if isinstance(data, dict) else None
    if kind is None:
        raise ValueError(f"not a runner event: {line[:200]!r}")
    return converter.structure(data, kind)
