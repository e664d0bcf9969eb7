"""Downloading one blob: ranged parts fetched over the pull's connections into its partial file, hashed as they
land, verified, then published into the store.

A blob starts as one part (or as planned by `Tuning.part_size`). A part whose connection turns out slow hands
its second half to an idle connection, again and again while connections are idle: a fast link keeps one
in-order stream per blob (hashing keeps up with it and has little left at the end), a slow one gets parallel
ranges. The thread that runs `BlobDownload.run` hashes the blob in order while parts are still arriving, on a
core of its own: the fetch at the front hands it each chunk in the buffer it was read into, as the chunk goes to
the fetch's writer thread (a few buffers per fetch, so reading the socket, writing and hashing overlap, and the
hash never waits for the disk), and whatever landed out of order is read back from the file once everything
before it is in. A part that fails is retried from where it stopped; after an interruption the next pull
continues every part from its recorded progress (the `.parts` file of `plugd.store.partial`).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial as bind

import httpx
from attrs import define

from plugd.registry.bulk import BODY, BulkBody
from plugd.registry.client import RegistryClient
from plugd.registry.errors import BlobCorrupt, DiskFull, RegistryError, RegistryUnreachable, TransferCancelled
from plugd.registry.progress import Progress
from plugd.store.manifests import Layer
from plugd.store.partial import DIRECT_BLOCK, Part, PartialBlob, is_disk_full, plan_parts
from plugd.store.store import Store

RETRIES = 3  # failed attempts in a row, without progress, before a part gives up
BACKOFF = 0.5  # seconds, times the attempt number
HASH_BLOCK = 8 << 20  # bytes per read of the partial file, for parts that landed out of order
BUFFER_SIZE = 4 << 20  # bytes per read from the socket
BUFFERS = 4  # per part being fetched: one filling from the socket, one being written, others waiting for the hasher
SAVE_INTERVAL = 1.0  # seconds between records of the parts' progress
CHECK_INTERVAL = 0.25  # seconds between looks at how the parts are doing


@define(frozen=True)
class Tuning:
    """How blobs are split: `part_size` plans the first parts (None: one per blob). A part whose connection has
    run `split_after` seconds at under `split_below` bytes per second gives its second half to an idle
    connection, if both halves keep at least `min_split` bytes."""

    part_size: int | None = None
    split_after: float = 1.0
    split_below: float = 64e6
    min_split: int = 32 << 20


class Connections:
    """The pull's connections for parts: at most `size` fetch at once, the others wait their turn."""

    def __init__(self, size: int):
        self.size = size
        self.busy = 0
        self.lock = threading.Lock()
        self.executor = ThreadPoolExecutor(size, thread_name_prefix="plugd-pull-part")

    def submit(self, fetch: Callable[[], None]) -> Future:
        def run() -> None:
            try:
                fetch()
            finally:
                with self.lock:
                    self.busy -= 1

        with self.lock:
            self.busy += 1
        return self.executor.submit(run)

    def idle(self) -> bool:
        with self.lock:
            return self.busy < self.size

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *exc) -> None:
        self.executor.shutdown()


class _RangesUnsupported(Exception):
    """The registry answered a ranged request with the whole blob; the blob is fetched in one piece instead."""


class _Transient(Exception):
    """A 5xx or 429 answer: worth another try."""


class _Stopped(Exception):
    """Another part failed, or the transfer was cancelled."""


def frontier(parts: list[Part]) -> int:
    """Bytes from the start of the blob that are all downloaded."""
    ready = 0
    for part in parts:
        ready += part.done
        if part.remaining:
            break
    return ready


@define(frozen=True)
class _Landed:
    """A chunk just read, handed to the hasher in the fetch's buffer; `release` says the hasher is done with it."""

    offset: int
    data: memoryview
    release: Callable[[], None]


