"""Which files of a local model directory `plugd create --from DIR` takes, and why it leaves the others.

A file is taken when its name is a model file's (plugd.store.model_files.is_model_path: at the top, or in a
sentence-transformers module folder) and it is a regular file,
or a symbolic link to one inside the directory, or, for a Hugging Face cache snapshot
(`models--ORG--NAME/snapshots/REVISION/`, whose files are links into the repository's `blobs/` folder), inside
that folder. A link anywhere else is left out whatever its name: it could make /etc/shadow a model layer.
"""

from __future__ import annotations

from pathlib import Path

from attrs import define

from plugd.store.model_files import is_model_path
from plugd.store.sentence_layout import module_folder


@define(frozen=True)
class DirectoryFiles:
    taken: list[Path]
    skipped: list[tuple[str, str]]  # (name, why)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _link_roots(directory: Path) -> list[Path]:
    """Where a link in `directory` may point: the directory itself, and a Hub cache snapshot's blob folder."""
    roots = [directory]
    if directory.parent.name == "snapshots":
        roots.append(directory.parent.parent / "blobs")
    return roots


def model_directory_files(directory: Path) -> DirectoryFiles:
    """The files to take, with sentence-transformers module folders' (`2_Dense/model.safetensors`) among them."""
    directory = directory.resolve()
    roots = _link_roots(directory)
    taken, skipped = [], []
    candidates = [p for p in sorted(directory.iterdir()) if not p.name.startswith(".")]
    for folder in [p for p in candidates if p.is_dir() and not p.is_symlink() and module_folder(p.name)]:
        candidates.remove(folder)
        candidates += [p for p in sorted(folder.iterdir()) if not p.name.startswith(".")]
    for path in candidates:
        name = path.relative_to(directory).as_posix()
        if path.is_dir():
            skipped.append((name, "a folder"))
        elif not is_model_path(name):
            skipped.append((name, "not a model file"))
        elif not path.is_file():
            skipped.append((name, "not a regular file"))
        elif path.is_symlink() and not any(_inside(path.resolve(), root) for root in roots):
            skipped.append((name, f"a link out of the model directory, to {path.resolve()}"))
        else:
            taken.append(path)
    return DirectoryFiles(taken, skipped)
