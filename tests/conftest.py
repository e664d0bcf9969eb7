"""Session fixtures shared by the core's end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import ollama
import pytest

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer
from plugd.testing.transcripts import train_agent

AGENT_MODEL = "agent"
# Greedy and unpenalised, so that every dialect's default sampling reproduces the trained answers exactly.
AGENT_MODELFILE = """\
FROM {checkpoint}
RENDERER jinja
PARSER qwen3
PARAMETER temperature 0
PARAMETER top_k 1
PARAMETER repeat_penalty 1
"""


@pytest.fixture(scope="session")
def trained_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where checkpoints trained in this session are kept (train_checkpoint's `cache_dir`), so that modules training
    the same one train it once."""
    return tmp_path_factory.getbasetemp() / "trained-checkpoints"


@pytest.fixture(scope="session")
def agent_checkpoint(tmp_path_factory: pytest.TempPathFactory, trained_checkpoints: Path) -> Path:
    """The tiny checkpoint trained on plugd.testing.transcripts' scenario, trained once per test session."""
    return train_agent(tmp_path_factory.mktemp("agent") / "checkpoint", cache_dir=trained_checkpoints)


@pytest.fixture(scope="session")
def agent_server(agent_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One live `plugd serve` for the session, holding model "agent": a tiny checkpoint that really thinks and calls
    tools, trained until greedy decoding answers each conversation of plugd.testing.transcripts word for word.

    The model renders with the checkpoint's own ChatML template (RENDERER jinja), parses with the `qwen3` parser,
    and samples greedily (temperature 0, top_k 1, repeat_penalty 1) unless a request says otherwise. Sent as the
    scenario's Exchange constants describe (the exact texts are constants there), it answers:

    - WEATHER_CALL_TURN, [user WEATHER_QUESTION] with tools [WEATHER_TOOL]: thinking WEATHER_CALL_THINKING, no
      content, one tool call get_weather {"city": "Paris"};
    - weather_answer_turn(...), the same plus that call and the tool result WEATHER_RESULT, with the call's thinking
      kept in the history or not, with call ids or not: thinking WEATHER_ANSWER_THINKING, content WEATHER_ANSWER;
    - HELLO, [user HELLO_QUESTION], no tools, thinking on or unspecified: thinking HELLO_THINKING, content
      HELLO_ANSWER;
    - HELLO_WITHOUT_THINKING, the same with thinking off: content HELLO_ANSWER_WITHOUT_THINKING.

    Raw prompts (Exchange.prompt()) complete with Exchange.completion(). Anything else (a system prompt, other
    wording, other tools) gets no trained answer. Tests share the server: leave model "agent" as it is.
    """
    models = tmp_path_factory.mktemp("agent-server") / "models"
    server = LiveServer(models)
    try:
        modelfile = models.parent / "Modelfile"
        modelfile.write_text(AGENT_MODELFILE.format(checkpoint=agent_checkpoint))
        created = server.cli("create", AGENT_MODEL, "-f", str(modelfile))
        assert created.returncode == 0, f"plugd create failed:\n{created.stderr}\n{server.log()}"
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tiny_server(plugd_server_factory, tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    """A live server, one per test module, holding model "tiny": a random-weight qwen3 checkpoint."""
    live = plugd_server_factory()
    created = live.cli("create", "tiny", "--from", str(write_checkpoint(tmp_path_factory.mktemp("tiny"), "qwen3")))
    assert created.returncode == 0, created.stderr
    return live


@pytest.fixture(scope="module")
def modelfile_server(plugd_server_factory, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., LiveServer]:
    """Starts a live server (stopped after the module) holding models created, in order, from Modelfile texts:
    `modelfile_server({"tiny": f"FROM {checkpoint}\\nRENDERER jinja\\n", "scripted": "FROM tiny\\nPARSER x\\n"})`;
    `env` adds to the server's environment."""

    def start(modelfiles: dict[str, str], env: dict[str, str] | None = None) -> LiveServer:
        live = plugd_server_factory(env=env)
        folder = tmp_path_factory.mktemp("modelfiles")
        for name, text in modelfiles.items():
            (folder / name).write_text(text)
            live.cli("create", name, "-f", str(folder / name), check=True)
        return live

    return start


@pytest.fixture(scope="module")
def checkpoints_server(plugd_server_factory, checkpoints: dict[str, Path]) -> LiveServer:
    """A live server holding each of the test module's `checkpoints` (a module-scoped fixture it defines: model type ->
    checkpoint directory), uploaded and created through the ollama client as the model type with "-" for "_"."""
    live = plugd_server_factory()
    client = ollama.Client(host=live.url)
    for model_type, path in checkpoints.items():
        files = {p.name: client.create_blob(p) for p in sorted(path.iterdir())}
        client.create(model=model_type.replace("_", "-"), files=files)
    return live
