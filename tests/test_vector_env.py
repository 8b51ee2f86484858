"""Vector envs (issue 24 item 1): one env object steps all N envs in one call; the runtime keeps
auto-reset, finals, masks, seeds and errors vectorised. Real servers in child processes (unix and
shm), traces compared with the same envs stepped in this process."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from transport import api
from transport.envs.echo import EchoEnv
from transport.envs.vector_echo import VectorEchoEnv
from transport.errors import RemoteError
from transport.generated import pac_env
from transport.protocol import AutoReset, ErrorCode, RequestError
from transport.runtime.core import EnvRuntime
from transport.runtime.host import EnvHost

pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered")

N = 5
EPISODE = 3
STEPS = 14
MODES = ["disabled", "next_step", "same_step"]

_SERVE = """
import functools, sys, warnings
warnings.filterwarnings("ignore")
import transport
kind, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
schema = None
if kind == "vector_echo":
    from transport.envs.vector_echo import VectorEchoEnv
    env = functools.partial(VectorEchoEnv, n, episode_len=3)
elif kind == "envpool":
    import envpool
    from transport.envs.vector_gym import EnvPoolEnv
    def env():  # a fresh pool (made with seed 11) for each client
        return EnvPoolEnv(envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=11))
    schema = EnvPoolEnv(envpool.make_gymnasium("CartPole-v1", num_envs=1)).SCHEMA
elif kind == "gymvec":
    import gymnasium
    from transport.envs.vector_gym import GymVectorEnv
    env = GymVectorEnv(gymnasium.make_vec("CartPole-v1", n, vectorization_mode="sync"))
server = transport.Server(env, url, num_envs=n, schema=schema).start()
print("ready", flush=True)
sys.stdin.read()
server.close()
"""


class _Child:
    """A server (``_SERVE``) in a child process; closing its stdin stops it."""

    def __init__(self, kind: str, scheme: str, n: int) -> None:
        name = f"tvec-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if scheme == "shm":
            self.url = f"shm://{name}?num_envs={n}"
        else:
            self.url = f"unix://{tempfile.gettempdir()}/{name}.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, kind, self.url, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise RuntimeError(f"the {kind} server did not start: {line!r}")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def servers() -> Iterator[Any]:
    started: dict[tuple[str, str], _Child] = {}

    def get(kind: str, scheme: str, n: int = N) -> str:
        key = (kind, scheme)
        if key not in started:
            started[key] = _Child(kind, scheme, n)
        return started[key].url

    yield get
    for child in started.values():
        child.close()


# -- references: the same envs stepped in this process ------------------------------------------


def _runtime(factory: Any, n: int, mode: str, schema: Any = pac_env.SCHEMA) -> EnvRuntime:
    host = EnvHost(schema, factory, num_envs=n)
    host.check()
    envs = host.create_envs()
    codec = host.result
    results = codec.view(bytearray(codec.size * n), 0, count=n)
    finals = codec.view(bytearray(codec.size * n), 0, count=n)
    runtime = host.runtime(envs, results, finals)
    runtime.set_autoreset(int(AutoReset[mode.upper()]))
    return runtime


def _actions(t: int, n: int = N) -> np.ndarray:
    return ((np.arange(n) * 7 + t * 3) % 92).astype(np.uint8)


def _trace_local(factory: Any, mode: str) -> list[Any]:
    runtime = _runtime(factory, N, mode)
    rows, finals = runtime.runner.results, runtime.runner.finals
    assert finals is not None
    runtime.reset_seed(7)
    out: list[Any] = [rows.copy()]
    for t in range(STEPS):
        done = runtime.done_mask()
        if mode == "disabled" and done is not None and done.any():
            runtime.reset()
            out.append(rows.copy())
            continue
        ended = sorted(runtime.step(_actions(t)))
        out += [rows.copy(), ended, [finals[i].copy() for i in ended]]
    runtime.close()
    return out


def _trace_remote(url: str, mode: str) -> list[Any]:
    out: list[Any] = []
    with api.connect(url, pac_env.SCHEMA, autoreset=mode, timeout=30) as client:
        rows = client.reset(seed=7).record.copy()
        out.append(rows)
        for t in range(STEPS):
            if mode == "disabled" and rows["done"].any():
                rows = client.reset().record.copy()
                out.append(rows)
                continue
            rows = client.step(_actions(t)).record.copy()
            ended = sorted(i for i, _ in client.finals)
            finals = dict((i, v.record.copy()) for i, v in client.finals)
            out += [rows, ended, [finals[i] for i in ended]]
    return out


def _fields(rows: np.ndarray) -> list[bytes]:
    """Each field's bytes (shm slots lay the fields out at other offsets than a packed body)."""
    names = rows.dtype.names or ()
    return [np.ascontiguousarray(rows[name]).tobytes() for name in sorted(names)]


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, np.ndarray):
            assert _fields(x) == _fields(np.asarray(y)), f"item {k} differs"
        elif isinstance(x, list) and x and isinstance(x[0], np.ndarray):
            assert [_fields(r) for r in x] == [_fields(r) for r in y], f"finals {k} differ"
        else:
            assert x == y, f"item {k}: {x} != {y}"


