"""`plugd run`: one-shot, piped and interactive chat against a real daemon."""

import os
import pty
import select
import signal
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


def test_a_bad_model_name_fails_before_prompting(server):
    result = server.cli("run", "no!", "hi")
    assert result.returncode == 1
    assert result.stderr.strip().startswith("Error: invalid model name 'no!': it must begin with")
    assert result.stdout == ""


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


class Session:
    """`plugd run tiny` on a pty, as a person types to it."""

    def __init__(self, server):
        self.primary, secondary = pty.openpty()
        self.process = subprocess.Popen([sys.executable, "-m", "plugd", "run", "tiny"], env=server.env,
                                        stdin=secondary, stdout=secondary, stderr=secondary)
        os.close(secondary)
        self.terminal = Terminal(self.primary)
        self.terminal.wait_for(b">>> ")

    def type(self, line: str) -> bytes:
        """Type a line; what the session printed up to its next prompt."""
        os.write(self.primary, line.encode() + b"\n")
        return self.terminal.wait_for(b">>> ")

    def close(self) -> None:
        self.process.kill()
        os.close(self.primary)


def reply_to(server, messages, **options):
    response = ollama.Client(host=server.url).chat(model="tiny", messages=messages, options=options or None)
    return response.message.content.replace("\n", "\r\n").encode()


def test_set_show_and_unknown_commands(server):
    session = Session(server)
    try:
        assert b"Set parameter 'num_predict' to '3'" in session.type("/set parameter num_predict 3")
        assert b"Set system message." in session.type("/set system Be brief.")
        first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
        answer = reply_to(server, first, num_predict=3)
        assert answer in session.type("Hello")
        assert b"temperature" in session.type("/show parameters")
        assert b"architecture" in session.type("/show info")
        assert b"Usage: /show info" in session.type("/show nonsense")
        assert b"Unknown command '/frobnicate'" in session.type("/frobnicate")
        session.type("/set parameter top_p 2")  # a float, as a Modelfile takes it, but out of the daemon's range
        assert b"Error: invalid options: top_p must be between 0 and 1" in session.type("Oops")
        session.type("/set parameter top_p 1")
        session.type("/set parameter temperature 0")
        # The refused message left no trace: the next one continues the first exchange.
        follow_up = first + [{"role": "assistant", "content": answer.decode().replace("\r\n", "\n")},
                             {"role": "user", "content": "Again"}]
        assert reply_to(server, follow_up, num_predict=3, temperature=0) in session.type("Again")
    finally:
        session.close()


def test_ctrl_c_stops_a_reply_and_ctrl_d_leaves(server):
    session = Session(server)
    try:
        session.process.send_signal(signal.SIGINT)
        assert b"Use Ctrl + d or /bye to exit." in session.terminal.wait_for(b">>> ")
        session.type("/set parameter num_predict 100000")
        os.write(session.primary, b"Hello\n")
        session.terminal.wait_for(b"Hello\r\n")
        assert select.select([session.primary], [], [], 30)[0]  # the reply has begun
        session.process.send_signal(signal.SIGINT)
        session.terminal.wait_for(b">>> ", timeout=30)
        # The stopped exchange left no trace either.
        session.type("/set parameter num_predict 2")
        assert reply_to(server, [{"role": "user", "content": "Hi"}], num_predict=2) in session.type("Hi")
        os.write(session.primary, b"\x04")
        assert session.process.wait(timeout=30) == 0
    finally:
        session.close()


def test_set_parameter_checks_names_and_values_as_a_modelfile_does(server):
    session = Session(server)
    try:
        assert b"Couldn't set parameter: unknown parameter 'temprature'" in session.type("/set parameter temprature 1")
        assert b"Set parameter 'stop' to 'x, y'" in session.type("/set parameter stop x y")
        assert b"Set parameter 'stop' to 'zzz'" in session.type("/set parameter stop zzz")  # not in the reply
        assert (b"Couldn't set parameter: invalid value 'three' for parameter num_predict: expected int"
                in session.type("/set parameter num_predict three"))
        # The refused value was not sent (the daemon would refuse the message); the list parameter was, as a list.
        assert reply_to(server, [{"role": "user", "content": "Hi"}], stop=["zzz"]) in session.type("Hi")
    finally:
        session.close()


def test_show_system_shows_the_sessions_system_message(server):
    session = Session(server)
    try:
        assert session.type("/show system") == b"/show system\r\n\r\n>>> "  # the model has none
        session.type("/set system Answer in French.")
        assert session.type("/show system") == b"/show system\r\nAnswer in French.\r\n>>> "
    finally:
        session.close()
