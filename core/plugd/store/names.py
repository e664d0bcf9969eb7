"""Model names, `[host/][namespace/]model[:tag]`, with Ollama's defaults, characters and length limits."""

from __future__ import annotations

import re

from attrs import define

from plugd.errors import PlugdError

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# First character alphanumeric or underscore; then also '-', and '.' (not in namespaces) and ':' (only in
# hosts, for a port). Lengths as in Ollama. Both the patterns and the error messages are made from this.
_RULES = {"host": ("-.:", 350), "namespace": ("-", 80), "model": ("-.", 80), "tag": ("-.", 80)}
_PART = {kind: re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_{re.escape(extra)}]{{0,{length - 1}}}")
         for kind, (extra, length) in _RULES.items()}


def _rule(kind: str) -> str:
    extra, length = _RULES[kind]
    marks = ", ".join(f"'{c}'" for c in extra)
    return f"begin with a letter, digit or '_', then hold only those or {marks}; {length} characters at most"


class InvalidName(PlugdError, ValueError):
    status = 400


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
            part = getattr(name, kind)
            if not _PART[kind].fullmatch(part):
                subject = "it" if part == text else f"its {kind} {part!r}"  # a bare name is said once
                raise InvalidName(f"invalid model name {text!r}: {subject} must {_rule(kind)}")
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
