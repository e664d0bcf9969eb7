"""`plugd create --from DIR` takes the files a model is made of and nothing else: a note, a folder, or a link out of
the directory (to /etc/passwd, say) is skipped and named, while a Hugging Face cache snapshot, whose files are links
into the repository's blob folder, imports whole."""

import shutil

import httpx


def test_only_model_files_are_taken(plugd_server, tiny_qwen3, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_qwen3, model)
    (model / "notes.txt").symlink_to("/etc/passwd")
    (model / "merges.txt").symlink_to("/etc/passwd")  # a model file's name does not make a link out acceptable
    (model / "README.md").write_text("# a model card\n")
    (model / "original").mkdir()
    (model / "LICENSE").write_text("MIT\n")
    (model / "tokenizer_config.json").rename(model / "tokenizer_config.real.json")
    (model / "tokenizer_config.json").symlink_to("tokenizer_config.real.json")  # a link inside: followed

    result = plugd_server.cli("create", "m", "--from", str(model))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "skipping notes.txt: not a model file" in lines
    assert "skipping merges.txt: a link out of the model directory, to /etc/passwd" in lines
    assert "skipping README.md: not a model file" in lines
    assert "skipping original: a folder" in lines
    assert "skipping tokenizer_config.real.json: not a model file" in lines
    copied = sorted(line.removeprefix("copying file ") for line in lines if line.startswith("copying file "))
    assert copied == sorted(["LICENSE", "config.json", "generation_config.json", "model.safetensors",
                             "tokenizer.json", "tokenizer_config.json"])
    reply = httpx.post(f"{plugd_server.url}/api/generate",
                       json={"model": "m", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}, timeout=120)
    assert reply.status_code == 200, reply.text


def test_a_hub_cache_snapshot_imports_through_its_links(plugd_server, tiny_qwen3, tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / ("0" * 40)
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(tiny_qwen3.iterdir())):
        shutil.copy(file, blobs / f"blob{i}")
        (snapshot / file.name).symlink_to(f"../../blobs/blob{i}")

    result = plugd_server.cli("create", "cached", "--from", str(snapshot))
    assert result.returncode == 0, result.stderr
    assert "skipping" not in result.stderr
    copied = [line for line in result.stderr.splitlines() if line.startswith("copying file ")]
    assert len(copied) == len(list(tiny_qwen3.iterdir()))
