"""zmq+ipc:///path and zmq+tcp://host:port: the protocol's frames over ZeroMQ (docs/zmq.md).

One protocol frame is one two-part ZeroMQ message ``[header (9 bytes), body]``. The server is a
ROUTER (one Session per client routing id, any number of clients on one socket); the client is a
DEALER, so requests can be pipelined and a late reply to an abandoned request is recognised by
its msg_id and dropped. Receives go through ``zmq_recv`` (``Socket.recv_into``) straight into the
channel buffer at BODY_OFFSET: the one copy that remains is libzmq's message -> that buffer (the
header comes first, so body_len is checked against the maximum before the buffer grows). Sends
of bodies of ``ZERO_COPY_THRESHOLD`` bytes or more hand the buffer to libzmq without a copy.

Dead peers: a socket monitor reports disconnects (a closed or reset connection, or ZMTP
heartbeats that stopped); a disconnect while a request waits is ``PeerGoneError``, and no reply
by the deadline is ``TransportTimeoutError``. tcp can be encrypted and authenticated with CURVE;
``python -m transport.backends.zmq keygen DIR`` makes key pairs.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from transport.codec import Schema
from transport.errors import (
    BadFrameError,
    ConnectError,
    PeerGoneError,
    TransportTimeoutError,
)
from transport.protocol import (
    BODY_OFFSET,
    CLOSING_ERRORS,
    DEFAULT_MAX_BODY,
    HEADER,
    HEADER_SIZE,
    ErrorCode,
    MessageIds,
    encode_error,
)
from transport.server import Session
from transport.sockets import claim_unix_path

log = logging.getLogger("transport.zmq")

ZERO_COPY_THRESHOLD = 1 << 20
"""Bodies at least this large are sent with ``copy=False`` (libzmq reads the caller's buffer).

Measured (docs/zmq.md): tracking a zero-copy send costs ~40 us, more than copying 160 KB, so
below 1 MiB a copy into the zmq message is cheaper."""
DEFAULT_HEARTBEAT = 1.0
"""ZMTP heartbeat interval in seconds; a peer silent for 3 intervals is disconnected."""
MAX_SESSIONS = 1024
"""Sessions a server keeps (least recently used beyond this are dropped; ROUTER sees no closes)."""
ERROR_MSG_TYPE = 0x0F

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
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in _PARAMS:
            known = ", ".join(sorted(_PARAMS))
            raise ConnectError(f"{url!r}: unknown query parameter {key!r} (known: {known})")
        params[key] = value
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


def _heartbeat_ms(address: Address) -> int:
    text = address.params.get("heartbeat")
    try:
        seconds = DEFAULT_HEARTBEAT if text is None else float(text)
    except ValueError:
        raise ConnectError(f"heartbeat={text!r} is not a number of seconds") from None
    return max(0, int(seconds * 1000))


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


# -- CURVE keys -----------------------------------------------------------------------------------


def _z85_key(text: str, what: str) -> bytes:
    key = text.strip().encode("ascii", "replace")
    try:
        if len(key) != 40 or len(z85.decode(key)) != 32:
            raise ValueError("wrong length")
    except (ValueError, KeyError) as exc:
        raise ConnectError(f"{what} is not a 40-character Z85 CURVE key ({exc})") from None
    return key


def _load_key_file(path: str, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConnectError(f"cannot read the CURVE key file {path}: {exc}") from None
    if secret and secret_key is None:
        raise ConnectError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret_key


def _allowed_clients(address: Address) -> set[bytes]:
    allowed: set[bytes] = set()
    directory = address.params.get("clients") or os.environ.get(ENV_CLIENTS_DIR)
    if directory:
        if not os.path.isdir(directory):
            raise ConnectError(f"the allowed-clients directory {directory} does not exist")
        allowed.update(key for key in zmq.auth.load_certificates(directory))
    for text in os.environ.get(ENV_ALLOWED_CLIENTS, "").split(","):
        if text.strip():
            allowed.add(_z85_key(text, f"a key in {ENV_ALLOWED_CLIENTS}"))
    return allowed


def server_curve(address: Address) -> tuple[bytes, bytes, set[bytes]] | None:
    """(public, secret, allowed client public keys) when this server uses CURVE, else None."""
    if address.transport != "tcp":
        if "server_key" in address.params or "clients" in address.params:
            raise ConnectError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode")
        return None
    path = address.params.get("server_key")
    if path:
        public, secret = _load_key_file(path, secret=True)
        assert secret is not None
    elif os.environ.get(ENV_SERVER_SECRET):
        secret = _z85_key(os.environ[ENV_SERVER_SECRET], ENV_SERVER_SECRET)
        public = zmq.curve_public(secret)
    else:
        return None
    allowed = _allowed_clients(address)
    if not allowed:
        raise ConnectError(
            "a CURVE server needs the public keys of the clients it admits: "
            f"?clients=DIR, {ENV_CLIENTS_DIR}=DIR or {ENV_ALLOWED_CLIENTS}=KEY,KEY"
        )
    return public, secret, allowed


def client_curve(address: Address) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) when this client uses CURVE, else None."""
    if address.transport != "tcp":
        if "server_key" in address.params or "client_key" in address.params:
            raise ConnectError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode")
        return None
    path = address.params.get("server_key")
    if path:
        server_public, _ = _load_key_file(path, secret=False)
    elif os.environ.get(ENV_SERVER_PUBLIC):
        server_public = _z85_key(os.environ[ENV_SERVER_PUBLIC], ENV_SERVER_PUBLIC)
    else:
        server_public = b""
    path = address.params.get("client_key")
    client_secret: bytes | None
    if path:
        client_public, client_secret = _load_key_file(path, secret=True)
    elif os.environ.get(ENV_CLIENT_SECRET):
        client_secret = _z85_key(os.environ[ENV_CLIENT_SECRET], ENV_CLIENT_SECRET)
        client_public = zmq.curve_public(client_secret)
    else:
        client_secret = None
        client_public = b""
    if not server_public and client_secret is None:
        return None
    if not server_public:
        raise ConnectError(
            "a CURVE client needs the server's public key "
            f"(?server_key=FILE or {ENV_SERVER_PUBLIC})"
        )
    if client_secret is None:
        raise ConnectError(
            f"a CURVE client needs its own key pair (?client_key=FILE or {ENV_CLIENT_SECRET})"
        )
    return server_public, client_public, client_secret


class _AllowList:
    """ZAP credentials provider: admits exactly the listed client public keys."""

    def __init__(self, allowed: set[bytes]) -> None:
        self.allowed = frozenset(allowed)

    def callback(self, domain: str, key: bytes) -> bool:
        admitted = key in self.allowed
        if not admitted:
            log.warning("refused a CURVE client with key %s", key.decode("ascii", "replace"))
        return admitted


# -- client ---------------------------------------------------------------------------------------

_client_context: Context | None = None
_client_context_pid = 0
_client_context_lock = threading.Lock()


def client_context() -> Context:
    """One ZeroMQ context for every client channel of this process (a fresh one after fork)."""
    global _client_context, _client_context_pid
    with _client_context_lock:
        if _client_context is None or _client_context_pid != os.getpid():
            _client_context = zmq.Context(io_threads=1)
            _client_context_pid = os.getpid()
        return _client_context


def _describe_failure(event: int, value: int) -> str:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the server refused this client's CURVE key (ZAP status {value})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return "the ZMTP handshake failed (CURVE on one side only, or the wrong server key?)"
    return "the ZMTP handshake failed (wrong server key, or not a ZeroMQ server?)"


class ZmqChannel:
    """The client side: a DEALER whose replies are matched to requests by msg_id.

    ``send_request`` and ``recv_response`` split ``request`` so callers can pipeline (send to
    several servers, then wait); a reply whose msg_id is not the awaited one is discarded.
    """

    def __init__(
        self,
        address: Address,
        *,
        timeout: float | None,
        max_body: int = DEFAULT_MAX_BODY,
        context: Context | None = None,
        capacity: int = 64 << 10,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.max_body = max_body
        self.info: dict[str, Any] = {}
        self._buffer = bytearray(BODY_OFFSET + capacity)
        self._view = memoryview(self._buffer)
        self._generation = 0
        self._header = bytearray(HEADER_SIZE)
        self._next_id = 1
        self._connected = False
        self._lost = False  # a connection we had went away; reported once
        self._failure = ""
        self._tracker: zmq.MessageTracker | None = None
        self._closed = False
        curve = client_curve(address)
        ctx = context or client_context()
        sock: Sock = ctx.socket(zmq.DEALER)
        try:
            _common_options(sock, address, max_body)
            sock.setsockopt(zmq.ROUTING_ID, b"T" + uuid.uuid4().bytes)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # never queue a request for a server not there
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            if curve is not None:
                server_public, client_public, client_secret = curve
                sock.curve_serverkey = server_public
                sock.curve_publickey = client_public
                sock.curve_secretkey = client_secret
            self._monitor: Sock = sock.get_monitor_socket(_MONITOR_EVENTS)
            sock.connect(address.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise ConnectError(f"cannot connect to {address.endpoint}: {exc}") from exc
        sock.setsockopt(zmq.RCVTIMEO, _SLICE_MS)
        self._sock = sock

    # -- Channel ---------------------------------------------------------------------------------

    @property
    def buffer(self) -> bytearray:
        return self._buffer

    @property
    def generation(self) -> int:
        return self._generation

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        msg_id = self.send_request(msg_type, body, deadline)
        return self.recv_response(msg_id, deadline)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(0)
        self._sock.close(0)

    # -- pipelining ------------------------------------------------------------------------------

    def send_request(self, msg_type: int, body: Any, deadline: float | None = None) -> int:
        """Queue one request; returns its msg_id. Waits for a connection until the deadline."""
        self._drain_monitor()
        self._raise_if_lost()
        msg_id = self._next_id
        self._next_id = (msg_id + 1) & 0xFFFFFFFF or 1
        view = memoryview(body)
        HEADER.pack_into(self._header, 0, msg_type, msg_id, view.nbytes)
        if self._tracker is not None and not self._tracker.done:
            self._wait_tracker(deadline)
        while True:
            try:
                self._sock.send(self._header, zmq.SNDMORE | zmq.NOBLOCK)
                break
            except zmq.Again:
                self._wait_monitor(deadline, "send")
        if view.nbytes >= ZERO_COPY_THRESHOLD:
            self._tracker = self._sock.send(view, copy=False, track=True)
        else:
            self._sock.send(view)
        return msg_id

    def recv_response(self, msg_id: int, deadline: float | None = None) -> tuple[int, memoryview]:
        """The reply to ``msg_id``: (msg_type, body view valid until the next receive).

        Receives block for at most ``_SLICE_MS`` (no zmq_poll on the hot path); between slices
        the monitor is read (a disconnect is PeerGoneError) and the deadline checked.
        """
        while True:
            try:
                resp_type, resp_id, body_len = self._recv_frame()
            except zmq.Again:
                self._drain_monitor()
                self._raise_if_lost()
            else:
                if resp_id == msg_id:
                    return resp_type, self._view[BODY_OFFSET : BODY_OFFSET + body_len]
                log.debug("discarded a stale reply (msg_id %d, awaiting %d)", resp_id, msg_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise TransportTimeoutError(
                    f"no reply from {self.address.endpoint} within {self.timeout:.3g} s"
                )

    # -- internals -------------------------------------------------------------------------------

    def _recv_frame(self) -> tuple[int, int, int]:
        sock = self._sock
        n = sock.recv_into(self._header)
        if n != HEADER_SIZE or not _more(sock):
            self._drain_parts()
            raise BadFrameError(f"reply header part is {n} bytes, or has no body part")
        msg_type, msg_id, body_len = HEADER.unpack_from(self._header, 0)
        if body_len > self.max_body:
            self._drain_parts()
            error = BadFrameError(f"reply body_len {body_len} exceeds the maximum {self.max_body}")
            error.msg_id = msg_id
            raise error
        self._ensure_capacity(body_len)
        got = sock.recv_into(self._view[BODY_OFFSET : BODY_OFFSET + body_len])
        if got != body_len or _more(sock):
            self._drain_parts()
            raise BadFrameError(f"reply body part is {got} bytes, its header says {body_len}")
        return msg_type, msg_id, body_len

    def _drain_parts(self) -> None:
        while _more(self._sock):
            self._sock.recv_into(_DISCARD)

    def _ensure_capacity(self, body_len: int) -> None:
        needed = BODY_OFFSET + body_len
        if needed > len(self._buffer):
            self._buffer = bytearray(max(needed, 2 * len(self._buffer)))
            self._view = memoryview(self._buffer)
            self._generation += 1

    def _drain_monitor(self) -> None:
        monitor = self._monitor
        while int(monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            event = recv_monitor_message(monitor)
            kind = int(event["event"])
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected = True
                self._failure = ""
            elif kind == zmq.EVENT_DISCONNECTED:
                if self._connected:
                    self._lost = True
                self._connected = False
            else:
                self._failure = _describe_failure(kind, int(event["value"]))

    def _raise_if_lost(self) -> None:
        if self._lost:
            self._lost = False
            raise PeerGoneError(
                f"the connection to {self.address.endpoint} was closed or its heartbeats stopped"
            )

    def _wait_monitor(self, deadline: float | None, what: str) -> None:
        """Wait for a connection event (or 50 ms); raise when the deadline has passed."""
        self._raise_if_lost()
        if deadline is not None and time.monotonic() >= deadline:
            if self._connected:
                raise TransportTimeoutError(f"could not {what} to {self.address.endpoint} in time")
            detail = f": {self._failure}" if self._failure else ""
            raise PeerGoneError(f"no connection to {self.address.endpoint}{detail}")
        if self._monitor.poll(50):
            self._drain_monitor()

    def _wait_tracker(self, deadline: float | None) -> None:
        tracker = self._tracker
        assert tracker is not None
        while not tracker.done:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TransportTimeoutError("the previous large request is still being sent")
            try:
                tracker.wait(0.05 if remaining is None else min(0.05, remaining))
            except zmq.NotDone:
                pass

    def wait_connected(self, deadline: float) -> None:
        """Block until the ZMTP handshake with the server succeeds (ConnectError otherwise)."""
        while not self._connected:
            self._drain_monitor()
            if self._connected:
                return
            if self._failure.startswith("the server refused"):
                raise ConnectError(f"{self.address.endpoint}: {self._failure}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                detail = f"; last failure: {self._failure}" if self._failure else ""
                raise ConnectError(
                    f"nothing accepted a ZeroMQ connection on {self.address.endpoint}{detail}"
                )
            self._monitor.poll(max(1, int(min(remaining, 0.1) * 1000)))


def open_channel(
    url: str,
    *,
    timeout: float | None,
    max_body: int = DEFAULT_MAX_BODY,
    schema: Schema | None = None,
) -> ZmqChannel:
    """Connect a DEALER and wait (until the deadline) for the handshake with the server."""
    address = parse_url(url)
    channel = ZmqChannel(address, timeout=timeout, max_body=max_body)
    try:
        channel.wait_connected(time.monotonic() + (timeout if timeout is not None else 10.0))
    except BaseException:
        channel.close()
        raise
    return channel


# -- server ---------------------------------------------------------------------------------------


class Listener:
    """A ROUTER socket serving every client; one Session per client routing id.

    One thread receives, handles and replies in turn (the env work dominates; libzmq's I/O
    thread moves the bytes). A HELLO from a client that already said hello starts a fresh
    Session. Errors that close a stream connection drop the session instead (a ROUTER cannot
    close one peer): the client must HELLO again.
    """

    def __init__(
        self,
        url: str,
        sessions: Callable[[], Session],
        *,
        max_body: int = DEFAULT_MAX_BODY,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.address = parse_url(url)
        self.url = url
        self.sessions = sessions
        self.max_body = max_body
        self.max_sessions = max_sessions
        schema = getattr(sessions, "schema", None)
        self._error_type = (
            MessageIds.from_schema(schema.ir).ERROR
            if isinstance(schema, Schema)
            else ERROR_MSG_TYPE
        )
        self._ctx: Context | None = None
        self._sock: Sock | None = None
        self._auth: ThreadAuthenticator | None = None
        self._inode: int | None = None
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()
        self._trackers: dict[bytes, zmq.MessageTracker] = {}
        self._buffer = bytearray(BODY_OFFSET + (64 << 10))
        self._view = memoryview(self._buffer)
        self._header = bytearray(HEADER_SIZE)
        self._lock = threading.Lock()
        self._closed = False
        self._running = False
        self._done = threading.Event()

    def start(self) -> None:
        """Bind now; refuses a live ipc path or a tcp port in use, and insecure remote binds."""
        address = self.address
        curve = server_curve(address)
        if address.transport == "tcp" and not address.is_loopback and curve is None:
            if not address.flag("allow_insecure"):
                raise ConnectError(
                    f"refusing to bind {address.host} without CURVE keys: anyone who can reach "
                    "it could drive the envs; give ?server_key=FILE&clients=DIR (or "
                    f"{ENV_SERVER_SECRET}) or add ?allow_insecure=1"
                )
        if address.transport == "ipc":
            claim_unix_path(address.path)
        ctx: Context = zmq.Context(io_threads=1)
        sock: Sock = ctx.socket(zmq.ROUTER)
        try:
            _common_options(sock, address, self.max_body)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting client keeps its session
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a gone client raises
            if curve is not None:
                public, secret, allowed = curve
                auth = ThreadAuthenticator(ctx, log=logging.getLogger("transport.zmq.auth"))
                auth.start()
                auth.configure_curve_callback("*", _AllowList(allowed))
                self._auth = auth
                sock.curve_server = True
                sock.curve_publickey = public
                sock.curve_secretkey = secret
            self._bind(sock, address)
        except BaseException:
            sock.close(0)
            if self._auth is not None:
                self._auth.stop()
                self._auth = None
            ctx.term()
            raise
        self._ctx, self._sock = ctx, sock

    def _bind(self, sock: Sock, address: Address) -> None:
        old = os.umask(0o177) if address.transport == "ipc" else None
        try:
            sock.bind(address.endpoint)
        except zmq.ZMQError as exc:
            where = address.path or f"{address.host}:{address.port}"
            if exc.errno == errno.EADDRINUSE:
                raise ConnectError(f"{where} is in use (EADDRINUSE)") from exc
            raise ConnectError(f"cannot bind {where}: {exc}") from exc
        finally:
            if old is not None:
                os.umask(old)
        if address.transport == "ipc":
            os.chmod(address.path, 0o600)
            self._inode = os.stat(address.path).st_ino
        else:
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.url = address.with_port(int(endpoint.rpartition(":")[2]))

    def serve_forever(self) -> None:
        sock = self._sock
        assert sock is not None, "call start() first"
        with self._lock:
            if self._closed:
                return
            self._running = True
        try:
            sock.setsockopt(zmq.RCVTIMEO, 100)  # wake up to notice close()
            while not self._closed:
                try:
                    identity = sock.recv()
                except zmq.Again:
                    continue
                self._serve_one(sock, identity)
        except zmq.ZMQError:
            if not self._closed:
                raise
        finally:
            self._done.set()

    def _serve_one(self, sock: Sock, identity: bytes) -> None:
        """Receive the rest of one message from ``identity``, handle it and answer."""
        if not _more(sock):
            return
        n = sock.recv_into(self._header)
        envelope = n == 0 and _more(sock)  # a REQ client: echo its empty delimiter
        if envelope:
            n = sock.recv_into(self._header)
        problem: tuple[ErrorCode, str] | None = None
        msg_type = msg_id = body_len = 0
        if n >= HEADER_SIZE:
            msg_type, msg_id, body_len = HEADER.unpack_from(self._header, 0)
        if n != HEADER_SIZE:
            problem = (ErrorCode.BAD_FRAME, f"the header part is {n} bytes, expected 9")
        elif body_len > self.max_body:
            problem = (
                ErrorCode.BODY_TOO_LARGE,
                f"body_len {body_len} exceeds the maximum {self.max_body}",
            )
        if _more(sock):
            if problem is None:
                self._ensure_capacity(body_len)
                got = sock.recv_into(self._view[BODY_OFFSET : BODY_OFFSET + body_len])
                if got != body_len:
                    problem = (
                        ErrorCode.BAD_FRAME,
                        f"the body part is {got} bytes, its header says {body_len}",
                    )
            else:
                sock.recv_into(_DISCARD)
            if _more(sock):
                while _more(sock):
                    sock.recv_into(_DISCARD)
                problem = problem or (ErrorCode.BAD_FRAME, "a frame is [header, body]: 2 parts")
        elif problem is None and body_len:
            problem = (ErrorCode.BAD_FRAME, f"header says {body_len} body bytes, no body part")
        if problem is not None:
            code, text = problem
            if code in CLOSING_ERRORS:
                self._drop(identity)
            self._reply(
                sock, identity, envelope, self._error_type, msg_id, encode_error(code, text)
            )
            return
        session = self._session_for(identity, msg_type)
        if session is None:
            body = encode_error(ErrorCode.INTERNAL, "the server could not create a session")
            self._reply(sock, identity, envelope, self._error_type, msg_id, body)
            return
        tracker = self._trackers.pop(identity, None)
        if tracker is not None and not tracker.done:
            try:  # a zero-copy reply still reads the session's buffer: let it finish
                tracker.wait(5.0)
            except zmq.NotDone:
                log.warning("dropping a session whose client does not read its replies")
                self._drop(identity)
                return
        resp_type, resp = session.handle(msg_type, self._view[BODY_OFFSET : BODY_OFFSET + body_len])
        if session.closing:
            self._drop(identity)
        sent = self._reply(sock, identity, envelope, resp_type, msg_id, resp)
        if sent is not None:
            self._trackers[identity] = sent

    def _session_for(self, identity: bytes, msg_type: int) -> Session | None:
        session = self._sessions.get(identity)
        if session is not None:
            if not (session.hello_done and msg_type == session.ids.HELLO_REQ):
                self._sessions.move_to_end(identity)
                return session
            del self._sessions[identity]  # a second HELLO: a fresh session, fresh envs
        try:
            session = self.sessions()
        except Exception:
            log.exception("cannot create a session for a new client on %s", self.url)
            return None
        self._sessions[identity] = session
        while len(self._sessions) > self.max_sessions:
            old, _ = self._sessions.popitem(last=False)
            self._trackers.pop(old, None)
            log.info("dropped the least recently used session (over %d)", self.max_sessions)
        return session

    def _drop(self, identity: bytes) -> None:
        self._sessions.pop(identity, None)

    def _reply(
        self,
        sock: Sock,
        identity: bytes,
        envelope: bool,
        msg_type: int,
        msg_id: int,
        body: memoryview | bytes,
    ) -> zmq.MessageTracker | None:
        view = memoryview(body)
        header = HEADER.pack(msg_type, msg_id, view.nbytes)
        try:
            sock.send(identity, zmq.SNDMORE | zmq.NOBLOCK)
            if envelope:
                sock.send(b"", zmq.SNDMORE)
            sock.send(header, zmq.SNDMORE)
            if view.nbytes >= ZERO_COPY_THRESHOLD and isinstance(body, memoryview):
                return sock.send(view, copy=False, track=True)
            sock.send(view)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:  # the client is gone: so is its session
                self._drop(identity)
            else:  # EAGAIN: its queue is full (a client that stopped reading)
                log.warning("dropped a reply to a client whose queue is full: %s", exc)
        return None

    def _ensure_capacity(self, body_len: int) -> None:
        needed = BODY_OFFSET + body_len
        if needed > len(self._buffer):
            self._buffer = bytearray(max(needed, 2 * len(self._buffer)))
            self._view = memoryview(self._buffer)

    def close(self) -> None:
        """Stop serving, close the socket and remove the ipc file (if still ours)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = self._running
        if running:
            self._done.wait(5.0)
        if self._sock is not None:
            self._sock.close(0)
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()
        self._sessions.clear()
        self._trackers.clear()
        if self.address.transport == "ipc" and self._inode is not None:
            try:
                if os.stat(self.address.path).st_ino == self._inode:
                    os.unlink(self.address.path)
            except FileNotFoundError:
                pass


# -- keys -----------------------------------------------------------------------------------------


def keygen(directory: str, names: list[str], *, force: bool = False) -> list[dict[str, str]]:
    """Create CURVE key pairs ``DIR/NAME.key`` (public) and ``DIR/NAME.key_secret`` (0600)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    made = []
    for name in names:
        secret_path = os.path.join(directory, f"{name}.key_secret")
        if os.path.exists(secret_path) and not force:
            raise ConnectError(f"{secret_path} exists (pass --force to replace it)")
        public_file, secret_file = zmq.auth.create_certificates(directory, name)
        os.chmod(secret_file, 0o600)
        public, secret = zmq.auth.load_certificate(secret_file)
        assert secret is not None
        made.append(
            {
                "name": name,
                "public_file": str(public_file),
                "secret_file": str(secret_file),
                "public_key": public.decode("ascii"),
            }
        )
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transport.backends.zmq",
        description="ZeroMQ backend tools. keygen: create CURVE key pairs for zmq+tcp.",
        epilog=(
            "Server: zmq+tcp://0.0.0.0:5555?server_key=DIR/server.key_secret&clients=DIR/clients"
            "  Client: zmq+tcp://HOST:5555?server_key=DIR/server.key&client_key="
            "DIR/client.key_secret (copy client.key into the server's clients directory)."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("keygen", help="create NAME.key and NAME.key_secret in DIR")
    gen.add_argument("directory", metavar="DIR")
    gen.add_argument(
        "--name", action="append", help="key pair name (repeatable; default: server, client)"
    )
    gen.add_argument("--force", action="store_true", help="replace existing key files")
    gen.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    try:
        made = keygen(args.directory, args.name or ["server", "client"], force=args.force)
    except (ConnectError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(made, indent=2))
    else:
        for entry in made:
            print(f"{entry['name']}: {entry['secret_file']} (public key {entry['public_key']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
