"""The daemon's settings are read from the environment once, at start, into one object; a value that cannot be
read stops `plugd serve` with a message naming the variable."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from plugd import plugins
from plugd.settings import Settings


def test_a_bare_environment_gives_the_defaults():
    assert Settings.from_environment({}) == Settings()


def test_each_variable_is_read_into_its_setting():
    settings = Settings.from_environment({
        "PLUGD_HOST": ":8080", "PLUGD_MODELS": "/srv/models", "PLUGD_NOPRUNE": "1", "PLUGD_KEEP_ALIVE": "-1",
        "PLUGD_MAX_LOADED_MODELS": "2", "PLUGD_MAX_QUEUE": "7", "PLUGD_CONTEXT_LENGTH": "8192",
        "PLUGD_LOAD_TIMEOUT": "30", "PLUGD_RUNNER_TIMEOUT": "2.5", "PLUGD_LOG_LEVEL": "debug",
        "PLUGD_ORIGINS": "https://a.example, https://b.example", "PLUGD_CACHE_POLICY": "single-slot",
        "PLUGD_CLIENT_RENDERERS": "claude-code", "PLUGD_PLUGINS": "qwen, gemma", "PLUGD_TRACE_PLUGINS": "qwen"})
    assert settings == Settings(
        address=("127.0.0.1", 8080), models=Path("/srv/models"), prune=False, keep_alive="-1", max_loaded_models=2,
        max_queue=7, context_length=8192, load_timeout=30.0, runner_timeout=2.5, log_level="DEBUG",
        origins=("https://a.example", "https://b.example"), cache_policy="single-slot",
        client_renderers=("claude-code",), plugins=("qwen", "gemma"), trace_plugins=("qwen",))
    assert Settings.from_environment({"PLUGD_MAX_LOADED_MODELS": "0"}).max_loaded_models == math.inf
    assert Settings.from_environment({"PLUGD_PLUGINS": ""}).plugins == ()  # none, where unset is all
    assert Settings.from_environment({"PLUGD_TRACE_PLUGINS": "all"}).trace_plugins == (plugins.TRACE_ALL,)
    assert Settings.from_environment({"PLUGD_TRACE_PLUGINS": "0"}).trace_plugins == ()


def test_an_unreadable_value_names_its_variable(tmp_path):
    with pytest.raises(ValueError, match="invalid PLUGD_MAX_QUEUE 'many': expected a whole number"):
        Settings.from_environment({"PLUGD_MAX_QUEUE": "many"})
    done = subprocess.run([sys.executable, "-m", "plugd", "serve"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PLUGD_RUNNER_TIMEOUT": "soon"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "Error: invalid PLUGD_RUNNER_TIMEOUT 'soon': expected a number"