class BlobDownload:
    def __init__(self, client: RegistryClient, store: Store, layer: Layer, connections: Connections,
                 progress: Progress, cancel: threading.Event, tuning: Tuning):
        self.client = client
        self.store = store
        self.digest = layer.digest
        self.size = layer.size
        self.connections = connections
        self.progress = progress
        self.cancel = cancel
        self.tuning = tuning
        self.changed = threading.Condition()  # guards the parts' progress and ends
        self.failure: BaseException | None = None
        self.stopping = False
        self.fetches: list[Future] = []
        self.began: dict[int, tuple[float, int]] = {}  # part offset -> (when its current fetch began, done then)
        self.landed: deque[_Landed] = deque()  # chunks handed to the hasher in memory, in order
        self.handed = 0  # bytes from the start of the blob the hasher has been handed (in memory or to read back)

    def run(self) -> None:
        with PartialBlob(self.store.blobs, self.digest, self.size) as partial:
            if not self.store.blobs.exists(self.digest):  # else another pull finished it while this one waited
                self._download_verify_publish(partial)
        self.progress.layer(self.digest, self.size, self.size)

    def _download_verify_publish(self, partial: PartialBlob) -> None:
        parts = partial.parts(self.tuning.part_size or max(self.size, 1))
        try:
            try:
                actual = self._download(partial, parts)
            except _RangesUnsupported:
                parts = plan_parts(self.size, max(self.size, 1))
                actual = self._download(partial, parts, may_split=False)
        except OSError as exc:
            self._keep(partial, parts)
            if is_disk_full(exc):
                raise DiskFull(f"disk full while pulling blob {self.digest} into {self.store.root}; free some space "
                               "and pull again: the download continues where it stopped") from None
            raise
        except BaseException:
            self._keep(partial, parts)
            raise
        if actual != self.digest:
            partial.discard()
            raise BlobCorrupt(f"blob {self.digest} failed verification (its content hashes to {actual}); "
                              "the download was discarded")
        partial.publish()

    def _keep(self, partial: PartialBlob, parts: list[Part]) -> None:
        try:
            partial.save(parts)
        except OSError:
            pass  # the disk may be full; the next pull then starts this blob over

    def _download(self, partial: PartialBlob, parts: list[Part], may_split: bool = True) -> str:
        self.failure, self.stopping, self.fetches, self.began = None, False, [], {}
        self.landed, self.handed = deque(), 0
        with self.changed:
            for part in parts:
                if part.remaining:
                    self._start(partial, part)
        try:
            digest = self._hash_as_it_lands(partial, parts, may_split)
        finally:
            self.stopping = True
            wait(self.fetches)  # no part may still write once this returns
        if self.failure is not None:  # a write that failed after its bytes were hashed
            raise self.failure
        return digest

    def _start(self, partial: PartialBlob, part: Part) -> None:
        self.fetches.append(self.connections.submit(lambda: self._fetch(partial, part)))

    def _hash_as_it_lands(self, partial: PartialBlob, parts: list[Part], may_split: bool) -> str:
        """Hash the blob in order: chunks handed over in memory by the fetch at the front, the rest (parts that
        landed ahead of it, or before an interruption) read back from the file once everything before it is in."""
        sha = hashlib.sha256()
        hashed, last_saved = 0, time.monotonic()
        block = memoryview(bytearray(HASH_BLOCK))
        while hashed < self.size:
            chunk, start, ready = self._next_to_hash(partial, parts, may_split)
            if chunk is not None:
                sha.update(chunk.data)
                chunk.release()
                hashed += len(chunk.data)
            while hashed < ready:
                count = os.preadv(partial.fd, [block[: min(HASH_BLOCK, ready - hashed)]], hashed)
                if count == 0:
                    raise RegistryError(f"the download of blob {self.digest} lost data ({partial.path} was truncated)")
                sha.update(block[:count])
                hashed += count
            partial.start_writeback(start, hashed - start)
            self.progress.layer(self.digest, self.size, sum(p.done for p in parts))
            if time.monotonic() - last_saved > SAVE_INTERVAL:
                partial.save(parts)
                last_saved = time.monotonic()
        return "sha256:" + sha.hexdigest()

    def _next_to_hash(self, partial: PartialBlob, parts: list[Part], may_split: bool) -> tuple[_Landed | None, int, int]:
        """Wait for more of the blob in order: (a chunk in memory, its offset, 0), or (None, start, end) of a
        stretch to read back from the file."""
        with self.changed:
            while not self.landed and frontier(parts) <= self.handed:
                if self.failure is not None:
                    raise self.failure
                if self.cancel.is_set():
                    raise TransferCancelled(f"pull of blob {self.digest} cancelled")
                self.changed.wait(CHECK_INTERVAL)
                self.progress.layer(self.digest, self.size, sum(p.done for p in parts))
                if may_split:
                    self._maybe_split(partial, parts)
            if self.landed:
                chunk = self.landed.popleft()
                return chunk, chunk.offset, 0
            start, self.handed = self.handed, frontier(parts)
            return None, start, self.handed

    def _maybe_split(self, partial: PartialBlob, parts: list[Part]) -> None:
        """Give the second half of one slow part to an idle connection (called holding `changed`)."""
        if not self.connections.idle():
            return
        now = time.monotonic()
        for index, part in enumerate(parts):
            if part.offset not in self.began or part.remaining < 2 * self.tuning.min_split:
                continue
            since, done_then = self.began[part.offset]
            elapsed = now - since
            if elapsed < self.tuning.split_after or (part.done - done_then) / elapsed >= self.tuning.split_below:
                continue
            cut = part.offset + part.done + part.remaining // 2
            parts.insert(index + 1, Part(cut, part.end - cut))
            part.size = cut - part.offset  # its fetch stops at the new end (see `_stream`)
            self._start(partial, parts[index + 1])
            return

    def _fetch(self, partial: PartialBlob, part: Part) -> None:
        failures = 0
        try:
            while part.remaining:
                before, error = part.done, None
                try:
                    self._stream(partial, part)
                except (httpx.TransportError, _Transient) as exc:
                    error = exc
                if part.done > before:
                    failures = 0
                    continue
                failures += 1
                if failures > RETRIES:
                    raise RegistryUnreachable(f"downloading blob {self.digest} from {self.client.name.host} failed "
                                              f"{failures} times in a row: {error or 'no data received'}")
                time.sleep(BACKOFF * failures)
        except _Stopped:
            pass
        except BaseException as exc:
            with self.changed:
                self.failure = self.failure or exc
                self.changed.notify_all()

    def _stream(self, partial: PartialBlob, part: Part) -> None:
        start = part.offset + part.done
        with self.client.blob_range(self.digest, start, part.end - 1) as response:
            status = response.status_code
            if status == 200 and (start > 0 or part.end < self.size):
                raise _RangesUnsupported()
            if status >= 500 or status == 429:
                raise _Transient(f"HTTP {status}")
            if status not in (200, 206):
                response.read()
                raise self.client.fail(response, f"download blob {self.digest}")
            if int(response.headers.get("content-length", -1)) > part.end - start:
                raise RegistryError(f"registry {self.client.name.host} sent more of blob {self.digest} than asked")
            body: BulkBody = response.extensions[BODY]
            buffers: queue.SimpleQueue[memoryview] = queue.SimpleQueue()
            for _ in range(BUFFERS):
                buffers.put(memoryview(mmap.mmap(-1, BUFFER_SIZE)))  # page-aligned, as direct I/O needs
            with self.changed:
                self.began[part.offset] = (time.monotonic(), part.done)
            with _ChunkWriter(bind(self._land, partial, part)) as writer:
                position, end = start, part.end
                while position < end:
                    buffer = self._free_buffer(buffers, writer)
                    count = body.readinto(buffer[: BUFFER_SIZE - position % DIRECT_BLOCK])  # the next read starts aligned
                    if self.stopping or self.cancel.is_set():
                        raise _Stopped()
                    writer.check()
                    with self.changed:
                        count = min(count, part.end - position)  # a split may have moved the end meanwhile
                        if count <= 0:
                            buffers.put(buffer)
                            return  # the server hung up early (`_fetch` asks again from here), or a split took the rest
                        release = self._hand_over(position, buffer, count, buffers)
                    writer.put(position, buffer[:count], release)
                    position += count
            writer.check()

    def _hand_over(self, position: int, buffer: memoryview, count: int,
                   buffers: queue.SimpleQueue[memoryview]) -> Callable[[], None]:
        """Give a chunk just read to the hasher too if it is next in line, so hashing need not wait for the disk;
        what the writer calls when done with it: the buffer goes back once the writer and the hasher are both
        done (called holding `changed`)."""
        if position != self.handed:
            return bind(buffers.put, buffer)
        release = _Twice(bind(buffers.put, buffer))
        self.landed.append(_Landed(position, buffer[:count], release))
        self.handed = position + count
        self.changed.notify_all()
        return release

    def _land(self, partial: PartialBlob, part: Part, position: int, chunk: memoryview) -> None:
        """Write a chunk into the partial file and record it as downloaded."""
        partial.write(chunk, position)
        with self.changed:
            part.done = min(position + len(chunk) - part.offset, part.size)
            self.changed.notify_all()

    def _free_buffer(self, buffers: queue.SimpleQueue[memoryview], writer: _ChunkWriter) -> memoryview:
        """A buffer the writer and the hasher are done with."""
        while True:
            try:
                return buffers.get(timeout=CHECK_INTERVAL)
            except queue.Empty:
                if self.stopping or self.cancel.is_set():
                    raise _Stopped() from None
                writer.check()


