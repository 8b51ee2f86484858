"""Env-steps/s of the same echo envs three ways, side by side in one run (issue: scale out on Ray).

Run (writes the JSON that benchmarks/report.py turns into a RESULTS.md block):
  pytest benchmarks/test_ray_bench.py --benchmark-enable -s \
      --benchmark-json=benchmarks/ray.json

Rows, 32 envs in every configuration (G actors x n envs):
  transport_on_ray[GxN]   (a) transport.ray.launch("echo", num_servers=G, num_envs=n) and
                          servers.vector_env(): a RayVectorEnv (gymnasium VectorEnv, next_step
                          auto-reset) over G Ray actors, zmq+tcp with CURVE on loopback
  ray_native[GxN]         (b) what a Ray user writes without us: G actors holding n envs each,
                          one `step(actions)` actor call per actor per batch (the envs write into
                          a preallocated record, the actor returns observation, reward,
                          terminated and truncated arrays), `ray.get` of the G calls, then the
                          pieces concatenated into one batch as a VectorEnv would return it
  local_remote_vector_env[curve-1x32]   (c) transport.gym.RemoteVectorEnv against one local
                          `transport-serve zmq+tcp://127.0.0.1:0 --env echo --num-envs 32`
                          with CURVE on (the same keys setup, no Ray)
  local_remote_vector_env[plain-1x32]   (c) the same without CURVE, for reference
In the interleaved run only, two rows without the Gymnasium adapter at 4 x 8: the
ClusterClient of (a) and transport.connect_many over four local transport-serve processes
(CURVE, no Ray), which tell Ray's share of (a)'s cost from the cost of four servers.
The envs are transport.envs.echo.EchoEnv (transport cost only). One Ray node on this machine
(the actors share its cores with the trainer). env-steps/s = 32 / mean seconds per batched step.
Goals: (a) >= 10x (b) at 32 envs, and (a) within 1.3x of (c) on one machine. The rows are
measured one after another; ``test_ratios_interleaved`` then steps every row in turn, in short
chunks, and computes the goals' ratios from that run (the same conditions for every row).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'transport[ray]')")
pytest.importorskip("gymnasium")

from transport.ray.testing import local_cluster, use_loopback

use_loopback()

import ray  # noqa: E402

import transport  # noqa: E402
from transport.gym import RemoteVectorEnv  # noqa: E402
from transport.ray import KeyPair, launch  # noqa: E402
from transport.ray.keys import client_url  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS = 32
CONFIGS = ["4x8", "2x16", "1x32"]
ACT_N = 92
ROUNDS = {"transport": 1500, "native": 300}
CHUNK = {"transport": 50, "native": 15}
REPEATS = 30
"""The interleaved run: 30 turns, each row stepping one chunk per turn."""
RESULTS: dict[str, dict[str, float]] = {}


def shape(config: str) -> tuple[int, int]:
    servers, envs = (int(part) for part in config.split("x"))
    assert servers * envs == NUM_ENVS
    return servers, envs


def measure(benchmark: Any, run: Callable[[], object], rounds: int, key: str) -> None:
    """Warm up, time ``rounds`` batched steps, record p50/p99 and env-steps/s."""
    for _ in range(max(20, rounds // 10)):
        run()
    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    data = np.array(benchmark.stats.stats.data) * 1e6
    row = {
        "p50_us": float(np.percentile(data, 50)),
        "p99_us": float(np.percentile(data, 99)),
        "env_steps_per_s": NUM_ENVS / float(benchmark.stats.stats.mean),
    }
    benchmark.extra_info.update(row)
    benchmark.extra_info["num_envs"] = NUM_ENVS
    RESULTS[key] = row


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    try:
        manager = local_cluster(nodes=1, num_cpus=32)
        ray_cluster = manager.__enter__()
    except Exception as exc:  # any failure to start Ray is a skip reason
        pytest.skip(f"Ray cannot start a local cluster here: {type(exc).__name__}: {exc}")
    try:
        yield ray_cluster
    finally:
        manager.__exit__(None, None, None)


def actions_for(n: int) -> np.ndarray:
    return np.arange(n) % ACT_N


Step = Callable[[], object]


@pytest.fixture(scope="module")
def transport_on_ray(cluster: Any) -> Iterator[dict[str, Step]]:
    """(a): a RayVectorEnv over G actors for every configuration, reset and ready to step."""
    steps: dict[str, Step] = {}
    with ExitStack() as stack:
        for config in CONFIGS:
            servers_n, envs_n = shape(config)
            servers = stack.enter_context(
                launch("echo", num_servers=servers_n, num_envs=envs_n, num_cpus=1)
            )
            envs = servers.vector_env(timeout=30.0)
            stack.callback(envs.close)
            envs.reset(seed=0)
            actions = actions_for(NUM_ENVS)
            steps[config] = lambda envs=envs, actions=actions: envs.step(actions)
            steps[f"client-{config}"] = lambda c=envs.cluster, actions=actions: c.step(actions)
        yield steps


@pytest.fixture(scope="module")
def ray_client(transport_on_ray: dict[str, Step]) -> dict[str, Step]:
    """(a) without the Gymnasium adapter: the ClusterClient's own step (views, no copies)."""
    return {config: transport_on_ray[f"client-{config}"] for config in CONFIGS}


