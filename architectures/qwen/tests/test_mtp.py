"""The multi-token-prediction head (`mtp.*`) of Qwen3-Next and Qwen3.5, the model's own drafter (plugd.nn.mtp): loaded
where the checkpoint carries it and only there; its drafts are what transformers' own Qwen3-Next layers, put together
as vLLM's Qwen3-Next MTP puts them, compute (transformers has no MTP forward of its own); drafting in cached chunks
and steps as the engine will equals one pass; and trained on transcripts (plugd.testing.training) it drafts the
model's own next-but-one tokens, where the untrained head does not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

from plugd.nn.mtp import drafter
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.training import Transcript, train_checkpoint, train_mtp_head
from plugd.tokenizer import Tokenizer
from plugd_qwen import qwen3_5, qwen3_5_moe, qwen3_next

MODULES = {"qwen3_next": qwen3_next, "qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5_moe}
TOKENS = mx.array(np.random.default_rng(11).integers(0, 512, 40), mx.int32)[None]
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=sorted(MODULES))
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, write_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=2)


def rewritten(source: Path, target: Path, tensors=lambda t: t, config=lambda c: c) -> Path:
    target = Path(shutil.copytree(source, target))
    save_file(tensors(load_file(target / "model.safetensors")), target / "model.safetensors")
    (target / "config.json").write_text(json.dumps(config(json.loads((target / "config.json").read_text()))))
    return target


def test_the_head_loads_with_the_checkpoints_tensors(checkpoint):
    model_type, path = checkpoint
    model = load_model(path, MODULES[model_type])
    head = drafter(model)
    assert head is not None and len(head.make_cache()) == 1
    fc = load_file(path / "model.safetensors")["mtp.fc.weight"]
    assert np.array_equal(np.array(head.head.fc.weight), fc)
    logits, hidden = model(TOKENS, return_hidden=True)
    assert mx.array_equal(logits, model(TOKENS))
    assert hidden.shape == (*TOKENS.shape, fc.shape[0])


@pytest.mark.parametrize("without", ["tensors", "config"])
def test_no_head_without_its_tensors_or_its_config(checkpoint, tmp_path, without):
    """As mlx-lm's conversions leave the tensors out while the config still announces the head; a config that
    announces none has no place for tensors it finds."""
    model_type, path = checkpoint

    def no_tensors(tensors):
        return {name: t for name, t in tensors.items() if not name.startswith("mtp.")}

    def no_config(config):
        (config.get("text_config") or config)["mtp_num_hidden_layers"] = 0
        return config

    changed = rewritten(path, tmp_path / "m", **({"tensors": no_tensors} if without == "tensors" else
                                                  {"config": no_config}))
    model = load_model(changed, MODULES[model_type])
    assert drafter(model) is None
    assert mx.array_equal(model(TOKENS), load_model(path, MODULES[model_type])(TOKENS))


def test_cached_drafting_in_chunks_and_steps_equals_one_pass(checkpoint):
    model_type, path = checkpoint
    model = load_model(path, MODULES[model_type])
    head = drafter(model)
    _, hidden = model(TOKENS, return_hidden=True)
    whole, _ = head(hidden[:, :-1], TOKENS[:, 1:])
    cache = head.make_cache()
    parts = [head(hidden[:, start:end], TOKENS[:, start + 1:end + 1], cache)[0]
             for start, end in ((0, 17), (17, 30), (30, 31), (31, 39))]
    assert cache[0].offset == TOKENS.shape[1] - 1
    assert mx.abs(mx.concatenate(parts, axis=1) - whole).max().item() <= TOLERANCE


def one_layer_model(path: Path, target: Path) -> Path:
    """The checkpoint with its head's decoder layer as its only layer (full attention), for transformers to build."""
    def tensors(all_tensors):
        kept = {name: t for name, t in all_tensors.items() if not name.startswith(("model.layers.", "mtp."))}
        return kept | {name.replace("mtp.layers.", "model.layers."): t for name, t in all_tensors.items()
                       if name.startswith("mtp.layers.")}

    return rewritten(path, target, tensors, lambda c: c | {"num_hidden_layers": 1, "layer_types": ["full_attention"]})


