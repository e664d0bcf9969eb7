"""Pull throughput: `plugd pull` of a 1 GiB model from a loopback registry, against `curl` fetching the same blobs;
and `plugd pull hf.co/...` of the same checkpoint from a loopback Hugging Face Hub, against huggingface_hub's own
`snapshot_download` of the same repository.

    .venv/bin/python bench/pull.py            # a 1 GiB float32 Qwen3 checkpoint in 2 shards, 3 rounds
    .venv/bin/python bench/pull.py --quick    # a tiny model, 1 round (the smoke test)

A real registry (Debian's `docker-registry`) serves on loopback from a temporary directory. One `plugd serve`
creates the model and pushes it there (its push rate is printed too); a second, with a store of its own,
pulls it: POST /api/pull, streamed, timed from the request to the `success` line, the model deleted again
between rounds so every blob is fetched. `curl` fetches the manifest and then each blob in turn, each to a
file on the same disk (not /dev/null), as a person scripting it would. plugd does more per byte than curl: it
hashes every byte (the digest check) and makes each blob durable (fsync) before it becomes visible; so, for
scale, `curl + sha256` also checks each file's digest after fetching it, with `openssl dgst -sha256` (SHA-NI,
as plugd's hashlib; coreutils' sha256sum lacks it and is several times slower). Rounds rotate which goes
first; figures are medians. Target: plugd / curl >= 0.9.

The last lines put that against what two cores allow: a verified pull cannot take less wall time than the CPU
the registry spends serving it plus the SHA-256 of every byte, spread over the cores the virtual machine
actually got (its host's steal time, read from /proc/stat during plugd's pulls, taken off); its own socket
reads and writes come on top. Where curl's time is below that floor divided by 0.9, the target is out of reach
on this machine whatever plugd does.

The Hub comparison, in the same run: `plugd.hub.testing.HubServer` serves the checkpoint as a repository on
loopback (LFS files through a second origin, as the Hub's CDN). The daemon pulls it through HF_ENDPOINT into an
empty Hugging Face cache of its own (POST /api/pull, timed to `success`: the download, the SHA-256 check, the
hard links into the store, the model's creation); a child process runs `snapshot_download` of the repository
into an empty cache (timed around that call alone, after its imports). plugd does more per byte: it checks
every file's SHA-256 against the digest the Hub lists and makes it durable (fsync) before the store names it;
so, for scale, `snapshot_download + sha256 + fsync` does that too after its download, as plugd does it. Caches
are emptied between rounds; rounds rotate which goes first. Target: plugd / snapshot_download >= 0.9.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import benchlib as bl
import httpx

from plugd.hub.testing import HubServer
from plugd.registry.testing import DockerRegistry, registry_binary
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer

FULL = {"hidden_size": 1024, "num_hidden_layers": 17, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 64, "intermediate_size": 4096}
TARGET = 0.9
MODEL = "bench/model:latest"
PEERS = ["plugd", "curl", "curl + sha256"]
HUB_REPO = "Bench/Tiny-Qwen3"
HUB_PEERS = ["plugd", "snapshot_download", "snapshot_download + sha256 + fsync"]
# A child process: the imports first, then the timed snapshot_download; with --verify, then also what plugd does to
# each file before it becomes a blob: its SHA-256, with its fsync alongside, files side by side.
SNAPSHOT_DOWNLOAD = """
import hashlib, os, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from huggingface_hub import snapshot_download

def durable_digest(path):
    with open(path, "rb") as f, ThreadPoolExecutor(1) as pool:
        synced = pool.submit(os.fsync, f.fileno())
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        synced.result()
    return digest

