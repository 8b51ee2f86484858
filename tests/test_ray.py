"""transport.ray on a real Ray cluster on this machine: three simulated nodes (loopback only).

Real actors, real zmq+tcp with CURVE on 127.0.0.1, real process kills (SIGKILL of an actor's
process, removal of a whole node) in the middle of a run, and a clean stop. One module-scoped
cluster and few tests that each check a lot: starting Ray costs seconds on two cores. Skipped,
with the reason, only where Ray is not installed or cannot start a cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'transport[ray]')")

from transport.ray.testing import LOOPBACK, add_node, use_loopback

use_loopback()  # before anything below talks to Ray

import ray  # noqa: E402

import transport  # noqa: E402
from transport.envs import env_factory, env_schema  # noqa: E402
from transport.errors import ConnectError, PeerGoneError, TransportError  # noqa: E402
from transport.multi import BatchError  # noqa: E402
from transport.ray import EnvServers, EnvsLostError, KeyPair, launch  # noqa: E402
from transport.ray.keys import client_url  # noqa: E402
from transport.runtime.env import Spaces  # noqa: E402

from .ray_util import cluster_or_skip  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLIENT_TIMEOUT = 10.0
WATCHDOG = 60.0
"""Seconds any one wait in these tests may take before it fails (never a hang)."""
NODE_SCRIPT = ROOT / "node_bridge" / "dist" / "cli" / "serve.js"
FAST_NODE_DEATH = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
"""Ray declares a silent node dead after ~1.5 s instead of its default ~15 s (tests only)."""
SKIP_DIRS = {".git", ".venv", "node_modules", ".mypy_cache", ".ruff_cache"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from cluster_or_skip(nodes=3, num_cpus=2, _system_config=FAST_NODE_DEATH)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WATCHDOG) -> None:
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


def port_closed(url: str) -> bool:
    host, _, port = url.removeprefix("zmq+tcp://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return False
    except OSError:
        return True


def pac_reset(seed: int | None) -> np.ndarray:
    """The observation a local pac env gives after ``reset(seed)``."""
    env: Any = env_factory("pac")()
    return np.array(env.reset(seed)["observation"], copy=True)


def first_legal(masks: np.ndarray) -> np.ndarray:
    return np.asarray(masks).argmax(axis=1)


def files_mentioning(text: str, roots: list[str], since: float) -> list[str]:
    """Regular files under ``roots`` changed since ``since`` whose bytes contain ``text``."""
    needle = text.encode()
    found = []
    for root in roots:
        for directory, subdirectories, names in os.walk(root):
            subdirectories[:] = [d for d in subdirectories if d not in SKIP_DIRS]
            for name in names:
                path = os.path.join(directory, name)
                try:
                    st = os.lstat(path)
                    if not os.path.isfile(path) or st.st_mtime < since or st.st_size > 50 << 20:
                        continue
                    if needle in Path(path).read_bytes():
                        found.append(path)
                except OSError:
                    continue
    return found


def test_core_does_not_import_ray() -> None:
    code = (
        "import sys, transport, transport.gym, transport.multi, transport.api\n"
        "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=WATCHDOG, cwd=ROOT)


def test_launch_spreads_curve_servers_and_every_client_steps_them(cluster: Any) -> None:
    started = time.time()
    with launch("pac", num_servers=3, num_envs=4, num_cpus=0.5) as servers:
        endpoints = servers.endpoints
        # Placement: SPREAD puts the three actors on the three nodes.
        assert len({e.node_id for e in endpoints}) == 3
        assert [e.index for e in endpoints] == [0, 1, 2]
        assert servers.num_envs == 12
        assert [servers.env_ids(k) for k in range(3)] == [range(0, 4), range(4, 8), range(8, 12)]
        for endpoint in endpoints:
            assert endpoint.url.startswith(f"zmq+tcp://{LOOPBACK}:")
            assert endpoint.child_pid is None and not process_dead(endpoint.pid)
        assert len(set(servers.urls)) == 3
        keys = servers.public_keys
        assert len(set(keys)) == 3 and all(len(key) == 40 for key in keys)
        assert servers.client_public_key not in keys
        assert "secret" not in repr(servers) or "<hidden>" in repr(servers)

        # CURVE is on: no keys, or a key the servers do not admit, is refused.
        with pytest.raises(TransportError):
            transport.connect(servers.urls[0], timeout=3.0)
        with (
            client_url(servers.urls[0], keys[0], KeyPair.generate()) as stranger,
            pytest.raises(ConnectError),
        ):
            transport.connect(stranger, timeout=5.0)

        # The existing connect_many: one batch of 12, global env i seeded with seed + i.
        expected = np.stack([pac_reset(100 + i) for i in range(12)])
        with servers.connect_many(timeout=CLIENT_TIMEOUT) as many:
            assert many.num_envs == 12
            first = many.reset(seed=100, copy=True)
            np.testing.assert_array_equal(first.observation, expected)
            stepped = many.step(first_legal(first.action_mask))
            assert stepped.observation.shape == (12, 612)

        # ClusterClient: the same batch, and the adapters' client.
        with servers.connect(timeout=CLIENT_TIMEOUT) as client:
            view = client.reset(seed=100)
            np.testing.assert_array_equal(view.observation, expected)
            assert client.spaces() == Spaces(612, 92)
            assert client.health()
            view = client.step(first_legal(view.action_mask))
            np.testing.assert_array_equal(view.observation, stepped.observation)

        # Gymnasium VectorEnv (next_step auto-reset) over the three servers.
        envs = servers.vector_env(timeout=CLIENT_TIMEOUT)
        try:
            observations, _ = envs.reset(seed=100)
            np.testing.assert_array_equal(observations, expected)
            ended = np.zeros(12, dtype=bool)
            for _ in range(40):  # "end turn" every step: a pac episode lasts at most 20
                actions = np.zeros(12, dtype=np.int64)
                observations, _, terminated, truncated, _ = envs.step(actions)
                ended |= terminated
                assert observations.shape == (12, 612) and not truncated.any()
            assert ended.all()
        finally:
            envs.close()

        # SB3 VecEnv (same_step auto-reset): final observations and TimeLimit flags.
        pytest.importorskip("stable_baselines3")
        vec = servers.sb3_vec_env(timeout=CLIENT_TIMEOUT)
        try:
            vec.seed(100)
            np.testing.assert_array_equal(vec.reset(), expected)
            finals = 0
            for _ in range(25):
                _, _, dones, infos = vec.step(np.zeros(12, dtype=np.int64))
                for i in np.flatnonzero(dones):
                    finals += 1
                    assert infos[i]["terminal_observation"].shape == (612,)
                    assert infos[i]["TimeLimit.truncated"] is False
            assert finals >= 12
        finally:
            vec.close()
        client_secret = servers._client_keys.secret
    # Keys went through Ray only: no file written during the test holds the trainer's secret.
    roots = [tempfile.gettempdir(), str(ROOT)]
    assert files_mentioning(client_secret, roots, started) == []

    # A placement group is honoured: actor k goes to bundle k (STRICT_SPREAD: two nodes).
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )

    group = placement_group([{"CPU": 0.5}, {"CPU": 0.5}], strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=WATCHDOG)
    try:
        with launch("echo", num_servers=2, num_cpus=0.5, placement_group=group) as servers:
            bundle_nodes = placement_group_table(group)["bundles_to_node_id"]
            assert [e.node_id for e in servers.endpoints] == [bundle_nodes[0], bundle_nodes[1]]
            with servers.connect_many(timeout=CLIENT_TIMEOUT) as many:
                many.reset()
                assert many.step([1, 2]).observation[:, 0].tolist() == [1.0, 2.0]
    finally:
        remove_placement_group(group)


def test_killed_actor_is_named_then_reconnected_at_the_next_reset(cluster: Any) -> None:
    # A Python env given as a factory (here the pac env's class) with its schema.
    pac = env_factory("pac")
    with launch(pac, num_servers=3, num_envs=4, num_cpus=0.5, schema=env_schema("pac")) as servers:
        assert servers.endpoint(0).num_envs == 4
        # -- the raw client, policy "raise": a typed error naming the lost envs ------------------
        with servers.connect(timeout=CLIENT_TIMEOUT) as client:
            view = client.reset(seed=1)
            for _ in range(3):
                view = client.step(first_legal(view.action_mask))
            before = servers.endpoint(1)
            masks = view.action_mask.copy()
            os.kill(before.pid, signal.SIGKILL)  # mid-run
            started = time.monotonic()
            with pytest.raises(EnvsLostError) as lost:
                client.step(first_legal(masks))
            assert time.monotonic() - started < CLIENT_TIMEOUT  # named within its timeout
            error = lost.value
            assert isinstance(error, BatchError) and isinstance(error, TransportError)
            assert error.lost_env_ids == (4, 5, 6, 7) and error.lost_servers == (1,)
            assert error.env_ids == [4, 5, 6, 7]
            assert isinstance(error.failures[0].error, PeerGoneError)
            assert "lost envs 4-7" in str(error) and before.url in str(error)
            assert error.results is not None and error.results.observation.shape == (12, 612)
            assert client.lost_env_ids == [4, 5, 6, 7]
            with pytest.raises(EnvsLostError):  # still lost until the next reset
                client.step(first_legal(masks))

            view = client.reset(seed=1)  # the next reset: Ray restarted the actor; reconnect
            after = servers.endpoint(1)
            assert after.incarnation != before.incarnation and after.pid != before.pid
            assert after.url != before.url and after.server_public_key != before.server_public_key
            assert client.lost_env_ids == [] and client.health()
            np.testing.assert_array_equal(view.observation[4], pac_reset(1 + 4))
            view = client.step(first_legal(view.action_mask))
            assert view.observation.shape == (12, 612)

        # -- Gymnasium, policy "truncate": the lost episodes end truncated, then start again ----
        envs = servers.vector_env(timeout=CLIENT_TIMEOUT)
        try:
            envs.reset(seed=2)
            actions = np.zeros(12, dtype=np.int64)
            envs.step(actions)
            victim = servers.endpoint(2)
            os.kill(victim.pid, signal.SIGKILL)
            observations, rewards, terminated, truncated, infos = envs.step(actions)
            assert truncated[8:].all() and not truncated[:8].any()
            assert not terminated[8:].any() and (rewards[8:] == 0).all()
            assert infos["transport_lost"][8:].all() and infos["_transport_lost"][8:].all()
            assert isinstance(envs.cluster.last_lost, EnvsLostError)
            assert envs.cluster.last_lost.lost_env_ids == tuple(range(8, 12))
            observations, rewards, terminated, truncated, infos = envs.step(actions)
            assert envs.cluster.restored[8:].all()  # their reset step, on the new server
            assert not truncated.any() and (rewards[8:] == 0).all()
            assert "transport_lost" not in infos
            fresh = pac_reset(None)  # a fresh server's first unseeded reset
            np.testing.assert_array_equal(observations[8:], np.stack([fresh] * 4))
            assert servers.endpoint(2).incarnation != victim.incarnation
            for _ in range(3):
                envs.step(actions)
        finally:
            envs.close()

        # -- SB3, same_step: done + TimeLimit.truncated + terminal_observation in one step ------
        pytest.importorskip("stable_baselines3")
        vec = servers.sb3_vec_env(timeout=CLIENT_TIMEOUT)
        try:
            vec.reset()
            actions = np.zeros(12, dtype=np.int64)
            last, *_ = vec.step(actions)
            victim = servers.endpoint(0)
            os.kill(victim.pid, signal.SIGKILL)
            observations, rewards, dones, infos = vec.step(actions)
            for i in range(4):
                assert dones[i] and rewards[i] == 0.0
                assert infos[i]["TimeLimit.truncated"] is True and infos[i]["transport_lost"]
                np.testing.assert_array_equal(infos[i]["terminal_observation"], last[i])
            assert vec.cluster.restored[:4].all()
            assert not any(infos[i].get("transport_lost") for i in range(4, 12))
            vec.step(actions)

            # A training run survives it: MaskablePPO.learn() with an actor killed mid-rollout.
            pytest.importorskip("sb3_contrib")
            from sb3_contrib import MaskablePPO
            from stable_baselines3.common.callbacks import BaseCallback

            class KillOnce(BaseCallback):
                """SIGKILL server 1's actor once, in the middle of the second rollout."""

                killed: int | None = None

                def _on_step(self) -> bool:
                    if self.killed is None and self.num_timesteps >= 12 * 24:
                        self.killed = servers.endpoint(1).pid
                        os.kill(self.killed, signal.SIGKILL)
                    return True

            kill = KillOnce()
            lost_before = vec.cluster.last_lost
            model = MaskablePPO("MlpPolicy", vec, n_steps=16, batch_size=96, n_epochs=1, seed=0)
            model.learn(total_timesteps=12 * 16 * 3, callback=kill)
            assert kill.killed is not None and model.num_timesteps >= 12 * 16 * 3
            assert vec.cluster.last_lost is not lost_before
            assert vec.cluster.last_lost is not None
            assert vec.cluster.last_lost.lost_servers == (1,)
            assert servers.endpoint(1).pid != kill.killed
        finally:
            vec.close()

        # -- a whole node lost: its actor comes back on another node ----------------------------
        worker_nodes = {node.node_id: node for node in cluster.worker_nodes}
        placed = [e for e in servers.endpoints if e.node_id in worker_nodes]
        assert placed, "SPREAD left no server on a worker node"
        doomed = placed[0]
        with servers.connect(autoreset="next_step", timeout=CLIENT_TIMEOUT) as client:
            view = client.reset(seed=3)
            cluster.remove_node(worker_nodes[doomed.node_id], allow_graceful=False)
            deadline = time.monotonic() + WATCHDOG
            with pytest.raises(EnvsLostError) as lost:
                while time.monotonic() < deadline:  # until its processes are seen to be gone
                    view = client.step(first_legal(view.action_mask))
            assert lost.value.lost_servers == (doomed.index,)
            client.reset(seed=3)
            moved = servers.endpoint(doomed.index)
            assert moved.node_id != doomed.node_id and client.health()
        add_node(cluster)  # back to three nodes
        cluster.wait_for_nodes()