def transformers_drafts(path: Path, tmp_path: Path, tokens: np.ndarray) -> np.ndarray:
    """The head's logits at every position of `tokens`, from transformers' Qwen3-Next: the model's final hidden
    states, and as vLLM's Qwen3NextMultiTokenPredictor composes them, its RMS norms, a linear map and its decoder
    layer (taken from a one-layer model built of the head's layer tensors)."""
    main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    layer_model = AutoModelForCausalLM.from_pretrained(one_layer_model(path, tmp_path / "one"), dtype=torch.float32)
    stored = {name: torch.tensor(t) for name, t in load_file(path / "model.safetensors").items()}
    config = main.config

    def norm(name: str) -> Qwen3NextRMSNorm:
        module = Qwen3NextRMSNorm(config.hidden_size, config.rms_norm_eps)
        module.weight.data = stored[f"mtp.{name}.weight"]
        return module

    ids = torch.tensor(tokens)
    length = ids.shape[1] - 1
    with torch.no_grad():
        hidden = main(ids, output_hidden_states=True).hidden_states[-1][:, :-1]
        joined = torch.cat([norm("pre_fc_norm_embedding")(main.model.embed_tokens(ids[:, 1:])),
                            norm("pre_fc_norm_hidden")(hidden)], dim=-1)
        x = joined @ stored["mtp.fc.weight"].T
        positions = torch.arange(length)[None]
        mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
        x = layer_model.model.layers[0](x, position_embeddings=layer_model.model.rotary_emb(x, positions),
                                        attention_mask=mask, position_ids=positions)
        return main.lm_head(norm("norm")(x)).numpy()


def test_qwen3_next_drafts_as_transformers_layers_compute(tmp_path):
    path = write_checkpoint(tmp_path / "next", "qwen3_next", seed=5)
    model = load_model(path, qwen3_next)
    _, hidden = model(TOKENS, return_hidden=True)
    logits, _ = drafter(model)(hidden[:, :-1], TOKENS[:, 1:])
    expected = transformers_drafts(path, tmp_path, np.array(TOKENS))
    assert np.abs(np.array(logits) - expected).max() <= TOLERANCE
    swapped = rewritten(path, tmp_path / "swapped", lambda t: t | {  # the hidden state's half first: not the head
        "mtp.fc.weight": np.concatenate(np.split(t["mtp.fc.weight"], 2, axis=1)[::-1], axis=1)})
    model = load_model(swapped, qwen3_next)
    logits, _ = drafter(model)(hidden[:, :-1], TOKENS[:, 1:])
    assert np.abs(np.array(logits) - expected).max() > 100 * TOLERANCE


# Trained: the model on two transcripts, then its head on the same.

def turn(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


TRANSCRIPTS = [Transcript(turn("Hi"), "Hello, how are you today? The river is calm and the parrots sing."),
               Transcript(turn("Where is the fox?"), "The quick brown fox sleeps under the old bridge near the market.")]


def draft_agreement(model, tokenizer: Tokenizer, transcript: Transcript) -> float:
    """How often the head's first draft is the token the model then decodes greedily, over the transcript's answer,
    the model and its head cached as the engine caches them: the head run over the prompt's hidden states and its
    tokens shifted by one, then one pair per decoded token."""
    head = drafter(model)
    cache, head_cache = model.make_cache(), head.make_cache()
    prompt = mx.array(tokenizer.encode(transcript.prompt))[None]
    logits, hidden = model(prompt, cache, return_hidden=True)
    token = mx.argmax(logits[:, -1:], axis=-1)
    draft_logits, _ = head(hidden, mx.concatenate([prompt[:, 1:], token], axis=1), head_cache)
    steps = len(tokenizer.encode(transcript.completion))  # the answer's tokens after its first, and its end of turn
    agreed = 0
    for _ in range(steps):
        draft = mx.argmax(draft_logits[:, -1:], axis=-1)
        logits, hidden = model(token, cache, return_hidden=True)
        token = mx.argmax(logits[:, -1:], axis=-1)
        agreed += int(draft.item() == token.item())
        draft_logits, _ = head(hidden, token, head_cache)
    return agreed / steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trained") / "model"
    train_checkpoint(path, TRANSCRIPTS, model_type="qwen3_next", overrides={"num_hidden_layers": 2})
    shutil.copytree(path, path.with_name("untrained-head"))
    return train_mtp_head(path, TRANSCRIPTS)


def test_a_trained_head_drafts_the_models_next_but_one_tokens(trained):
    tokenizer = Tokenizer.from_dir(trained)
    rates = [draft_agreement(load_model(trained, qwen3_next), tokenizer, t) for t in TRANSCRIPTS]
    untrained = [draft_agreement(load_model(trained.with_name("untrained-head"), qwen3_next), tokenizer, t)
                 for t in TRANSCRIPTS]
    assert min(rates) == 1.0, rates
    assert max(untrained) <= 0.2, untrained
