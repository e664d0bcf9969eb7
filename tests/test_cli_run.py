"""`plugd run`: one-shot, piped and interactive chat against a real daemon."""

import os
import pty
import select
import subprocess
import sys
import time

import ollama
import pytest


@pytest.fixture
def server(plugd_server, tiny_qwen3):
    client = ollama.Client(host=plugd_server.url)
    files = {p.name: client.create_blob(p) for p in sorted(tiny_qwen3.iterdir())}
    client.create(model="tiny", files=files, parameters={"num_predict": 6, "temperature": 0})
    return plugd_server


def test_one_shot_prints_the_reply_and_verbose_stats(server):
    result = server.cli("run", "tiny", "Hello", "there", "--verbose")
    assert result.returncode == 0, result.stderr
    expected = ollama.Client(host=server.url).chat(model="tiny", messages=[{"role": "user", "content": "Hello there"}])
    assert result.stdout == expected.message.content + "\n"
    for label in ("total duration:", "load duration:", "prompt eval count:", "eval count:", "eval rate:"):
        assert label in result.stderr


def test_prompt_from_a_pipe(server):
    result = server.cli("run", "tiny", input="Hello there")
    assert result.returncode == 0, result.stderr
    expected = ollama.Client(host=server.url).chat(model="tiny", messages=[{"role": "user", "content": "Hello there"}])
    assert result.stdout == expected.message.content + "\n"


def test_unknown_model_fails_before_prompting(server):
    result = server.cli("run", "nope", "hi")
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: model 'nope:latest' not found"


class Terminal:
    """Reads a pty's output, waiting for markers; text after a marker stays for the next wait."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pending = b""

    def wait_for(self, marker: bytes, timeout: float = 60) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.pending:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {marker!r} in {self.pending!r}"
            if select.select([self.fd], [], [], remaining)[0]:
                self.pending += os.read(self.fd, 4096)
        seen, _, self.pending = self.pending.partition(marker)
        return seen + marker


def test_interactive_session_with_multiline_input_and_bye(server):
    primary, secondary = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "plugd", "run", "tiny"], env=server.env,
                               stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    terminal = Terminal(primary)
    try:
        terminal.wait_for(b">>> ")
        os.write(primary, b'"""first line\n')
        terminal.wait_for(b"... ")
        os.write(primary, b'second line"""\n')
        expected = ollama.Client(host=server.url).chat(
            model="tiny", messages=[{"role": "user", "content": "first line\nsecond line"}])
        terminal.wait_for(expected.message.content.replace("\n", "\r\n").encode() + b"\r\n")  # the pty writes CRLF
        terminal.wait_for(b">>> ")
        os.write(primary, b"/help\n")
        assert b"/bye" in terminal.wait_for(b">>> ")
        os.write(primary, b"/bye\n")
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        os.close(primary)
