"""The CLI's progress for pull and push: one bar per layer with size, rate and time left; plain lines off a terminal."""

import io

from plugd.cli_transfer import LayerLine, ProgressBoard, human_duration


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def layer_item(completed, total=2_000_000_000, digest="sha256:" + "ab" * 32):
    return {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total, "completed": completed}


def test_a_layer_line_shows_size_rate_and_time_left():
    line = LayerLine("pulling abababababab", total=2_000_000_000)
    line.update(0, now=100.0)
    assert line.render().startswith("pulling abababababab:   0% ▕" + " " * 25 + "▏ 0 B/2.0 GB")
    line.update(500_000_000, now=101.0)
    line.update(1_000_000_000, now=102.0)
    assert line.render() == "pulling abababababab:  50% ▕" + "█" * 12 + " " * 13 + "▏ 1.0 GB/2.0 GB  500.0 MB/s  2s"
    line.update(2_000_000_000, now=104.0)
    assert line.done and line.render() == "pulling abababababab: 100% ▕" + "█" * 25 + "▏ 2.0 GB"


def test_the_rate_follows_the_last_few_seconds():
    line, completed = LayerLine("pulling x", total=10_000_000_000), 0
    for second in range(1, 11):
        completed += 100_000_000 if second <= 5 else 10_000_000
        line.update(completed, now=float(second))
    assert round(line.rate()) == 10_000_000  # the fast first seconds no longer count


def test_off_a_terminal_each_status_and_finished_layer_is_printed_once():
    out = io.StringIO()
    board = ProgressBoard(out)
    for item in [{"status": "pulling manifest"}, layer_item(0), layer_item(10), layer_item(2_000_000_000),
                 {"status": "verifying sha256 digest"}, {"status": "success"}, {"status": "success"}]:
        board.update(item)
    board.close()
    assert out.getvalue().splitlines() == ["pulling manifest", "pulling abababababab: 100% ▕" + "█" * 25 + "▏ 2.0 GB",
                                           "verifying sha256 digest", "success"]


def test_on_a_terminal_the_lines_are_redrawn_in_place():
    out = Terminal()
    board = ProgressBoard(out)
    board.update({"status": "pulling manifest"})
    board.update(layer_item(1_000_000_000))
    board.close()
    first, last = out.getvalue().split("\x1b[1F")  # the cursor goes back up over what was drawn
    assert first == "\x1b[2Kpulling manifest\n"
    assert last == "\x1b[2Kpulling manifest\n\x1b[2Kpulling abababababab:  50% ▕" + "█" * 12 + " " * 13 + \
        "▏ 1.0 GB/2.0 GB\n"


def test_durations():
    assert [human_duration(s) for s in (0.4, 59, 61, 3600 + 120)] == ["0s", "59s", "1m01s", "1h02m"]
