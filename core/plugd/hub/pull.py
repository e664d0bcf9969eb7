"""`plugd pull hf.co/ORG/REPO[:REVISION]`: the revision resolved to a commit, the repository's file list checked
before anything is downloaded, the files plugd needs fetched into the user's Hugging Face cache (or found there),
made blobs without a second copy, and the model created from them exactly as `plugd create` would, the source
and commit recorded in its config.

Nothing is half-created: the manifest is written last, by `create_model`, and blobs left unreferenced by a failed
pull are pruned as any others.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, constants
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.hf_api import RepoFile

from plugd import __version__
from plugd.hub.download import download
from plugd.hub.errors import hub_errors
from plugd.hub.files import INDEX, HubFile, model_files, weights_to_fetch
from plugd.hub.follow import Follower
from plugd.hub.importing import import_cached
from plugd.hub.reference import HubReference
from plugd.plugins import Registry
from plugd.registry.errors import UnsupportedFormat
from plugd.registry.parallel import run_all
from plugd.registry.progress import Emit, Progress
from plugd.store.create import CreateError, CreateRequest, create_model
from plugd.store.model_files import is_weights
from plugd.store.store import Store

FILES_AT_ONCE = 8  # as huggingface_hub's snapshot_download


def pull_from_hub(store: Store, registry: Registry, text: str, *, emit: Emit = lambda _: None,
                  cancel: threading.Event | None = None) -> None:
    ref = HubReference.parse(text)
    cancel = cancel or threading.Event()
    progress = Progress(emit, "pulling")
    progress.status(f"resolving {ref.repo_id} at {ref.revision}")
    with hub_errors(ref):
        api = HfApi(library_name="plugd", library_version=__version__)
        commit = api.model_info(ref.repo_id, revision=ref.revision).sha
        listing = [HubFile(f.path, f.size, f.blob_id, f.lfs.sha256 if f.lfs else None)
                   for f in api.list_repo_tree(ref.repo_id, revision=commit, recursive=True) if isinstance(f, RepoFile)]
        files = model_files(ref.source, listing)
        others = [f for f in files if not is_weights(f.path)]
        digests = _fetch(store, ref, commit, others, progress, cancel)
        index = _index(store, ref, digests)
        digests |= _fetch(store, ref, commit, weights_to_fetch(ref.source, files, index), progress, cancel)
    origin = {"source": ref.source, "revision": ref.revision, "commit": commit, "endpoint": constants.ENDPOINT}
    try:
        create_model(store, registry, CreateRequest(model=str(ref.name), files=digests), progress.status, origin=origin)
    except CreateError as exc:
        raise UnsupportedFormat(f"{ref.source} cannot be made into a model: {exc}") from None
    progress.status("success")


def _fetch(store: Store, ref: HubReference, commit: str, files: list[HubFile], progress: Progress,
           cancel: threading.Event) -> dict[str, str]:
    """Download `files` side by side, each made a blob as soon as it is in; returns their digests by path."""
    digests: dict[str, str] = {}

    blobs_dir = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo_id, repo_type="model") / "blobs"

    def fetch(file: HubFile) -> None:
        with ExitStack() as stack:
            follower = stack.enter_context(Follower(blobs_dir, file.sha256)) if file.sha256 else None
            path = download(ref.repo_id, commit, file, progress, cancel)
            digests[file.path] = import_cached(store.blobs, path, file, follower)

    run_all([lambda file=file: fetch(file) for file in files], FILES_AT_ONCE, cancel, "plugd-hub")
    return digests


def _index(store: Store, ref: HubReference, digests: dict[str, str]) -> dict[str, Any] | None:
    if INDEX not in digests:
        return None
    try:
        return store.json_blob(digests[INDEX], INDEX)
    except ValueError as exc:
        raise UnsupportedFormat(f"{ref.source}: {exc}") from None
