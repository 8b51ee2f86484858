"""Lock-step with worker processes, shm:// against unix://, side by side (issue 24 item 5).

One ``heavy_tail`` server per setup (N envs in W worker processes, ``transport-serve
--workers W``), all started before the first spin and kept for the whole run; each round spins
every setup once (``client.step(actions)`` of all N envs per call, time-boxed), the order
rotating from round to round, so a load that comes and goes (a shared 2-core machine) falls on
every setup alike. Reports the median env-steps/s of each setup over the rounds, the median of
the per-round shm/unix ratios, the load average before and after, and each side's CPU seconds
per 1,000 env-steps (the client's own, from ``time.process_time``; the server's and its
workers', from /proc): a waiter that spins shows there.

    .venv/bin/python benchmarks/shm_pool_bench.py [--rounds 7] [--seconds 1] [--json]
        [--setup shm] [--setup unix] [--setup "shm-futex=shm://?wait=futex"]

A setup is ``NAME`` (unix or shm, defaults) or ``NAME=URL``; an shm URL's query (``wait=``,
``spin=``) is the client's wait policy; after a ``|``, the server's (``shm://?wait=futex|spin=0``).
``shm://?q`` (no name) gets a unique region name.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

import transport

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE = os.path.join(ROOT, ".venv", "bin", "transport-serve")
TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its children (the pool's workers)."""
    return _tree(pid)[0]


def _tree(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` and its children (the pool's workers), and the seconds their
    threads spent runnable but not running (/proc/PID/task/TID/schedstat: waiting for a core)."""
    total = waited = 0.0
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):  # a pool started by any of its threads
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                pids += [int(p) for p in fh.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/schedstat") as fh:
                    waited += int(fh.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            pass
    return total, waited


class Setup:
    """One server (transport-serve subprocess) and one connected lock-step client."""

    def __init__(self, name: str, url: str, num_envs: int, workers: int, lang: str) -> None:
        self.name = name
        tag = f"{os.getpid()}-{name.replace('=', '-')}"
        scheme, _, rest = url.partition("://")
        if scheme == "shm":
            rest, _, server_query = rest.partition("|")
            region, _, query = rest.partition("?")
            region = region or f"shm-pool-bench-{tag}"
            self.server_url = f"shm://{region}?num_envs={num_envs}"
            if server_query:
                self.server_url += "&" + server_query
            self.client_url = f"shm://{region}?num_envs={num_envs}"
            if query:
                self.client_url += "&" + query
        else:
            path = rest or f"/tmp/shm-pool-bench-{tag}.sock"
            self.server_url = self.client_url = f"unix://{path}"
        cmd = [SERVE, self.server_url, "--env", "heavy_tail", "--num-envs", str(num_envs)]
        cmd += ["--workers", str(workers), "--seed", "1", "--lang", lang]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            self.proc.kill()
            raise RuntimeError(f"transport-serve {self.server_url} did not start: {line!r}")
        self.client = transport.connect(self.client_url, autoreset="next_step", timeout=30)
        self.client.reset(1)
        self.actions = np.random.default_rng(0).integers(0, 92, num_envs)
        self.num_envs = num_envs
        self.rates: list[float] = []
        self.client_cpu: list[float] = []
        self.server_cpu: list[float] = []
        self.server_wait: list[float] = []

    def spin(self, seconds: float) -> float:
        """Lock-step steps for ``seconds`` (after a short warm-up); returns env-steps/s."""
        client, actions, n = self.client, self.actions, self.num_envs
        warm = time.perf_counter() + min(0.2, seconds / 4)
        while time.perf_counter() < warm:
            client.step(actions)
        cpu0, (srv0, wait0) = time.process_time(), _tree(self.proc.pid)
        steps = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            client.step(actions)
            steps += n
        took = time.perf_counter() - start
        rate = steps / took
        per_k = 1000.0 / steps
        self.rates.append(rate)
        self.client_cpu.append((time.process_time() - cpu0) * per_k)
        srv1, wait1 = _tree(self.proc.pid)
        self.server_cpu.append((srv1 - srv0) * per_k)
        self.server_wait.append((wait1 - wait0) * per_k)
        return rate

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def run(
    setups: list[tuple[str, str]],
    num_envs: int,
    workers: int,
    rounds: int,
    seconds: float,
    lang: str = "python",
    busy: int = 0,
) -> dict[str, Any]:
    """Interleaved rounds over every setup; medians and the per-round ratios to ``unix``."""
    load0 = os.getloadavg()
    live: list[Setup] = []
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        for name, url in setups:
            live.append(Setup(name, url, num_envs, workers, lang))
        for r in range(rounds):
            k = r % len(live)
            for setup in live[k:] + live[:k]:  # rotate the order: no setup always goes first
                setup.spin(seconds)
        base = next((s for s in live if s.name == "unix"), live[0])
        rows: dict[str, Any] = {}
        for s in live:
            ratios = [a / b for a, b in zip(s.rates, base.rates, strict=True)]
            rows[s.name] = {
                "url": s.client_url,
                "median_steps_per_s": statistics.median(s.rates),
                "rounds_steps_per_s": [round(x) for x in s.rates],
                f"median_ratio_to_{base.name}": statistics.median(ratios),
                "client_cpu_s_per_1k_steps": statistics.median(s.client_cpu),
                "server_cpu_s_per_1k_steps": statistics.median(s.server_cpu),
                "server_runqueue_wait_s_per_1k_steps": statistics.median(s.server_wait),
            }
    finally:
        for s in live:
            s.close()
        for hog in hogs:
            hog.kill()
            hog.wait()
    return {
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "num_envs": num_envs,
        "workers": workers,
        "server": lang,
        "rounds": rounds,
        "busy_loops": busy,
        "seconds_per_spin": seconds,
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.0, help="each spin (time-boxed)")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lang", choices=["python", "node"], default="python")
    parser.add_argument("--setup", action="append", help="NAME or NAME=URL (repeatable)")
    parser.add_argument(
        "--busy", type=int, default=0, help="CPU-bound processes beside it (a loaded machine)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    setups = []
    for item in args.setup or ["unix", "shm"]:
        name, _, url = item.partition("=")
        setups.append((name, url or f"{name}://"))
    report = run(
        setups, args.num_envs, args.workers, args.rounds, args.seconds, args.lang, args.busy
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['server']} server, N={args.num_envs}, W={args.workers}, {args.rounds} rounds "
        f"x {args.seconds} s, {args.busy} busy loops, "
        f"load {report['load_before']} -> {report['load_after']}"
    )
    print(
        f"{'setup':14} {'steps/s':>9} {'ratio':>6} {'cli cpu':>8} {'srv cpu':>8} "
        f"{'srv wait':>8}  rounds"
    )
    for name, r in report["rows"].items():
        ratio = next(v for k, v in r.items() if k.startswith("median_ratio"))
        print(
            f"{name:14} {r['median_steps_per_s']:9.0f} {ratio:6.2f} "
            f"{r['client_cpu_s_per_1k_steps']:8.3f} {r['server_cpu_s_per_1k_steps']:8.3f} "
            f"{r['server_runqueue_wait_s_per_1k_steps']:8.3f}  "
            f"{r['rounds_steps_per_s']}"
        )
    print(
        "ratio: median of the per-round ratios to unix; cpu: CPU s per 1k env-steps (client; "
        "server + workers); srv wait: s per 1k env-steps the server and its workers were "
        "runnable but had no core"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
