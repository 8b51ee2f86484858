"""Asynchronous batches against lock-step, in one run (issue 14 item 5).

The env is ``heavy_tail`` (transport/envs/heavy_tail.py): most steps cost 0.2 ms of CPU, one in
twenty 20 times that. Every spin is time-boxed (``--seconds``) and reports env-steps/s and the
p50/p99 of one call (a lock-step STEP of N envs, or one RECV of B = N/2 plus its SEND):

- transport lock-step: ``client.step(actions)`` over a unix socket, N envs in W worker processes
- transport async: ``client.send`` / ``client.recv(B)`` on the same server
- gymnasium ``AsyncVectorEnv`` and SB3 ``SubprocVecEnv`` (one process per env) on the same env
- worker counts 1, 2, 4, 8 on this machine's cores (oversubscription must not collapse)

    .venv/bin/python benchmarks/async_bench.py [--seconds 3] [--num-envs 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

import transport
from transport.envs.heavy_tail import FAST_S, SLOW_FACTOR, SLOW_ONE_IN, HeavyTailEnv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE = os.path.join(ROOT, ".venv", "bin", "transport-serve")


class HeavyTailGym(gymnasium.Env[np.ndarray, np.int64]):
    """The same env as a plain gymnasium.Env, for the peers that host Python envs themselves."""

    def __init__(self) -> None:
        self.env = HeavyTailEnv()
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (612,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(92)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        record = self.env.reset(seed)
        return np.array(record["observation"], dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        record = self.env.step(int(action))
        obs = np.array(record["observation"], dtype=np.float32)
        return obs, float(record["reward"]), False, False, {}


def _spin(seconds: float, call: Callable[[], int]) -> dict[str, float]:
    """Run ``call`` (returns env-steps done) for ``seconds`` after a short warm-up."""
    warm = time.perf_counter() + min(0.5, seconds / 4)
    while time.perf_counter() < warm:
        call()
    lat: list[float] = []
    steps = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        t = time.perf_counter()
        if t >= end:
            break
        steps += call()
        lat.append(time.perf_counter() - t)
    took = time.perf_counter() - start
    arr = np.array(lat) * 1e3
    return {
        "steps_per_s": steps / took,
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "calls": len(lat),
    }


def _server(url: str, num_envs: int, workers: int, lang: str = "python") -> subprocess.Popen[str]:
    cmd = [SERVE, url, "--env", "heavy_tail", "--num-envs", str(num_envs), "--lang", lang]
    cmd += ["--workers", str(workers), "--seed", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise RuntimeError(f"transport-serve did not start: {line!r}")
    return proc


def ideal_ratio(num_envs: int, workers: int, cores: int = 2, samples: int = 4000) -> float:
    """The most async can gain over lock-step on ``cores`` cores, from the env's step-time law
    alone (no transport cost, no other load): a lock-step batch ends when its last worker ends
    (worker k's work is the sum of its envs' steps; the cores are shared fairly among the
    workers still busy), while async never lets a core idle (total work / min(cores, W))."""
    rng = np.random.default_rng(0)
    per = num_envs // workers
    slow = rng.integers(0, SLOW_ONE_IN, (samples, workers, per)) == 0
    work = np.where(slow, FAST_S * SLOW_FACTOR, FAST_S).sum(axis=2)
    lockstep = 0.0
    for jobs in np.sort(work, axis=1):  # processor sharing: the shortest job ends first
        t, done = 0.0, 0.0
        for k, job in enumerate(jobs):
            rate = min(1.0, cores / (len(jobs) - k))
            t += (job - done) / rate
            done = job
        lockstep += t
    busy = work.sum() / min(cores, workers)
    return float(lockstep / busy)


def transport_runs(
    num_envs: int,
    workers: int,
    seconds: float,
    modes: list[str],
    scheme: str = "unix",
    lang: str = "python",
) -> dict[str, Any]:
    """Lock-step and async spins against one ``heavy_tail`` server (``lang``) over ``scheme``."""
    if scheme == "shm":
        url = f"shm://async-bench-{os.getpid()}-{workers}?num_envs={num_envs}"
    else:
        url = f"unix:///tmp/async-bench-{os.getpid()}-{workers}.sock"
    proc = _server(url, num_envs, workers, lang)
    out: dict[str, Any] = {}
    try:
        with transport.connect(url, autoreset="next_step", timeout=30) as client:
            rng = np.random.default_rng(0)
            if "lockstep" in modes:
                client.reset(1)
                actions = rng.integers(0, 92, num_envs)

                def lockstep() -> int:
                    client.step(actions)
                    return num_envs

                out["lockstep"] = _spin(seconds, lockstep)
            if "async" in modes:
                batch = max(1, num_envs // 2)
                client.async_reset(1)
                first = client.recv(num_envs)
                # in two halves: over shm a SEND of every env is a lock-step step to the server
                client.send(rng.integers(0, 92, batch), first.env_ids[:batch])
                client.send(rng.integers(0, 92, num_envs - batch), first.env_ids[batch:])

                def async_step() -> int:
                    got = client.recv(batch)
                    ids = got.env_ids
                    client.send(rng.integers(0, 92, len(ids)), ids)
                    return len(ids)

                out["async"] = _spin(seconds, async_step)
                while True:  # drain what is in flight
                    try:
                        client.recv(num_envs)
                    except transport.errors.RemoteError:
                        break
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return out


def gym_async(num_envs: int, seconds: float) -> dict[str, float]:
    from gymnasium.vector import AsyncVectorEnv

    envs = AsyncVectorEnv([HeavyTailGym for _ in range(num_envs)])
    try:
        envs.reset(seed=1)
        rng = np.random.default_rng(0)

        def step() -> int:
            envs.step(rng.integers(0, 92, num_envs))
            return num_envs

        return _spin(seconds, step)
    finally:
        envs.close()


def sb3_subproc(num_envs: int, seconds: float) -> dict[str, float]:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    envs = SubprocVecEnv([HeavyTailGym for _ in range(num_envs)])
    try:
        envs.reset()
        rng = np.random.default_rng(0)

        def step() -> int:
            envs.step(rng.integers(0, 92, num_envs))
            return num_envs

        return _spin(seconds, step)
    finally:
        envs.close()


def _puffer_env(*args: Any, **kwargs: Any) -> Any:
    import pufferlib.emulation  # type: ignore[import-not-found, unused-ignore]

    return pufferlib.emulation.GymnasiumPufferEnv(
        env=HeavyTailGym(), buf=kwargs.get("buf"), seed=kwargs.get("seed", 0)
    )


def puffer_async(num_envs: int, workers: int, seconds: float) -> dict[str, float] | str:
    """PufferLib's multiprocessing vector with the same B = N/2 (its recv/send), if installed."""
    try:
        import pufferlib.vector  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        return f"not installed ({exc}): pip install pufferlib-core (it pins torch)"
    envs = pufferlib.vector.make(
        _puffer_env,
        num_envs=num_envs,
        num_workers=workers,
        batch_size=num_envs // 2,
        backend=pufferlib.vector.Multiprocessing,
    )
    try:
        envs.async_reset(1)
        rng = np.random.default_rng(0)

        def step() -> int:
            out = envs.recv()
            count = len(out[0])
            envs.send(rng.integers(0, 92, count))
            return count

        return _spin(seconds, step)
    finally:
        envs.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="each spin (time-boxed)")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="for the peer comparison")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n, s = args.num_envs, args.seconds
    rows: dict[str, Any] = {}
    main_run = transport_runs(n, args.workers, s, ["lockstep", "async"])
    rows[f"transport lock-step (W={args.workers})"] = main_run["lockstep"]
    rows[f"transport async B={n // 2} (W={args.workers})"] = main_run["async"]
    shm_run = transport_runs(n, args.workers, s, ["lockstep", "async"], scheme="shm")
    rows[f"transport shm lock-step (W={args.workers})"] = shm_run["lockstep"]
    rows[f"transport shm async B={n // 2} (W={args.workers})"] = shm_run["async"]
    rows["gymnasium AsyncVectorEnv"] = gym_async(n, s)
    rows["SB3 SubprocVecEnv"] = sb3_subproc(n, s)
    skipped = {"EnvPool": "runs only its own C++ envs: it cannot host this Python env"}
    puffer = puffer_async(n, args.workers, s)
    if isinstance(puffer, str):
        skipped["PufferLib"] = puffer
    else:
        rows[f"PufferLib Multiprocessing B={n // 2} (W={args.workers})"] = puffer
    deep = transport_runs(4 * n, args.workers, s, ["lockstep", "async"])
    rows[f"transport lock-step, N={4 * n} (W={args.workers})"] = deep["lockstep"]
    rows[f"transport async B={2 * n}, N={4 * n} (W={args.workers})"] = deep["async"]
    workers: dict[int, Any] = {args.workers: main_run}
    for w in (1, 4, 8):
        if w != args.workers and w <= n:
            workers[w] = transport_runs(n, w, s, ["async", "lockstep"])
    lock = rows[f"transport lock-step (W={args.workers})"]["steps_per_s"]
    asyn = rows[f"transport async B={n // 2} (W={args.workers})"]["steps_per_s"]
    best = max(w["async"]["steps_per_s"] for w in workers.values())
    report = {
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "num_envs": n,
        "seconds_per_spin": s,
        "rows": rows,
        "async_over_lockstep": asyn / lock,
        "shm_async_over_lockstep": shm_run["async"]["steps_per_s"]
        / shm_run["lockstep"]["steps_per_s"],
        "ideal_async_over_lockstep": ideal_ratio(n, args.workers, os.cpu_count() or 1),
        "ideal_async_over_lockstep_deep": ideal_ratio(4 * n, args.workers, os.cpu_count() or 1),
        "async_over_lockstep_deep": deep["async"]["steps_per_s"] / deep["lockstep"]["steps_per_s"],
        "async_over_best_peer": asyn
        / max(r["steps_per_s"] for name, r in rows.items() if not name.startswith("transport")),
        "workers": {
            str(w): {
                "async_steps_per_s": r["async"]["steps_per_s"],
                "lockstep_steps_per_s": r["lockstep"]["steps_per_s"],
                "async_over_best_async": r["async"]["steps_per_s"] / best,
            }
            for w, r in sorted(workers.items())
        },
        "skipped": skipped,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{'run':40} {'steps/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for name, r in rows.items():
        print(f"{name:40} {r['steps_per_s']:10.0f} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f}")
    print(f"async / lock-step: {report['async_over_lockstep']:.2f}x (unix)")
    print(f"async / lock-step: {report['shm_async_over_lockstep']:.2f}x (shm)")
    print(
        f"ideal async / lock-step (idle-free workers, no transport): "
        f"{report['ideal_async_over_lockstep']:.2f}x at N={n}, "
        f"{report['ideal_async_over_lockstep_deep']:.2f}x at N={4 * n}, W={args.workers}"
    )
    print(f"async / best peer: {report['async_over_best_peer']:.2f}x")
    print(f"async / lock-step at N={4 * n}: {report['async_over_lockstep_deep']:.2f}x")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    for w, r in report["workers"].items():
        print(
            f"W={w}: async {r['async_steps_per_s']:.0f}/s lock-step "
            f"{r['lockstep_steps_per_s']:.0f}/s, {r['async_over_best_async']:.2f}x of the best"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
