"""Env-steps/s of real envs (MuJoCo, Atari) through our worker pool vs the usual vector envs.

    python benchmarks/real_env_bench.py                         # both envs, N = 8 and 32
    python benchmarks/real_env_bench.py --envs mujoco --n 8 --seconds 2 --repeats 3

The same env in every column: ``mujoco`` is ``HalfCheetah-v5``; ``atari`` is Pong as trainers
use it (``ALE/Pong-v5`` with frameskip 1 and no sticky actions, then gymnasium's
``AtariPreprocessing``: 30 no-op starts, frame skip 4 with max-pooling, 84x84 grayscale; then
``FrameStackObservation(4)``: observations (4, 84, 84) uint8), EnvPool's ``Pong-v5`` with the
same settings. Columns, at N envs and ``--workers`` P processes:

- ours lock-step: ``transport-serve shm://... --gym ID --num-envs N --workers P`` (a child
  process) and ``transport.gym.RemoteVectorEnv``: one batched ``step`` of N envs;
- ours async: the same server, ``RemoteAsyncVectorEnv(batch_size=N/2)``: ``send`` the envs
  just received, ``recv`` the first N/2 to finish (EnvPool's async loop);
- gymnasium ``AsyncVectorEnv`` and SB3 ``SubprocVecEnv``: one process per env (N processes;
  they have no other mode);
- EnvPool in process: ``envpool.make(..., num_envs=N, num_threads=P)``, lock-step
  (``batch_size=N``) and async (``batch_size=N/2``, ``send``/``recv``);
- EnvPool over shm: the same EnvPool instance (lock-step) served by ``transport.serve`` as one
  ``EnvPoolEnv`` in a child process, stepped here through ``RemoteVectorEnv``: what the
  transport costs a trainer next to EnvPool in its own process (issue 23 item 5: within 1.2x).

Actions are random, drawn before timing. Each cell (an env at one N) opens every column's envs
at once, runs a ``--warmup`` window of each, then ``--repeats`` rounds of one ``--seconds``
window per column (interleaved, so a change in the machine's load hits every column alike);
the median env-steps/s (one step of one env = 1) per column. Prints a markdown table with the
ratios ours / others.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PONG_ID = "TransportBench/Pong84x4-v0"
MODULE = Path(__file__).stem  # gymnasium.make("real_env_bench:ID") imports this module


def make_pong(**kwargs: Any) -> gymnasium.Env[Any, Any]:
    """Pong as trainers use it (see the module doc); EnvPool's Pong-v5 with the same settings."""
    import ale_py

    gymnasium.register_envs(ale_py)
    env = gymnasium.make(
        "ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, full_action_space=False
    )
    env = gymnasium.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False
    )
    return gymnasium.wrappers.FrameStackObservation(env, 4)


if PONG_ID not in gymnasium.registry:
    gymnasium.register(PONG_ID, entry_point=make_pong, max_episode_steps=27_000)

ENVS = {
    # name: (gymnasium id, EnvPool id, EnvPool kwargs)
    "mujoco": ("HalfCheetah-v5", "HalfCheetah-v5", {}),
    "atari": (
        f"{MODULE}:{PONG_ID}",
        "Pong-v5",
        {
            "stack_num": 4,
            "frame_skip": 4,
            "noop_max": 30,
            "img_height": 84,
            "img_width": 84,
            "gray_scale": True,
            "episodic_life": False,
            "reward_clip": False,
            "use_fire_reset": False,
            "repeat_action_probability": 0.0,
        },
    ),
}
COLUMNS = [
    "ours lock-step",
    "ours async",
    "AsyncVectorEnv",
    "SubprocVecEnv",
    "EnvPool",
    "EnvPool async",
    "EnvPool over shm",
]


Step = Callable[[], int]
"""One step of a column: steps some envs, returns how many env steps it made."""


def window(step: Step, seconds: float) -> float:
    """Env-steps/s of ``step`` over one window of ``seconds``."""
    count, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        count += step()
        now = time.perf_counter()
        if now >= end:
            return count / (now - start)


def random_actions(space: gymnasium.Space[Any], n: int, rows: int = 64) -> np.ndarray:
    """``rows`` batches of n random actions, drawn once (no sampling inside the timing)."""
    space.seed(0)
    return np.stack([np.stack([space.sample() for _ in range(n)]) for _ in range(rows)])


def lock_step(envs: Any, actions: np.ndarray, n: int) -> Step:
    """``envs.step`` of N envs (gymnasium, SB3 and EnvPool alike), cycling ``actions``."""
    i = 0

    def step() -> int:
        nonlocal i
        envs.step(actions[i % len(actions)])
        i += 1
        return n

    return step


