"""The model store, laid out like Ollama's: manifests by name, content-addressed blobs, per-blob metadata."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attrs import define

from plugd.errors import PlugdError
from plugd.store.blobs import BlobStore, write_atomically
from plugd.store.manifests import MalformedManifest, Manifest
from plugd.store.names import ModelName
from plugd.store.partial import pull_record, pulled_digests, remove_stale

log = logging.getLogger(__name__)

# How long an unreferenced blob is kept: between `plugd create`'s uploads and its create, a restart can come.
PRUNE_GRACE_SECONDS = 3600


class ModelNotFound(PlugdError, LookupError):
    status = 404

    def __init__(self, name: ModelName | str):
        super().__init__(f"model '{name}' not found")


class CorruptModel(PlugdError, RuntimeError):
    """A manifest or config in the store cannot be read; the message says which file and why."""


@define(frozen=True)
class StoredModel:
    name: ModelName
    manifest: Manifest
    modified_at: datetime


def default_root() -> Path:
    return Path(os.environ.get("PLUGD_MODELS") or Path.home() / ".plugd" / "models")


class Store:
    def __init__(self, root: Path | None = None):
        self.root = Path(root or default_root())
        self.blobs = BlobStore(self.root / "blobs")
        self.manifests_dir = self.root / "manifests"
        self.metadata_dir = self.root / "metadata"
        self.manifests_dir.mkdir(parents=True, exist_ok=True)
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        # Serialises manifest writes, deletes and pruning against each other.
        self.lock = threading.Lock()

    def manifest_path(self, name: ModelName) -> Path:
        return self.manifests_dir.joinpath(*name.parts)

    def get(self, name: ModelName) -> StoredModel:
        path = self.manifest_path(name)
        try:
            raw = path.read_bytes()
            mtime = path.stat().st_mtime
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ModelNotFound(name) from None
        try:
            manifest = Manifest.from_bytes(raw)
        except MalformedManifest as exc:
            raise CorruptModel(f"manifest of '{name}' ({path}) is malformed: {exc}") from None
        return StoredModel(name, manifest, datetime.fromtimestamp(mtime, UTC))

    def json_blob(self, digest: str, what: str) -> dict[str, Any]:
        """The JSON object in a blob; ValueError naming `what` when it is missing or not a JSON object."""
        try:
            data = json.loads(self.blobs.path(digest).read_bytes())
        except FileNotFoundError:
            raise ValueError(f"{what} is missing") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{what} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{what} is not a JSON object")
        return data

    def config(self, model: StoredModel) -> dict[str, Any]:
        digest = model.manifest.config.digest
        try:
            return self.json_blob(digest, f"config blob {digest} of '{model.name}'")
        except ValueError as exc:
            raise CorruptModel(str(exc)) from None

    def text_blob(self, digest: str) -> str:
        return self.blobs.path(digest).read_text()

    def _manifest_files(self) -> Iterator[tuple[Path, tuple[str, ...]]]:
        for path in self.manifests_dir.rglob("*"):
            parts = path.relative_to(self.manifests_dir).parts
            if path.is_file() and len(parts) == 4 and not path.name.startswith("."):
                yield path, parts

    def list(self) -> list[StoredModel]:
        """Every readable model; unreadable manifests are logged and left out."""
        models = []
        for _, parts in self._manifest_files():
            try:
                models.append(self.get(ModelName(*parts)))
            except CorruptModel as exc:
                log.warning("skipping %s", exc)
        return sorted(models, key=lambda m: m.modified_at, reverse=True)

    def put(self, name: ModelName, manifest: Manifest) -> None:
        """Point `name` at `manifest`; every blob it names must already be in the store."""
        with self.lock:
            missing = [d for d in sorted(manifest.digests()) if not self.blobs.exists(d)]
            if missing:
                raise FileNotFoundError(f"blob {missing[0]} is not in the store")
            path = self.manifest_path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, manifest.to_bytes())

    def copy(self, source: ModelName, destination: ModelName) -> None:
        self.put(destination, self.get(source).manifest)

    def delete(self, name: ModelName) -> None:
        """Remove the name, then the blobs no other manifest refers to."""
        with self.lock:
            model = self.get(name)
            self.manifest_path(name).unlink()
            self._remove_empty_dirs(self.manifest_path(name).parent)
            if (still_used := self._referenced()) is not None:
                for digest in model.manifest.digests() - still_used:
                    self._remove_blob(digest)

    @contextmanager
    def pulling(self, manifest: Manifest) -> Iterator[None]:
        """Keep the blobs of `manifest` from `delete` and `prune` while a pull fetches them, and after it fails
        long enough for the next pull to resume (`plugd.store.partial`); `put` the manifest inside the block."""
        with ExitStack() as stack:
            with self.lock:
                stack.enter_context(pull_record(self.blobs, manifest.to_bytes()))
            yield

    def prune(self) -> None:
        """Remove blobs no manifest or pull refers to (once older than PRUNE_GRACE_SECONDS: `plugd create` uploads
        its files, then creates), leftovers of interrupted writes, and what pulls interrupted over
        `partial.STALE_AFTER` ago left behind."""
        with self.lock:
            self.blobs.remove_partials()
            remove_stale(self.blobs)
            still_used = self._referenced()
            if still_used is None:
                log.warning("not pruning blobs: some manifests are unreadable")
                return
            settled = time.time() - PRUNE_GRACE_SECONDS
            for digest in self.blobs.digests() - still_used:
                if self.blobs.path(digest).stat().st_mtime > settled:
                    continue  # uploaded for a create that is still to come
                log.info("pruning unreferenced blob %s", digest)
                self._remove_blob(digest)

    def _referenced(self) -> set[str] | None:
        """Digests named by any manifest or pull; None when a manifest cannot be read (nothing is safe to remove)."""
        used = pulled_digests(self.blobs)
        for path, _ in self._manifest_files():
            try:
                used |= Manifest.from_bytes(path.read_bytes()).digests()
            except MalformedManifest:
                return None
        return used

    def _remove_blob(self, digest: str) -> None:
        self.blobs.remove(digest)
        self.metadata_path(digest).unlink(missing_ok=True)
        self.stat_record_path(digest).unlink(missing_ok=True)

    def _remove_empty_dirs(self, directory: Path) -> None:
        while directory != self.manifests_dir and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
            directory = directory.parent

    def metadata_path(self, digest: str) -> Path:
        return self.metadata_dir / (self.blobs.path(digest).name + ".json")

    def stat_record_path(self, digest: str) -> Path:
        """The size and mtime the blob had when last found sound (plugd.store.integrity)."""
        return self.metadata_dir / (self.blobs.path(digest).name + ".stat")