class _Twice:
    """Calls `then` on its second call: a buffer shared by the writer and the hasher goes back once both are done."""

    def __init__(self, then: Callable[[], None]):
        self.then = then
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.calls += 1
            last = self.calls == 2
        if last:
            self.then()


class _ChunkWriter:
    """Lands one fetch's chunks (`land(position, chunk)`) in order on a thread of its own, so the socket is read
    while the disk takes the previous chunk: a direct write blocks until the device has the bytes, and reading
    and writing in turn left each half idle while the other ran. Each chunk's `release` is called once it is
    written, also when the write fails; after a failure the remaining chunks are only released, and `check`
    raises the failure. Leaving the block waits for every write."""

    def __init__(self, land: Callable[[int, memoryview], None]):
        self.land = land
        self.chunks: queue.SimpleQueue[tuple[int, memoryview, Callable[[], None]] | None] = queue.SimpleQueue()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="plugd-pull-write", daemon=True)

    def __enter__(self) -> _ChunkWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.chunks.put(None)
        self.thread.join()

    def put(self, position: int, chunk: memoryview, release: Callable[[], None]) -> None:
        self.chunks.put((position, chunk, release))

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        while (item := self.chunks.get()) is not None:
            position, chunk, release = item
            try:
                if self.failure is None:
                    self.land(position, chunk)
            except BaseException as exc:
                self.failure = exc
            finally:
                release()
