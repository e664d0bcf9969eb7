"""`plugd run MODEL [PROMPT]`: one-shot or interactive chat, streamed as it generates."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from plugd.client import DaemonClient

HELP = """Available commands:
  /bye            Exit
  /clear          Forget the conversation so far
  /?, /help       This help
Use \"\"\" to begin and end a multi-line message."""


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


def chat_once(client: DaemonClient, model: str, messages: list[dict[str, Any]], verbose: bool, out: TextIO) -> str:
    """Stream one assistant reply to `out`; returns its text."""
    reply = []
    thinking = False
    for chunk in client.stream("/api/chat", {"model": model, "messages": messages, "stream": True}):
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


def run(model: str, prompt: str | None, verbose: bool) -> None:
    client = DaemonClient()
    client.json("POST", "/api/generate", {"model": model})  # load now, so errors come before the prompt
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is not None:
        chat_once(client, model, [{"role": "user", "content": prompt}], verbose, sys.stdout)
        return
    history: list[dict[str, Any]] = []
    while (text := _read_message()) is not None:
        command = text.strip()
        if command == "/bye":
            return
        if command in ("/?", "/help"):
            print(HELP)
            continue
        if command == "/clear":
            history.clear()
            print("Cleared session context")
            continue
        if not command:
            continue
        history.append({"role": "user", "content": text})
        history.append({"role": "assistant", "content": chat_once(client, model, history, verbose, sys.stdout)})
        print()
