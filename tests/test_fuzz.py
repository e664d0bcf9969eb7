"""schemathesis against a live daemon with a real model, from the OpenAPI document it serves (request bodies
included): no server error, every response in the shape documented for its dialect. Bounded to 10 cases per
operation (about a minute here, some 1,300 requests); bench/fuzz.py is the longer run."""

from plugd.testing.fuzz import fuzz


def test_fuzzing_every_operation_finds_no_server_error(plugd_server, tiny_qwen3, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {tiny_qwen3}\nPARAMETER num_predict 2\n")
    assert plugd_server.cli("create", "m", "-f", str(tmp_path / "Modelfile")).returncode == 0
    run = fuzz(plugd_server.url, examples=10)
    assert run.returncode == 0, run.output[-6000:]
    assert run.requests > 500 and run.server_errors == 0
    assert "500 Internal Server Error" not in plugd_server.log()
