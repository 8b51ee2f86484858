"""The batched echo path at N = 256 over shm (issue 24 goal: ordinary Python envs >= 2M
env-steps/s) keeps the outcomes of the plain path.

- ``tp_screen_actions`` / ``tp_strided_any`` (the runtime's screen of a batch in one C pass)
  agree with NumPy's whole-array checks for every integer width, sign, row stride and mask.
- ``tp_server_publish`` stores a slot's status only where it changes, yet a status that goes
  back to 0 after a refusal is written (end to end: a refused batch, then a good one).
- ``EnvRuntime``'s screen follows the array it is handed (a new array at a reused id, an array
  changed in place) and refuses as the full check does.
- ``LocalEnvs.step_many``'s index-free loop names the env that raised or returned an output.
- ``EchoEnv`` chooses its views again when ``episode_len`` changes after a step.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport import native
from transport.backends.shm.region import ShmLayout
from transport.envs.echo import EchoEnv
from transport.errors import EnvError, TransportError
from transport.generated import pac_env
from transport.protocol import AutoReset, ErrorCode, RequestError
from transport.runtime.core import EACH_CHECK_MAX, NativeColumn
from transport.runtime.env import Spaces
from transport.runtime.host import EnvHost

from .servers import ServerProcess

N = 40
assert N > EACH_CHECK_MAX  # the vectorised (screened) checks
LAYOUT = ShmLayout.of(pac_env.SCHEMA)
ACT_N = 92


def _strided(values: np.ndarray, stride_items: int) -> np.ndarray:
    """``values`` laid out ``stride_items`` items apart (an shm slot's column)."""
    base = np.zeros(len(values) * stride_items, dtype=values.dtype)
    column = base[::stride_items]
    column[:] = values
    return column


def _numpy_screen(actions: np.ndarray, act_n: int, masks: np.ndarray | None) -> bool:
    wide = actions.astype(object)  # no overflow: Python ints
    if any(a < 0 or a >= act_n for a in wide):
        return False
    if masks is None:
        return True
    return all(masks[i, int(a)] != 0 for i, a in enumerate(wide))


@pytest.mark.parametrize("dtype", ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8"])
@pytest.mark.parametrize("stride_items", [1, 7])
def test_native_action_screen_agrees_with_numpy(dtype: str, stride_items: int) -> None:
    rng = np.random.default_rng(stride_items)
    info = np.iinfo(dtype)
    masks_base = np.ones((N, 200), dtype=np.uint8)
    masks = masks_base[:, :ACT_N]  # rows 200 bytes apart
    for trial in range(60):
        values = rng.integers(0, ACT_N, size=N).astype(dtype)
        masks[:] = 1
        if trial % 3 == 1:  # one value out of range: past act_n, negative, or the type's extremes
            bad = [ACT_N, info.max, info.min if info.min < 0 else info.max, -1 if info.min else 0]
            values[rng.integers(N)] = bad[trial % len(bad)]
        if trial % 4 == 2:  # one taken action masked out
            i = int(rng.integers(N))
            masks[i, int(values[i])] = 0
        column = NativeColumn.of(_strided(values, stride_items))
        assert column is not None
        for mask in (None, masks):
            want = _numpy_screen(values, ACT_N, mask)
            ptr, mstride = (
                (native.ffi.NULL, 0)
                if mask is None
                else (native.ffi.cast("char *", mask.__array_interface__["data"][0]), 200)
            )
            got = native.lib.tp_screen_actions(
                column.ptr,
                column.stride,
                column.itemsize,
                column.signed,
                column.count,
                ACT_N,
                ptr,
                mstride,
            )
            assert bool(got) == want, (dtype, values.tolist(), trial)


@pytest.mark.parametrize("dtype", ["?", "u1", "i2", "u4", "i8"])
def test_native_any_agrees_with_count_nonzero(dtype: str) -> None:
    for where in [None, 0, N // 2, N - 1]:
        values = np.zeros(N, dtype=dtype)
        if where is not None:
            values[where] = 1 if dtype != "i8" else -(2**40)
        column = NativeColumn.of(_strided(values, 5))
        assert column is not None
        assert column.any() == bool(np.count_nonzero(values))
    assert NativeColumn.of(np.zeros(4, dtype="f4")) is None  # floats: NumPy reads them
    assert NativeColumn.of(np.zeros(4, dtype=">u4")) is None  # not native byte order
    assert NativeColumn.of(np.zeros(0, dtype="u1")) is None


def test_publish_writes_changed_statuses_and_every_response_word() -> None:
    """A fake region of 6 slots: only pending slots are answered; status stores where needed."""
    slots, stride = 6, 128
    region = bytearray(slots * stride)
    words = np.frombuffer(region, dtype=np.uint32).reshape(slots, stride // 4)
    statuses = np.frombuffer(region, dtype=np.uint16).reshape(slots, stride // 2)
    ctx = native.new_ctx()
    ctx.slots = native.address(region)
    ctx.stride, ctx.n = stride, slots
    ctx.req_off, ctx.resp_off, ctx.status_off = 0, 4, 64
    seqs = np.zeros(slots, dtype=np.uint32)
    ctx.seqs = native.ffi.cast("uint32_t *", native.ffi.from_buffer(seqs, require_writable=True))
    pending = np.zeros(slots, dtype=np.uint8)
    ptr = native.ffi.cast("uint8_t *", native.ffi.from_buffer(pending, require_writable=True))
    same = native.ffi.new("int32_t *")
    statuses[:, 32] = [0, 7, 7, 0, 3, 0]
    words[:, 0] = [1, 1, 0, 2, 5, 0]  # request words: slots 0, 1, 3, 4 pending
    words[:, 2] = 4  # the command word at offset 8
    assert native.lib.tp_server_pending(ctx, ptr, 8, same) == 4
    assert pending.tolist() == [1, 1, 0, 1, 1, 0] and same[0] == 4
    native.lib.tp_server_publish(ctx, ptr, 0)
    assert statuses[:, 32].tolist() == [0, 0, 7, 0, 0, 0]  # slot 2 was not pending
    assert words[:, 1].tolist() == [1, 1, 0, 2, 5, 0]
    words[:, 0] += 1
    native.lib.tp_server_pending(ctx, ptr, 8, same)
    native.lib.tp_server_publish(ctx, ptr, 9)
    assert statuses[:, 32].tolist() == [9, 9, 9, 9, 9, 9]
    words[:, 0] += 1
    native.lib.tp_server_pending(ctx, ptr, 8, same)
    statuses[:, 32] = [1, 0, 2, 0, 3, 0]
    native.lib.tp_server_publish(ctx, ptr, -1)  # statuses written by the caller: left alone
    assert statuses[:, 32].tolist() == [1, 0, 2, 0, 3, 0]
    assert words[:, 1].tolist() == words[:, 0].tolist()


# -- the runtime's screen ------------------------------------------------------------------------


def _runtime(factory: Any = EchoEnv, mode: AutoReset = AutoReset.NEXT_STEP) -> Any:
    host = EnvHost(pac_env.SCHEMA, factory, num_envs=N)
    rows = np.zeros(N, dtype=LAYOUT.result_dtype)
    finals = np.zeros(N, dtype=LAYOUT.result_dtype)
    runtime = host.runtime(host.create_envs(), rows, finals)
    runtime.set_autoreset(int(mode))
    runtime.reset_seed(1)
    return runtime


def test_screen_follows_the_array_it_is_handed() -> None:
    runtime = _runtime()
    slots = np.zeros(N * 9, dtype=np.int32)
    actions = slots[::9]  # strided, as the server's view of the slots
    actions[:] = 3
    runtime.step(actions)
    actions[5] = ACT_N  # changed in place: the screen reads the memory, not a copy
    with pytest.raises(RequestError) as refused:
        runtime.step(actions)
    assert refused.value.code == ErrorCode.INVALID_ACTION and "env 5" in refused.value.text
    actions[5] = 1
    runtime.step(actions)
    for _ in range(3):  # new arrays (ids may be reused): each one screened as itself
        fresh = np.full(N, 2, dtype=np.int64)
        fresh[N - 1] = -1
        with pytest.raises(RequestError) as refused:
            runtime.step(fresh)
        assert f"env {N - 1}" in refused.value.text
        del fresh
    runtime.masks[7, 4] = 0  # a masked action
    taken = np.full(N, 4, dtype=np.uint8)
    with pytest.raises(RequestError) as refused:
        runtime.step(taken)
    assert refused.value.code == ErrorCode.MASKED_ACTION and "env 7" in refused.value.text


# -- the runner's index-free loop ----------------------------------------------------------------


class _Picky(EchoEnv):
    """Raises on action 13; returns its result (no step_into) on action 17 via ``step``."""

    def step_into(self, action: int, out: np.ndarray) -> Any:
        if action == 13:
            raise ValueError("thirteen")
        if action == 17:
            record = pac_env.StepResult.zeros()
            super().step_into(action, record)
            record["reward"] = -1.0
            return record
        return super().step_into(action, out)

    def spaces(self) -> Spaces:
        return Spaces(612, ACT_N)


def test_step_loop_names_the_env_that_raised_or_returned() -> None:
    runtime = _runtime(_Picky, AutoReset.DISABLED)
    actions = np.full(N, 2, dtype=np.int32)
    actions[[4, 30]] = 17  # outputs written into their own rows
    actions[[9, 21]] = 13  # two envs raise; the others step
    with pytest.raises(RequestError) as refused:
        runtime.step(actions)
    assert refused.value.code == ErrorCode.ENV_ERROR
    assert "env 9" in refused.value.text and "env 21" in refused.value.text
    rows = runtime.runner.results
    assert rows["reward"][[4, 30]].tolist() == [-1.0, -1.0]
    stepped = [i for i in range(N) if i not in (4, 9, 21, 30)]
    assert (rows["reward"][stepped] == 0.5).all()
    assert (rows["observation"][stepped, 1] == 1).all()


def test_echo_views_follow_episode_len_set_after_a_step() -> None:
    env = EchoEnv()
    rows = np.zeros(2, dtype=LAYOUT.result_dtype)
    record = rows[0, ...]
    env.reset_into(None, record)
    env.step_into(1, record)
    assert int(record["done"]) == 0
    env.episode_len = env.length = 2  # now episodes end: the same record gets ``done``
    env.step_into(1, record)
    assert int(record["done"]) == 1 and float(record["observation"][1]) == 2.0
    env.episode_len = 0
    env.reset_into(None, record)
    env.step_into(3, record)
    assert int(record["done"]) == 0 and float(record["reward"]) == 0.75


# -- end to end: statuses over shm ---------------------------------------------------------------


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    name = f"shm://test-sef-{uuid.uuid4().hex[:12]}?num_envs={N}"
    with ServerProcess(name, env="echo", num_envs=N) as server:
        yield server.url


def test_a_good_batch_after_a_refused_one_reads_status_zero(url: str) -> None:
    with api.connect(url, timeout=20, autoreset="next_step") as client:
        client.reset(seed=1)
        actions = np.full(N, 5, dtype=np.int64)
        view = client.step(actions)
        assert np.asarray(view.observation)[:, 0].tolist() == [5.0] * N
        bad = actions.copy()
        bad[11] = ACT_N + 1
        with pytest.raises((TransportError, EnvError, RequestError)) as refused:
            client.step(bad)
        assert "env 11" in str(refused.value)
        for step in range(3):  # every slot's status went back to 0: no stale refusal
            view = client.step(actions + step)
            assert np.asarray(view.observation)[:, 0].tolist() == [5.0 + step] * N


@pytest.mark.parametrize("action", [0, 1, 91, 92, 1000, -3, True, np.int64(5), 2.5, 2**40])
def test_echo_step_bytes_for_any_action(action: Any) -> None:
    """In range (the tables), past them, negative, bool, NumPy and float actions: the bytes of
    NumPy's field writes of the echo rule."""
    rows = np.zeros(2, dtype=LAYOUT.result_dtype)
    want = np.zeros(2, dtype=LAYOUT.result_dtype)
    env = EchoEnv()
    env.reset_into(None, rows[0, ...])
    env.steps = 70000  # life wraps
    record = rows[0, ...]
    env.step_into(action, rows[0, ...])  # a view it has not seen: new views
    env.step_into(action, record)  # another one, then kept
    env.step_into(action, record)
    want[0]["action_mask"] = 1
    want["observation"][0, 0] = action
    want["observation"][0, 1] = 70003
    want["reward"][0] = action / 4
    want["life"][0] = 70003 & 0xFFFF
    assert rows.tobytes() == want.tobytes()
