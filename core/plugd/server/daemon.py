"""`plugd serve`: bind the address, open the store, load plugins, run the app under uvicorn."""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import sys

import uvicorn

from plugd import __version__
from plugd.scratch import remove_orphans
from plugd.server.app import create_app
from plugd.server.cors import cors_config, origin_guard
from plugd.server.hosts import loopback_host_guard
from plugd.settings import Settings
from plugd.store.owner import StoreInUse, StoreOwner
from plugd.store.store import Store

log = logging.getLogger("plugd")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve() -> int:
    try:
        settings = Settings.from_environment()
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "httpcore"):  # the daemon's own calls to its runners and registries
        logging.getLogger(noisy).setLevel(logging.WARNING)
    host, port = settings.address
    try:
        sock = _bind(host, port)
    except OSError as exc:
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        print(f"Error: listen tcp {host}:{port}: {reason}", file=sys.stderr)
        return 1
    if orphans := remove_orphans():
        log.info("removed %d scratch folders of daemons that are gone", len(orphans))
    store = Store(settings.models)
    try:
        owner = StoreOwner(store.root)
        owner.claim(f"{host}:{port}")
    except StoreInUse as exc:
        sock.close()
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    if settings.prune:
        store.prune()
    else:
        store.blobs.remove_partials()
    registry = settings.load_plugins()
    log.info("models in %s; plugins: %s", store.root, ", ".join(f"{p.name} ({p.status})" for p in registry.plugins))
    app = origin_guard(create_app(store, registry, settings), cors_config(settings.origins))
    if ipaddress.ip_address(sock.getsockname()[0]).is_loopback:
        app = loopback_host_guard(app)
    # plugd names itself in every response's Server header (/api/version reports the Ollama API version instead).
    config = uvicorn.Config(app, log_config=None, server_header=False, headers=[("server", f"plugd/{__version__}")])
    server = uvicorn.Server(config)
    log.info("listening on %s:%d", host, port)
    server.run(sockets=[sock])
    return 0