# -- the vectorised echo env ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_vector_echo_in_process_equals_one_env_per_object(mode: str) -> None:
    """The vector runner's NumPy auto-reset gives the bytes of the per-env runner."""
    vector = _trace_local(functools.partial(VectorEchoEnv, N, episode_len=EPISODE), mode)
    ordinary = _trace_local(functools.partial(EchoEnv, episode_len=EPISODE), mode)
    _same(vector, ordinary)
    if mode == "same_step":  # episodes ended, their finals kept
        assert any(isinstance(x, list) and x and isinstance(x[0], int) for x in vector)


@pytest.mark.parametrize("scheme", ["unix", "shm"])
@pytest.mark.parametrize("mode", MODES)
def test_vector_echo_served_equals_in_process(servers: Any, scheme: str, mode: str) -> None:
    url = servers("vector_echo", scheme)
    expected = _trace_local(functools.partial(EchoEnv, episode_len=EPISODE), mode)
    _same(_trace_remote(url, mode), expected)


def test_seeds_env_i_gets_seed_plus_i(servers: Any) -> None:
    with api.connect(servers("vector_echo", "shm"), pac_env.SCHEMA, timeout=30) as client:
        lengths = client.reset(seed=7).observation[:, 2]
    assert lengths.tolist() == [EPISODE + (7 + i) % 5 for i in range(N)]


# -- errors and refusals ---------------------------------------------------------------------


class _Failing(VectorEchoEnv):
    """Raises when any env is stepped with action 13."""

    def step_envs(self, actions: np.ndarray, ids: np.ndarray | None, out: np.ndarray) -> None:
        taken = actions if ids is None else actions[ids]
        if (taken == 13).any():
            raise ValueError("action 13")
        super().step_envs(actions, ids, out)


def test_an_env_error_fails_the_call_and_the_envs_are_reset() -> None:
    runtime = _runtime(functools.partial(_Failing, N), N, "next_step")
    runtime.reset_seed(1)
    runtime.step(np.ones(N, dtype=np.uint8))
    with pytest.raises(RequestError) as info:
        runtime.step(np.full(N, 13, dtype=np.uint8))
    assert info.value.code == ErrorCode.ENV_ERROR
    assert info.value.text.startswith(
        "env 0: ValueError: action 13 (the env was reset); envs 1..4: the same error "
        "(the env was reset)"
    )
    assert info.value.env_ids == tuple(range(N))
    rows = runtime.runner.results
    assert (rows["observation"][:, 1] == 0).all()  # reset results
    runtime.step(np.ones(N, dtype=np.uint8))  # the next request works
    assert (rows["observation"][:, 1] == 1).all()


def test_a_bad_action_is_refused_by_the_runtime_and_serving_goes_on(servers: Any) -> None:
    with api.connect(servers("vector_echo", "unix"), pac_env.SCHEMA, timeout=30) as client:
        client.reset(seed=1)
        actions = np.ones(N, dtype=np.uint8)
        actions[3] = 92  # outside 0..91: the runtime's vectorised check names env 3
        with pytest.raises(RemoteError, match="env 3") as info:
            client.step(actions)
        assert info.value.code == ErrorCode.INVALID_ACTION
        assert client.step(np.ones(N, dtype=np.uint8)).observation[0, 1] == 1


