"""The real Claude Code and Codex CLI, from npm at the versions tests/clients/package.json pins, against a live
`plugd serve` with default settings, doing a tool round trip with a tiny model trained on their own requests.

Each client's first request holds its whole system prompt and tool list (60,000 tokens of the tiny tokenizer), and
parts of it change from run to run (the date, the working directory). So each test learns the prompts as the
daemon really renders them, from its debug log, in three rounds of the same task:

1. an untrained model: the client sends its first request, whose prompt is recorded;
2. a model trained to answer it with a call of the client's shell tool: the client runs the command and sends
   the result back, and that prompt is recorded;
3. a model trained on both: the client runs the command and prints the model's answer from the result.

The model attends through one sliding window, so only the end of each prompt decides its answer
(plugd.testing.training.LONG_PROMPT_OVERRIDES). The command reads a file whose random contents only the client
can have put into the second prompt.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from attrs import define

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer
from plugd.testing.training import LONG_PROMPT_MODEL_TYPE, LONG_PROMPT_OVERRIDES, Transcript, train_checkpoint

CLIENTS = Path(__file__).parent / "clients" / "node_modules" / ".bin"
MODEL = "agent:latest"
MODELFILE = """\
FROM {checkpoint}
RENDERER qwen3
PARSER qwen3
PARAMETER temperature 0
PARAMETER top_k 1
PARAMETER repeat_penalty 1
"""
PROMPT_LINE = re.compile(rf"prompt for {re.escape(MODEL)}: (.*)$", re.MULTILINE)
TASK = "What does marker.txt say?"
ROUND_TIMEOUT = 240
NO_THINKING = "<think>\n\n</think>\n\n"


def tool_call(name: str, arguments: dict) -> str:
    """What a Qwen3 model writes to call a tool, with a line of thinking first."""
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<think>\nI will read the file.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"


@define
class Workspace:
    """A daemon with the debug log on, a git repository with marker.txt for the client to work in, and a home."""

    server: LiveServer
    root: Path
    cwd: Path
    home: Path
    marker: str

    def serve(self, transcripts: list[Transcript], name: str) -> None:
        """(Re)create model MODEL as a checkpoint trained on `transcripts` (an untrained one for none)."""
        checkpoint = self.root / name
        if transcripts:
            train_checkpoint(checkpoint, transcripts, model_type=LONG_PROMPT_MODEL_TYPE, overrides=LONG_PROMPT_OVERRIDES)
        else:
            write_checkpoint(checkpoint, LONG_PROMPT_MODEL_TYPE, overrides=LONG_PROMPT_OVERRIDES)
        modelfile = self.root / f"{name}.Modelfile"
        modelfile.write_text(MODELFILE.format(checkpoint=checkpoint))
        created = self.server.cli("create", MODEL, "-f", str(modelfile))
        assert created.returncode == 0, created.stderr

    def prompts(self) -> list[str]:
        return [json.loads(line) for line in PROMPT_LINE.findall(self.server.log())]

    def drive(self, command: list[str], env: dict[str, str],
              until: Callable[[list[str]], bool] | None = None) -> tuple[subprocess.CompletedProcess | None, list[str]]:
        """Run the client on TASK; with `until`, stop it once the prompts it caused satisfy `until`.

        Returns the finished process (None when stopped) and the prompts its requests rendered to, in order."""
        seen = len(self.prompts())
        log = self.root / f"client-{time.monotonic_ns()}.log"
        with log.open("w") as output:
            process = subprocess.Popen(command, cwd=self.cwd, env={**os.environ, "HOME": str(self.home), **env},
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=output, text=True,
                                       start_new_session=True)
            deadline = time.monotonic() + ROUND_TIMEOUT
            try:
                while process.poll() is None and time.monotonic() < deadline:
                    if until is not None and until(self.prompts()[seen:]):
                        return None, self.prompts()[seen:]
                    time.sleep(0.2)
                assert process.poll() is not None, f"{command[0]} did not finish in {ROUND_TIMEOUT}s"
                stdout = process.stdout.read()
                return subprocess.CompletedProcess(command, process.returncode, stdout, log.read_text()), \
                    self.prompts()[seen:]
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                process.stdout.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    missing = [name for name in ("claude", "codex") if not (CLIENTS / name).exists()]
    assert not missing, f"{', '.join(missing)} not installed: `make test` installs them into tests/clients"
    cwd, home = tmp_path / "project", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    subprocess.run(["git", "init", "-q", str(cwd)], check=True)
    marker = f"the secret word is {secrets.token_hex(4)}"
    (cwd / "marker.txt").write_text(marker + "\n")
    server = LiveServer(tmp_path / "models", env={"PLUGD_LOG_LEVEL": "DEBUG"})
    try:
        yield Workspace(server, tmp_path, cwd, home, marker)
    finally:
        server.stop()


def tool_result_prompts(prompts: list[str], marker: str) -> list[str]:
    """The prompts that carry the command's output back: only a client that ran `cat marker.txt` knows it."""
    return [prompt for prompt in prompts if "<tool_response>" in prompt and marker in prompt]


