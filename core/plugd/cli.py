"""The `plugd` command. Everything but `serve` and `plugins` talks to the daemon found through PLUGD_HOST."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from plugd import __version__
from plugd.client import DaemonClient, DaemonError
from plugd.settings import Settings, environment_help
from plugd.store.model_dir import model_directory_files
from plugd.store.modelfile import ModelfileError, parse_modelfile
from plugd.store.names import ModelName
from plugd.store.quantize import LEVELS as QUANTIZE_LEVELS
from plugd.store.quantize import QuantizeError, bits_for

INSECURE_HELP = "allow plain http and private addresses (an https session never goes to plain http)"


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _span(seconds: float) -> str | None:
    """"3 hours", "1 minute"; None under a minute."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count > 1 else ''}"
    return None


def human_age(iso: str) -> str:
    span = _span((datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds())
    return f"{span} ago" if span else "Less than a minute ago"


def human_until(iso: str) -> str:
    span = _span((datetime.fromisoformat(iso) - datetime.now(UTC)).total_seconds())
    return f"{span} from now" if span else "Less than a minute from now"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_list(args: argparse.Namespace) -> None:
    models = DaemonClient().json("GET", "/api/tags")["models"]
    rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
    rows += [[m["name"], m["digest"][:12], human_size(m["size"]), human_age(m["modified_at"])] for m in models]
    print(table(rows))
    for m in models:
        if "damaged" in m:
            print(f"{m['name']} is damaged: {m['damaged']}", file=sys.stderr)


SHOW_FIELDS = ("modelfile", "parameters", "template", "system", "license")


def cmd_show(args: argparse.Namespace) -> None:
    show_model(args.model, next((f for f in SHOW_FIELDS if getattr(args, f)), None), args.verbose)


def show_model(model: str, field: str | None = None, verbose: bool = False) -> None:
    """What `plugd show` prints: one of SHOW_FIELDS, or the summary (with the tensors when `verbose`)."""
    info = DaemonClient().json("POST", "/api/show", {"model": model, "verbose": verbose})
    if field is not None:
        print(info.get(field, ""))
        return
    if "damaged" in info:
        print(f"damaged: {info['damaged']}", file=sys.stderr)
    details, model_info = info["details"], info["model_info"]
    family = model_info.get("general.architecture", "")
    sections: list[tuple[str, list[list[str]]]] = [
        ("Model", [
            ["architecture", family],
            ["parameters", details.get("parameter_size", "")],
            ["context length", str(model_info.get(f"{family}.context_length", ""))],
            ["embedding length", str(model_info.get(f"{family}.embedding_length", ""))],
            ["quantization", details.get("quantization_level", "")],
            *([["source", f"{source} at {model_info.get('general.source_commit', '')}"]]
              if (source := model_info.get("general.source")) else []),
        ]),
        ("Capabilities", [[c] for c in info.get("capabilities", [])]),
        ("Parameters", [line.split(None, 1) for line in info.get("parameters", "").splitlines()]),
        ("System", [[line] for line in info.get("system", "").splitlines()]),
        ("License", [[line] for line in info.get("license", "").splitlines()[:2]]),
    ]
    if verbose:
        sections.append(("Tensors", [[t["name"], t["type"], str(t["shape"])] for t in info.get("tensors", [])]))
    for title, rows in sections:
        if rows:
            print(f"  {title}")
            print("\n".join("    " + line for line in table(rows).splitlines()))
            print()


def cmd_cp(args: argparse.Namespace) -> None:
    DaemonClient().json("POST", "/api/copy", {"source": args.source, "destination": args.destination})
    print(f"copied '{args.source}' to '{args.destination}'")


def cmd_verify(args: argparse.Namespace) -> None:
    body = {"model": args.model} if args.model else {}
    damaged = False
    for model in DaemonClient().json("POST", "/api/verify", body)["models"]:
        damaged |= model["damaged"] is not None
        print(f"{model['name']}: {'damaged: ' + model['damaged'] if model['damaged'] else 'ok'}")
    if damaged:
        sys.exit(1)


def cmd_rm(args: argparse.Namespace) -> None:
    client = DaemonClient()
    for name in args.models:
        client.json("DELETE", "/api/delete", {"model": name})
        print(f"deleted '{name}'")


def upload_model_dir(client: DaemonClient, directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        raise DaemonError(f"{directory} is not a directory; --from takes a Hugging Face model directory")
    found = model_directory_files(directory)
    for name, why in found.skipped:
        print(f"skipping {name}: {why}", file=sys.stderr)
    files = {}
    for path in found.taken:
        name = path.relative_to(directory.resolve()).as_posix()  # `2_Dense/model.safetensors` keeps its folder
        print(f"copying file {name}", file=sys.stderr)
        files[name] = client.upload_blob(path)
    if not files:
        raise DaemonError(f"{directory} holds no model files")
    return files


def _source(client: DaemonClient, given: str, folder: Path, where: str, what: str) -> tuple[str, Any]:
    """(`files`, their blobs) for a model directory, uploaded; (`from`, the name) for a model in the store. `given`
    is a directory (relative to `folder`) when one is there or it is written as a path."""
    directory = folder / Path(given).expanduser()
    if directory.is_dir():
        return "files", upload_model_dir(client, directory)
    if given.startswith(("/", "./", "../", "~")):
        raise DaemonError(f"{where}{what} {given}: no such directory")
    return "from", given


def create_request(args: argparse.Namespace, client: DaemonClient) -> dict[str, Any]:
    request: dict[str, Any] = {"model": args.model, "stream": True}
    if args.capabilities:
        request["capabilities"] = args.capabilities.split(",")
    if args.quantize:
        request["quantize"] = args.quantize
    if args.draft:
        kind, value = _source(client, args.draft, Path.cwd(), "", "--draft")
        request["draft_files" if kind == "files" else "draft"] = value
    if args.from_dir:
        request["files"] = upload_model_dir(client, Path(args.from_dir))
        return request
    path = Path(args.file or "Modelfile")
    try:
        text = path.read_text()
    except OSError as exc:
        raise DaemonError(f"cannot read {path}: {exc.strerror}; give --from DIR or -f Modelfile") from None
    mf = parse_modelfile(text, str(path))
    kind, value = _source(client, mf.from_, path.parent, f"{path}: ", "FROM")
    request[kind] = value
    if mf.draft and not args.draft:
        kind, value = _source(client, mf.draft, path.parent, f"{path}: ", "DRAFT")
        request["draft_files" if kind == "files" else "draft"] = value
    fields = {"system": mf.system, "template": mf.template, "renderer": mf.renderer, "parser": mf.parser}
    request |= {k: v for k, v in fields.items() if v is not None}
    if mf.parameters:
        request["parameters"] = mf.parameters
    if mf.messages:
        request["messages"] = mf.messages
    if mf.license:
        request["license"] = mf.license
    return request


def cmd_create(args: argparse.Namespace) -> None:
    client = DaemonClient()
    for item in client.stream("/api/create", create_request(args, client)):
        print(item.get("status", ""), file=sys.stderr)


def cmd_plugins(args: argparse.Namespace) -> None:
    registry = Settings.from_environment().load_plugins()
    if args.json:
        print(json.dumps([attrs.asdict(p) for p in registry.plugins], indent=2))
        return
    rows = [["NAME", "VERSION", "HOOKS", "STATUS"]]
    for p in registry.plugins:
        hooks = ", ".join(h.removeprefix("plugd_") for h in p.hooks) or "-"
        status = p.status + (f": {p.error}" if p.error else "") + (" (builtin)" if p.builtin else "")
        rows.append([p.name, p.version, hooks, status])
    print(table(rows))


def cmd_ps(args: argparse.Namespace) -> None:
    models = DaemonClient().json("GET", "/api/ps")["models"]
    grouped = any("group" in m for m in models)
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", *(["HOSTS"] if grouped else [])]]
    for m in models:
        until = "Forever" if m["expires_at"].startswith("0001") else human_until(m["expires_at"])
        processor = "100% GPU" if m["size_vram"] else "100% CPU"
        hosts = [", ".join(f"{rank['host']} (rank {rank['rank']})" for rank in m.get("group", [])) or "this one"]
        rows.append([m["name"], m["digest"][:12], human_size(m["size"]), processor, str(m["context_length"]), until,
                     *(hosts if grouped else [])])
    print(table(rows))


def cmd_stop(args: argparse.Namespace) -> None:
    client = DaemonClient()
    name = ModelName.parse(args.model).display()
    loaded = any(m["name"] == name for m in client.json("GET", "/api/ps")["models"])
    client.json("POST", "/api/generate", {"model": args.model, "keep_alive": 0})  # a model not in the store: 404
    if not loaded:  # nothing to do, and nothing wrong: stopping is idempotent
        print(f"model '{name}' is not loaded", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> None:
    from plugd.cli_run import run

    run(args.model, " ".join(args.prompt) if args.prompt else None, args.verbose, args.insecure)


def cmd_transfer(args: argparse.Namespace) -> None:
    from plugd.cli_transfer import transfer

    transfer(args.command, args.model, args.insecure)


def cmd_runner(args: argparse.Namespace) -> None:
    from plugd.runner.server import main

    sys.exit(main(args.model_dir, args.socket, args.config))


def cmd_serve(args: argparse.Namespace) -> None:
    from plugd.server.daemon import serve

    sys.exit(serve())


def quantize_level(text: str) -> str:
    """--quantize's value, refused before any file is uploaded when the daemon would refuse it."""
    try:
        bits_for(text)
    except QuantizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _command(sub: Any, name: str, func: Any, help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand; a flag it does not know is told with its own usage (see parse_arguments)."""
    p = sub.add_parser(name, help=help, **kwargs)
    p.set_defaults(func=func, command_parser=p)
    return p


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="plugd", description="A local LLM daemon with Ollama's API.")
    top.add_argument("--version", action="version", version=f"plugd {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")

    _command(sub, "serve", cmd_serve, "start the daemon", formatter_class=argparse.RawDescriptionHelpFormatter,
             epilog=environment_help(min(100, shutil.get_terminal_size().columns - 2)))
    _command(sub, "list", cmd_list, "list models", aliases=["ls"])

    p = _command(sub, "show", cmd_show, "show a model's details")
    p.add_argument("model")
    for flag in SHOW_FIELDS:
        p.add_argument(f"--{flag}", action="store_true", help=f"print only the {flag}")
    p.add_argument("-v", "--verbose", action="store_true", help="include tensors")

    p = _command(sub, "cp", cmd_cp, "copy a model")
    p.add_argument("source")
    p.add_argument("destination")

    p = _command(sub, "verify", cmd_verify, "hash every blob of a model (of all without one) against its digest")
    p.add_argument("model", nargs="?")

    p = _command(sub, "rm", cmd_rm, "remove models")
    p.add_argument("models", nargs="+")

    p = _command(sub, "create", cmd_create, "create a model from a Hugging Face directory or a Modelfile")
    p.add_argument("model")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--from", dest="from_dir", metavar="DIR", help="a Hugging Face safetensors model directory")
    source.add_argument("-f", "--file", metavar="MODELFILE", help="a Modelfile (default: ./Modelfile)")
    p.add_argument("--capabilities", help="comma-separated, overriding the inferred ones")
    p.add_argument("--draft", metavar="MODEL_OR_DIR",
                   help="a draft model for speculative decoding, sharing the model's vocabulary: a model or a directory")
    p.add_argument("-q", "--quantize", metavar="LEVEL", type=quantize_level,
                   help=f"quantize a float model: {' or '.join(QUANTIZE_LEVELS)} (MLX affine)")

    p = _command(sub, "run", cmd_run, "chat with a model, or answer one prompt; a model not here is pulled first")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("prompt", metavar="PROMPT", nargs="*",
                   help="answer this prompt and exit; without one (and nothing piped in), chat until /bye")
    p.add_argument("--verbose", action="store_true", help="print timings after each reply")
    p.add_argument("--insecure", action="store_true", help=f"when pulling: {INSECURE_HELP}")

    for verb, text in (("pull", "download a model from a registry"), ("push", "upload a model to a registry")):
        p = _command(sub, verb, cmd_transfer, text)
        p.add_argument("model", help="[host[:port]/]namespace/model[:tag]; registry.ollama.ai/library by default")
        p.add_argument("--insecure", action="store_true", help=INSECURE_HELP)

    _command(sub, "ps", cmd_ps, "list loaded models")
    p = _command(sub, "stop", cmd_stop, "unload a model")
    p.add_argument("model")

    p = _command(sub, "plugins", cmd_plugins, "list installed plugins")
    p.add_argument("--json", action="store_true")
    return top


def runner_parser() -> argparse.ArgumentParser:
    """`plugd runner`, which the daemon spawns, one per loaded model: not for users, so not among the commands."""
    p = argparse.ArgumentParser(prog="plugd runner")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("--config", required=True, help="the RunnerConfig, as JSON (plugd.protocol)")
    p.set_defaults(func=cmd_runner)
    return p


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["runner"]:
        return runner_parser().parse_args(argv[1:])
    top = parser()
    args, unknown = top.parse_known_args(argv)
    if unknown:  # argparse would report these with the top-level usage, not the subcommand's
        getattr(args, "command_parser", top).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        top.print_help()
        sys.exit(0)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    try:
        args.func(args)
        sys.stdout.flush()  # a reader gone by now is reported here, not in the interpreter's last flush
    except BrokenPipeError:
        # The reader went away (`plugd plugins --json | head -1`). As the Python docs advise: point stdout at
        # devnull so that the final flush cannot fail again, and exit 1 without a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (DaemonError, ModelfileError, ValueError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        sys.exit(130)
