"""Images end to end for the vision families whose checkpoints transformers writes here, Gemma 4
(plugd.testing.gemma4_vision_checkpoints), Nemotron-H Omni (plugd.testing.nemotron_omni_checkpoints) and Qwen3.5
(plugd.testing.qwen3_5_vision_checkpoints): a live
`plugd serve` answers a prompt with two images of different sizes through the official ollama, openai and anthropic
clients with the tokens transformers' greedy generate gives (the first two read token by token from their logprobs,
the third's text equal to the first's); a WebP image (through plugd-webp) answers as its PNG; the second turn of a
conversation with the same images evaluates only its new tokens; the model is reported with `vision`, while a copy
without its tower is not and refuses images; and, for the families with an audio tower, a copy that also carries
it is reported as not supporting audio, and refuses audio input."""

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
from plugd_prefix_cache.policy import DEFAULT_TAIL_MARGINS

pytest.importorskip("torch")
from plugd.testing import gemma4_vision_checkpoints, nemotron_omni_checkpoints, qwen3_5_vision_checkpoints  # noqa: E402

FAMILIES = {
    "gemma4": (gemma4_vision_checkpoints, lambda path: gemma4_vision_checkpoints.write_gemma4_vision(path, seed=2)),
    "nemotron_h_omni": (nemotron_omni_checkpoints,
                        lambda path: nemotron_omni_checkpoints.write_nemotron_omni(path, seed=3)),
    "qwen3_5": (qwen3_5_vision_checkpoints, lambda path: qwen3_5_vision_checkpoints.write_qwen3_5_vision(path, seed=0)),
}
NEW_TOKENS = 8
GREEDY = {"temperature": 0, "num_predict": NEW_TOKENS}
QUESTION = "Which is brighter?"


def picture(width: int, height: int, seed: int, kind: str = "PNG", **options) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, kind, **options)
    return out.getvalue()


# Different sizes and aspect ratios, so each family gives them different numbers of tokens.
UPRIGHT, WIDE = picture(37, 53, 1), picture(61, 29, 2, "JPEG", quality=90)
FIRST_TURN = [{"role": "user", "content": QUESTION, "images": [UPRIGHT, WIDE]}]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return FAMILIES[request.param][0]


@pytest.fixture(scope="module")
def checkpoints(request, family, tmp_path_factory) -> dict[str, Path]:
    """The checkpoint, a copy without its tower, and where the family has an audio tower, a copy that also carries
    it (one tensor of it stands for it)."""
    from safetensors.numpy import load_file, save_file

    root = tmp_path_factory.mktemp("vision-e2e")
    vision = next(write for module, write in FAMILIES.values() if module is family)(root / "vision")
    weights = load_file(vision / "model.safetensors")
    copies = {"text": {name: tensor for name, tensor in weights.items() if not name.startswith(family.TOWER_TENSORS)}}
    if family.AUDIO_TENSOR is not None:
        copies["audio"] = weights | {family.AUDIO_TENSOR: np.zeros((4, 4), np.float32)}
    for name, tensors in copies.items():
        shutil.copytree(vision, root / name)
        save_file(tensors, root / name / "model.safetensors", metadata={"format": "pt"})
    return {"vision": vision} | {name: root / name for name in copies}


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory):
    """Each checkpoint created as a model, from a Modelfile that turns Ollama's default repeat penalty off, so that
    greedy output is what transformers' greedy generate gives (a penalty makes the prompt's last tokens, as the "r"
    of "brighter", less likely)."""
    live = LiveServer(tmp_path_factory.mktemp("vision-store") / "models")
    modelfiles = tmp_path_factory.mktemp("vision-modelfiles")
    try:
        for name, checkpoint in checkpoints.items():
            (modelfiles / name).write_text(f"FROM {checkpoint}\nPARAMETER repeat_penalty 1\n")
            created = live.cli("create", name, "-f", str(modelfiles / name))
            assert created.returncode == 0, created.stderr
            assert ("audio tower is not supported" in created.stdout + created.stderr) == (name == "audio")
        yield live
    finally:
        live.stop()


def as_json(messages: list[dict]) -> list[dict]:
    return [message | {"images": [b64(image) for image in message.get("images", [])]} for message in messages]


def prompt_ids(server: LiveServer, family, path: Path, messages: list[dict]) -> list[int]:
    """The rendered conversation's token ids, each image expanded as transformers' processor expands it."""
    body = {"model": "vision", "messages": as_json(messages), "_debug_render_only": True}
    response = httpx.post(server.url + "/api/chat", json=body, timeout=30)
    assert response.status_code == 200, response.text
    pieces = response.json()["_debug_info"]["rendered_template"].split(family.PLACEHOLDER)
    images = [Image.open(io.BytesIO(image)) for message in messages for image in message.get("images", [])]
    assert len(pieces) == len(images) + 1
    runs = family.reference_expansions(images) if images else []
    return Tokenizer.from_dir(path).encode("".join(piece + run for piece, run in zip(pieces, [*runs, ""])))


@pytest.fixture(scope="module")
def expected(server, family, checkpoints) -> list[str]:
    """The tokens of transformers' greedy continuation of the first turn, as logprobs name them."""
    path = checkpoints["vision"]
    ids = prompt_ids(server, family, path, FIRST_TURN)
    new = family.reference_greedy(path, ids, [Image.open(io.BytesIO(data)) for data in (UPRIGHT, WIDE)], NEW_TOKENS)
    assert len(new) == NEW_TOKENS, "transformers stopped early: the comparison would cover fewer tokens"
    tokenizer = Tokenizer.from_dir(path)
    return [tokenizer.token_text(token) for token in new]


