"""Images end to end: the official ollama, openai and anthropic clients chat with a PNG, a JPEG and a WebP image
against a live `plugd serve` holding a tiny Gemma 3 with its vision tower; without plugd-webp a WebP is refused
clearly while a PNG still works; a runner whose vision tower fails reports it and the daemon serves on."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import anthropic
import httpx
import numpy as np
import ollama
import openai
import pytest
from PIL import Image

from plugd import plugins
from plugd.builtins import jinja_renderer
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution
from plugd.testing.server import LiveServer
from plugd.tokenizer import Tokenizer
from plugd.types import Media, Message

TEMPLATES = Path(__file__).resolve().parent / "reference/chat_templates"
GREEDY = {"temperature": 0, "num_predict": 4}
KINDS = {"png": ("PNG", {}), "jpeg": ("JPEG", {"quality": 90}), "webp": ("WEBP", {"lossless": True})}

BROKEN_PLUGIN = '''
from plugd.hookspecs import Architecture, hookimpl
from plugd_gemma.config import gemma3_media_tokens

PLUGD_API = "1.2"


@hookimpl
def plugd_architectures():
    return [Architecture("gemma3_broken", "plugd_broken_vision", media_types=frozenset({"image/png", "image/jpeg"}),
                         media_tokens=gemma3_media_tokens)]
'''
BROKEN_MODEL = '''
from plugd_gemma import gemma3

ModelArgs = gemma3.ModelArgs


class Model(gemma3.Model):
    def embed_media(self, pixels):
        raise RuntimeError("the vision tower broke")
'''


def picture(seed: int, kind: str = "png") -> bytes:
    """Noise, different for each seed and kind (a lossless WebP must not become another test's PNG)."""
    pixels = np.random.default_rng([seed, list(KINDS).index(kind)]).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    out = io.BytesIO()
    name, options = KINDS[kind]
    Image.fromarray(pixels).save(out, name, **options)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("media-e2e")
    vision = write_checkpoint(root / "vision", "gemma3", seed=5)
    broken = Path(shutil.copytree(vision, root / "broken"))
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(config | {"model_type": "gemma3_broken"}))
    # A text model whose config names a vision tower it does not have: no `vision` for it.
    text = write_checkpoint(root / "text", "gemma3_text", seed=5, overrides={"vision_config": {"hidden_size": 32}})
    return {"vision": vision, "broken": broken, "text": text}


def create(server: LiveServer, name: str, checkpoint: Path) -> None:
    created = server.cli("create", name, "--from", str(checkpoint))
    assert created.returncode == 0, created.stderr


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory):
    site = write_distribution(tmp_path_factory.mktemp("site"), "plugd-broken-vision",
                              {"plugd_broken_vision_plugin": BROKEN_PLUGIN, "plugd_broken_vision": BROKEN_MODEL},
                              {"broken-vision": "plugd_broken_vision_plugin"})
    live = LiveServer(tmp_path_factory.mktemp("media-store") / "models", env={"PYTHONPATH": str(site)})
    try:
        for name, checkpoint in checkpoints.items():
            create(live, name, checkpoint)
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def server_without_webp(checkpoints, tmp_path_factory):
    live = LiveServer(tmp_path_factory.mktemp("media-store-no-webp") / "models",
                      env={"PLUGD_PLUGINS": "gemma,render-gemma,prefix-cache"})
    try:
        create(live, "vision", checkpoints["vision"])
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def expected_tokens(checkpoints):
    """The number of prompt tokens of a rendered prompt with its images, and where each image's run of tokens
    lies: each placeholder replaced by the expansion the architecture declares, then tokenized."""
    path = checkpoints["vision"]
    media = plugins.load().architectures()["gemma3"].media_tokens(json.loads((path / "config.json").read_text()))
    tokenizer = Tokenizer.from_dir(path)

    def count(text: str, images: list[bytes]) -> tuple[int, list[tuple[int, int]]]:
        assert text.count(media.placeholder) == len(images)
        tokens = tokenizer.encode(text.replace(media.placeholder, media.expansion))
        starts = [i for i, t in enumerate(tokens) if t == media.token_id and tokens[i - 1] != media.token_id]
        return len(tokens), [(start, start + media.expansion.count("<image_soft_token>")) for start in starts]

    return count