def send_recv(envs: Any, actions: np.ndarray, first_ids: np.ndarray) -> Step:
    """EnvPool's async loop: ``send`` the envs just received, ``recv`` the next batch."""
    ids, i = first_ids, 0

    def step() -> int:
        nonlocal ids, i
        envs.send(actions[i % len(actions)][: len(ids)], ids)
        i += 1
        ids = envs.recv()[-1]["env_id"]
        return len(ids)

    return step


# -- the columns: each opens its envs and returns (step, close) -----------------------------------


def shm_url(n: int) -> str:
    return f"shm://real-bench-{uuid.uuid4().hex[:8]}?num_envs={n}"


def start_server(command: list[str]) -> tuple[str, subprocess.Popen[str]]:
    """A server child (this directory and the repository on its path) that prints
    ``ready URL`` once clients can connect; returns (URL, process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("ready "):
        stop(proc)
        raise RuntimeError(f"the server did not start ({line!r}): {' '.join(command)}")
    return line.split(" ", 1)[1], proc


def serve(gym_id: str, n: int, workers: int) -> tuple[str, subprocess.Popen[str]]:
    """``transport-serve shm://... --gym ID`` as a child; returns (URL, process)."""
    command = [sys.executable, "-m", "transport.tools.serve_cli", shm_url(n), "--gym", gym_id]
    command += ["--num-envs", str(n), "--seed", "0"]
    if workers:
        command += ["--workers", str(workers)]
    return start_server(command)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


Opened = tuple[Step, Callable[[], None]]


