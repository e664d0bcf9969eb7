"""One session with the registry a model name points at: the OCI distribution API over the guarded transport.

Names map to repositories as in Ollama: `model:tag` is `registry.ollama.ai`, repository `library/model`;
`host[:port]/namespace/model:tag` addresses that registry. The session speaks https; plain http only to a
loopback host or with `insecure`, and then only after https failed (as docker does for insecure registries).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import httpx

from plugd.registry.auth import RegistryAuth
from plugd.registry.bulk import BulkTransport
from plugd.registry.errors import RegistryError, RegistryUnreachable, UnknownModel, UnsafeTarget
from plugd.registry.transport import (
    AddressPolicy,
    GuardedBackend,
    GuardedTransport,
    check_target,
    is_loopback_host,
    ssl_context,
)
from plugd.store.manifests import MANIFEST_MEDIA_TYPE, MalformedManifest, Manifest
from plugd.store.names import ModelName

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MAX_REDIRECTS = 10
REDIRECTS = {301, 302, 303, 307, 308}
TIMEOUT = httpx.Timeout(60.0, connect=10.0)

Body = bytes | Callable[[], Iterable[bytes]] | None


class RegistryClient:
    def __init__(self, name: ModelName, *, insecure: bool = False, push: bool = False, extra_scopes: Iterable[str] = ()):
        self.name = name
        self.repository = f"{name.namespace}/{name.model}"
        self.insecure = insecure
        self.hostname = httpx.URL(f"https://{name.host}/").host
        backend, context = GuardedBackend(AddressPolicy(self.hostname, insecure)), ssl_context()
        self.http = httpx.Client(transport=GuardedTransport(backend, context), timeout=TIMEOUT, trust_env=False)
        self.bulk = httpx.Client(transport=BulkTransport(backend, context), timeout=TIMEOUT, trust_env=False)
        scopes = [f"repository:{self.repository}:{'pull,push' if push else 'pull'}", *extra_scopes]
        self.auth = RegistryAuth(name.host, scopes, lambda url, headers: self._follow("GET", url, headers, authorize=False))
        try:
            self.base = self._choose_base()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()
        self.bulk.close()

    def _choose_base(self) -> httpx.URL:
        plain_allowed = self.insecure or is_loopback_host(self.hostname)
        errors = []
        for scheme in ("https", "http") if plain_allowed else ("https",):
            self.base = httpx.URL(f"{scheme}://{self.name.host}/v2/")
            try:
                self._follow("GET", self.base, authorize=False)  # any answer, 401 included, means it speaks this scheme
                return self.base
            except httpx.TransportError as exc:
                errors.append(f"{scheme}: {exc}")
        raise RegistryUnreachable(f"registry {self.name.host} is unreachable ({'; '.join(errors)})")

    # ---- requests ------------------------------------------------------------------------------------------------

    def send(self, method: str, url: httpx.URL | str, *, headers: dict[str, str] | None = None, body: Body = None,
             stream: bool = False, bulk: bool = False) -> httpx.Response:
        """A request with the session's Authorization; answers one challenge (bearer or Basic) and follows redirects,
        checking each hop.
        `bulk` sends it over the transport for large bodies (`plugd.registry.bulk`)."""
        authorization = self.auth.authorization
        response = self._follow(method, url, headers, body, stream, bulk=bulk)
        if response.status_code == 401:
            response.close()
            self.auth.answer(response, authorization)
            response = self._follow(method, url, headers, body, stream, bulk=bulk)
            if response.status_code == 401:
                response.read()
                raise self.auth.refused(self.repository, registry_errors(response) or "unauthorized")
        return response

    def _follow(self, method: str, url: httpx.URL | str, headers: dict[str, str] | None = None, body: Body = None,
                stream: bool = False, authorize: bool = True, bulk: bool = False) -> httpx.Response:
        http = self.bulk if bulk else self.http
        url = httpx.URL(url)
        origin = _origin(url)
        for _ in range(MAX_REDIRECTS + 1):
            check_target(self.base, url)
            sent = dict(headers or {})
            if _origin(url) != origin:  # credentials a caller gave stay with the origin it gave them for
                sent = {key: value for key, value in sent.items() if key.lower() != "authorization"}
            if authorize and _origin(url) == _origin(self.base):  # a token never leaves the registry, e.g. for a CDN
                sent |= self.auth.header()
            request = http.build_request(method, url, headers=sent, content=body() if callable(body) else body)
            response = http.send(request, stream=True)
            if response.status_code not in REDIRECTS or "location" not in response.headers:
                if not stream:
                    response.read()
                return response
            response.close()
            url = url.join(response.headers["location"])
            if response.status_code == 303:
                method, body = "GET", None
        raise UnsafeTarget(f"registry {self.name.host} redirected plugd more than {MAX_REDIRECTS} times")

    def url(self, path: str) -> httpx.URL:
        return httpx.URL(f"{self.base}{self.repository}/{path}")

    def fail(self, response: httpx.Response, doing: str) -> RegistryError:
        detail = registry_errors(response) or response.reason_phrase
        return RegistryError(f"{doing}: registry {self.name.host} answered {response.status_code} {detail}")

    # ---- the distribution API ------------------------------------------------------------------------------------

    def get_manifest(self) -> Manifest:
        response = self.send("GET", self.url(f"manifests/{self.name.tag}"),
                             headers={"Accept": f"{MANIFEST_MEDIA_TYPE}, {OCI_MANIFEST}"})
        if response.status_code == 404:
            raise self._unknown()
        if response.status_code != 200:
            raise self.fail(response, "pull manifest")
        raw = response.content
        announced = response.headers.get("docker-content-digest")
        if announced and announced != "sha256:" + hashlib.sha256(raw).hexdigest():
            raise RegistryError(f"the manifest of {self.name} does not match its digest {announced}")
        try:
            return Manifest.from_bytes(raw)
        except MalformedManifest as exc:
            raise RegistryError(f"registry {self.name.host} sent a manifest for {self.name} plugd cannot use: {exc}") from None

    def _unknown(self) -> UnknownModel:
        """Unknown model or unknown tag, told apart by the repository's tag list where the registry offers one."""
        response = self.send("GET", self.url("tags/list"))
        where = f"on registry {self.name.host}"
        if response.status_code == 200:
            tags = response.json().get("tags") or []
            known = f"; it has {', '.join(sorted(tags))}" if tags else ""
            return UnknownModel(f"model '{self.repository}' has no tag '{self.name.tag}' {where}{known}")
        if "NAME_UNKNOWN" in registry_errors(response):
            return UnknownModel(f"unknown model '{self.repository}' {where}")
        return UnknownModel(f"model '{self.repository}:{self.name.tag}' not found {where}")

    def put_manifest(self, raw: bytes, media_type: str = MANIFEST_MEDIA_TYPE) -> None:
        response = self.send("PUT", self.url(f"manifests/{self.name.tag}"), body=raw,
                             headers={"Content-Type": media_type})
        if response.status_code not in (200, 201):
            raise self.fail(response, f"push manifest of {self.name}")

    def blob_exists(self, digest: str) -> bool:
        response = self.send("HEAD", self.url(f"blobs/{digest}"))
        if response.status_code in (200, 404):
            return response.status_code == 200
        raise self.fail(response, f"check blob {digest}")

    @contextmanager
    def blob_range(self, digest: str, start: int, end: int) -> Iterator[httpx.Response]:
        """The blob's bytes start..end (inclusive), the body to be read from `response.extensions[bulk.BODY]`; the
        caller checks the status (206, or 200 for the whole blob)."""
        headers = {"Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        response = self.send("GET", self.url(f"blobs/{digest}"), headers=headers, stream=True, bulk=True)
        try:
            yield response
        finally:
            response.close()

    def start_upload(self, mount: str | None = None, source: str | None = None) -> httpx.URL | None:
        """An upload session's location; None when the registry mounted blob `mount` from repository `source`."""
        url = self.url("blobs/uploads/")
        if mount and source:
            url = url.copy_merge_params({"mount": mount, "from": source})
        response = self.send("POST", url)
        if response.status_code == 201 and mount:
            return None
        if response.status_code != 202:
            raise self.fail(response, "start upload")
        return self.location(response)

    def location(self, response: httpx.Response) -> httpx.URL:
        if "location" not in response.headers:
            raise RegistryError(f"registry {self.name.host} sent no Location for the upload")
        return response.url.join(response.headers["location"])


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def registry_errors(response: httpx.Response) -> str:
    """`CODE: message` of each entry of a distribution-API error body; empty when there is none."""
    try:
        errors = response.json().get("errors") or []
        return "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError, httpx.ResponseNotRead):
        return ""


@contextmanager
def unreachable_as_error(name: ModelName) -> Iterator[None]:
    """Transport failures that survived the retries become RegistryUnreachable naming the registry."""
    try:
        yield
    except httpx.TransportError as exc:
        raise RegistryUnreachable(f"registry {name.host} is unreachable: {exc or type(exc).__name__}") from None
