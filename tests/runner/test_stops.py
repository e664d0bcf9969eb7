"""Stop strings over streamed text."""

from __future__ import annotations

from plugd.runner.stops import StopMatcher


def test_text_without_stop_strings_passes_straight_through():
    matcher = StopMatcher(["STOP"])
    assert [matcher.feed(piece) for piece in ("Hello", ", ", "world")] == ["Hello", ", ", "world"]
    assert not matcher.stopped and matcher.flush() == ""


def test_a_stop_string_split_over_pieces_ends_the_output_before_it():
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("Hello wor") == "Hello wor"
    assert matcher.feed("ld! ST") == "ld! "  # "ST" could begin "STOP"
    assert not matcher.stopped
    assert matcher.feed("OP and more") == ""
    assert matcher.stopped


def test_held_text_is_released_once_it_can_no_longer_match():
    matcher = StopMatcher(["<end>"])
    assert matcher.feed("a <e") == "a "
    assert matcher.feed("nd") == ""
    assert matcher.feed("!") == "<end!"
    assert not matcher.stopped


def test_held_text_is_released_by_flush_at_the_end():
    matcher = StopMatcher(["<end>"])
    assert matcher.feed("done <en") == "done "
    assert matcher.flush() == "<en"
    assert matcher.flush() == ""


def test_the_earliest_of_several_stop_strings_wins():
    matcher = StopMatcher(["world", "lo, w"])
    assert matcher.feed("Hello, world") == "Hel"
    assert matcher.stopped


def test_a_held_prefix_that_restarts_inside_itself_is_still_caught():
    matcher = StopMatcher(["aab"])
    assert matcher.feed("xa") == "x"
    assert matcher.feed("a") == ""
    assert matcher.feed("ab tail") == "a"
    assert matcher.stopped


def test_empty_stop_strings_are_ignored():
    matcher = StopMatcher(["", "END"])
    assert matcher.feed("text") == "text"
    assert not matcher.stopped
