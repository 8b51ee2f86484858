"""Train SB3 PPO or SAC on a gymnasium env served by id over shm: no schema, no env code.

The server is ``transport-serve URL --gym ENV_ID`` (a child process, the default) or
``transport.gym_serve.gym_server(ENV_ID, url, ...)`` in this process (``--server library``);
either derives the schema from the env's spaces, and the trainer discovers it: SB3 sees a
``transport.sb3.RemoteVecEnv`` with the env's exact spaces. ``--workers K`` steps the envs in K
worker processes of the server.

    python examples/train_gym.py CartPole-v1                           # PPO, 8 envs, shm://
    python examples/train_gym.py InvertedPendulum-v5 --workers 2       # MuJoCo, 2 env processes
    python examples/train_gym.py InvertedPendulum-v5 --algo sac --workers 2
    python examples/train_gym.py CartPole-v1 --server library          # serve_gym in-process
    python examples/train_gym.py CartPole-v1 --smoke                   # seconds: CI's run

Each env id has tuned hyperparameters (``PRESETS``, after rl-baselines3-zoo); another id gets
SB3's defaults. While it trains, a ``progress:`` line (at most one every ``--progress-every``
seconds) gives the timesteps, speed and the mean return of the last ``--window`` episodes; at
the end one ``result:`` line says whether the env's target (CartPole-v1: 475, the "solved"
score; InvertedPendulum-v5: 950) was reached. ``--csv`` writes one row per finished episode,
``--plot`` the learning curve (episode returns and their rolling mean).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

# the episode log, CSV and plot of the MaskablePPO example (one copy of each)
from train_maskable_ppo import EpisodeLog, make_callback, plot, write_csv  # noqa: E402

PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    # rl-baselines3-zoo's CartPole-v1 PPO (solves in ~100k steps)
    ("CartPole-v1", "ppo"): {
        "timesteps": 100_000,
        "num_envs": 8,
        "kwargs": {
            "n_steps": 32,
            "batch_size": 256,
            "gae_lambda": 0.8,
            "gamma": 0.98,
            "n_epochs": 20,
            "ent_coef": 0.0,
            "learning_rate": "lin_0.001",
            "clip_range": "lin_0.2",
        },
    },
    ("InvertedPendulum-v5", "ppo"): {
        "timesteps": 60_000,
        "num_envs": 8,
        "kwargs": {
            "n_steps": 256,
            "batch_size": 256,
            "gae_lambda": 0.9,
            "gamma": 0.99,
            "n_epochs": 10,
            "learning_rate": "lin_0.001",
            "clip_range": 0.2,
        },
    },
    ("InvertedPendulum-v5", "sac"): {
        "timesteps": 12_000,
        "num_envs": 4,
        "kwargs": {"learning_starts": 1_000, "batch_size": 256, "gradient_steps": 2},
    },
    ("HalfCheetah-v5", "sac"): {
        "timesteps": 60_000,
        "num_envs": 4,
        "kwargs": {"learning_starts": 5_000, "batch_size": 256, "gradient_steps": 2},
    },
}
TARGETS = {"CartPole-v1": 475.0, "InvertedPendulum-v5": 950.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env_id", nargs="?", default="CartPole-v1", help="gymnasium env id")
    parser.add_argument("--algo", choices=["ppo", "sac"], default="ppo")
    parser.add_argument("--url", default=None, help="default shm://gym-train-<random>")
    parser.add_argument("--server", choices=["cli", "library"], default="cli")
    parser.add_argument("--num-envs", type=int, default=None, help="default: the preset's")
    parser.add_argument("--workers", type=int, default=0, help="server worker processes")
    parser.add_argument("--timesteps", type=int, default=None, help="default: the preset's")
    parser.add_argument("--seed", type=int, default=0, help="seed of the policy and the envs")
    parser.add_argument("--csv", type=Path, default=None, help="episode returns (CSV)")
    parser.add_argument("--plot", type=Path, default=None, help="learning curve (PNG)")
    parser.add_argument("--window", type=int, default=20, help="episodes of the rolling mean")
    parser.add_argument("--progress-every", type=float, default=10.0, help="seconds")
    parser.add_argument(
        "--smoke", action="store_true", help="a few rollouts (CI): runs end to end, learns little"
    )
    args = parser.parse_args(argv)
    preset = PRESETS.get((args.env_id, args.algo), {"timesteps": 50_000, "num_envs": 4})
    args.kwargs = dict(preset.get("kwargs", {}))
    args.num_envs = args.num_envs or preset["num_envs"]
    args.timesteps = args.timesteps or preset["timesteps"]
    if args.smoke:
        args.num_envs = min(args.num_envs, 4)
        if args.algo == "ppo":
            args.kwargs.update(n_steps=64, batch_size=64, n_epochs=1)
            args.timesteps = 2 * 64 * args.num_envs
        else:
            args.kwargs.update(learning_starts=100, gradient_steps=1, batch_size=64)
            args.timesteps = 400
        args.progress_every = 0.0
    return args


def schedule(value: Any) -> Any:
    """``"lin_X"``: X decayed linearly to 0 over training (rl-zoo's notation)."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress: progress * start
    return value


def spawn_cli_server(args: argparse.Namespace, url: str) -> tuple[str, subprocess.Popen[str]]:
    """``transport-serve URL --gym ENV_ID`` as a child; returns (bound URL, process)."""
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--gym", args.env_id]
    command += ["--num-envs", str(args.num_envs), "--seed", str(args.seed)]
    if args.workers:
        command += ["--workers", str(args.workers)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # "ready URL" (EOF if it failed: stderr says why)
    if not line.startswith("ready "):
        stop_child(proc)
        raise SystemExit(f"transport-serve did not start ({line!r}): {' '.join(command)}")
    return line.split(" ", 1)[1], proc


def stop_child(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)


def make_model(args: argparse.Namespace, env: Any) -> Any:
    kwargs = {name: schedule(value) for name, value in args.kwargs.items()}
    if args.algo == "ppo":
        from stable_baselines3 import PPO

        return PPO("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **kwargs)
    from stable_baselines3 import SAC

    return SAC("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **kwargs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from transport.gym_serve import gym_server
    from transport.sb3 import RemoteVecEnv

    torch.set_num_threads(1)
    url = args.url or f"shm://gym-train-{uuid.uuid4().hex[:8]}"
    if url.startswith("shm://") and "num_envs=" not in url:
        url += ("&" if "?" in url else "?") + f"num_envs={args.num_envs}"
    started = time.perf_counter()
    child = server = None
    if args.server == "cli":
        url, child = spawn_cli_server(args, url)
    else:
        server = gym_server(
            args.env_id, url, num_envs=args.num_envs, workers=args.workers, seed=args.seed
        ).start()
        url = server.bound_url
    print(
        f"serving {args.env_id} at {url} ({args.server}, {args.num_envs} envs, "
        f"{args.workers} workers) in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    log = EpisodeLog(args.num_envs, args.timesteps, args.window, args.progress_every)
    try:
        env = RemoteVecEnv(url, args.num_envs, timeout=60.0)
        try:
            env.seed(args.seed)
            model = make_model(args, env)
            log.started = time.perf_counter()
            model.learn(total_timesteps=args.timesteps, callback=make_callback(log))
        finally:
            env.close()
    finally:
        if child is not None:
            stop_child(child)
        if server is not None:
            server.close()
    elapsed = time.perf_counter() - log.started
    returns = np.array([row[2] for row in log.rows])
    last = returns[-args.window :]
    mean_last = float(last.mean()) if len(last) else float("nan")
    target = TARGETS.get(args.env_id)
    verdict = "" if target is None else f" target={target:g} reached={mean_last >= target}"
    print(
        f"result: {args.env_id} {args.algo} url={url} envs={args.num_envs} "
        f"workers={args.workers} timesteps={args.timesteps} episodes={len(returns)} "
        f"time={elapsed:.1f}s steps/s={args.timesteps / elapsed:.0f} "
        f"first {len(returns[: args.window])} episodes mean={returns[: args.window].mean():.1f} "
        f"last {len(last)} mean={mean_last:.1f}{verdict}",
        flush=True,
    )
    if args.csv is not None:
        write_csv(args.csv, log.rows)
    if args.plot is not None:
        title = (
            f"SB3 {args.algo.upper()} on {args.env_id} over shm:// "
            f"({args.num_envs} envs, {args.workers} workers, seed {args.seed})"
        )
        plot(args.plot, log.rows, args.window, title)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
