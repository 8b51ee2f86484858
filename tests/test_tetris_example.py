"""The Tetris example (examples/tetris/): play.py against the real Node server, masks enforced."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

import transport
from transport.errors import RemoteError
from transport.protocol import ErrorCode

from .servers import ROOT, unique_unix_url

PLAY = ROOT / "examples" / "tetris" / "play.py"
SERVER = ROOT / "node_bridge" / "dist" / "examples" / "tetris_server.js"
SCHEMA = ROOT / "schema" / "tetris.toml"
TIMEOUT = 120


@pytest.fixture(autouse=True)
def _node_built() -> None:
    if shutil.which("node") is None or not SERVER.is_file():
        pytest.skip("the Node Tetris server is not built (cd node_bridge && npm run build)")


@pytest.mark.parametrize("policy", ["greedy", "random"])
def test_play_spawns_the_server_and_plays(policy: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(PLAY),
            "--spawn",
            "--games",
            "2",
            "--policy",
            policy,
            "--max-steps",
            "60",
            "--seed",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    games = re.findall(
        r"^game \d+: (\d+) lines, (\d+) pieces \((top-out|truncated)\)$", done.stdout, re.MULTILINE
    )
    assert len(games) == 2, done.stdout
    assert all(0 < int(pieces) <= 60 for _, pieces, _ in games)
    if policy == "greedy":  # the heuristic clears lines and survives 60 pieces
        assert all(end == "truncated" and int(lines) > 0 for lines, _, end in games)
    assert re.search(r"steps/s in client\.step$", done.stdout, re.MULTILINE)


@pytest.fixture
def url() -> Iterator[str]:
    requested = unique_unix_url()
    proc = subprocess.Popen(
        ["node", str(SERVER), requested, "--num-envs", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    try:
        assert line == f"ready {requested}"
        yield requested
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


def test_the_server_refuses_masked_placements(url: str) -> None:
    with transport.connect(url, schema=SCHEMA, timeout=10) as client:
        assert client.server_info["env"] == "tetris"
        assert (client.spaces().obs_n, client.spaces().act_n) == (214, 40)
        result = client.reset(seed=1)
        masked = int(np.flatnonzero(result.action_mask[0] == 0)[0])  # e.g. past the right wall
        legal = int(np.flatnonzero(result.action_mask[1])[0])
        with pytest.raises(RemoteError) as info:
            client.step([masked, legal])
        assert info.value.code == ErrorCode.MASKED_ACTION
        assert info.value.text == f"env 0: action {masked} is masked out"
        with pytest.raises(RemoteError) as out_of_range:
            client.step([40, legal])
        assert out_of_range.value.code == ErrorCode.INVALID_ACTION
        result = client.step([int(np.flatnonzero(result.action_mask[0])[0]), legal])
        assert result.pieces.tolist() == [1, 1]


def test_next_step_auto_reset_over_the_tetris_schema(url: str) -> None:
    with transport.connect(url, schema=SCHEMA, timeout=10, autoreset="next_step") as client:
        result = client.reset(seed=2)
        ended = 0
        for _ in range(400):
            was_done = result.done.copy()
            actions = [int(np.flatnonzero(m)[-1]) if m.any() else 0 for m in result.action_mask]
            result = client.step(actions)
            for i in np.flatnonzero(was_done):
                ended += 1
                assert result.pieces[i] == 0 and result.total_lines[i] == 0  # the reset result
            if ended >= 2:
                break
        assert ended >= 2
