"""The zmq server: one ROUTER socket, one thread, one ``Session`` per client routing id."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

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
        host: EnvHost,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.address = parse_url(url)
        self.url = url
        self.host = host
        self.max_body = max_body
        self.max_sessions = max_sessions
        ids = MessageIds.from_schema(host.schema.ir)
        self._error_type = ids.ERROR
        self._hello_type = ids.HELLO_REQ
        self._ctx: Context | None = None
        self._sock: Sock | None = None
        self._auth: ThreadAuthenticator | None = None
        self._inode: int | None = None
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()
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
        if msg_type == self._hello_type and is_goodbye(self._receive.body(body_len)):
            self._trackers.pop(identity, None)
            self._drop(identity)  # the client left: its envs are closed now, not at LRU
            return
        session = self._session_for(identity, msg_type)
        if isinstance(session, str):
            body = encode_error(ErrorCode.INTERNAL, session)
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
        resp_type, resp = session.handle(msg_type, self._receive.body(body_len))
        if session.closing:
            self._drop(identity)
        sent = self._reply(sock, identity, envelope, resp_type, msg_id, resp)
        if sent is not None:
            self._trackers[identity] = sent

    def _session_for(self, identity: bytes, msg_type: int) -> Session | str:
        """The client's session, made on its first message; why not, when it cannot be made."""
        session = self._sessions.get(identity)
        if session is not None:
            if not (session.hello_done and msg_type == session.ids.HELLO_REQ):
                self._sessions.move_to_end(identity)
                return session
            del self._sessions[identity]  # a second HELLO: a fresh session, fresh envs
            session.close()
        try:
            session = Session(self.host)
        except Exception as exc:
            log.exception("cannot create a session for a new client on %s", self.url)
            return cannot_make_envs(exc)
        self._sessions[identity] = session
        while len(self._sessions) > self.max_sessions:
            old, dropped = self._sessions.popitem(last=False)
            self._trackers.pop(old, None)
            dropped.close()
            log.info("dropped the least recently used session (over %d)", self.max_sessions)
        return session

    def _drop(self, identity: bytes) -> None:
        session = self._sessions.pop(identity, None)
        if session is not None:
            session.close()

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
            sock.send(identity, SNDMORE_NOBLOCK)
            if envelope:
                sock.send(b"", SNDMORE)
            sock.send(header, SNDMORE)
            if view.nbytes >= ZERO_COPY_THRESHOLD and isinstance(body, memoryview):
                return sock.send(view, copy=False, track=True)
            sock.send(view)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:  # the client is gone: so is its session
                self._drop(identity)
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
        for session in self._sessions.values():
            session.close()  # its envs (the loop has ended: nothing steps them)
        self._sessions.clear()
        if self.address.transport == "ipc" and self._inode is not None:
            try:
                if os.stat(self.address.path).st_ino == self._inode:
                    os.unlink(self.address.path)
            except FileNotFoundError:
                pass
