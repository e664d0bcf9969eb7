"""A full disk is a 507 with the reason, and leaves nothing half-written: the store lives on a 1 MiB tmpfs here
(mounting one needs root, as CI has; elsewhere the test is skipped)."""

import hashlib
import subprocess

import httpx
import pytest

from plugd.testing.server import LiveServer


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_an_upload_that_fills_the_disk_is_a_507_and_leaves_nothing(small_disk):
    server = LiveServer(small_disk / "models")
    try:
        data = b"\x01" * (2 << 20)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        response = httpx.post(f"{server.url}/api/blobs/{digest}", content=data, timeout=60)
        assert response.status_code == 507
        assert response.json() == {"error": "no space left on the model store's disk: free some space, or remove "
                                            "models"}
        assert httpx.head(f"{server.url}/api/blobs/{digest}").status_code == 404
        assert [p.name for p in (small_disk / "models" / "blobs").iterdir()] == []
        small = b"fits"
        small_digest = "sha256:" + hashlib.sha256(small).hexdigest()
        assert httpx.post(f"{server.url}/api/blobs/{small_digest}", content=small).status_code == 201
    finally:
        server.stop()
