"""transport.ray carries every space the core carries (issue 23): a Box action and a Dict
observation of multi-dim fields (the ``reach`` env, schema dictbox) and a MultiDiscrete action
(``lock``), through ``connect()``, ``vector_env()`` and ``sb3_vec_env()``, compared step by step
with the same env served by one local server and driven by the core client and adapters.

One small loopback Ray node (2 logical CPUs) for the module; 2 actors of a quarter CPU each.
Skipped, with the reason, only where Ray is not installed or cannot start.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'transport[ray]')")

from transport.ray.testing import use_loopback

use_loopback()  # before anything below talks to Ray

import gymnasium  # noqa: E402

import transport  # noqa: E402
from transport.envs.rich_spaces import ReachEnv  # noqa: E402
from transport.errors import ActionError  # noqa: E402
from transport.gym import RemoteVectorEnv  # noqa: E402
from transport.ray import launch  # noqa: E402

from .ray_util import cluster_or_skip  # noqa: E402
from .servers import ServerProcess, require_lang, unique_url  # noqa: E402

CLIENT_TIMEOUT = 10.0
READY_TIMEOUT = 60.0
SEED = 7
STEPS = 55
"""More than the reach env's 50-step limit: every episode ends at least once (auto-reset)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from cluster_or_skip(nodes=1, num_cpus=2)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def process_dead(pid: int) -> bool:
    """Gone, or a zombie (dead, waiting for its parent to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "State:\tZ" in status


def moves(num_envs: int) -> np.ndarray:
    """(STEPS, num_envs, 2) float32 moves in -1..1: the Box actions both sides get."""
    return np.random.default_rng(3).uniform(-1, 1, (STEPS, num_envs, 2)).astype(np.float32)


def assert_same_view(got: Any, want: Any) -> None:
    """Every field of two result views (or records): same shape, same values."""
    want_record, got_record = np.asarray(want.record), np.asarray(got.record)
    names = want_record.dtype.names
    assert names is not None and got_record.dtype.names == names
    for name in names:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def assert_same_obs(got: Any, want: Any, num_envs: int | None) -> None:
    """A reach observation: a dict of grid (2, 5, 5) and vec (4,), with an env axis if any."""
    lead = () if num_envs is None else (num_envs,)
    assert isinstance(got, dict) and list(got) == ["grid", "vec"]
    assert got["grid"].shape == (*lead, 2, 5, 5) and got["vec"].shape == (*lead, 4)
    for name in ("grid", "vec"):
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# python: 2 servers of 2 envs (the MultiClient path); node: 2 servers of 1 env (one action each)
@pytest.mark.parametrize(("lang", "per_server"), [("python", 2), ("node", 1)])
def test_box_actions_and_dict_observations_on_every_ray_path(
    cluster: Any, lang: str, per_server: int
) -> None:
    require_lang(lang)
    n = 2 * per_server
    actions = moves(n)
    with (
        ServerProcess(unique_url("unix"), env="reach", num_envs=n, lang=lang) as local,
        launch(
            "reach",
            num_servers=2,
            num_envs=per_server,
            lang=lang,
            num_cpus=0.25,
            ready_timeout=READY_TIMEOUT,
        ) as servers,
    ):
        # -- connect(): the ClusterClient, next_step auto-reset ---------------------------------
        with (
            servers.connect(autoreset="next_step", timeout=CLIENT_TIMEOUT) as client,
            transport.connect(local.url, autoreset="next_step", timeout=CLIENT_TIMEOUT) as ref,
        ):
            got, want = client.reset(seed=SEED, copy=True), ref.reset(seed=SEED, copy=True)
            assert got["grid"].shape == (n, 2, 5, 5) and got["vec"].shape == (n, 4)
            assert_same_view(got, want)
            ended = np.zeros(n, dtype=bool)
            for batch in actions:
                got, want = client.step(batch, copy=True), ref.step(batch, copy=True)
                assert_same_view(got, want)
                ended |= got["terminated"] | got["truncated"]
            assert ended.all()
            # one action per env and nothing else: a flat (2n,) array is refused, typed
            with pytest.raises(
                ActionError, match=rf"Box\(-1.0, 1.0, \(2,\), float32\).*\({n}, 2\)"
            ):
                client.step(actions[0].reshape(-1))
            with pytest.raises(ActionError):
                client.step(actions[0][:1])
            with pytest.raises(ActionError, match="not numbers of one shape"):
                client.step([[0.5, 0.5]] * (n - 1) + [[0.5]])  # ragged
            with pytest.raises(ActionError, match="values are not numbers"):
                client.step(np.full((n, 2), "x"))
            assert_same_view(client.step(actions[0]), ref.step(actions[0]))  # still in step

        # -- vector_env(): gymnasium, next_step -------------------------------------------------
        envs = servers.vector_env(timeout=CLIENT_TIMEOUT)
        ref_envs = RemoteVectorEnv(local.url, timeout=CLIENT_TIMEOUT)
        try:
            assert envs.single_observation_space == ref_envs.single_observation_space
            assert isinstance(envs.single_observation_space, gymnasium.spaces.Dict)
            assert envs.single_action_space == gymnasium.spaces.Box(-1, 1, (2,), np.float32)
            obs, _ = envs.reset(seed=SEED)
            ref_obs, _ = ref_envs.reset(seed=SEED)
            assert_same_obs(obs, ref_obs, n)
            assert obs in envs.observation_space
            for batch in actions:
                obs, rewards, terminated, truncated, _ = envs.step(batch)
                ref_obs, ref_rewards, ref_terminated, ref_truncated, _ = ref_envs.step(batch)
                assert_same_obs(obs, ref_obs, n)
                np.testing.assert_array_equal(rewards, ref_rewards)
                np.testing.assert_array_equal(terminated, ref_terminated)
                np.testing.assert_array_equal(truncated, ref_truncated)
        finally:
            envs.close()
            ref_envs.close()

        # -- sb3_vec_env(): Stable-Baselines3, same_step (final observations in infos) ----------
        pytest.importorskip("stable_baselines3")
        from transport.sb3 import RemoteVecEnv

        vec = servers.sb3_vec_env(timeout=CLIENT_TIMEOUT)
        ref_vec = RemoteVecEnv(local.url, timeout=CLIENT_TIMEOUT)
        try:
            assert vec.observation_space == ref_vec.observation_space
            assert vec.action_space == ref_vec.action_space
            vec.seed(SEED)
            ref_vec.seed(SEED)
            assert_same_obs(vec.reset(), ref_vec.reset(), n)
            finals = 0
            for batch in actions:
                obs, rewards, dones, infos = vec.step(batch)
                ref_obs, ref_rewards, ref_dones, ref_infos = ref_vec.step(batch)
                assert_same_obs(obs, ref_obs, n)
                np.testing.assert_array_equal(rewards, ref_rewards)
                np.testing.assert_array_equal(dones, ref_dones)
                for i in np.flatnonzero(dones):
                    finals += 1
                    final = infos[i]["terminal_observation"]
                    assert_same_obs(final, ref_infos[i]["terminal_observation"], None)
                    assert infos[i]["TimeLimit.truncated"] == ref_infos[i]["TimeLimit.truncated"]
            assert finals >= n

            # a lost server: its envs end their episodes with their last Dict observation and
            # start again on the restarted server (same_step: in the same step)
            victim = servers.endpoint(1)
            os.kill(victim.pid, signal.SIGKILL)
            if victim.child_pid is not None:  # a Node server: it ends when its actor dies
                wait_until(lambda: process_dead(victim.child_pid or 0), "the Node child exits")
            after, rewards, dones, infos = vec.step(actions[0])
            lost = list(servers.env_ids(1))
            assert dones[lost].all()
            fresh = ReachEnv().reset(None)  # a restarted server's first unseeded reset
            for i in lost:
                assert infos[i]["transport_lost"] and infos[i]["TimeLimit.truncated"]
                assert rewards[i] == 0.0
                last = {name: obs[name][i] for name in obs}
                assert_same_obs(infos[i]["terminal_observation"], last, None)
                assert_same_obs({name: after[name][i] for name in after}, fresh, None)
            assert servers.endpoint(1).incarnation != victim.incarnation
            vec.step(actions[1])
        finally:
            vec.close()
            ref_vec.close()


def test_multidiscrete_actions_over_ray(cluster: Any) -> None:
    """The lock env's u8[3] dials (MultiDiscrete), one server of 2 envs, against a local one."""
    nvec = np.array([3, 4, 5])
    rng = np.random.default_rng(5)
    dials = (rng.integers(0, 1 << 16, (30, 2, 3)) % nvec).astype(np.uint8)
    with (
        ServerProcess(unique_url("unix"), env="lock", num_envs=2) as local,
        launch("lock", num_servers=1, num_envs=2, num_cpus=0.25, ready_timeout=READY_TIMEOUT) as s,
        s.connect(autoreset="next_step", timeout=CLIENT_TIMEOUT) as client,
        transport.connect(local.url, autoreset="next_step", timeout=CLIENT_TIMEOUT) as ref,
    ):
        assert_same_view(client.reset(seed=SEED, copy=True), ref.reset(seed=SEED, copy=True))
        for batch in dials[:15]:
            assert_same_view(client.step(batch, copy=True), ref.step(batch, copy=True))
        # values the u8 field cannot hold are refused before anything is sent, named
        with pytest.raises(ActionError, match=r"MultiDiscrete\(\[3, 4, 5\]\).*outside 0\.\.255"):
            client.step(np.full((2, 3), 300))
        with pytest.raises(ActionError, match="would be truncated"):
            client.step(dials[0].astype(np.float64))
        for batch in dials[15:]:
            assert_same_view(client.step(batch, copy=True), ref.step(batch, copy=True))
        envs = s.vector_env(timeout=CLIENT_TIMEOUT)
        try:
            assert envs.single_action_space == gymnasium.spaces.MultiDiscrete(nvec)
            envs.reset(seed=SEED)
            observations, *_ = envs.step(dials[0])
            assert observations.shape == (2, 6)
        finally:
            envs.close()


