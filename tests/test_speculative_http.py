"""Speculative decoding through the HTTP API and the official ollama client: a qwen3 created with a draft (`--draft`),
a hybrid (qwen3_next) with a draft, and a qwen3_5 that drafts with its checkpoint's own multi-token-prediction head
answer, token for token, what they answer with drafting turned off (the request option draft_tokens 0), a
structured request included, and a prompt whose client hung up during its prefill resumes, drafter and all, from
the restore points that prefill took. /api/ps says what drafts and how much of it the target kept.
"""

from __future__ import annotations

import json
import shutil
import time

import httpx
import ollama
import pytest

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.decoding import LONG, OTHER_LONG, SHORT, STRUCTURED, TRANSCRIPTS
from plugd.testing.training import FAST_OVERRIDES, train_checkpoint, train_mtp_head
from plugd.tokenizer import Tokenizer

GREEDY = {"temperature": 0, "num_predict": 40}  # Ollama's repeat penalty stays on
DRAFT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1,
         "num_key_value_heads": 1, "head_dim": 32, "tie_word_embeddings": True}
# Slow enough to leave during a prefill of LONG_PROMPT_WORDS words: about 3 s here.
SLOW = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 4, "max_position_embeddings": 16384}


def long_prompt(tag: str) -> str:
    return f"{tag}: " + " ".join(f"w{j % 997}x{j // 997}" for j in range(1500))


LONG_PROMPT = long_prompt("left")


@pytest.fixture(scope="module")
def server(plugd_server_factory, tmp_path_factory, trained_checkpoints):
    """Models "drafted" (qwen3 + draft), "hybrid" (qwen3_next + draft), "mtp" (qwen3_5 + its head), trained on
    plugd.testing.decoding's transcripts, and "slow-drafted" and "slow-mtp" (random, slower to prefill)."""
    root = tmp_path_factory.mktemp("speculative")

    def trained(name: str, model_type: str, **overrides):
        return train_checkpoint(root / name, TRANSCRIPTS, model_type=model_type, overrides=overrides,
                                cache_dir=trained_checkpoints)

    draft = trained("draft", "qwen3", **DRAFT)
    # Deep enough that its head (one layer, and the output head it shares) costs a fifth of a step: drafting pays.
    mtp = train_mtp_head(shutil.copytree(trained("qwen3_5", "qwen3_5", num_hidden_layers=8), root / "mtp"),
                         TRANSCRIPTS)
    live = plugd_server_factory()
    live.cli("create", "drafted", "--from", str(trained("qwen3", "qwen3", **FAST_OVERRIDES)), "--draft", str(draft),
             check=True)
    live.cli("create", "hybrid", "--from", str(trained("qwen3_next", "qwen3_next", num_hidden_layers=2)),
             "--draft", str(draft), check=True)
    live.cli("create", "mtp", "--from", str(mtp), check=True)
    slow_draft = write_checkpoint(root / "slow-draft", "qwen3", seed=2, overrides=DRAFT)
    live.cli("create", "slow-drafted", "--from", str(write_checkpoint(root / "slow", "qwen3", seed=1, overrides=SLOW)),
             "--draft", str(slow_draft), check=True)
    live.cli("create", "slow-mtp", "--from", str(write_checkpoint(root / "slow-mtp", "qwen3_5", seed=1,
                                                                    overrides=SLOW)), check=True)
    live.tokenizer = Tokenizer.from_dir(draft)  # every tiny checkpoint's
    return live


def generate(server, model: str, prompt: str, drafting: bool = True, **fields) -> ollama.GenerateResponse:
    options = GREEDY | ({} if drafting else {"draft_tokens": 0})
    return ollama.Client(host=server.url).generate(model=model, prompt=prompt, raw=True, options=options,
                                                   logprobs=True, top_logprobs=2, **fields)


def drafting(server, model: str) -> dict:
    loaded = {m["name"]: m for m in httpx.get(f"{server.url}/api/ps").json()["models"]}
    return loaded[f"{model}:latest"]["drafting"]


def tokens(response: ollama.GenerateResponse) -> list[str]:
    return [entry.token for entry in response.logprobs]


@pytest.mark.parametrize(("model", "drafter"), [("drafted", "draft model"), ("hybrid", "draft model"),
                                                ("mtp", "mtp head")])
def test_greedy_output_is_what_plain_decoding_gives(server, model, drafter):
    for transcript in (SHORT, LONG, OTHER_LONG):
        plain, drafted = generate(server, model, transcript.prompt, False), generate(server, model, transcript.prompt)
        assert drafted.response == plain.response and tokens(drafted) == tokens(plain)
        assert drafted.eval_count == plain.eval_count
    stats = drafting(server, model)
    assert stats["drafter"] == drafter and 0 < stats["kept"] <= stats["drafted"]


@pytest.mark.parametrize("model", ["drafted", "mtp"])
def test_a_structured_request_drafts_and_answers_the_same(server, model):
    # A fresh runner: one that has measured poor acceptance on earlier requests would rightly decode plainly.
    ollama.Client(host=server.url).generate(model=model, keep_alive=0)
    plain, drafted = (generate(server, model, STRUCTURED.prompt, choice, format="json") for choice in (False, True))
    assert drafted.response == plain.response and json.loads(drafted.response)
    assert drafting(server, model)["drafted"] > 0


@pytest.mark.parametrize("model", ["slow-drafted", "slow-mtp"])
def test_a_prompt_left_during_its_prefill_resumes_with_its_drafter(server, model):
    started = time.monotonic()
    ollama.Client(host=server.url).generate(model=model, prompt=long_prompt("other"), raw=True,  # as long a prefill
                                            options={"num_predict": 1})  # of nothing the next prompt shares
    half_a_prefill = (time.monotonic() - started) / 2
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/api/generate", timeout=httpx.Timeout(60, read=half_a_prefill), json={
            "model": model, "prompt": LONG_PROMPT, "raw": True, "options": GREEDY})
    retried = generate(server, model, LONG_PROMPT)
    assert 0 < retried.prompt_eval_count < len(server.tokenizer.encode(LONG_PROMPT)) - 512  # a chunk or more kept
    assert retried.response == generate(server, model, LONG_PROMPT, False).response
    assert drafting(server, model)["drafted"] > 0

