"""examples/train_maskable_ppo.py as a real process: a short MaskablePPO run over unix and shm."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from .servers import ROOT

SCRIPT = ROOT / "examples" / "train_maskable_ppo.py"

pytest.importorskip("sb3_contrib")


def url_for(scheme: str) -> str:
    name = f"transport-test-train-{uuid.uuid4().hex[:10]}"
    if scheme == "unix":
        return f"unix://{tempfile.gettempdir()}/{name}.sock"
    return f"shm://{name}"


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_training_smoke_run_exits_0(scheme: str, tmp_path: Path) -> None:
    csv_path, png_path = tmp_path / "rewards.csv", tmp_path / "curve.png"
    command = [
        sys.executable,
        str(SCRIPT),
        "--spawn",
        "--url",
        url_for(scheme),
        "--timesteps",
        "2048",
        "--n-steps",
        "128",
        "--csv",
        str(csv_path),
        "--plot",
        str(png_path),
        "--progress-every",
        "0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "episodes=" in done.stdout and f"url={scheme}://" in done.stdout
    progress = [line for line in done.stdout.splitlines() if line.startswith("progress: ")]
    assert len(progress) == 2, done.stdout  # one line per rollout of 8 envs x 128 steps
    assert progress[0].startswith("progress: 1024/2048 timesteps (50%), ")
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows and set(rows[0]) == {"timestep", "env", "episode_reward", "episode_length"}
    assert png_path.stat().st_size > 1000
