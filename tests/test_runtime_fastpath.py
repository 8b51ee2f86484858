"""The runtime's fast paths (issue 24 items 2 and 4) give the bytes and outcomes of the plain ones.

- ``EchoEnv.step_into`` writes through memoryviews of the record it was handed, kept while the
  runtime hands it the same record: a different record (other field offsets, a new buffer after a
  remap) gets its own views, a record memoryviews cannot serve gets NumPy writes.
- ``VectorEchoEnv.step_envs`` writes every env in place through kept column views.
- ``EnvRuntime.check_actions`` screens a batch in a few whole-array operations and falls back to
  the full check when anything is off: the outcome (refusal text, ``noop`` envs) is the full
  check's.
- ``LocalEnvs.step_same`` (SAME_STEP, env by env in one loop) keeps finals and resets as
  ``Runner.step_same`` (``step_one`` per env) does, in the same order.

Each is compared with a reference in this file: the echo rule in plain NumPy field writes, the
screen turned off, the base class's SAME_STEP loop. N = 24 envs (above ``EACH_CHECK_MAX``: the
vectorised checks), in a packed buffer and in shm-like strided slots (the slot profile's offsets).
"""

from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from transport.backends.shm.region import ShmLayout
from transport.envs.echo import ACT_N, OBS_N, EchoEnv, episode_length
from transport.envs.vector_echo import VectorEchoEnv
from transport.generated import pac_env
from transport.protocol import AutoReset, RequestError
from transport.runtime.core import EACH_CHECK_MAX, MASKED_ACTION_POLICIES, EnvRuntime, Runner
from transport.runtime.env import Spaces
from transport.runtime.host import EnvHost

N = 24
EPISODE = 3
LAYOUT = ShmLayout.of(pac_env.SCHEMA)
assert N > EACH_CHECK_MAX


class ReferenceEchoEnv:
    """The echo env's rule (``transport.envs.echo``) in plain NumPy field writes."""

    def __init__(self, episode_len: int = 0) -> None:
        self.steps = 0
        self.episode_len = episode_len
        self.length = episode_len

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self.steps = 0
        out[()] = 0
        out["action_mask"] = 1
        if self.episode_len:
            self.length = episode_length(self.episode_len, seed, self.length)
            out["observation"][2] = self.length

    def step_into(self, action: int, out: np.ndarray) -> None:
        self.steps += 1
        obs = out["observation"]
        obs[0] = action
        obs[1] = self.steps
        out["reward"] = action / 4
        out["life"] = self.steps & 0xFFFF
        if self.episode_len:
            out["done"] = self.steps >= self.length


CALLS: list[tuple[str, int]] = []
"""The order envs were called in (``Ordered``): envs that share state see it."""


class Ordered(EchoEnv):
    """Echo that also logs each call and writes its position in the log into observation[3]."""

    def __init__(self) -> None:
        super().__init__(episode_len=EPISODE)

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        super().reset_into(seed, out)
        CALLS.append(("reset", id(self)))
        out["observation"][3] = len(CALLS)

    def step_into(self, action: int, out: np.ndarray) -> None:
        super().step_into(action, out)
        CALLS.append(("step", id(self)))
        out["observation"][3] = len(CALLS)


