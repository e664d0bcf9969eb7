"""Registries for tests and benchmarks, all on loopback: the real `docker-registry` (Debian's package of the
CNCF distribution registry), a token server it trusts, a self-signed certificate made with the `openssl` CLI,
and `Front`, a proxy in front of a registry that can redirect, cut connections, corrupt blobs, and records
what it was asked.
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx

from plugd import plugins
from plugd.store.create import CreateRequest, create_model
from plugd.store.names import ModelName
from plugd.store.store import Store
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import free_port

TOKEN_SERVICE = "plugd-test-registry"
TOKEN_ISSUER = "plugd-test-issuer"
COPY_SIZE = 1 << 20


def registry_binary() -> str | None:
    return shutil.which("docker-registry") or shutil.which("registry")


class Certificate:
    """A self-signed certificate (also its own CA) for localhost, 127.0.0.1 and 127.0.0.2, made with openssl."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = directory / "cert.pem", directory / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
             "-subj", "/CN=plugd test registry", "-keyout", str(self.key), "-out", str(self.cert),
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:127.0.0.2",
             "-addext", "basicConstraints=critical,CA:TRUE"],
            check=True, capture_output=True,
        )
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"], check=True,
                             capture_output=True).stdout
        self.der_b64 = base64.b64encode(der).decode()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def sign_rs256(self, data: bytes) -> bytes:
        return subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=data, check=True,
                              capture_output=True).stdout


def store_with_model(root: Path, name: ModelName | str, checkpoint: Path | None = None) -> Store:
    """A store at `root` holding one model: `checkpoint`, or a tiny random qwen3 written beside the store."""
    checkpoint = checkpoint or write_checkpoint(root.with_name(root.name + "-checkpoint"), "qwen3", seed=0)
    store = Store(root)
    files = {p.name: store.blobs.import_file(p) for p in sorted(checkpoint.iterdir())}
    create_model(store, plugins.load(), CreateRequest(model=str(name), files=files), lambda _: None)
    return store


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # clients that hang up (on purpose, in these tests) are not errors


