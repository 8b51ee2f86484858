"""zmq addresses and socket options both ends share (``zmq+ipc://path``, ``zmq+tcp://host:port``)."""

from __future__ import annotations

import ipaddress
import logging
import math
import os
from dataclasses import dataclass, field

import zmq
import zmq.auth

from transport.backends.url_params import single_params
from transport.errors import (
    ConnectError,
)
from transport.protocol import (
    BODY_OFFSET,
    HEADER_SIZE,
)

log = logging.getLogger("transport.zmq")

ZERO_COPY_THRESHOLD = 1 << 20
"""Bodies at least this large are sent with ``copy=False`` (libzmq reads the caller's buffer).

Measured (docs/zmq.md): tracking a zero-copy send costs ~40 us, more than copying 160 KB, so
below 1 MiB a copy into the zmq message is cheaper."""
DEFAULT_HEARTBEAT = 1.0
"""ZMTP heartbeat interval in seconds; a peer silent for 3 intervals is disconnected."""
MAX_HEARTBEAT = 86400.0
"""The longest ``?heartbeat=`` interval (a day: 3 intervals in ms still fit libzmq's int)."""
MAX_SESSIONS = 1024
"""Sessions a server keeps (least recently used beyond this are dropped; ROUTER sees no closes)."""

ENV_SERVER_SECRET = "TRANSPORT_ZMQ_SERVER_SECRET"
ENV_SERVER_PUBLIC = "TRANSPORT_ZMQ_SERVER_PUBLIC"
ENV_CLIENT_SECRET = "TRANSPORT_ZMQ_CLIENT_SECRET"
ENV_CLIENTS_DIR = "TRANSPORT_ZMQ_CLIENTS_DIR"
ENV_ALLOWED_CLIENTS = "TRANSPORT_ZMQ_ALLOWED_CLIENTS"

_PARAMS = {"server_key", "client_key", "clients", "allow_insecure", "heartbeat"}
_MONITOR_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_DISCARD = bytearray()
_SLICE_MS = 20
"""Blocking receives wait this long at most, then check the monitor and the deadline."""

Context = zmq.Context[zmq.Socket[bytes]]
Sock = zmq.Socket[bytes]


class ReceiveBuffer:
    """A growing buffer a body part is received into, at BODY_OFFSET (both zmq sides). The
    body view of a length is made once and handed on again while the buffer stays, so what a
    receiver builds over it (a session's STEP_BATCH actions array) is reused, not rebuilt."""

    def __init__(self, capacity: int) -> None:
        self.buffer = bytearray(BODY_OFFSET + capacity)
        self.generation = 0  # bumped when the buffer is replaced (views of the old one go stale)
        self._view = memoryview(self.buffer)
        self._body = self._view[BODY_OFFSET:BODY_OFFSET]

    def body(self, body_len: int) -> memoryview:
        """The buffer's ``body_len`` bytes at BODY_OFFSET (the same view for the same length)."""
        body = self._body
        if body.nbytes != body_len:
            body = self._body = self._view[BODY_OFFSET : BODY_OFFSET + body_len]
        return body

    def ensure_capacity(self, body_len: int) -> None:
        """Room for a body of ``body_len`` bytes (a new, larger buffer when there is none)."""
        needed = BODY_OFFSET + body_len
        if needed > len(self.buffer):
            self.buffer = bytearray(max(needed, 2 * len(self.buffer)))
            self._view = memoryview(self.buffer)
            self._body = self._view[BODY_OFFSET:BODY_OFFSET]
            self.generation += 1


# -- addresses ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    """A parsed zmq URL: ``transport`` is "ipc" or "tcp"; ``port`` 0 asks for any free port."""

    url: str
    transport: str
    path: str = ""
    host: str = ""
    port: int = 0
    params: dict[str, str] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        if self.transport == "ipc":
            return f"ipc://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port if self.port else '*'}"

    @property
    def is_loopback(self) -> bool:
        if self.transport == "ipc" or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def flag(self, name: str) -> bool:
        return self.params.get(name, "0").lower() in ("1", "true", "yes")

    def with_port(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = self.url.partition("?")[2]
        return f"zmq+tcp://{host}:{port}" + (f"?{query}" if query else "")


def parse_url(url: str) -> Address:
    """``zmq+ipc:///path[?...]`` or ``zmq+tcp://host:port[?...]`` (empty host: 127.0.0.1)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("zmq+ipc", "zmq+tcp"):
        raise ConnectError(f"{url!r} is not a zmq+ipc:// or zmq+tcp:// URL")
    location, _, query = rest.partition("?")
    params = single_params(url, query)
    for key in params:
        if key not in _PARAMS:
            known = ", ".join(sorted(_PARAMS))
            raise ConnectError(f"{url!r}: unknown query parameter {key!r} (known: {known})")
    if "heartbeat" in params:
        _heartbeat_seconds(params["heartbeat"])  # a bad interval is refused with the URL
    if scheme == "zmq+ipc":
        if not location:
            raise ConnectError(f"{url!r} names no socket path (expected zmq+ipc:///path)")
        if len(os.fsencode(location)) > 107:
            raise ConnectError(f"ipc path {location!r} is longer than the 107 bytes Linux allows")
        return Address(url, "ipc", path=location, params=params)
    host, colon, port_text = location.rpartition(":")
    if not colon:
        raise ConnectError(f"{url!r} names no port (expected zmq+tcp://host:port)")
    host = host.strip("[]") or "127.0.0.1"
    if port_text in ("*", ""):
        port = 0
    else:
        try:
            port = int(port_text)
        except ValueError:
            raise ConnectError(f"{url!r}: port {port_text!r} is not a number") from None
        if not 0 <= port <= 65535:
            raise ConnectError(f"{url!r}: port {port} is out of range")
    return Address(url, "tcp", host=host, port=port, params=params)


def _more(sock: Sock) -> bool:
    return bool(sock.getsockopt(zmq.RCVMORE))


SNDMORE = int(zmq.SNDMORE)
SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
"""Send flags as plain ints: combining pyzmq's enum flags costs ~1 us on every send."""


def _heartbeat_seconds(text: str) -> float:
    """``?heartbeat=SECONDS``: 0 (off) or 0.001..MAX_HEARTBEAT; anything else is refused."""
    try:
        seconds = float(text)
    except ValueError:
        raise ConnectError(f"heartbeat={text!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or not (seconds == 0 or 0.001 <= seconds <= MAX_HEARTBEAT):
        raise ConnectError(
            f"heartbeat={text!r} must be 0 (off) or 0.001..{MAX_HEARTBEAT:g} seconds"
        )
    return seconds


def _heartbeat_ms(address: Address) -> int:
    text = address.params.get("heartbeat")
    seconds = DEFAULT_HEARTBEAT if text is None else _heartbeat_seconds(text)
    return int(seconds * 1000)


def _common_options(sock: Sock, address: Address, max_body: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max(max_body, HEADER_SIZE))
    heartbeat = _heartbeat_ms(address)
    if heartbeat:
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * heartbeat)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 3 * heartbeat)
    if address.transport == "tcp" and ":" in address.host:
        sock.setsockopt(zmq.IPV6, 1)
