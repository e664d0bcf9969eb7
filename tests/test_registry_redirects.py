"""Redirect rules, proved against https fronts (self-signed certificate, trusted through PLUGD_CA_BUNDLE) that send
blob downloads through redirect chains before a real registry serves them."""

import ipaddress

import httpx
import pytest

from plugd.registry.errors import UnsafeTarget
from plugd.registry.pull import pull_model
from plugd.registry.push import push_model
from plugd.registry.testing import (
    Certificate,
    DockerRegistry,
    Front,
    redirect_blob_downloads,
    store_with_model,
)
from plugd.registry.transport import AddressPolicy, check_target, is_loopback_host
from plugd.store.names import ModelName
from plugd.store.store import Store
from plugd.testing.server import LiveServer


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return Certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, certificate):
    """The registry (plain http, with test/tiny:v1 pushed), and three https fronts: `origin` on 127.0.0.1 (the
    registry plugd is told to use), `other_ip` on 127.0.0.2, and `other_name` on 127.0.0.1 reached as localhost."""
    with DockerRegistry(tmp_path_factory.mktemp("registry")) as registry:
        name = ModelName.parse(f"{registry.address}/test/tiny:v1")
        source = store_with_model(tmp_path_factory.mktemp("source") / "models", name)
        push_model(source, name)
        tls = certificate.server_context()
        fronts = {"origin": Front(registry.url, tls=tls), "other_ip": Front(registry.url, host="127.0.0.2", tls=tls),
                  "other_name": Front(registry.url, tls=tls)}
        yield registry, source, name, fronts
        for front in fronts.values():
            front.close()


@pytest.fixture
def trusted(monkeypatch, certificate):
    monkeypatch.setenv("PLUGD_CA_BUNDLE", str(certificate.cert))


def chain_urls(registry, fronts, hops):
    urls = {"origin": fronts["origin"].url, "other_ip": fronts["other_ip"].url,
            "other_name": fronts["other_name"].url.replace("127.0.0.1", "localhost"), "plain": registry.url}
    return [urls[hop] for hop in hops]


def pull_through(setup, tmp_path, hops, insecure):
    registry, source, name, fronts = setup
    rule = redirect_blob_downloads(chain_urls(registry, fronts, hops))
    for front in fronts.values():
        front.rules[:] = [rule]
        front.log.clear()
    target = Store(tmp_path / "models")
    pulled = ModelName.parse(f"{fronts['origin'].address}/test/tiny:v1")
    try:
        pull_model(target, pulled, insecure=insecure)
    finally:
        assert_nothing_half_visible(target, source, name)
    assert target.get(pulled).manifest == source.get(name).manifest
    return fronts


def assert_nothing_half_visible(target, source, name):
    if not target.list():
        assert not any(target.blobs.exists(d) for d in source.get(name).manifest.digests()
                       if d != source.get(name).manifest.config.digest)


@pytest.mark.parametrize("insecure", [False, True])
@pytest.mark.parametrize("hops", [["plain"], ["origin", "plain"]], ids=["first-hop", "second-hop"])
def test_https_never_follows_a_redirect_to_plain_http(setup, tmp_path, trusted, hops, insecure):
    with pytest.raises(UnsafeTarget, match="from https to plain http.*not even with --insecure"):
        pull_through(setup, tmp_path, hops, insecure)


@pytest.mark.parametrize("hops", [["other_ip"], ["origin", "other_name"]], ids=["address", "name-resolved-per-hop"])
def test_a_redirect_to_a_private_address_is_refused_without_insecure(setup, tmp_path, trusted, hops):
    with pytest.raises(UnsafeTarget, match="refused to connect to (127.0.0.2|localhost).*non-public address"):
        pull_through(setup, tmp_path, hops, insecure=False)


@pytest.mark.parametrize("hops", [["other_ip"], ["origin", "other_name"]], ids=["address", "name-resolved-per-hop"])
def test_insecure_allows_private_addresses(setup, tmp_path, trusted, hops):
    fronts = pull_through(setup, tmp_path, hops, insecure=True)
    assert fronts[hops[-1]].blob_gets()  # the blobs really came through the last hop


def test_redirects_within_the_registry_host_need_no_insecure(setup, tmp_path, trusted):
    fronts = pull_through(setup, tmp_path, ["origin", "origin"], insecure=False)
    assert any("hop=2" in path for _, path, _ in fronts["origin"].blob_gets())


def test_an_untrusted_certificate_is_refused(setup, tmp_path):
    registry, source, name, fronts = setup
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        pull_model(Store(tmp_path / "models"), ModelName.parse(f"{fronts['origin'].address}/test/tiny:v1"))


def test_the_daemon_honours_the_ca_bundle_and_insecure(setup, tmp_path, certificate):
    registry, source, name, fronts = setup
    rule = redirect_blob_downloads(chain_urls(registry, fronts, ["other_ip"]))
    for front in fronts.values():
        front.rules[:] = [rule]
    server = LiveServer(tmp_path / "models", env={"PLUGD_CA_BUNDLE": str(certificate.cert)})
    try:
        pulled = f"{fronts['origin'].address}/test/tiny:v1"
        refused = server.cli("pull", pulled)
        assert refused.returncode == 1
        assert "Error: refused to connect to 127.0.0.2" in refused.stderr
        assert httpx.get(f"{server.url}/api/tags").json()["models"] == []
        allowed = server.cli("pull", "--insecure", pulled)
        assert allowed.returncode == 0, allowed.stderr
        assert allowed.stderr.splitlines()[-1] == "success"
        assert [m["name"] for m in httpx.get(f"{server.url}/api/tags").json()["models"]] == [pulled]
    finally:
        server.stop()


def test_address_policy_trusts_only_the_named_registry_host():
    loopback, private, public = (ipaddress.ip_address(a) for a in ("127.0.0.1", "10.1.2.3", "93.184.216.34"))
    policy = AddressPolicy("registry.local")
    policy.check("registry.local", [loopback, private])
    policy.check("cdn.example.com", [public])
    for address in (loopback, private, ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("::1"),
                    ipaddress.ip_address("::ffff:10.0.0.1"), ipaddress.ip_address("fd00::1")):
        with pytest.raises(UnsafeTarget, match="non-public address"):
            policy.check("cdn.example.com", [public, address])
    AddressPolicy("registry.local", insecure=True).check("cdn.example.com", [loopback, private])


def test_scheme_rules():
    https, http = httpx.URL("https://r.example/v2/"), httpx.URL("http://localhost:5000/v2/")
    check_target(https, httpx.URL("https://cdn.example/blob"))
    check_target(http, httpx.URL("https://cdn.example/blob"))
    check_target(http, httpx.URL("http://localhost:5000/other"))
    with pytest.raises(UnsafeTarget, match="from https to plain http"):
        check_target(https, httpx.URL("http://cdn.example/blob"))
    with pytest.raises(UnsafeTarget, match="only http and https"):
        check_target(https, httpx.URL("file:///etc/passwd"))
    assert is_loopback_host("localhost") and is_loopback_host("127.0.0.5") and is_loopback_host("[::1]")
    assert not is_loopback_host("registry.example.com") and not is_loopback_host("10.0.0.1")
