"""The zmq server: one ROUTER socket, one thread, one ``Session`` per client routing id."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from transport.backends.socket_listener import SWEEP_INTERVAL, ServerLimits
from transport.backends.sockets import LISTEN_BACKLOG, claim_unix_path
from transport.backends.zmq.curve import (
    _AllowList,
    server_curve,
)
from transport.backends.zmq.wire import (
    _DISCARD,
    ENV_SERVER_SECRET,
    MAX_SESSIONS,
    SNDMORE,
    SNDMORE_NOBLOCK,
    ZERO_COPY_THRESHOLD,
    Address,
    Context,
    ReceiveBuffer,
    Sock,
    _common_options,
    _more,
    log,
    parse_url,
)
from transport.errors import (
    ConnectError,
)
from transport.protocol import (
    CLOSING_ERRORS,
    DEFAULT_MAX_BODY,
    HEADER,
    HEADER_SIZE,
    ErrorCode,
    MessageIds,
    encode_error,
    is_goodbye,
)
from transport.runtime.host import EnvHost
from transport.runtime.session import Session, cannot_make_envs

# -- server ---------------------------------------------------------------------------------------

WAKE_MS = 100
"""The serving thread's receive timeout: it wakes at least this often to notice ``close()`` and
sessions past their idle timeout."""

BUILD_WAKE_MS = 5
"""The receive timeout while a session is being made: a made session's HELLO is answered within
this long of its being ready, on a quiet socket."""

BUILDERS = 4
"""Threads that make new sessions (their envs, their worker pools) and close dropped ones, off
the serving thread; more wait their turn."""


class _Build:
    """A session being made for a client's HELLO (by a builder thread); the serving thread
    answers the HELLO when it is ready, or closes it when the client has left meanwhile."""

    __slots__ = ("envelope", "error", "future", "hello", "identity", "msg_id", "session")

    def __init__(self, identity: bytes, envelope: bool, msg_id: int, hello: bytes) -> None:
        self.identity = identity
        self.envelope = envelope
        self.msg_id = msg_id
        self.hello = hello
        self.session: Session | None = None
        self.error: str | None = None
        self.future: Future[None] | None = None


class Listener:
    """A ROUTER socket serving every client; one Session per client routing id.

    One thread receives, handles and replies in turn (the env work dominates; libzmq's I/O
    thread moves the bytes). A new client's session (its envs, a worker pool's processes) is
    made by a builder thread while the other clients are served, and its HELLO answered when it
    is ready; a dropped session is closed by one too. A HELLO from a client that already said
    hello starts a fresh Session. Errors that close a stream connection drop the session instead
    (a ROUTER cannot close one peer): the client must HELLO again. A session that sent nothing
    for ``idle_timeout`` seconds is closed (a ROUTER is not told when a peer dies): its client's
    next request gets HELLO_REQUIRED.
    """

    def __init__(
        self,
        url: str,
        host: EnvHost,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        max_sessions: int = MAX_SESSIONS,
        idle_timeout: float = ServerLimits.idle_timeout,
    ) -> None:
        ServerLimits(idle_timeout=idle_timeout)  # a positive number of seconds, or ValueError
        self.address = parse_url(url)
        self.url = url
        self.host = host
        self.max_body = max_body
        self.max_sessions = max_sessions
        self.idle_timeout = float(idle_timeout)
        ids = MessageIds.from_schema(host.schema.ir)
        self._error_type = ids.ERROR
        self._hello_type = ids.HELLO_REQ
        self._ctx: Context | None = None
        self._sock: Sock | None = None
        self._auth: ThreadAuthenticator | None = None
        self._inode: int | None = None
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()  # least recently used first
        self._seen: dict[bytes, float] = {}  # each session's last request (time.monotonic)
        self._pending: dict[bytes, _Build] = {}  # sessions being made, by routing id
        self._built: deque[_Build] = deque()  # made (or failed), for the serving thread
        self._builders: ThreadPoolExecutor | None = None
        self._wake_ms = WAKE_MS
        self._trackers: dict[bytes, zmq.MessageTracker] = {}
        self._receive = ReceiveBuffer(64 << 10)
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
            sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)  # as the other servers (Node: 511)
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
            sock.setsockopt(zmq.RCVTIMEO, WAKE_MS)  # wake up to notice close() and idle sessions
            next_sweep = time.monotonic() + SWEEP_INTERVAL
            while not self._closed:
                try:
                    identity: bytes | None = sock.recv()
                except zmq.Again:
                    identity = None
                now = time.monotonic()
                if self._built:
                    self._finish_builds(sock, now)
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + SWEEP_INTERVAL
                if identity is not None:
                    self._serve_one(sock, identity, now)
                wake = BUILD_WAKE_MS if self._pending else WAKE_MS
                if wake != self._wake_ms:
                    sock.setsockopt(zmq.RCVTIMEO, wake)
                    self._wake_ms = wake
        except zmq.ZMQError:
            if not self._closed:
                raise
        finally:
            self._done.set()

    def _serve_one(self, sock: Sock, identity: bytes, now: float) -> None:
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
                self._receive.ensure_capacity(body_len)
                got = sock.recv_into(self._receive.body(body_len))
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
        body = self._receive.body(body_len)
        hello = msg_type == self._hello_type
        if hello and is_goodbye(body):
            self._trackers.pop(identity, None)
            self._drop(identity)  # the client left: its envs are closed now, not at LRU or idle
            return
        building = self._pending.get(identity)
        if building is not None:  # its session is being made
            if hello:  # again (a retry): this one is answered instead
                stale = (building.envelope, building.msg_id)
                building.envelope, building.msg_id, building.hello = envelope, msg_id, bytes(body)
                envelope, msg_id = stale
                text = "superseded by a later HELLO_REQ from this client"
            else:  # a client that does not wait for its HELLO_RESP
                text = "this client's session is being made: wait for the HELLO_RESP"
            error = encode_error(ErrorCode.HELLO_REQUIRED, text)
            self._reply(sock, identity, envelope, self._error_type, msg_id, error)
            return
        session = self._sessions.get(identity)
        if session is None or (hello and session.hello_done):
            if not hello:  # an unknown client (or one whose session was dropped): no session
                error = encode_error(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first")
                self._reply(sock, identity, envelope, self._error_type, msg_id, error)
                return
            if session is not None:  # a second HELLO: a fresh session, fresh envs
                self._trackers.pop(identity, None)
                self._drop(identity)
            self._build(identity, envelope, msg_id, bytes(body))
            return
        self._sessions.move_to_end(identity)
        self._seen[identity] = now
        self._answer(sock, identity, envelope, msg_id, session, msg_type, body)

    def _answer(
        self,
        sock: Sock,
        identity: bytes,
        envelope: bool,
        msg_id: int,
        session: Session,
        msg_type: int,
        body: memoryview,
    ) -> None:
        tracker = self._trackers.pop(identity, None)
        if tracker is not None and not tracker.done:
            try:  # a zero-copy reply still reads the session's buffer: let it finish
                tracker.wait(5.0)
            except zmq.NotDone:
                log.warning("dropping a session whose client does not read its replies")
                self._drop(identity)
                return
        resp_type, resp = session.handle(msg_type, body)
        if session.closing:
            self._drop(identity)
        hello = msg_type == self._hello_type
        sent = self._reply(sock, identity, envelope, resp_type, msg_id, resp, forget_if_gone=hello)
        if sent is not None:
            self._trackers[identity] = sent

    # -- sessions: made off the serving thread, dropped when idle ---------------------------------

    def _build(self, identity: bytes, envelope: bool, msg_id: int, hello: bytes) -> None:
        """Have a builder thread make ``identity``'s session; its HELLO is answered when done."""
        build = _Build(identity, envelope, msg_id, hello)
        if self._builders is None:
            self._builders = ThreadPoolExecutor(
                BUILDERS, thread_name_prefix="transport-zmq-session"
            )
        self._pending[identity] = build
        build.future = self._builders.submit(self._make, build)

    def _make(self, build: _Build) -> None:
        """In a builder thread: make the session (or say why not) and hand it back."""
        try:
            build.session = Session(self.host)
        except Exception as exc:
            log.exception("cannot create a session for a new client on %s", self.url)
            build.error = cannot_make_envs(exc)
        self._built.append(build)  # the serving thread (or close()) takes it from here

    def _finish_builds(self, sock: Sock, now: float) -> None:
        """Answer the HELLOs whose sessions are made; close those whose client left."""
        while self._built:
            build = self._built.popleft()
            identity, session = build.identity, build.session
            if self._pending.get(identity) is not build:  # a goodbye, or close(), came first
                if session is not None:
                    self._retire(session)
                continue
            del self._pending[identity]
            if session is None:
                body = encode_error(ErrorCode.INTERNAL, build.error or "no session")
                self._reply(sock, identity, build.envelope, self._error_type, build.msg_id, body)
                continue
            self._sessions[identity] = session
            self._seen[identity] = now
            while len(self._sessions) > self.max_sessions:
                old = next(iter(self._sessions))
                self._trackers.pop(old, None)
                self._drop(old)
                log.info("dropped the least recently used session (over %d)", self.max_sessions)
            hello = memoryview(build.hello)
            self._answer(
                sock, identity, build.envelope, build.msg_id, session, self._hello_type, hello
            )

    def _sweep(self, now: float) -> None:
        """Close the sessions that sent nothing for ``idle_timeout`` seconds (least recently
        used first: the loop stops at the first one still in time)."""
        cutoff = now - self.idle_timeout
        expired = []
        for identity in self._sessions:
            if self._seen.get(identity, now) > cutoff:
                break
            expired.append(identity)
        for old in expired:
            self._trackers.pop(old, None)
            self._drop(old)
            log.info("closed a session idle for over %g s", self.idle_timeout)

    def _drop(self, identity: bytes) -> None:
        self._seen.pop(identity, None)
        building = self._pending.pop(identity, None)
        if building is not None and building.future is not None:
            building.future.cancel()  # not started: never made; made later: closed when handed back
        session = self._sessions.pop(identity, None)
        if session is not None:
            self._retire(session)

    def _retire(self, session: Session) -> None:
        """Close a dropped session's envs off the serving thread (a worker pool joins its
        processes); in this thread when there is no builder (close() waits for them)."""
        if self._builders is not None:
            try:
                self._builders.submit(session.close)
                return
            except RuntimeError:  # shut down: close() is under way
                pass
        session.close()

    def _reply(
        self,
        sock: Sock,
        identity: bytes,
        envelope: bool,
        msg_type: int,
        msg_id: int,
        body: memoryview | bytes,
        *,
        forget_if_gone: bool = False,
    ) -> zmq.MessageTracker | None:
        """Send one reply; one to a client whose connection is gone is dropped, and with it the
        session when ``forget_if_gone`` (a HELLO_RESP: that client never learnt of its session)."""
        view = memoryview(body)
        header = HEADER.pack(msg_type, msg_id, view.nbytes)
        try:
            sock.send(identity, SNDMORE_NOBLOCK)
            if envelope:
                sock.send(b"", SNDMORE)
            sock.send(header, SNDMORE)
            if view.nbytes >= ZERO_COPY_THRESHOLD and isinstance(body, memoryview):
                return sock.send(view, copy=False, track=True)
            sock.send(view)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                # its connection is down, not necessarily the client: one that comes back with
                # the same routing id (a cut link) goes on with its session, which otherwise
                # waits for the idle timeout like any silent client's
                if forget_if_gone:
                    self._drop(identity)  # it never learnt of this session (a retry re-HELLOs)
                log.debug("dropped a reply to a disconnected client")
            else:  # EAGAIN: its queue is full (a client that stopped reading)
                log.warning("dropped a reply to a client whose queue is full: %s", exc)
        return None

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
        self._trackers.clear()
        if self._builders is not None:  # sessions being made or closed: wait, then close them
            for build in self._pending.values():
                if build.future is not None:
                    build.future.cancel()
            self._pending.clear()
            self._builders.shutdown(wait=True)
        while self._built:
            made = self._built.popleft().session
            if made is not None:
                made.close()
        for session in self._sessions.values():
            session.close()  # its envs (the loop has ended: nothing steps them)
        self._sessions.clear()
        self._seen.clear()
        if self.address.transport == "ipc" and self._inode is not None:
            try:
                if os.stat(self.address.path).st_ino == self._inode:
                    os.unlink(self.address.path)
            except FileNotFoundError:
                pass
