"""The repository stands alone: a user's clone has nothing beside it, so no tracked file may read or link outside it."""

import re
import subprocess
from pathlib import Path

from plugd.testing.gemma_checkpoints import GEMMA3_CHAT_TEMPLATE

ROOT = Path(__file__).resolve().parents[1]
# The folder of reading material beside the developers' checkout, spelt as code or prose would name it.
OUTSIDE = re.compile(r"\.\./shared\b|[\"']shared[\"']\s*/\s*[\"']reference[\"']|parents\[\d\]\s*/\s*[\"']\.\./")
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


def text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return None


def test_no_tracked_file_refers_outside_the_repository():
    this_file = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in tracked_files() if path != this_file and (content := text(path)) is not None
        for number, line in enumerate(content.splitlines(), 1) if OUTSIDE.search(line)
    ]
    assert not offenders, "\n".join(offenders)


def test_markdown_links_stay_inside_the_repository_and_resolve():
    problems = []
    for path in tracked_files():
        if path.suffix != ".md" or (content := text(path)) is None:
            continue
        for target in MARKDOWN_LINK.findall(content):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT):
                problems.append(f"{path.relative_to(ROOT)} links outside the repository: {target}")
            elif not resolved.exists():
                problems.append(f"{path.relative_to(ROOT)} links to a missing file: {target}")
    assert not problems, "\n".join(problems)


def test_the_testing_kit_ships_the_reference_gemma3_template_byte_for_byte():
    assert GEMMA3_CHAT_TEMPLATE.read_bytes() == (ROOT / "tests/reference/chat_templates/gemma3.jinja").read_bytes()