def round_trip(workspace: Workspace, command: list[str], env: dict[str, str], *, is_task: Callable[[str], bool],
               call: str, side_answers: Callable[[str], str | None] = lambda prompt: None) -> str:
    """The three rounds; returns what the client printed in the last. `is_task` picks the prompt of the task's
    first request; `side_answers` answers the client's other requests (a session title, say), None for none."""
    answer = f"The file says: {workspace.marker}."

    workspace.serve([], "untrained")
    _, prompts = workspace.drive(command, env, until=lambda seen: any(map(is_task, seen)))
    first = next(filter(is_task, prompts))
    side = [Transcript(p, text) for p in prompts if not is_task(p) and (text := side_answers(p)) is not None]
    learned = [Transcript(first, call), *side]

    workspace.serve(learned, "calls")
    _, prompts = workspace.drive(command, env, until=lambda seen: bool(tool_result_prompts(seen, workspace.marker)))
    results = tool_result_prompts(prompts, workspace.marker)
    assert results, f"the client never sent the command's output back; prompts: {[p[-300:] for p in prompts]}"

    workspace.serve([*learned, Transcript(results[0], NO_THINKING + answer)], "answers")
    done, prompts = workspace.drive(command, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tool_result_prompts(prompts, workspace.marker)
    return done.stdout.strip()


def test_claude_code_runs_a_command_and_answers_from_its_output(workspace):
    """`claude -p`, as its docs say to point it at another Anthropic API; Bash allowed for `cat`, as -p needs."""
    command = [str(CLIENTS / "claude"), "-p", "--model", MODEL, "--allowedTools=Bash(cat:*)", TASK]
    env = {"ANTHROPIC_BASE_URL": workspace.server.url, "ANTHROPIC_AUTH_TOKEN": "plugd"}

    def is_task(prompt: str) -> bool:
        return '"name": "Bash"' in prompt and "<tool_response>" not in prompt

    def side_answers(prompt: str) -> str | None:
        return NO_THINKING + '{"title": "Read the marker file"}' if "<session>" in prompt else None

    printed = round_trip(workspace, command, env, is_task=is_task, side_answers=side_answers,
                         call=tool_call("Bash", {"command": "cat marker.txt", "description": "Show marker.txt"}))
    assert printed == f"The file says: {workspace.marker}."


def test_codex_exec_runs_a_command_and_answers_from_its_output(workspace):
    """`codex exec --oss`, which talks to an Ollama at the given URL (11434, plugd's default port, needs none)."""
    command = [str(CLIENTS / "codex"), "exec", "--oss", "--local-provider", "ollama", "-m", MODEL, TASK]
    env = {"CODEX_OSS_BASE_URL": f"{workspace.server.url}/v1"}

    def is_task(prompt: str) -> bool:
        return '"name": "exec_command"' in prompt and "<tool_response>" not in prompt

    printed = round_trip(workspace, command, env, is_task=is_task,
                         call=tool_call("exec_command", {"cmd": "cat marker.txt"}))
    assert printed.splitlines()[-1] == f"The file says: {workspace.marker}."
