"""The path the embedding endpoints share: resolve the model, tokenize the inputs, acquire its runner, embed.

Each text is encoded as sentence-transformers encodes it by default: the layout's default prompt before it, the
tokenizer's special tokens around it, cut to the layout's max_seq_length. Past the context (num_ctx, or the
model's) an input is cut (`truncate`, as Ollama's default) or refused; `dimensions` keeps the first that many of
each vector (Matryoshka), normalised again where the model normalises.
"""

from __future__ import annotations

import math
import time

import anyio
from attrs import define, field

from plugd.chat.models import ResolvedModel, embedding_layout, resolve
from plugd.chat.options import resolve_options
from plugd.chat.pipeline import Services
from plugd.chat.request import InvalidRequest
from plugd.chat.tokens import tokenizer_of
from plugd.protocol import embed_batches
from plugd.scheduler.durations import parse_keep_alive
from plugd.store.names import ModelName
from plugd.store.sentence_layout import EmbeddingLayout


@define
class EmbedRequest:
    model: str
    inputs: list[str] | list[list[int]]  # texts, or token ids (which get no prompt)
    truncate: bool = True
    dimensions: int | None = None
    keep_alive: str | float | None = None
    options: dict = field(factory=dict)


@define
class Embeddings:
    model: ResolvedModel
    vectors: list[list[float]]
    prompt_tokens: int
    load_duration: int
    total_duration: int


async def embed(services: Services, request: EmbedRequest) -> Embeddings:
    """The vectors of `request.inputs`, in order; InvalidRequest for inputs, options or a model that cannot be.
    No inputs (Ollama's way to preload an embedding model) loads the model and gives no vectors."""
    started = time.perf_counter_ns()
    try:
        keep_alive = parse_keep_alive(services.settings.keep_alive if request.keep_alive is None else request.keep_alive)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    model = await anyio.to_thread.run_sync(resolve, services.store, services.registry, ModelName.parse(request.model))
    layout = embedding_layout(model)
    if layout is None:
        raise InvalidRequest(f"model '{model.name}' does not support embeddings: it is not an embedding model")
    if request.dimensions is not None and not 1 <= request.dimensions <= layout.dimensions:
        raise InvalidRequest(f"dimensions must be between 1 and {layout.dimensions} for model '{model.name}', "
                             f"not {request.dimensions}")
    try:
        options = resolve_options(model.generation_config, model.parameters, request.options,
                                  model.config.get("context_length"), services.settings.context_length)
    except ValueError as exc:
        raise InvalidRequest(f"invalid options: {exc}") from None
    limit = min(options.num_ctx or math.inf, model.config.get("context_length") or math.inf)
    inputs = await anyio.to_thread.run_sync(_encoded, model, layout, request.inputs)
    inputs = [_fitted(i, tokens, limit, request.truncate) for i, tokens in enumerate(inputs)]
    vectors: list[list[float]] = [[] for _ in inputs]
    async with services.scheduler.acquire(model, options.num_ctx, keep_alive) as loaded:
        load_duration = time.perf_counter_ns() - started
        # One runner batch a request: each answers well within the runner's progress timeout.
        for part in embed_batches([len(tokens) for tokens in inputs]):
            for index, vector in zip(part, (await loaded.runner.embed([inputs[i] for i in part])).embeddings,
                                     strict=True):
                vectors[index] = vector
    if request.dimensions is not None:
        vectors = [_shortened(vector, request.dimensions, layout.normalize) for vector in vectors]
    return Embeddings(model, vectors, sum(map(len, inputs)), load_duration, time.perf_counter_ns() - started)


def _encoded(model: ResolvedModel, layout: EmbeddingLayout, inputs: list[str] | list[list[int]]) -> list[list[int]]:
    tokenizer, vocabulary = tokenizer_of(model), model.model_files.config.get("vocab_size", 0)
    encoded = []
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            encoded.append(tokenizer.encode_standalone(layout.prompt + item, layout.max_tokens))
        elif all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocabulary for t in item):
            encoded.append(list(item)[: layout.max_tokens])
        else:
            raise InvalidRequest(f"input {index} holds a token id outside the model's vocabulary of {vocabulary}")
    return encoded


def _fitted(index: int, tokens: list[int], limit: float, truncate: bool) -> list[int]:
    if not tokens:
        raise InvalidRequest(f"input {index} is empty")
    if len(tokens) <= limit:
        return tokens
    if not truncate:
        raise InvalidRequest(f"input {index} is {len(tokens)} tokens, more than the {int(limit)} the model takes "
                             "(the input length exceeds the context length)")
    return tokens[: int(limit)]


def _shortened(vector: list[float], dimensions: int, normalize: bool) -> list[float]:
    kept = vector[:dimensions]
    if not normalize:
        return kept
    norm = math.sqrt(sum(x * x for x in kept)) or 1.0
    return [x / norm for x in kept]
