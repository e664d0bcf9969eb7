"""`plugd run MODEL [PROMPT]`: one-shot or interactive chat, streamed as it generates."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from plugd.cli import SHOW_FIELDS, show_model
from plugd.cli_transfer import transfer
from plugd.client import DaemonClient, DaemonError
from plugd.store.modelfile import parameter_value
from plugd.types import OPTION_TYPES

HELP = """Available commands:
  /set parameter NAME VALUE   Set a model option for this session (temperature, num_ctx, num_predict...)
  /set system TEXT            Set the system message
  /set think, /set nothink    Ask for thinking, or not
  /set verbose, /set quiet    Show timings after each reply, or not
  /show info                  The model's details
  /show FIELD                 One of: modelfile, parameters, template, system, license
  /clear                      Forget the conversation so far
  /bye                        Exit
  /?, /help                   This help
Use \"\"\" to begin and end a multi-line message. Ctrl+C stops a reply; Ctrl+D or /bye leaves."""


def _stats(final: dict[str, Any]) -> str:
    def rate(count: int, ns: int) -> str:
        return f"{count / (ns / 1e9):.2f} tokens/s" if ns else "n/a"

    return "\n".join([
        f"total duration:       {final['total_duration'] / 1e9:.6f}s",
        f"load duration:        {final['load_duration'] / 1e9:.6f}s",
        f"prompt eval count:    {final['prompt_eval_count']} token(s)",
        f"prompt eval duration: {final['prompt_eval_duration'] / 1e9:.6f}s",
        f"prompt eval rate:     {rate(final['prompt_eval_count'], final['prompt_eval_duration'])}",
        f"eval count:           {final['eval_count']} token(s)",
        f"eval duration:        {final['eval_duration'] / 1e9:.6f}s",
        f"eval rate:            {rate(final['eval_count'], final['eval_duration'])}",
    ])


def chat_once(client: DaemonClient, body: dict[str, Any], verbose: bool, out: TextIO) -> str:
    """Stream one assistant reply to `out` for the /api/chat `body`; returns its text."""
    reply = []
    thinking = False
    for chunk in client.stream("/api/chat", body | {"stream": True}):
        message = chunk.get("message", {})
        if message.get("thinking"):
            if not thinking:
                out.write("Thinking...\n")
                thinking = True
            out.write(message["thinking"])
        if message.get("content"):
            if thinking:
                out.write("\n...done thinking.\n\n")
                thinking = False
            out.write(message["content"])
            reply.append(message["content"])
        out.flush()
        if chunk.get("done"):
            out.write("\n")
            if verbose:
                print(_stats(chunk), file=sys.stderr)
    return "".join(reply)


def _prompt(text: str) -> str | None:
    """A line typed at the prompt `text`; None at end of input."""
    sys.stdout.write(text)
    sys.stdout.flush()
    line = sys.stdin.readline()
    return line.rstrip("\n") if line else None


def _read_message() -> str | None:
    """One message: a line, or everything between triple quotes (continuation lines prompted with "... ")."""
    first = _prompt(">>> ")
    if first is None or not first.lstrip().startswith('"""'):
        return first
    body = [first.lstrip()[3:]]
    while not body[-1].rstrip().endswith('"""'):
        line = _prompt("... ")
        if line is None:
            break
        body.append(line)
    body[-1] = body[-1].rstrip().removesuffix('"""')
    return "\n".join(body).strip("\n")


class Session:
    """An interactive chat: the conversation and what /set changed, sent with every message."""

    def __init__(self, client: DaemonClient, model: str, verbose: bool):
        self.client = client
        self.model = model
        self.verbose = verbose
        self.history: list[dict[str, Any]] = []
        self.system: str | None = None
        self.options: dict[str, Any] = {}
        self.think: bool | None = None

    def command(self, text: str) -> bool:
        """Carry out a /command; False for /bye."""
        words = text.split(maxsplit=1)
        name, rest = words[0], words[1] if len(words) > 1 else ""
        if name == "/bye":
            return False
        if name in ("/?", "/help"):
            print(HELP)
        elif name == "/clear":
            self.history.clear()
            print("Cleared session context")
        elif name == "/set":
            self._set(rest)
        elif name == "/show":
            self._show(rest.strip())
        else:
            print(f"Unknown command '{name}'. Type /? for help")
        return True

    def _set(self, text: str) -> None:
        what, _, value = text.partition(" ")
        if what == "parameter" and len(parts := value.split(maxsplit=1)) == 2:
            self._set_parameter(*parts)
        elif what == "system" and value.strip():
            self.system = value.strip()
            print("Set system message.")
        elif what in ("think", "nothink") and not value:
            self.think = what == "think"
            print(f"Set '{what}' mode.")
        elif what in ("verbose", "quiet") and not value:
            self.verbose = what == "verbose"
            print(f"Set '{what}' mode.")
        else:
            print("Usage: /set parameter NAME VALUE | /set system TEXT | /set think | /set nothink | "
                  "/set verbose | /set quiet")

    def _set_parameter(self, name: str, text: str) -> None:
        """Checked as a Modelfile's PARAMETER is; a list parameter (stop) takes the words of `text`, as Ollama's does."""
        try:
            name, value = parameter_value(name, text)
        except ValueError as exc:
            print(f"Couldn't set parameter: {exc}")
            return
        if OPTION_TYPES[name] is list:
            value = text.split()
            text = ", ".join(value)
        self.options[name] = value
        print(f"Set parameter '{name}' to '{text}'")

    def _show(self, field: str) -> None:
        if field != "info" and field not in SHOW_FIELDS:
            print(f"Usage: /show info | /show {' | /show '.join(SHOW_FIELDS)}")
            return
        if field == "system" and self.system is not None:
            print(self.system)  # the session's own, which replaces the model's
            return
        try:
            show_model(self.model, None if field == "info" else field)
        except DaemonError as exc:
            print(f"Error: {exc}", file=sys.stderr)

    def say(self, text: str) -> None:
        """Send a message and stream the reply. A reply stopped with Ctrl+C, or refused, leaves the
        conversation as it was before the message."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages += self.history + [{"role": "user", "content": text}]
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.options:
            body["options"] = self.options
        if self.think is not None:
            body["think"] = self.think
        try:
            reply = chat_once(self.client, body, self.verbose, sys.stdout)
        except KeyboardInterrupt:
            print()
            return
        except DaemonError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        print()


def load(client: DaemonClient, model: str, insecure: bool) -> None:
    """Load `model` now, so that errors come before the prompt; one not in the store is pulled first, as
    `ollama run` does, drawing the progress `plugd pull` draws."""
    try:
        client.json("POST", "/api/generate", {"model": model})
    except DaemonError as exc:
        if exc.status != 404:
            raise
        transfer("pull", model, insecure)
        client.json("POST", "/api/generate", {"model": model})


def run(model: str, prompt: str | None, verbose: bool, insecure: bool) -> None:
    client = DaemonClient()
    load(client, model, insecure)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is not None:
        chat_once(client, {"model": model, "messages": [{"role": "user", "content": prompt}]}, verbose, sys.stdout)
        return
    session = Session(client, model, verbose)
    while True:
        try:
            text = _read_message()
        except KeyboardInterrupt:
            print("\nUse Ctrl + d or /bye to exit.")
            continue
        if text is None:
            print()
            return
        command = text.strip()
        if command.startswith("/"):
            if not session.command(command):
                return
        elif command:
            session.say(text)
