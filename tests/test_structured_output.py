"""Structured output is enforced token by token (plugd-llguidance, plugd-xgrammar), or refused with a clear error:
never ignored.

One live daemon and one model serve every request here (and a daemon per engine for the reference set). The
model is a tiny random-weight qwen3 that leans towards JSON's closing punctuation (see `json_leaning_checkpoint`):
a plain random model fills strings and numbers for thousands of tokens, while this one closes them within a few,
and its eagerness to close (`}` before the required keys, `"` before minLength) is exactly what the grammar has
to overrule. Without a format its output is not JSON at all (checked below).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from pathlib import Path

import attrs
import httpx
import jsonschema
import numpy as np
import ollama
import pytest

from plugd import plugins
from plugd.protocol import Completion, DoneEvent, GrammarSpec, PrefillEvent, RunnerConfig, SamplingParams
from plugd.runner.grammar import TokenMask
from plugd.scheduler.runner_client import RunnerProcess
from plugd.testing.grammar import parsed
from plugd.testing.server import LiveServer
from plugd.testing.structured import json_leaning_checkpoint
from plugd.tokenizer import Tokenizer
from plugd.types import structure, unstructure

SCHEMAS = sorted((Path(__file__).resolve().parent / "reference/json_schemas").glob("*.json"))
MODEL = "json-leaning"
OPTIONS = {"temperature": 1.0, "seed": 7, "num_predict": 256}
SEEDS = (7, 8, 9)
TODO = json.loads((SCHEMAS[0].parent / "jsb-Glaiveai2K__create_todo_e7e42931.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return json_leaning_checkpoint(tmp_path_factory.mktemp("structured") / "model")


def serving(checkpoint: Path, models: Path, env: dict[str, str] | None = None):
    server = LiveServer(models, env=env)
    try:
        server.cli("create", MODEL, "--from", str(checkpoint), check=True)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(checkpoint):
    """Every installed engine, in the default order."""
    yield from serving(checkpoint, checkpoint.parent / "models")


@pytest.fixture(scope="module", params=["every engine", "llguidance", "xgrammar"])
def engine_server(request, checkpoint, server, tmp_path_factory):
    if request.param == "every engine":
        yield server
    else:
        yield from serving(checkpoint, tmp_path_factory.mktemp(request.param), {"PLUGD_GRAMMAR_ENGINES": request.param})


def generate(server: LiveServer, **body) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Answer in JSON.", "stream": False, "options": OPTIONS} | body
    return httpx.post(f"{server.url}/api/generate", json=body, timeout=120)


def validate(schema: dict, text: str) -> str | None:
    """None if `text` is JSON valid under `schema` (formats checked where jsonschema can, no key written twice
    in an object), else why not."""
    try:
        instance = parsed(text)
    except ValueError as exc:
        return f"not JSON: {exc}"
    validator = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(validator(schema, format_checker=validator.FORMAT_CHECKER)
                                             .iter_errors(instance))
    return None if error is None else error.message


def test_every_reference_schema_is_enforced_or_refused(engine_server):
    """Each schema is sampled with each of SEEDS unless refused: the outputs of an accepted one are counted."""
    outcomes: Counter[str] = Counter()
    failures, refusals = [], []
    for path in SCHEMAS:
        schema = json.loads(path.read_text())
        for seed in SEEDS:
            response = generate(engine_server, format=schema, options=OPTIONS | {"seed": seed})
            body = response.json()
            if response.status_code == 400 and "JSON schema" in body.get("error", ""):
                outcomes["refused"] += 1
                refusals.append(f"{path.stem}: {body['error']}")
                break
            if response.status_code != 200:
                outcomes["failed"] += 1
                failures.append(f"{path.stem}: HTTP {response.status_code} {body}")
            elif body["done_reason"] == "length":
                outcomes["length"] += 1  # ran out of tokens inside the structure: reported, not counted as valid
            elif (problem := validate(schema, body["response"])) is None and body["done_reason"] == "stop":
                outcomes["valid"] += 1
            else:
                outcomes["failed"] += 1
                failures.append(f"{path.stem} (seed {seed}): {body['done_reason']}: {problem}: "
                                f"{body['response'][:200]!r}")
    summary = (f"{len(SCHEMAS)} schemas: {outcomes['refused']} refused; of {len(SEEDS)} outputs each of the others, "
               f"{outcomes['valid']} valid, {outcomes['length']} cut at num_predict={OPTIONS['num_predict']}, "
               f"{outcomes['failed']} failed")
    print("\n" + summary + "\nrefused:\n  " + "\n  ".join(refusals))
    assert outcomes["failed"] == 0, summary + "\n" + "\n".join(failures)
    assert outcomes["valid"] >= len(SEEDS) * (len(SCHEMAS) // 3), summary


def test_the_real_qwen3_vocabulary(server, tmp_path):
    server.cli("create", "json-qwen", "--from", str(json_leaning_checkpoint(tmp_path / "qwen", "qwen3")), check=True)
    for fmt in (TODO, "json"):
        body = generate(server, model="json-qwen", format=fmt).json()
        assert body["done_reason"] == "stop", body
        assert validate(TODO if fmt == TODO else {"type": "object"}, body["response"]) is None, body["response"]
    httpx.post(f"{server.url}/api/generate", json={"model": "json-qwen", "keep_alive": 0}, timeout=60)


def test_the_model_alone_does_not_write_json(server):
    text = generate(server).json()["response"]
    assert validate(TODO, text) is not None, text


def test_format_json_gives_a_json_object(server):
    body = generate(server, format="json").json()
    assert body["done_reason"] == "stop"
    assert isinstance(json.loads(body["response"]), dict)


def test_seeded_structured_requests_repeat(server):
    first, again = (generate(server, format=TODO).json()["response"] for _ in range(2))
    assert first == again
    assert validate(TODO, first) is None
    assert generate(server, format=TODO, options=OPTIONS | {"seed": 8}).json()["response"] != first


def test_running_out_of_tokens_inside_the_structure_is_length(server):
    body = generate(server, format=TODO, options=OPTIONS | {"num_predict": 5}).json()
    assert body["done_reason"] == "length" and body["eval_count"] == 5
    assert validate(TODO, body["response"]) is not None


def test_stop_strings_do_not_cut_a_structure_short(server):
    body = generate(server, format=TODO, options=OPTIONS | {"stop": ['"']}).json()
    assert body["done_reason"] == "stop"
    assert validate(TODO, body["response"]) is None


def test_logprobs_are_those_of_the_masked_distribution(server):
    body = generate(server, format=TODO, logprobs=True, top_logprobs=20).json()
    steps = body["logprobs"]
    assert "".join(step["token"] for step in steps) == body["response"]
    for step in steps:
        tops = step["top_logprobs"]
        assert tops and all(math.isfinite(t["logprob"]) for t in tops)
        assert sum(math.exp(t["logprob"]) for t in tops) <= 1.0 + 1e-4
        assert step["logprob"] <= 0.0
    # The first token must open the object: nothing else is allowed, whatever the model prefers.
    assert all(t["token"].startswith("{") for t in steps[0]["top_logprobs"])
    # Where the grammar leaves one token (inside a required property's name), it has probability 1.
    forced = [step for step in steps if len(step["top_logprobs"]) == 1]
    assert forced and all(abs(step["logprob"]) < 1e-4 for step in forced)


def test_official_client_format_json_and_schema(server):
    client = ollama.Client(host=server.url)
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "A todo, please."}], format=TODO,
                        options=OPTIONS)
    assert reply.done_reason == "stop"
    assert validate(TODO, reply.message.content) is None
    generated = client.generate(model=MODEL, prompt="Anything, as JSON.", format="json", options=OPTIONS)
    assert isinstance(json.loads(generated.response), dict)
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model=MODEL, prompt="x", format={"type": "string", "not": {"const": "x"}}, options=OPTIONS)
    assert refused.value.status_code == 400 and "'not'" in refused.value.error


ONLY_XGRAMMAR = {"type": "string", "format": "uri-reference"}  # a format llguidance does not know
ONLY_LLGUIDANCE = {"type": "string", "pattern": "^a+$", "minLength": 2}  # xgrammar drops the length beside a pattern
NEITHER = {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}


def test_the_first_engine_that_can_enforce_a_schema_serves_it(server):
    for schema in (ONLY_XGRAMMAR, ONLY_LLGUIDANCE):
        response = generate(server, format=schema)
        assert response.status_code == 200, response.text
        assert validate(schema, response.json()["response"]) is None
    refused = generate(server, format=NEITHER)
    assert refused.status_code == 400
    assert refused.json() == {"error": "llguidance cannot enforce this JSON schema: 'uniqueItems' at /; and xgrammar "
                                       "cannot enforce this JSON schema: 'uniqueItems' at /"}


def test_an_engine_left_out_of_the_order_serves_nothing(checkpoint, tmp_path):
    for server in serving(checkpoint, tmp_path / "xgrammar", {"PLUGD_GRAMMAR_ENGINES": "xgrammar"}):
        refused = generate(server, format=ONLY_LLGUIDANCE)
        assert refused.status_code == 400 and refused.json()["error"].startswith("xgrammar cannot enforce")
    for server in serving(checkpoint, tmp_path / "outlines", {"PLUGD_GRAMMAR_ENGINES": "outlines"}):
        refused = generate(server, format="json")
        assert refused.status_code == 400
        assert "none of PLUGD_GRAMMAR_ENGINES (outlines) is installed" in refused.json()["error"]


def test_the_runner_refuses_before_any_output_and_stays_usable(checkpoint):
    body = Completion(tokens=Tokenizer.from_dir(checkpoint).encode("Answer in JSON."),
                      sampling=SamplingParams(temperature=0.0), num_predict=64, num_ctx=512)

    async def exchange() -> tuple[httpx.Response, list[dict]]:
        config = RunnerConfig("plugd_qwen.qwen3", "plugd.runner.cache_policy:single_slot",
                              grammar_engines={"xgrammar": "plugd_xgrammar.engine:XGrammarEngine"})
        runner = RunnerProcess({p.name: p for p in checkpoint.iterdir() if p.is_file()}, config)
        try:
            await runner.start()
            unenforceable = GrammarSpec(("xgrammar",), "json_schema", {"type": "array", "uniqueItems": True})
            refused = await runner.http.post("/completion", json=unstructure(attrs.evolve(body, grammar=unenforceable)))
            todo = attrs.evolve(body, grammar=GrammarSpec(("xgrammar",), "json_schema", TODO))
            events = [event async for event in runner.completion(todo)]
            return refused, events
        finally:
            await runner.close()

    refused, events = asyncio.run(exchange())
    assert refused.status_code == 400
    assert refused.json() == {"error": "xgrammar cannot enforce this JSON schema: 'uniqueItems' at /",
                              "kind": "grammar_refused"}
    assert isinstance(events[-1], DoneEvent) and events[-1].done_reason == "stop"
    assert validate(TODO, "".join(e.text for e in events if not isinstance(e, PrefillEvent))) is None


def test_without_an_engine_plain_inference_works_and_format_is_refused(checkpoint, tmp_path):
    others = [p.name for p in plugins.load().plugins if not p.builtin and p.name not in ("llguidance", "xgrammar")]
    bare = LiveServer(tmp_path / "models", env={"PLUGD_PLUGINS": ",".join(others)})  # a store of its own: one daemon each
    try:
        bare.cli("create", MODEL, "--from", str(checkpoint), check=True)
        plain = httpx.post(f"{bare.url}/api/generate", timeout=120,
                           json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 3}})
        assert plain.status_code == 200 and plain.json()["eval_count"] > 0
        refused = httpx.post(f"{bare.url}/api/generate", timeout=120,
                             json={"model": MODEL, "prompt": "hi", "stream": False, "format": "json"})
        assert refused.status_code == 400 and "plugd-xgrammar" in refused.json()["error"]
    finally:
        bare.stop()


def test_plugins_lists_the_engines(server):
    listing = server.cli("plugins", check=True).stdout
    for name in ("llguidance", "xgrammar"):
        line = next(line for line in listing.splitlines() if line.startswith(f"{name} "))
        assert "grammar_engines" in line and "ok" in line


class _Recorder:
    """A matcher that allows every token and records what it was given."""

    def __init__(self):
        self.accepted: list[int] = []

    def fill_mask(self, bitmask: np.ndarray) -> None:
        bitmask[:] = -1

    def accept(self, token: int) -> bool:
        self.accepted.append(token)
        return True


def test_a_grammar_with_after_waits_for_the_marker_and_never_lets_the_output_end_before():
    matcher = _Recorder()
    mask = TokenMask(matcher, width=40, stop_ids=frozenset({3, 39}), after="</think>")
    waiting = np.array(mask.allowed())
    assert not waiting[3] and not waiting[39] and waiting[[0, 4, 38]].all()
    for token, text in [(5, "hmm </th"), (6, "ink"), (7, ">")]:
        assert not mask.active
        mask.accept(token, text)
    assert mask.active and matcher.accepted == []
    mask.accept(8, "{")
    assert matcher.accepted == [8]
    assert np.array(mask.allowed()).all()


def test_grammar_specs_are_checked():
    spec = structure({"engines": ["llguidance", "xgrammar"], "kind": "json_schema", "format": TODO, "after": "</think>"},
                     GrammarSpec)
    spec.check()
    assert spec.engines == ("llguidance", "xgrammar") and spec.after == "</think>" and spec.format == TODO
    for bad in (GrammarSpec(("xgrammar",), "yaml", None), GrammarSpec(("xgrammar",), "json", None, after=""),
                GrammarSpec((), "json", None)):
        with pytest.raises(ValueError):
            bad.check()


def test_a_schema_that_leaves_only_a_repeated_key_ends_with_an_error(server):
    """Keys never repeat (plugd.json_uniqueness): where the schema's only way on is a key written already, the
    request ends with a 400 that says so (an error event once streaming has begun), and the model serves on."""
    only_a = {"type": "object", "patternProperties": {"^a$": {"type": "integer"}}, "additionalProperties": False,
              "minProperties": 2}
    whole = generate(server, format=only_a)
    assert whole.status_code == 400
    assert whole.json() == {"error": "the schema allows nothing more here but a key or a unique item written already"}
    with httpx.stream("POST", f"{server.url}/api/generate", timeout=120, json={
            "model": MODEL, "prompt": "Answer in JSON.", "format": only_a, "options": OPTIONS}) as streamed:
        assert streamed.status_code == 200
        lines = [json.loads(line) for line in streamed.iter_lines() if line]
    assert lines[-1] == {"error": "the schema allows nothing more here but a key or a unique item written already"}
    openai = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Answer in JSON."}], "temperature": 1, "seed": 7,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": only_a}}})
    assert openai.status_code == 400 and openai.json()["error"]["type"] == "invalid_request_error"
    assert generate(server, format=TODO).status_code == 200
