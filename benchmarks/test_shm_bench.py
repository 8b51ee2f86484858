"""shm:// next to unix:// and the C floor, in one run; 32-env batches against gymnasium.

Run:
  pytest benchmarks/test_shm_bench.py --benchmark-enable --benchmark-json=benchmarks/shm.json -s

Rows (Python client, echo env, Python server process):
  c-floor-{spin,futex}    two C processes ping-ponging one word each way (transport.native)
  unix / shm-{balanced,spin,futex}   1 env: step(a) round trips with a 2557-byte result
  shm-batch32             32 envs, one batched step per round: env-steps/s
  gymnasium-async32       gymnasium AsyncVectorEnv(shared_memory=True), 32 trivial envs
The last test prints the ratios (shm vs unix p50, shm vs gymnasium env-steps/s).
"""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport import native

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.test_transport_bench import measure
from tests.servers import ServerProcess, unique_url
from tests.test_shm_backend import unique_shm_url

BATCH = 32
RESULTS: dict[str, float] = {}


@pytest.mark.parametrize("mode", ["spin", "futex"])
@pytest.mark.benchmark(group="shm: 1-env round trip")
def test_c_floor(benchmark: Any, mode: str) -> None:
    iterations = 20_000
    region = mmap.mmap(-1, native.FLOOR_REGION_SIZE)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        os._exit(native.floor_pingpong(region, 1, iterations, mode, timeout=10.0) + 10)
    out = np.zeros(iterations, dtype=np.int64)
    rc = native.floor_pingpong(region, 0, iterations, mode, out, timeout=10.0)
    os.waitpid(pid, 0)
    assert rc == native.OK
    samples = out[2000:] / 1000.0
    benchmark.extra_info["p50_us"] = float(np.percentile(samples, 50))
    benchmark.extra_info["p99_us"] = float(np.percentile(samples, 99))
    RESULTS[f"floor-{mode}"] = benchmark.extra_info["p50_us"]
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


@pytest.mark.parametrize("backend", ["unix", "shm-balanced", "shm-spin", "shm-futex"])
@pytest.mark.benchmark(group="shm: 1-env round trip")
def test_step(benchmark: Any, backend: str) -> None:
    if backend == "unix":
        url = unique_url("unix")
    else:
        url = unique_shm_url(1) + "&wait=" + backend.split("-")[1]
    with ServerProcess(url, env="echo", lang="python") as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset()
            measure(benchmark, lambda: client.step(5))
    RESULTS[backend] = benchmark.extra_info["p50_us"]


@pytest.mark.benchmark(group="shm: 32 envs, one batched step")
def test_shm_batch32(benchmark: Any) -> None:
    actions = np.arange(BATCH, dtype=np.int32) % 92
    with ServerProcess(unique_shm_url(BATCH), env="echo", lang="python") as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset()
            measure(benchmark, lambda: client.step(actions))
    rate = BATCH / benchmark.stats.stats.mean
    benchmark.extra_info["env_steps_per_s"] = rate
    RESULTS["shm-batch32"] = rate


class _TrivialEnv:
    """A gymnasium env with the pac spaces that does nothing: pure vector-env overhead."""

    def __init__(self) -> None:
        import gymnasium as gym

        self.observation_space = gym.spaces.Box(-1.0, 1.0, (612,), np.float32)
        self.action_space = gym.spaces.Discrete(92)
        self.obs = np.zeros(612, dtype=np.float32)
        self.metadata: dict[str, Any] = {}
        self.render_mode = None
        self.spec = None
        self.np_random = None

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        return self.obs, {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.obs[0] = action
        return self.obs, action / 4, False, False, {}

    def close(self) -> None:
        pass


def _make_trivial() -> Any:
    import gymnasium as gym

    class Trivial(gym.Env):  # type: ignore[misc,unused-ignore]
        def __init__(self) -> None:
            self.inner = _TrivialEnv()
            self.observation_space = self.inner.observation_space
            self.action_space = self.inner.action_space

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            return self.inner.reset()

        def step(self, action: int) -> Any:
            return self.inner.step(int(action))

    return Trivial()


@pytest.mark.benchmark(group="shm: 32 envs, one batched step")
def test_gymnasium_async32(benchmark: Any) -> None:
    gym = pytest.importorskip("gymnasium")
    envs = gym.vector.AsyncVectorEnv([_make_trivial] * BATCH, shared_memory=True)
    try:
        envs.reset(seed=0)
        actions = np.arange(BATCH) % 92
        measure(benchmark, lambda: envs.step(actions))
    finally:
        envs.close()
    rate = BATCH / benchmark.stats.stats.mean
    benchmark.extra_info["env_steps_per_s"] = rate
    RESULTS["gymnasium-async32"] = rate


def test_ratios(benchmark: Any) -> None:
    """Ratios of the rows above (only those that ran): printed and kept in extra_info."""
    ratios: dict[str, float] = {}
    if "unix" in RESULTS and "shm-balanced" in RESULTS:
        ratios["unix_p50_over_shm_balanced_p50"] = RESULTS["unix"] / RESULTS["shm-balanced"]
    if "unix" in RESULTS and "shm-spin" in RESULTS:
        ratios["unix_p50_over_shm_spin_p50"] = RESULTS["unix"] / RESULTS["shm-spin"]
    if "shm-batch32" in RESULTS and "gymnasium-async32" in RESULTS:
        ratios["shm_over_gymnasium_env_steps"] = (
            RESULTS["shm-batch32"] / RESULTS["gymnasium-async32"]
        )
    benchmark.extra_info.update(RESULTS)
    benchmark.extra_info.update(ratios)
    print("\nshm benchmark:", {k: round(v, 2) for k, v in {**RESULTS, **ratios}.items()})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
