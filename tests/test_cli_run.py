"""`plugd run`: one-shot, piped and interactive chat against a real daemon."""

import os
import pty
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


def _read_until(fd: int, marker: bytes, timeout: float = 60) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} in {seen!r}"
        seen += os.read(fd, 4096)
    return seen


def test_interactive_session_with_multiline_input_and_bye(server):
    primary, secondary = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "plugd", "run", "tiny"], env=server.env,
                               stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    try:
        _read_until(primary, b">>> ")
        os.write(primary, b'"""first line\n')
        _read_until(primary, b"... ")
        os.write(primary, b'second line"""\n')
        expected = ollama.Client(host=server.url).chat(
            model="tiny", messages=[{"role": "user", "content": "first line\nsecond line"}])
        _read_until(primary, expected.message.content.encode() + b"\r\n")
        _read_until(primary, b">>> ")
        os.write(primary, b"/help\n")
        assert b"/bye" in _read_until(primary, b">>> ")
        os.write(primary, b"/bye\n")
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        os.close(primary)
