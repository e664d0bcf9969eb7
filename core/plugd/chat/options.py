"""Generation options: Ollama's defaults, then the checkpoint's generation_config, the Modelfile, the request."""

from __future__ import annotations

from typing import Any

import attrs

from plugd.constants import DRAFT_TOKENS, MAX_DRAFT_TOKENS
from plugd.protocol import Completion, SamplingParams
from plugd.types import Options, structure

# Ollama's defaults, except num_ctx: PLUGD_CONTEXT_LENGTH when set, else None, which the scheduler sizes per model at
# load to the memory left after its weights (plugd.scheduler.memory.default_context).
DEFAULTS: dict[str, Any] = {
    "num_batch": 512,
    "num_keep": 4,
    "num_predict": -1,
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "repeat_penalty": 1.1,
    "repeat_last_n": 64,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "seed": None,
    "stop": [],
    "draft_tokens": DRAFT_TOKENS,
}
# The values each option can take (low, high; None: unbounded); Ollama's special values (num_predict and num_keep
# -1, repeat_last_n -1 for the whole context, a negative seed for a fresh one) lie inside. Counts of tokens stop
# at what a 32-bit index holds, seeds at 64 bits, as the runner's arrays and random keys take them.
_COUNT = 2**31 - 1
RANGES: dict[str, tuple[float | None, float | None]] = {
    "num_ctx": (1, _COUNT), "num_batch": (1, _COUNT), "num_predict": (None, _COUNT), "num_keep": (None, _COUNT),
    "repeat_last_n": (-1, _COUNT), "temperature": (0, None), "top_k": (0, _COUNT), "top_p": (0, 1), "min_p": (0, 1),
    "seed": (None, 2**64 - 1), "draft_tokens": (0, MAX_DRAFT_TOKENS),
}
# generation_config.json keys that mean the same as an Ollama option.
_GENERATION_CONFIG = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                      "repetition_penalty": "repeat_penalty"}


def resolve_options(generation_config: dict[str, Any], parameters: dict[str, Any], request: dict[str, Any] | None,
                    context_length: int | None, default_num_ctx: int | None = None) -> Options:
    """Every option set, later sources winning (the first: `default_num_ctx`, PLUGD_CONTEXT_LENGTH); num_ctx capped
    at the model's trained context length, and None when no source sets it (the scheduler then sizes the model's
    context to memory)."""
    merged = dict(DEFAULTS)
    if default_num_ctx is not None:
        merged["num_ctx"] = default_num_ctx
    merged |= {ours: generation_config[theirs] for theirs, ours in _GENERATION_CONFIG.items()
               if isinstance(generation_config.get(theirs), (int, float))}
    merged |= parameters
    known = {a.name for a in attrs.fields(Options)}
    merged |= {k: v for k, v in (request or {}).items() if k in known and v is not None}
    options = structure(merged, Options)
    for name, (low, high) in RANGES.items():
        value = getattr(options, name)
        if value is not None and (low is not None and value < low or high is not None and value > high):
            bounds = (f"at least {low}" if high is None else f"at most {high}" if low is None
                      else f"between {low} and {high}")
            raise ValueError(f"{name} must be {bounds}, not {value}")
    if context_length and options.num_ctx is not None and options.num_ctx > context_length:
        options.num_ctx = context_length
    return options


def completion(options: Options, logprobs: bool, top_logprobs: int, truncate: bool) -> Completion:
    """The runner's /completion for these options; the caller adds the prompt and any grammar."""
    sampling = SamplingParams(**{field.name: getattr(options, field.name) for field in attrs.fields(SamplingParams)})
    return Completion(sampling=sampling, num_predict=options.num_predict, num_ctx=options.num_ctx,
                      num_keep=options.num_keep, stop=options.stop or [], logprobs=logprobs,
                      top_logprobs=top_logprobs, truncate=truncate, draft_tokens=options.draft_tokens)
