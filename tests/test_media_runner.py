"""Images in the runner, on a tiny Gemma 3 with its vision tower: placeholders expanded by the daemon into one run
of image tokens per image, keyed in the runner by the image's digest and read from the file the daemon named; each
image evaluated whole in one forward whatever the chunking and the cache policy's capture points, and the cache
reused exactly as far as the prompts' images agree."""

from __future__ import annotations

import importlib
import io
import json

import attrs
import mlx.core as mx
import pytest
from PIL import Image

from plugd import plugins
from plugd.chat.request import InvalidRequest
from plugd.chat.tokens import encode_prompt
from plugd.protocol import Completion, MediaSpan, SamplingParams
from plugd.runner.cache_policy import make_policy, single_slot
from plugd.runner.generate import Engine, fit_prompt
from plugd.runner.loading import load_model
from plugd.runner.media import keyed, media_key, media_runs
from plugd.testing.checkpoints import write_checkpoint
from plugd.tokenizer import Tokenizer
from plugd.types import Media, Prompt

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
TURN = "<bos><start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
IMAGE = "<start_of_image>"


def image(color: str, size: tuple[int, int] = (40, 30), kind: str = "PNG") -> Media:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, kind)
    return Media(out.getvalue(), f"image/{kind.lower()}")


RED, BLUE = image("red"), image("blue")


@attrs.define
class RunnerPrompt:
    """A prompt as the runner takes it: the daemon's token ids, their cache keys, the images by key."""

    tokens: list[int]
    keys: list[int]
    images: dict


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("gemma3") / "model", "gemma3", seed=5)
    architecture = plugins.load().architectures()["gemma3"]
    media_tokens = architecture.media_tokens(json.loads((path / "config.json").read_text()))
    return load_model(path, importlib.import_module(architecture.module)), Tokenizer.from_dir(path), media_tokens


@pytest.fixture
def encode(gemma3, tmp_path):
    """What the daemon sends for a prompt (its images written to files), as the runner reads it."""
    _, tokenizer, media_tokens = gemma3

    def encoded(text: str, images: list[Media]) -> RunnerPrompt:
        prompt = encode_prompt(tokenizer, media_tokens, Prompt(text, images))
        by_digest = {item.key: item.data for item in images}
        for span in prompt.media:
            (tmp_path / span.digest).write_bytes(by_digest[span.digest])
        spans = [attrs.evolve(span, path=str(tmp_path / span.digest)) for span in prompt.media]
        return RunnerPrompt(prompt.tokens, *keyed(prompt.tokens, spans))

    return encoded


def complete(engine: Engine, prompt: RunnerPrompt, num_predict: int = 6, num_ctx: int = 512):
    request = Completion(tokens=prompt.tokens, sampling=GREEDY, num_predict=num_predict, num_ctx=num_ctx,
                         logprobs=True)
    *events, done = engine.complete(request, lambda: False, None, prompt.images, keys=prompt.keys)
    return [e.token for e in events], [e.logprob for e in events], done


def test_each_placeholder_becomes_one_run_of_image_tokens_keyed_by_its_bytes(gemma3, encode):
    _, tokenizer, media_tokens = gemma3
    prompt = encode(TURN.format(f"{IMAGE}a{IMAGE}b{IMAGE}c"), [RED, BLUE, RED])
    runs = media_runs(prompt.keys)
    assert [prompt.tokens[s:e] for s, e in runs] == [[media_tokens.token_id] * (e - s) for s, e in runs]
    assert [e - s for s, e in runs] == [media_tokens.expansion.count("<image_soft_token>")] * 3
    red, blue = media_key(RED.key), media_key(BLUE.key)
    assert [prompt.keys[s] for s, _ in runs] == [red, blue, red] and red < 0 and blue < 0 and red != blue
    assert sorted(prompt.images) == sorted({red, blue})
    text_positions = [i for i, k in enumerate(prompt.keys) if k >= 0]
    assert [prompt.keys[i] for i in text_positions] == [prompt.tokens[i] for i in text_positions]
    expansion = media_tokens.expansion
    assert prompt.tokens == tokenizer.encode(TURN.format(expansion + "a" + expansion + "b" + expansion + "c"))


@pytest.mark.parametrize(("text", "media", "error"), [
    (TURN.format(IMAGE + IMAGE), [RED], "2 image placeholders"),
    (TURN.format("no image"), [RED], "0 image placeholders"),
    (TURN.format(IMAGE + "<image_soft_token>"), [RED], "image tokens written as text"),
])
def test_images_that_do_not_fit_the_prompt_are_refused_by_the_daemon(gemma3, text, media, error):
    _, tokenizer, media_tokens = gemma3
    with pytest.raises(InvalidRequest, match=error):
        encode_prompt(tokenizer, media_tokens, Prompt(text, media))


def test_a_text_model_refuses_images(tmp_path):
    tokenizer = Tokenizer.from_dir(write_checkpoint(tmp_path / "qwen3", "qwen3", seed=0))
    with pytest.raises(InvalidRequest, match="does not take images"):
        encode_prompt(tokenizer, None, Prompt("hi", [RED]))


