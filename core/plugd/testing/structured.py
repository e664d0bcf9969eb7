"""A tiny model for structured-output tests: random weights that lean towards JSON's closing punctuation.

A plain random model fills strings and numbers for thousands of tokens; this one closes them within a few,
and its eagerness to close (`}` before the required keys, `"` before minLength) is what a grammar engine has
to overrule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from plugd.testing.checkpoints import write_checkpoint

CLOSERS = ('"', "}", "]")
CLOSING_BIAS = 3.0  # nats added to the logit of every token with a closer in it


def json_leaning_checkpoint(path: Path, tokenizer: str = "tiny", leaning: Mapping[str, float] | None = None) -> Path:
    """A tiny qwen3 whose next-token distribution is about uniform plus CLOSING_BIAS on closing punctuation.

    `leaning` adds more biases, in nats, to tokens given by their text (added tokens such as "</think>" too).

    Hidden dimension 0 carries a constant that dominates every RMS norm (the embedding sets it large, no
    o_proj or down_proj row writes it), so after the final norm it is sqrt(hidden_size) and the lm_head's
    column 0 works as a per-token bias; the other dimensions, squashed by the norm, leave only a small
    random preference between tokens.
    """
    write_checkpoint(path, "qwen3", seed=3, tokenizer=tokenizer)
    config = json.loads((path / "config.json").read_text())
    vocab = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
    closers = [i for piece, i in vocab.items() if any(c in piece for c in CLOSERS) and i < config["vocab_size"]]
    weights = load_file(str(path / "model.safetensors"))
    weights["model.embed_tokens.weight"][:, 0] = 10.0
    weights["model.norm.weight"][0] = 1.0
    for name, tensor in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor[0, :] = 0.0
    lm_head = weights["lm_head.weight"]
    lm_head[:, 0] = 0.0
    lm_head[closers, 0] = CLOSING_BIAS / math.sqrt(config["hidden_size"])
    vocabulary = Tokenizer.from_file(str(path / "tokenizer.json"))
    for text, bias in (leaning or {}).items():
        lm_head[vocabulary.token_to_id(text), 0] = bias / math.sqrt(config["hidden_size"])
    save_file(weights, str(path / "model.safetensors"))
    return path
