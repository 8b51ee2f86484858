"""``auto://name``: pick the fastest backend a server named ``name`` is reachable on.

Tried in order (seed 000, 6.3b/c), the first that connects wins:

1. ``shm://name``: when the region ``/dev/shm/transport-name`` exists;
2. ``unix://$XDG_RUNTIME_DIR/transport-name.sock``, then ``unix:///tmp/transport-name.sock``:
   when the socket file exists;
3. ``http://127.0.0.1:$TRANSPORT_HTTP_PORT`` (default 8080; ``auto://name?port=P`` overrides).

Each choice and each skipped candidate (with the reason) is logged at INFO on the
``transport.backends.auto`` logger. Only "nobody there" errors move on (``nobody_there``); a
server that answered with a refusal (fingerprint or version mismatch, region in use, a remote
error) ends the search with that error. When none connects, ``ConnectError`` lists every reason.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from transport.backends import backend_for
from transport.backends.base import Channel
from transport.backends.url_params import single_params
from transport.client import DEFAULT_TIMEOUT
from transport.codec import Schema, StructCodec
from transport.errors import (
    ConnectError,
    PeerGoneError,
    RegionInUseError,
    TransportError,
    TransportTimeoutError,
)
from transport.protocol import DEFAULT_MAX_BODY, MESSAGE_IDS, MessageIds, decode_error

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


def nobody_there(exc: TransportError) -> bool:
    """Whether an error says only that no server is at a candidate (nothing listens, a stale
    region or socket, a silent or vanished peer): the search moves on. Any other error proves a
    server answered (a fingerprint or version mismatch, a remote error, a region in use) and
    ends the search as it is."""
    if isinstance(exc, RegionInUseError):
        return False
    return isinstance(exc, ConnectError | PeerGoneError | TransportTimeoutError)


def open_channel(
    url: str,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_body: int = DEFAULT_MAX_BODY,
    schema: Schema | None = None,
) -> AutoChannel:
    """A channel that picks its backend at the handshake (see ``AutoChannel``)."""
    candidates(url)  # a bad URL fails here
    return AutoChannel(url, schema, timeout, max_body)  # None: each candidate discovers


class AutoChannel:
    """The first candidate (module docstring) that opens and answers the HELLO becomes the
    channel every later request goes to; each skipped candidate is logged with its reason."""

    def __init__(
        self, url: str, schema: Schema | None, timeout: float | None, max_body: int
    ) -> None:
        self.url = url
        self.info: dict[str, Any] = {}
        self.schema = schema
        self.timeout = timeout
        self.max_body = max_body
        self.chosen: Channel | None = None

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        if self.chosen is not None:
            return self.chosen.request(msg_type, body)
        return self._choose(msg_type, body)

    def _choose(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        ids = MESSAGE_IDS if self.schema is None else MessageIds.from_schema(self.schema.ir)
        if msg_type != ids.HELLO_REQ:
            raise ConnectError(f"{self.url}: send HELLO_REQ first (it chooses the backend)")
        reasons: list[str] = []
        for candidate, skip in candidates(self.url):
            if not skip:
                try:
                    channel = backend_for(candidate).open_channel(
                        candidate, timeout=self.timeout, max_body=self.max_body, schema=self.schema
                    )
                except TransportError as exc:
                    if not nobody_there(exc):
                        raise
                    skip = str(exc)
            if skip:
                log.info("auto: skipped %s: %s", candidate, skip)
                reasons.append(f"{candidate}: {skip}")
                continue
            try:
                resp_type, resp = channel.request(msg_type, body)
                if resp_type != ids.HELLO_RESP:
                    raise decode_error(resp)
            except TransportError as exc:
                channel.close()
                if not nobody_there(exc):
                    raise  # a server answered: its refusal is the answer, as it is
                log.info("auto: skipped %s: %s", candidate, exc)
                reasons.append(f"{candidate}: {exc}")
                continue
            log.info("auto: %s chose %s", self.url, candidate)
            self.chosen, self.url = channel, candidate
            return resp_type, resp
        raise ConnectError(f"{self.url}: no backend answered ({'; '.join(reasons)})")

    def _channel(self) -> Channel:
        if self.chosen is None:
            raise ConnectError(f"{self.url}: no backend chosen yet (send HELLO_REQ first)")
        return self.chosen

    def request_area(self, codec: StructCodec, count: int) -> tuple[np.ndarray, Any]:
        return self._channel().request_area(codec, count)

    def result_records(
        self, body: memoryview, codec: StructCodec, count: int | None, finals: bool
    ) -> np.ndarray:
        return self._channel().result_records(body, codec, count, finals)

    def final_records(self) -> list[tuple[int, np.ndarray]]:
        return self._channel().final_records()

    def close(self) -> None:
        if self.chosen is not None:
            self.chosen.close()


class Listener:
    """``auto://`` names a server for clients only: servers listen on a concrete URL."""

    def __init__(self, url: str, host: Any, **_: Any) -> None:
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
    params = single_params(url, query)
    unknown = set(params) - {"port"}
    if unknown:
        raise ConnectError(f"{url!r}: unknown parameter(s) {', '.join(sorted(unknown))}")
    return name, params
