"""Contract checks of asynchronous batches (SEND / RECV / ASYNC_RESET): results equal the
lock-step results of the same env ids and actions (a local ContractEnv predicts every byte),
RECV returns at most B, every env id comes back exactly once, misuse is ASYNC_STATE."""

from __future__ import annotations

import random

import numpy as np

from transport.errors import RemoteError
from transport.protocol import AutoReset, ErrorCode
from transport.testing.checks import (
    SEATS_ENVS,
    CheckContext,
    _check,
    _pick,
)
from transport.testing.model import ExpectedSession, field_differences


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


@_check(per_schema=True)
def check_async_batches(ctx: CheckContext) -> None:
    """send/recv with B = N/2 under next_step auto-reset: each RECV has at most B results, every
    env id comes back once per send, and every byte is the lock-step result of that env."""
    server = ctx.server(SEATS_ENVS)
    mode = AutoReset.NEXT_STEP
    rng = random.Random(7)
    with ctx.connect(server, autoreset="next_step") as client:
        n = client.num_envs
        batch = max(1, n // 2)
        model = ExpectedSession(ctx.schema, n, server_seed=None, autoreset=mode)
        model.reset(31)
        client.async_reset(31)
        ready: list[int] = []
        seen: list[int] = []
        while len(seen) < n:
            got = client.recv(batch)
            ids = got.env_ids.tolist()
            assert 1 <= len(ids) <= batch, f"async reset: recv returned {len(ids)} > {batch}"
            _expect_rows(got.results.record, ids, model, "async reset")
            seen += ids
        assert sorted(seen) == list(range(n)), f"async reset returned envs {sorted(seen)}"
        ready = seen
        for rnd in range(6):
            picked = _pick(model, rng)
            send_ids = ready[: max(1, len(ready))]
            actions = [picked[i] for i in send_ids]
            # the model steps only the envs sent (lock-step semantics per env)
            for i, a in zip(send_ids, actions, strict=True):
                _step_model_env(model, i, a)
            client.send(actions, send_ids)
            back: list[int] = []
            while len(back) < len(send_ids):
                got = client.recv(batch)
                ids = got.env_ids.tolist()
                assert 1 <= len(ids) <= batch, f"round {rnd}: recv returned {len(ids)} results"
                assert not set(ids) & set(back), f"round {rnd}: env ids {ids} came back twice"
                _expect_rows(got.results.record, ids, model, f"round {rnd}")
                back += ids
            assert sorted(back) == sorted(send_ids), f"round {rnd}: got {back}, sent {send_ids}"
            ready = back


def _step_model_env(model: ExpectedSession, i: int, action: int) -> None:
    """One env of the model steps (NEXT_STEP: an ended env resets instead)."""
    env = model.envs[i]
    if model.autoreset == AutoReset.NEXT_STEP and model.done(i):
        model.results[i] = env.reset(None)
        return
    model.results[i] = env.step(int(action))


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