def test_refusals_at_start() -> None:
    schema = pac_env.SCHEMA
    with pytest.raises(ValueError, match="workers=0"):
        EnvHost(schema, functools.partial(VectorEchoEnv, 4), num_envs=4, workers=2).check()
    with pytest.raises(ValueError, match="num_envs=4"):
        EnvHost(schema, functools.partial(VectorEchoEnv, 4), num_envs=3).check()
    with pytest.raises(ValueError, match="num_envs=4"):
        EnvHost(schema, VectorEchoEnv(4), num_envs=2)

    class AllTogether(VectorEchoEnv):
        steps_subsets = False

    with pytest.raises(ValueError, match="autoreset_next_step"):
        EnvHost(schema, functools.partial(AllTogether, 4), num_envs=4).check()

    class Native(AllTogether):
        autoreset_next_step = True

    with pytest.raises(ValueError, match="noop"):
        EnvHost(schema, functools.partial(Native, 4), num_envs=4, masked_actions="noop").check()


# -- EnvPool and gymnasium vector envs --------------------------------------------------------


def _envpool(n: int) -> Any:
    envpool = pytest.importorskip("envpool")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=11)


def _cartpole_actions(steps: int, n: int) -> np.ndarray:
    return np.random.default_rng(3).integers(0, 2, size=(steps, n)).astype(np.uint8)


def _envpool_matches_in_process(url: str, n: int, steps: int) -> None:
    """A NEXT_STEP client of an EnvPoolEnv server at ``url`` sees EnvPool's own trajectories
    (stepped here with the same actions), byte for byte, episode ends included."""
    pool = _envpool(n)
    actions = _cartpole_actions(steps, n)
    obs, _ = pool.reset()
    expected = [(obs.copy(), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool))]
    for t in range(steps):
        obs, reward, terminated, truncated, _ = pool.step(actions[t].astype(np.int32))
        expected.append((obs.copy(), reward.copy(), terminated.copy(), truncated.copy()))
    assert sum(int(e[2].sum()) for e in expected) > n  # episodes ended (and auto-reset)
    with api.connect(url, autoreset="next_step", timeout=30) as client:
        got = [client.reset(copy=True)]
        got += [client.step(actions[t], copy=True) for t in range(steps)]
    for t, (view, want) in enumerate(zip(got, expected, strict=True)):
        assert view.observation.tobytes() == want[0].astype(np.float32).tobytes(), t
        assert np.array_equal(view.reward, want[1]), t
        assert np.array_equal(view.terminated, want[2]), t
        assert np.array_equal(view.truncated, want[3]), t


def test_envpool_over_shm_equals_envpool_in_process(servers: Any) -> None:
    """NEXT_STEP is EnvPool's own auto-reset: the served trajectories are EnvPool's."""
    _envpool_matches_in_process(servers("envpool", "shm", 8), 8, 80)


def test_envpool_in_the_shm_column_layout_writes_the_columns() -> None:
    """``EnvPoolEnv(pool, shm_layout="columns")`` over shm:// writes the region's columns (the
    server copies nothing) and the trajectories are still EnvPool's own."""
    from transport.backends.shm.region import ColumnRecords
    from transport.envs.vector_gym import EnvPoolEnv

    n = 8
    schema = EnvPoolEnv(_envpool(1), shm_layout="columns").SCHEMA
    url = f"shm://vec-cols-{os.getpid()}-{uuid.uuid4().hex[:6]}?num_envs={n}"
    server = api.Server(
        lambda: EnvPoolEnv(_envpool(n), shm_layout="columns"), url, schema=schema, num_envs=n
    ).start()
    try:
        listener: Any = server.listener
        assert isinstance(listener.results, ColumnRecords) and listener._columns == []
        _envpool_matches_in_process(server.bound_url, n, 60)
    finally:
        server.close()


