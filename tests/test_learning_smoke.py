"""examples/train_gym.py end to end as a user runs it, in seconds (``--smoke``; issue 23 item 4).

PPO on CartPole-v1 served with ``transport-serve --gym`` over shm, and PPO on a MuJoCo env
(InvertedPendulum-v5: Box observations and actions) with two server worker processes, each in
a subprocess: it exits 0, prints its progress and result lines, writes the curve's CSV and PNG
and leaves no shm region behind. Whether it learns is the full run's business (examples/).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .servers import ROOT

SCRIPT = ROOT / "examples" / "train_gym.py"

pytest.importorskip("stable_baselines3")


def run_smoke(tmp_path: Path, *args: str) -> tuple[str, list[dict[str, str]]]:
    name = f"transport-test-learn-{uuid.uuid4().hex[:10]}"
    csv_path, png_path = tmp_path / "curve.csv", tmp_path / "curve.png"
    command = [sys.executable, str(SCRIPT), *args, "--smoke", "--url", f"shm://{name}"]
    command += ["--csv", str(csv_path), "--plot", str(png_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl"}
    try:
        done = subprocess.run(
            command, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env
        )
    finally:
        leftover = Path("/dev/shm") / f"transport-{name}"
        left = leftover.exists()
        leftover.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not left, f"{leftover} left behind"
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert png_path.stat().st_size > 1000
    return done.stdout, rows


def check_output(stdout: str, rows: list[dict[str, str]], env_id: str, workers: int) -> None:
    lines = stdout.splitlines()
    assert any(line.startswith(f"serving {env_id} at shm://") for line in lines), stdout
    progress = [line for line in lines if line.startswith("progress: ")]
    assert len(progress) == 2, stdout  # one per rollout: two rollouts
    assert progress[-1].startswith("progress: 512/512 timesteps (100%)"), progress
    result = next(line for line in lines if line.startswith("result: "))
    assert f"result: {env_id} ppo url=shm://" in result and f"workers={workers}" in result
    assert "episodes=" in result and "reached=False" in result, result  # a smoke does not learn
    assert rows and set(rows[0]) == {"timestep", "env", "episode_reward", "episode_length"}
    assert all(0 < int(row["timestep"]) <= 512 for row in rows)


def test_ppo_on_cartpole_over_shm_smoke(tmp_path: Path) -> None:
    stdout, rows = run_smoke(tmp_path, "CartPole-v1")
    check_output(stdout, rows, "CartPole-v1", 0)


def test_ppo_on_mujoco_with_workers_over_shm_smoke(tmp_path: Path) -> None:
    pytest.importorskip("mujoco")
    stdout, rows = run_smoke(tmp_path, "InvertedPendulum-v5", "--workers", "2")
    check_output(stdout, rows, "InvertedPendulum-v5", 2)
