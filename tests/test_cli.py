"""The `plugd` command against a real daemon, and without one."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx

import plugd
from plugd import __version__
from plugd.testing.server import free_port


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "plugd", *args], env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=60,
    )


def test_version():
    assert run("--version").stdout.strip() == f"plugd {__version__}"


def test_commands_say_when_the_daemon_is_not_running():
    port = free_port()
    for args in (["list"], ["show", "x"], ["cp", "a", "b"], ["rm", "a"]):
        result = run(*args, env={"PLUGD_HOST": f"127.0.0.1:{port}"})
        assert result.returncode == 1
        assert result.stderr.strip() == (
            f"Error: could not connect to plugd at http://127.0.0.1:{port}; is `plugd serve` running?"
        )


def test_serve_on_a_busy_port_fails_with_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("serve", env={"PLUGD_HOST": f"127.0.0.1:{port}", "PLUGD_MODELS": str(tmp_path)})
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"Error: listen tcp 127.0.0.1:{port}: address already in use"]


def test_create_list_show_copy_remove(plugd_server, tiny_qwen3):
    cli = plugd_server.cli
    created = cli("create", "tiny", "--from", str(tiny_qwen3))
    assert created.returncode == 0, created.stderr
    assert created.stderr.splitlines()[-1] == "success"

    listing = cli("list").stdout.splitlines()
    assert listing[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert listing[1].startswith("tiny:latest")

    shown = cli("show", "tiny").stdout
    assert "architecture        qwen3" in shown
    assert "context length      4096" in shown
    assert "embedding length    64" in shown
    assert "thinking" in shown

    assert "model.embed_tokens.weight" in cli("show", "tiny", "--verbose").stdout
    assert cli("cp", "tiny", "tiny2").returncode == 0
    assert cli("rm", "tiny").stdout.strip() == "deleted 'tiny'"
    assert [line.split()[0] for line in cli("list").stdout.splitlines()[1:]] == ["tiny2:latest"]

    missing = cli("rm", "tiny")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "Error: model 'tiny:latest' not found"


def test_create_from_modelfile(plugd_server, tiny_qwen3, tmp_path):
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(
        f'FROM {os.path.relpath(tiny_qwen3, tmp_path)}\n'
        'PARAMETER temperature 0.3\nPARAMETER stop "<|im_end|>"\nPARAMETER stop END\n'
        'SYSTEM """You answer\nin two lines."""\n'
        "MESSAGE user Hello\nMESSAGE assistant Hi!\nLICENSE Apache-2.0\n"
    )
    result = plugd_server.cli("create", "custom", "-f", str(modelfile))
    assert result.returncode == 0, result.stderr
    assert plugd_server.cli("show", "custom", "--system").stdout == "You answer\nin two lines.\n"
    assert plugd_server.cli("show", "custom", "--license").stdout.strip() == "Apache-2.0"
    params = plugd_server.cli("show", "custom", "--parameters").stdout.split()
    assert params == ["temperature", "0.3", "stop", '"<|im_end|>"', "stop", '"END"']

    # The generated Modelfile recreates the same model from it.
    regenerated = tmp_path / "Regenerated"
    regenerated.write_text(plugd_server.cli("show", "custom", "--modelfile").stdout)
    assert plugd_server.cli("create", "again", "-f", str(regenerated)).returncode == 0
    assert plugd_server.cli("show", "again", "--modelfile").stdout.replace("again", "custom") == regenerated.read_text()


def test_modelfile_errors_name_file_and_line(plugd_server, tmp_path):
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM base\n# comment\nADAPTER ./lora\n")
    result = plugd_server.cli("create", "x", "-f", str(modelfile))
    assert result.returncode == 1
    assert result.stderr.strip() == f"Error: {modelfile}:3: unknown command 'ADAPTER'"

    modelfile.write_text("FROM base\n")
    result = plugd_server.cli("create", "x", "-f", str(modelfile))
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: model 'base:latest' not found"


def test_a_missing_model_directory_is_named(plugd_server, tmp_path):
    result = plugd_server.cli("create", "x", "--from", str(tmp_path / "absent"))
    assert (result.returncode, result.stderr.strip()) == (
        1, f"Error: {tmp_path / 'absent'} is not a directory; --from takes a Hugging Face model directory")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM ./absent\n")
    result = plugd_server.cli("create", "x", "-f", str(modelfile))
    assert (result.returncode, result.stderr.strip()) == (1, f"Error: {modelfile}: FROM ./absent: no such directory")


def test_modelfile_from_a_home_directory_path(plugd_server, tiny_qwen3, tmp_path):
    (tmp_path / "home").mkdir()
    shutil.copytree(tiny_qwen3, tmp_path / "home" / "tiny")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM ~/tiny\n")
    result = subprocess.run([sys.executable, "-m", "plugd", "create", "x", "-f", str(modelfile)], capture_output=True,
                            text=True, env=plugd_server.env | {"HOME": str(tmp_path / "home")}, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_template_must_be_jinja(plugd_server, tiny_qwen3, tmp_path):
    plugd_server.cli("create", "base", "--from", str(tiny_qwen3), check=True)
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text('FROM base\nTEMPLATE """{{ if .System }}{{ .System }}{{ end }}{{ .Prompt }}"""\n')
    result = plugd_server.cli("create", "x", "-f", str(modelfile))
    assert (result.returncode, result.stderr.strip()) == (1, (
        "Error: TEMPLATE is not a valid Jinja template: unexpected '.' (line 1). It looks like an Ollama Go template; "
        "plugd's TEMPLATE is a Jinja chat template, as in a model's tokenizer_config.json."))
    jinja = "{% for m in messages %}{{ m.content }}{% endfor %}"
    modelfile.write_text(f'FROM base\nTEMPLATE "{jinja}"\n')
    assert plugd_server.cli("create", "x", "-f", str(modelfile)).returncode == 0
    assert plugd_server.cli("show", "x", "--template").stdout.strip() == jinja


def test_create_refuses_a_model_type_no_installed_plugin_runs(plugd_server, tiny_qwen3):
    config = json.loads((tiny_qwen3 / "config.json").read_text())
    (tiny_qwen3 / "config.json").write_text(json.dumps(config | {"model_type": "nowhere"}))
    result = plugd_server.cli("create", "x", "--from", str(tiny_qwen3))
    assert result.returncode == 1
    error = result.stderr.splitlines()[-1]
    assert error.startswith("Error: no installed architecture plugin runs model_type 'nowhere'; installed: ")
    assert "qwen3" in error.split("installed: ")[1]
    assert plugd_server.cli("list").stdout.splitlines()[1:] == []


def test_bare_plugd_prints_help():
    result = run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: plugd ")
    assert "start the daemon" in result.stdout and "chat with a model" in result.stdout


def test_the_hidden_runner_command_is_not_offered():
    assert "runner" not in run("--help").stdout
    unknown = run("frobnicate")
    assert unknown.returncode == 2
    assert "invalid choice: 'frobnicate'" in unknown.stderr and "'serve'" in unknown.stderr
    assert "runner" not in unknown.stderr
    assert run("runner", "--help").stdout.startswith("usage: plugd runner ")  # the daemon still starts runners


def test_a_bad_flag_prints_its_subcommands_usage():
    for args, usage in ((["list", "--bogus"], "usage: plugd list [-h]"),
                        (["create", "x", "--bogus"], "usage: plugd create [-h] [--from DIR | -f MODELFILE]")):
        result = run(*args)
        assert result.returncode == 2
        assert result.stderr.startswith(usage)
        assert result.stderr.splitlines()[-1] == f"plugd {args[0]}: error: unrecognized arguments: --bogus"


def test_run_usage_shows_the_prompt_as_optional():
    assert run("run", "--help").stdout.splitlines()[0] == "usage: plugd run [-h] [--verbose] [--insecure] MODEL [PROMPT ...]"


def test_serve_help_lists_every_environment_variable_the_core_reads():
    read = set()
    for source in (Path(plugd.__file__).parent).rglob("*.py"):
        read |= set(re.findall(r"""environ(?:\.get\(|\[)\s*["'](PLUGD_[A-Z_]+)""", source.read_text()))
    assert "PLUGD_HOST" in read and "PLUGD_KEEP_ALIVE" in read
    help_text = run("serve", "--help").stdout
    listed = set(re.findall(r"^  (PLUGD_[A-Z_]+) ", help_text, re.MULTILINE))
    assert listed == read
    assert "how long an idle model stays loaded" in help_text and "(default: 5m)" in help_text


def test_an_unknown_quantization_is_refused_before_any_upload(plugd_server, tiny_qwen3):
    result = plugd_server.cli("create", "x", "--from", str(tiny_qwen3), "--quantize", "q2")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "plugd create: error: argument -q/--quantize: unsupported quantization 'q2': plugd quantizes to q4 or q8 "
        "(MLX affine)")
    assert "copying file" not in result.stderr
    assert not any(path.is_file() for path in (plugd_server.models / "blobs").rglob("*"))


