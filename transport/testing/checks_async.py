"""Contract checks of asynchronous batches (SEND / RECV / ASYNC_RESET): results equal the
lock-step results of the same env ids and actions (a local ContractEnv predicts every byte),
RECV returns at most B, every env id comes back exactly once, misuse is ASYNC_STATE."""

from __future__ import annotations

import os
import random
import signal

import numpy as np

from transport.errors import ConnectError, PeerGoneError, RemoteError
from transport.protocol import AutoReset, ErrorCode
from transport.testing.checks import (
    DEAD_TIMEOUT,
    SEATS_ENVS,
    WATCHDOG,
    CheckContext,
    _check,
    _pick,
    _watchdog,
    wire_actions,
)
from transport.testing.model import ExpectedSession, field_differences
from transport.testing.servers import RunningServer, ServerOptions


def _expect_rows(got: np.ndarray, ids: list[int], model: ExpectedSession, what: str) -> None:
    problems: list[str] = []
    for row, env in zip(got.reshape(-1), ids, strict=True):
        expected = model.results[env]
        assert expected is not None, f"{what}: env {env} has no expected result"
        problems += field_differences(row, expected, f"{what}, env {env}")
    assert not problems, "; ".join(problems[:5])


def _expect_code(call: object, code: ErrorCode, what: str) -> None:
    try:
        call()  # type: ignore[operator]
    except RemoteError as exc:
        assert exc.code == code, f"{what}: error {exc.name}, expected {code.name}"
        return
    raise AssertionError(f"{what}: answered, expected {code.name}")


