"""schemathesis against a live daemon's OpenAPI document, request bodies included: every operation but those that
reach out to registries (pull, push), destroy what the run needs (delete) or stream raw bytes (blobs), with the
checks that no response is a server error and every one has the shape documented for its dialect."""

from __future__ import annotations

import re
import subprocess
import sys

from attrs import define

EXCLUDED = r"/api/(pull|push|delete|blobs.*)"


@define(frozen=True)
class FuzzRun:
    returncode: int
    output: str

    @property
    def requests(self) -> int:
        """Test cases schemathesis generated and sent."""
        found = re.search(r"(\d+) generated", self.output)
        return int(found.group(1)) if found else 0

    @property
    def server_errors(self) -> int:
        return len(re.findall(r"Server error", self.output))


def fuzz(url: str, examples: int, seed: int = 1, timeout: float = 1800) -> FuzzRun:
    """Run schemathesis's coverage and fuzzing phases, `examples` cases per operation at most, against `url`."""
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/schema/openapi.json",
               "--checks", "not_a_server_error,response_schema_conformance", "--max-examples", str(examples),
               "--exclude-path-regex", EXCLUDED, "--phases", "coverage,fuzzing", "--seed", str(seed),
               "--no-color"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return FuzzRun(done.returncode, done.stdout + done.stderr)
