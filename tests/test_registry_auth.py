"""Registry credentials, in process against real registries on loopback: Debian's docker-registry asking for
Basic credentials (htpasswd), and one trusting a token server that wants Basic credentials for its tokens;
credentials from a Docker-style config file or a credential helper, never shown in errors."""

import base64
import json
import os
import stat

import httpx
import pytest

from plugd.registry.client import RegistryClient
from plugd.registry.credentials import credentials_for
from plugd.registry.errors import AuthenticationFailed
from plugd.registry.pull import pull_model
from plugd.registry.push import push_model
from plugd.registry.testing import Certificate, DockerRegistry, Front, TokenServer, store_with_model
from plugd.store.names import ModelName
from plugd.store.store import Store

PASSWORD = "s3cret-Pa55"


@pytest.fixture(scope="module")
def checkpoint_store(tmp_path_factory):
    return store_with_model(tmp_path_factory.mktemp("source") / "models", "tiny")


@pytest.fixture(scope="module")
def basic_registry(tmp_path_factory):
    pytest.importorskip("bcrypt")
    with DockerRegistry(tmp_path_factory.mktemp("basic"), users={"alice": PASSWORD}) as registry:
        yield registry


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("token")
    with TokenServer(Certificate(root / "tls"), users={"bob": PASSWORD}) as tokens, \
            DockerRegistry(root / "registry", token=tokens) as registry:
        yield registry, tokens


def credentials_file(tmp_path, monkeypatch, config: dict) -> None:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("PLUGD_REGISTRY_AUTH", str(path))


def auths(host: str, user: str, password: str) -> dict:
    return {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}


def push_then_pull(source: Store, name: ModelName, tmp_path) -> None:
    source.copy(ModelName.parse("tiny"), name)
    push_model(source, name)
    target = Store(tmp_path / "pulled")
    pull_model(target, name)
    assert target.get(name).manifest == source.get(name).manifest


def test_a_registry_asking_for_basic_credentials(checkpoint_store, basic_registry, tmp_path, monkeypatch):
    name = ModelName.parse(f"{basic_registry.address}/private/tiny:v1")
    monkeypatch.setenv("PLUGD_REGISTRY_AUTH", str(tmp_path / "none.json"))
    checkpoint_store.copy(ModelName.parse("tiny"), name)
    with pytest.raises(AuthenticationFailed, match="asks for a user name and password, and plugd has none"):
        push_model(checkpoint_store, name)

    credentials_file(tmp_path, monkeypatch, auths(f"http://{basic_registry.address}/", "alice", "wrong"))
    refused = r"refused access to private/tiny for user 'alice' \(from .*auth.json"
    with pytest.raises(AuthenticationFailed, match=refused) as info:
        pull_model(Store(tmp_path / "refused"), name)
    assert "wrong" not in str(info.value)

    credentials_file(tmp_path, monkeypatch, auths(basic_registry.address, "alice", PASSWORD))
    push_then_pull(checkpoint_store, name, tmp_path)


def test_a_token_server_asking_for_basic_credentials(checkpoint_store, token_registry, tmp_path, monkeypatch):
    registry, tokens = token_registry
    name = ModelName.parse(f"{registry.address}/private/tiny:v1")
    monkeypatch.setenv("PLUGD_REGISTRY_AUTH", str(tmp_path / "none.json"))
    with pytest.raises(AuthenticationFailed, match=r"token server .* asks for a user name and password"):
        pull_model(Store(tmp_path / "anonymous"), name)

    credentials_file(tmp_path, monkeypatch, {"auths": {registry.address: {"username": "bob", "password": PASSWORD}}})
    tokens.authorizations.clear()
    push_then_pull(checkpoint_store, name, tmp_path)
    basic = "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
    assert tokens.authorizations and set(tokens.authorizations) == {basic}


def test_credentials_from_a_credential_helper(checkpoint_store, token_registry, tmp_path, monkeypatch):
    registry, tokens = token_registry
    helper = tmp_path / "bin" / "docker-credential-plugdtest"
    helper.parent.mkdir()
    helper.write_text(f"""#!/bin/sh
read host
if [ "$1" = get ] && [ "$host" = "{registry.address}" ]; then
  echo '{{"ServerURL": "{registry.address}", "Username": "bob", "Secret": "{PASSWORD}"}}'
else
  echo "credentials not found in native keychain"; exit 1
fi
""")
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{helper.parent}{os.pathsep}{os.environ['PATH']}")
    credentials_file(tmp_path, monkeypatch, {"auths": {}, "credHelpers": {registry.address: "plugdtest"}})
    push_then_pull(checkpoint_store, ModelName.parse(f"{registry.address}/helped/tiny:v1"), tmp_path)
    assert credentials_for("elsewhere.example:5000") is None


def test_where_credentials_are_found(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.delenv("PLUGD_REGISTRY_AUTH", raising=False)
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(home))
    assert credentials_for("registry.example") is None
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text(json.dumps(auths("https://Registry.Example/v1/", "docker", "pw1")))
    assert credentials_for("registry.example").username == "docker"
    (home / ".plugd").mkdir()
    (home / ".plugd" / "auth.json").write_text(json.dumps(auths("registry.example", "plugd", "pw2")))
    found = credentials_for("registry.example")
    assert (found.username, found.password) == ("plugd", "pw2") and "pw2" not in repr(found)
    assert credentials_for("registry.example:5000") is None  # another port is another registry

    credentials_file(tmp_path, monkeypatch, {"auths": {"registry.example": {"auth": "bm90IGJhc2U2NA"}}})
    with pytest.raises(AuthenticationFailed, match="base64 of user:password"):
        credentials_for("registry.example")
    (tmp_path / "auth.json").write_text("{not json")
    with pytest.raises(AuthenticationFailed, match="auth.json: not valid JSON"):
        credentials_for("registry.example")


def test_credentials_never_follow_a_redirect_to_another_origin(tmp_path):
    basic = "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
    with TokenServer(Certificate(tmp_path / "tls")) as tokens, Front(tokens.url) as front:
        front.rules.append(lambda handler: handler.reply(307, headers={"Location": f"{tokens.url}{handler.path}"}) or True)
        with RegistryClient(ModelName.parse(f"{front.address}/private/tiny:v1")) as client:
            client.auth.fetch(httpx.URL(f"{tokens.url}/token"), {"Authorization": basic})
            client.auth.fetch(httpx.URL(f"{front.url}/token"), {"Authorization": basic})
    assert tokens.authorizations[-2:] == [basic, None]
