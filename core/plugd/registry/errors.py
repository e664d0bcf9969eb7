"""Errors of registry transfers: each message says what went wrong and what the user can do about it."""

from __future__ import annotations

from plugd.errors import PlugdError


class RegistryError(PlugdError, RuntimeError):
    """A transfer failed; `status` is the HTTP status the daemon answers a non-streamed request with."""

    status = 502


class UnknownModel(RegistryError):
    status = 404


class UnsupportedFormat(RegistryError):
    """The registry holds the model in a format plugd does not run (Ollama's GGUF models)."""

    status = 400


class RegistryUnreachable(RegistryError):
    status = 502


class UnsafeTarget(RegistryError):
    """A redirect, upload location or token realm pointed somewhere plugd refuses to go."""

    status = 502


class AuthenticationFailed(RegistryError):
    status = 401


class BlobCorrupt(RegistryError):
    """A downloaded blob did not match its digest; the download was discarded."""

    status = 502


class DiskFull(RegistryError):
    status = 507


class TransferCancelled(RegistryError):
    """The client went away; what was downloaded so far stays for the next pull to resume."""

    status = 499
