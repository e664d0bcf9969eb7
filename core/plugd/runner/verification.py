"""Which drafted tokens the target keeps, so that speculative decoding draws from the target's own distribution.

The target scores every drafted position in one forward pass. Greedy, a
drafted token is kept while it is the target's own argmax, and the token after
the kept ones is the target's argmax there. Sampled (Leviathan et al., 2023;
Chen et al., 2023), drafted token d_i, drawn from the draft's distribution q_i,
is kept with probability min(1, p_i(d_i) / q_i(d_i)), p_i being the target's;
at the first one refused the token is drawn from max(p_i - q_i, 0),
renormalised, and when all are kept, from the target's distribution after
them. Either way every token comes out distributed exactly as plain sampling
from the target would give it.
"""

from __future__ import annotations

import mlx.core as mx


def verify(target: mx.array, drafted: mx.array, draft: mx.array, greedy: bool, key: mx.array | None = None,
           ) -> tuple[mx.array, mx.array]:
    """(how many of `drafted` are kept, the token after them), both int32 scalars, lazy.

    target: (k + 1, vocab), the scores (plugd.runner.sampling.Sampler.choose) of the position each drafted token
    takes and of the one after the last; drafted: (k,); draft: (k, vocab), the scores each drafted token was
    drawn from. `key` is needed when not greedy.
    """
    steps = drafted.shape[0]
    if greedy:
        chosen = mx.argmax(target, axis=-1).astype(mx.int32)
        kept = mx.cumprod(chosen[:steps] == drafted).sum().astype(mx.int32)
        return kept, chosen[kept]
    p, q = mx.softmax(target, axis=-1), mx.softmax(draft, axis=-1)
    accept_key, draw_key = mx.random.split(key)
    chance = mx.random.uniform(shape=(steps,), key=accept_key)
    index = drafted[:, None]
    p_drafted = mx.take_along_axis(p[:steps], index, axis=-1)[:, 0]
    q_drafted = mx.take_along_axis(q, index, axis=-1)[:, 0]
    kept = mx.cumprod(chance * q_drafted < p_drafted).sum().astype(mx.int32)
    # After the kept ones: the target's distribution less the draft's (none past the last drafted position).
    residual = mx.maximum(p - mx.concatenate([q, mx.zeros((1, q.shape[-1]), q.dtype)]), 0)[kept]
    return kept, mx.random.categorical(mx.log(residual), key=draw_key).astype(mx.int32)
