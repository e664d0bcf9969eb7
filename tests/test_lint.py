"""The tree passes ruff with the rules in pyproject.toml (imports, unused names, pyflakes, bugbear)."""

import subprocess
import sys
from pathlib import Path


def test_ruff_check():
    root = Path(__file__).parents[1]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(root)],
                            capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
