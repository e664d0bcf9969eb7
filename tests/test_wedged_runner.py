"""A runner that stops making progress (SIGSTOP here; a deadlock or a machine swapping look the same) is killed at
PLUGD_RUNNER_TIMEOUT: the stream on it ends with an error saying so, /api/ps and the rest answer meanwhile, and the
next request loads the model again in a new runner."""

import json
import os
import signal
import threading
import time

import httpx
import pytest

TIMEOUT = 3


@pytest.fixture
def server(modelfile_server, tiny_qwen3):
    return modelfile_server({"m": f"FROM {tiny_qwen3}\n"}, env={"PLUGD_RUNNER_TIMEOUT": str(TIMEOUT)})


def test_a_stopped_runner_is_killed_and_replaced(server):
    body = {"model": "m", "prompt": "Go", "options": {"num_predict": 100_000, "temperature": 0}}
    events = []
    with httpx.stream("POST", f"{server.url}/api/generate", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        events.append(json.loads(next(lines)))  # the runner is generating
        (runner,) = server.runner_pids()
        os.kill(runner, signal.SIGSTOP)
        stopped = time.monotonic()

        answered = []

        def poll():  # while the stream waits on the stopped runner
            while time.monotonic() - stopped < TIMEOUT:
                answered.append(httpx.get(f"{server.url}/api/ps", timeout=TIMEOUT + 10).status_code)
                answered.append(httpx.get(f"{server.url}/api/version", timeout=5).status_code)
                time.sleep(0.2)

        poller = threading.Thread(target=poll)
        poller.start()
        for line in lines:
            events.append(json.loads(line))
        poller.join()
    assert set(answered) == {200} and len(answered) >= 2
    assert events[-1] == {"error": "the model runner made no progress for 3 s and was stopped; the next request "
                                   "loads the model again"}
    assert "killing it" in server.log()

    reply = httpx.post(f"{server.url}/api/generate", timeout=120,
                       json={"model": "m", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    assert reply.status_code == 200 and reply.json()["done"]
    assert server.runner_pids() and runner not in server.runner_pids()
