"""Answering a registry's 401: bearer-token challenges as OCI registries issue them (the Docker token protocol),
and Basic challenges; with the user's credentials for the registry host where there are some
(`plugd.registry.credentials`), anonymously otherwise."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import httpx

from plugd.registry.credentials import Credentials, credential_files, credentials_for
from plugd.registry.errors import AuthenticationFailed

_PARAM = re.compile(r'([A-Za-z_]+)=(?:"([^"]*)"|([^\s,]*))')

# GET a URL with the given headers, following redirects (the headers stay with the URL's origin).
Fetch = Callable[[httpx.URL, dict[str, str]], httpx.Response]


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="...",scope="..."` -> ("bearer", {"realm": ..., ...})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), {key.lower(): quoted or bare for key, quoted, bare in _PARAM.findall(rest)}


class RegistryAuth:
    """The session's Authorization header. A 401 with a bearer challenge sends plugd to the challenge's realm for
    a token covering the scopes the session declared (e.g. `repository:ns/model:pull,push`) and the one the
    challenge names, with the user's credentials if any; a Basic challenge is answered with the credentials."""

    def __init__(self, host: str, scopes: list[str], fetch: Fetch):
        self.host = host
        self.scopes = scopes
        self.fetch = fetch
        self.authorization: str | None = None
        self.lock = threading.Lock()
        self._credentials: tuple[Credentials | None] | None = None

    def header(self) -> dict[str, str]:
        return {"Authorization": self.authorization} if self.authorization else {}

    def credentials(self) -> Credentials | None:
        if self._credentials is None:
            self._credentials = (credentials_for(self.host),)
        return self._credentials[0]

    def answer(self, challenged: httpx.Response, sent_with: str | None) -> None:
        """Authorize the session for the challenge of a 401 response to a request sent with Authorization
        `sent_with`, unless another request has done so meanwhile; AuthenticationFailed when it cannot be."""
        with self.lock:
            if self.authorization == sent_with:
                self.authorization = self._authorize(challenged, sent_with)

    def _authorize(self, challenged: httpx.Response, sent_with: str | None) -> str:
        header = challenged.headers.get("www-authenticate", "")
        scheme, params = parse_challenge(header)
        if scheme == "basic":
            return self._basic(sent_with)
        if scheme != "bearer" or not params.get("realm"):
            raise AuthenticationFailed(
                f"registry {self.host} asks for authentication plugd cannot give ({header or 'no challenge'}); "
                "plugd answers bearer-token and Basic challenges"
            )
        return "Bearer " + self._token(params)

    def _basic(self, sent_with: str | None) -> str:
        credentials = self.credentials()
        if credentials is None:
            raise self._missing_credentials(f"registry {self.host} asks for a user name and password")
        if sent_with == credentials.basic():
            raise AuthenticationFailed(f"registry {self.host} refused the credentials for user "
                                       f"'{credentials.username}' from {credentials.source}")
        return credentials.basic()

    def _token(self, params: dict[str, str]) -> str:
        scopes = list(dict.fromkeys([*self.scopes, *params.get("scope", "").split()]))
        query: dict[str, str | list[str]] = {"scope": scopes}
        if params.get("service"):
            query["service"] = params["service"]
        realm = httpx.URL(params["realm"]).copy_merge_params(query)
        credentials = self.credentials()
        response = self.fetch(realm, {"Authorization": credentials.basic()} if credentials else {})
        where = f"the token server of {self.host} ({realm.host})"
        if response.status_code == 401 and credentials is not None:
            raise AuthenticationFailed(f"{where} refused the credentials for user '{credentials.username}' from "
                                       f"{credentials.source}")
        if response.status_code == 401:
            raise self._missing_credentials(f"{where} asks for a user name and password")
        if response.status_code != 200:
            raise AuthenticationFailed(f"{where} refused a token for {' '.join(scopes)}: HTTP {response.status_code}")
        try:
            data = response.json()
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise AuthenticationFailed(f"{where} sent no token")
        return token

    def refused(self, repository: str, detail: str) -> AuthenticationFailed:
        """The error for a request still refused after `answer`."""
        credentials = self._credentials[0] if self._credentials else None
        if credentials is None:
            return self._missing_credentials(f"registry {self.host} refused anonymous access to {repository} ({detail})")
        return AuthenticationFailed(f"registry {self.host} refused access to {repository} for user "
                                    f"'{credentials.username}' (from {credentials.source}): {detail}")

    def _missing_credentials(self, what: str) -> AuthenticationFailed:
        files = ", ".join(str(path) for path in credential_files())
        return AuthenticationFailed(f"{what}, and plugd has none for {self.host}: add them to the first of {files} "
                                    "(Docker's config.json format; see docs/registries.md)")