def native_actor_class() -> Any:
    """The plain-Ray way (built in a function so that Ray ships the class by value)."""

    class NativeEchoEnvs:
        """n echo envs in one actor, stepped by one call per batch."""

        def __init__(self, n: int) -> None:
            from transport.envs.echo import EchoEnv
            from transport.generated import pac_env

            self.envs = [EchoEnv() for _ in range(n)]
            self.out = pac_env.StepResult.zeros(n)
            self.rows = [self.out[i : i + 1].reshape(()) for i in range(n)]  # 0-d views

        def reset(self, seed: int) -> np.ndarray:
            for i, env in enumerate(self.envs):
                env.reset_into(seed + i, self.rows[i])
            return np.array(self.out["observation"])

        def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
            out = self.out
            for i, env in enumerate(self.envs):
                env.step_into(int(actions[i]), self.rows[i])
            return (
                out["observation"],
                out["reward"].astype(np.float64),
                out["done"].astype(bool),
                np.zeros(len(self.envs), dtype=bool),
            )

    return NativeEchoEnvs


@pytest.fixture(scope="module")
def ray_native(cluster: Any) -> Iterator[dict[str, Step]]:
    """(b): G plain actors of n envs each per configuration; a step is one call per actor."""
    remote_class = ray.remote(native_actor_class())
    steps: dict[str, Step] = {}
    every: list[Any] = []
    try:
        for config in CONFIGS:
            servers_n, envs_n = shape(config)
            actors = [
                remote_class.options(num_cpus=1, scheduling_strategy="SPREAD").remote(envs_n)
                for _ in range(servers_n)
            ]
            every += actors
            ray.get([actor.reset.remote(k * envs_n) for k, actor in enumerate(actors)], timeout=120)
            actions = actions_for(NUM_ENVS)
            pieces = [actions[k * envs_n : (k + 1) * envs_n] for k in range(servers_n)]

            def step(actors: list[Any] = actors, pieces: list[np.ndarray] = pieces) -> object:
                parts = ray.get([a.step.remote(p) for a, p in zip(actors, pieces, strict=True)])
                return tuple(np.concatenate(column) for column in zip(*parts, strict=True))

            batch: Any = step()
            assert batch[0].shape == (NUM_ENVS, 612)
            steps[config] = step
        yield steps
    finally:
        for actor in every:
            ray.kill(actor)


def start_local_server(stack: ExitStack, num_envs: int, curve: bool) -> tuple[str, Any]:
    """``transport-serve zmq+tcp://127.0.0.1:0 --env echo`` (CURVE keys through its environment);
    returns a client URL and the ``ExitStack`` holding its key files (close it once connected)."""
    server_keys, client_keys = KeyPair.generate(), KeyPair.generate()
    env = dict(os.environ)
    if curve:
        env["TRANSPORT_ZMQ_SERVER_SECRET"] = server_keys.secret
        env["TRANSPORT_ZMQ_ALLOWED_CLIENTS"] = client_keys.public
    command = [sys.executable, "-m", "transport.tools.serve_cli", "zmq+tcp://127.0.0.1:0"]
    command += ["--env", "echo", "--num-envs", str(num_envs)]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)

    def stop() -> None:
        server.terminate()
        server.wait(timeout=30)

    stack.callback(stop)
    assert server.stdout is not None
    line = server.stdout.readline().strip()
    assert line.startswith("ready "), line
    url = line.split(" ", 1)[1]
    keys = ExitStack()
    if curve:
        url = keys.enter_context(client_url(url, server_keys.public, client_keys))
    return url, keys


