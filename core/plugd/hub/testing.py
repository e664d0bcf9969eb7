"""A Hugging Face Hub on loopback, for tests and benchmarks: the HTTP API that huggingface_hub's downloads use
(snapshot_download, hf_hub_download), answered as the Hub answers, headers and error codes included.

    with HubServer(tokens={"hf_granted", "hf_other"}) as hub:
        commit = hub.add("Org/Repo", checkpoint_dir)                  # the repository's branch main
        hub.add("Org/Gated", checkpoint_dir, gated_for={"hf_granted"})
        env = {"HF_ENDPOINT": hub.url}

- GET /api/models/{repo}[/revision/{rev}]: the repository's info: its commit sha, its files
- GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=: the files, with sizes, git blob ids, LFS sha256 and size
- HEAD, GET /{repo}/resolve/{rev}/{path}: a file kept in git is answered directly (ETag: its blob id); a file in
  LFS is a redirect to a second server on another origin, the Hub's CDN, with X-Linked-Etag (its sha256) and
  X-Linked-Size; both carry X-Repo-Commit
- GET {cdn}/cdn/{sha256}: LFS content; Range requests are answered with 206
- GET /api/agent-harnesses: the (empty) list of coding agents huggingface_hub names in its user agent

Errors carry X-Error-Code and X-Error-Message as the Hub's do: RepoNotFound (401 anonymous, 404 with a token),
RevisionNotFound, EntryNotFound, GatedRepo (401 anonymous, 403 for a token without access), and 401 "Invalid
credentials in Authorization header" for a token the server does not know. A gated repository's info and file
list are public, as on the Hub; its files are not. Repository names are case-sensitive. Nothing speaks Xet:
huggingface_hub downloads over plain HTTP.

`cut(path, after)` makes the next download of a file stop after that many bytes (the connection dropped);
`log` records every request.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, unquote, urlsplit

from attrs import define, field

# What a new Hub repository's .gitattributes keeps in LFS, besides any file over 10 MB.
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".model", ".msgpack", ".h5", ".onnx")
LFS_OVER = 10 * 1000 * 1000
TIMESTAMP = "2026-01-01T00:00:00.000Z"
INVALID_TOKEN = "Invalid credentials in Authorization header"


@define(frozen=True)
class HubEntry:
    path: str
    size: int
    blob_id: str  # git's id of the file's blob
    sha256: str | None  # set for files kept in LFS
    source: Path

    @classmethod
    def of(cls, path: str, source: Path) -> HubEntry:
        size = source.stat().st_size
        git, sha256 = hashlib.sha1(b"blob %d\0" % size), hashlib.sha256()
        with source.open("rb") as f:
            while chunk := f.read(1 << 20):
                git.update(chunk)
                sha256.update(chunk)
        in_lfs = PurePosixPath(path).suffix in LFS_SUFFIXES or size > LFS_OVER
        return cls(path, size, git.hexdigest(), sha256.hexdigest() if in_lfs else None, source)

    def tree_json(self) -> dict:
        entry = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.path}
        if self.sha256:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry


@define
class HubRepo:
    branches: dict[str, str] = field(factory=dict)  # name -> commit
    commits: dict[str, dict[str, HubEntry]] = field(factory=dict)
    gated_for: set[str] | None = None  # tokens granted access; None: not gated

    def commit_of(self, revision: str) -> str | None:
        return self.branches.get(revision) or (revision if revision in self.commits else None)


@define(frozen=True)
class HubRequest:
    method: str
    path: str
    file: str | None  # the repository file it serves, for resolve and CDN requests
    range: str | None
    token: str | None
    status: int


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.commit = status, message, code, commit


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: HubServer, cdn: bool):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub, self.cdn = hub, cdn
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def handle_error(self, request, client_address) -> None:
        pass  # clients that hang up, and connections cut on purpose, are not errors


class HubServer:
    def __init__(self, tokens: Iterable[str] = ()):
        self.tokens = set(tokens)
        self.repos: dict[str, HubRepo] = {}
        self.blobs: dict[str, HubEntry] = {}  # what the CDN serves, by sha256
        self.cuts: dict[str, int] = {}
        self.log: list[HubRequest] = []
        self.lock = threading.Lock()
        self._api, self._cdn = _Server(self, cdn=False), _Server(self, cdn=True)
        self.url, self.cdn_url = self._api.url, self._cdn.url

    def add(self, repo_id: str, directory: Path, revision: str = "main", gated_for: Iterable[str] | None = None) -> str:
        """Commit the files under `directory` to `revision` (a branch) of `repo_id`; returns the commit sha."""
        entries = {}
        for source in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
            path = source.relative_to(directory).as_posix()
            entries[path] = HubEntry.of(path, source)
        commit = hashlib.sha1(json.dumps([repo_id, revision, [e.tree_json() for e in entries.values()]]).encode())
        with self.lock:
            repo = self.repos.setdefault(repo_id, HubRepo())
            repo.branches[revision] = commit.hexdigest()
            repo.commits[commit.hexdigest()] = entries
            repo.gated_for = None if gated_for is None else set(gated_for)
            self.blobs |= {e.sha256: e for e in entries.values() if e.sha256}
        return commit.hexdigest()

    def cut(self, path: str, after: int) -> None:
        """The next download of the file at `path` (in any repository) stops after `after` bytes."""
        with self.lock:
            self.cuts[path] = after

    def downloads(self) -> list[HubRequest]:
        """The requests that fetched a file's content."""
        return [r for r in self.log if r.method == "GET" and r.file is not None]

    def close(self) -> None:
        for server in (self._api, self._cdn):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def answer(self, path: str, query: dict[str, list[str]], token: str | None, cdn: bool):
        """What to send: a file entry, a JSON document, or None for a redirect (to the `Location` in the
        headers), and the headers; a HubError for what the Hub refuses."""
        if token is not None and token not in self.tokens:
            raise HubError(401, INVALID_TOKEN)
        if cdn:
            entry = self.blobs.get(path.removeprefix("/cdn/"))
            if entry is None:
                raise HubError(404, "Not found")
            return entry, {}
        if path == "/api/agent-harnesses":  # what huggingface_hub reads once to tell coding agents in its user agent
            return {"standardEnvVars": [], "harnesses": {}}, {}
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._api_call(parts[2:], query, token)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), token)
        raise HubError(404, "Not found")

    def _repo(self, repo_id: str, token: str | None) -> HubRepo:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise HubError(404 if token else 401, "Repository not found", "RepoNotFound")
        return repo

    def _commit(self, repo: HubRepo, revision: str) -> str:
        commit = repo.commit_of(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def _api_call(self, parts: list[str], query: dict[str, list[str]], token: str | None):
        repo_id, rest = "/".join(parts[:2]), parts[2:]
        repo = self._repo(repo_id, token)
        if not rest or rest[0] == "revision":
            commit = self._commit(repo, rest[1] if len(rest) > 1 else "main")
            return self._info(repo_id, repo, commit), {}
        if rest[0] == "tree" and len(rest) >= 2:
            entries = repo.commits[self._commit(repo, rest[1])]
            return self._tree(entries, "/".join(rest[2:]), query.get("recursive", ["false"])[0].lower() == "true"), {}
        raise HubError(404, "Not found")

    def _info(self, repo_id: str, repo: HubRepo, commit: str) -> dict:
        return {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0], "sha": commit,
                "lastModified": TIMESTAMP, "createdAt": TIMESTAMP, "private": False,
                "gated": "manual" if repo.gated_for is not None else False, "disabled": False, "downloads": 0,
                "likes": 0, "tags": [], "siblings": [{"rfilename": path} for path in repo.commits[commit]]}

    @staticmethod
    def _tree(entries: dict[str, HubEntry], under: str, recursive: bool) -> list[dict]:
        prefix = f"{under}/" if under else ""
        listed, folders = [], {}
        for path, entry in entries.items():
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):].split("/")
            for depth in range(1, len(rest) if recursive else min(2, len(rest))):
                folder = prefix + "/".join(rest[:depth])
                folders[folder] = {"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                                   "path": folder}
            if recursive or len(rest) == 1:
                listed.append(entry.tree_json())
        return list(folders.values()) + listed

    def _resolve(self, repo_id: str, revision: str, path: str, token: str | None):
        repo = self._repo(repo_id, token)
        commit = self._commit(repo, revision)
        if repo.gated_for is not None and token not in repo.gated_for:
            if token is None:
                raise HubError(401, f"Access to model {repo_id} is restricted. You must have access to it and be "
                               "authenticated to access it. Please log in.", "GatedRepo")
            raise HubError(403, f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                           f"Visit https://huggingface.co/{repo_id} to ask for access.", "GatedRepo")
        entry = repo.commits[commit].get(path)
        if entry is None:
            raise HubError(404, "Entry not found", "EntryNotFound", commit)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry.blob_id}"'}
        if entry.sha256 is None:
            return entry, headers
        headers |= {"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size),
                    "Location": f"{self.cdn_url}/cdn/{entry.sha256}"}
        return None, headers

    def take_cut(self, path: str) -> int | None:
        with self.lock:
            return self.cuts.pop(path, None)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        hub, url = self.server.hub, urlsplit(self.path)
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        try:
            result, headers = hub.answer(url.path, parse_qs(url.query), token, self.server.cdn)
        except HubError as error:
            self._record(url.path, None, token, error.status)
            headers = {"X-Error-Message": error.message, "Content-Type": "application/json"}
            if error.code:
                headers["X-Error-Code"] = error.code
            if error.commit:
                headers["X-Repo-Commit"] = error.commit
            return self._send(error.status, headers, json.dumps({"error": error.message}).encode(), body)
        if isinstance(result, HubEntry):
            return self._send_file(result, headers, body, token)
        self._record(url.path, None, token, 302 if result is None else 200)
        if result is None:
            return self._send(302, headers, b"", body)
        self._send(200, headers | {"Content-Type": "application/json"}, json.dumps(result).encode(), body)

    def _record(self, path: str, file: str | None, token: str | None, status: int) -> None:
        with self.server.hub.lock:
            self.server.hub.log.append(HubRequest(self.command, path, file, self.headers.get("Range"), token, status))

    def _send(self, status: int, headers: dict[str, str], data: bytes, body: bool) -> None:
        self.send_response(status)
        for name, value in (headers | {"Content-Length": str(len(data))}).items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _send_file(self, entry: HubEntry, headers: dict[str, str], body: bool, token: str | None) -> None:
        start, status = 0, 200
        if (wanted := self.headers.get("Range")) and wanted.startswith("bytes=") and wanted.endswith("-"):
            start, status = min(int(wanted[6:-1]), entry.size), 206
            headers = headers | {"Content-Range": f"bytes {start}-{entry.size - 1}/{entry.size}"}
        self._record(urlsplit(self.path).path, entry.path, token, status)
        self.send_response(status)
        for name, value in (headers | {"Content-Length": str(entry.size - start), "Accept-Ranges": "bytes",
                                       "Content-Type": "application/octet-stream"}).items():
            self.send_header(name, value)
        self.end_headers()
        if not body:
            return
        cut = self.server.hub.take_cut(entry.path)
        with entry.source.open("rb") as f:
            self.connection.sendfile(f, start, entry.size - start if cut is None else max(0, cut - start))
        if cut is not None:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
