"""`plugd run` of a model the store lacks pulls it first, as `ollama run` does: a real registry (Debian's
docker-registry on loopback), a daemon that pushed the model there, and an empty one that runs it."""

import ollama
import pytest

from plugd.registry.testing import DockerRegistry
from plugd.testing.checkpoints import write_checkpoint

MODELFILE = "FROM {checkpoint}\nPARAMETER num_predict 4\nPARAMETER temperature 0\n"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with DockerRegistry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="module")
def pushed(registry, plugd_server_factory, tmp_path_factory):
    """A tiny model, short and greedy, pushed to the registry; its name there."""
    root = tmp_path_factory.mktemp("source")
    (root / "Modelfile").write_text(MODELFILE.format(checkpoint=write_checkpoint(root / "checkpoint", "qwen3", seed=0)))
    source = plugd_server_factory()
    name = f"{registry.address}/test/tiny:v1"
    source.cli("create", name, "-f", str(root / "Modelfile"), check=True)
    source.cli("push", name, check=True)
    return name


@pytest.fixture(scope="module")
def target(plugd_server_factory):
    return plugd_server_factory()


def test_run_pulls_a_missing_model_then_answers(pushed, target):
    result = target.cli("run", pushed, "Hello")
    assert result.returncode == 0, result.stderr + target.log()
    progress = result.stderr.splitlines()
    assert progress[0] == "pulling manifest" and progress[-1] == "success"
    assert sum(f"100% ▕{'█' * 25}▏" in line for line in progress) >= 3  # config, weights, tokenizer, ...: one bar each
    expected = ollama.Client(host=target.url).chat(model=pushed, messages=[{"role": "user", "content": "Hello"}])
    assert expected.eval_count == 4
    assert result.stdout == expected.message.content + "\n"

    again = target.cli("run", pushed, "Hello")  # now in the store: nothing is pulled
    assert (again.returncode, again.stderr, again.stdout) == (0, "", result.stdout)


def test_a_failed_pull_is_reported_and_nothing_runs(registry, target):
    missing = f"{registry.address}/test/nothing"
    result = target.cli("run", missing, "Hello")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == f"Error: unknown model 'test/nothing' on registry {registry.address}"
    assert result.stdout == ""
    assert missing not in target.cli("list").stdout
