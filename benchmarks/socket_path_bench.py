"""Batched socket paths, before/after in one run: p50 of a batched step (issue 24 item 3).

    python benchmarks/socket_path_bench.py --before /tmp/before --backends unix,zmq+ipc \
        --envs echo,vector-echo,null --batch 64,256 --rounds 3

Each cell starts a server (``--serve``) and a client (``--client``) as child processes under the
PYTHONPATH of one tree (``--before DIR``: a copy of the package as it was; the working tree
otherwise), so the two trees alternate A B A B in one run and their medians are comparable.
Envs: ``echo`` (one EchoEnv per env), ``vector-echo`` (VectorEchoEnv), ``null`` (a vector env
whose step writes nothing: the transport and the runtime alone, the split of env vs transport).
``--raw`` adds the raw floor of each scheme (transport/probe/raw.py) to every round.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class NullVectorEnv:
    """N envs whose step writes nothing: a round trip is the transport and the runtime."""

    steps_subsets = True
    writes_columns = True
    autoreset_next_step = False

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs

    def spaces(self) -> Any:
        from transport.runtime.env import Spaces

        return Spaces(612, 92)

    def reset_envs(self, ids: np.ndarray, seeds: Sequence[int | None], out: Any) -> None:
        out["action_mask"][ids] = 1  # every action legal; a step writes nothing after this

    def step_envs(self, actions: np.ndarray, ids: np.ndarray | None, out: Any) -> None:
        return None


def serve(url: str, env: str, num_envs: int) -> None:
    import transport
    from transport.generated import pac_env

    factory: Any
    if env == "echo":
        from transport.envs.echo import EchoEnv

        factory = EchoEnv
    elif env == "vector-echo":
        from transport.envs.vector_echo import VectorEchoEnv

        factory = functools.partial(VectorEchoEnv, num_envs)
    else:
        factory = functools.partial(NullVectorEnv, num_envs)
    transport.serve(
        factory,
        url,
        schema=pac_env.SCHEMA,
        num_envs=num_envs,
        env_name=env,
        ready=lambda u: print(f"ready {u}", flush=True),
    )


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of process ``pid`` so far (ns; /proc/PID/task/*/schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def client(url: str, num_envs: int, count: int, seconds: float, server_pid: int) -> None:
    """p50 of the round trips, and the CPU time per round trip of this process (all its
    threads) and of the server process: robust to other jobs' load where wall time is not."""
    import transport

    with transport.connect(url) as c:
        c.reset()
        actions = np.arange(num_envs, dtype=np.uint8) % 92
        for _ in range(200):
            c.step(actions)
        times = []
        clock = time.perf_counter_ns
        end = time.monotonic() + seconds
        mine, theirs = cpu_ns(os.getpid()), cpu_ns(server_pid)
        for _ in range(count):
            t0 = clock()
            c.step(actions)
            times.append(clock() - t0)
            if time.monotonic() > end:
                break
        mine, theirs = cpu_ns(os.getpid()) - mine, cpu_ns(server_pid) - theirs
    n = len(times)
    print(
        f"{statistics.median(times) / 1e3:.1f} {mine / n / 1e3:.1f} {theirs / n / 1e3:.1f}",
        flush=True,
    )


def cell(
    tree: str, scheme: str, env: str, batch: int, count: int, seconds: float
) -> tuple[float, float, float]:
    path = os.environ.copy()
    path["PYTHONPATH"] = tree
    from transport.testing.servers import unique_url

    me = str(Path(__file__).resolve())
    server = subprocess.Popen(
        [sys.executable, me, "--serve", unique_url(scheme), env, str(batch)],
        env=path,
        cwd=tempfile.gettempdir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().decode().strip()
        if not line.startswith("ready "):
            raise RuntimeError(f"server did not start: {line!r}")
        url = line.split(" ", 1)[1]
        out = subprocess.run(
            [
                sys.executable,
                me,
                "--client",
                url,
                str(batch),
                str(count),
                str(seconds),
                str(server.pid),
            ],
            env=path,
            cwd=tempfile.gettempdir(),
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        ).stdout
        p50, mine, theirs = (float(v) for v in out.split()[-3:])
        return p50, mine, theirs
    finally:
        server.terminate()
        server.wait(10)


def raw_cell(scheme: str, batch: int, count: int, seconds: float) -> float:
    from transport.probe.raw import measure_raw
    from transport.probe.runner import step_request_size, step_result_size

    tag = f"spbraw-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    hist, _ = measure_raw(
        scheme,
        "python",
        tag,
        9 + batch * step_request_size(),
        9 + batch * step_result_size(),
        count,
        200,
        seconds,
    )
    return float(hist.percentile(50)) / 1e3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve":
        serve(argv[1], argv[2], int(argv[3]))
        return 0
    if argv and argv[0] == "--client":
        client(argv[1], int(argv[2]), int(argv[3]), float(argv[4]), int(argv[5]))
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default=None, help="a tree holding the old package")
    parser.add_argument("--backends", default="unix")
    parser.add_argument("--envs", default="echo")
    parser.add_argument("--batch", default="64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--raw", action="store_true")
    args = parser.parse_args(argv)
    trees = {"after": str(ROOT)}
    if args.before:
        trees = {"before": args.before, "after": str(ROOT)}
    cells = [
        (scheme, env, int(batch))
        for scheme in args.backends.split(",")
        for env in args.envs.split(",")
        for batch in args.batch.split(",")
    ]
    got: dict[tuple[str, ...], list[float]] = {}
    cpu: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    for _ in range(args.rounds):
        for scheme, env, batch in cells:
            for name, tree in trees.items():
                p50, mine, theirs = cell(tree, scheme, env, batch, args.count, args.seconds)
                got.setdefault((scheme, env, str(batch), name), []).append(p50)
                cpu.setdefault((scheme, env, str(batch), name), []).append((mine, theirs))
            if args.raw and scheme != "http" and env == args.envs.split(",")[0]:
                raw = raw_cell(scheme, batch, args.count, args.seconds)
                got.setdefault((scheme, "raw", str(batch), "python"), []).append(raw)
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    print("cell  p50 us (each round)  cpu us per round trip: client / server (medians)")
    for key, values in got.items():
        runs = " ".join(f"{v:.0f}" for v in values)
        text = f"{' '.join(key):32s} p50 {statistics.median(values):7.1f} ({runs})"
        if key in cpu:
            mine = statistics.median(c[0] for c in cpu[key])
            theirs = statistics.median(c[1] for c in cpu[key])
            text += f"  cpu {mine:6.1f} / {theirs:6.1f}"
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