def test_the_runner_refuses_spans_out_of_place_and_files_that_are_not_images(tmp_path):
    (tmp_path / "junk").write_bytes(b"not an image")
    digest = RED.key
    for span, error in [(MediaSpan(start=2, end=9, digest=digest), "outside the prompt"),
                        (MediaSpan(start=0, end=2, digest="sha256:" + digest), "not a sha256"),
                        (MediaSpan(start=0, end=2, digest=digest, path=str(tmp_path / "missing")), "cannot be read"),
                        (MediaSpan(start=0, end=2, digest=digest, path=str(tmp_path / "junk")), "cannot be read")]:
        with pytest.raises(ValueError, match=error):
            keyed([1, 2, 3, 4], [span])
    (tmp_path / "red").write_bytes(RED.data)
    first = MediaSpan(start=0, end=3, digest=digest, path=str(tmp_path / "red"))
    with pytest.raises(ValueError, match="over another"):
        keyed([1, 2, 3, 4], [first, MediaSpan(start=2, end=4, digest=digest)])


def test_an_image_is_evaluated_whole_whatever_the_chunking(gemma3, encode):
    model, tokenizer, _ = gemma3
    prompt = encode(TURN.format(f"look {IMAGE} and {IMAGE} here"), [RED, BLUE])
    whole = complete(Engine(model, tokenizer), prompt)
    # Chunks of 5 would end inside each 16-token image; the engine moves them to the image's edges.
    chunked = complete(Engine(model, tokenizer, prefill_chunk=5), prompt)
    assert whole[0] == chunked[0]
    assert whole[1] == pytest.approx(chunked[1], abs=1e-5)
    assert whole[2].prompt_eval_count == len(prompt.tokens)  # image positions count as prompt tokens

    # And it is what the model gives for the whole prompt in one call with the images' embeddings.
    runs = media_runs(prompt.keys)
    embeddings = model.embed_media(mx.stack([model.preprocess(prompt.images[prompt.keys[s]]) for s, _ in runs]))
    logits = model(mx.array(prompt.tokens)[None], cache=model.make_cache(),
                   media=[(s, embeddings[i]) for i, (s, _) in enumerate(runs)])[0, -1]
    assert whole[0][0] == mx.argmax(logits).item()
    assert whole[1][0] == pytest.approx((logits - mx.logsumexp(logits)).max().item(), abs=1e-4)


def test_different_images_give_different_outputs_and_the_same_image_the_same(gemma3, encode):
    model, tokenizer, _ = gemma3
    text = TURN.format(f"{IMAGE}What is this?")
    red = complete(Engine(model, tokenizer), encode(text, [RED]))
    red_again = complete(Engine(model, tokenizer), encode(text, [image("red")]))
    blue = complete(Engine(model, tokenizer), encode(text, [BLUE]))
    assert red[:2] == red_again[:2]
    assert red[1] != blue[1]


@pytest.mark.parametrize("policy", ["single-slot", "prefix-cache"])
def test_the_cache_is_reused_up_to_the_first_image_that_differs(gemma3, encode, policy, monkeypatch):
    model, tokenizer, _ = gemma3
    monkeypatch.setenv("PLUGD_PREFIX_CACHE_INTERVAL", "7")  # capture points fall inside the images
    factory = plugins.load().named("plugd_cache_policies")[policy].factory
    engine = Engine(model, tokenizer, prefill_chunk=9, cache_policy=lambda m: make_policy(factory, m))
    text = TURN.format(f"first {IMAGE} then {IMAGE} end")
    first = encode(text, [RED, BLUE])
    chunked, whole = complete(engine, first), complete(Engine(model, tokenizer, cache_policy=single_slot), first)
    assert chunked[0] == whole[0] and chunked[1] == pytest.approx(whole[1], abs=1e-5)

    again = complete(engine, first)
    assert again[2].prompt_eval_count == 1  # all but the last token restored

    changed = encode(text, [RED, RED])
    second_image = media_runs(changed.keys)[1][0]
    reused = complete(engine, changed)
    assert reused[2].prompt_eval_count == len(changed.tokens) - second_image
    cold = complete(Engine(model, tokenizer), changed)
    assert reused[0] == cold[0] and reused[1] == pytest.approx(cold[1], abs=1e-5)


def test_truncation_keeps_or_drops_an_image_whole():
    image = [-7] * 4
    tokens = [1, 2, 9, 9, 9, 9, 3, 4, 9, 9, 9, 9, 5, 6]
    keys = [1, 2, *image, 3, 4, *image, 5, 6]
    # Room for 8: keep 3 from the start (cut inside the first image: back to its start) and the rest from the end
    # (which would begin inside the second image: on to its end).
    assert fit_prompt(tokens, keys, num_ctx=9, num_keep=3) == ([1, 2, 5, 6], [1, 2, 5, 6])
    assert fit_prompt(tokens, keys, num_ctx=12, num_keep=0) == (tokens[6:], keys[6:])
    assert fit_prompt(tokens, keys, num_ctx=20, num_keep=0) == (tokens, keys)


def test_a_prompt_cut_to_its_image_tokens_is_refused(gemma3, encode):
    model, tokenizer, _ = gemma3
    prompt = encode(TURN.format(IMAGE), [RED])
    end = media_runs(prompt.keys)[0][1]
    cut = RunnerPrompt(prompt.tokens[:end], prompt.keys[:end], prompt.images)
    with pytest.raises(ValueError, match="must not end with an image"):
        complete(Engine(model, tokenizer), cut)
