"""What the engine-level decoding tests share: transcripts of several lengths for checkpoints trained on them
(plugd.testing.training), and the events of one completion as a test reads them."""

from __future__ import annotations

import attrs

from plugd.protocol import DoneEvent, SamplingParams, TokenEvent
from plugd.testing.training import Transcript

WORDS = ("the quick brown fox jumps over a lazy dog while seven green parrots sing about rivers and stone "
         "under an old bridge near the quiet market").split()


def turn(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def words(count: int, start: int) -> str:
    return " ".join(WORDS[(start + 7 * i) % len(WORDS)] for i in range(count))


SHORT = Transcript(turn("Hi"), "Hello, how are you today? The river is calm and the parrots sing.")
MEDIUM = Transcript(turn(words(20, 1)), "Parrots sing about stone rivers under the old bridge all day long.")
LONG = Transcript(turn(words(60, 2)), "A lazy dog jumps over seven foxes near the quiet market at dawn.")
STRUCTURED = Transcript(turn("Give JSON."), '{"name": "fox", "legs": 4, "colour": "brown"}')
OTHER_LONG = Transcript(turn(words(45, 5)), "The market is quiet and the green parrots are asleep.")
TRANSCRIPTS = [SHORT, MEDIUM, LONG, STRUCTURED, OTHER_LONG]
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
SEEDED = SamplingParams(temperature=1.0, top_k=20, seed=5, repeat_penalty=1.0)


@attrs.define
class Outcome:
    """One completion's events, in order."""

    events: list = attrs.Factory(list)

    @property
    def tokens(self) -> list[int]:
        return [event.token for event in self.events if isinstance(event, TokenEvent)]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TokenEvent | DoneEvent))

    @property
    def done(self) -> DoneEvent:
        assert isinstance(self.events[-1], DoneEvent), self.events[-1]
        return self.events[-1]
