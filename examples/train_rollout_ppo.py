"""Masked PPO in plain torch on the batched rollout collector (``transport.rollout``).

Observations reach the policy's device through ``transport.torch`` (CPU: views of the shm slots;
CUDA: the registered region, one block copy per step) and stay there: the rollout buffer, the
masks, GAE and the updates all live on that device. Only the actions go back to the host.

    python examples/train_rollout_ppo.py --env pac --timesteps 30000          # Python pac server
    python examples/train_rollout_ppo.py --env tetris --timesteps 30000       # Node Tetris server
    python examples/train_rollout_ppo.py --url shm://pac --env pac            # a server you run

It starts the server as a child process (``transport-serve URL --env pac`` or
``node examples/tetris/serve.js URL``; shm:// by default) unless ``--url`` is given, prints a
``progress:`` line per update (env steps, steps/s, mean return and length of the latest
episodes) and a summary comparing the first and last episodes' mean return
(a quarter of the episodes each, at most 100).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transport.torch as tt  # noqa: E402
from transport.rollout import RolloutBuffer, RolloutCollector  # noqa: E402

SCHEMAS = {"pac": None, "tetris": str(ROOT / "schema" / "tetris.toml")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=sorted(SCHEMAS), default="pac")
    parser.add_argument("--url", default=None, help="a running server (default: spawn one)")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64, help="rollout steps per env")
    parser.add_argument("--timesteps", type=int, default=30_000, help="total env steps")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def spawn(env: str, num_envs: int, seed: int) -> tuple[str, subprocess.Popen[str]]:
    """A server child on a fresh shm:// name; its ``ready URL`` line gives the URL."""
    url = f"shm://ppo-{env}-{uuid.uuid4().hex[:8]}"
    if env == "tetris":
        command = ["node", str(ROOT / "examples" / "tetris" / "serve.js"), url]
        command += ["--num-envs", str(num_envs), "--seed", str(seed), "--max-steps", "500"]
    else:
        command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", env]
        command += ["--num-envs", str(num_envs), "--seed", str(seed)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("ready "):
        proc.kill()
        raise SystemExit(f"the server did not start ({line!r}): {' '.join(command)}")
    return line.split(" ", 1)[1], proc


class ActorCritic(nn.Module):  # type: ignore[misc]
    def __init__(self, obs: int, actions: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
        self.logits = nn.Linear(256, actions)
        self.value = nn.Linear(256, 1)

    def forward(self, obs: Any, mask: Any) -> tuple[Any, Any]:
        hidden = self.body(obs.float())
        logits = self.logits(hidden).masked_fill(~mask, -1e8)
        return logits, self.value(hidden).squeeze(-1)

    def act(self, obs: Any, mask: Any) -> tuple[Any, dict[str, Any]]:
        """The collector's policy: sampled actions, their log-probabilities and the values."""
        logits, value = self(obs, mask)
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        actions = dist.sample()
        return actions, {"logprob": dist.log_prob(actions), "value": value}


def advantages(model: ActorCritic, buf: RolloutBuffer, gamma: float, lam: float) -> Any:
    """GAE on the device; a truncated episode bootstraps from its final observation."""
    rewards = buf.rewards.clone()
    with torch.no_grad():
        for t, i, final in buf.finals:
            if buf.truncated[t, i]:
                obs = final.observation.unsqueeze(0)
                mask = (final.action_mask != 0).unsqueeze(0)
                rewards[t, i] += gamma * model(obs, mask)[1][0]
        next_value = model(buf.next_observations, buf.next_masks)[1]
    values = buf.extras["value"]
    out = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(buf.steps)):
        following = next_value if t == buf.steps - 1 else values[t + 1]
        alive = (~buf.dones[t]).float()
        delta = rewards[t] + gamma * following * alive - values[t]
        last = delta + gamma * lam * alive * last
        out[t] = last
    return out


def update(model: ActorCritic, optim: Any, buf: RolloutBuffer, adv: Any) -> float:
    """Four epochs of clipped PPO over four minibatches; the last loss."""
    obs = buf.observations.flatten(0, 1)
    masks = buf.masks.flatten(0, 1)
    actions = buf.actions.flatten(0, 1)
    old_logprob = buf.extras["logprob"].flatten(0, 1)
    returns = (adv + buf.extras["value"]).flatten(0, 1)
    adv = adv.flatten(0, 1)
    size = obs.shape[0]
    loss = torch.zeros(())
    for _ in range(4):
        order = torch.randperm(size, device=obs.device)
        for chunk in order.chunk(4):
            logits, value = model(obs[chunk], masks[chunk])
            dist = torch.distributions.Categorical(logits=logits, validate_args=False)
            ratio = (dist.log_prob(actions[chunk]) - old_logprob[chunk]).exp()
            a = adv[chunk]
            a = (a - a.mean()) / (a.std() + 1e-8)
            policy_loss = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
            value_loss = (value - returns[chunk]).pow(2).mean()
            loss = policy_loss + 0.5 * value_loss - 0.01 * dist.entropy().mean()
            optim.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optim.step()
    return float(loss.item())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    proc = None
    url = args.url
    if url is None:
        url, proc = spawn(args.env, args.num_envs, args.seed)
    try:
        with tt.connect(url, SCHEMAS[args.env], device=args.device, autoreset="same_step") as env:
            print(f"connected: {env!r}", flush=True)
            result = env.reset(args.seed)
            model = ActorCritic(result.observation.shape[-1], result.action_mask.shape[-1])
            model.to(env.device)
            optim = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-5)
            collector = RolloutCollector(env, model.act, args.steps, seed=args.seed)
            every: list[float] = []  # each finished episode's return, in order
            recent: deque[tuple[float, int]] = deque(maxlen=100)
            start = time.perf_counter()
            while collector.total_steps < args.timesteps:
                buf = collector.collect()
                episodes = list(zip(buf.episode_returns, buf.episode_lengths, strict=True))
                recent.extend(episodes)
                every += [r for r, _ in episodes]
                loss = update(model, optim, buf, advantages(model, buf, 0.99, 0.95))
                rate = collector.total_steps / (time.perf_counter() - start)
                mean = np.mean([r for r, _ in recent]) if recent else float("nan")
                length = np.mean([n for _, n in recent]) if recent else float("nan")
                print(
                    f"progress: steps={collector.total_steps} steps/s={rate:.0f} "
                    f"episodes={len(recent)} mean_return={mean:.3f} mean_length={length:.1f} "
                    f"loss={loss:.3f}",
                    flush=True,
                )
            k = max(1, min(100, len(every) // 4))  # the first and last quarter, at most 100
            print(
                f"done: env={args.env} device={env.device} steps={collector.total_steps} "
                f"episodes={len(every)} time={time.perf_counter() - start:.1f}s mean return "
                f"first {k} episodes={np.mean(every[:k]) if every else float('nan'):.3f} "
                f"last {k}={np.mean(every[-k:]) if every else float('nan'):.3f}",
                flush=True,
            )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from transport.errors import ConnectError, PeerGoneError, TransportTimeoutError

    try:
        raise SystemExit(main())
    except (ConnectError, PeerGoneError, TransportTimeoutError) as exc:
        raise SystemExit(f"train_rollout_ppo.py: {exc}") from None  # no server: one line
