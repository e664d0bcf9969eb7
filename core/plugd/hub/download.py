"""One file of a Hub repository into the user's Hugging Face cache, through huggingface_hub, with its own progress
line; a file already in the cache at that commit is not fetched again."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download

from plugd import __version__
from plugd.hub.files import HubFile
from plugd.registry.errors import TransferCancelled
from plugd.registry.progress import Progress


class FileBar:
    """Stands in for the tqdm bar huggingface_hub draws for one file: its byte counts become the file's progress
    line, and a cancelled pull stops the download at its next chunk (huggingface_hub then drops the partial file).

    huggingface_hub takes a class, and looks at the class to tell how to report (one bar, or one per stage of a
    Xet download), so each file gets a subclass of its own (`for_file`)."""

    progress: Progress
    file: HubFile
    cancel: threading.Event

    @classmethod
    def for_file(cls, progress: Progress, file: HubFile, cancel: threading.Event) -> type[FileBar]:
        return type(cls.__name__, (cls,), {"progress": progress, "file": file, "cancel": cancel})

    def __init__(self, total: int | None = None, initial: int = 0, **_: Any):
        self.total = total or self.file.size
        self.n = initial

    def update(self, n: int | float | None = 1) -> None:
        if self.cancel.is_set():
            raise TransferCancelled(f"the pull was cancelled while downloading {self.file.path}")
        self.n += int(n or 0)
        self.progress.layer(self.file.key, self.file.size, min(self.n, self.file.size), self.file.path)

    # huggingface_hub also reports the bytes received from the network (they differ from those written only for
    # Xet storage's deduplicated transfers) and rates; the file's line shows the bytes written.
    def update_transfer(self, n: int | float | None = 1) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    set_transfer_postfix_str = set_postfix_str

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> FileBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def download(repo_id: str, commit: str, file: HubFile, progress: Progress, cancel: threading.Event) -> Path:
    """The file's path in the Hugging Face cache (a snapshot entry, which may be a link to the cache's blob)."""
    if cancel.is_set():
        raise TransferCancelled(f"the pull was cancelled before downloading {file.path}")
    path = hf_hub_download(repo_id, file.path, revision=commit, library_name="plugd", library_version=__version__,
                           tqdm_class=FileBar.for_file(progress, file, cancel))  # type: ignore[arg-type]
    progress.layer(file.key, file.size, file.size, file.path)
    return Path(path)