@pytest.fixture(scope="module")
def local_vector_env(cluster: Any) -> Iterator[dict[str, Step]]:
    """(c): RemoteVectorEnv against one local transport-serve of 32 envs, CURVE on and off;
    and, for reference, transport.connect_many over four local servers of 8 (no Ray)."""
    steps: dict[str, Step] = {}
    actions = actions_for(NUM_ENVS)
    with ExitStack() as stack:
        for curve in ("curve", "plain"):
            url, keys = start_local_server(stack, NUM_ENVS, curve == "curve")
            with keys:
                envs = RemoteVectorEnv(url, NUM_ENVS, timeout=30.0)  # reads the keys here
            stack.callback(envs.close)
            envs.reset(seed=0)
            steps[f"{curve}-1x32"] = lambda envs=envs: envs.step(actions)
        with ExitStack() as keys:
            urls = []
            for _ in range(4):
                url, key_files = start_local_server(stack, NUM_ENVS // 4, curve=True)
                urls.append(url)
                keys.enter_context(key_files)
            many = transport.connect_many(urls, timeout=30.0)
        stack.callback(many.close)
        many.reset(seed=0)
        steps["many-4x8"] = lambda: many.step(actions)
        yield steps


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.benchmark(group="ray: env-steps/s at 32 envs")
def test_transport_on_ray(benchmark: Any, transport_on_ray: dict[str, Step], config: str) -> None:
    measure(benchmark, transport_on_ray[config], ROUNDS["transport"], f"a/{config}")


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.benchmark(group="ray: env-steps/s at 32 envs")
def test_ray_native(benchmark: Any, ray_native: dict[str, Step], config: str) -> None:
    measure(benchmark, ray_native[config], ROUNDS["native"], f"b/{config}")


@pytest.mark.parametrize("variant", ["curve-1x32", "plain-1x32"])
@pytest.mark.benchmark(group="ray: env-steps/s at 32 envs")
def test_local_remote_vector_env(
    benchmark: Any, local_vector_env: dict[str, Step], variant: str
) -> None:
    measure(benchmark, local_vector_env[variant], ROUNDS["transport"], f"c/{variant}")


def test_ratios_interleaved(
    benchmark: Any,
    transport_on_ray: dict[str, Step],
    ray_client: dict[str, Step],
    ray_native: dict[str, Step],
    local_vector_env: dict[str, Step],
) -> None:
    """The goals' ratios from one interleaved run: every row steps in turn, in short chunks.

    On a shared 2-core machine the load drifts within seconds; alternating chunks of every row
    gives each the same conditions, which the sequential rows above do not.
    """
    rows: dict[str, tuple[Step, int]] = {}
    for config in CONFIGS:
        rows[f"a/{config}"] = (transport_on_ray[config], CHUNK["transport"])
        rows[f"b/{config}"] = (ray_native[config], CHUNK["native"])
    rows["c/curve-1x32"] = (local_vector_env["curve-1x32"], CHUNK["transport"])
    rows["a-client/4x8"] = (ray_client["4x8"], CHUNK["transport"])
    rows["d/4x8"] = (local_vector_env["many-4x8"], CHUNK["transport"])
    samples: dict[str, list[float]] = {key: [] for key in rows}
    for _ in range(REPEATS):
        for key, (step, count) in rows.items():
            for _ in range(count):
                started = time.perf_counter()
                step()
                samples[key].append(time.perf_counter() - started)
    stats = {key: _stats(values) for key, values in samples.items()}
    reference = stats["c/curve-1x32"]
    lines = [
        "| actors x envs | (a) transport on Ray | (b) Ray actor calls | (a)/(b) | "
        "(c) local RemoteVectorEnv | (c)/(a) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ratios: dict[str, dict[str, float]] = {}
    for config in CONFIGS:
        a, b = stats[f"a/{config}"], stats[f"b/{config}"]
        over_b = a["env_steps_per_s"] / b["env_steps_per_s"]
        c_over_a = reference["env_steps_per_s"] / a["env_steps_per_s"]
        ratios[config] = {"a_over_b": over_b, "c_over_a": c_over_a}
        lines.append(
            f"| {config} | {_cell(a)} | {_cell(b)} | {over_b:.1f}x | {_cell(reference)} | "
            f"{c_over_a:.2f}x |"
        )
    client, many = stats["a-client/4x8"], stats["d/4x8"]
    lines += [
        "",
        "| 4 servers x 8 envs, no adapter | env-steps/s |",
        "|---|---:|",
        f"| ClusterClient over Ray actors | {_cell(client)} |",
        f"| transport.connect_many over 4 local transport-serve (no Ray) | {_cell(many)} |",
    ]
    ratios["4x8-no-adapter"] = {
        "ray_client_over_local_many": client["env_steps_per_s"] / many["env_steps_per_s"]
    }
    table = "\n".join(lines)
    print("\n" + table)
    benchmark.extra_info.update({"ratios": ratios, "interleaved": stats, "table": table})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


def _stats(seconds: list[float]) -> dict[str, float]:
    data = np.array(seconds) * 1e6
    return {
        "p50_us": float(np.percentile(data, 50)),
        "p99_us": float(np.percentile(data, 99)),
        "env_steps_per_s": NUM_ENVS / (float(data.mean()) / 1e6),
    }


def _cell(row: dict[str, float]) -> str:
    return f"{row['env_steps_per_s']:,.0f} (p50 {row['p50_us']:,.0f} us, p99 {row['p99_us']:,.0f})"
