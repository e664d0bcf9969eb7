"""The recurrent building blocks of plugd.nn: the recurrent cache, the short convolution, the Mamba2 scan and the
gated delta rule, each against a plain NumPy recurrence written from the definition."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from plugd.nn import mamba
from plugd.nn.cache import KVCache
from plugd.nn.gated_delta import gated_delta, gates, normalize_qk
from plugd.nn.recurrent import RecurrentCache
from plugd.nn.short_conv import ShortConv, fold_conv_weights

RNG = np.random.default_rng(0)


def normal(*shape: int, scale: float = 1.0) -> mx.array:
    return mx.array((scale * RNG.standard_normal(shape)).astype(np.float32))


def close(ours: mx.array, expected: np.ndarray, tolerance: float = 1e-4) -> bool:
    return np.allclose(np.array(ours), expected, rtol=tolerance, atol=tolerance)


# ---- the cache ------------------------------------------------------------------------------------------------------

def test_only_key_value_caches_can_be_trimmed():
    assert KVCache.trimmable and not RecurrentCache.trimmable
    cache = RecurrentCache()
    cache.advance(normal(1, 3, 4), normal(1, 2, 4, 4), 5)
    assert cache.trim(0) == 0 and cache.trim(2) == 0
    assert cache.offset == 5


def test_a_snapshot_is_unchanged_by_later_updates_and_restores_exactly():
    cache = RecurrentCache()
    assert cache.state is None
    conv, recurrent = normal(1, 3, 4), normal(1, 2, 4, 4)
    cache.advance(conv, recurrent, 7)
    snapshot = cache.state
    cache.advance(normal(1, 3, 4), normal(1, 2, 4, 4), 1)
    assert cache.offset == 8 and snapshot.offset == 7
    assert mx.array_equal(snapshot.conv, conv) and mx.array_equal(snapshot.recurrent, recurrent)
    restored = RecurrentCache()
    restored.state = snapshot
    assert restored.offset == 7 and restored.conv is conv and restored.recurrent is recurrent
    restored.state = None
    assert (restored.offset, restored.conv, restored.recurrent) == (0, None, None)


# ---- the short convolution -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def conv() -> ShortConv:
    layer = ShortConv(6, 4, bias=True)
    layer.weight, layer.bias = normal(6, 4, 1), normal(6)
    return layer


def test_short_conv_streams_in_chunks_like_mlx_conv1d_on_the_whole_sequence(conv):
    x = normal(1, 11, 6)
    padded = mx.pad(x, [(0, 0), (3, 0), (0, 0)])
    expected = np.array(mx.sigmoid(y := mx.conv1d(padded, conv.weight, groups=6) + conv.bias) * y)
    window, pieces = None, []
    for start, end in ((0, 5), (5, 6), (6, 11)):
        out, window = conv(x[:, start:end], window)
        pieces.append(out)
    assert close(mx.concatenate(pieces, axis=1), expected, 1e-5)
    assert mx.array_equal(window, x[:, -3:])


def test_fold_conv_weights_moves_only_the_hugging_face_layout():
    hugging_face = {"a.conv1d.weight": normal(6, 1, 4), "a.conv1d.bias": normal(6)}
    assert fold_conv_weights(hugging_face)
    assert hugging_face["a.conv1d.weight"].shape == (6, 4, 1) and hugging_face["a.conv1d.bias"].shape == (6,)
    converted = {"a.conv1d.weight": normal(6, 4, 1)}
    assert not fold_conv_weights(converted) and converted["a.conv1d.weight"].shape == (6, 4, 1)


# ---- the Mamba2 scan -------------------------------------------------------------------------------------------------

def mamba_reference(x, dt, A, B, C, D, state):
    """Per position: state = exp(dt A) state + dt x B^T; y = state C + D x (float64)."""
    x, dt, A, B, C, D, state = (np.array(a, np.float64) for a in (x, dt, A, B, C, D, state))
    heads, groups = x.shape[2], B.shape[2]
    ys = []
    for t in range(x.shape[1]):
        Bt = np.repeat(B[:, t], heads // groups, axis=1)  # (b, h, N)
        Ct = np.repeat(C[:, t], heads // groups, axis=1)
        decay = np.exp(dt[:, t] * A)[..., None, None]
        state = decay * state + (dt[:, t, :, None] * x[:, t])[..., None] * Bt[:, :, None, :]
        ys.append(np.einsum("bhpn,bhn->bhp", state, Ct) + D[:, None] * x[:, t])
    return np.stack(ys, axis=1), state


def test_chunked_scan_and_single_steps_follow_the_recurrence():
    batch, length, heads, dims, groups, size = 1, mamba.CHUNK + 44, 4, 3, 2, 5
    x, B, C = normal(batch, length, heads, dims), normal(batch, length, groups, size), normal(batch, length, groups, size)
    dt = mx.array(RNG.uniform(0.01, 0.3, (batch, length, heads)).astype(np.float32))
    A, D = -mx.array(RNG.uniform(0.5, 2, heads).astype(np.float32)), normal(heads)
    start = normal(batch, heads, dims, size)
    expected, expected_state = mamba_reference(x, dt, A, B, C, D, start)

    # Two prompt pieces (the first spans a chunk boundary), then three single positions.
    pieces, state = [], start
    spans = [(0, mamba.CHUNK + 40), (mamba.CHUNK + 40, mamba.CHUNK + 41), *[(p, p + 1) for p in range(length - 3, length)]]
    for begin, end in spans:
        y, state = mamba.selective_scan(x[:, begin:end], dt[:, begin:end], A, B[:, begin:end], C[:, begin:end], D, state)
        pieces.append(y)
    assert close(mx.concatenate(pieces[:2], axis=1), expected[:, : mamba.CHUNK + 41])
    assert close(mx.concatenate(pieces[2:], axis=1), expected[:, length - 3 :])
    assert close(state, expected_state)


def test_a_fresh_scan_starts_from_a_zero_state():
    x, B, C = normal(1, 9, 2, 3), normal(1, 9, 1, 4), normal(1, 9, 1, 4)
    dt, A, D = mx.full((1, 9, 2), 0.1), mx.array([-1.0, -0.5]), normal(2)
    expected, _ = mamba_reference(x, dt, A, B, C, D, np.zeros((1, 2, 3, 4)))
    assert close(mamba.selective_scan(x, dt, A, B, C, D, None)[0], expected)
    assert close(mamba.selective_scan(x[:, :1], dt[:, :1], A, B[:, :1], C[:, :1], D, None)[0], expected[:, :1])


# ---- the gated delta rule --------------------------------------------------------------------------------------------

def gated_delta_reference(q, k, v, g, beta, state):
    """Per position and value head j (key head j // (value heads / key heads)), float64."""
    q, k, v, g, beta, state = (np.array(a, np.float64) for a in (q, k, v, g, beta, state))
    shared = v.shape[2] // k.shape[2]
    ys = []
    for t in range(q.shape[1]):
        kt, qt = np.repeat(k[:, t], shared, axis=1), np.repeat(q[:, t], shared, axis=1)  # (b, hv, dk)
        state = state * g[:, t, :, None, None]
        recalled = np.einsum("bhvk,bhk->bhv", state, kt)
        state = state + ((v[:, t] - recalled) * beta[:, t, :, None])[..., None] * kt[:, :, None, :]
        ys.append(np.einsum("bhvk,bhk->bhv", state, qt))
    return np.stack(ys, axis=1), state


def test_normalize_qk_is_l2_normalisation_with_the_query_scaled():
    q, k = normal(1, 3, 2, 8), normal(1, 3, 2, 8)
    nq, nk = normalize_qk(q, k)

    def l2(a):
        a = np.array(a, np.float64)
        return a / np.sqrt((a * a).sum(-1, keepdims=True) + 1e-6)

    assert close(nq, l2(q) / np.sqrt(8), 1e-5) and close(nk, l2(k), 1e-5)


def test_gated_delta_follows_the_recurrence_with_shared_key_heads():
    batch, length, key_heads, value_heads, key_dim, value_dim = 1, 7, 2, 4, 8, 3
    q, k = normalize_qk(normal(batch, length, key_heads, key_dim), normal(batch, length, key_heads, key_dim))
    v = normal(batch, length, value_heads, value_dim)
    g, beta = gates(normal(batch, length, value_heads), normal(batch, length, value_heads), normal(value_heads),
                    normal(value_heads))
    start = normal(batch, value_heads, value_dim, key_dim, scale=0.1)
    expected, expected_state = gated_delta_reference(q, k, v, g, beta, start)
    first, state = gated_delta(q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], start)
    second, state = gated_delta(q[:, 5:], k[:, 5:], v[:, 5:], g[:, 5:], beta[:, 5:], state)
    assert close(mx.concatenate([first, second], axis=1), expected) and close(state, expected_state)
    fresh, _ = gated_delta(q, k, v, g, beta, None)
    assert close(fresh, gated_delta_reference(q, k, v, g, beta, np.zeros(start.shape))[0])
