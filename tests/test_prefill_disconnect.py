"""A client that gives up during a long prefill frees the runner, in every dialect, streamed or not.

A prompt of about 13.3k tokens on a slower tiny model takes 7-10 s to prefill here. A client sends it
and leaves a few seconds in: a stream closed by the client, or a whole response (or an Ollama stream, which
sends nothing before the first token, as Ollama's does) whose client timed out. The next request must start
at once, not after the rest of that prefill; and the abandoned prompt, sent again, resumes from the restore
points its prefill had taken. The time the resumed prompt takes is what the next request would have waited
for had the runner gone on, so it is the yardstick.

SSE streams also open before the prefill (message_start with the prompt's real usage, OpenAI's role delta,
the Responses API's response.created and response.in_progress) and send keep-alives during it (Anthropic ping
events, SSE comments), so that clients' idle timeouts (Claude Code's, Codex's) do not fire.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from plugd.testing.checkpoints import write_checkpoint

CONTEXT = 32768
CHUNK = 512  # the runner's prefill chunk, and the prefix cache's restore-point interval
WORDS = 2300  # about 13.3k tokens of the tiny vocabulary once rendered
LEAVE_AFTER = 3.0  # seconds into the prefill
SLOW = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4, "max_position_embeddings": CONTEXT}


@pytest.fixture(scope="module")
def server(modelfile_server, tmp_path_factory):
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("slow") / "slow", "qwen3", overrides=SLOW)
    live = modelfile_server({"slow": f"FROM {checkpoint}\nPARAMETER num_ctx {CONTEXT}\nPARAMETER temperature 0\n"})
    httpx.post(f"{live.url}/api/generate", json={"model": "slow", "prompt": "warm up", "stream": False,
                                                 "options": {"num_predict": 1}}, timeout=120).raise_for_status()
    return live


def long_prompt(tag: str) -> str:
    """A prompt that shares only the chat template's first tokens with another tag's: the cache has nothing
    of it until it is sent."""
    return f"{tag}: " + " ".join(f"w{j % 997}x{j // 997}" for j in range(WORDS))


class Anthropic:
    path = "/v1/messages"

    def body(self, text: str, stream: bool) -> dict:
        return {"model": "slow", "max_tokens": 1, "messages": [{"role": "user", "content": text}], "stream": stream}

    def is_keep_alive(self, line: str) -> bool:
        return line == "event: ping"

    def cached(self, server, text: str, answer: dict) -> int:
        return answer["usage"]["cache_read_input_tokens"]


class OpenAI:
    path = "/v1/chat/completions"

    def body(self, text: str, stream: bool) -> dict:
        return {"model": "slow", "max_tokens": 1, "messages": [{"role": "user", "content": text}], "stream": stream}

    def is_keep_alive(self, line: str) -> bool:
        return line.startswith(":")

    def cached(self, server, text: str, answer: dict) -> int:
        return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


class Ollama:
    path = "/api/chat"

    def body(self, text: str, stream: bool) -> dict:
        return {"model": "slow", "messages": [{"role": "user", "content": text}], "stream": stream,
                "options": {"num_predict": 1}}

    def is_keep_alive(self, line: str) -> bool:
        return False  # as Ollama, nothing is sent before the first token

    def cached(self, server, text: str, answer: dict) -> int:
        return prompt_tokens(server, text) - answer["prompt_eval_count"]


class Responses(OpenAI):
    path = "/v1/responses"

    def body(self, text: str, stream: bool) -> dict:
        return {"model": "slow", "max_output_tokens": 1, "input": text, "stream": stream}

    def cached(self, server, text: str, answer: dict) -> int:
        return answer["usage"]["input_tokens_details"]["cached_tokens"]


DIALECTS = {"anthropic": Anthropic(), "openai": OpenAI(), "responses": Responses(), "ollama": Ollama()}


def prompt_tokens(server, text: str) -> int:
    """The rendered conversation's tokens, counted by the runner; every dialect renders [user text] alike."""
    counted = httpx.post(f"{server.url}/v1/messages/count_tokens", timeout=60,
                         json={"model": "slow", "messages": [{"role": "user", "content": text}]})
    return counted.json()["input_tokens"]


def abandon_stream(server, dialect, text: str) -> tuple[list[str], list[float]]:
    """Stream the prompt and close the connection LEAVE_AFTER seconds in: the lines read, and when each came."""
    lines, times = [], []
    started = time.monotonic()
    try:
        with httpx.stream("POST", server.url + dialect.path, json=dialect.body(text, True),
                          timeout=httpx.Timeout(60, read=LEAVE_AFTER)) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                times.append(time.monotonic() - started)
                if times[-1] > LEAVE_AFTER:
                    break
    except httpx.ReadTimeout:
        pass  # the Ollama stream: nothing came
    return lines, times


