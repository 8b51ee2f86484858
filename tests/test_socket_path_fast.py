"""The socket paths' per-request fast paths (issue 24 item 3) against their general paths.

- ``FramedSocket.recv_frame`` hands the same body view object for frames of the same length
  (a new one after the buffer grew), pipelined frames included;
- ``Session._step_batch`` reuses the actions array it built over that view: new bytes in the
  same place are new actions; a body of another size is still refused;
- ``VectorEnvs.step`` (one ``step_envs`` call) leaves the rows, the ended envs and the failures
  ``step_except`` (the general path) leaves, in every auto-reset mode;
- ``ActionShapes._fits`` (one reduction for the common case) agrees with min/max;
- the zmq server and client reuse their body view.
"""

from __future__ import annotations

import functools
import socket

import numpy as np
import pytest

from transport.actions import ActionShapes
from transport.backends.stream import FramedSocket
from transport.envs.vector_echo import VectorEchoEnv
from transport.generated import pac_env
from transport.protocol import AutoReset, ErrorCode
from transport.runtime.host import EnvHost
from transport.runtime.session import Session
from transport.runtime.vector import VectorEnvs

N = 8
EPISODE = 3


def _session(n: int = N, mode: AutoReset = AutoReset.DISABLED, episode: int = 0) -> Session:
    host = EnvHost(pac_env.SCHEMA, functools.partial(VectorEchoEnv, n, episode), num_envs=n)
    session = Session(host)
    session.hello_done = True
    session.runtime.set_autoreset(int(mode))
    session.runtime.reset()
    return session


def test_recv_frame_hands_the_same_body_view_for_the_same_length() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender, receiver = FramedSocket(a, timeout=5.0), FramedSocket(b, capacity=64, timeout=5.0)
    try:
        sender.send_frame(1, 1, b"abcd")
        _, _, first = receiver.recv_frame()
        assert bytes(first) == b"abcd"
        sender.send_frame(1, 2, b"wxyz")
        _, msg_id, second = receiver.recv_frame()
        assert msg_id == 2 and second is first and bytes(second) == b"wxyz"
        sender.send_frame(1, 3, b"12345")  # another length: another view
        _, _, third = receiver.recv_frame()
        assert third is not first and bytes(third) == b"12345"
        big = bytes(range(256)) * 4  # past the 64-byte buffer: it grows, the view is new
        sender.send_frame(1, 4, big)
        _, _, grown = receiver.recv_frame()
        assert bytes(grown) == big and grown.obj is receiver.buffer
        # two frames in one send (pipelined): both come out whole, in order
        a.sendall(
            bytes([1]) + (5).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"first"
            + bytes([1]) + (6).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"again"
        )  # fmt: skip
        got = [receiver.recv_frame()[1:] for _ in range(2)]
        assert got[0][0] == 5 and got[1][0] == 6 and bytes(got[1][1]) == b"again"
        sender.send_frame(1, 7, b"")
        assert receiver.recv_frame()[2].nbytes == 0
    finally:
        sender.close()
        receiver.close()


