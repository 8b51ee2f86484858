"""Asynchronous batches against lock-step on the Node server with worker threads, in one run.

The Node twin of ``benchmarks/async_bench.py``'s transport rows: the env is ``heavy_tail``
(node_bridge/src/envs/heavy_tail.ts: most steps cost 0.2 ms of CPU, one in twenty 20 times
that), served by ``transport-serve URL --lang node --workers W``; the client is Python. Each spin
is time-boxed and reports env-steps/s and the p50/p99 of one call (a lock-step STEP of N envs,
or one RECV of B = N/2 plus its SEND), and the async / lock-step ratio beside the ideal one.

    .venv/bin/python benchmarks/node_async_bench.py [--seconds 3] [--num-envs 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_bench import ideal_ratio, transport_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE = os.path.join(ROOT, ".venv", "bin", "transport-serve")


def node_runs(scheme: str, num_envs: int, workers: int, seconds: float) -> dict[str, Any]:
    """Lock-step then async on a Node heavy_tail server with ``workers`` worker threads."""
    out = transport_runs(num_envs, workers, seconds, ["lockstep", "async"], scheme, lang="node")
    out["ratio"] = out["async"]["steps_per_s"] / out["lockstep"]["steps_per_s"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each spin (time-boxed)")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--schemes", default="unix,shm", help="comma-separated: unix, shm")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "num_envs": args.num_envs,
        "workers": args.workers,
        "ideal_ratio": ideal_ratio(args.num_envs, args.workers),
    }
    for scheme in args.schemes.split(","):
        results[scheme] = node_runs(scheme, args.num_envs, args.workers, args.seconds)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    n, w = args.num_envs, args.workers
    print(f"Node server, heavy_tail, N = {n}, {w} worker threads, B = {max(1, n // 2)}")
    print("| run | env-steps/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    for scheme in args.schemes.split(","):
        for mode in ("lockstep", "async"):
            r = results[scheme][mode]
            name = f"{scheme} {'lock-step' if mode == 'lockstep' else 'async send/recv'}"
            print(f"| {name} | {r['steps_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
    for scheme in args.schemes.split(","):
        print(f"{scheme}: async / lock-step = {results[scheme]['ratio']:.2f}x")
    print(f"ideal async / lock-step for this env law on 2 cores: {results['ideal_ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