def open_ours(gym_id: str, n: int, workers: int, asynchronous: bool) -> Opened:
    """Our server (a child process, its own for each column) and its gymnasium client."""
    from transport.gym import RemoteAsyncVectorEnv, RemoteVectorEnv

    url, proc = serve(gym_id, n, workers)
    try:
        if not asynchronous:
            envs = RemoteVectorEnv(url, n, timeout=120.0)
            envs.reset(seed=0)
            step = lock_step(envs, random_actions(envs.single_action_space, n), n)
        else:
            aenvs = RemoteAsyncVectorEnv(url, n, batch_size=max(1, n // 2), timeout=120.0)
            aenvs.async_reset(seed=0)
            first = aenvs.recv()[4]["env_id"]
            step = send_recv(aenvs, random_actions(aenvs.single_action_space, n), first)
            envs = aenvs
    except BaseException:
        stop(proc)
        raise

    def close() -> None:
        try:
            if asynchronous:
                aenvs.recv()  # the other half, still in flight
            envs.close()
        finally:
            stop(proc)

    return step, close


def open_gym_async(gym_id: str, n: int) -> Opened:
    envs = gymnasium.vector.AsyncVectorEnv([functools.partial(gymnasium.make, gym_id)] * n)
    envs.reset(seed=0)
    return lock_step(envs, random_actions(envs.single_action_space, n), n), envs.close


def open_subproc(gym_id: str, n: int) -> Opened:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    envs = SubprocVecEnv([functools.partial(gymnasium.make, gym_id)] * n)
    envs.seed(0)
    envs.reset()
    return lock_step(envs, random_actions(envs.action_space, n), n), envs.close


def open_envpool(
    pool_id: str, kwargs: dict[str, Any], n: int, threads: int, asynchronous: bool
) -> Opened:
    import envpool

    batch = max(1, n // 2) if asynchronous else n
    envs = envpool.make(
        pool_id,
        env_type="gymnasium",
        num_envs=n,
        batch_size=batch,
        num_threads=threads,
        seed=0,
        **kwargs,
    )
    actions = random_actions(envs.action_space, n)
    if not asynchronous:
        envs.reset()
        return lock_step(envs, actions, n), envs.close
    envs.async_reset()
    return send_recv(envs, actions, envs.recv()[-1]["env_id"]), envs.close


def serve_envpool(name: str, n: str, threads: str, url: str) -> None:
    """(In the child process of ``open_envpool_shm``: its arguments as given on the command
    line) serve EnvPool's ``name`` env, N envs in one lock-step ``EnvPoolEnv``, until SIGTERM;
    prints ``ready URL``."""
    import envpool

    import transport
    from transport.envs.vector_gym import EnvPoolEnv

    _, pool_id, kwargs = ENVS[name]

    def factory() -> EnvPoolEnv:
        pool = envpool.make(
            pool_id,
            env_type="gymnasium",
            num_envs=int(n),
            num_threads=int(threads),
            seed=0,
            **kwargs,
        )
        return EnvPoolEnv(pool)

    first = [factory()]  # its schema, then the first client's env (not a second idle pool)
    transport.serve(
        lambda: first.pop() if first else factory(),
        url,
        schema=first[0].SCHEMA,
        num_envs=int(n),
        ready=lambda at: print(f"ready {at}", flush=True),
    )


def open_envpool_shm(name: str, n: int, threads: int) -> Opened:
    """EnvPool served over shm by our server (a child process) and stepped through
    ``RemoteVectorEnv`` here."""
    from transport.gym import RemoteVectorEnv

    code = "import sys, real_env_bench as b; b.serve_envpool(*sys.argv[1:])"
    command = [sys.executable, "-c", code, name, str(n), str(threads), shm_url(n)]
    url, proc = start_server(command)
    try:
        envs = RemoteVectorEnv(url, n, timeout=120.0)
        envs.reset(seed=0)
    except BaseException:
        stop(proc)
        raise

    def close() -> None:
        try:
            envs.close()
        finally:
            stop(proc)

    return lock_step(envs, random_actions(envs.single_action_space, n), n), close


# -- the run --------------------------------------------------------------------------------------


def open_column(column: str, name: str, n: int, workers: int) -> Opened:
    gym_id, pool_id, pool_kwargs = ENVS[name]
    if column.startswith("ours"):
        return open_ours(gym_id, n, workers, column == "ours async")
    if column == "AsyncVectorEnv":
        return open_gym_async(gym_id, n)
    if column == "SubprocVecEnv":
        return open_subproc(gym_id, n)
    if column == "EnvPool over shm":
        return open_envpool_shm(name, n, workers)
    return open_envpool(pool_id, pool_kwargs, n, workers, column == "EnvPool async")


def run_cell(name: str, n: int, args: argparse.Namespace, columns: list[str]) -> dict[str, float]:
    """Every column's envs open at once, the timed windows interleaved (round r of every column,
    then round r + 1), so a change of the machine's load hits every column alike: median of
    ``repeats`` windows each, after a ``warmup`` window each."""
    opened: dict[str, Opened] = {}
    try:
        for column in columns:
            opened[column] = open_column(column, name, n, args.workers)
        for column in columns:
            window(opened[column][0], args.warmup)
        rates: dict[str, list[float]] = {column: [] for column in columns}
        for _ in range(args.repeats):
            for column in columns:
                rates[column].append(window(opened[column][0], args.seconds))
        return {column: statistics.median(rates[column]) for column in columns}
    finally:
        for _, close in opened.values():
            close()


def table(results: dict[tuple[str, int], dict[str, float]], columns: list[str]) -> str:
    ratio_of = [c for c in ("AsyncVectorEnv", "SubprocVecEnv", "EnvPool") if c in columns]
    head = ["env", "N", *columns]
    head += [f"lock-step / {c}" for c in ratio_of] + [f"async / {c}" for c in ratio_of]
    served = "EnvPool" in columns and "EnvPool over shm" in columns
    head += ["EnvPool / EnvPool over shm"] if served else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for (name, n), got in results.items():
        cells = [f"{ENVS[name][0].rpartition(':')[2]}", str(n)]
        cells += [f"{got[c]:,.0f}" if c in got else "-" for c in columns]
        for ours in ("ours lock-step", "ours async"):
            for c in ratio_of:
                ok = ours in got and c in got
                cells.append(f"{got[ours] / got[c]:.2f}x" if ok else "-")
        if served:
            cells.append(f"{got['EnvPool'] / got['EnvPool over shm']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    parser.add_argument("--n", type=int, nargs="+", default=[8, 32], help="envs (default 8 32)")
    parser.add_argument(
        "--workers",
        type=int,
        default=min(os.cpu_count() or 1, 8),
        help="our server's worker processes and EnvPool's threads (default: the cores, <= 8)",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="one timed window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows (median)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before timing")
    parser.add_argument("--columns", nargs="+", choices=COLUMNS, default=COLUMNS)
    args = parser.parse_args(argv)
    print(
        f"# {platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"workers={args.workers}, {args.repeats} x {args.seconds:g} s per cell (median), "
        f"env-steps/s",
        flush=True,
    )
    results: dict[tuple[str, int], dict[str, float]] = {}
    for name in args.envs:
        for n in args.n:
            started, load = time.perf_counter(), os.getloadavg()[0]
            results[(name, n)] = run_cell(name, n, args, args.columns)
            cells = ", ".join(f"{c}={v:,.0f}" for c, v in results[(name, n)].items())
            print(
                f"{name} N={n}: {cells} ({time.perf_counter() - started:.0f} s, "
                f"load average {load:.1f} -> {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print()
    print(table(results, args.columns))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
