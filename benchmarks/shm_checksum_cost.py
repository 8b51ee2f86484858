"""What ``shm://NAME?checksum=crc32`` costs: p50/p99 of a step with and without it, side by side.

    python benchmarks/shm_checksum_cost.py [--rounds 20] [--steps 2000]

One server per (server language, num_envs, checksum) cell, a Python client each; the cells take
turns in chunks of ``--steps`` steps for ``--rounds`` rounds, so every cell sees the same load.
Prints a Markdown table (benchmarks/RESULTS.md, "shm checksum").
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transport.api as api  # noqa: E402
from tests.servers import ServerProcess  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--langs", default="python,node")
    args = parser.parse_args()
    cells = []
    try:
        for lang in args.langs.split(","):
            for n in (1, 16):
                for checksum in (False, True):
                    name = f"bench-{uuid.uuid4().hex[:10]}"
                    url = f"shm://{name}" + ("?checksum=crc32" if checksum else "")
                    server = ServerProcess(url, lang=lang, num_envs=n)
                    client = api.connect(f"shm://{name}", timeout=10)
                    client.reset(seed=1)
                    actions = 0 if n == 1 else np.zeros(n, dtype=np.int32)
                    cells.append((lang, n, checksum, server, client, actions, []))
        for _ in range(args.rounds):
            for _lang, _n, _ck, _server, client, actions, samples in cells:
                for _ in range(args.steps):
                    t = time.perf_counter_ns()
                    client.step(actions)
                    samples.append(time.perf_counter_ns() - t)
        print("| server | envs | checksum | p50 us | p99 us | p50 ratio |")
        print("|---|---:|---|---:|---:|---:|")
        base: dict[tuple[str, int], float] = {}
        for lang, n, checksum, _server, _client, _actions, samples in cells:
            p50, p99 = (float(np.percentile(samples, q)) / 1e3 for q in (50, 99))
            if not checksum:
                base[(lang, n)] = p50
            ratio = p50 / base[(lang, n)]
            print(
                f"| {lang} | {n} | {'crc32' if checksum else 'off'} | {p50:.2f} | {p99:.2f} "
                f"| {ratio:.2f}x |"
            )
    finally:
        for _lang, _n, _ck, server, client, _actions, _samples in cells:
            client.close()
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