def abandon_whole(server, dialect, text: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + dialect.path, json=dialect.body(text, False), timeout=httpx.Timeout(60, read=LEAVE_AFTER))


def timed(server, dialect, text: str) -> tuple[float, dict]:
    started = time.monotonic()
    answer = httpx.post(server.url + dialect.path, json=dialect.body(text, False), timeout=120)
    assert answer.status_code == 200, answer.text
    return time.monotonic() - started, answer.json()


def check_freed_and_resumed(server, dialect, text: str, finished_chunks: int) -> None:
    """The next request starts at once; the abandoned prompt resumes from the restore points it had reached."""
    waited, _ = timed(server, dialect, "Just a short question")
    resumed, answer = timed(server, dialect, text)
    cached = dialect.cached(server, text, answer)
    print(f"next request {waited:.2f}s; the rest of the abandoned prefill {resumed:.2f}s, "
          f"{cached} of {prompt_tokens(server, text)} tokens cached")
    assert waited < resumed / 3, "the next request waited for the abandoned prefill"
    assert CHUNK * max(finished_chunks, 1) <= cached < prompt_tokens(server, text) - CHUNK


@pytest.mark.parametrize("name", list(DIALECTS))
def test_a_stream_abandoned_during_the_prefill_frees_the_runner(server, name):
    dialect, text = DIALECTS[name], long_prompt(f"streamed {name}")
    lines, times = abandon_stream(server, dialect, text)
    keep_alives = [t for line, t in zip(lines, times) if dialect.is_keep_alive(line)]
    if name == "ollama":
        assert lines == []
        finished_chunks = 1
    else:
        # Bounds in time only as far as the prefill's own length, which a loaded machine stretches: the stream
        # opens and keeps talking long before the prefill (several seconds longer than LEAVE_AFTER) could end.
        assert times[0] < LEAVE_AFTER, "the stream did not open before the prefill"
        assert len(keep_alives) >= 2, "no keep-alives during the prefill"
        finished_chunks = len(keep_alives) - 1  # the first keep-alive comes as the prefill starts
    if name == "anthropic":  # message_start has the prompt's real usage, and a ping follows it
        assert lines[:4] == ["event: message_start", lines[1], "", "event: ping"]
        usage = json.loads(lines[1].removeprefix("data: "))["message"]["usage"]
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == prompt_tokens(server, text)
        assert usage["input_tokens"] > CONTEXT // 4 and usage["output_tokens"] == 0
    if name == "responses":  # the response's lifecycle opens the stream, before the first keep-alive
        opening = lines[:next(i for i, line in enumerate(lines) if dialect.is_keep_alive(line))]
        assert [line for line in opening if line.startswith("event:")] == [
            "event: response.created", "event: response.in_progress"]
    check_freed_and_resumed(server, dialect, text, finished_chunks)


@pytest.mark.parametrize("name", list(DIALECTS))
def test_a_whole_response_whose_client_timed_out_frees_the_runner(server, name):
    dialect, text = DIALECTS[name], long_prompt(f"whole {name}")
    abandon_whole(server, dialect, text)
    check_freed_and_resumed(server, dialect, text, 1)


def test_requests_abandoned_while_queued_never_reach_the_runner(server):
    """Clients that time out while another request holds the runner are dropped from the queue: the request
    after them starts as soon as the runner is free, and their prompts were never evaluated."""
    dialect = DIALECTS["openai"]
    holder_text, queued = long_prompt("holder"), [long_prompt(f"queued {i}") for i in range(3)]
    with ThreadPoolExecutor(len(queued) + 1) as pool:
        holder = pool.submit(timed, server, dialect, holder_text)
        time.sleep(1.0)  # the holder is in its prefill
        abandoned = [pool.submit(abandon_whole, server, dialect, text) for text in queued]
        for future in abandoned:
            future.result()
        held, _ = holder.result()
    waited, _ = timed(server, dialect, "Just a short question")
    print(f"the holder took {held:.2f}s; the request after the abandoned ones {waited:.2f}s")
    assert waited < held / 3, "the next request waited for requests whose clients had gone"
    _, answer = timed(server, dialect, queued[0])
    assert dialect.cached(server, queued[0], answer) < CHUNK, "an abandoned request's prompt was evaluated"
