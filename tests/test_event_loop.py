"""A chat template that loops for ever holds neither the daemon nor the model: it renders in a worker thread, every
other endpoint answers meanwhile, and the render ends at its time limit with a 400 naming the model's template."""

import concurrent.futures

import httpx
import pytest

from plugd.builtins.jinja_renderer import RENDER_SECONDS

NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def server(plugd_server_factory, tiny_checkpoint, tmp_path_factory):
    server = plugd_server_factory()
    folder = tmp_path_factory.mktemp("modelfiles")
    checkpoint = tiny_checkpoint("qwen3")
    for name, extra in [("slow", f'TEMPLATE """{NESTED_LOOPS}"""\n'), ("fine", "")]:
        (folder / name).write_text(f"FROM {checkpoint}\nRENDERER jinja\n{extra}PARAMETER num_predict 1\n")
        assert server.cli("create", name, "-f", str(folder / name)).returncode == 0
    return server


def chat(server, model, path="/api/chat"):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    return httpx.post(server.url + path, json=body, timeout=60)


def test_a_template_that_never_ends_is_stopped_while_the_daemon_answers(server):
    with concurrent.futures.ThreadPoolExecutor() as pool:
        slow = [pool.submit(chat, server, "slow") for _ in range(3)]  # more than one worker's worth
        answered_meanwhile = []
        while not all(future.done() for future in slow):
            answered_meanwhile.append(httpx.get(server.url + "/api/version", timeout=5).status_code)
            if len(answered_meanwhile) == 3:
                assert chat(server, "fine").status_code == 200  # another model's chat goes through too
        assert answered_meanwhile.count(200) == len(answered_meanwhile) >= 3
        for future in slow:
            response = future.result()
            assert response.status_code == 400
            assert response.json()["error"] == (
                f"model 'slow:latest': the chat template ran for more than {RENDER_SECONDS:g} s and was stopped")


@pytest.mark.parametrize("template, error", [
    ("{{ 'x' * 10**10 }}", "the chat template builds a value too large to render"),
    ("{% for i in range(10**9) %}{% endfor %}", "Range too big"),
    ("{{ 1 / 0 }}", "division by zero"),
])
def test_templates_that_fail_as_they_render_are_400s(server, tmp_path, template, error):
    (tmp_path / "Modelfile").write_text(f'FROM slow\nTEMPLATE """{template}"""\n')
    assert server.cli("create", "bad", "-f", str(tmp_path / "Modelfile")).returncode == 0
    for path in ("/api/chat", "/v1/chat/completions"):
        response = chat(server, "bad", path)
        assert response.status_code == 400 and error in response.text
