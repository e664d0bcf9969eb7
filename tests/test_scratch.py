"""Scratch folders a killed daemon leaves in the temporary directory (runner sockets and logs, partial quantized
output) are removed when the next daemon starts; those of live processes stay."""

import os
import subprocess
import sys

import httpx

from plugd.testing.server import LiveServer


def test_a_restart_removes_what_a_killed_daemon_left(tmp_path, tiny_qwen3):
    scratch = tmp_path / "t"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    first = LiveServer(tmp_path / "models", env=env)
    try:
        (tmp_path / "Modelfile").write_text(f"FROM {tiny_qwen3}\nPARAMETER num_predict 1\n")
        assert first.cli("create", "m", "-f", str(tmp_path / "Modelfile")).returncode == 0
        assert httpx.post(f"{first.url}/api/generate", json={"model": "m", "prompt": "hi", "stream": False},
                          timeout=120).status_code == 200
        left = list(scratch.glob(f"plugd-runner-{first.process.pid}-*"))
        assert len(left) == 1 and (left[0] / "runner.log").exists()
    finally:
        first.kill()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    partial = scratch / f"plugd-quantize-{gone.stdout.strip()}-x1y2"
    (partial / "quantized").mkdir(parents=True)
    live = scratch / f"plugd-runner-{os.getpid()}-abcd"  # this test's own process: alive
    live.mkdir()
    unrelated = scratch / "plugd-notes"
    unrelated.mkdir()

    second = LiveServer(tmp_path / "models", env=env)
    try:
        assert not left[0].exists() and not partial.exists()
        assert live.is_dir() and unrelated.is_dir()
        assert "removed 2 scratch folders of daemons that are gone" in second.log()
    finally:
        second.stop()