def test_output_into_a_closed_pipe_ends_without_a_traceback():
    reader, writer = os.pipe()
    os.close(reader)  # as `| head -1` is once it has its line: every write from here on fails
    try:
        result = subprocess.run([sys.executable, "-m", "plugd", "plugins", "--json"], stdout=writer,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(writer)
    assert (result.returncode, result.stderr) == (1, "")


def test_stop_says_when_the_model_is_not_loaded(plugd_server, tiny_qwen3):
    cli = plugd_server.cli
    cli("create", "tiny", "--from", str(tiny_qwen3), check=True)
    idle = cli("stop", "tiny")
    assert (idle.returncode, idle.stderr) == (0, "model 'tiny:latest' is not loaded\n")
    # The unload request behind it answers without loading the model first, as Ollama's does.
    unload = httpx.post(f"{plugd_server.url}/api/generate", json={"model": "tiny", "keep_alive": 0, "stream": False})
    assert unload.json()["done_reason"] == "unload" and unload.json()["load_duration"] == 0
    assert plugd_server.runner_pids() == []

    httpx.post(f"{plugd_server.url}/api/generate", json={"model": "tiny"}, timeout=120).raise_for_status()
    assert len(plugd_server.runner_pids()) == 1
    loaded = cli("stop", "tiny")
    assert (loaded.returncode, loaded.stderr) == (0, "")
    assert plugd_server.runner_pids() == [] and cli("ps").stdout.splitlines()[1:] == []

    missing = cli("stop", "nope")
    assert (missing.returncode, missing.stderr) == (1, "Error: model 'nope:latest' not found\n")