class _Served:
    """A ThreadingHTTPServer on loopback, run on a thread; `url` is its address; stops on `close`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1", tls: ssl.SSLContext | None = None):
        self.tls = tls
        self.server = _QuietServer((host, 0), handler)
        self.server.owner = self  # type: ignore[attr-defined]
        self.url = f"{'https' if tls else 'http'}://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return self.url.split("://", 1)[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        tls = self.server.owner.tls  # type: ignore[attr-defined]
        if tls is not None:
            self.request = tls.wrap_socket(self.request, server_side=True)
        super().setup()

    def log_message(self, format: str, *args) -> None:
        pass

    def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class TokenServer(_Served):
    """Issues a signed token (RS256, certificate in `x5c`) granting whatever scopes are asked; records the asks
    and the Authorization headers they came with. With `users` (name -> password) it answers only requests with
    one of their Basic credentials, others get 401."""

    def __init__(self, certificate: Certificate, users: dict[str, str] | None = None):
        self.certificate = certificate
        self.users = users
        self.requests: list[dict[str, list[str]]] = []
        self.authorizations: list[str | None] = []
        super().__init__(_TokenHandler)

    def admits(self, authorization: str | None) -> bool:
        if self.users is None:
            return True
        scheme, _, encoded = (authorization or "").partition(" ")
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except ValueError:
            return False
        return scheme == "Basic" and self.users.get(user) == password

    def token(self, scopes: list[str]) -> str:
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.certificate.der_b64]}
        now = int(time.time())
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        claims = {"iss": TOKEN_ISSUER, "sub": "", "aud": TOKEN_SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        return f"{signing_input}.{_b64url(self.certificate.sign_rs256(signing_input.encode()))}"


class _TokenHandler(_Handler):
    def do_GET(self) -> None:
        owner: TokenServer = self.server.owner  # type: ignore[attr-defined]
        query = parse_qs(urlsplit(self.path).query)
        owner.requests.append(query)
        owner.authorizations.append(self.headers.get("Authorization"))
        if not owner.admits(self.headers.get("Authorization")):
            self.reply(401, b'{"details": "bad credentials"}', {"WWW-Authenticate": 'Basic realm="tokens"'})
            return
        token = owner.token(query.get("scope", []))
        self.reply(200, json.dumps({"token": token, "expires_in": 300}).encode(), {"Content-Type": "application/json"})


class DockerRegistry:
    """`docker-registry serve` on a free loopback port, storing under `root`; with `token`, it demands bearer
    tokens from that server; with `users` (name -> password), Basic credentials (an htpasswd file: needs the
    `bcrypt` package)."""

    def __init__(self, root: Path, token: TokenServer | None = None, users: dict[str, str] | None = None):
        binary = registry_binary()
        if binary is None:
            raise RuntimeError("no docker-registry binary (Debian package docker-registry)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.address = f"127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        config = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
            "http": {"addr": self.address, "relativeurls": True},
        }
        if token is not None:
            config["auth"] = {"token": {"realm": f"{token.url}/token", "service": TOKEN_SERVICE,
                                        "issuer": TOKEN_ISSUER, "rootcertbundle": str(token.certificate.cert)}}
        if users is not None:
            config["auth"] = {"htpasswd": {"realm": "plugd-test", "path": str(_htpasswd(root, users))}}
        (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log_path = root / "registry.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=log,
                                            stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/v2/", timeout=1).status_code in (200, 401):
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        self.close()
        raise RuntimeError(f"docker-registry did not answer within {timeout}s: {self.log_path.read_text()}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> DockerRegistry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _htpasswd(root: Path, users: dict[str, str]) -> Path:
    import bcrypt  # a test dependency only

    path = root / "htpasswd"
    path.write_text("".join(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}\n"
                            for user, password in users.items()))
    return path


# What a Front does with a request instead of passing it on: handle it (return True) or not (False).
Rule = Callable[["_FrontHandler"], bool]


class Front(_Served):
    """A reverse proxy in front of `upstream` (a registry's http URL). Every request is recorded in `log` as
    (method, path, Range header); `rules` may answer a request themselves; `body_filter` may cut or change
    the body of a blob download (it gets the handler, the byte offset and the chunk, returns the chunk to send
    or None to drop the connection)."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None):
        self.upstream = urlsplit(upstream)
        self.rules: list[Rule] = []
        self.body_filter: Callable[[_FrontHandler, int, bytes], bytes | None] | None = None
        self.log: list[tuple[str, str, str | None]] = []
        super().__init__(_FrontHandler, host, tls)

    def blob_gets(self) -> list[tuple[str, str, str | None]]:
        return [entry for entry in self.log if entry[0] == "GET" and "/blobs/sha256:" in entry[1]]


class _FrontHandler(_Handler):
    @property
    def front(self) -> Front:
        return self.server.owner  # type: ignore[attr-defined]

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError, ssl.SSLError):
            self.close_connection = True

    def _any(self) -> None:
        front = self.front
        front.log.append((self.command, self.path, self.headers.get("Range")))
        if any(rule(self) for rule in front.rules):
            return
        self._proxy()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    def _proxy(self) -> None:
        upstream = http.client.HTTPConnection(self.front.upstream.hostname, self.front.upstream.port, timeout=60)
        try:
            length = int(self.headers.get("Content-Length") or 0)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")}
            if self.front.tls is not None:
                headers["X-Forwarded-Proto"] = "https"
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for key, value in [*headers.items(), ("Content-Length", str(length))]:
                upstream.putheader(key, value)
            upstream.endheaders()
            remaining = length
            while remaining:
                chunk = self.rfile.read(min(COPY_SIZE, remaining))
                if not chunk:
                    raise ConnectionError("client went away mid-body")
                upstream.send(chunk)
                remaining -= len(chunk)
            self._relay(upstream.getresponse())
        finally:
            upstream.close()

    def _relay(self, response: http.client.HTTPResponse) -> None:
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("connection", "transfer-encoding", "date", "server"):
                self.send_header(key, value)
        body_length = response.getheader("Content-Length")
        if body_length is None:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command == "HEAD":
            return
        is_blob = self.command == "GET" and "/blobs/sha256:" in self.path
        offset = 0
        while chunk := response.read(COPY_SIZE):
            if is_blob and self.front.body_filter is not None:
                filtered = self.front.body_filter(self, offset, chunk)
                if filtered is None:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                chunk = filtered
            self.wfile.write(chunk)
            offset += len(chunk)


def redirect_blob_downloads(chain: list[str]) -> Rule:
    """A rule for every front of a test: blob GETs go through `chain` (base URLs), one redirect per hop; the hop
    number travels in the query, and a request past the last hop is passed on (proxied or served)."""

    def rule(handler: _FrontHandler) -> bool:
        if handler.command != "GET" or "/blobs/sha256:" not in handler.path:
            return False
        path, _, query = handler.path.partition("?")
        hop = int(parse_qs(query).get("hop", ["0"])[0])
        if hop >= len(chain):
            return False
        handler.reply(307, headers={"Location": f"{chain[hop]}{path}?hop={hop + 1}"})
        return True

    return rule
