"""Bearer-token challenges as OCI registries issue them (the Docker token protocol), answered anonymously."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import httpx

from plugd.registry.errors import AuthenticationFailed

_PARAM = re.compile(r'([A-Za-z_]+)=(?:"([^"]*)"|([^\s,]*))')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="...",scope="..."` -> ("bearer", {"realm": ..., ...})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), {key.lower(): quoted or bare for key, quoted, bare in _PARAM.findall(rest)}


class TokenAuth:
    """The session's bearer token. A 401 sends plugd to the challenge's realm for a token covering the scopes the
    session declared (e.g. `repository:ns/model:pull,push`) and the one the challenge names."""

    def __init__(self, host: str, scopes: list[str], fetch: Callable[[httpx.URL], httpx.Response]):
        self.host = host
        self.scopes = scopes
        self.fetch = fetch
        self.token: str | None = None
        self.lock = threading.Lock()

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def answer(self, challenged: httpx.Response, sent_with: str | None) -> None:
        """Fetch a token for the challenge of a 401 response to a request sent with token `sent_with`, unless
        another request has fetched a new one meanwhile; AuthenticationFailed when none can be had."""
        with self.lock:
            if self.token == sent_with:
                self._fetch_token(challenged)

    def _fetch_token(self, challenged: httpx.Response) -> None:
        header = challenged.headers.get("www-authenticate", "")
        scheme, params = parse_challenge(header)
        if scheme != "bearer" or not params.get("realm"):
            raise AuthenticationFailed(
                f"registry {self.host} asks for authentication plugd cannot give ({header or 'no challenge'}); "
                "plugd answers bearer-token challenges only"
            )
        scopes = list(dict.fromkeys([*self.scopes, *params.get("scope", "").split()]))
        query: dict[str, str | list[str]] = {"scope": scopes}
        if params.get("service"):
            query["service"] = params["service"]
        realm = httpx.URL(params["realm"]).copy_merge_params(query)
        response = self.fetch(realm)
        if response.status_code != 200:
            raise AuthenticationFailed(
                f"the token server of {self.host} ({realm.host}) refused a token for {' '.join(scopes)}: "
                f"HTTP {response.status_code}"
            )
        try:
            data = response.json()
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise AuthenticationFailed(f"the token server of {self.host} ({realm.host}) sent no token")
        self.token = token
