"""Which connections a registry session may open, checked where the connection is made.

Rules (see README, "Pull and push"):
- The registry host the user named (on any port) is reached wherever its name resolves: the user chose it.
- Any other host a registry sends plugd to (a redirect, an upload location, a token realm) must resolve only to
  public addresses; loopback, private, link-local and other special addresses are refused unless `insecure`.
  Names are resolved, and every address checked, each time a connection is opened, so a redirect chain is
  checked hop by hop and a name cannot resolve to one address when checked and another when connected.
- An https session never follows anything to plain http, `insecure` or not (`check_target`).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpcore
import httpx
from attrs import define

from plugd.registry.errors import RegistryError, UnsafeTarget

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# httpcore asks the socket for 64 KiB at a time, and each read is a trip through h11 in Python; a multi-GiB blob
# is tens of thousands of them. Reading up to this much per call cuts that Python work sixteenfold.
READ_SIZE = 1 << 20
MAX_CONNECTIONS = 16


def is_loopback_host(host: str) -> bool:
    """`localhost`, `*.localhost` or a loopback address literal: hosts that may be reached over plain http."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@define(frozen=True)
class AddressPolicy:
    registry_host: str
    insecure: bool = False

    def check(self, host: str, addresses: list[IPAddress]) -> None:
        if self.insecure or host.lower() == self.registry_host.lower():
            return
        for address in addresses:
            if not _public(address):
                raise UnsafeTarget(
                    f"refused to connect to {host} ({address}): the registry sent plugd to a non-public address; "
                    "use --insecure only if you trust this registry and its network"
                )


def check_target(session: httpx.URL, target: httpx.URL) -> None:
    """Refuse URLs of other schemes, and plain http anywhere in an https session."""
    if target.scheme not in ("http", "https"):
        raise UnsafeTarget(f"refused to follow the registry to {target}: only http and https are allowed")
    if session.scheme == "https" and target.scheme == "http":
        raise UnsafeTarget(
            f"refused to follow the registry from https to plain http ({target}): "
            "an https session never downgrades, not even with --insecure"
        )


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror}") from None
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream):
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max(max_bytes, READ_SIZE), timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, timeout)

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self.inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """Resolves each host itself, checks every address against the policy, and connects to a checked address."""

    def __init__(self, policy: AddressPolicy):
        self.policy = policy
        self.inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        addresses = _resolve(host, port)
        self.policy.check(host, addresses)
        error: Exception | None = None
        for address in addresses:
            try:
                return _Stream(self.inner.connect_tcp(str(address), port, timeout, local_address, socket_options))
            except httpcore.ConnectError as exc:
                error = exc
        raise error or httpcore.ConnectError(f"{host} has no address")

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None):
        raise httpcore.ConnectError("registries are reached over TCP only")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class GuardedTransport(httpx.BaseTransport):
    """An httpx transport over an httpcore connection pool that connects through the guarded backend (httpx's
    own HTTPTransport takes no network backend of the caller's choosing)."""

    def __init__(self, backend: GuardedBackend, ssl_context: ssl.SSLContext):
        self.pool = httpcore.ConnectionPool(
            ssl_context=ssl_context, max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS,
            keepalive_expiry=5.0, network_backend=backend,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        sent = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with as_httpx_errors():
            response = self.pool.handle_request(sent)
        return httpx.Response(response.status, headers=response.headers, stream=_Body(response),
                              extensions=response.extensions)

    def close(self) -> None:
        self.pool.close()


class _Body(httpx.SyncByteStream):
    def __init__(self, response: httpcore.Response):
        self.response = response

    def __iter__(self) -> Iterator[bytes]:
        with as_httpx_errors():
            yield from self.response.iter_stream()

    def close(self) -> None:
        self.response.close()


@contextmanager
def as_httpx_errors() -> Iterator[None]:
    """httpcore's exceptions as httpx's classes of the same names (what callers of an httpx client catch)."""
    try:
        yield
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        for kind in type(exc).__mro__:
            mapped = getattr(httpx, kind.__name__, None)
            if isinstance(mapped, type) and issubclass(mapped, httpx.TransportError):
                raise mapped(str(exc)) from exc
        raise


def ssl_context() -> ssl.SSLContext:
    """Certificates are checked against PLUGD_CA_BUNDLE (a PEM file) when set, else as httpx does by default
    (SSL_CERT_FILE or SSL_CERT_DIR when set, else certifi's bundle)."""
    environ = os.environ
    return _ssl_context(environ.get("PLUGD_CA_BUNDLE"), environ.get("SSL_CERT_FILE"), environ.get("SSL_CERT_DIR"))


@functools.lru_cache(maxsize=4)
def _ssl_context(bundle: str | None, cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """One context per certificate setting (the arguments are the cache key), shared by every transfer: loading a
    bundle takes ~30 ms of CPU, a fifth of a small model's whole pull."""
    try:
        return ssl.create_default_context(cafile=bundle) if bundle else httpx.create_ssl_context()
    except (OSError, ssl.SSLError) as exc:
        raise RegistryError(f"cannot read the CA bundle {bundle or cert_file}: {exc}") from None
