"""The env runtime's own work per env (issue 24 item 2): us per env of a batched step beyond the
env's own ``step``, with an env whose step does nothing, N = 256 (one run, medians).

  .venv/bin/python benchmarks/runtime_overhead_bench.py [--envs 256] [--steps 200]
      [--repeat 7] [--workers 2] [--shm] [--json] [--tree LABEL=DIR ... [--rounds 3]]

Rows (us per env per step, the median of ``--repeat`` runs of ``--steps`` batched steps):

  floor            a bare Python loop calling each env's ``step_into`` (the env's own cost)
  in-process/<how> ``EnvRuntime.step`` over a ``LocalEnvs`` runner, next_step auto-reset; <how>:
                   ``step_into`` (writes in place), ``record`` (returns a record), and
                   ``same_step`` (step_into, same_step auto-reset)
  runtime-net      in-process/step_into minus the floor: the runtime's work per env
  same_step-net    in-process/same_step minus the floor (the same, same_step auto-reset)
  pool/<K>         ``EnvRuntime.step`` over a ``WorkerPool`` of K worker processes (wall time
                   per step / N: the envs of K workers step concurrently), private result
                   rows (a stream session's: the pool copies its N results into them)
  pool/<K> in place  the same with the rows in a shared mapping (an shm server's slots: the
                   workers write them in place, no copy)
  pool/<K> sync only a fan-out whose workers do nothing (``WorkerPool.ping``): the pool's
                   wake-ups and gather alone, the floor of any pool step on this machine
  pool/... cpu     the CPU time of the server and its workers per env (/proc schedstat): the
                   work done, which moves much less with the machine's other load than wall
  vector-echo      ``EnvRuntime.step`` over one ``VectorEchoEnv`` of N envs (one call a step)

``--tree LABEL=DIR`` (repeatable) measures whole trees instead (DIR holds a ``transport``
package, say a copy of the code before a change), each in its own process, alternating
``--rounds`` times, and prints one column per tree (medians of the rounds' medians).

``--envpool`` adds EnvPool CartPole at N stepped in process and served over shm (env-steps/s).
``--shm`` adds end-to-end env-steps/s at N over shm (a server in this process's thread, a client
here): the ordinary echo env (N envs, one object each) and the vectorised echo env. The machine
is shared and loaded: numbers are noisy; compare rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import time
import uuid
from functools import partial
from typing import Any

import numpy as np

from transport.generated import pac_env
from transport.protocol import AutoReset
from transport.runtime.core import EnvRuntime
from transport.runtime.env import Spaces

try:
    from transport.runtime.host import EnvHost
except ImportError:  # a tree before runtime/host.py (--tree runs older trees)
    from transport.runtime.core import EnvHost  # type: ignore[attr-defined,no-redef]

OBS_N, ACT_N = 612, 92


class NullEnv:
    """An env whose step does nothing (the result row keeps its reset values)."""

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        out[()] = 0
        out["action_mask"] = 1

    def step_into(self, action: int, out: np.ndarray) -> None:
        return None

    def reset(self, seed: int | None = None) -> np.ndarray:
        record = pac_env.StepResult.zeros()
        self.reset_into(seed, record)
        return record

    def step(self, action: int) -> np.ndarray:
        return self.reset()


class NullRecordEnv:
    """An env whose step returns the same (prepared) record each time."""

    def __init__(self) -> None:
        self.record = NullEnv().reset()

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def reset(self, seed: int | None = None) -> np.ndarray:
        return self.record

    def step(self, action: int) -> np.ndarray:
        return self.record


def _runtime(
    factory: Any,
    n: int,
    workers: int = 0,
    mode: AutoReset = AutoReset.NEXT_STEP,
    shared: bool = False,
) -> Any:
    """(an ``EnvRuntime`` over N envs, its envs); ``shared``: the result rows lie in a shared
    file mapping (a memfd, as an shm region's slots do), so a pool's workers write them in place
    (else private rows: a pool copies its N results into them, as for a stream session)."""
    host = EnvHost(pac_env.SCHEMA, factory, num_envs=n, workers=workers)
    host.check()
    envs = host.create_envs()
    codec = host.result
    if shared:
        fd = os.memfd_create("rt-bench-rows", os.MFD_CLOEXEC)
        os.ftruncate(fd, 2 * codec.size * n)
        rows = mmap.mmap(fd, 2 * codec.size * n, mmap.MAP_SHARED)
        os.close(fd)  # the mapping keeps the memfd open (find_shared dups an fd on it)
        results = codec.view(rows, 0, count=n)
        finals = codec.view(rows, codec.size * n, count=n)
    else:
        results = codec.view(bytearray(codec.size * n), 0, count=n)
        finals = codec.view(bytearray(codec.size * n), 0, count=n)
    runtime: EnvRuntime = host.runtime(envs, results, finals)
    runtime.set_autoreset(int(mode))
    runtime.reset()
    return runtime, envs


BEST: dict[str, float] = {}
"""The best run of each row (printed beside the median: on a loaded machine the median moves
with the load, the best run much less)."""


def _median_us_per_env(run: Any, n: int, steps: int, repeat: int, key: str = "") -> float:
    for _ in range(max(3, steps // 10)):
        run()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(steps):
            run()
        samples.append((time.perf_counter() - start) / steps / n * 1e6)
    if key:
        BEST[key] = min(samples)
    return statistics.median(samples)


def measure(args: argparse.Namespace) -> dict[str, float]:
    n, steps, repeat = args.envs, args.steps, args.repeat
    rows: dict[str, float] = {}
    actions = np.ones(n, dtype=np.uint8)

    envs = [NullEnv() for _ in range(n)]
    codec = pac_env.StepResult
    results = codec.view(bytearray(codec.size * n), 0, count=n)
    records = [results[i, ...] for i in range(n)]
    values = actions.tolist()

    def floor() -> None:
        for env, action, record in zip(envs, values, records, strict=True):
            env.step_into(action, record)

    rows["floor"] = _median_us_per_env(floor, n, steps, repeat, "floor")
    for name, factory, mode in (
        ("in-process/step_into", NullEnv, AutoReset.NEXT_STEP),
        ("in-process/record", NullRecordEnv, AutoReset.NEXT_STEP),
        ("in-process/same_step", NullEnv, AutoReset.SAME_STEP),
    ):
        runtime, _ = _runtime(factory, n, mode=mode)
        rows[name] = _median_us_per_env(lambda r=runtime: r.step(actions), n, steps, repeat, name)
        runtime.close()
    rows["runtime-net"] = rows["in-process/step_into"] - rows["floor"]
    BEST["runtime-net"] = BEST["in-process/step_into"] - BEST["floor"]
    rows["same_step-net"] = rows["in-process/same_step"] - rows["floor"]
    BEST["same_step-net"] = BEST["in-process/same_step"] - BEST["floor"]
    if args.workers:
        rows.update(measure_pool(args.workers, n, steps, repeat, actions))
    vector: Any = None
    try:  # absent before issue 24: the bench also runs on older trees (PYTHONPATH)
        from transport.envs.vector_echo import VectorEchoEnv as vector
    except ImportError:
        pass
    if vector is not None:
        runtime, _ = _runtime(partial(vector, n), n)
        step = runtime.step
        rows["vector-echo"] = _median_us_per_env(
            lambda: step(actions), n, steps, repeat, "vector-echo"
        )
        runtime.close()
    if args.shm:
        rows.update(measure_shm(n, steps, repeat))
    if args.envpool:
        rows.update(measure_envpool(n, steps, repeat))
    return rows


def measure_pool(
    workers: int, n: int, steps: int, repeat: int, actions: np.ndarray
) -> dict[str, float]:
    """The worker-pool rows: private rows (the pool copies its results into them), rows in a
    shared mapping (the workers write them in place: an shm server's case), and the pool's
    synchronisation alone (a fan-out whose workers do nothing: ``WorkerPool.ping``, the floor
    of any pool step on this machine), each per env of N (wall time / N)."""
    rows: dict[str, float] = {}
    for label, shared in (("", False), (" in place", True)):
        runtime, _ = _runtime(NullEnv, n, workers=workers, shared=shared)
        try:
            pids = [os.getpid(), *runtime.runner.pids()]
            key = f"pool/{workers}{label}"
            step = lambda r=runtime: r.step(actions)  # noqa: E731
            rows[key], rows[key + " cpu"] = _wall_and_cpu(step, pids, n, steps, repeat, key)
            ping = getattr(runtime.runner, "ping", None)  # absent on older trees (--tree)
            if shared and ping is not None:
                key = f"pool/{workers} sync only"
                rows[key], rows[key + " cpu"] = _wall_and_cpu(ping, pids, n, steps, repeat, key)
        finally:
            runtime.close()
    return rows


def _cpu_ns(pids: list[int]) -> int:
    """Nanoseconds the processes ``pids`` ran on a CPU (/proc/<pid>/schedstat; 0 if absent)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def _wall_and_cpu(
    run: Any, pids: list[int], n: int, steps: int, repeat: int, key: str
) -> tuple[float, float]:
    """(median wall us per env, median CPU us per env of every process in ``pids``: the server
    and its workers): on a loaded 2-core machine the wall time moves with the other load, the
    CPU time (the work done) much less."""
    for _ in range(max(3, steps // 10)):
        run()
    walls, cpus = [], []
    for _ in range(repeat):
        cpu, start = _cpu_ns(pids), time.perf_counter()
        for _ in range(steps):
            run()
        walls.append((time.perf_counter() - start) / steps / n * 1e6)
        cpus.append((_cpu_ns(pids) - cpu) / steps / n / 1e3)
    BEST[key], BEST[key + " cpu"] = min(walls), min(cpus)
    return statistics.median(walls), statistics.median(cpus)


_SERVE = """
import sys, functools
import transport
from transport.generated import pac_env
kind, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
schema = pac_env.SCHEMA
if kind == "vector":
    from transport.envs.vector_echo import VectorEchoEnv
    factory = functools.partial(VectorEchoEnv, n)
elif kind == "envpool":
    import envpool
    from transport.envs.vector_gym import EnvPoolEnv
    def factory():
        return EnvPoolEnv(envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=0))
    schema = factory().SCHEMA
else:
    from transport.envs.echo import EchoEnv as factory
server = transport.Server(factory, url, schema=schema, num_envs=n).start()
print("ready", flush=True)
sys.stdin.read()
server.close()
"""


def measure_envpool(n: int, steps: int, repeat: int) -> dict[str, float]:
    """EnvPool CartPole at N: stepped in this process, and served over shm (next_step, its own
    auto-reset) to a client here; env-steps/s each (issue 24: within 1.2x)."""
    import subprocess
    import sys
    import warnings

    import envpool

    import transport

    warnings.filterwarnings("ignore")
    pool = envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=0)
    pool.reset()
    acts = np.ones(n, dtype=np.int32)
    rows: dict[str, float] = {}
    key = "envpool in process (env-steps/s)"
    us = _median_us_per_env(lambda: pool.step(acts), n, steps, repeat, key)
    rows[key], BEST[key] = 1e6 / us, 1e6 / BEST[key]
    pool.close()
    url = f"shm://rt-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}?num_envs={n}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, "envpool", url, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with transport.connect(url, autoreset="next_step", timeout=30) as client:
            client.reset()
            actions = np.ones(n, dtype=np.uint8)
            key = "envpool over shm (env-steps/s)"
            us = _median_us_per_env(lambda: client.step(actions), n, steps, repeat, key)
            rows[key], BEST[key] = 1e6 / us, 1e6 / BEST[key]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    return rows


def measure_shm(n: int, steps: int, repeat: int) -> dict[str, float]:
    """env-steps/s at N over shm: a server process, a client here (next_step auto-reset)."""
    import subprocess
    import sys

    import transport

    kinds = [("shm/echo", "echo")]
    try:
        import transport.envs.vector_echo as _vector

        kinds += [("shm/vector-echo", "vector")] if _vector else []
    except ImportError:
        pass
    rows: dict[str, float] = {}
    actions = np.ones(n, dtype=np.uint8)
    for name, kind in kinds:
        url = f"shm://rt-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}?num_envs={n}"
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, kind, url, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            client = transport.connect(url, pac_env.SCHEMA, autoreset="next_step", timeout=30)
            with client:
                client.reset(seed=1)
                key = name + " (env-steps/s)"
                us = _median_us_per_env(lambda c=client: c.step(actions), n, steps, repeat, key)
            rows[key] = 1e6 / us
            BEST[key] = 1e6 / BEST[key]
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    return rows


def compare_trees(args: argparse.Namespace) -> None:
    """Each tree's rows, measured in a child process per tree and round (alternating: the same
    load for each), printed side by side: the median of the rounds' medians (best run of all)."""
    import subprocess
    import sys

    trees = [(label, path) for label, _, path in (t.partition("=") for t in args.tree)]
    passed = ["--envs", str(args.envs), "--steps", str(args.steps), "--repeat", str(args.repeat)]
    passed += ["--workers", str(args.workers), "--json"] + (["--shm"] if args.shm else [])
    found: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    best: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    for _ in range(args.rounds):
        for label, path in trees:
            env = dict(os.environ, PYTHONPATH=path)
            done = subprocess.run(
                [sys.executable, __file__, *passed],
                env=env,
                cwd=path,
                capture_output=True,
                text=True,
                check=True,
            )
            rows = json.loads(done.stdout)
            found[label].append(rows["median"])
            best[label].append(rows["best"])
    keys: list[str] = []  # every tree's rows, in the order they came (older trees lack some)
    for runs in found.values():
        keys += [key for key in runs[0] if key not in keys]
    print(
        f"N = {args.envs}, {args.rounds} alternating rounds of {args.repeat} x {args.steps} "
        "steps: median of the rounds' medians (best run of all)"
    )
    print(f"  {'row':24s}" + "".join(f"{label:>24s}" for label, _ in trees))
    for key in keys:
        text = ""
        for label, _ in trees:
            values = [run[key] for run in found[label] if key in run]
            bests = [run[key] for run in best[label] if key in run]
            if not values:
                text += f"{'-':>24s}"
            elif "steps/s" in key:
                text += f"{statistics.median(values):14,.0f} ({max(bests):,.0f})"
            else:
                text += f"{statistics.median(values):15.3f} ({min(bests):6.3f})"
        print(f"  {key:24s}{text}" + ("" if "steps/s" in key else "  us/env"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2, help="0: no pool row")
    parser.add_argument("--shm", action="store_true", help="env-steps/s over shm too")
    parser.add_argument("--envpool", action="store_true", help="EnvPool in process vs over shm")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--tree", action="append", default=[], help="LABEL=DIR: a tree to measure (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the trees")
    args = parser.parse_args()
    if args.tree:
        compare_trees(args)
        return
    rows = measure(args)
    if args.json:
        print(json.dumps({"median": rows, "best": BEST}))
        return
    print(f"N = {args.envs}, {args.steps} steps x {args.repeat} runs: median (best run)")
    for key, value in rows.items():
        best = BEST.get(key, value)
        if "steps/s" in key:
            print(f"  {key:30s} {value:12,.0f} ({best:,.0f})")
        else:
            print(f"  {key:30s} {value:9.3f} us/env ({best:.3f})")


if __name__ == "__main__":
    main()
