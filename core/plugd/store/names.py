"""Model names, `[host/][namespace/]model[:tag]`, with Ollama's defaults, characters and length limits."""

from __future__ import annotations

import re

from attrs import define

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# First character alphanumeric or underscore; then also '-', '_', and '.' (not in namespaces)
# and ':' (only in hosts, for a port). Lengths as in Ollama: host up to 350, others up to 80.
_PART = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
}


class InvalidName(ValueError):
    pass


@define(frozen=True)
class ModelName:
    host: str
    namespace: str
    model: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> ModelName:
        """Parse a user-supplied name, filling in defaults; raises InvalidName for anything malformed."""
        if not isinstance(text, str) or not text:
            raise InvalidName("model name is required")
        rest, tag = text, DEFAULT_TAG
        slash = rest.rfind("/")
        colon = rest.rfind(":")
        if colon > slash:
            rest, tag = rest[:colon], rest[colon + 1 :]
        parts = rest.split("/")
        if len(parts) > 3:
            raise InvalidName(f"invalid model name {text!r}: too many '/' separated parts")
        host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
        if len(parts) == 3:
            host, namespace, model = parts
        elif len(parts) == 2:
            namespace, model = parts
        else:
            (model,) = parts
        name = cls(host=host, namespace=namespace, model=model, tag=tag)
        for kind in ("host", "namespace", "model", "tag"):
            if not _PART[kind].fullmatch(getattr(name, kind)):
                raise InvalidName(f"invalid model name {text!r}: bad {kind} {getattr(name, kind)!r}")
        return cls(host=host.lower(), namespace=namespace.lower(), model=model.lower(), tag=tag.lower())

    @property
    def parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.model, self.tag)

    def display(self) -> str:
        """The short form Ollama shows: defaults left out, tag always present."""
        if self.host != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def __str__(self) -> str:
        return self.display()
