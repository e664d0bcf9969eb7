"""Cache for recurrent layers (Mamba2, Gated DeltaNet): a short-convolution window and a recurrent state.

Unlike keys and values, a recurrent state folds every position into one
fixed-size tensor, so it cannot forget its last positions: `trim` refuses,
and going back to an earlier point means restoring a snapshot taken there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx

if TYPE_CHECKING:
    from plugd.nn.batch_cache import BatchRecurrentCache


class RecurrentState(NamedTuple):
    """A snapshot of a RecurrentCache after `offset` positions."""

    offset: int
    conv: mx.array
    recurrent: mx.array


class RecurrentCache:
    """The last `kernel - 1` inputs of a layer's causal convolution, (batch, kernel - 1, channels), and its
    recurrent state (layer-specific shape), after `offset` positions.

    MLX arrays are immutable values and every update replaces them, so a
    snapshot (`state`) is a pair of references: taking one copies nothing,
    and later updates leave it as it was.
    """

    spans = False
    trimmable = False

    def __init__(self):
        self.offset = 0
        self.conv: mx.array | None = None
        self.recurrent: mx.array | None = None

    def advance(self, conv: mx.array, recurrent: mx.array, positions: int) -> None:
        """Store the window and state reached after `positions` more positions."""
        self.conv, self.recurrent = conv, recurrent
        self.offset += positions

    @property
    def trim_floor(self) -> int:
        """The earliest offset `trim` can go back to: none but the current one."""
        return self.offset

    def trim(self, n: int) -> int:
        """Forget the last n positions: a recurrent state cannot, so nothing is forgotten and 0 returned.

        Callers compare the result with n (as for KVCache.trim): only n == 0
        succeeds. To go back, restore a snapshot taken at the wanted offset.
        """
        return 0

    @property
    def state(self) -> RecurrentState | None:
        """A snapshot of the cache (None when it has seen nothing); restore it by assigning it back."""
        if self.offset == 0:
            return None
        return RecurrentState(self.offset, self.conv, self.recurrent)

    @state.setter
    def state(self, snapshot: RecurrentState | None) -> None:
        if snapshot is None:
            self.offset, self.conv, self.recurrent = 0, None, None
        else:
            self.offset, self.conv, self.recurrent = snapshot

    def snapshot(self, start: int = 0, end: int | None = None) -> RecurrentState | None:
        """The whole state: shared, not copied, since updates replace its arrays rather than write into them."""
        return self.state

    def restore(self, snapshot: RecurrentState | None) -> None:
        self.state = snapshot

    @property
    def nbytes(self) -> int:
        return 0 if self.offset == 0 else self.conv.nbytes + self.recurrent.nbytes

    def batch(self) -> BatchRecurrentCache:
        from plugd.nn.batch_cache import BatchRecurrentCache

        return BatchRecurrentCache()
