"""Gemma 4 images end to end: a live `plugd serve` holding a tiny Gemma 4 that transformers wrote with its vision
tower (plugd.testing.gemma4_vision_checkpoints) answers a prompt with two images of different sizes through the
official ollama, openai and anthropic clients with the tokens transformers' greedy generate gives (the first two
read token by token from their logprobs, the third's text equal to the first's); a WebP image (through
plugd-webp) answers as its PNG; the second turn of a conversation with the same images evaluates only its new
tokens; the model is reported with `vision`, while a copy without its tower is not and refuses images; and a copy
that also carries an audio tower is reported as not supporting audio, and refuses audio input."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path

import anthropic
import httpx
import numpy as np
import ollama
import openai
import pytest
from PIL import Image

from plugd.testing.server import LiveServer
from plugd.tokenizer import Tokenizer

pytest.importorskip("torch")
from plugd.testing.gemma4_vision_checkpoints import SOFT_TOKENS, VISION, write_gemma4_vision  # noqa: E402

NEW_TOKENS = 8
GREEDY = {"temperature": 0, "num_predict": NEW_TOKENS}
QUESTION = "Which is brighter?"


def picture(width: int, height: int, seed: int, kind: str = "PNG", **options) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, kind, **options)
    return out.getvalue()


# Different sizes and aspect ratios: 60 and 64 soft tokens.
UPRIGHT, WIDE = picture(37, 53, 1), picture(61, 29, 2, "JPEG", quality=90)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma4-vision-e2e")
    vision = write_gemma4_vision(root / "vision", seed=2)
    text = Path(shutil.copytree(vision, root / "text"))
    from safetensors.numpy import load_file, save_file

    weights = load_file(text / "model.safetensors")
    save_file({name: tensor for name, tensor in weights.items()
               if not name.startswith(("model.vision_tower.", "model.embed_vision."))},
              text / "model.safetensors", metadata={"format": "pt"})
    # An audio tower beside the vision tower (one tensor of it stands for it): plugd does not run it.
    audio = Path(shutil.copytree(vision, root / "audio"))
    save_file(weights | {"model.audio_tower.output_proj.weight": np.zeros((4, 4), np.float32)},
              audio / "model.safetensors", metadata={"format": "pt"})
    return {"vision": vision, "text": text, "audio": audio}


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory):
    live = LiveServer(tmp_path_factory.mktemp("gemma4-vision-store") / "models")
    try:
        for name, checkpoint in checkpoints.items():
            created = live.cli("create", f"g4-{name}", "--from", str(checkpoint))
            assert created.returncode == 0, created.stderr
            assert ("audio tower is not supported" in created.stdout + created.stderr) == (name == "audio")
        yield live
    finally:
        live.stop()


def rendered(server: LiveServer, messages: list[dict]) -> str:
    body = {"model": "g4-vision", "messages": messages, "_debug_render_only": True}
    response = httpx.post(server.url + "/api/chat", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["_debug_info"]["rendered_template"]


def soft_tokens(images: list[bytes]):
    """transformers' processing of `images`: pixel values, patch positions and soft tokens per image."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    processor = Gemma4ImageProcessorPil(patch_size=VISION["patch_size"], max_soft_tokens=SOFT_TOKENS,
                                        pooling_kernel_size=VISION["pooling_kernel_size"])
    return processor(images=[Image.open(io.BytesIO(data)) for data in images], return_tensors="pt")


def prompt_ids(server: LiveServer, path: Path, messages: list[dict]) -> list[int]:
    """The rendered conversation's token ids, each image expanded to the soft tokens transformers counts."""
    images = [base64.b64decode(image) for message in messages for image in message.get("images", [])]
    counts = soft_tokens(images)["num_soft_tokens_per_image"] if images else []
    pieces = rendered(server, messages).split("<|image|>")
    assert len(pieces) == len(images) + 1
    runs = ["<|image>" + "<|image|>" * int(n) + "<image|>" for n in counts]
    return Tokenizer.from_dir(path).encode("".join(piece + run for piece, run in zip(pieces, [*runs, ""])))


