"""Stop strings over streamed text: end the output before the first one, never emit any part of it."""

from __future__ import annotations

from collections.abc import Iterable


class StopMatcher:
    """Passes text through, holding back any tail that could still grow into a stop string.

    Once a stop string is complete, `stopped` is set and the text before it is
    the last thing `feed` returns.
    """

    def __init__(self, stops: Iterable[str]):
        self._stops = [stop for stop in stops if stop]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the output

    def feed(self, text: str) -> str:
        """The part of the text seen so far that can no longer be, or begin, a stop string."""
        text = self._held + text
        found = [(index, stop) for stop in self._stops if (index := text.find(stop)) >= 0]
        if found:
            index, self.matched = min(found)
            self._held, self.stopped = "", True
            return text[:index]
        release = len(text) - self._partial_stop_length(text)
        self._held = text[release:]
        return text[:release]

    def flush(self) -> str:
        """The held-back text, at the end of a generation that no stop string ended."""
        held, self._held = self._held, ""
        return held

    def _partial_stop_length(self, text: str) -> int:
        """The length of the longest end of `text` that is a proper beginning of some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
