"""The shm column layout (issue 25 item 2, docs/shm.md "Column layout"): a schema with
``[env] shm = "columns"`` (schema/image_columns.toml) served by a real Python server over shm,
checked step by step against the same env served over unix (row records), plus the layout
arithmetic, the checksum, discovery, size refusals and the CPU torch views."""

from __future__ import annotations

import json
import os
import shlex
import sys
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport
from transport.backends.shm.region import CONTROL_SIZE, ShmLayout, SlotChecksums
from transport.errors import RegionMismatchError, SchemaError
from transport.generated import image_columns, tetris
from transport.schema import compile_schema
from transport.schema.ir import shm_columns
from transport.testing.servers import ServeProcess
from transport.tools.conformance_cli import main

from .columns_trace import legal_actions, mapping_root, same_fields, trace_against_unix

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = str(ROOT / "schema" / "image_columns.toml")
SCHEMA = image_columns.SCHEMA
LAYOUT = ShmLayout.of(SCHEMA)
MAX_BODY = 1 << 22
MODES = ("disabled", "next_step", "same_step")


def _serve(url: str, n: int, *extra: str) -> ServeProcess:
    return ServeProcess(url, SCHEMA_FILE, num_envs=n, max_body=MAX_BODY, extra_args=extra)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[tuple[str, int], str]]:
    """A columns shm server and a unix server (rows) of the contract env, N = 1 and N = 4,
    a 4-env columns server with 2 worker processes, and an 8-env shm server with
    ?checksum=crc32 (the seats: STEP_MULTI)."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    started: dict[tuple[str, int], ServeProcess] = {}
    try:
        for n in (1, 4):
            started["shm", n] = _serve(f"shm://cols-{tag}-{n}?num_envs={n}", n)
            started["unix", n] = _serve(f"unix:///tmp/cols-{tag}-{n}.sock", n)
        started["pool", 4] = _serve(f"shm://cols-{tag}-pool?num_envs=4", 4, "--workers", "2")
        started["crc", 8] = _serve(f"shm://cols-{tag}-crc?num_envs=8&checksum=crc32", 8)
        started["unix", 8] = _serve(f"unix:///tmp/cols-{tag}-8.sock", 8)
        yield {key: server.url for key, server in started.items()}
    finally:
        for server in started.values():
            server.stop()
            assert not server.leftovers()


# -- the layout ------------------------------------------------------------------------------


def test_region_arithmetic_follows_the_spec() -> None:
    """C0(k), every column's start (previous end rounded up to 64) and region_size(k), by hand
    for k = 1; attaching finds k from the size and refuses sizes that fit no k."""
    columns, size = shm_columns(SCHEMA.ir, 1)
    c0 = CONTROL_SIZE + 1344 + 21312
    assert [(c.key, c.start) for c in columns] == [
        ("StepRequest.action", c0),
        ("StepResult.observation", 22784),
        ("StepResult.action_mask", 43968),
        ("StepResult.reward", 44032),
        ("StepResult.terminated", 44096),
        ("StepResult.truncated", 44160),
    ]
    assert size == 44224 == LAYOUT.region_size(1)
    for k in (1, 3, 8, 33):
        assert LAYOUT.slots_in(LAYOUT.region_size(k), 1) == (k, True)
        assert LAYOUT.slots_in(LAYOUT.region_size(k), k) == (k, True)
        assert LAYOUT.slots_in(LAYOUT.region_size(k) + 64, 1) is None
        assert LAYOUT.slots_in(LAYOUT.region_size(k) - 64, 1) is None
    assert LAYOUT.slots_in(LAYOUT.region_size(3), 4) is None  # fewer slots than envs


def test_ir_key_only_for_columns_and_slot_structs() -> None:
    """`layout` is in the IR only for the column layout; the slot has no request / result."""
    assert SCHEMA.ir.to_json()["shm"]["layout"] == "columns"
    assert "layout" not in tetris.SCHEMA.ir.to_json()["shm"]
    slot = SCHEMA.ir.structs["ShmSlot"]
    assert slot.size == 1344
    assert [(f.name, f.offset) for f in slot.fields][-2:] == [("error_text", 64), ("info", 1088)]
    assert SCHEMA.ir.shm is not None and SCHEMA.ir.shm.request_offsets == {}
    assert image_columns.SHM_LAYOUT == "columns"


def test_shm_value_must_be_columns_or_a_profile_name() -> None:
    text = (ROOT / "schema" / "image_columns.toml").read_text()
    with pytest.raises(SchemaError, match='shm must name a layout profile schema or be "columns"'):
        compile_schema(text.replace('shm = "columns"', "shm = 3"))


# -- a real server and client ----------------------------------------------------------------


@pytest.mark.parametrize("n", [4, 1])
@pytest.mark.parametrize("mode", MODES)
def test_lock_step_equals_rows_over_unix(
    servers: dict[tuple[str, int], str], n: int, mode: str
) -> None:
    """reset / step over the column region give the same results as the row records over
    unix, step by step (finals too); the fields are C-contiguous views of the mapping and the
    actions are written into the request column."""
    with (
        transport.connect(servers["shm", n], SCHEMA, autoreset=mode) as shm,
        transport.connect(servers["unix", n], SCHEMA, autoreset=mode) as unix,
    ):
        region = shm.channel.region  # type: ignore[attr-defined]
        a = trace_against_unix(shm, unix, n, mode, turns=14, seed=7)
        for name in a.keys():
            field = a[name]
            column = region.result_columns[name]
            assert field.flags.c_contiguous, name
            assert np.shares_memory(field, column), name
            assert mapping_root(field) is mapping_root(column)
        assert a.observation.shape[-3:] == (3, 84, 84)  # (N, 3, 84, 84); a 1-env reset: none
        records = a.record  # the column layout's fields are no one array: an owned copy
        assert isinstance(records, np.ndarray) and records.dtype == SCHEMA["StepResult"].dtype
        assert not np.shares_memory(records, region.result_columns["observation"])
        for name in a.keys():
            assert np.array_equal(records[name], a[name]), name
        owned = a.copy()
        assert not np.shares_memory(owned.observation, region.result_columns["observation"])
        same_fields(owned, a, "copy")


@pytest.mark.parametrize("server", ["shm", "pool"])
def test_async_send_recv_on_columns(servers: dict[tuple[str, int], str], server: str) -> None:
    """SEND / RECV: the actions go into the request column of the envs sent, RECV's results
    (cut from the columns) equal the unix server's for each env; with the envs in worker
    processes too (each env's rows copied into the columns as it is answered)."""
    with (
        transport.connect(servers[server, 4], SCHEMA) as shm,
        transport.connect(servers["unix", 4], SCHEMA) as unix,
    ):
        for client in (shm, unix):
            client.async_reset(seed=11)
        got: dict[str, dict[int, Any]] = {"shm": {}, "unix": {}}
        for name, client in (("shm", shm), ("unix", unix)):
            first = client.recv(4, copy=True)
            masks = {int(e): first.results.action_mask[k] for k, e in enumerate(first.env_ids)}
            ids = np.array([2, 0], dtype=np.int64)
            actions = np.stack([legal_actions(masks[int(i)], 0)[0] for i in ids]).astype(np.int32)
            client.send(actions, ids)
            received = client.recv(2, copy=True)
            got[name] = {
                int(e): {f: received.results[f][k] for f in received.results.keys()}
                for k, e in enumerate(received.env_ids)
            }
        assert sorted(got["shm"]) == sorted(got["unix"]) == [0, 2]
        for env in (0, 2):
            for field, value in got["shm"][env].items():
                assert np.array_equal(value, got["unix"][env][field]), (env, field)


def test_step_multi_and_checksums(servers: dict[tuple[str, int], str]) -> None:
    """STEP_MULTI on an 8-env (seats) columns server with ?checksum=crc32 equals the unix
    server's; each slot's checksum word is the CRC-32 chained over its result columns."""
    url = servers["crc", 8]
    with (
        transport.connect(url, SCHEMA) as shm,
        transport.connect(servers["unix", 8], SCHEMA) as unix,
    ):
        a, b = shm.reset(seed=3), unix.reset(seed=3)
        same_fields(a, b, "reset")
        actions = legal_actions(a.action_mask, 0)
        same_fields(shm.step_multi(actions), unix.step_multi(actions), "step_multi")
        region = shm.channel.region  # type: ignore[attr-defined]
        words = region.strided("checksum")
        for i in range(8):
            crc = 0
            for name in ("observation", "action_mask", "reward", "terminated", "truncated"):
                crc = zlib.crc32(region.result_columns[name][i].tobytes(), crc)
            assert int(words[i]) == crc
        checks = SlotChecksums(region)
        try:
            assert checks.first_bad(8) == -1
            region.result_columns["reward"][5] += 1.0  # a write after the server published
            assert checks.first_bad(8) == 5
        finally:
            checks.release()


def test_step_multi_seats_of_one_env(tmp_path: Path) -> None:
    """A 1-env server whose env has step_batch: the region has one slot per seat (k = 8 >
    num_envs = 1, found from the size by the client) and STEP_MULTI's results come from the
    seats' column entries, equal to the same env's over unix."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    env = ("--env", "tests.shm_columns_seats_env:SeatsEnv")  # after the launcher's --env
    servers = [
        _serve(f"shm://cols-{tag}-seats?num_envs=1", 1, *env),
        _serve(f"unix:///tmp/cols-{tag}-seats.sock", 1, *env),
    ]
    try:
        with (
            transport.connect(servers[0].url, SCHEMA) as shm,
            transport.connect(servers[1].url, SCHEMA) as unix,
        ):
            assert shm.channel.region.num_slots == 8  # type: ignore[attr-defined]
            a, b = shm.reset(seed=2), unix.reset(seed=2)
            same_fields(a, b, "reset")
            actions = np.zeros(8, dtype=np.int32)  # action 0: never masked, never poison
            a, b = shm.step_multi(actions), unix.step_multi(actions)
            same_fields(a, b, "step_multi of seats")
            assert a.observation.shape == (8, 3, 84, 84) and a.observation.flags.c_contiguous
    finally:
        for server in servers:
            server.stop()
            assert not server.leftovers()


def test_discovery_and_size_refusal(servers: dict[tuple[str, int], str]) -> None:
    """A client with no schema finds the column layout in the region's schema area; a client
    whose URL names another num_envs is refused with the typed error."""
    url = servers["shm", 4]
    with transport.connect(url) as found:
        assert found.schema.fingerprint == SCHEMA.fingerprint
        assert found.schema.ir.shm is not None and found.schema.ir.shm.columns
        view = found.reset(seed=1)
        assert view.observation.flags.c_contiguous
    base = url.partition("?")[0]
    with pytest.raises(RegionMismatchError, match="num_envs"):
        transport.connect(f"{base}?num_envs=3", SCHEMA)


def test_torch_cpu_tensors_are_the_columns(servers: dict[tuple[str, int], str]) -> None:
    """transport.torch on the CPU: each tensor's data_ptr is its column's address (no copy)
    and its values equal the NumPy path's."""
    torch = pytest.importorskip("torch")
    from transport.torch import connect as torch_connect

    with torch_connect(servers["shm", 4], SCHEMA, device="cpu") as client:
        tensors = client.reset(seed=5)
        region = client.client.channel.region  # type: ignore[attr-defined]
        view = client.view
        assert view is not None
        tensors = client.step(torch.from_numpy(legal_actions(view.action_mask, 0)))
        view = client.view
        assert view is not None
        assert client.copied_fields == []
        for name in view.keys():
            column = region.result_columns[name]
            assert tensors[name].data_ptr() == column.__array_interface__["data"][0], name
            assert np.array_equal(tensors[name].numpy(), view[name]), name


def test_torch_cuda_columns_in_one_copy(servers: dict[tuple[str, int], str]) -> None:
    """transport.torch on CUDA: the region is registered and the result columns travel in one
    asynchronous copy straight from it (no staging), each field a view of the device block;
    the values equal the NumPy path's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from transport.torch import _ColumnPlan
    from transport.torch import connect as torch_connect

    with torch_connect(servers["shm", 4], SCHEMA, device="cuda") as client:
        assert "result columns in one copy" in client.path, client.path
        client.reset(seed=5)
        view = client.view
        assert view is not None
        actions = torch.from_numpy(legal_actions(view.action_mask, 0)).to("cuda")
        tensors = client.step(actions)
        view = client.view
        assert view is not None
        plans = list(client._plans.values())
        assert plans and all(isinstance(plan, _ColumnPlan) for plan in plans)
        assert all(len(plan.copies) == 1 for plan in plans)
        assert all(stage is None for plan in plans for _, _, stage, _ in plan.copies)
        for name in view.keys():
            expected = torch.from_numpy(np.ascontiguousarray(view[name]))
            assert torch.equal(tensors[name].cpu(), expected), name


COLUMN_DRIFT_TESTEE = """
import sys
from transport.conformance.testee import Testee, main

class Drift(Testee):
    '''Lays env 1's reward one bit off in the columns area.'''

    def columns(self, schema, slots, requests, results):
        answer = super().columns(schema, slots, requests, results)
        first = min(answer["offsets"].values())
        at = answer["offsets"]["StepResult.reward"] - first + 4 * min(1, slots - 1)
        area = bytearray(answer["area"])
        area[at] ^= 0x01
        answer["area"] = bytes(area)
        return answer

sys.exit(main([SCHEMA_FILE], testee_class=Drift))
"""


def test_conformance_columns_check_names_the_drifting_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner's columns check passes against the Python testee and names the column and
    env of a testee that lays one byte elsewhere (the Node testee is checked the same way)."""

    assert main(["--testee", "python", "--only", "columns", SCHEMA_FILE]) == 0
    assert "k in 1, 3, 8" in capsys.readouterr().out
    script = tmp_path / "column_drift_testee.py"
    script.write_text(COLUMN_DRIFT_TESTEE.replace("SCHEMA_FILE", repr(SCHEMA_FILE)))
    testee = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    assert main(["--testee", testee, "--only", "columns", "--json", SCHEMA_FILE]) == 1
    failures = json.loads(capsys.readouterr().out)["schemas"][0]["failures"]
    assert len(failures) == 3  # k = 1, 3, 8
    assert {f["field"] for f in failures} == {"StepResult.reward"}
    assert any("env 1" in f["summary"] for f in failures)


@pytest.mark.parametrize("direct", [True, False], ids=["writes-columns", "rows-copied"])
def test_vector_env_writes_the_columns(direct: bool) -> None:
    """A vector env that declares ``writes_columns`` is handed the region's columns as its
    ``out`` (the server copies nothing); one without it writes private rows the server copies.
    Both give the same results as the env over unix, in every auto-reset mode."""
    from transport.backends.shm.region import ColumnRecords

    from .shm_columns_vector_env import NUM_ENVS, VectorImages, VectorImagesRows

    factory = VectorImages if direct else VectorImagesRows
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    shm_server = transport.Server(
        factory, f"shm://colsv-{tag}?num_envs={NUM_ENVS}", schema=SCHEMA, num_envs=NUM_ENVS
    ).start()
    unix_server = transport.Server(
        factory, f"unix:///tmp/colsv-{tag}.sock", schema=SCHEMA, num_envs=NUM_ENVS
    ).start()
    try:
        listener: Any = shm_server.listener
        assert isinstance(listener.results, ColumnRecords) is direct
        assert (listener._columns == []) is direct  # no row -> column copy when direct
        for mode in MODES:
            with (
                transport.connect(shm_server.url, SCHEMA, autoreset=mode) as shm,
                transport.connect(unix_server.url, SCHEMA, autoreset=mode) as unix,
            ):
                last = trace_against_unix(shm, unix, NUM_ENVS, mode, turns=9, seed=3)
                region = shm.channel.region  # type: ignore[attr-defined]
                assert np.shares_memory(last.observation, region.result_columns["observation"])
    finally:
        shm_server.close()
        unix_server.close()