@pytest.fixture(scope="module")
def expected(server, checkpoints) -> list[str]:
    """The tokens of transformers' greedy continuation of the rendered prompt, as logprobs name them: each image
    expanded to the soft tokens its own processor counts, the pixels from its processor, the images marked for
    bidirectional attention."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    path = checkpoints["vision"]
    inputs = soft_tokens([UPRIGHT, WIDE])
    ids = torch.tensor([prompt_ids(server, path, [{"role": "user", "content": QUESTION,
                                                   "images": [b64(UPRIGHT), b64(WIDE)]}])])
    model = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"],
                             image_position_ids=inputs["image_position_ids"],
                             mm_token_type_ids=(ids == model.config.image_token_id).long(),
                             max_new_tokens=NEW_TOKENS, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    assert len(new) == NEW_TOKENS, "transformers stopped early: the comparison would cover fewer tokens"
    tokenizer = Tokenizer.from_dir(path)
    return [tokenizer.token_text(token) for token in new]


def test_vision_is_reported_only_for_the_checkpoint_with_its_tower(server):
    client = ollama.Client(host=server.url)
    assert "vision" in client.show("g4-vision").capabilities
    assert "vision" not in client.show("g4-text").capabilities
    with pytest.raises(ollama.ResponseError, match="does not support images") as refused:
        client.chat("g4-text", messages=[{"role": "user", "content": QUESTION, "images": [UPRIGHT]}])
    assert refused.value.status_code == 400


def test_ollama_chat_with_two_images_gives_transformers_greedy_output(server, expected):
    reply = ask_ollama(server, [UPRIGHT, WIDE])
    assert [logprob.token for logprob in reply.logprobs] == expected
    assert reply.eval_count == NEW_TOKENS


def ask_ollama(server: LiveServer, images: list[bytes]) -> ollama.ChatResponse:
    return ollama.Client(host=server.url).chat("g4-vision", messages=[{"role": "user", "content": QUESTION,
                                                                      "images": images}], options=GREEDY, logprobs=True)


def openai_image(data: bytes, mime: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64(data)}"}}


def test_openai_chat_with_two_images_gives_transformers_greedy_output(server, expected):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    content = [openai_image(UPRIGHT, "image/png"), openai_image(WIDE, "image/jpeg"), {"type": "text", "text": QUESTION}]
    reply = client.chat.completions.create(model="g4-vision", messages=[{"role": "user", "content": content}],
                                           max_tokens=NEW_TOKENS, temperature=0, logprobs=True)
    assert [logprob.token for logprob in reply.choices[0].logprobs.content] == expected


def test_anthropic_messages_with_two_images_give_transformers_greedy_output(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

    def block(data: bytes, mime: str) -> dict:
        return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(data)}}

    content = [block(UPRIGHT, "image/png"), block(WIDE, "image/jpeg"), {"type": "text", "text": QUESTION}]
    reply = client.messages.create(model="g4-vision", max_tokens=NEW_TOKENS, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": content}])
    assert reply.content[0].text == ask_ollama(server, [UPRIGHT, WIDE]).message.content
    assert reply.usage.output_tokens == NEW_TOKENS


def test_a_webp_image_answers_as_its_png(server, expected):
    webp = io.BytesIO()
    Image.open(io.BytesIO(UPRIGHT)).save(webp, "WEBP", lossless=True)
    assert [logprob.token for logprob in ask_ollama(server, [webp.getvalue(), WIDE]).logprobs] == expected


def test_the_second_turn_with_the_same_images_evaluates_only_its_new_tokens(server, checkpoints):
    """Only what follows the longest prefix the two turns' prompts share is evaluated: the first turn's images
    come from the cache."""
    client = ollama.Client(host=server.url)
    first_turn = [{"role": "user", "content": QUESTION, "images": [b64(UPRIGHT), b64(WIDE)]}]
    first = client.chat("g4-vision", messages=first_turn, options=GREEDY)
    conversation = [*first_turn, {"role": "assistant", "content": first.message.content},
                    {"role": "user", "content": "And the other one?"}]
    second = client.chat("g4-vision", messages=conversation, options=GREEDY)
    before, after = (prompt_ids(server, checkpoints["vision"], messages) for messages in (first_turn, conversation))
    shared = next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)
    last_image = max(i for i, token in enumerate(before) if Tokenizer.from_dir(checkpoints["vision"]).token_text(token)
                     == "<image|>")
    assert shared > last_image  # both images lie in the shared prefix
    assert second.prompt_eval_count == len(after) - shared


def test_an_audio_tower_is_reported_as_not_supported_and_audio_input_refused(server):
    shown = ollama.Client(host=server.url).show("g4-audio")
    assert shown.modelinfo["plugd.unsupported_inputs"] == ["audio"]
    assert "plugd.unsupported_inputs" not in ollama.Client(host=server.url).show("g4-vision").modelinfo
    assert "vision" in shown.capabilities
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    audio = {"type": "input_audio", "input_audio": {"data": b64(b"RIFF0000WAVE"), "format": "wav"}}
    with pytest.raises(openai.BadRequestError, match="input_audio"):
        client.chat.completions.create(model="g4-audio", messages=[{"role": "user", "content": [audio]}], max_tokens=2)
    reply = ollama.Client(host=server.url).chat(
        "g4-audio", messages=[{"role": "user", "content": QUESTION, "images": [UPRIGHT, WIDE]}], options=GREEDY)
    assert reply.message.content == ask_ollama(server, [UPRIGHT, WIDE]).message.content