started = time.perf_counter()
snapshot = snapshot_download(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3], token=False)
if "--verify" in sys.argv:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(durable_digest, [p.resolve() for p in Path(snapshot).iterdir()]))
print(time.perf_counter() - started)
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stolen_seconds() -> float:
    """CPU time the hypervisor gave to others while this machine wanted it, all cores together, so far."""
    return int(Path("/proc/stat").read_text().split()[8]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sha256_seconds(size: int) -> float:
    """What hashing `size` bytes costs this machine (in memory, one thread): the floor of any verified pull."""
    block, sha = bytes(min(size, 64 << 20)), hashlib.sha256()
    started = time.perf_counter()
    for _ in range(-(-size // len(block))):
        sha.update(block)
    return time.perf_counter() - started


def pull_with_plugd(server: LiveServer, name: str) -> float:
    started = time.perf_counter()
    with httpx.stream("POST", f"{server.url}/api/pull", json={"model": name}, timeout=None) as response:
        for line in response.iter_lines():
            item = json.loads(line)
            if "error" in item:
                raise RuntimeError(f"plugd pull failed: {item['error']}")
    elapsed = time.perf_counter() - started
    if item.get("status") != "success":
        raise RuntimeError(f"plugd pull ended with {item}")
    return elapsed


def pull_with_curl(registry: DockerRegistry, directory: Path, verify: bool = False) -> float:
    directory.mkdir()
    base = f"{registry.url}/v2/{MODEL.split(':')[0]}"
    accept = "Accept: application/vnd.docker.distribution.manifest.v2+json"
    started = time.perf_counter()
    manifest = subprocess.run(["curl", "-sSf", "-H", accept, f"{base}/manifests/latest"], check=True,
                              capture_output=True).stdout
    layers = json.loads(manifest)
    for layer in [layers["config"], *layers["layers"]]:
        path = directory / layer["digest"]
        subprocess.run(["curl", "-sSf", "-o", str(path), f"{base}/blobs/{layer['digest']}"], check=True)
        if verify:
            digest = subprocess.run(["openssl", "dgst", "-sha256", "-r", str(path)], check=True,
                                    capture_output=True).stdout.split()[0]
            if "sha256:" + digest.decode() != layer["digest"]:
                raise RuntimeError(f"curl fetched a corrupt {layer['digest']}")
    elapsed = time.perf_counter() - started
    shutil.rmtree(directory)
    return elapsed


def pull_from_hub_with_plugd(server: LiveServer, hf_home: Path) -> float:
    elapsed = pull_with_plugd(server, f"hf.co/{HUB_REPO}")
    server.cli("rm", f"hf.co/{HUB_REPO}", check=True)
    shutil.rmtree(hf_home / "hub")
    return elapsed


def snapshot_download(hub: HubServer, cache: Path, verify: bool) -> float:
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    result = subprocess.run([sys.executable, "-c", SNAPSHOT_DOWNLOAD, HUB_REPO, str(cache), hub.url,
                             *(["--verify"] if verify else [])], env=env, check=True, capture_output=True, text=True)
    shutil.rmtree(cache)
    return float(result.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model and one round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if registry_binary() is None or shutil.which("curl") is None:
        print("needs docker-registry (Debian package docker-registry) and curl", file=sys.stderr)
        return 1
    rounds = 1 if args.quick else args.rounds
    bl.on_sigterm_exit()
    with tempfile.TemporaryDirectory(prefix="plugd-bench-pull-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        checkpoint = write_checkpoint(root / "checkpoint", "qwen3", seed=0, shards=1 if args.quick else 2,
                                      overrides=None if args.quick else FULL)
        size = sum(p.stat().st_size for p in checkpoint.iterdir())
        registry = stack.enter_context(DockerRegistry(root / "registry"))
        hub = stack.enter_context(HubServer())
        hub.add(HUB_REPO, checkpoint)
        hf_home = root / "hf-home"
        name = f"{registry.address}/{MODEL}"
        source = LiveServer(root / "source")
        stack.callback(source.stop)
        source.cli("create", name, "--from", str(checkpoint), check=True)
        started = time.perf_counter()
        source.cli("push", name, check=True)
        push_seconds = time.perf_counter() - started
        target = LiveServer(root / "target", env={"HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_TOKEN": ""})
        stack.callback(target.stop)
        times: dict[str, list[float]] = {who: [] for who in PEERS}
        cpu: dict[str, list[float]] = {who: [] for who in PEERS}
        registry_cpu: list[float] = []  # what the registry spent serving each plugd pull
        cores_stolen: list[float] = []  # cores' worth of steal time during each plugd pull
        load_before = os.getloadavg()[0]
        for round_ in range(rounds):
            for who in PEERS[round_ % 3:] + PEERS[: round_ % 3]:
                if who == "plugd":
                    before, serving, stolen = (cpu_seconds(target.process.pid), cpu_seconds(registry.process.pid),
                                               stolen_seconds())
                    times[who].append(pull_with_plugd(target, name))
                    cpu[who].append(cpu_seconds(target.process.pid) - before)
                    registry_cpu.append(cpu_seconds(registry.process.pid) - serving)
                    cores_stolen.append((stolen_seconds() - stolen) / times[who][-1])
                    target.cli("rm", name, check=True)
                else:
                    before = children_cpu_seconds()
                    times[who].append(pull_with_curl(registry, root / f"curl-{round_}", verify=who != "curl"))
                    cpu[who].append(children_cpu_seconds() - before)
        hub_times: dict[str, list[float]] = {who: [] for who in HUB_PEERS}
        for round_ in range(rounds):
            for who in HUB_PEERS[round_ % 3:] + HUB_PEERS[: round_ % 3]:
                hub_times[who].append(pull_from_hub_with_plugd(target, hf_home) if who == "plugd"
                                      else snapshot_download(hub, root / f"hf-cache-{round_}", who != "snapshot_download"))
        rates = {who: size / bl.median(times[who]) for who in PEERS}
        gib = size / 2**30
        print(f"model: {bl.mib(size)} in {len(list(checkpoint.iterdir()))} files; {rounds} round(s); "
              f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")
        print(f"push plugd            {size / push_seconds / 1e6:8.1f} MB/s")
        for who in PEERS:
            print(f"pull {who:<17}{rates[who] / 1e6:8.1f} MB/s   ({', '.join(f'{t:.2f}' for t in times[who])} s; "
                  f"CPU {bl.median(cpu[who]) / gib:.2f} s/GiB)")
        hashing = sha256_seconds(size)
        print(f"sha256 alone          {size / hashing / 1e6:8.1f} MB/s   (one thread, in memory)")
        cores = os.cpu_count() - bl.median(cores_stolen)
        floor = (bl.median(registry_cpu) + hashing) / cores
        print(f"floor of a verified pull {floor:5.2f} s   (the registry's CPU serving it, {bl.median(registry_cpu):.2f} s, "
              f"and the SHA-256, {hashing:.2f} s, on the {cores:.1f} of {os.cpu_count()} cores the host left)")
        print(f"best ratio possible   {bl.median(times['curl']) / floor:8.2f}   (curl's median time over that floor)")
        ratio = rates["plugd"] / rates["curl"]
        print(f"ratio plugd/curl      {ratio:8.2f}   (target >= {TARGET}: {'met' if ratio >= TARGET else 'not met'})")
        print(f"ratio plugd/(curl + sha256) {rates['plugd'] / rates['curl + sha256']:.2f}")
        for who in HUB_PEERS:
            print(f"hub pull {who:<35}{size / bl.median(hub_times[who]) / 1e6:8.1f} MB/s   "
                  f"({', '.join(f'{t:.2f}' for t in hub_times[who])} s)")
        hub_ratio = bl.median(hub_times["snapshot_download"]) / bl.median(hub_times["plugd"])
        print(f"ratio plugd/snapshot_download {hub_ratio:5.2f}   (target >= {TARGET}: "
              f"{'met' if hub_ratio >= TARGET else 'not met'})")
        print(f"ratio plugd/(snapshot_download + sha256 + fsync) "
              f"{bl.median(hub_times['snapshot_download + sha256 + fsync']) / bl.median(hub_times['plugd']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
