"""Tiny checkpoints trained until they reproduce given transcripts, so end-to-end tests see real model output.

    train_checkpoint(tmp_path / "agent", [Transcript(prompt, completion), ...])

writes a tiny random checkpoint (plugd.testing.checkpoints.write_checkpoint),
trains every one of its tensors with Adam on CPU in float32, the loss on the
completion and the end-of-turn token `<|im_end|>` that follows it, until the
runner's own engine, decoding greedily, answers each prompt with exactly its
completion; then writes the trained tensors back into the checkpoint's
safetensors under their own names and dtypes.

The tensors trained are the checkpoint's, not the model's parameters: the
architecture plugin's `sanitize` (renames, expert stacking) runs inside every
step, so any architecture whose folds and forward pass are differentiable
trains, and the result saves under the checkpoint's names with nothing to map
back.

`train_mtp_head` then trains a checkpoint's multi-token-prediction head
(plugd.nn.mtp) alone, on the model's own hidden states, until it drafts every
transcript token two ahead: a drafter whose drafts the model accepts.

Training runs in a child process (`python -m plugd.testing.training`) set up
like a runner: on Linux a system OpenBLAS serves MLX's float32 GEMMs there,
several times faster than the reference BLAS the mlx-cpu wheel links, and the
caller's process keeps its MLX memory and default device to itself.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from attrs import asdict, define
from mlx.utils import tree_unflatten

from plugd import __version__, plugins
from plugd.hookspecs import Architecture, LayerCache
from plugd.nn.attention import traceable
from plugd.protocol import Completion, DoneEvent, SamplingParams
from plugd.runner.generate import Engine
from plugd.runner.loading import compute_dtype, load_model, read_weights
from plugd.scheduler.runner_client import runner_env
from plugd.testing.checkpoints import write_checkpoint
from plugd.tokenizer import Tokenizer

log = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
# Greedy decoding is checked only once every completion token leads the runner-up by this many logits, so that
# small numerical differences (prefill in chunks, bfloat16 weights on a GPU) cannot flip a choice.
DEFAULT_MARGIN = 1.0
# The checkpoint tensors of a multi-token-prediction head, as Qwen3-Next's and Qwen3.5's hold it.
MTP_PREFIX = "mtp."
# A shorter memory of squared gradients than Adam's default 0.999: full-batch memorisation then converges in a
# third of the steps, and as reliably across seeds.
ADAM_BETAS = (0.9, 0.95)
# MLX's CPU softmax (a slow exp) dominates a training step and grows with the number of attention heads. With one
# head in one layer a handful of transcripts of a few hundred tokens train in seconds; the tiny config's four heads
# in two layers take a minute.
FAST_OVERRIDES = {"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 32}
# For prompts of any length (a coding agent's first request is 60,000 tokens of the tiny tokenizer): gemma3_text
# with one sliding-window layer, so that an answer depends on the last 64 prompt tokens only and trains in seconds,
# and what a client varies further back (Codex puts a random chunk id and a timing ahead of a command's output)
# cannot change it. Two heads of a 128-wide layer learn a few agent turns from every seed tried (one head of a
# 64-wide one failed one seed in three); its context is as long as Gemma 3's own.
LONG_PROMPT_MODEL_TYPE = "gemma3_text"
LONG_PROMPT_OVERRIDES = {
    "num_hidden_layers": 1, "layer_types": ["sliding_attention"], "sliding_window": 64, "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    "max_position_embeddings": 131072,
}


@define(frozen=True)
class Transcript:
    """A prompt exactly as the runner receives it, and the text the model must generate after it."""

    prompt: str
    completion: str


class TrainingError(RuntimeError):
    """The checkpoint cannot be trained, or did not learn its transcripts within the allowed steps."""


@define(frozen=True)
class _Example:
    """One transcript as token ids: the prompt as the runner encodes it, then the completion and the end of turn.

    `reach`, for a model whose every layer attends through a sliding window, is how many of the last prompt
    tokens the answer can depend on; only those are trained on, so a prompt of 20,000 tokens trains as fast as
    one of a few hundred. Rotary embeddings see only relative positions, so the window trains as it runs."""

    transcript: Transcript
    prompt: list[int]
    answer: list[int]
    reach: int | None = None

    @property
    def trained_prompt(self) -> list[int]:
        return self.prompt[-self.reach:] if self.reach else self.prompt

    @property
    def sequence(self) -> list[int]:
        return self.trained_prompt + self.answer


@define(frozen=True)
class _Batch:
    """Sequences of similar length, right-padded together: inputs, next-token targets, and where the loss counts."""

    inputs: mx.array
    targets: mx.array
    mask: mx.array


def train_checkpoint(
    path: Path,
    transcripts: Sequence[Transcript],
    *,
    model_type: str = "qwen3",
    tokenizer: str = "tiny",
    seed: int = 0,
    dtype: str = "float32",
    max_steps: int = 600,
    learning_rate: float = 1e-2,
    margin: float = DEFAULT_MARGIN,
    overrides: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """Write a tiny checkpoint into `path`, train it until greedy decoding reproduces every transcript, return `path`.

    Deterministic by `seed` (the initial weights; training itself draws
    nothing) on a given machine. `overrides` change the tiny config
    (write_checkpoint's): FAST_OVERRIDES trains several times faster; a larger
    model learns more transcripts. With a `cache_dir`, a checkpoint trained
    before on the same transcripts and settings is copied from there instead of
    trained again. Raises TrainingError when `max_steps` Adam steps are not enough.
    """
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    path = Path(path)
    settings = {"learning_rate": learning_rate, "margin": margin, "betas": ADAM_BETAS}
    checkpoint = {
        "model_type": model_type, "tokenizer": tokenizer, "seed": seed, "dtype": dtype, "overrides": overrides or {},
    }
    cached = None
    if cache_dir is not None:
        cached = Path(cache_dir) / _cache_key(transcripts, {**settings, **checkpoint, "plugd": __version__})
        if cached.is_dir():
            shutil.copytree(cached, path, dirs_exist_ok=True)
            return path
    write_checkpoint(path, model_type, seed=seed, dtype=dtype, tokenizer=tokenizer, overrides=overrides)
    _run_trainer(path, transcripts, max_steps=max_steps, **settings)
    if cached is not None:
        _store(path, cached)
    return path


def _cache_key(transcripts: Sequence[Transcript], settings: dict[str, Any]) -> str:
    content = {"transcripts": [asdict(t) for t in transcripts], **settings}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:24]


def _store(path: Path, cached: Path) -> None:
    """Copy `path` to `cached` atomically: a concurrent session sees all of it or none."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
    shutil.copytree(path, partial, dirs_exist_ok=True)
    try:
        partial.rename(cached)
    except OSError:  # another session stored the same result first
        shutil.rmtree(partial)


def train_mtp_head(path: Path, transcripts: Sequence[Transcript], *, max_steps: int = 600,
                   learning_rate: float = 1e-2, margin: float = DEFAULT_MARGIN) -> Path:
    """Train the multi-token-prediction head of the checkpoint in `path` (its MTP_PREFIX tensors; the model's own
    stay as they are) until it names every completion token after the first, and the end of turn, by `margin`
    logits, from the model's final hidden states two positions before it and the token between (the head runs
    over the whole transcript, as over a prompt it drafts after); write it back and return `path`. Train the model
    first (train_checkpoint) for drafts the model will agree with. Raises TrainingError when the checkpoint has no
    head, or `max_steps` Adam steps are not enough."""
    _run_trainer(path, transcripts, head=True, max_steps=max_steps, learning_rate=learning_rate, margin=margin,
                 betas=ADAM_BETAS)
    return path


def _run_trainer(path: Path, transcripts: Sequence[Transcript], **settings: Any) -> None:
    job = {"path": str(path), "transcripts": [asdict(t) for t in transcripts], **settings}
    done = subprocess.run(
        [sys.executable, "-m", __name__], input=json.dumps(job), env=runner_env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise TrainingError(done.stderr.strip() or f"the trainer exited with status {done.returncode}")
    log.info("trained %s: %s", path, done.stdout.strip())


def main() -> None:
    """The trainer process: a job as JSON on stdin; a summary on stdout, or the reason it failed on stderr."""
    job = json.load(sys.stdin)
    mx.set_default_device(mx.cpu)
    started = time.perf_counter()
    try:
        steps = (_train_head if job.get("head") else _train)(
            Path(job["path"]), [Transcript(**t) for t in job["transcripts"]], max_steps=job["max_steps"],
            learning_rate=job["learning_rate"], betas=job["betas"], margin=job["margin"],
        )
    except TrainingError as error:
        sys.exit(str(error))
    print(json.dumps({"steps": steps, "seconds": round(time.perf_counter() - started, 2)}))


def _train(
    path: Path, transcripts: Sequence[Transcript], *, max_steps: int, learning_rate: float, betas: Sequence[float],
    margin: float,
) -> int:
    """Train the checkpoint in `path` in place; the number of steps it took."""
    config = json.loads((path / "config.json").read_text())
    if "quantization" in config:
        raise TrainingError(f"{path}: a quantized checkpoint cannot be trained")
    architecture = _architecture(config["model_type"])
    model = load_model(path, importlib.import_module(architecture.module))
    tok = Tokenizer.from_dir(path)
    reach = _reach(architecture.cache_layers(config.get("text_config", config)))
    examples = [_example(tok, transcript, _end_of_turn(config), reach) for transcript in transcripts]
    batches = _batches(examples)
    stored = read_weights(path)
    weights = {name: tensor.astype(mx.float32) for name, tensor in stored.items()}
    optimizer = optim.Adam(learning_rate, betas=list(betas))
    loss_and_grad = mx.value_and_grad(lambda w: _loss(model, w, batches))
    for step in range(1, max_steps + 1):
        (loss, least_lead), grads = loss_and_grad(weights)
        mx.eval(loss, least_lead, grads)
        if least_lead.item() >= margin:
            # What is checked is what is saved: the weights rounded to the checkpoint's dtypes.
            rounded = {name: tensor.astype(stored[name].dtype) for name, tensor in weights.items()}
            if _reproduces(model, rounded, tok, examples):
                _save(path, rounded)
                return step
        weights = optimizer.apply_gradients(grads, weights)
    raise TrainingError(
        f"{path}: greedy decoding did not reproduce all {len(transcripts)} transcripts within {max_steps} steps "
        f"(last loss {loss.item():.4f}, least lead of a completion token {least_lead.item():.3f}); "
        "raise max_steps or enlarge the model with overrides"
    )


def _train_head(
    path: Path, transcripts: Sequence[Transcript], *, max_steps: int, learning_rate: float, betas: Sequence[float],
    margin: float,
) -> int:
    """Train the checkpoint's multi-token-prediction head in place; the number of steps it took."""
    config = json.loads((path / "config.json").read_text())
    model = load_model(path, importlib.import_module(_architecture(config["model_type"]).module))
    drafter = model.drafter() if hasattr(model, "drafter") else None
    if drafter is None:
        raise TrainingError(f"{path}: the checkpoint has no multi-token-prediction head to train")
    tok = Tokenizer.from_dir(path)
    examples = [_example(tok, transcript, _end_of_turn(config), None) for transcript in transcripts]
    sequences = [mx.array(example.sequence)[None] for example in examples]
    # The first completion token is the model's to draft; the prompt's tokens are no one's.
    drafted = [len(example.prompt) - 1 for example in examples]
    hidden = [model(sequence, return_hidden=True)[1] for sequence in sequences]
    stored = read_weights(path)
    frozen = {name: tensor.astype(mx.float32) for name, tensor in stored.items() if not name.startswith(MTP_PREFIX)}
    head = {name: tensor.astype(mx.float32) for name, tensor in stored.items() if name.startswith(MTP_PREFIX)}
    mx.eval(hidden, frozen, head)

    def loss(weights: dict[str, mx.array]) -> tuple[mx.array, mx.array]:
        _apply(model, frozen | weights)
        total, count, least_lead = mx.array(0.0), 0, mx.array(mx.inf)
        with traceable():
            for sequence, states, first in zip(sequences, hidden, drafted, strict=True):
                logits, _ = drafter(states[:, :-2], sequence[:, 1:-1])  # (h_t, x_t+1) -> x_t+2
                logits, targets = logits[:, first:], sequence[:, first + 2:]
                total += nn.losses.cross_entropy(logits, targets, reduction="sum")
                count += targets.size
                wanted = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
                others = mx.put_along_axis(logits, targets[..., None], mx.array(-mx.inf, logits.dtype), axis=-1)
                least_lead = mx.minimum(least_lead, mx.stop_gradient((wanted - others.max(axis=-1)).min()))
        return total / count, least_lead

    optimizer = optim.Adam(learning_rate, betas=list(betas))
    loss_and_grad = mx.value_and_grad(loss)
    for step in range(1, max_steps + 1):
        (value, least_lead), grads = loss_and_grad(head)
        mx.eval(value, least_lead, grads)
        if least_lead.item() >= margin:
            _save(path, {name: tensor.astype(stored[name].dtype) for name, tensor in (frozen | head).items()})
            return step
        head = optimizer.apply_gradients(grads, head)
    raise TrainingError(f"{path}: the multi-token-prediction head did not learn every transcript within {max_steps} "
                        f"steps (last loss {value.item():.4f}, least lead {least_lead.item():.3f})")


def _architecture(model_type: str) -> Architecture:
    """The architecture the runner would run `model_type` with, found through the plugins."""
    architecture = plugins.load().architectures().get(model_type)
    if architecture is None:
        raise TrainingError(f"no installed plugin provides the architecture {model_type!r}")
    return architecture


def _end_of_turn(config: dict[str, Any]) -> int:
    eos = config["eos_token_id"]
    return eos if isinstance(eos, int) else eos[0]


def _reach(layers: list[LayerCache]) -> int | None:
    """How many positions, the last included, one position's output depends on: through sliding-window layers
    of windows W1 ... WL, the sum of (Wi - 1), plus 1; None (all of them) when any layer attends to the whole
    context or keeps a state. Layers that cache nothing (sharing another's keys and values) add no reach."""
    caching = [layer for layer in layers if layer != LayerCache()]
    if not caching or any(layer.window is None or layer.state or layer.state_float32 for layer in caching):
        return None
    return sum(layer.window - 1 for layer in caching) + 1


def _example(tok: Tokenizer, transcript: Transcript, end_of_turn: int, reach: int | None) -> _Example:
    """Prompt and completion tokenized apart, as the runner sees them: the prompt encoded, the rest generated."""
    completion = tok.encode(transcript.completion)
    if tok.bos_id is not None and completion[:1] == [tok.bos_id]:
        completion = completion[1:]
    return _Example(transcript, tok.encode(transcript.prompt), completion + [end_of_turn], reach)


def _batches(examples: list[_Example]) -> list[_Batch]:
    """Examples grouped by length, longest first; a group takes no sequence that padding would more than double."""
    groups: list[list[_Example]] = []
    for example in sorted(examples, key=lambda e: len(e.sequence), reverse=True):
        if groups and 2 * len(example.sequence) >= len(groups[-1][0].sequence):
            groups[-1].append(example)
        else:
            groups.append([example])
    return [_batch(group) for group in groups]


def _batch(examples: list[_Example]) -> _Batch:
    width = max(len(e.sequence) for e in examples) - 1
    inputs, targets, mask = [], [], []
    for e in examples:
        padding = [0] * (width + 1 - len(e.sequence))
        inputs.append(e.sequence[:-1] + padding)
        targets.append(e.sequence[1:] + padding)
        # The position whose next token is the answer's first is the prompt's last.
        mask.append([len(e.trained_prompt) - 1 <= i < len(e.sequence) - 1 for i in range(width)])
    return _Batch(mx.array(inputs, mx.int32), mx.array(targets, mx.int32), mx.array(mask, mx.float32))


def _apply(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Put the checkpoint tensors `weights` into `model` through its own sanitize, as loading does."""
    model.update(tree_unflatten(list(model.sanitize(dict(weights)).items())))


def _loss(model: nn.Module, weights: dict[str, mx.array], batches: list[_Batch]) -> tuple[mx.array, mx.array]:
    """Mean cross-entropy over the answer tokens, and the least lead of a wanted token over its runner-up."""
    _apply(model, weights)
    total, count, least_lead = mx.array(0.0), mx.array(0.0), mx.array(mx.inf)
    with traceable():
        for batch in batches:
            logits = model(batch.inputs)
            total += (nn.losses.cross_entropy(logits, batch.targets, reduction="none") * batch.mask).sum()
            count += batch.mask.sum()
            wanted = mx.take_along_axis(logits, batch.targets[..., None], axis=-1)[..., 0]
            others = mx.put_along_axis(logits, batch.targets[..., None], mx.array(-mx.inf, logits.dtype), axis=-1)
            lead = mx.where(batch.mask > 0, wanted - others.max(axis=-1), mx.inf)
            least_lead = mx.minimum(least_lead, mx.stop_gradient(lead.min()))
    return total / count, least_lead


def _reproduces(model: nn.Module, weights: dict[str, mx.array], tok: Tokenizer, examples: list[_Example]) -> bool:
    """Whether the runner's engine, greedy, answers every prompt with exactly its completion and then stops."""
    _apply(model, {name: tensor.astype(compute_dtype()) for name, tensor in weights.items()})  # as loading casts
    engine = Engine(model, tok)  # a fresh one: a previous engine's caches hold keys of older weights
    for example in examples:
        request = Completion(
            tokens=example.prompt, sampling=GREEDY, num_predict=len(example.answer) + 8,
            num_ctx=len(example.prompt) + len(example.answer) + 8, num_keep=0, stop=[],
        )
        *events, done = engine.complete(request, lambda: False)
        assert isinstance(done, DoneEvent)
        if done.done_reason != "stop" or "".join(e.text for e in events) + done.text != example.transcript.completion:
            return False
    return True


def _save(path: Path, weights: dict[str, mx.array]) -> None:
    """Write `weights` over the checkpoint's safetensors, each tensor into its own file; each file replaced whole."""
    with tempfile.TemporaryDirectory(dir=path) as scratch:  # a folder: loading globs *.safetensors, not below
        for file in sorted(path.glob("*.safetensors")):
            written = Path(scratch) / file.name
            mx.save_safetensors(str(written), {name: weights[name] for name in mx.load(str(file))}, metadata={"format": "pt"})
            written.replace(file)


if __name__ == "__main__":
    main()
