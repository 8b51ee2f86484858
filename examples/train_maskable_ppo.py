"""Train sb3-contrib MaskablePPO on the `pac` env through transport.sb3.RemoteVecEnv.

The same script runs over every backend: only the URL changes.

    python examples/train_maskable_ppo.py --spawn                          # shm://, 8 envs
    python examples/train_maskable_ppo.py --spawn --url unix:///tmp/pac.sock
    python examples/train_maskable_ppo.py --spawn --url zmq+ipc:///tmp/pac
    python examples/train_maskable_ppo.py --spawn --url http://127.0.0.1:0
    transport-serve "shm://pac?num_envs=8" --env pac --seed 0 &           # or a server you run
    python examples/train_maskable_ppo.py --url shm://pac --timesteps 200000 \\
        --csv rewards.csv --plot learning_curve.png

``--spawn`` starts ``transport-serve URL --env pac --num-envs N`` as a child process (its
``ready URL`` line gives the bound address) and stops it at exit, also on Ctrl-C or an error.
``--csv`` writes one row per finished episode (timestep, env, episode reward, length);
``--plot`` draws the episode rewards over timesteps with a rolling mean. While it trains, a
``progress:`` line after a rollout (at most one every ``--progress-every`` seconds) says how far
it got, how fast, and the mean reward of the latest episodes.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_ENVS = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=None,
        help="env server URL (default shm://pac-train-<random> with --spawn, else shm://pac)",
    )
    parser.add_argument("--num-envs", type=int, default=DEFAULT_ENVS, help="envs (default 8)")
    parser.add_argument("--spawn", action="store_true", help="start a transport-serve child")
    parser.add_argument("--workers", type=int, default=0, help="--spawn: server worker processes")
    parser.add_argument("--timesteps", type=int, default=100_000, help="total env steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of the policy and the envs")
    parser.add_argument("--n-steps", type=int, default=256, help="rollout steps per env")
    parser.add_argument("--csv", type=Path, default=None, help="episode rewards (CSV)")
    parser.add_argument("--plot", type=Path, default=None, help="learning curve (PNG)")
    parser.add_argument("--window", type=int, default=100, help="rolling-mean episodes")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument(
        "--progress-every",
        type=float,
        default=10.0,
        help="seconds between progress lines (checked after each rollout; 0: every rollout)",
    )
    return parser.parse_args(argv)


def with_num_envs(url: str, num_envs: int) -> str:
    if url.startswith("shm://") and "num_envs=" not in url:
        return url + ("&" if "?" in url else "?") + f"num_envs={num_envs}"
    return url


def spawn_server(url: str, num_envs: int, seed: int, workers: int) -> tuple[str, Any]:
    """transport-serve as a child process; returns (bound URL, process). Stopped at exit."""
    command = [
        sys.executable,
        "-m",
        "transport.tools.serve_cli",
        with_num_envs(url, num_envs),
        "--env",
        "pac",
        "--num-envs",
        str(num_envs),
        "--seed",
        str(seed),
    ]
    if workers:
        command += ["--workers", str(workers)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    atexit.register(stop)
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    if not selector.select(60):
        stop()
        raise SystemExit(f"transport-serve did not print 'ready' within 60 s: {command}")
    line = proc.stdout.readline().strip()
    if not line.startswith("ready "):
        stop()
        raise SystemExit(f"transport-serve failed to start ({line!r}): {command}")
    return line.split(" ", 1)[1], proc


class EpisodeLog:
    """Sums rewards per env from the VecEnv's step results; one row per finished episode."""

    def __init__(self, num_envs: int, total: int, window: int, every: float) -> None:
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.rows: list[tuple[int, int, float, int]] = []
        self.total = total
        self.window = window
        self.every = every
        self.started = time.perf_counter()
        self.reported: float | None = None

    def report(self, timestep: int) -> None:
        """A progress line after a rollout, at most one per ``every`` seconds."""
        now = time.perf_counter()
        if self.reported is not None and now - self.reported < self.every:
            return
        self.reported = now
        recent = [r[2] for r in self.rows[-self.window :]]
        mean = f"{np.mean(recent):.3f}" if recent else "n/a"
        elapsed = now - self.started
        print(
            f"progress: {timestep}/{self.total} timesteps ({100 * timestep / self.total:.0f}%), "
            f"{len(self.rows)} episodes, mean reward of the last {len(recent)} = {mean}, "
            f"{timestep / elapsed:.0f} steps/s, {elapsed:.0f} s",
            flush=True,
        )

    def update(self, timestep: int, rewards: np.ndarray, dones: np.ndarray) -> None:
        self.returns += rewards
        self.lengths += 1
        for i in np.flatnonzero(dones):
            self.rows.append((timestep, int(i), float(self.returns[i]), int(self.lengths[i])))
            self.returns[i] = 0.0
            self.lengths[i] = 0


