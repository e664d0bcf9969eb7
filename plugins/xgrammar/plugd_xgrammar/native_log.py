"""xgrammar's C++ core reports what it approximates (a lookahead it drops, a oneOf it loosens to anyOf) only as
warning lines on the process's stderr. This reads them off file descriptor 2 around a call."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# "[12:00:00] /path/to/file.cc:870: Warning: oneOf with overlapping ..."
_WARNING = re.compile(r"^\[[^\]]*\] \S+:\d+: Warning: (.*)$")
_LOCATION = re.compile(r"^\[[^\]]*\] \S+:\d+: ")
_capturing = threading.Lock()


def with_native_warnings(call: Callable[[], T]) -> tuple[T, list[str]]:
    """`call()` and the distinct warnings native code logged meanwhile.

    Everything written to stderr in that window, by any thread, is passed on to stderr afterwards, so
    nothing is lost; it may only come a few milliseconds late.
    """
    with _capturing, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            result = call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            written = sink.read()
            os.write(2, written)
    lines = written.decode(errors="replace").splitlines()
    return result, list(dict.fromkeys(m.group(1).strip() for line in lines if (m := _WARNING.match(line))))


def native_message(exc: BaseException) -> str:
    """An xgrammar error's message without its time stamp and source location."""
    text = str(exc).strip().splitlines()
    return _LOCATION.sub("", text[0]) if text else type(exc).__name__
