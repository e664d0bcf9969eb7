"""Embeddings end to end: tiny checkpoints in the sentence-transformers layout, created in a live `plugd serve`,
embedded through /api/embed, /api/embeddings and /v1/embeddings by the official ollama and openai clients and by
LangChain's OllamaEmbeddings, against sentence-transformers itself on the same directory; and bad input refused
in each dialect's shape."""

from __future__ import annotations

import httpx
import numpy as np
import ollama
import openai
import pytest
from langchain_ollama import OllamaEmbeddings
from sentence_transformers import SentenceTransformer

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.embeddings import write_embedding_checkpoint
from plugd.testing.server import LiveServer

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11"]
PARITY = 0.99999


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedding-checkpoints")
    return {
        # Qwen3-Embedding's pipeline: the last token's state, normalised, its tokenizer ending each text with EOS
        # (kept when a text is cut to max_seq_length).
        "last": write_embedding_checkpoint(root / "last", "qwen3", seed=3, pooling="lasttoken", append_eos=True,
                                           max_seq_length=12),
        # Mean pooling, two Dense projections and a default prompt, cut to 8 tokens: EmbeddingGemma's pipeline.
        "projected": write_embedding_checkpoint(root / "projected", "qwen3", seed=4, pooling="mean", dense=[48, 32],
                                                prompts={"query": "query: "}, default_prompt="query",
                                                max_seq_length=8),
        # EmbeddingGemma's: gemma3_text attending both ways (a window of 4 on its sliding layers), mean pooling,
        # two Dense projections, its task prompt.
        "gemma": write_embedding_checkpoint(root / "gemma", "gemma3_text", seed=5, pooling="mean", dense=[96, 40],
                                            prompts={"query": "task: search result | query: "},
                                            default_prompt="query",
                                            overrides={"use_bidirectional_attention": True, "sliding_window": 4}),
    }


@pytest.fixture(scope="module")
def reference(checkpoints):
    """sentence-transformers' vectors for texts, by checkpoint, with its default settings."""
    models = {name: SentenceTransformer(str(path), device="cpu") for name, path in checkpoints.items()}
    return lambda name, texts, **kw: models[name].encode(texts, convert_to_numpy=True, **kw)


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory):
    chat = write_checkpoint(tmp_path_factory.mktemp("chat") / "model", "qwen3")
    live = LiveServer(tmp_path_factory.mktemp("embedding-store") / "models")
    try:
        for name, path in [*checkpoints.items(), ("chat", chat)]:
            created = live.cli("create", name, "--from", str(path))
            assert created.returncode == 0, created.stderr
        yield live
    finally:
        live.stop()


def assert_parity(ours, theirs):
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape
    cosine = (ours * theirs).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1))
    assert cosine.min() >= PARITY, cosine


@pytest.mark.parametrize("name", ["last", "projected", "gemma"])
def test_ollama_embed_matches_sentence_transformers(server, reference, name):
    client = ollama.Client(host=server.url)
    response = client.embed(model=name, input=TEXTS)
    assert_parity(response.embeddings, reference(name, TEXTS))
    assert response.prompt_eval_count > len(TEXTS) and response.total_duration >= response.load_duration > 0
    single = client.embed(model=name, input=TEXTS[1])
    assert_parity(single.embeddings, reference(name, TEXTS[1:2]))
    assert_parity([client.embeddings(model=name, prompt=TEXTS[0]).embedding], reference(name, TEXTS[:1]))
    assert client.show(name).capabilities == ["embedding"]


@pytest.mark.parametrize("name", ["last", "projected", "gemma"])
def test_openai_embeddings_match_sentence_transformers(server, reference, name):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    default = client.embeddings.create(model=name, input=TEXTS)  # the client asks for base64 and decodes it
    assert [item.index for item in default.data] == list(range(len(TEXTS)))
    assert_parity([item.embedding for item in default.data], reference(name, TEXTS))
    floats = client.embeddings.create(model=name, input=TEXTS[0], encoding_format="float")
    assert_parity([floats.data[0].embedding], reference(name, TEXTS[:1]))
    assert default.usage.prompt_tokens == default.usage.total_tokens > len(TEXTS)


def test_token_ids_are_embedded_as_given(server, checkpoints, reference):
    ids = SentenceTransformer(str(checkpoints["last"]), device="cpu").tokenizer(TEXTS[1])["input_ids"]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    by_ids = client.embeddings.create(model="last", input=[ids], encoding_format="float")
    assert_parity([by_ids.data[0].embedding], reference("last", TEXTS[1:2]))
    assert by_ids.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("name", ["projected", "gemma"])