def _step_both(mode: AutoReset, bodies: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """The same requests through one reused body view (the fast path) and through a fresh
    view each time (the general path): the response bodies each gives."""
    reused_session, fresh_session = _session(N, mode, EPISODE), _session(N, mode, EPISODE)
    place = bytearray(N * 4)
    view = memoryview(place)
    reused, fresh = [], []
    for body in bodies:
        place[:] = body
        kind, resp = reused_session.handle(reused_session.ids.STEP_BATCH_REQ, view)
        reused.append(bytes([kind]) + bytes(resp))
        kind, resp = fresh_session.handle(
            fresh_session.ids.STEP_BATCH_REQ, memoryview(bytearray(body))
        )
        fresh.append(bytes([kind]) + bytes(resp))
    return reused, fresh


@pytest.mark.parametrize("mode", list(AutoReset))
def test_a_reused_body_view_steps_like_a_fresh_one(mode: AutoReset) -> None:
    rng = np.random.default_rng(7)
    bodies = [rng.integers(0, 92, N, dtype=np.int32).tobytes() for _ in range(8)]
    reused, fresh = _step_both(mode, bodies)
    assert reused == fresh
    assert len(set(reused)) > 1  # the actions changed in place: so did the results


def test_a_reused_body_view_with_a_bad_action_is_refused_like_a_fresh_one() -> None:
    good = np.arange(N, dtype=np.int32).tobytes()
    bad = np.array([5] * (N - 1) + [500], dtype=np.int32).tobytes()
    reused, fresh = _step_both(AutoReset.DISABLED, [good, bad, good])
    assert reused == fresh
    assert reused[1][0] != reused[0][0]  # an ERROR, then steps again


def test_a_body_of_another_size_is_refused_after_a_reused_one() -> None:
    session = _session()
    body = memoryview(bytearray(N * 4))
    assert session.handle(session.ids.STEP_BATCH_REQ, body)[0] == session.ids.STEP_BATCH_RESP
    kind, resp = session.handle(session.ids.STEP_BATCH_REQ, memoryview(bytearray(N * 4 - 4)))
    assert kind == session.ids.ERROR
    assert int.from_bytes(bytes(resp[:2]), "little") == ErrorCode.BAD_BATCH
    assert session.handle(session.ids.STEP_BATCH_REQ, body)[0] == session.ids.STEP_BATCH_RESP


def _runner(n: int, episode: int, env: object | None = None) -> VectorEnvs:
    host = EnvHost(pac_env.SCHEMA, functools.partial(VectorEchoEnv, n, episode), num_envs=n)
    rows = host.result.view(bytearray(n * host.result.size), 0, count=n)
    return VectorEnvs(
        env or VectorEchoEnv(n, episode), host.result, rows, rows.copy(), np.dtype(np.int32)
    )


@pytest.mark.parametrize("mode", list(AutoReset))
def test_vector_step_equals_step_except(mode: AutoReset) -> None:
    fast, general = _runner(N, EPISODE), _runner(N, EPISODE)
    for runner in (fast, general):
        runner.reset([None] * N)
    for t in range(7):
        actions = ((np.arange(N) * 3 + t) % 92).astype(np.int32)
        got = fast.step(actions, mode)
        want = general.step_except(actions, mode, None)
        assert got == want
        assert fast.rows.tobytes() == general.rows.tobytes()
    # a list (not an array) and a longer block take the general path
    assert fast.step(list(range(N)), mode) == general.step_except(list(range(N)), mode, None)
    longer = np.arange(N + 2, dtype=np.int32)
    assert fast.step(longer, mode) == general.step_except(longer, mode, None)
    assert fast.rows.tobytes() == general.rows.tobytes()


class _Broken(VectorEchoEnv):
    def step_envs(self, actions: np.ndarray, ids: np.ndarray | None, out: np.ndarray) -> None:
        raise RuntimeError("boom")


def test_vector_step_fails_every_env_as_step_except_does() -> None:
    fast, general = _runner(4, 0, _Broken(4)), _runner(4, 0, _Broken(4))
    actions = np.zeros(4, dtype=np.int32)
    ended, failures = fast.step(actions, AutoReset.DISABLED)
    want_ended, want = general.step_except(actions, AutoReset.DISABLED, None)
    assert ended == want_ended == []
    assert [i for i, _ in failures] == [i for i, _ in want] == [0, 1, 2, 3]
    assert all(type(i) is int and str(exc) == "boom" for i, exc in failures)


@pytest.mark.parametrize("field", ["i1", "u1", "i2", "i4", "u4"])
@pytest.mark.parametrize("given", ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", ">i8"])
def test_fits_agrees_with_min_and_max(field: str, given: str) -> None:
    shapes = ActionShapes(pac_env.SCHEMA, 4, None)
    shapes.lo, shapes.hi = int(np.iinfo(field).min), int(np.iinfo(field).max)
    info = np.iinfo(np.dtype(given))
    rng = np.random.default_rng(3)
    edges = [info.min, info.max, 0, 1, shapes.lo, shapes.hi, shapes.lo - 1, shapes.hi + 1]
    pool = np.array([e for e in edges if info.min <= e <= info.max], dtype=given)
    for _ in range(60):
        values = pool[rng.integers(0, len(pool), size=(3, 2))]
        want = int(values.min()) >= shapes.lo and int(values.max()) <= shapes.hi
        assert shapes._fits(values) == want, (values, field)
        assert shapes._fits(values[:, 1]) == (
            int(values[:, 1].min()) >= shapes.lo and int(values[:, 1].max()) <= shapes.hi
        )
    assert shapes._fits(np.zeros(0, dtype=given))


def test_zmq_body_view_is_kept_per_length() -> None:
    from transport.backends.zmq.wire import ReceiveBuffer

    receive = ReceiveBuffer(64)
    first = receive.body(16)
    assert receive.body(16) is first
    assert receive.body(8) is not first and receive.body(8).nbytes == 8
    receive.ensure_capacity(1 << 12)  # a new buffer: a new view of it
    grown = receive.body(8)
    assert grown.obj is receive.buffer and grown.nbytes == 8 and receive.generation == 1


def test_http_body_view_is_kept_while_the_body_stays_in_place() -> None:
    from transport.backends.http.server import _Connection

    conn = _Connection.__new__(_Connection)
    conn.buffer = bytearray(64)
    conn.view = memoryview(conn.buffer)
    conn._body, conn._body_at = conn.view[:0], 0
    first = conn._body_view(10, 26)
    assert conn._body_view(10, 26) is first and first.nbytes == 16
    moved = conn._body_view(12, 28)  # another head length: the body starts elsewhere
    assert moved is not first and conn._body_view(12, 28) is moved
    conn.have = 0
    conn._grow(128)  # a new buffer: a new view of it, even in the same place
    grown = conn._body_view(12, 28)
    assert grown is not moved and grown.obj is conn.buffer
