"""transport-probe --env vector-echo (issue 24 item 3): the reference servers serve one vector
env object (VectorEchoEnv, made with --num-envs N) instead of N EchoEnv objects, so a row
measures the transport without per-env Python; the rows name the env and pass the echo check
(the same bytes as echo). A short real run: Python servers, unix and shm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from transport.envs import VECTOR_ENVS, env_factory
from transport.envs.echo import EchoEnv
from transport.generated import pac_env


def _probe(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transport.tools.probe_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_probe_run_serves_vector_echo_over_a_socket_and_shm(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    done = _probe(
        "--env",
        "vector-echo",
        "--batch",
        "8",
        "--backends",
        "unix,shm",
        "--lang",
        "python",
        "--quick",
        "--no-floor",
        "--no-plot",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    rows = {(r["backend"], r["server"], r["batch"]): r for r in doc["rows"]}
    assert set(rows) == {("unix", "python", 8), ("shm", "python", 8)}
    assert {r["env"] for r in rows.values()} == {"vector-echo"}
    assert all(r["count"] > 0 and r["steps_per_s"] > 0 for r in rows.values())
    assert doc["settings"]["env"] == "vector-echo"
    assert "Vector echo env" in done.stdout


def test_env_is_refused_with_url_and_unknown_names() -> None:
    done = _probe("--url", "unix:///nonexistent.sock", "--env", "vector-echo")
    assert done.returncode == 2 and "--env" in done.stderr
    done = _probe("--env", "nope", "--backends", "unix")
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.parametrize("name", sorted(VECTOR_ENVS))
def test_the_reference_vector_env_is_made_with_num_envs(name: str) -> None:
    """env_factory(name, N) makes one object of N envs that steps the bytes of N EchoEnvs."""
    env = env_factory(name, 3)()
    assert getattr(env, "num_envs", None) == 3
    codec = pac_env.SCHEMA["StepResult"]
    out = codec.zeros(3)
    env.reset_envs(np.arange(3), [None] * 3, out)  # type: ignore[attr-defined]
    actions = np.array([5, 0, 91], dtype=np.int32)
    env.step_envs(actions, None, out)  # type: ignore[attr-defined]
    for i, action in enumerate(actions.tolist()):
        one = EchoEnv()
        row = codec.zeros()
        one.reset_into(None, row)
        one.step_into(action, row)
        assert out[i].tobytes() == row.tobytes()