def test_langchain_ollama_embeddings(server, reference, name):
    embeddings = OllamaEmbeddings(model=name, base_url=server.url)
    assert_parity(embeddings.embed_documents(TEXTS), reference(name, TEXTS))
    assert_parity([embeddings.embed_query(TEXTS[2])], reference(name, TEXTS[2:3]))


def test_dimensions_keep_the_first_and_normalise_again(server, reference):
    client = ollama.Client(host=server.url)
    short = np.asarray(client.embed(model="projected", input=TEXTS, dimensions=8).embeddings)
    full = reference("projected", TEXTS)[:, :8]
    assert_parity(short, full)
    assert np.allclose(np.linalg.norm(short, axis=-1), 1.0, atol=1e-5)
    openai_client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert len(openai_client.embeddings.create(model="last", input="x", dimensions=5).data[0].embedding) == 5


def test_inputs_are_cut_to_max_seq_length_and_past_the_context_cut_or_refused(server, reference):
    long = " ".join(f"w{i}" for i in range(40))
    client = ollama.Client(host=server.url)
    # max_seq_length (8) cuts every input, as sentence-transformers does.
    assert_parity(client.embed(model="projected", input=long, truncate=False).embeddings, reference("projected", [long]))
    openai_client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert_parity([openai_client.embeddings.create(model="projected", input=long).data[0].embedding],
                  reference("projected", [long]))
    assert_parity(client.embed(model="last", input=long).embeddings, reference("last", [long]))  # EOS kept
    # Past num_ctx, Ollama cuts unless told not to; OpenAI refuses.
    cut = client.embed(model="last", input=long, options={"num_ctx": 6})
    assert cut.prompt_eval_count == 6
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="last", input=long, truncate=False, options={"num_ctx": 6})
    assert refused.value.status_code == 400 and "exceeds the context length" in refused.value.error


@pytest.mark.parametrize("endpoint, body, empty", [
    ("/api/embed", {"model": "last"}, {"embeddings": []}),
    ("/api/embed", {"model": "last", "input": []}, {"embeddings": []}),
    ("/api/embeddings", {"model": "last", "prompt": ""}, {"embedding": []}),
])
def test_no_input_loads_the_model_as_ollama_does(server, endpoint, body, empty):
    # What `ollama stop` sends: it unloads an embedding model as any other.
    assert ollama.Client(host=server.url).generate(model="last", keep_alive=0).done_reason == "unload"
    assert not [m for m in httpx.get(server.url + "/api/ps").json()["models"] if m["name"].startswith("last")]
    response = httpx.post(server.url + endpoint, json=body)
    assert response.status_code == 200 and empty.items() <= response.json().items(), response.text
    assert [m for m in httpx.get(server.url + "/api/ps").json()["models"] if m["name"].startswith("last")]


@pytest.mark.parametrize("body, status, words", [
    ({"model": "last", "input": ["a", 1]}, 400, "invalid request body"),
    ({"model": "absent", "input": "a"}, 404, "not found"),
    ({"model": "chat", "input": "a"}, 400, "does not support embeddings"),
    ({"model": "last", "input": "a", "dimensions": 65}, 400, "dimensions must be between 1 and 64"),
])
def test_bad_input_is_refused_in_ollama_shape(server, body, status, words):
    response = httpx.post(server.url + "/api/embed", json=body)
    assert response.status_code == status and words in response.json()["error"], response.text


@pytest.mark.parametrize("body, status, words", [
    ({"model": "last", "input": []}, 400, "'input' is empty"),
    ({"model": "last", "input": ["a", 1]}, 400, "'input' must be"),
    ({"model": "absent", "input": "a"}, 404, "not found"),
    ({"model": "chat", "input": "a"}, 400, "does not support embeddings"),
    ({"model": "last", "input": "a", "dimensions": 65}, 400, "dimensions must be between 1 and 64"),
    ({"model": "last", "input": [[1, 10**9]]}, 400, "outside the model's vocabulary"),
])
def test_bad_input_is_refused_in_openai_shape(server, body, status, words):
    response = httpx.post(server.url + "/v1/embeddings", json=body)
    error = response.json()["error"]
    assert response.status_code == status and words in error["message"] and error["type"], response.text


def test_an_embedding_model_does_not_chat(server):
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=server.url).chat(model="last", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 400 and "embedding model" in refused.value.error
