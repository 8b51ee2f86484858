"""Python client round trips against the Node zmq server, next to the Python zmq server.

Run:
  pytest benchmarks/test_zmq_node_bench.py --benchmark-enable \
    --benchmark-json=benchmarks/zmq_node.json

Rows (client in this process, `transport-serve URL --env echo --lang LANG` in another; p50/p99
in extra_info): `client.step(...)` over zmq+ipc and zmq+tcp for one env (4-byte request,
2557-byte result) and 32 envs (128-byte request, 81824-byte result: above the Node server's
64 KiB zero-copy threshold, below Python's 1 MiB one). Short loops: the machine is shared.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport.api as api

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import ServerProcess, require_lang
from tests.test_zmq_backend import zmq_url

ROUNDS = 1500
WARMUP = 200


def measure(benchmark: Any, run: Any) -> None:
    for _ in range(WARMUP):
        run()
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    data = np.array(benchmark.stats.stats.data) * 1e6
    benchmark.extra_info["p50_us"] = float(np.percentile(data, 50))
    benchmark.extra_info["p99_us"] = float(np.percentile(data, 99))


@pytest.mark.parametrize("num_envs", [1, 32], ids=["1env", "32envs"])
@pytest.mark.parametrize("kind", ["ipc", "tcp"])
@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.benchmark(group="zmq server: python vs node")
def test_zmq_server(benchmark: Any, lang: str, kind: str, num_envs: int) -> None:
    require_lang(lang)
    with ServerProcess(zmq_url(kind), env="echo", lang=lang, num_envs=num_envs) as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset()
            if num_envs == 1:
                run = lambda: client.step(5)  # noqa: E731
            else:
                actions = [5] * num_envs
                run = lambda: client.step(actions)  # noqa: E731
            measure(benchmark, run)
