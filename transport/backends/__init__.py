"""Backend registry: one module per URL scheme, imported on first use.

A backend module provides ``open_channel(url, *, timeout, max_body, schema) -> Channel`` (client)
and ``Listener(url, sessions, *, max_body)`` (server side: ``start()``, ``serve_forever()``,
``close()``, ``url``). Adding a backend is adding a module and a line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from transport.errors import ConnectError

BACKENDS: dict[str, str] = {
    "unix": "transport.backends.unix",
    "http": "transport.backends.http",
    "zmq+ipc": "transport.backends.zmq",
    "zmq+tcp": "transport.backends.zmq",
    "shm": "transport.backends.shm",
    "auto": "transport.backends.auto",
}


def scheme_of(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConnectError(f"{url!r} is not a URL: expected scheme://address")
    return scheme.lower()


def backend_for(url: str) -> ModuleType:
    """The backend module serving ``url``'s scheme."""
    scheme = scheme_of(url)
    module = BACKENDS.get(scheme)
    if module is None:
        known = ", ".join(f"{s}://" for s in sorted(BACKENDS))
        raise ConnectError(f"no backend for {scheme}:// (known: {known})")
    return importlib.import_module(module)
