"""What decoder-only language models share: the sizes every config.json gives under transformers' names, and a
model whose output head is its own `lm_head` or, with tied word embeddings, the input embedding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.linear import Linear


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of a decoder-only transformer; an architecture's ModelArgs extends it with its own settings."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float

    @staticmethod
    def fields(config: Mapping[str, Any]) -> dict[str, Any]:
        """The DecoderShape fields of a config.json: without `num_key_value_heads` every query head has its own
        key/value head, and `rms_norm_eps` defaults to 1e-6."""
        return {
            "vocab_size": config["vocab_size"],
            "hidden_size": config["hidden_size"],
            "intermediate_size": config["intermediate_size"],
            "num_hidden_layers": config["num_hidden_layers"],
            "num_attention_heads": config["num_attention_heads"],
            "num_key_value_heads": config.get("num_key_value_heads") or config["num_attention_heads"],
            "rms_norm_eps": config.get("rms_norm_eps", 1e-6),
        }


class LanguageModel(nn.Module):
    """A decoder under `model.` (embeddings in `model.embed_tokens`) and its output head: `lm_head`, or where
    `args.tie_word_embeddings` is set, the embedding matrix itself."""

    def __init__(self, args: Any, decoder: nn.Module):
        super().__init__()
        self.args = args
        self.model = decoder
        if not args.tie_word_embeddings:
            self.lm_head = Linear(args.hidden_size, args.vocab_size)

    def hidden_states(self, tokens: mx.array, lengths: mx.array) -> mx.array:
        """(batch, length) token ids, each row's first `lengths` real and the rest padding -> the decoder's final
        (normed) hidden states, without a cache: what an embedding model pools. Attention is causal here, so no
        real position sees the padding after it; a bidirectional model masks it instead."""
        return self.model(tokens, [None] * len(self.model.layers))

    def logits(self, h: mx.array) -> mx.array:
        """Final hidden states -> vocabulary logits."""
        return self.model.embed_tokens.as_linear(h) if self.args.tie_word_embeddings else self.lm_head(h)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Drops the copy of the embeddings some tied checkpoints still carry as `lm_head.weight`."""
        if self.args.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return weights