def _async_rounds(ctx: CheckContext, server: RunningServer, mode: AutoReset, rounds: int) -> None:
    """async_reset, then ``rounds`` SENDs of the envs the last RECVs returned, each RECV of at
    most B = N/2: every env comes back once per SEND with the bytes of its lock-step result
    (and, SAME_STEP, its final result when its episode ended)."""
    rng = random.Random(7)
    with ctx.connect(server, autoreset=mode.name.lower()) as client:
        n = client.num_envs
        batch = max(1, n // 2)
        model = ExpectedSession(ctx.schema, n, server_seed=None, autoreset=mode)
        model.reset(31)
        client.async_reset(31)
        seen: list[int] = []
        while len(seen) < n:
            got = client.recv(batch)
            ids = got.env_ids.tolist()
            assert 1 <= len(ids) <= batch, f"async reset: recv returned {len(ids)} > {batch}"
            _expect_rows(got.results.record, ids, model, "async reset")
            seen += ids
        assert sorted(seen) == list(range(n)), f"async reset returned envs {sorted(seen)}"
        ready = seen
        finals_seen = 0
        for rnd in range(rounds):
            picked = _pick(model, rng)
            send_ids = ready[: max(1, len(ready))]
            actions = [picked[i] for i in send_ids]
            # the model steps only the envs sent (lock-step semantics per env)
            expected_finals = {}
            for i, a in zip(send_ids, actions, strict=True):
                final = _step_model_env(model, i, a)
                if final is not None:
                    expected_finals[i] = final
            client.send(wire_actions(ctx.schema, actions), send_ids)
            back: list[int] = []
            while len(back) < len(send_ids):
                got = client.recv(batch)
                ids = got.env_ids.tolist()
                assert 1 <= len(ids) <= batch, f"round {rnd}: recv returned {len(ids)} results"
                assert not set(ids) & set(back), f"round {rnd}: env ids {ids} came back twice"
                _expect_rows(got.results.record, ids, model, f"round {rnd}")
                for env, final_view in got.finals:
                    assert env in expected_finals, f"round {rnd}: env {env} has no final result"
                    problems = field_differences(
                        final_view.record,
                        expected_finals.pop(env),
                        f"round {rnd}, final of env {env}",
                    )
                    assert not problems, "; ".join(problems[:5])
                    finals_seen += 1
                back += ids
            assert not expected_finals, f"round {rnd}: no final result for envs {expected_finals}"
            assert sorted(back) == sorted(send_ids), f"round {rnd}: got {back}, sent {send_ids}"
            ready = back
        if mode == AutoReset.SAME_STEP:
            assert finals_seen, f"{rounds} rounds ended no episode: the check tests no final result"


@_check(per_schema=True)
def check_async_batches(ctx: CheckContext) -> None:
    """send/recv with B = N/2 under next_step auto-reset: each RECV has at most B results, every
    env id comes back once per send, and every byte is the lock-step result of that env."""
    _async_rounds(ctx, ctx.server(SEATS_ENVS), AutoReset.NEXT_STEP, 6)


@_check(per_schema=False)
def check_async_worker_pool(ctx: CheckContext) -> None:
    """The same over a server whose envs run in 2 worker processes (Node: worker threads) and
    under same_step auto-reset: each env is answered as it finishes, with its lock-step bytes
    and its final result when its episode ended."""
    server = ctx.factory(ctx.schema, 4, ServerOptions(workers=2))
    _async_rounds(ctx, server, AutoReset.SAME_STEP, 12)


def _step_model_env(model: ExpectedSession, i: int, action: int) -> np.ndarray | None:
    """One env of the model steps (NEXT_STEP: an ended env resets instead); its SAME_STEP final
    result when the step ended its episode."""
    env = model.envs[i]
    if model.autoreset == AutoReset.NEXT_STEP and model.done(i):
        model.results[i] = env.reset(None)
        return None
    model.results[i] = result = env.step(int(action))
    if model.autoreset == AutoReset.SAME_STEP and model.done(i):
        model.results[i] = env.reset(None)
        return result
    return None


@_check(per_schema=False)
def check_async_misuse(ctx: CheckContext) -> None:
    """RECV with nothing in flight, an env sent twice while in flight, an env id out of range
    and a lock-step STEP while envs are in flight are refused (ASYNC_STATE / BAD_BATCH); the
    client stays usable."""
    server = ctx.server(SEATS_ENVS)
    with ctx.connect(server, autoreset="next_step") as client:
        n = client.num_envs
        _expect_code(lambda: client.recv(1), ErrorCode.ASYNC_STATE, "recv before any send")
        client.async_reset(3)
        _expect_code(lambda: client.async_reset(3), ErrorCode.ASYNC_STATE, "reset in flight")
        _expect_code(lambda: client.send([0], [0]), ErrorCode.ASYNC_STATE, "env in flight")
        _expect_code(lambda: client.step([0] * n), ErrorCode.ASYNC_STATE, "step in flight")
        got = client.recv(n)
        assert sorted(got.env_ids.tolist()) == list(range(n))
        _expect_code(lambda: client.recv(1), ErrorCode.ASYNC_STATE, "recv after all came back")
        _expect_code(lambda: client.send([0, 0], [1, 1]), ErrorCode.ASYNC_STATE, "id twice")
        _expect_code(lambda: client.send([0], [n]), ErrorCode.BAD_BATCH, "id out of range")
        client.send([0], [1])
        assert client.recv(4).env_ids.tolist() == [1]
        client.step([0] * n)  # lock-step works again


@_check(per_schema=False)
def check_async_dead_server(ctx: CheckContext) -> None:
    """A server killed (SIGKILL) while the client uses asynchronous batches: the next
    send/recv fails with PeerGoneError (or ConnectError) in bounded time, never a hang."""
    server = ctx.server(2, dedicated=True)
    try:
        client = ctx.connect(server, timeout=DEAD_TIMEOUT, autoreset="next_step")
        try:
            client.async_reset(5)
            while len(client.recv(2).env_ids) < 2:
                pass
            os.kill(server.pid, signal.SIGKILL)
            server.wait(20.0)

            def send_and_recv() -> None:
                client.send([0, 0], [0, 1])
                client.recv(2)

            try:
                _watchdog(WATCHDOG, send_and_recv, "send/recv to a killed server")
            except (PeerGoneError, ConnectError):
                pass
            else:
                raise AssertionError("a killed server answered send/recv")
        finally:
            client.close()
    finally:
        server.kill()
