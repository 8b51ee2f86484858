"""``auto://name``: pick the fastest backend a server named ``name`` is reachable on.

Tried in order (seed 000, 6.3b/c), the first that connects wins:

1. ``shm://name``: when the region ``/dev/shm/transport-name`` exists;
2. ``unix://$XDG_RUNTIME_DIR/transport-name.sock``, then ``unix:///tmp/transport-name.sock``:
   when the socket file exists;
3. ``http://127.0.0.1:$TRANSPORT_HTTP_PORT`` (default 8080; ``auto://name?port=P`` overrides).

Each choice and each skipped candidate (with the reason) is logged at INFO on the
``transport.backends.auto`` logger. When none connects, ``ConnectError`` lists every reason.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import parse_qsl

from transport.client import DEFAULT_TIMEOUT, Client
from transport.codec import Schema
from transport.errors import ConnectError, TransportError
from transport.protocol import AutoReset

log = logging.getLogger(__name__)

DEFAULT_HTTP_PORT = 8080
HTTP_PORT_ENV = "TRANSPORT_HTTP_PORT"


def candidates(url: str) -> list[tuple[str, str]]:
    """(candidate URL, reason to skip it or "") in the order ``connect`` tries them."""
    name, params = _parse(url)
    out: list[tuple[str, str]] = []
    shm_path = f"/dev/shm/transport-{name}"
    shm_url = f"shm://{name}"
    out.append((shm_url, "" if os.path.exists(shm_path) else f"no shared-memory region {shm_path}"))
    dirs = [os.environ.get("XDG_RUNTIME_DIR", ""), "/tmp"]
    for directory in dict.fromkeys(d for d in dirs if d):
        path = os.path.join(directory, f"transport-{name}.sock")
        out.append((f"unix://{path}", "" if os.path.exists(path) else f"no socket file {path}"))
    port = params.get("port") or os.environ.get(HTTP_PORT_ENV) or str(DEFAULT_HTTP_PORT)
    out.append((f"http://127.0.0.1:{port}", ""))
    return out


def connect(
    url: str,
    *,
    schema: Schema,
    timeout: float | None = DEFAULT_TIMEOUT,
    autoreset: AutoReset = AutoReset.DISABLED,
    max_body: int | None = None,
) -> Client:
    """Connect to the first candidate that answers (see the module docstring)."""
    from transport.api import connect as connect_url
    from transport.protocol import DEFAULT_MAX_BODY

    reasons: list[str] = []
    for candidate, skip in candidates(url):
        if skip:
            log.info("auto: skipped %s: %s", candidate, skip)
            reasons.append(f"{candidate}: {skip}")
            continue
        try:
            client = connect_url(
                candidate,
                schema,
                timeout=timeout,
                autoreset=autoreset,
                max_body=max_body or DEFAULT_MAX_BODY,
            )
        except TransportError as exc:
            log.info("auto: skipped %s: %s", candidate, exc)
            reasons.append(f"{candidate}: {exc}")
            continue
        log.info("auto: %s chose %s", url, candidate)
        return client
    raise ConnectError(f"{url}: no backend answered ({'; '.join(reasons)})")


class Listener:
    """``auto://`` names a server for clients only: servers listen on a concrete URL."""

    def __init__(self, url: str, sessions: Any, **_: Any) -> None:
        raise ConnectError(
            f"{url}: auto:// is for clients; serve on shm://NAME, unix:///tmp/transport-NAME.sock"
            " or http://127.0.0.1:PORT"
        )


def _parse(url: str) -> tuple[str, dict[str, str]]:
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "auto" or not sep:
        raise ConnectError(f"{url!r} is not an auto:// URL")
    name, _, query = rest.partition("?")
    name = name.strip("/")
    if not name or "/" in name:
        raise ConnectError(f"{url!r}: expected auto://NAME (a server name, no slashes)")
    params = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(params) - {"port"}
    if unknown:
        raise ConnectError(f"{url!r}: unknown parameter(s) {', '.join(sorted(unknown))}")
    return name, params