PLATE_SCHEMA = """
[schema]
name = "plate"
version = 1
layout = "natural"

[env]

[structs.StepResult]
fields = [
  { name = "plate",      type = "f32[2,3]", role = "observation" },
  { name = "sums",       type = "f32[2]",   role = "observation" },
  { name = "reward",     type = "f64",      role = "reward" },
  { name = "terminated", type = "bool",     role = "terminated" },
  { name = "truncated",  type = "bool",     role = "truncated" },
]

[structs.StepRequest]
fields = [{ name = "tilt", type = "f32[2,3]", role = "action", low = -1.0, high = 1.0 }]
"""


class PlateEnv:
    """A 2-D Box action (f32[2,3]): the observation is the last action and its row sums."""

    def __init__(self) -> None:
        self.steps = 0

    def spaces(self) -> Any:
        from transport.runtime.env import Spaces

        return Spaces(8, 6)

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.steps = 0
        return self._result(np.zeros((2, 3), dtype=np.float32))

    def step(self, action: Any) -> dict[str, Any]:
        self.steps += 1
        return self._result(np.asarray(action, dtype=np.float32).reshape(2, 3))

    def _result(self, plate: np.ndarray) -> dict[str, Any]:
        return {
            "plate": plate,
            "sums": plate.sum(axis=1),
            "reward": float(plate[0, 0]),
            "terminated": False,
            "truncated": False,
        }


