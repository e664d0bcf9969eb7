"""The Makefile's virtual-environment rule, run by make and the shell with a real interpreter; apt-get and sudo
are stand-ins that record what they were asked (a test cannot install system packages), and `id` plays root or
a user."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)


def make_venv(tmp_path: Path, python: str, uid: int = 0) -> tuple[subprocess.CompletedProcess[str], str]:
    """`make VENV/bin/python` as `uid`, apt-get and sudo recorded; the result and what they were asked."""
    tools, asked = tmp_path / "tools", tmp_path / "apt.log"
    tools.mkdir(exist_ok=True)
    script(tools / "id", f"echo {uid}\n")
    script(tools / "apt-get", f'echo "apt-get $*" >> {asked}\n')
    script(tools / "sudo", f'echo "sudo $*" >> {asked}\nexec "$@"\n')
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["make", "-C", str(ROOT), "--no-print-directory", f"VENV={venv}", f"PYTHON={python}", f"{venv}/bin/python"],
        env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "PIP_NO_INDEX": "1"},
        capture_output=True, text=True, timeout=300,
    )
    return result, asked.read_text() if asked.exists() else ""


@pytest.mark.parametrize("uid", [0, 1000])
def test_a_python_without_venv_gets_its_debian_venv_package(tmp_path, uid):
    asked = tmp_path / "apt.log"
    # An interpreter without ensurepip until apt-get has installed something: Debian's, before python3.X-venv.
    script(tmp_path / "python", f'''
        if [ "$2" = "import ensurepip, venv" ] && ! grep -q " install " {asked} 2>/dev/null; then exit 1; fi
        exec {sys.executable} "$@"
    ''')
    result, apt = make_venv(tmp_path, str(tmp_path / "python"), uid)
    assert result.returncode == 0, result.stdout + result.stderr
    package = f"python{sys.version_info.major}.{sys.version_info.minor}-venv"
    assert [line for line in apt.splitlines() if line.startswith("apt-get")] == [
        "apt-get update -qq", f"apt-get install -y -qq {package}"]
    assert ("sudo apt-get install" in apt) == (uid != 0)
    assert (tmp_path / "venv" / "bin" / "python").exists()


def test_a_python_with_venv_installs_nothing(tmp_path):
    result, apt = make_venv(tmp_path, sys.executable)
    assert result.returncode == 0, result.stdout + result.stderr
    assert apt == ""
    assert (tmp_path / "venv" / "bin" / "python").exists()
