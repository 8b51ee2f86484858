"""shm:// with the Node server next to the Python server, in one run (short loops: shared machine).

Run:
  pytest benchmarks/test_shm_node_bench.py --benchmark-enable -s

Rows (Python client, echo env, server process in Python or Node):
  shm-{python,node}           1 env: step(a) round trips (balanced wait policy), p50 / p99
  unix-node                   1 env over unix:// to the Node server (the stream baseline)
  shm-batch32-{python,node}   32 envs, one batched step per round: env-steps/s
The last test prints the ratios (Node vs Python server, unix vs shm for Node).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport.api as api

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.test_transport_bench import measure
from tests.servers import ServerProcess, require_lang, unique_url
from tests.test_shm_backend import unique_shm_url

BATCH = 32
# a fresh Node server runs its first few thousand requests before V8 has optimised the serve
# loop (~17 us instead of ~3 us per round trip): warm every row up past that
WARMUP = 10_000
RESULTS: dict[str, float] = {}


@pytest.mark.parametrize("row", ["shm-python", "shm-node", "unix-node"])
@pytest.mark.benchmark(group="shm node: 1-env round trip")
def test_step(benchmark: Any, row: str) -> None:
    backend, lang = row.split("-")
    require_lang(lang)
    url = unique_shm_url(1) if backend == "shm" else unique_url("unix")
    with ServerProcess(url, env="echo", lang=lang) as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset()
            measure(benchmark, lambda: client.step(5), WARMUP)
    RESULTS[f"{row}-p50-us"] = benchmark.extra_info["p50_us"]
    RESULTS[f"{row}-p99-us"] = benchmark.extra_info["p99_us"]


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.benchmark(group="shm node: 32 envs, one batched step")
def test_batch32(benchmark: Any, lang: str) -> None:
    require_lang(lang)
    actions = np.arange(BATCH, dtype=np.int32) % 92
    with ServerProcess(unique_shm_url(BATCH), env="echo", lang=lang, num_envs=BATCH) as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset()
            measure(benchmark, lambda: client.step(actions), WARMUP)
    rate = BATCH / benchmark.stats.stats.mean
    benchmark.extra_info["env_steps_per_s"] = rate
    RESULTS[f"shm-batch32-{lang}-env-steps-per-s"] = rate


def test_ratios(benchmark: Any) -> None:
    """Ratios of the rows above (only those that ran): printed and kept in extra_info."""
    ratios: dict[str, float] = {}
    if "shm-node-p50-us" in RESULTS and "shm-python-p50-us" in RESULTS:
        ratios["node_p50_over_python_p50"] = (
            RESULTS["shm-node-p50-us"] / RESULTS["shm-python-p50-us"]
        )
    if "unix-node-p50-us" in RESULTS and "shm-node-p50-us" in RESULTS:
        ratios["node_unix_p50_over_shm_p50"] = (
            RESULTS["unix-node-p50-us"] / RESULTS["shm-node-p50-us"]
        )
    py, node = "shm-batch32-python-env-steps-per-s", "shm-batch32-node-env-steps-per-s"
    if py in RESULTS and node in RESULTS:
        ratios["node_over_python_env_steps"] = RESULTS[node] / RESULTS[py]
    benchmark.extra_info.update(RESULTS)
    benchmark.extra_info.update(ratios)
    print("\nshm node benchmark:", {k: round(v, 2) for k, v in {**RESULTS, **ratios}.items()})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
