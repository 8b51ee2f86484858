"""transport-probe --url against any running server: N envs, Box / MultiDiscrete / masked
Discrete actions, a Dict observation, the server's own schema (discovered), and the report
names the server's env. Real servers in subprocesses, the probe in another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transport import load_schema
from transport.envs import SCHEMAS
from transport.protocol import body_codec

from .servers import ServerProcess, unique_url
from .test_probe import check_rows, run_probe

ROOT = Path(__file__).resolve().parents[1]


def _sizes(env: str) -> tuple[int, int]:
    """(result, request) bytes per env of a reference env's schema."""
    schema = load_schema(ROOT / "schema" / f"{SCHEMAS[env]}.toml")
    return body_codec(schema, "STEP_RESP").size, body_codec(schema, "STEP_REQ").size


@pytest.mark.parametrize(
    ("env", "lang", "backend", "num_envs"),
    [
        ("reach", "python", "unix", 3),  # Box action f32[2], Dict observation
        ("reach", "node", "shm", 2),
        ("lock", "python", "zmq+ipc", 4),  # MultiDiscrete action u8[3]
        ("pac", "node", "unix", 2),  # Discrete with an action mask, not the echo env
    ],
)
def test_url_probes_any_server_as_it_is(
    env: str, lang: str, backend: str, num_envs: int, tmp_path: Path
) -> None:
    url = unique_url(backend)
    if backend == "shm":
        url += f"?num_envs={num_envs}"
    with ServerProcess(url, env=env, lang=lang, num_envs=num_envs) as server:
        done = run_probe(
            "--url", server.url, "--quick", "--no-floor", "--plot", str(tmp_path / "u.png"),
            "--json", str(tmp_path / "u.json"),
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "u.json").read_text())
    (row,) = doc["rows"]
    check_rows(doc["rows"])
    result_size, request_size = _sizes(env)
    assert (row["backend"], row["server"], row["batch"]) == (backend, lang, num_envs)
    assert row["payload_bytes"] == num_envs * result_size
    assert row["request_bytes"] == num_envs * request_size
    assert row["env"] == env and doc["settings"]["env"] == env
    assert doc["failed"] == [] and row["steps_per_s"] > 0
    # the report names the server's env, not "echo"
    assert f"{env} env" in done.stdout and "echo env" not in done.stdout.lower()
    assert (tmp_path / "u.png").exists() and (tmp_path / "u-bars.png").exists()


def test_a_url_row_is_compared_with_the_raw_floor_of_its_bytes(tmp_path: Path) -> None:
    """With floors: the socket floors of the server's own bytes, raw-unix of its language."""
    with ServerProcess(unique_url("unix"), env="reach", lang="python", num_envs=3) as server:
        done = run_probe("--url", server.url, "--quick", "--no-plot", "--json", "-")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)["rows"]
    (row,) = [r for r in rows if r["env"] is not None]
    result_size, request_size = _sizes("reach")
    raw = [r for r in rows if r["backend"] == "raw-unix"]
    assert [(r["server"], r["batch"], r["payload_bytes"]) for r in raw] == [
        ("python", 3, 3 * result_size)
    ]
    (socket_floor,) = [r for r in rows if r["backend"] == "c-floor-unix"]
    assert socket_floor["payload_bytes"] == 3 * result_size
    assert socket_floor["request_bytes"] == 3 * request_size
    assert row["floor"] == "raw-unix"
    assert row["ratio_to_floor"] == pytest.approx(row["p50_us"] / raw[0]["p50_us"], rel=0.01)
    assert "raw-unix/python" in done.stderr  # the table (stderr with --json -) names it
