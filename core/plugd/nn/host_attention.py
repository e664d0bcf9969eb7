"""Attention on the CPU with the softmax computed by numpy (see `plugd.nn.attention` for which queries).

MLX's CPU backend evaluates `exp` one element at a time on x86 (about 28 ns each on
this project's machines, against 2.5 ns for an add), so a prefill chunk over a long
cache spends most of its time in the softmax over its scores: 256 queries of 12
heads over 9,256 keys took 1,020 ms in `mx.fast.scaled_dot_product_attention` and
187 ms here. The two products stay in MLX: numpy's own BLAS would bring a second
thread pool whose spinning threads fight MLX's for the cores (a 256-token prefill
after 8k cached tokens took ~6.2 s that way, ~5.5 s this way). The arithmetic is the
same, in float32, and agrees to float32 rounding (about 3e-7). numpy cannot be
traced, so nothing here is differentiable or compilable: see
`plugd.nn.attention.traceable`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def host_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: mx.array | str | None
) -> mx.array:
    """What `mx.fast.scaled_dot_product_attention` returns for (batch, heads, length, head_dim) tensors, keys and
    values with a divisor of the query heads, and a mask that is None, "causal" (the last query aligned to the last
    key), a boolean array (True attends) or an additive one, broadcastable to (batch, heads, queries, keys)."""
    dtype = queries.dtype
    queries, keys, values = (t.astype(mx.float32) for t in (queries, keys, values))
    batch, heads, length, head_dim = queries.shape
    kv_heads, key_length = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    bias = _as_array(mask, length, key_length)
    outputs = []
    # One key/value head at a time, so only one group's scores exist at once.
    for h in range(kv_heads):
        heads_of_group = slice(h * group, (h + 1) * group)
        grouped = queries[:, heads_of_group].reshape(batch, group * length, head_dim) * scale
        scores = grouped @ keys[:, h].swapaxes(-1, -2)
        mx.eval(scores)
        # The softmax is written over the evaluated scores' own buffer, which nothing else shares; the product
        # with the values below then reads the probabilities from it.
        _softmax_in_place(np.asarray(scores).reshape(batch, group, length, key_length), bias, heads_of_group, heads)
        outputs.append((scores @ values[:, h]).reshape(batch, group, length, head_dim))
        mx.eval(outputs[-1])
    return mx.concatenate(outputs, axis=1).astype(dtype)


def _softmax_in_place(scores: np.ndarray, bias: np.ndarray | None, heads_of_group: slice, heads: int) -> None:
    if bias is not None:
        part = bias[:, heads_of_group] if bias.shape[1] == heads else bias
        if part.dtype == np.bool_:
            np.copyto(scores, np.float32(-np.inf), where=~part)
        else:
            scores += part
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)


def _as_array(mask: mx.array | str | None, length: int, key_length: int) -> np.ndarray | None:
    """The mask as a 4-d numpy array (boolean or additive float32), or None for no mask."""
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        return (np.arange(key_length)[None] <= np.arange(length)[:, None] + (key_length - length))[None, None]
    mask = mask if mask.dtype == mx.bool_ else mask.astype(mx.float32)
    mx.eval(mask)
    array = np.asarray(mask)
    return array.reshape((1,) * (4 - array.ndim) + array.shape)
