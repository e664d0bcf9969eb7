"""The Mamba2 selective state-space scan: a chunked matrix form for prompts, a single step for decoding.

Per head h (head_dim P, state size N; heads share B and C within groups):

    state_t = exp(dt_t * A_h) * state_{t-1} + dt_t * x_t (outer) B_t      state: (P, N)
    y_t     = state_t @ C_t + D_h * x_t

Over a chunk of s positions the recurrence unrolls into a masked
attention-like product (the state-space dual form): position t reads
position u <= t with weight (C_t . B_u) * exp(sum of dt*A over (u, t]), plus
the state the chunk started from, decayed to t. Prompts are scanned chunk by
chunk in that form; a single position uses the recurrence itself.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

CHUNK = 256


@mx.compile
def time_steps(dt: mx.array, dt_bias: mx.array, low: float, high: float) -> mx.array:
    """softplus(dt + dt_bias), clipped to the checkpoint's [low, high], in float32."""
    return mx.clip(nn.softplus(dt.astype(mx.float32) + dt_bias), low, high)


def selective_scan(
    x: mx.array, dt: mx.array, A: mx.array, B: mx.array, C: mx.array, D: mx.array, state: mx.array | None
) -> tuple[mx.array, mx.array]:
    """y and the state after x, from the state before it (None: zeros).

    x: (batch, length, heads, P); dt: (batch, length, heads), already
    discretised (`time_steps`); A, D: (heads,); B, C: (batch, length, groups, N);
    state: (batch, heads, P, N), float32.
    """
    if x.shape[1] == 1:
        if state is None:
            state = mx.zeros((x.shape[0], x.shape[2], x.shape[3], B.shape[-1]), mx.float32)
        y, state = _step(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, state)
        return y[:, None], state
    ys = []
    for start in range(0, x.shape[1], CHUNK):
        end = start + CHUNK
        y, state = _chunk(x[:, start:end], dt[:, start:end], A, B[:, start:end], C[:, start:end], state)
        ys.append(y)
    y = ys[0] if len(ys) == 1 else mx.concatenate(ys, axis=1)
    return (y + x * D[:, None]).astype(x.dtype), state


@mx.compile
def _step(x, dt, A, B, C, D, state):
    # x: (b, h, P); dt: (b, h); B, C: (b, g, N); state: (b, h, P, N)
    batch, heads, dims = x.shape
    groups, size = B.shape[1:]
    per_group = (batch, groups, heads // groups)
    decay = mx.exp(dt * A).reshape(*per_group, 1, 1)
    inflow = (dt[..., None] * x).reshape(*per_group, dims, 1) * B.reshape(batch, groups, 1, 1, size)
    state = state.reshape(*per_group, dims, size) * decay + inflow
    y = (state @ C.reshape(batch, groups, 1, size, 1)).reshape(batch, heads, dims)
    return (y + D[:, None] * x).astype(x.dtype), state.reshape(batch, heads, dims, size)


def _segment_sums(values: mx.array) -> mx.array:
    """(..., s) -> (..., s, s) with [t, u] = sum of values over (u, t] for u <= t, and -inf above the diagonal.

    Summed directly rather than as a difference of running sums, which would
    lose precision once the running sum is large.
    """
    length = values.shape[-1]
    below = mx.tril(mx.repeat(values[..., None], length, axis=-1), -1)
    sums = mx.cumsum(below, axis=-2)
    causal = mx.tril(mx.ones((length, length), mx.bool_))
    return mx.where(causal, sums, -mx.inf)


@mx.compile
def _chunk(x, dt, A, B, C, state):
    # x: (b, s, h, P); dt: (b, s, h); B, C: (b, s, g, N); state: (b, h, P, N) or None
    batch, length, heads, dims = x.shape
    groups, size = B.shape[-2:]
    per_group = (batch, groups, heads // groups)
    log_decay = (dt * A).transpose(0, 2, 1)  # (b, h, s)
    decay = mx.exp(_segment_sums(log_decay)).reshape(*per_group, length, length)
    B_ = B.transpose(0, 2, 1, 3)[:, :, None]  # (b, g, 1, s, N)
    C_ = C.transpose(0, 2, 1, 3)[:, :, None]
    mixing = decay * (C_ @ B_.swapaxes(-1, -2))  # (b, g, h/g, s, s)
    inputs = (x * dt[..., None]).transpose(0, 2, 1, 3).reshape(*per_group, length, dims)
    y = mixing @ inputs  # (b, g, h/g, s, P)
    to_end = decay[..., -1, :, None]  # (b, g, h/g, s, 1): decay from each position to the chunk's end
    new_state = (inputs * to_end).swapaxes(-1, -2) @ B_  # (b, g, h/g, P, N)
    if state is not None:
        state = state.reshape(*per_group, dims, size)
        from_start = mx.exp(mx.cumsum(log_decay, axis=-1)).reshape(*per_group, length, 1)
        y = y + from_start * (C_ @ state.swapaxes(-1, -2))
        new_state = new_state + from_start[..., -1:, :] * state
    y = y.reshape(batch, heads, length, dims).transpose(0, 2, 1, 3)
    return y, new_state.reshape(batch, heads, dims, size)
