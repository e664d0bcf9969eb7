"""A streaming request that has to wait for its model's runner gets its response headers at once, in every
dialect (and, on an event stream, a `: queued` comment), so that a client sees the request accepted and its idle
timeout does not fire; it is answered in full once the runner is free.

The runner (one request at a time: OLLAMA_NUM_PARALLEL=1, Ollama's own variable) is held busy by a generation
whose runner is stopped (SIGSTOP), so the requests behind it wait for as long as the test needs, whatever the
machine's speed."""

import json
import os
import signal
import threading

import httpx
import pytest

WAITING = {
    "/api/chat": {"messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 3}},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 3, "stream": True},
    "/v1/messages": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True},
}
LAST = {"/api/chat": '"done": true', "/v1/chat/completions": "data: [DONE]",
        "/v1/responses": "event: response.incomplete", "/v1/messages": "event: message_stop"}


@pytest.fixture
def server(modelfile_server, tiny_qwen3):
    return modelfile_server({"m": f"FROM {tiny_qwen3}\nPARAMETER temperature 0\n"}, env={"OLLAMA_NUM_PARALLEL": "1"})


class Waiter(threading.Thread):
    """One streaming request: what it had once its headers came, then (after `go`) the rest of its body."""

    def __init__(self, url: str, path: str, go: threading.Event):
        super().__init__()
        self.url, self.path, self.go = url, path, go
        self.opened = threading.Event()
        self.status, self.first, self.rest, self.failure = None, "", "", None

    def run(self):
        try:
            # No read may take long while the runner is stopped: the headers and the comment come at once.
            with httpx.stream("POST", self.url + self.path, json={"model": "m"} | WAITING[self.path],
                              timeout=httpx.Timeout(30, read=10)) as response:
                self.status = response.status_code
                chunks = response.iter_text()
                if self.path != "/api/chat":  # NDJSON has no comments: only the headers come while it waits
                    self.first = next(chunks)
                self.opened.set()
                self.go.wait()
                self.rest = "".join(chunks)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.failure = exc
        finally:
            self.opened.set()


def test_requests_queued_behind_a_busy_runner_get_their_headers_at_once(server):
    busy = {"model": "m", "prompt": "Go", "options": {"num_predict": 100_000}}
    go = threading.Event()
    with httpx.stream("POST", f"{server.url}/api/generate", json=busy, timeout=60) as holder:
        lines = holder.iter_lines()  # held: an iterator let go closes the response
        json.loads(next(lines))  # the runner is generating for it
        (runner,) = server.runner_pids()
        os.kill(runner, signal.SIGSTOP)
        try:
            waiters = [Waiter(server.url, path, go) for path in WAITING]
            for waiter in waiters:
                waiter.start()
            for waiter in waiters:
                waiter.opened.wait(60)
        finally:
            os.kill(runner, signal.SIGCONT)
    go.set()  # the holder has gone: its generation is cancelled, and the waiters have the runner in turn
    for waiter in waiters:
        waiter.join(120)
    for waiter in waiters:
        assert waiter.failure is None, (waiter.path, waiter.failure)
        assert waiter.status == 200, waiter.path
        assert waiter.first == ("" if waiter.path == "/api/chat" else ": queued\n\n"), waiter.path
        assert LAST[waiter.path] in waiter.rest, (waiter.path, waiter.rest[-300:])