def ask_ollama(server: LiveServer, images: list[bytes], model: str = "vision") -> ollama.ChatResponse:
    return ollama.Client(host=server.url).chat(model, messages=[{"role": "user", "content": QUESTION, "images": images}],
                                               options=GREEDY, logprobs=True)


def test_vision_is_reported_only_for_the_checkpoint_with_its_tower(server):
    client = ollama.Client(host=server.url)
    assert "vision" in client.show("vision").capabilities
    assert "vision" not in client.show("text").capabilities
    with pytest.raises(ollama.ResponseError, match="does not support images") as refused:
        client.chat("text", messages=[{"role": "user", "content": QUESTION, "images": [UPRIGHT]}])
    assert refused.value.status_code == 400
    assert client.chat("text", messages=[{"role": "user", "content": QUESTION}], options=GREEDY).eval_count > 0


def test_ollama_chat_with_two_images_gives_transformers_greedy_output(server, expected):
    reply = ask_ollama(server, [UPRIGHT, WIDE])
    assert [logprob.token for logprob in reply.logprobs] == expected
    assert reply.eval_count == NEW_TOKENS


def openai_image(data: bytes, mime: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64(data)}"}}


def test_openai_chat_with_two_images_gives_transformers_greedy_output(server, expected):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    content = [openai_image(UPRIGHT, "image/png"), openai_image(WIDE, "image/jpeg"), {"type": "text", "text": QUESTION}]
    reply = client.chat.completions.create(model="vision", messages=[{"role": "user", "content": content}],
                                           max_tokens=NEW_TOKENS, temperature=0, logprobs=True)
    assert [logprob.token for logprob in reply.choices[0].logprobs.content] == expected


def test_anthropic_messages_with_two_images_give_transformers_greedy_output(server, expected):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

    def block(data: bytes, mime: str) -> dict:
        return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(data)}}

    content = [block(UPRIGHT, "image/png"), block(WIDE, "image/jpeg"), {"type": "text", "text": QUESTION}]
    reply = client.messages.create(model="vision", max_tokens=NEW_TOKENS, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": content}])
    assert reply.content[0].text == ask_ollama(server, [UPRIGHT, WIDE]).message.content
    assert reply.usage.output_tokens == NEW_TOKENS


def test_a_webp_image_answers_as_its_png(server, expected):
    webp = io.BytesIO()
    Image.open(io.BytesIO(UPRIGHT)).save(webp, "WEBP", lossless=True)
    assert [logprob.token for logprob in ask_ollama(server, [webp.getvalue(), WIDE]).logprobs] == expected


def test_the_second_turn_with_the_same_images_evaluates_only_its_new_tokens(server, family, checkpoints):
    """No more than what follows the longest prefix the two turns' prompts share is evaluated (the first turn's
    reply is cached too, where the second prompt writes it as it was generated): the images come from the cache."""
    client = ollama.Client(host=server.url)
    first = client.chat("vision", messages=as_json(FIRST_TURN), options=GREEDY)
    conversation = [*FIRST_TURN, {"role": "assistant", "content": first.message.content},
                    {"role": "user", "content": "And the other one?"}]
    second = client.chat("vision", messages=as_json(conversation), options=GREEDY)
    path = checkpoints["vision"]
    before, after = (prompt_ids(server, family, path, messages) for messages in (FIRST_TURN, conversation))
    shared = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), len(before))
    tokenizer = Tokenizer.from_dir(path)
    last_image = max(i for i, token in enumerate(before) if tokenizer.token_text(token) == family.IMAGE_END)
    assert shared > last_image  # both images lie in the shared prefix
    # A recurrent model resumes at most from before the first prompt's last token (its state is kept there, since
    # the first decode step fed that token), and only from a restore point. Qwen3.5's template writes the earlier
    # assistant turn without the empty thinking block its generation prompt opened, so the prompts part a few tokens
    # before the first one's end; the prefix cache's nearest restore point lies at most its smallest tail margin
    # before that.
    parted = min(shared, len(before) - 1)
    resumed = len(after) - second.prompt_eval_count
    assert resumed > last_image
    assert resumed >= parted or (family is qwen3_5_vision_checkpoints and parted - resumed < min(DEFAULT_TAIL_MARGINS))


def test_an_audio_tower_is_reported_as_not_supported_and_audio_input_refused(server, family):
    if family.AUDIO_TENSOR is None:
        pytest.skip("this family's checkpoints have no audio tower")
    client = ollama.Client(host=server.url)
    shown = client.show("audio")
    assert shown.modelinfo["plugd.unsupported_inputs"] == ["audio"]
    assert "plugd.unsupported_inputs" not in client.show("vision").modelinfo
    assert "vision" in shown.capabilities
    audio = {"type": "input_audio", "input_audio": {"data": b64(b"RIFF0000WAVE"), "format": "wav"}}
    with pytest.raises(openai.BadRequestError, match="input_audio"):
        openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
            model="audio", messages=[{"role": "user", "content": [audio]}], max_tokens=2)
    assert ask_ollama(server, [UPRIGHT, WIDE], "audio").message.content == ask_ollama(server, [UPRIGHT, WIDE]).message.content