def make_callback(log: EpisodeLog) -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class Recorder(BaseCallback):  # type: ignore[misc,unused-ignore]
        def _on_step(self) -> bool:
            log.update(self.num_timesteps, self.locals["rewards"], self.locals["dones"])
            return True

        def _on_rollout_end(self) -> None:
            log.report(self.num_timesteps)

    return Recorder()


def write_csv(path: Path, rows: list[tuple[int, int, float, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["timestep", "env", "episode_reward", "episode_length"])
        writer.writerows(rows)


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    out = np.empty_like(values, dtype=np.float64)
    cumsum = np.cumsum(np.insert(values.astype(np.float64), 0, 0.0))
    for i in range(len(values)):
        lo = max(0, i + 1 - window)
        out[i] = (cumsum[i + 1] - cumsum[lo]) / (i + 1 - lo)
    return out


def plot(path: Path, rows: list[tuple[int, int, float, int]], window: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([r[0] for r in rows])
    rewards = np.array([r[2] for r in rows])
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.scatter(steps, rewards, s=3, alpha=0.25, label="episode reward")
    if len(rows):
        ax.plot(
            steps,
            rolling_mean(rewards, window),
            color="C3",
            lw=2,
            label=f"rolling mean ({window} episodes)",
        )
    ax.set_xlabel("timesteps")
    ax.set_ylabel("episode reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sb3_contrib import MaskablePPO

    from transport.sb3 import RemoteVecEnv

    url = args.url or (f"shm://pac-train-{uuid.uuid4().hex[:8]}" if args.spawn else "shm://pac")
    if args.spawn:
        url, _ = spawn_server(url, args.num_envs, args.seed, args.workers)
    env = RemoteVecEnv(url, args.num_envs, timeout=args.timeout)
    log = EpisodeLog(args.num_envs, args.timesteps, args.window, args.progress_every)
    started = time.perf_counter()
    try:
        env.seed(args.seed)
        model = MaskablePPO(
            "MlpPolicy",
            env,
            n_steps=args.n_steps,
            batch_size=256,
            n_epochs=4,
            learning_rate=3e-4,
            gamma=0.99,
            ent_coef=0.01,
            seed=args.seed,
            device="cpu",
            verbose=0,
        )
        model.learn(total_timesteps=args.timesteps, callback=make_callback(log))
    finally:
        env.close()
    elapsed = time.perf_counter() - started
    rows = log.rows
    rewards = np.array([r[2] for r in rows]) if rows else np.zeros(0)
    k = min(args.window, len(rows) // 4 or 1) if rows else 0
    first = float(rewards[:k].mean()) if rows else float("nan")
    last = float(rewards[-k:].mean()) if rows else float("nan")
    print(
        f"url={url} envs={args.num_envs} timesteps={args.timesteps} episodes={len(rows)} "
        f"time={elapsed:.1f}s steps/s={args.timesteps / elapsed:.0f} "
        f"mean reward first {k} episodes={first:.3f} last {k}={last:.3f}",
        flush=True,
    )
    if args.csv is not None:
        write_csv(args.csv, rows)
    if args.plot is not None:
        scheme = url.partition("://")[0]
        title = f"MaskablePPO on pac over {scheme}:// ({args.num_envs} envs, seed {args.seed})"
        plot(args.plot, rows, args.window, title)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from transport.errors import ConnectError, PeerGoneError, TransportTimeoutError

    try:
        sys.exit(main())
    except (ConnectError, PeerGoneError, TransportTimeoutError) as exc:
        sys.exit(f"train_maskable_ppo.py: {exc}")  # no server, a lost one: one line