def _rows(layout: str, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """(results, finals) of ``n`` envs: a packed buffer, or strided shm-like slots."""
    if layout == "packed":
        codec = pac_env.StepResult
        return (
            codec.view(bytearray(codec.size * n), 0, count=n),
            codec.view(bytearray(codec.size * n), 0, count=n),
        )
    results = np.ndarray(
        (n,),
        dtype=LAYOUT.result_dtype,
        buffer=bytearray(LAYOUT.slot_size * n + 64),
        offset=16,
        strides=(LAYOUT.slot_size,),
    )
    finals = np.ndarray(
        (n,),
        dtype=LAYOUT.final_dtype,
        buffer=bytearray(LAYOUT.final_size * n + 64),
        offset=16,
        strides=(LAYOUT.final_size,),
    )
    return results, finals


def _actions(values: list[int], dtype: str) -> np.ndarray:
    """A batch of ``dtype``; ``strided-i4``: an i32 column of shm-like request slots."""
    if dtype != "strided-i4":
        return np.array(values, dtype=dtype)
    column = np.ndarray(
        (len(values),),
        dtype="<i4",
        buffer=bytearray(LAYOUT.slot_size * len(values) + 64),
        offset=12,
        strides=(LAYOUT.slot_size,),
    )
    column[:] = values
    return column


def _fields(rows: Any) -> list[bytes]:
    """Each field's bytes (the slot profile lays fields out at other offsets than a packed row)."""
    names = rows.dtype.names or ()
    return [np.ascontiguousarray(rows[name]).tobytes() for name in sorted(names)]


def _runtime(
    factory: Callable[[], Any], mode: AutoReset, layout: str, policy: str = "reject"
) -> EnvRuntime:
    host = EnvHost(pac_env.SCHEMA, factory, num_envs=N, masked_actions=policy)
    envs = host.create_envs()
    results, finals = _rows(layout)
    runtime = host.runtime(envs, results, finals)
    runtime.set_autoreset(int(mode))
    return runtime


def _plain(runtime: EnvRuntime) -> EnvRuntime:
    """The runtime without its fast paths: no screen, SAME_STEP through ``Runner.step_same``."""
    runtime._accepts_all = lambda actions, skip_done=False: False  # type: ignore[method-assign]
    runner = runtime.runner
    runner.step_same = functools.partial(Runner.step_same, runner)  # type: ignore[method-assign]
    return runtime


def _trace(runtime: EnvRuntime, seed: int, dtype: str, steps: int = 24) -> list[Any]:
    """Results, finals and refusals of a random run: in-range actions, some out of range, some
    masked (mask entries cleared after each reset), an env lost now and then."""
    rng = random.Random(seed)
    out: list[Any] = []
    runtime.reset_seed(seed)
    rows = runtime.runner.results
    finals = runtime.runner.finals
    assert finals is not None
    for t in range(steps):
        if t % 5 == 4:  # mask a few actions of a few envs
            for i in rng.sample(range(N), 3):
                rows["action_mask"][i, rng.randrange(8)] = 0
        values = [rng.randrange(8) for _ in range(N)]
        if rng.random() < 0.15 or t == 7:
            values[rng.randrange(N)] = ACT_N + rng.randrange(3)
        if dtype in ("i1", "strided-i4", "i8") and rng.random() < 0.15:
            values[rng.randrange(N)] = -1
        if rng.random() < 0.1 or t == 13:
            runtime.mark_lost(rng.randrange(N))
        try:
            ended = runtime.step(_actions(values, dtype))
        except RequestError as exc:
            out.append(("refused", int(exc.code), exc.text))
            runtime.reset_seed(seed + t)
            continue
        out += [_fields(rows[:N]), ended, [_fields(finals[i : i + 1]) for i in ended]]
    return out


@pytest.mark.parametrize("layout", ["packed", "shm"])
@pytest.mark.parametrize("mode", [AutoReset.NEXT_STEP, AutoReset.SAME_STEP, AutoReset.DISABLED])
@pytest.mark.parametrize("policy", MASKED_ACTION_POLICIES)
def test_fast_paths_give_the_plain_runtimes_trace(
    layout: str, mode: AutoReset, policy: str
) -> None:
    dtype = {"packed": "u1", "shm": "strided-i4"}[layout]
    fast = _runtime(functools.partial(EchoEnv, EPISODE), mode, layout, policy)
    plain = _plain(_runtime(functools.partial(ReferenceEchoEnv, EPISODE), mode, layout, policy))
    seed = zlib.crc32(f"{layout}-{mode}-{policy}".encode()) % 1000
    got, want = _trace(fast, seed, dtype), _trace(plain, seed, dtype)
    assert got == want
    assert any(isinstance(x, tuple) for x in want)  # refusals were exercised
    if mode == AutoReset.SAME_STEP:
        assert any(isinstance(x, list) and x and isinstance(x[0], int) for x in want)


@pytest.mark.parametrize("dtype", ["u1", "i1", "strided-i4", "i8", "u8", "u2"])
def test_the_screen_gives_the_full_checks_outcome(dtype: str) -> None:
    """check_actions with and without its screen: the same refusal or ``noop`` envs, batch by
    batch, with done envs, lost envs, masked and out-of-range actions of each dtype."""
    rng = random.Random(dtype)
    for policy in MASKED_ACTION_POLICIES:
        fast = _runtime(EchoEnv, AutoReset.NEXT_STEP, "shm", policy)
        plain = _plain(_runtime(EchoEnv, AutoReset.NEXT_STEP, "shm", policy))
        for runtime in (fast, plain):
            runtime.reset_seed(1)
        for _ in range(60):
            state = rng.random()
            values = [rng.randrange(ACT_N) for _ in range(N)]
            edits: list[tuple[str, int, int]] = []
            if state < 0.2:
                done = rng.randrange(N)
                edits.append(("done", done, 1))
                if rng.random() < 0.3:  # a done env's action out of range, or masked
                    values[done] = ACT_N + rng.randrange(30)
                elif rng.random() < 0.3:
                    edits.append(("mask", done, 0))
            if 0.2 <= state < 0.4:
                edits.append(("mask", rng.randrange(N), 0))
            if 0.4 <= state < 0.5:
                values[rng.randrange(N)] = ACT_N + rng.randrange(30)
            if 0.5 <= state < 0.6 and dtype[-2] == "i":
                values[rng.randrange(N)] = -rng.randrange(1, 100)
            lost = rng.randrange(N) if 0.6 <= state < 0.7 else None
            skip_done = rng.random() < 0.5
            outcomes: list[tuple[Any, ...]] = []
            for runtime in (fast, plain):
                runtime.reset_seed(1)
                rows = runtime.runner.results
                for what, i, value in edits:
                    if what == "done":
                        rows["done"][i] = value
                    else:
                        rows["action_mask"][i, values[i]] = value
                if lost is not None:
                    runtime.mark_lost(lost)
                try:
                    noop = runtime.check_actions(_actions(values, dtype), skip_done=skip_done)
                    outcomes.append(("ok", None if noop is None else noop.tolist()))
                except RequestError as exc:
                    outcomes.append(("refused", int(exc.code), exc.text))
            assert outcomes[0] == outcomes[1], (policy, values, edits, lost, skip_done)


def test_same_step_calls_envs_in_the_plain_order() -> None:
    """Envs that share state (here: one log) see the calls in the order ``step_one`` makes
    them: env i's reset right after the step that ended it, before env i+1 steps."""
    traces = []
    for make in (lambda rt: rt, _plain):
        runtime = make(_runtime(Ordered, AutoReset.SAME_STEP, "packed"))
        CALLS.clear()
        runtime.reset_seed(3)
        envs = runtime.runner.envs  # type: ignore[union-attr]
        calls, ended = [], []
        for t in range(9):
            ended.append(runtime.step(np.full(N, t % 7, dtype=np.uint8)))
        calls = [(what, envs.index(next(e for e in envs if id(e) == who))) for what, who in CALLS]
        traces.append((calls, ended, _fields(runtime.runner.results)))
    assert traces[0] == traces[1]
    assert any(ended for ended in traces[0][1])


def test_echo_views_follow_the_record_they_are_handed() -> None:
    """The cached views are of the record last handed: another record (other offsets, another
    buffer as after a remap) gets its own; the record given before keeps its last bytes."""
    env, reference = EchoEnv(EPISODE), ReferenceEchoEnv(EPISODE)
    packed, _ = _rows("packed", 2)
    slots, _ = _rows("shm", 2)
    remapped, _ = _rows("shm", 2)
    want_packed, _ = _rows("packed", 2)
    want_slots, _ = _rows("shm", 2)
    want_remapped, _ = _rows("shm", 2)
    env.reset_into(5, packed[0, ...])
    reference.reset_into(5, want_packed[0, ...])
    sequence = [
        (packed, want_packed),
        (packed, want_packed),
        (slots, want_slots),
        (packed, want_packed),
        (remapped, want_remapped),
        (remapped, want_remapped),
    ]
    for step, (rows, want) in enumerate(sequence):
        env.step_into(step + 1, rows[0, ...])  # a new 0-d view object each time
        reference.step_into(step + 1, want[0, ...])
        for got_rows, want_rows in ((packed, want_packed), (slots, want_slots)):
            assert _fields(got_rows) == _fields(want_rows)
        assert _fields(remapped) == _fields(want_remapped)
    kept = packed[1, ...]
    env.steps = reference.steps = 65533  # life wraps at 65536
    for action in range(5):  # the same record object each step: the kept views
        env.step_into(action, kept)
        reference.step_into(action, want_packed[1, ...])
        assert _fields(packed) == _fields(want_packed)


def test_echo_writes_records_views_cannot_serve() -> None:
    """A big-endian record, a misaligned one, a read-only one: NumPy's writes (or its error)."""
    native = pac_env.StepResult.zeros()
    swapped = np.zeros((), dtype=native.dtype.newbyteorder(">"))
    fields = native.dtype.fields
    assert fields is not None
    names = list(fields)
    shifted = np.zeros(
        (),
        dtype=np.dtype(
            {
                "names": names,
                "formats": [fields[name][0] for name in names],
                "offsets": [fields[name][1] + 1 for name in names],  # misaligned items
                "itemsize": native.dtype.itemsize + 1,
            }
        ),
    )
    for out in (native, swapped, shifted):
        env = EchoEnv(EPISODE)
        env.reset_into(2, out)
        env.step_into(7, out)
        env.step_into(9, out)
        assert out["observation"][:3].tolist() == [9.0, 2.0, EPISODE + 2]
        assert float(out["reward"]) == 9 / 4 and int(out["life"]) == 2
    readonly = pac_env.StepResult.zeros()
    readonly.flags.writeable = False
    with pytest.raises(ValueError):
        EchoEnv().step_into(1, readonly)
    huge = pac_env.StepResult.zeros()
    EchoEnv().step_into(2**200, huge)  # past f32: NumPy's inf, as before the fast path
    assert np.isinf(huge["observation"][0])


@pytest.mark.parametrize("dtype", ["u1", "strided-i4", "i8", "i2"])
@pytest.mark.parametrize("layout", ["packed", "shm"])
def test_vector_echo_in_place_step_equals_the_echo_rule(dtype: str, layout: str) -> None:
    """step_envs over every env (kept column views) writes each row as the echo rule does, for
    each action dtype, and follows a different ``out`` (rows remapped)."""
    rng = random.Random(f"{dtype}-{layout}")
    env = VectorEchoEnv(N, episode_len=EPISODE)
    references = [ReferenceEchoEnv(EPISODE) for _ in range(N)]
    rows, _ = _rows(layout)
    want, _ = _rows(layout)
    env.reset_envs(np.arange(N), list(range(N)), rows)
    for i, reference in enumerate(references):
        reference.reset_into(i, want[i, ...])
        reference.steps = 65535  # the first step wraps life to 0
    env.steps[:] = 65535
    for t in range(8):
        if t == 5:  # the rows move (a new buffer): the env is handed the new ones
            moved, _ = _rows(layout)
            moved[...] = rows
            rows = moved
        values = [rng.randrange(ACT_N) for _ in range(N)]
        ended = np.flatnonzero(rows["done"][:N]).tolist()
        if ended:
            env.reset_envs(np.array(ended), [None] * len(ended), rows)
            for i in ended:
                references[i].reset_into(None, want[i, ...])
        env.step_envs(_actions(values, dtype), None, rows)
        for i, reference in enumerate(references):
            reference.step_into(values[i], want[i, ...])
        assert _fields(rows) == _fields(want), t
