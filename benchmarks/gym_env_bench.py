"""Gymnasium envs served one object per env: the runtime's cost next to gymnasium's own
``SyncVectorEnv`` (us per env per step; one run, medians of ``--repeat`` rounds).

    .venv/bin/python benchmarks/gym_env_bench.py [--envs CartPole-v1,Pendulum-v1] [--n 64]
        [--steps 300] [--repeat 5] [--served] [--tree LABEL=DIR ...]

Rows per env id, N envs made with ``gymnasium.make(id)``, random actions (one batch, seeded):

  sync        ``SyncVectorEnv.step`` in this process (gymnasium's own vector loop)
  runtime     one batched STEP request answered by the server's ``Session`` in this process
              (``GymEnv`` per env, next_step auto-reset): the env plus everything the server
              does, no transport
  served      ``RemoteVectorEnv.step`` over shm against ``transport-serve --gym ID`` in a
              process of its own (``--served``): the env, the runtime and the transport

``--tree LABEL=DIR`` (repeatable) runs the rows under each tree (DIR holds a ``transport``
package: a checkout before a change) in a process of its own, alternating, and prints one
column per tree. The machine is shared: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENVS = "CartPole-v1,Acrobot-v1,MountainCarContinuous-v0,Pendulum-v1,FrozenLake-v1"


def _per_env(step: Any, actions: Any, n: int, steps: int) -> float:
    for _ in range(min(50, steps)):
        step(actions)
    start = time.perf_counter()
    for _ in range(steps):
        step(actions)
    return (time.perf_counter() - start) / steps / n * 1e6


def measure(env_id: str, n: int, steps: int, served: bool) -> dict[str, float]:
    """One round of every row for ``env_id`` (us per env per step)."""
    import gymnasium
    import numpy as np
    from gymnasium.vector import SyncVectorEnv

    from transport.gym_serve import gym_factory, gym_schema
    from transport.protocol import body_codec
    from transport.runtime.host import EnvHost
    from transport.runtime.session import Session

    local = SyncVectorEnv([lambda: gymnasium.make(env_id)] * n)
    local.reset(seed=0)
    local.action_space.seed(0)
    actions = local.action_space.sample()
    rows = {"sync": _per_env(local.step, actions, n, steps)}
    local.close()

    schema = gym_schema(env_id)
    session = Session(EnvHost(schema, gym_factory(env_id), num_envs=n))
    session.hello_done = True
    session.runtime.set_autoreset(1)  # next_step, as SyncVectorEnv
    session.runtime.reset()
    request = body_codec(schema, "STEP_REQ").zeros(n)
    request["action"] = np.asarray(actions).reshape(request["action"].shape)
    body = memoryview(request.view(np.uint8).reshape(-1))
    answer = session.handle(session.ids.STEP_BATCH_REQ, body)
    if answer[0] != session.ids.STEP_BATCH_RESP:
        raise SystemExit(f"{env_id}: the runtime refused the step: {bytes(answer[1])!r}")
    rows["runtime"] = _per_env(
        lambda b: session.handle(session.ids.STEP_BATCH_REQ, b), body, n, steps
    )
    session.close()

    if served:
        rows["served"] = _served(env_id, n, steps, actions)
    return rows


def _served(env_id: str, n: int, steps: int, actions: Any) -> float:
    """``RemoteVectorEnv`` over shm against ``transport-serve --gym`` of the same tree."""
    import uuid

    import transport
    from transport.gym import RemoteVectorEnv

    tree = Path(transport.__file__).resolve().parents[1]  # the server runs the same code
    url = f"shm://gym-bench-{uuid.uuid4().hex[:8]}?num_envs={n}"
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--gym", env_id]
    server = subprocess.Popen(
        [*command, "--num-envs", str(n)], cwd=tree, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        if not line.startswith("ready "):
            raise SystemExit(f"{env_id}: the server did not start ({line!r})")
        remote = RemoteVectorEnv(line.split(" ", 1)[1], timeout=60)
        try:
            remote.reset(seed=0)
            return _per_env(remote.step, actions, n, steps)
        finally:
            remote.close()
    finally:
        server.terminate()
        server.wait(30)


def run_tree(directory: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """This script's rows under the ``transport`` package of ``directory`` (a subprocess)."""
    command = [sys.executable, __file__, "--json", "--repeat", "1", "--envs", args.envs]
    command += ["--n", str(args.n), "--steps", str(args.steps)]
    command += ["--served"] if args.served else []
    env = {**os.environ, "PYTHONPATH": directory}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default=DEFAULT_ENVS, help="comma-separated gymnasium ids")
    parser.add_argument("--n", type=int, default=64, help="envs per batch (default 64)")
    parser.add_argument("--steps", type=int, default=300, help="batched steps per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (medians are printed)")
    parser.add_argument("--served", action="store_true", help="add the served row (over shm)")
    parser.add_argument("--json", action="store_true", help="one JSON line of the medians")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR")
    args = parser.parse_args()
    ids = [e for e in args.envs.split(",") if e]

    if args.tree:
        trees = [tuple(t.split("=", 1)) for t in args.tree]
        runs: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label, _ in trees}
        for _ in range(args.repeat):
            for label, directory in trees:
                runs[label].append(run_tree(directory, args))
        labels = [label for label, _ in trees]
        print(f"us per env per step, N = {args.n}, medians of {args.repeat} alternating rounds")
        print(f"{'env':28s} {'row':8s} " + " ".join(f"{label:>12s}" for label in labels))
        for env_id in ids:
            for row in runs[labels[0]][0][env_id]:
                cells = [statistics.median(r[env_id][row] for r in runs[lab]) for lab in labels]
                print(f"{env_id:28s} {row:8s} " + " ".join(f"{c:12.2f}" for c in cells))
        return 0

    rounds = {
        env_id: [measure(env_id, args.n, args.steps, args.served) for _ in range(args.repeat)]
        for env_id in ids
    }
    medians = {
        env_id: {row: statistics.median(r[row] for r in got) for row in got[0]}
        for env_id, got in rounds.items()
    }
    if args.json:
        print(json.dumps(medians))
        return 0
    print(f"us per env per step, N = {args.n}, medians of {args.repeat} rounds of {args.steps}")
    print(
        f"{'env':28s} {'sync':>8s} {'runtime':>8s} {'x sync':>7s}"
        + (f" {'served':>8s} {'x sync':>7s}" if args.served else "")
    )
    for env_id, row in medians.items():
        line = f"{env_id:28s} {row['sync']:8.2f} {row['runtime']:8.2f} "
        line += f"{row['runtime'] / row['sync']:6.2f}x"
        if args.served:
            line += f" {row['served']:8.2f} {row['served'] / row['sync']:6.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