def rendered(server: LiveServer, messages: list[dict]) -> dict:
    body = {"model": "vision", "messages": messages, "_debug_render_only": True}
    response = httpx.post(server.url + "/api/chat", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["_debug_info"]


def test_show_reports_vision_only_for_a_model_with_a_tower(server):
    client = ollama.Client(host=server.url)
    assert "vision" in client.show("vision").capabilities
    assert "vision" not in client.show("text").capabilities


def test_the_image_turn_renders_as_the_upstream_template_does(server):
    image = picture(1)
    messages = [{"role": "system", "content": "Describe."}, {"role": "user", "content": "What is it?", "images": [b64(image)]}]
    info = rendered(server, messages)
    model = ModelFiles(config={}, chat_template=(TEMPLATES / "gemma3.jinja").read_text(),
                       tokenizer_config={"bos_token": "<bos>"})
    upstream = jinja_renderer.render(RenderRequest(model, [
        Message("system", "Describe."), Message("user", "What is it?", images=[Media(image, "image/png")])])).text
    assert info == {"rendered_template": upstream, "image_count": 1}
    assert "<start_of_image>What is it?" in upstream


@pytest.mark.parametrize("kind", list(KINDS))
def test_ollama_chat_with_an_image(server, expected_tokens, kind):
    client = ollama.Client(host=server.url)
    image = picture(10, kind)
    messages = [{"role": "user", "content": "What is it?", "images": [image]}]
    first = client.chat("vision", messages=messages, options=GREEDY, logprobs=True)
    text = rendered(server, [{"role": "user", "content": "What is it?", "images": [b64(image)]}])["rendered_template"]
    total, [(start, end)] = expected_tokens(text, [image])
    assert end - start == 16
    assert total - start <= first.prompt_eval_count <= total  # the text before the image may be cached
    again = client.chat("vision", messages=messages, options=GREEDY, logprobs=True)
    assert again.prompt_eval_count == 1  # the image's positions came back from the cache
    assert [lp.logprob for lp in again.logprobs] == [lp.logprob for lp in first.logprobs]
    other = client.chat("vision", messages=[messages[0] | {"images": [picture(11, kind)]}], options=GREEDY,
                        logprobs=True)
    assert other.prompt_eval_count == total - start  # a different image: reused up to where the images differ
    assert [lp.logprob for lp in other.logprobs] != [lp.logprob for lp in first.logprobs]


def openai_image(data: bytes, kind: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{b64(data)}"}}


@pytest.mark.parametrize("kind", list(KINDS))
def test_openai_chat_with_an_image(server, expected_tokens, kind):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    image = picture(20, kind)
    messages = [{"role": "user", "content": [openai_image(image, kind), {"type": "text", "text": "What is it?"}]}]

    def chat(content):
        return client.chat.completions.create(model="vision", messages=[{"role": "user", "content": content}],
                                              max_tokens=4, temperature=0, logprobs=True)

    first = chat(messages[0]["content"])
    text = rendered(server, [{"role": "user", "content": "What is it?", "images": [b64(image)]}])["rendered_template"]
    total, [(start, _)] = expected_tokens(text, [image])
    assert first.usage.prompt_tokens == total
    assert first.usage.prompt_tokens_details.cached_tokens <= start
    again = chat(messages[0]["content"])
    assert again.usage.prompt_tokens_details.cached_tokens == total - 1
    assert again.choices[0].logprobs == first.choices[0].logprobs
    other = chat([openai_image(picture(21, kind), kind), {"type": "text", "text": "What is it?"}])
    assert other.usage.prompt_tokens_details.cached_tokens == start
    assert other.choices[0].logprobs != first.choices[0].logprobs


@pytest.mark.parametrize("kind", list(KINDS))
def test_anthropic_messages_with_an_image(server, expected_tokens, kind):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

    def ask(image: bytes):
        source = {"type": "base64", "media_type": f"image/{kind}", "data": b64(image)}
        content = [{"type": "image", "source": source}, {"type": "text", "text": "What is it?"}]
        return client.messages.create(model="vision", max_tokens=4, extra_body={"temperature": 0},
                                      messages=[{"role": "user", "content": content}])

    image = picture(30, kind)
    first = ask(image)
    text = rendered(server, [{"role": "user", "content": "What is it?", "images": [b64(image)]}])["rendered_template"]
    total, [(start, _)] = expected_tokens(text, [image])
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == total
    counted = client.messages.count_tokens(model="vision", messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": f"image/{kind}", "data": b64(image)}},
        {"type": "text", "text": "What is it?"}]}])
    assert counted.input_tokens == total
    assert first.usage.cache_read_input_tokens <= start
    again = ask(image)
    assert (again.usage.input_tokens, again.usage.cache_read_input_tokens) == (1, total - 1)
    assert again.content == first.content