def test_node_servers_are_owned_by_their_actors_and_shutdown_leaves_nothing(
    cluster: Any,
) -> None:
    import shutil

    if shutil.which("node") is None or not NODE_SCRIPT.is_file():
        pytest.skip("the Node server is not built (run ./dev setup)")
    # A custom resource is honoured: both actors go to the one node that has it.
    resource = sorted(name for name in ray.cluster_resources() if re.fullmatch(r"node\d+", name))[0]
    servers: EnvServers = launch(
        "pac", num_servers=2, num_envs=2, lang="node", num_cpus=0.5, resources={resource: 0.1}
    )
    seen: list[Any] = []
    try:
        holder = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
        assert [e.node_id for e in servers.endpoints] == holder * 2
        for endpoint in servers.endpoints:
            seen.append(endpoint)
            assert endpoint.child_pid is not None and not process_dead(endpoint.child_pid)
            stat = Path(f"/proc/{endpoint.child_pid}/stat").read_text()
            assert int(stat.rpartition(")")[2].split()[1]) == endpoint.pid  # the actor's child
        envs = servers.vector_env(timeout=CLIENT_TIMEOUT)
        try:
            observations, _ = envs.reset(seed=5)
            expected = np.stack([pac_reset(5 + i) for i in range(4)])
            np.testing.assert_array_equal(observations, expected)
            actions = np.zeros(4, dtype=np.int64)
            envs.step(actions)
            victim = servers.endpoint(0)
            os.kill(victim.pid, signal.SIGKILL)
            assert victim.child_pid is not None
            wait_until(lambda: process_dead(victim.child_pid or 0), "the orphaned Node child exits")
            _, _, _, truncated, _ = envs.step(actions)
            assert truncated.tolist() == [True, True, False, False]
            envs.step(actions)
            assert envs.cluster.restored[:2].all()
            restarted = servers.endpoint(0)
            seen.append(restarted)
            assert restarted.child_pid not in (None, victim.child_pid)
            envs.step(actions)
        finally:
            envs.close()
    finally:
        servers.shutdown()
    # Nothing left: actors and their Node children gone, ports closed, no shm segment of ours.
    for endpoint in seen:
        wait_until(lambda e=endpoint: process_dead(e.pid), f"actor process {endpoint.pid} exits")
        child = endpoint.child_pid or 0
        wait_until(lambda c=child: process_dead(c), f"Node server {child} exits")
        assert port_closed(endpoint.url)
    listing = subprocess.run(
        [sys.executable, "-m", "transport.tools.serve_cli", "--list-shm", "--json"],
        capture_output=True,
        text=True,
        timeout=WATCHDOG,
        check=True,
    )
    ours = {e.pid for e in seen} | {e.child_pid for e in seen}
    assert not [s for s in json.loads(listing.stdout) if s.get("owner_pid") in ours]