def test_envpool_box_actions_over_shm_equal_envpool_in_process() -> None:
    """A MuJoCo EnvPool (Box actions: the adapter's cast to EnvPool's dtype, the runtime's
    C screen of float actions) served over shm:// steps as the same pool in this process, byte
    for byte, actions at and inside the bounds."""
    envpool = pytest.importorskip("envpool")
    from transport.envs.vector_gym import EnvPoolEnv

    n, steps = 4, 40

    def make() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return envpool.make_gymnasium("HalfCheetah-v5", num_envs=n, seed=5)
            except Exception as exc:  # an EnvPool wheel without MuJoCo
                pytest.skip(f"EnvPool has no HalfCheetah-v5 here: {exc}")

    actions = np.random.default_rng(2).uniform(-1, 1, (steps, n, 6)).astype(np.float32)
    actions[::5, 0] = 1.0  # the bounds themselves are legal
    actions[1::5, 1] = -1.0
    pool = make()
    obs, _ = pool.reset()
    expected = [(obs.copy(), np.zeros(n))]
    for t in range(steps):
        obs, reward, _, _, _ = pool.step(actions[t].astype(np.float64))
        expected.append((obs.copy(), reward.copy()))
    adapter = EnvPoolEnv(make())
    url = f"shm://vec-box-{os.getpid()}-{uuid.uuid4().hex[:6]}?num_envs={n}"
    server = api.Server(adapter, url, schema=adapter.SCHEMA, num_envs=n).start()
    try:
        with api.connect(server.bound_url, autoreset="next_step", timeout=30) as client:
            got = [client.reset(copy=True)]
            got += [client.step(actions[t], copy=True) for t in range(steps)]
    finally:
        server.close()
    for t, (view, (observation, reward)) in enumerate(zip(got, expected, strict=True)):
        assert view.observation.tobytes() == observation.astype(view.observation.dtype).tobytes(), t
        assert np.array_equal(view.reward, reward), t


def _space_dtypes(space: Any) -> Any:
    """A zero of each leaf space's dtype, in the space's Dict structure."""
    if hasattr(space, "spaces") and isinstance(space.spaces, dict):
        return {key: _space_dtypes(sub) for key, sub in space.spaces.items()}
    return np.zeros((), space.dtype)


def _leaves(value: Any, path: str = "") -> list[tuple[str, np.ndarray]]:
    if isinstance(value, dict):
        return [leaf for key in value for leaf in _leaves(value[key], f"{path}{key}.")]
    return [(path, np.asarray(value))]


@pytest.mark.parametrize("env_id", ["CVRP-v1", "Parking-v0", "LunarLanderContinuous-v3"])
def test_envpool_envs_of_rich_spaces_served_equal_the_pool_in_process(env_id: str) -> None:
    """EnvPool envs nobody here wrote, with spaces our own envs lack (Jumanji's CVRP: a Dict of
    a 2-D Box, MultiBinary((21,)) masks, a scalar Box, an int32 Box; highway's Parking: a
    goal-conditioned Dict; Box2D's LunarLander: Box actions), served over shm by ``EnvPoolEnv``
    and stepped through ``RemoteVectorEnv``: the same spaces and the same trajectories (the
    values, each leaf in its space's dtype) as the same pool stepped here. (CVRP's
    MultiBinary((21,)) did not rebuild: MultiBinary(21) is not equal to it.)"""
    envpool = pytest.importorskip("envpool")
    from transport.envs.vector_gym import EnvPoolEnv
    from transport.gym import RemoteVectorEnv

    if env_id not in envpool.list_all_envs():
        pytest.skip(f"this EnvPool build has no {env_id}")
    n, steps = 3, 25

    def make() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return envpool.make_gymnasium(env_id, num_envs=n, seed=5)

    pool = make()
    pool.action_space.seed(1)
    actions = [np.stack([pool.action_space.sample() for _ in range(n)]) for _ in range(steps)]
    expected = [_leaves(pool.reset()[0])]
    for t in range(steps):
        obs, reward, terminated, truncated, _ = pool.step(actions[t])
        expected.append(_leaves(obs) + _leaves({"r": reward, "te": terminated, "tr": truncated}))
    space = pool.single_observation_space
    declared = {k: v.dtype for k, v in _leaves(_space_dtypes(space))}
    adapter = EnvPoolEnv(make())
    url = f"shm://vec-rich-{os.getpid()}-{uuid.uuid4().hex[:6]}?num_envs={n}"
    server = api.Server(adapter, url, schema=adapter.SCHEMA, num_envs=n).start()
    try:
        remote = RemoteVectorEnv(server.bound_url, timeout=30)
        try:
            assert remote.single_observation_space == pool.single_observation_space
            assert remote.single_action_space == pool.single_action_space
            got = [_leaves(remote.reset()[0])]
            for t in range(steps):
                obs, reward, terminated, truncated, _ = remote.step(actions[t])
                got.append(_leaves(obs) + _leaves({"r": reward, "te": terminated, "tr": truncated}))
        finally:
            remote.close()
    finally:
        server.close()
    for t, (have, want) in enumerate(zip(got, expected, strict=True)):
        assert [k for k, _ in have] == [k for k, _ in want], t
        for (key, a), (_, b) in zip(have, want, strict=True):
            # each leaf in its space's dtype (CVRP's masks come out of EnvPool as bool for an
            # int8 MultiBinary); rewards f64 as gymnasium's (EnvPool's f32 widens exactly)
            assert a.dtype == declared.get(key, np.float64 if key == "r." else b.dtype), (t, key)
            assert a.shape == b.shape and np.array_equal(a, b), (t, key)