def test_counting_the_tokens_of_an_image_prompt_loads_no_model(server, expected_tokens):
    """The daemon expands images itself, from what the architecture declares: no runner is asked."""
    ollama.Client(host=server.url).generate("vision", keep_alive=0)  # unloads whatever earlier tests loaded
    assert server.runner_pids() == []
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    image = picture(40)
    counted = client.messages.count_tokens(model="vision", messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image)}},
        {"type": "text", "text": "What is it?"}]}])
    text = rendered(server, [{"role": "user", "content": "What is it?", "images": [b64(image)]}])["rendered_template"]
    assert counted.input_tokens == expected_tokens(text, [image])[0]
    assert server.runner_pids() == []


def test_a_conversation_is_fitted_to_num_ctx_counting_its_images(server, expected_tokens):
    first, second = picture(60), picture(61)
    turns = [{"role": "user", "content": "one", "images": [b64(first)]}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "two", "images": [b64(second)]}]
    whole, _ = expected_tokens(rendered(server, turns)["rendered_template"], [first, second])
    kept, _ = expected_tokens(rendered(server, turns[1:])["rendered_template"], [second])
    assert whole > kept + 4
    client = ollama.Client(host=server.url)
    client.create(model="vision-small", from_="vision", parameters={"num_ctx": kept + 4})
    # Ollama's API fits a long conversation, as Ollama does; the OpenAI and Anthropic dialects refuse it.
    response = client.chat("vision-small", messages=turns, options={"num_predict": 2, "temperature": 0})
    assert response.prompt_eval_count == kept  # the oldest turn went, its image with it
    openai_client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": [openai_image(first, "png"), {"type": "text", "text": "one"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [openai_image(second, "png"), {"type": "text", "text": "two"}]}]
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(model="vision-small", messages=messages, max_tokens=2)
    assert refused.value.code == "context_length_exceeded" and f"resulted in {whole} tokens" in str(refused.value)


def test_a_remote_image_url_is_refused(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    content = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, {"type": "text", "text": "?"}]
    with pytest.raises(openai.BadRequestError, match="does not fetch remote URLs"):
        client.chat.completions.create(model="vision", messages=[{"role": "user", "content": content}], max_tokens=2)


def test_an_image_for_a_text_model_is_refused(server):
    with pytest.raises(ollama.ResponseError, match="does not support images") as refused:
        ollama.Client(host=server.url).chat("text", messages=[{"role": "user", "content": "?", "images": [picture(1)]}])
    assert refused.value.status_code == 400


def test_a_placeholder_written_as_text_is_refused(server):
    with pytest.raises(ollama.ResponseError, match="1 image placeholders .* but the request carries 0 images") as refused:
        ollama.Client(host=server.url).chat("vision", messages=[{"role": "user", "content": "<start_of_image>?"}])
    assert refused.value.status_code == 400


def test_images_without_a_rendered_prompt_are_refused_not_dropped(server):
    client = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError, match="a raw prompt has no place for images") as refused:
        client.generate("vision", prompt="<start_of_image>", raw=True, images=[picture(1)])
    assert refused.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="images need a prompt"):
        client.generate("vision", images=[picture(1)])


WEBP_REFUSAL = r"takes images as image/jpeg, image/png, not image/webp.*plugd-webp"


def test_without_plugd_webp_a_webp_is_refused_in_every_dialect(server_without_webp):
    url, webp = server_without_webp.url, picture(40, "webp")
    with pytest.raises(ollama.ResponseError, match=WEBP_REFUSAL) as refused:
        ollama.Client(host=url).chat("vision", messages=[{"role": "user", "content": "?", "images": [webp]}])
    assert refused.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match=WEBP_REFUSAL):
        openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
            model="vision", max_tokens=2, messages=[{"role": "user", "content": [openai_image(webp, "webp")]}])
    source = {"type": "base64", "media_type": "image/webp", "data": b64(webp)}
    with pytest.raises(anthropic.BadRequestError, match=WEBP_REFUSAL):
        anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0).messages.create(
            model="vision", max_tokens=2, messages=[{"role": "user", "content": [{"type": "image", "source": source}]}])


def test_without_plugd_webp_a_png_still_works(server_without_webp):
    response = ollama.Client(host=server_without_webp.url).chat(
        "vision", messages=[{"role": "user", "content": "?", "images": [picture(41)]}], options=GREEDY)
    assert response.done_reason == "length" and response.prompt_eval_count > 16


def test_a_runner_whose_vision_tower_fails_reports_it_and_the_daemon_serves_on(server):
    client = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError, match="the vision tower broke"):
        client.chat("broken", messages=[{"role": "user", "content": "?", "images": [picture(50)]}], options=GREEDY)
    assert client.chat("broken", messages=[{"role": "user", "content": "hi"}], options=GREEDY).done_reason == "length"
    response = client.chat("vision", messages=[{"role": "user", "content": "?", "images": [picture(51)]}],
                           options=GREEDY)
    assert response.done_reason == "length"
