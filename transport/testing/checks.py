"""The backend contract: named checks, each run against a server made by a ServerFactory.

Every check uses only ``transport.connect`` and the public client API (plus raw frames through
the backend's own channel, or raw bytes on its socket, for the malformed-input checks), and the
server must host ``ContractEnv`` so that every result byte can be predicted
(``ExpectedSession``). A check raises AssertionError (or the unexpected error) on failure and
``NotApplicable`` when the backend cannot express what it tests (shm:// has no frames).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

import transport
from transport.client import Client
from transport.codec import Schema
from transport.errors import (
    ConnectError,
    EnvError,
    FingerprintMismatchError,
    PeerGoneError,
    RemoteError,
    TransportTimeoutError,
    VersionMismatchError,
)
from transport.protocol import HELLO, PROTOCOL_VERSION, AutoReset, ErrorCode, MessageIds
from transport.runtime.core import action_dtype
from transport.step_view import StepView
from transport.testing.contract_env import POISON_ACTION, contract_spaces
from transport.testing.model import ExpectedSession, field_differences
from transport.testing.servers import (
    CONTRACT_MAX_BODY,
    SERVER_SEED,
    RunningServer,
    ServerFactory,
    ServerOptions,
    stop_process,
)

TIMEOUT = 20.0
"""The client timeout of the checks: a server that hangs fails the check, never the run."""
WATCHDOG = 60.0
"""Seconds a dead- or silent-peer check may take before it fails as a hang."""
DEAD_TIMEOUT = 2.0
"""The client timeout of the dead-server check: a backend that notices a dead peer only when
its wait ends (zmq:// with no connection) answers PeerGoneError then."""
SEATS_ENVS = 8
"""Envs of the batch server: the seats of a STEP_MULTI (seed 000), so it serves both."""

T = TypeVar("T")


class NotApplicable(Exception):
    """The backend cannot express what the check tests (the reason says why)."""


@dataclass
class CheckContext:
    """What a check runs with: the server factory and the schema under test."""

    factory: ServerFactory
    schema: Schema

    def server(self, num_envs: int = 1, *, dedicated: bool = False) -> RunningServer:
        return self.factory(self.schema, num_envs, ServerOptions(dedicated=dedicated))

    def connect(
        self,
        server: RunningServer,
        *,
        autoreset: str = "disabled",
        timeout: float = TIMEOUT,
        schema: Schema | None = None,
    ) -> Client:
        return transport.connect(
            server.url, schema or self.schema, timeout=timeout, autoreset=autoreset
        )


@dataclass(frozen=True)
class Check:
    """One named check. ``per_schema``: its outcome depends on the schema's layout, so it runs
    for every schema; the others run once, on the first schema."""

    name: str
    run: Callable[[CheckContext], None]
    per_schema: bool
    doc: str


CHECKS: list[Check] = []


def _check(per_schema: bool) -> Callable[[Callable[[CheckContext], None]], Callable[..., None]]:
    def register(func: Callable[[CheckContext], None]) -> Callable[[CheckContext], None]:
        doc = (func.__doc__ or "").strip().splitlines()[0]
        CHECKS.append(Check(func.__name__.removeprefix("check_"), func, per_schema, doc))
        return func

    return register


def contract_checks() -> dict[str, Check]:
    """Every check of the contract, by name, in a stable order."""
    return {check.name: check for check in CHECKS}


# -- helpers -------------------------------------------------------------------------------


def _records(view: StepView) -> np.ndarray:
    """The records of a response with a leading env axis (a 1-env response has shape ())."""
    record: np.ndarray = view.record.reshape(-1)
    return record


def _expect_results(view: StepView, expected: Sequence[np.ndarray], what: str) -> None:
    got = _records(view)
    assert len(got) == len(expected), f"{what}: {len(got)} results, expected {len(expected)}"
    problems = []
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        problems += field_differences(g, e, f"{what}, env {i}")
    assert not problems, "; ".join(problems[:5])


def _expect_finals(client: Client, expected: list[tuple[int, np.ndarray]], what: str) -> None:
    got = [index for index, _ in client.finals]
    want = [index for index, _ in expected]
    assert got == want, f"{what}: finals of envs {got}, expected {want}"
    problems = []
    for (index, view), (_, record) in zip(client.finals, expected, strict=True):
        problems += field_differences(view.record, record, f"{what}, final of env {index}")
    assert not problems, "; ".join(problems[:5])


def wire_action(schema: Schema, action: int) -> Any:
    """One env's action as the schema's action field carries it: the integer itself for a
    Discrete (scalar) action; for an array action (Box, MultiDiscrete) an array of the field's
    shape and dtype filled with it, which ContractEnv reads back as that integer (its first
    element). So the checks' one rule of picks, masks, refusals and poison serves every
    action space."""
    dtype = action_dtype(schema)
    if dtype.subdtype is None:
        return int(action)
    base, dims = dtype.subdtype
    return np.full(dims, action, dtype=base)


def wire_actions(schema: Schema, actions: Sequence[int]) -> Any:
    """One action per env (``wire_action``): a list of integers, or an ``(N, *dims)`` array."""
    dtype = action_dtype(schema)
    if dtype.subdtype is None:
        return [int(a) for a in actions]
    base, dims = dtype.subdtype
    out = np.empty((len(actions), *dims), dtype=base)
    out[...] = np.reshape(np.asarray(actions), (len(actions),) + (1,) * len(dims))
    return out


def _step(client: Client, actions: Sequence[int]) -> StepView:
    """One action per env (a batch request; a 1-env server gets a single STEP_REQ)."""
    if client.num_envs == 1:
        return client.step(wire_action(client.schema, actions[0]))
    return client.step(wire_actions(client.schema, actions))


def _expect_refused(
    client: Client, actions: Sequence[int], code: ErrorCode, what: str
) -> RemoteError:
    try:
        _step(client, actions)
    except RemoteError as exc:
        assert exc.code == code, f"{what}: error {exc.name} ({exc.code}), expected {code.name}"
        return exc
    raise AssertionError(f"{what}: the step was answered, expected {code.name}")


def _action_is_signed(schema: Schema) -> bool:
    """Whether the action field can carry -1 (a signed integer, or a Box's floats)."""
    body = schema.ir.messages["STEP_REQ"].body
    action = schema[body].ir.role("action") if body else None
    return action is not None and action.elem[0] in "if"


def _pick(model: ExpectedSession, rng: random.Random) -> list[int]:
    return [rng.choice(model.allowed(i)) for i in range(model.num_envs)]


def _watchdog(seconds: float, work: Callable[[], T], what: str) -> T:
    """Run ``work`` in a thread; fail (never hang) when it has not returned within ``seconds``.
    Not a runtime assertion: only a hang trips it."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{what}: no answer and no error after {seconds} s (a hang)")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def _raw_channel(server: RunningServer, schema: Schema) -> Any:
    """The backend's own channel, before any HELLO (raw frames)."""
    from transport.backends import backend_for

    backend = backend_for(server.url)
    if not hasattr(backend, "open_channel"):
        raise NotApplicable(f"{server.url.partition(':')[0]}:// has no frames (no channel)")
    return backend.open_channel(server.url, timeout=TIMEOUT, max_body=1 << 26, schema=schema)


def _still_served(ctx: CheckContext, server: RunningServer, what: str) -> None:
    """A new client is served normally (the server survived whatever came before)."""
    with ctx.connect(server) as client:
        model = ExpectedSession(ctx.schema, client.num_envs, server_seed=SERVER_SEED)
        _expect_results(client.reset(7), model.reset(7), f"{what}: then a reset")
        actions = [0] * client.num_envs
        results, _, _ = model.step(actions)
        _expect_results(_step(client, actions), results, f"{what}: then a step")


def _other_schema(schema: Schema) -> Schema:
    """``schema`` with the HEALTH_RESP body's field renamed: another fingerprint, the same
    sizes and the same result layout (every other part of the IR kept as it is)."""
    ir = schema.ir
    body = ir.messages["HEALTH_RESP"].body
    if body is None:
        raise NotApplicable(f"schema {schema.name}: HEALTH_RESP has no body to rename")
    health = ir.structs[body]
    fields = tuple(replace(f, name=f.name + "_other") for f in health.fields)
    structs = {**ir.structs, body: replace(health, fields=fields)}
    return Schema(replace(ir, structs=structs))


# -- handshake -----------------------------------------------------------------------------


@_check(per_schema=True)
def check_hello_health_spaces(ctx: CheckContext) -> None:
    """HELLO succeeds and names N; health is true; spaces are the observation and mask sizes."""
    for num_envs in (1, SEATS_ENVS):
        server = ctx.server(num_envs)
        with ctx.connect(server) as client:
            assert client.num_envs == num_envs, f"HELLO says {client.num_envs} envs"
            assert client.server_info.get("num_envs") == num_envs
            assert client.health() is True
            expected = contract_spaces(ctx.schema)
            got = client.spaces()
            assert (got.obs_n, got.act_n) == (expected.obs_n, expected.act_n), (
                f"spaces {got}, expected {expected}"
            )


@_check(per_schema=False)
def check_fingerprint_mismatch(ctx: CheckContext) -> None:
    """A client with another schema is refused: FingerprintMismatchError naming both; the
    server goes on serving."""
    server = ctx.server()
    other = _other_schema(ctx.schema)
    try:
        client = ctx.connect(server, schema=other)
    except FingerprintMismatchError as exc:
        text = str(exc)
        for fingerprint in (ctx.schema.fingerprint, other.fingerprint):
            assert f"{fingerprint:016x}" in text, f"{fingerprint:016x} not named in {text!r}"
    else:
        client.close()
        raise AssertionError("a client with another schema fingerprint was accepted")
    _still_served(ctx, server, "after a fingerprint mismatch")


@_check(per_schema=False)
def check_version_mismatch(ctx: CheckContext) -> None:
    """A HELLO with another major protocol version is refused (VERSION_MISMATCH)."""
    server = ctx.server()
    channel = _raw_channel(server, ctx.schema)
    ids = MessageIds.from_schema(ctx.schema.ir)
    try:
        body = HELLO.pack(PROTOCOL_VERSION + 0x0100, 0, ctx.schema.fingerprint)
        msg_type, reply = channel.request(ids.HELLO_REQ, body)
        assert msg_type == ids.ERROR, f"HELLO of version 2.0 answered 0x{msg_type:02X}"
        from transport.protocol import decode_error

        error = decode_error(reply)
        assert isinstance(error, VersionMismatchError), f"refused as {error!r}"
    except PeerGoneError:
        pass  # the ERROR was sent and the connection closed: some channels see only the close
    finally:
        channel.close()
    _still_served(ctx, server, "after a version mismatch")


# -- malformed requests --------------------------------------------------------------------


@_check(per_schema=False)
def check_bad_requests(ctx: CheckContext) -> None:
    """Unknown message, wrong body size, body over the maximum: typed ERRORs; the connection is
    kept where the protocol says so, and other clients are served meanwhile."""
    server = ctx.server()
    scheme = server.url.partition("://")[0]
    if scheme == "shm":
        raise NotApplicable("shm:// has no frames: requests are slot commands")
    ids = MessageIds.from_schema(ctx.schema.ir)
    with ctx.connect(server) as bystander:
        bystander.reset(3)
        with ctx.connect(server) as client:
            client.reset(3)
            msg_type, body = client.channel.request(ids.STEP_REQ, b"\x00")
            _expect_error_frame(ids, msg_type, body, ErrorCode.BAD_BODY_SIZE, "1-byte STEP_REQ")
            client.step(0)  # kept: the next request works
        if scheme == "http":
            _http_unknown_method(server.url)
        else:
            with ctx.connect(server) as client:
                msg_type, body = client.channel.request(0x77, b"")
                _expect_error_frame(ids, msg_type, body, ErrorCode.UNKNOWN_MESSAGE, "type 0x77")
        with ctx.connect(server) as client:
            try:
                msg_type, body = client.channel.request(
                    ids.STEP_BATCH_REQ, bytes(CONTRACT_MAX_BODY + 4)
                )
            except (PeerGoneError, TransportTimeoutError):
                pass  # refused by closing the connection (zmq: the sender is dropped)
            else:
                _expect_error_frame(
                    ids, msg_type, body, ErrorCode.BODY_TOO_LARGE, "a body over the maximum"
                )
        if scheme != "http":  # over HTTP a request with the fingerprint header is the HELLO
            channel = _raw_channel(server, ctx.schema)
            try:
                msg_type, body = channel.request(ids.RESET_REQ, b"")
                _expect_error_frame(ids, msg_type, body, ErrorCode.HELLO_REQUIRED, "no HELLO")
            finally:
                channel.close()
        bystander.step([0] * bystander.num_envs if bystander.num_envs > 1 else 0)
    _still_served(ctx, server, "after bad requests")


@_check(per_schema=False)
def check_bad_batch(ctx: CheckContext) -> None:
    """The wrong number of actions is BAD_BATCH and the connection is kept: STEP_MULTI to a
    1-env server whose env has no step_batch, STEP_REQ to an N-env server, a short batch."""
    with ctx.connect(ctx.server(1)) as client:
        client.reset(1)
        try:
            client.step_multi([0] * SEATS_ENVS)
        except RemoteError as exc:
            assert exc.code == ErrorCode.BAD_BATCH, f"STEP_MULTI to 1 env: {exc}"
        else:
            raise AssertionError("a 1-env server without step_batch answered STEP_MULTI")
        client.step(0)
    server = ctx.server(SEATS_ENVS)
    if server.url.startswith("shm://"):
        raise NotApplicable("shm:// requests always cover every slot (no frames to miscount)")
    ids = MessageIds.from_schema(ctx.schema.ir)
    size = ctx.schema[ctx.schema.ir.messages["STEP_REQ"].body or ""].size
    with ctx.connect(server) as client:
        client.reset(1)
        msg_type, body = client.channel.request(ids.STEP_REQ, bytes(size))
        _expect_error_frame(ids, msg_type, body, ErrorCode.BAD_BATCH, "STEP_REQ to 8 envs")
        short = bytes(size * (SEATS_ENVS - 1))
        msg_type, body = client.channel.request(ids.STEP_BATCH_REQ, short)
        _expect_error_frame(ids, msg_type, body, ErrorCode.BAD_BATCH, "7 actions for 8 envs")
        client.step([0] * SEATS_ENVS)


@_check(per_schema=False)
def check_sessions_are_independent(ctx: CheckContext) -> None:
    """Two clients of one server have their own envs: interleaved requests, each client's
    bytes as its own local envs'."""
    server = ctx.server(SEATS_ENVS)
    if server.url.startswith("shm://"):
        raise NotApplicable("shm:// serves one client per region (the lease)")
    rng = random.Random(6)
    with ctx.connect(server) as first, ctx.connect(server, autoreset="next_step") as second:
        models = [
            ExpectedSession(ctx.schema, SEATS_ENVS, server_seed=SERVER_SEED),
            ExpectedSession(
                ctx.schema, SEATS_ENVS, server_seed=SERVER_SEED, autoreset=AutoReset.NEXT_STEP
            ),
        ]
        clients = [first, second]
        for k in (0, 1):
            _expect_results(clients[k].reset(), models[k].reset(), f"client {k}: reset")
        for step in range(6):
            for k in (0, 1):
                what = f"client {k}: step {step + 1}"
                actions = _pick(models[k], rng)
                if models[k].refusal(actions) is not None:
                    _expect_results(clients[k].reset(), models[k].reset(), f"{what}: reset")
                    continue
                results, _, _ = models[k].step(actions)
                _expect_results(_step(clients[k], actions), results, what)


def _expect_error_frame(
    ids: MessageIds, msg_type: int, body: Any, code: ErrorCode, what: str
) -> None:
    from transport.protocol import decode_error

    assert msg_type == ids.ERROR, f"{what}: answered 0x{msg_type:02X}, expected ERROR"
    error = decode_error(body)
    assert isinstance(error, RemoteError) and error.code == code, (
        f"{what}: {error!r}, expected {code.name}"
    )


def _http_unknown_method(url: str) -> None:
    host, _, port = url.partition("://")[2].partition("/")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(b"POST /v1/no_such_method HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 404"), f"an unknown method answered {head[:40]!r}"
    assert b"x-transport-error: 2" in head.lower(), "the 404 does not carry code 2"


@_check(per_schema=False)
def check_garbage_bytes(ctx: CheckContext) -> None:
    """Random bytes on the server's socket do not crash it: it keeps serving other clients."""
    server = ctx.server()
    scheme, _, rest = server.url.partition("://")
    address = rest.partition("?")[0]
    if scheme == "shm":
        raise NotApplicable("shm:// has no socket to send bytes to")
    rng = random.Random(12)
    for round_ in range(4):
        data = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 9, 64, 4096])))
        if round_ == 3:
            data = b"\x0d" + data  # a plausible HELLO_REQ type byte, then nonsense
        if scheme in ("unix", "zmq+ipc"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(address)
        else:
            host, _, port = address.partition("/")[0].rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        try:
            sock.sendall(data)
            sock.settimeout(0.2)
            try:
                sock.recv(4096)
            except (TimeoutError, OSError):
                pass
        finally:
            sock.close()
    _still_served(ctx, server, "after random bytes on its socket")


# -- resets and steps ----------------------------------------------------------------------


@_check(per_schema=True)
def check_reset_seeds(ctx: CheckContext) -> None:
    """Resets: env i gets seed + i (the first unseeded reset: the server's seed + i), then each
    unseeded reset starts the next episode; bytes equal a local ContractEnv's."""
    server = ctx.server(SEATS_ENVS)
    with ctx.connect(server) as client:
        model = ExpectedSession(ctx.schema, client.num_envs, server_seed=SERVER_SEED)
        _expect_results(client.reset(), model.reset(), "first unseeded reset")
        _expect_results(client.reset(), model.reset(), "second unseeded reset")
        _expect_results(client.reset(2**40 + 5), model.reset(2**40 + 5), "seeded reset")
        _expect_results(client.reset(), model.reset(), "unseeded reset after a seeded one")


@_check(per_schema=True)
def check_step_one_env(ctx: CheckContext) -> None:
    """A 1-env server: reset then STEP_REQ over two episodes, every byte as the local env's;
    a step after the episode ended is NOT_RESET (auto-reset disabled)."""
    server = ctx.server(1)
    rng = random.Random(1)
    with ctx.connect(server) as client:
        model = ExpectedSession(ctx.schema, 1, server_seed=SERVER_SEED)
        for episode in range(2):
            _expect_results(client.reset(40 + episode), model.reset(40 + episode), "reset")
            for step in range(10):
                if model.done(0):
                    _expect_refused(client, [0], ErrorCode.NOT_RESET, "a step after the end")
                    break
                actions = _pick(model, rng)
                results, _, _ = model.step(actions)
                view = client.step(wire_action(ctx.schema, actions[0]))
                _expect_results(view, results, f"episode {episode} step {step + 1}")
            else:
                raise AssertionError("the contract env's episode did not end within 10 steps")


@_check(per_schema=True)
def check_step_batch(ctx: CheckContext) -> None:
    """An N-env server: STEP_BATCH with one action per env, bytes as the local envs'."""
    _autoreset_trace(ctx, AutoReset.DISABLED)


@_check(per_schema=True)
def check_autoreset_next_step(ctx: CheckContext) -> None:
    """next_step: the step after an episode's end ignores its action and returns the reset."""
    _autoreset_trace(ctx, AutoReset.NEXT_STEP)


@_check(per_schema=True)
def check_autoreset_same_step(ctx: CheckContext) -> None:
    """same_step: the ending step returns the reset result and the final one in ``finals``."""
    _autoreset_trace(ctx, AutoReset.SAME_STEP)


def _autoreset_trace(ctx: CheckContext, mode: AutoReset, steps: int = 14) -> None:
    server = ctx.server(SEATS_ENVS)
    rng = random.Random(int(mode) + 10)
    with ctx.connect(server, autoreset=mode.name.lower()) as client:
        assert client.autoreset == mode, f"the server applies {client.autoreset.name}"
        model = ExpectedSession(ctx.schema, client.num_envs, server_seed=None, autoreset=mode)
        _expect_results(client.reset(21), model.reset(21), "reset")
        ended = 0
        for step in range(steps):
            what = f"{mode.name.lower()} step {step + 1}"
            actions = _pick(model, rng)
            refusal = model.refusal(actions)
            if refusal is not None:  # disabled: an ended env must be reset by the client
                assert refusal.code == ErrorCode.NOT_RESET
                _expect_refused(client, actions, ErrorCode.NOT_RESET, what)
                _expect_results(client.reset(), model.reset(), f"{what}: reset")
                continue
            results, finals, _ = model.step(actions)
            ended += len(finals) + sum(model.done(i) for i in range(model.num_envs))
            view = _step(client, actions)
            _expect_results(view, results, what)
            if mode == AutoReset.SAME_STEP:
                _expect_finals(client, finals, what)
        assert ended, "no episode ended during the trace"


@_check(per_schema=True)
def check_refused_actions(ctx: CheckContext) -> None:
    """A step before any reset is NOT_RESET; masked (act_n - 1) and out-of-range (act_n, -1)
    actions are MASKED_ACTION / INVALID_ACTION naming the env; a refused batch steps no env;
    the client stays usable."""
    server = ctx.server(SEATS_ENVS)
    with ctx.connect(server) as client:
        model = ExpectedSession(ctx.schema, client.num_envs, server_seed=None)
        _expect_refused(client, [0] * client.num_envs, ErrorCode.NOT_RESET, "before a reset")
        _expect_results(client.reset(5), model.reset(5), "reset")
        act_n = model.act_n
        last = client.num_envs - 1
        cases = [(act_n, ErrorCode.INVALID_ACTION)]
        if _action_is_signed(ctx.schema):  # an unsigned action field cannot carry -1
            cases.append((-1, ErrorCode.INVALID_ACTION))
        if model.mask_name is not None:
            cases.insert(0, (act_n - 1, ErrorCode.MASKED_ACTION))
        for bad, code in cases:
            actions = [0] * client.num_envs
            actions[last] = bad
            error = _expect_refused(client, actions, code, f"action {bad} on env {last}")
            assert f"env {last}" in error.text, f"the error does not name env {last}: {error}"
        results, _, _ = model.step([0] * client.num_envs)  # nothing stepped before
        _expect_results(_step(client, [0] * client.num_envs), results, "a step after refusals")


@_check(per_schema=True)
def check_env_error(ctx: CheckContext) -> None:
    """An env that raises: EnvError with its env_id, text ``env {i}: ... reset``; that env is
    reset, the others stepped, and the next request works (bytes as the local envs'); on a
    1-env and an N-env server."""
    rng = random.Random(3)
    for num_envs in (1, SEATS_ENVS):
        with ctx.connect(ctx.server(num_envs)) as client:
            what = f"{num_envs} env(s)"
            model = ExpectedSession(ctx.schema, num_envs, server_seed=None)
            _expect_results(client.reset(9), model.reset(9), f"{what}: reset")
            poisoned = num_envs // 2
            actions = _pick(model, rng)
            actions[poisoned] = POISON_ACTION
            assert model.refusal(actions) is None
            _, _, failed = model.step(actions)
            assert failed == [poisoned]
            try:
                _step(client, actions)
            except EnvError as exc:
                assert exc.env_id == poisoned, f"{what}: EnvError names env {exc.env_id}"
                assert exc.text.startswith(f"env {poisoned}: "), f"{what}: text {exc.text!r}"
                assert "reset" in exc.text, f"{what}: the text does not say the env was reset"
            else:
                raise AssertionError(f"{what}: a step whose env raised was answered")
            actions = [0] * num_envs
            if model.refusal(actions) is not None:  # an env that stepped along may have ended
                _expect_results(client.reset(11), model.reset(11), f"{what}: reset")
            results, _, _ = model.step(actions)
            _expect_results(_step(client, actions), results, f"{what}: the next step")


@_check(per_schema=True)
def check_step_multi(ctx: CheckContext) -> None:
    """STEP_MULTI on an N = seats server: one action per env, N results as the local envs'."""
    server = ctx.server(SEATS_ENVS)
    rng = random.Random(4)
    with ctx.connect(server) as client:
        model = ExpectedSession(ctx.schema, client.num_envs, server_seed=None)
        _expect_results(client.reset(13), model.reset(13), "reset")
        for step in range(3):
            actions = _pick(model, rng)
            if model.refusal(actions) is not None:
                break
            results, _, _ = model.step(actions)
            view = client.step_multi(wire_actions(ctx.schema, actions))
            _expect_results(view, results, f"STEP_MULTI {step + 1}")


# -- dead, silent and signalled servers ----------------------------------------------------


@_check(per_schema=False)
def check_silent_server(ctx: CheckContext) -> None:
    """A stopped (SIGSTOP) server: TransportTimeoutError within the client's timeout, never a
    hang; after SIGCONT the server serves again."""
    server = ctx.server(1, dedicated=True)
    try:
        with ctx.connect(server, timeout=0.5) as client:
            client.reset(1)
            stop_process(server.pid)
            try:
                _watchdog(WATCHDOG, lambda: client.step(0), "a step to a stopped server")
            except TransportTimeoutError:
                pass
            else:
                raise AssertionError("a stopped server answered a step")
            finally:
                os.kill(server.pid, signal.SIGCONT)
    finally:
        status = server.stop()
    assert status == 0, f"the server exited {status} after SIGTERM"


@_check(per_schema=False)
def check_dead_server(ctx: CheckContext) -> None:
    """A killed (SIGKILL) server: PeerGoneError (or ConnectError) in bounded time, then every
    call fails the same way, and a new client gets ConnectError (or PeerGoneError)."""
    server = ctx.server(1, dedicated=True)
    try:
        client = ctx.connect(server, timeout=DEAD_TIMEOUT)
        try:
            client.reset(1)
            os.kill(server.pid, signal.SIGKILL)
            server.wait(20.0)
            for attempt in range(2):
                try:
                    _watchdog(WATCHDOG, lambda: client.step(0), "a step to a killed server")
                except (PeerGoneError, ConnectError):
                    pass
                else:
                    raise AssertionError(f"a killed server answered step {attempt + 1}")
        finally:
            client.close()
        try:  # what it left behind (a socket file, a segment) is not mistaken for a server
            _watchdog(WATCHDOG, lambda: ctx.connect(server, timeout=0.5), "a new connection")
        except (ConnectError, PeerGoneError):
            pass
        else:
            raise AssertionError("a new client connected to a killed server")
    finally:
        server.kill()


@_check(per_schema=False)
def check_signal_cleanup(ctx: CheckContext) -> None:
    """SIGTERM and SIGINT: the server exits 0 and leaves no socket file or shm segment, also
    with a client connected."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        server = ctx.server(1, dedicated=True)
        try:
            created = server.leftovers()
            with ctx.connect(server) as client:
                client.reset(1)
                os.kill(server.pid, sig)
                status = server.wait(30.0)
            assert status == 0, f"exit status {status} after {signal.Signals(sig).name}"
            left = server.leftovers()
            assert not left, f"left {left} after {signal.Signals(sig).name} (created {created})"
        finally:
            server.kill()


# -- for callers ---------------------------------------------------------------------------


def run_check(check: Check | str, factory: ServerFactory, schema: Schema) -> None:
    """Run one check (by object or name) with ``factory`` and ``schema``."""
    found = contract_checks()[check] if isinstance(check, str) else check
    found.run(CheckContext(factory, schema))


__all__ = [
    "CHECKS",
    "Check",
    "CheckContext",
    "NotApplicable",
    "contract_checks",
    "run_check",
]