def test_envpool_same_step_over_shm_equals_the_runtime_in_process(servers: Any) -> None:
    """SAME_STEP (the runtime's: finals kept, ended envs reset by EnvPool's partial reset): the
    served trace equals the same adapter under the runtime in this process."""
    from transport.envs.vector_gym import EnvPoolEnv

    n, steps = 8, 60
    actions = _cartpole_actions(steps, n)
    adapter = EnvPoolEnv(_envpool(n))
    runtime = _runtime(lambda: EnvPoolEnv(_envpool(n)), n, "same_step", adapter.SCHEMA)
    rows, finals = runtime.runner.results, runtime.runner.finals
    assert finals is not None
    runtime.reset()
    expected: list[Any] = [rows.copy()]
    for t in range(steps):
        ended = sorted(runtime.step(actions[t]))
        expected += [rows.copy(), ended, [finals[i].copy() for i in ended]]
    url = servers("envpool", "shm", n)
    got: list[Any] = []
    with api.connect(url, adapter.SCHEMA, autoreset="same_step", timeout=30) as client:
        got.append(client.reset().record.copy())
        for t in range(steps):
            got.append(client.step(actions[t]).record.copy())
            ended = sorted(i for i, _ in client.finals)
            by_env = {i: v.record.copy() for i, v in client.finals}
            got += [ended, [by_env[i] for i in ended]]
    assert any(isinstance(x, list) and x and isinstance(x[0], int) for x in got)
    _same(got, expected)


def test_gymnasium_vector_env_over_unix_equals_gymnasium_in_process(servers: Any) -> None:
    gymnasium = pytest.importorskip("gymnasium")
    n, steps = N, 60
    actions = _cartpole_actions(steps, n)
    env = gymnasium.make_vec("CartPole-v1", n, vectorization_mode="sync")
    obs, _ = env.reset(seed=5)
    expected = [obs.copy()]
    flags = []
    for t in range(steps):
        obs, reward, terminated, truncated, _ = env.step(actions[t].astype(np.int64))
        expected.append(obs.copy())
        flags.append((reward.copy(), terminated.copy(), truncated.copy()))
    env.close()
    with api.connect(servers("gymvec", "unix"), autoreset="next_step", timeout=30) as client:
        got = [client.reset(seed=5, copy=True)]
        got += [client.step(actions[t], copy=True) for t in range(steps)]
    for t, view in enumerate(got):
        assert view.observation.tobytes() == expected[t].astype(np.float32).tobytes(), t
        if t:
            reward, terminated, truncated = flags[t - 1]
            assert np.array_equal(view.reward, reward), t
            assert np.array_equal(view.terminated, terminated), t
            assert np.array_equal(view.truncated, truncated), t
    assert any(f[1].any() for f in flags)


def test_the_default_schema_check_closes_a_vector_env_it_made() -> None:
    """serve(factory) without a schema tries the factory's env against pac_env: a vector env
    it makes for that (an EnvPool, say: threads, memory) is closed again, not leaked."""
    made: list[Any] = []

    class Closing(VectorEchoEnv):
        closed = 0

        def close(self) -> None:
            Closing.closed += 1

    def factory() -> Closing:
        made.append(Closing(2))
        return made[-1]

    api.check_default_schema_fits(pac_env.SCHEMA, factory, "unix:///tmp/x.sock")
    api.check_default_schema_fits(pac_env.SCHEMA, Closing(2), "unix:///tmp/x.sock")
    assert len(made) == 1 and Closing.closed == 1
