"""The shm column layout across languages (issue 25 item 2, docs/shm.md "Column layout"), real
processes: a Python client of a NODE server over a column region, and a NODE client of a PYTHON
server over one, each checked step by step against the same contract env over unix (row
records): lock-step in every auto-reset mode, N = 1 and N = 4, SEND / RECV, ?checksum=crc32
chained over the columns, and column views that are the mapping (no copy) on both sides."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import transport
from transport.generated import image_columns
from transport.testing.servers import ServeProcess

from .columns_trace import legal_actions, mapping_root, same_fields, trace_against_unix

ROOT = Path(__file__).resolve().parents[1]
NODE_DIST = ROOT / "node_bridge" / "dist"
SCHEMA = image_columns.SCHEMA
MAX_BODY = 1 << 22
MODES = ("disabled", "next_step", "same_step")

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_DIST / "cli" / "serve.js").is_file(),
    reason="the Node side is not built (cd node_bridge && npx tsc -p .)",
)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[tuple[str, int], str]]:
    """Column shm servers in Node (``?checksum=crc32``) and in Python, and the unix reference
    (Python, row records), for N = 1 and N = 4 (and an 8-env Node one: STEP_MULTI's 8 seats):
    the same contract env and seed everywhere."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    started: dict[tuple[str, int], ServeProcess] = {}
    try:
        for n in (1, 4):
            started["node", n] = ServeProcess(
                f"shm://ncols-{tag}-{n}?num_envs={n}&checksum=crc32",
                "image_columns",
                lang="node",
                num_envs=n,
                max_body=MAX_BODY,
            )
            started["python", n] = ServeProcess(
                f"shm://pcols-{tag}-{n}?num_envs={n}",
                "image_columns",
                num_envs=n,
                max_body=MAX_BODY,
            )
            started["unix", n] = ServeProcess(
                f"unix:///tmp/ncols-{tag}-{n}.sock", "image_columns", num_envs=n, max_body=MAX_BODY
            )
        started["node", 8] = ServeProcess(
            f"shm://ncols-{tag}-8?num_envs=8&checksum=crc32",
            "image_columns",
            lang="node",
            num_envs=8,
            max_body=MAX_BODY,
        )
        started["unix", 8] = ServeProcess(
            f"unix:///tmp/ncols-{tag}-8.sock", "image_columns", num_envs=8, max_body=MAX_BODY
        )
        yield {key: server.url for key, server in started.items()}
    finally:
        for server in started.values():
            server.stop()
            assert not server.leftovers()


@pytest.mark.parametrize("n", [4, 1])
@pytest.mark.parametrize("mode", MODES)
def test_python_client_of_a_node_column_server(
    servers: dict[tuple[str, int], str], n: int, mode: str
) -> None:
    """A Python client of the Node server: every step equals the unix server's (finals too), the
    checksums (CRC-32 chained over the columns, written by Node) check, the fields are
    C-contiguous views of the mapping and the actions are in the request column."""
    url = servers["node", n]
    with (
        transport.connect(url, SCHEMA, autoreset=mode) as shm,
        transport.connect(servers["unix", n], SCHEMA, autoreset=mode) as unix,
    ):
        region = shm.channel.region  # type: ignore[attr-defined]
        a = trace_against_unix(shm, unix, n, mode, turns=12, seed=5)
        for name in a.keys():
            assert a[name].flags.c_contiguous, name
            assert np.shares_memory(a[name], region.result_columns[name]), name
            assert mapping_root(a[name]) is mapping_root(region.result_columns[name])


def test_python_client_recv_from_a_node_column_server(
    servers: dict[tuple[str, int], str],
) -> None:
    """SEND / RECV against the Node server: the answered envs' results equal the unix server's."""
    got: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for name in ("node", "unix"):
        with transport.connect(servers[name, 4], SCHEMA) as client:
            client.async_reset(seed=11)
            first = client.recv(4, copy=True)
            masks = {int(e): first.results.action_mask[k] for k, e in enumerate(first.env_ids)}
            ids = np.array([3, 1], dtype=np.int64)
            client.send(np.stack([legal_actions(masks[int(i)], 2)[0] for i in ids]), ids)
            received = client.recv(2, copy=True)
            got[name] = {
                int(e): {f: received.results[f][k] for f in received.results.keys()}
                for k, e in enumerate(received.env_ids)
            }
    assert sorted(got["node"]) == sorted(got["unix"]) == [1, 3]
    for env, fields in got["node"].items():
        for field, value in fields.items():
            assert np.array_equal(value, got["unix"][env][field]), (env, field)


def test_python_client_step_multi_on_a_node_column_server(
    servers: dict[tuple[str, int], str],
) -> None:
    """STEP_MULTI (one seat action per slot, in the action column) against the 8-env Node
    server equals the unix server's; each checksum word is CRC-32 chained over the columns."""
    with (
        transport.connect(servers["node", 8], SCHEMA) as shm,
        transport.connect(servers["unix", 8], SCHEMA) as unix,
    ):
        a, b = shm.reset(seed=3), unix.reset(seed=3)
        same_fields(a, b, "reset")
        actions = legal_actions(a.action_mask, 1)
        same_fields(shm.step_multi(actions), unix.step_multi(actions), "step_multi")
        region = shm.channel.region  # type: ignore[attr-defined]
        assert np.array_equal(region.request_columns["action"][:8], actions)
        words = region.strided("checksum")
        for i in range(8):
            crc = 0
            for name in ("observation", "action_mask", "reward", "terminated", "truncated"):
                crc = zlib.crc32(region.result_columns[name][i].tobytes(), crc)
            assert int(words[i]) == crc, i


NODE_CLIENT = Path(__file__).with_name("node_shm_columns_client.js")


@pytest.mark.parametrize("n", [4, 1])
def test_node_client_of_a_python_column_server(servers: dict[tuple[str, int], str], n: int) -> None:
    """A Node client of the Python server over a column region: the same results and finals as
    the unix server's in every mode (SEND / RECV for N = 4); its views and column arrays are the
    mapping."""
    done = subprocess.run(
        [
            "node",
            str(NODE_CLIENT),
            str(NODE_DIST),
            servers["python", n],
            servers["unix", n],
            str(n),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    out = json.loads(lines[-1])
    assert "error" not in out, out.get("error")
    assert out["steps"] == 36 and out["finals"] > 0 and out["resets"] > 0
    assert out["zeroCopy"] is True
    assert out.get("recv", False) is (n > 1)
