"""Registry credentials, read from the files `docker login` and `podman login` write (see docs/registries.md).

The daemon looks, in order, at `$PLUGD_REGISTRY_AUTH` (a file; when set, only that file), `~/.plugd/auth.json`,
then `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`; the first file with an entry for the registry host
wins. Files are in Docker's config format: `{"auths": {"host[:port]": {"auth": base64("user:password")}}}`
(or `"username"` and `"password"`), and `"credHelpers": {"host": "name"}` or `"credsStore": "name"`, which ask
the program `docker-credential-<name>`. Secrets never appear in messages or logs.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
from pathlib import Path

from attrs import define, field

from plugd.registry.errors import AuthenticationFailed

HELPER_TIMEOUT = 30.0  # seconds a credential helper may take


@define(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str  # where they came from, for messages

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def credential_files() -> list[Path]:
    if explicit := os.environ.get("PLUGD_REGISTRY_AUTH"):
        return [Path(explicit).expanduser()]
    docker = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    return [Path.home() / ".plugd" / "auth.json", docker]


def credentials_for(host: str) -> Credentials | None:
    """The credentials the first credential file holds for `host` (`name[:port]`); None when none has any."""
    for path in credential_files():
        try:
            config = json.loads(path.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise AuthenticationFailed(f"cannot read the registry credentials in {path}: "
                                       f"{exc.strerror if isinstance(exc, OSError) else 'not valid JSON'}") from None
        if not isinstance(config, dict):
            raise AuthenticationFailed(f"cannot read the registry credentials in {path}: not a JSON object")
        if found := _from_config(config, host, path):
            return found
    return None


def _host_of(key: str) -> str:
    """`https://host:port/v1/` -> `host:port`, as Docker writes keys of `auths`."""
    return key.split("://", 1)[-1].split("/", 1)[0].lower()


def _from_config(config: dict, host: str, path: Path) -> Credentials | None:
    host = host.lower()
    helpers = config.get("credHelpers") or {}
    helper = next((name for key, name in helpers.items() if _host_of(key) == host), None)
    auths = config.get("auths") or {}
    entry = next((value for key, value in auths.items() if _host_of(key) == host), None)
    if helper is None and isinstance(entry, dict) and (entry.get("auth") or entry.get("username")):
        return _from_entry(entry, f"{path} (auths.{host})")
    helper = helper or config.get("credsStore")
    return _from_helper(helper, host, path) if isinstance(helper, str) and helper else None


def _from_entry(entry: dict, source: str) -> Credentials:
    if entry.get("auth"):
        try:
            username, separator, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, TypeError):
            separator = ""
        if not separator:
            raise AuthenticationFailed(f"the registry credentials in {source} are unusable: `auth` must be "
                                       "base64 of user:password")
        return Credentials(username, password, source)
    username, password = entry.get("username"), entry.get("password")
    if not isinstance(username, str) or not isinstance(password, str):
        raise AuthenticationFailed(f"the registry credentials in {source} need `username` and `password` strings")
    return Credentials(username, password, source)


def _from_helper(helper: str, host: str, path: Path) -> Credentials | None:
    program = f"docker-credential-{helper}"
    source = f"{program} (named in {path})"
    try:
        done = subprocess.run([program, "get"], input=host.encode(), capture_output=True, timeout=HELPER_TIMEOUT)
    except FileNotFoundError:
        raise AuthenticationFailed(f"{path} asks the credential helper {program} for {host}, and it is not "
                                   "installed (not on PATH)") from None
    except subprocess.TimeoutExpired:
        raise AuthenticationFailed(f"the credential helper {source} did not answer within "
                                   f"{HELPER_TIMEOUT:.0f}s") from None
    if done.returncode != 0:
        if b"credentials not found" in done.stdout + done.stderr:
            return None
        raise AuthenticationFailed(f"the credential helper {source} failed for {host} (exit {done.returncode})")
    try:
        answer = json.loads(done.stdout)
        return Credentials(answer["Username"], answer["Secret"], source)
    except (ValueError, KeyError, TypeError):
        raise AuthenticationFailed(f"the credential helper {source} gave an answer plugd cannot read") from None
