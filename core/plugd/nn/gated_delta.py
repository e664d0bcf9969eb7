"""The gated delta rule (Gated DeltaNet linear attention), one position at a time.

Per value head, with a state S of shape (value_dim, key_dim):

    S_t = g_t * S_{t-1}                       decay, g_t = exp(-exp(A_log) * softplus(a_t + dt_bias))
    S_t = S_t + beta_t * (v_t - S_t k_t) k_t^T  delta rule: write v_t at k_t, replacing what was there
    y_t = S_t q_t

Query and key are L2-normalised (the query also scaled by key_dim^-1/2).
Several value heads may share one key head (grouped like grouped-query
attention: value head j reads key head j // (value_heads / key_heads)).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

L2_EPS = 1e-6


def normalize_qk(q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
    """L2-normalise q and k over their last axis (eps added to the sum of squares); scale q by key_dim^-1/2.

    x / sqrt(sum(x^2) + eps) == rms_norm(x, eps / d) / sqrt(d), so the fused
    RMS norm does it.
    """
    dims = k.shape[-1]
    eps = L2_EPS / dims
    return mx.fast.rms_norm(q, None, eps) / dims, mx.fast.rms_norm(k, None, eps) * dims**-0.5


@mx.compile
def gates(a: mx.array, b: mx.array, A_log: mx.array, dt_bias: mx.array) -> tuple[mx.array, mx.array]:
    """The decay g (float32) and the write strength beta = sigmoid(b), per position and value head."""
    decay = mx.exp(-mx.exp(A_log.astype(mx.float32)) * nn.softplus(a + dt_bias))
    return decay, mx.sigmoid(b)


def gated_delta(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array | None
) -> tuple[mx.array, mx.array]:
    """Outputs (batch, length, value_heads, value_dim) and the state after the last position.

    q, k: (batch, length, key_heads, key_dim), normalised (`normalize_qk`);
    v: (batch, length, value_heads, value_dim); g, beta: (batch, length,
    value_heads); state: (batch, value_heads, value_dim, key_dim), float32,
    or None for a fresh start.
    """
    batch, length, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[-2:]
    if state is None:
        state = mx.zeros((batch, value_heads, value_dim, key_dim), mx.float32)
    # Value heads grouped under their key head: (batch, key_heads, heads per key head, ...).
    grouped = (batch, key_heads, value_heads // key_heads)
    state = state.reshape(*grouped, value_dim, key_dim)
    q = q.reshape(batch, length, key_heads, 1, 1, key_dim)
    k = k.reshape(batch, length, key_heads, 1, 1, key_dim)
    v = v.reshape(batch, length, *grouped[1:], value_dim)
    g = g.reshape(batch, length, *grouped[1:], 1, 1)
    beta = beta.reshape(batch, length, *grouped[1:], 1)
    ys = []
    for t in range(length):
        y, state = _step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        ys.append(y)
    y = ys[0][:, None] if length == 1 else mx.stack(ys, axis=1)
    return y.reshape(batch, length, value_heads, value_dim), state.reshape(batch, value_heads, value_dim, key_dim)


@mx.compile
def _step(q, k, v, g, beta, state):
    # q, k: (b, hk, 1, 1, dk); v: (b, hk, r, dv); g: (b, hk, r, 1, 1); beta: (b, hk, r, 1); state: (b, hk, r, dv, dk)
    state = state * g
    recalled = (state * k).sum(axis=-1)  # (b, hk, r, dv)
    state = state + ((v - recalled) * beta)[..., None] * k
    return (state * q).sum(axis=-1).astype(v.dtype), state