def test_a_two_dim_box_action_over_ray(cluster: Any, tmp_path: Path) -> None:
    """Box actions of any shape: (N, 2, 3) batches through connect() and vector_env()."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actor needs PlateEnv
    schema_file = tmp_path / "plate.toml"
    schema_file.write_text(PLATE_SCHEMA)
    schema = transport.load_schema(schema_file)
    tilts = np.random.default_rng(9).uniform(-1, 1, (5, 2, 2, 3)).astype(np.float32)
    with launch(
        PlateEnv,
        schema=schema,
        num_servers=2,
        num_envs=1,
        num_cpus=0.25,
        ready_timeout=READY_TIMEOUT,
    ) as servers:
        with servers.connect(timeout=CLIENT_TIMEOUT) as client:
            client.reset()
            for batch in tilts:
                view = client.step(batch)
                np.testing.assert_array_equal(view["plate"], batch)
                np.testing.assert_array_equal(view["sums"], batch.sum(axis=2))
            with pytest.raises(ActionError, match=r"shape \(2, 2, 3\)"):
                client.step(tilts[0].reshape(2, 6))
        envs = servers.vector_env(timeout=CLIENT_TIMEOUT)
        try:
            assert envs.single_action_space.shape == (2, 3)
            obs, _ = envs.reset()
            assert obs["plate"].shape == (2, 2, 3) and obs["sums"].shape == (2, 2)
            for batch in tilts[:2]:
                obs, rewards, *_ = envs.step(batch)
                np.testing.assert_array_equal(obs["plate"], batch)
                np.testing.assert_array_equal(rewards, batch[:, 0, 0].astype(np.float64))
        finally:
            envs.close()


def test_a_factory_without_schema_is_served_with_the_schema_it_declares(cluster: Any) -> None:
    """launch(factory) without schema= takes the schema transport.Server would: the reach env's
    class speaks dictbox (not the pac_env default); an env whose results fit neither is a
    TypeError before any actor starts."""
    with pytest.raises(TypeError, match="schema="):
        launch(PlateEnv, num_servers=1, num_cpus=0.25, ready_timeout=READY_TIMEOUT)
    with (
        launch(ReachEnv, num_servers=1, num_cpus=0.25, ready_timeout=READY_TIMEOUT) as servers,
        servers.connect(timeout=CLIENT_TIMEOUT) as client,
    ):
        assert servers.schema.name == "dictbox"
        first = client.reset(seed=SEED, copy=True)
        np.testing.assert_array_equal(first["grid"][0], ReachEnv().reset(SEED)["grid"])
        view = client.step(np.array([[0.5, -0.5]], dtype=np.float32))
        assert view["grid"].shape == (1, 2, 5, 5) and view["vec"].shape == (1, 4)
