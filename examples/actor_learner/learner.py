"""Seed 002 in small: N Node actors play Tetris with the latest policy from a board and push
transitions into rings; this PyTorch learner consumes batches, updates, republishes, and stops
everyone with one flag.

  python examples/actor_learner/learner.py [--actors 2] [--seconds 240] [--out DIR]

Channels of the run (all under /dev/shm/transport-*, removed at the end):
  control RUN                 epoch (one tick per env step), stop flag, heartbeats, error flags
  board   RUN-policy          the policy MLP's state_dict (double buffer)
  ring    RUN-actor<k>        one single-producer ring of experience.Transition per actor

The update is a one-step advantage actor-critic on the freshest transitions (the policy is at
most a publish or two behind the actors). Reward: the env's line reward (0/1/3/5/8) plus 0.1
per placed piece and -1 on a top-out: surviving longer is learnable within minutes, lines come
later. Writes learning_curve.csv (per 2,000 env steps: mean pieces and lines per finished
episode) and learning_curve.png into --out (default: this folder, whose committed curve a run
replaces).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transport.channels import ChannelTimeoutError, PolicyBoard, Ring, RunControl  # noqa: E402
from transport.generated import experience  # noqa: E402

ACTOR_JS = ROOT / "node_bridge" / "dist" / "channels" / "tetris_actor.js"
OBS, ACTIONS, HIDDEN = 214, 40, 128


def policy_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(OBS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, ACTIONS))


def value_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(OBS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))


class Curve:
    """Finished-episode statistics per actor, averaged per window of env steps."""

    def __init__(self, actors: int, window: int) -> None:
        self.pieces = np.zeros(actors)
        self.lines = np.zeros(actors)
        self.window = window
        self.finished: list[tuple[float, float]] = []
        self.rows: list[dict[str, float]] = []
        self.steps = 0

    def add(self, records: np.ndarray) -> None:
        for actor, reward, done in zip(
            records["actor"], records["reward"], records["done"], strict=True
        ):
            self.pieces[actor] += 1
            self.lines[actor] += {0: 0, 1: 1, 3: 2, 5: 3, 8: 4}.get(int(reward), 0)
            self.steps += 1
            if done:
                self.finished.append((self.pieces[actor], self.lines[actor]))
                self.pieces[actor] = self.lines[actor] = 0
            if self.steps % self.window == 0 and self.finished:
                f = np.array(self.finished)
                self.rows.append(
                    {
                        "env_steps": self.steps,
                        "episodes": len(f),
                        "pieces_per_episode": float(f[:, 0].mean()),
                        "lines_per_episode": float(f[:, 1].mean()),
                    }
                )
                print(
                    f"steps {self.steps:>8}  episodes {len(f):>4}  pieces/ep "
                    f"{f[:, 0].mean():6.1f}  lines/ep {f[:, 1].mean():5.2f}",
                    flush=True,
                )
                self.finished = []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent),
        help="folder for learning_curve.csv and .png (default: this example's folder, whose "
        "committed curve a run replaces)",
    )
    args = parser.parse_args(argv)
    if not ACTOR_JS.is_file():
        raise SystemExit(f"{ACTOR_JS} is missing: cd node_bridge && npm run build")
    torch.manual_seed(args.seed)
    run = f"al-{os.getpid()}"
    policy, value = policy_net(), value_net()
    optimizer = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=1e-3)
    control = RunControl.create(run, stuck_after=5.0)
    board = PolicyBoard.create(f"{run}-policy", policy.state_dict(), mode="double_buffer")
    board.publish(policy.state_dict())
    rings = [
        Ring.create(f"{run}-actor{k}", experience.Transition, 4096) for k in range(args.actors)
    ]
    consumers = [ring.consumer() for ring in rings]
    actors = [
        subprocess.Popen(["node", str(ACTOR_JS), run, str(k), str(args.seed)])
        for k in range(args.actors)
    ]
    curve = Curve(args.actors, window=2000)
    pending: list[np.ndarray] = []
    updates = 0
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline and not control.stopped:
            for consumer in consumers:
                try:
                    with consumer.take(1024, timeout=0.01) as batch:
                        pending.append(batch.copy())
                except ChannelTimeoutError:
                    pass
            if sum(len(p) for p in pending) < args.batch:
                problems = control.problems()
                if problems:
                    print(f"learner: unhealthy members {problems}", flush=True)
                continue
            records = np.concatenate(pending)
            pending = []
            curve.add(records)
            obs = torch.from_numpy(records["obs"])
            next_obs = torch.from_numpy(records["next_obs"])
            mask = torch.from_numpy(records["mask"].astype(bool))
            action = torch.from_numpy(records["action"].astype(np.int64))
            done = torch.from_numpy(records["done"].astype(np.float32))
            topout = done * (1 - torch.from_numpy(records["truncated"].astype(np.float32)))
            reward = torch.from_numpy(records["reward"]) + 0.1 - topout * 1.1
            with torch.no_grad():
                target = reward + 0.97 * (1 - done) * value(next_obs).squeeze(-1)
            v = value(obs).squeeze(-1)
            logits = policy(obs).masked_fill(~mask, -1e9)
            logp = torch.log_softmax(logits, -1)
            advantage = (target - v).detach()
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-6)
            entropy = -(logp.exp() * logp.masked_fill(~mask, 0)).sum(-1).mean()
            loss = (
                -(logp.gather(1, action[:, None]).squeeze(1) * advantage).mean()
                + 0.5 * (target - v).pow(2).mean()
                - 0.01 * entropy
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            board.publish(policy.state_dict())
            updates += 1
    finally:
        control.stop()
        for proc in actors:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(
            f"learner: {updates} updates, board version {board.version}, epoch {control.epoch}, "
            f"members {[(m.name, m.state) for m in control.members()]}",
            flush=True,
        )
        for consumer in consumers:
            consumer.close()
        for ring in rings:
            ring.close()
        board.close()
        control.close()
    write_curve(curve.rows, Path(args.out))
    return 0


def write_curve(rows: list[dict[str, float]], out: Path) -> None:
    if not rows:
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "learning_curve.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["env_steps"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["pieces_per_episode"] for r in rows], label="pieces per episode")
    ax2 = ax.twinx()
    ax2.plot(
        steps, [r["lines_per_episode"] for r in rows], color="tab:orange", label="lines per episode"
    )
    ax.set_xlabel("env steps (all actors)")
    ax.set_ylabel("pieces per episode")
    ax2.set_ylabel("lines per episode")
    fig.legend(loc="lower right", bbox_to_anchor=(0.88, 0.15))
    ax.set_title("actor-learner over shared-memory channels: Node Tetris actors, PyTorch learner")
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
