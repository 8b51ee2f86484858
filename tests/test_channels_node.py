"""The channels across languages: Python and Node on both ends of rings, the board and run
control (the Node end is node_bridge/dist/channels/probe_cli.js)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from tests.channels_util import (
    board_arrays,
    board_consistent,
    check_probe,
    produce,
    start,
    stop,
    unique,
    watchdog,
)
from transport.channels import ChannelClosedError, PeerDiedError, PolicyBoard, Ring, RunControl
from transport.generated import experience

CLI = Path(__file__).resolve().parents[1] / "node_bridge" / "dist" / "channels" / "probe_cli.js"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not CLI.is_file(),
    reason="node or node_bridge/dist is missing (cd node_bridge && npm run build)",
)


def node(*args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(["node", str(CLI), *map(str, args)], stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def drain(consumer: Any, expected: int) -> np.ndarray:
    """Records until ``expected`` came (producers that start late may find the others closed:
    the consumer then sees an end of stream and looks again)."""
    got: list[np.ndarray] = []
    deadline = time.monotonic() + 60
    while sum(map(len, got)) < expected and time.monotonic() < deadline:
        try:
            batch = consumer.take(64, timeout=30)
        except (ChannelClosedError, PeerDiedError):
            time.sleep(0.05)
            continue
        got.append(batch.copy())
        batch.release()
    return np.concatenate(got)


@pytest.mark.parametrize("record_size", [64, 2557])
def test_node_producers_python_consumer(record_size: int) -> None:
    name = unique("n2p")
    record = experience.Probe64 if record_size == 64 else experience.Probe2557
    with watchdog(90), Ring.create(name, record, 32, multi_producer=True) as ring:
        consumer = ring.consumer()
        procs = [node("produce", name, record_size, p, 2000, 5) for p in range(2)]
        pyproc = start(produce, name, record_size, 7, 2000, 3, 1)
        records = drain(consumer, 6000)
        for proc in procs:
            assert result(proc)["sent"] == 2000
        stop(pyproc)
        assert check_probe(records).all()
        for p in (0, 1, 7):
            assert records["index"][records["producer"] == p].tolist() == list(range(2000))


@pytest.mark.parametrize("policy", ["block", "overwrite"])
def test_python_producers_node_consumer(policy: Literal["block", "overwrite"]) -> None:
    name = unique("p2n")
    with (
        watchdog(90),
        Ring.create(name, experience.Probe64, 16, multi_producer=True, policy=policy) as ring,
    ):  # type: ignore[arg-type]
        consumer = node("consume", name, 64, 6000)
        time.sleep(0.3)
        procs = [start(produce, name, 64, p, 3000, 6, 20 + p) for p in range(2)]
        for proc in procs:
            stop(proc)
        summary = result(consumer)
        assert summary["bad"] == 0 and summary["outOfOrder"] == 0 and summary["end"] == "closed"
        if policy == "block":
            assert summary["records"] == 6000
            assert summary["perProducer"] == {"0": 3000, "1": 3000}
        else:
            assert summary["records"] + ring.overwritten == 6000
            tails = sum(3000 - summary["perProducer"].get(str(p), 0) for p in range(2))
            assert summary["gaps"] + tails == ring.overwritten


def test_sigkill_node_producer_gives_python_consumer_a_typed_error() -> None:
    name = unique("killn")
    with watchdog(60), Ring.create(name, experience.Probe64, 64) as ring:
        consumer = ring.consumer()
        proc = node("produce-forever", name, 64, 3)
        taken = 0
        with pytest.raises(PeerDiedError):
            while True:
                batch = consumer.take(16, timeout=10)
                assert check_probe(batch.copy()).all()
                taken += batch.count
                batch.release()
                if taken > 500 and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.mark.parametrize("mode", ["double_buffer", "seqlock"])
def test_board_python_publishes_node_reads_and_back(
    mode: Literal["double_buffer", "seqlock"],
) -> None:
    name = unique("nboard")
    with watchdog(90), PolicyBoard.create(name, board_arrays(0), mode=mode) as board:
        reader = node("board-read", name, 2)
        deadline = time.monotonic() + 2.5
        version = 0
        while time.monotonic() < deadline:
            version = board.publish(board_arrays(version + 1))
        summary = result(reader)
        assert summary["torn"] == 0 and summary["reads"] > 0
        board.close()
    name = unique("nboard2")
    with PolicyBoard.create(name, board_arrays(0), mode=mode) as board:
        writer = node("board-publish", name, 500)
        out = None
        last = 0
        while writer.poll() is None or last < 500:
            version, out = board.read(out)
            if version:
                assert board_consistent(version, out) and version >= last
                last = version
        assert result(writer)["published"] == 500


def test_run_control_node_members() -> None:
    name = unique("nctl")
    with watchdog(60), RunControl.create(name, stuck_after=1.0) as control:
        waiter = node("member", name, 200, "wait_stop")
        failer = node("member", name, 100, "fail")
        assert result(failer)["then"] == "fail"
        assert control.stopped and control.stop_reason > 0
        assert result(waiter)["then"] == "wait_stop"
        states = {m.name: m for m in control.members()}
        assert states["node-fail"].state == "ERROR" and states["node-fail"].error_code == 9
        assert states["node-wait_stop"].state == "CLOSED"
        assert control.epoch > 0
        assert os.path.exists(control.segment.path)
    assert not any(name in p for p in os.listdir("/dev/shm"))


def owned_by_node(*args: Any) -> tuple[subprocess.Popen[str], str]:
    """A Node process that creates a channel segment; returns it and the segment's path once
    it said ready."""
    proc = subprocess.Popen(
        ["node", str(CLI), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the Node owner exited before it was ready (rc {proc.wait()})"
    return proc, str(json.loads(line)["ready"])


@pytest.mark.parametrize("mode", ["double_buffer", "seqlock"])
def test_board_created_by_node_python_reads_every_version_whole(
    mode: Literal["double_buffer", "seqlock"],
) -> None:
    """A Node learner creates the board (same array table, same fingerprint as Python's) and
    publishes while Python reads: every read is one whole version, versions never go back."""
    name = unique("nown")
    with watchdog(90):
        proc, path = owned_by_node("board-own", name, mode, 3000)
        board = PolicyBoard.open(name, board_arrays(0), timeout=10)
        assert board.mode.name.lower() == mode and os.path.exists(path)
        out, last, reads = None, 0, 0
        while last < 3000:
            version, out = board.read(out)
            if version:
                assert board_consistent(version, out) and version >= last
                last, reads = version, reads + 1
        board.close()
        assert result(proc)["published"] == 3000  # communicate() ends its stdin
    assert reads > 0 and not os.path.exists(path)


def test_run_control_created_by_node_sees_python_members() -> None:
    """A Node learner creates run control; a Python actor joins, beats and fails: the Node side
    wakes on the stop flag and reports the member as ERROR with its code and slot."""
    name = unique("nctlown")
    with watchdog(60):
        proc, path = owned_by_node("control-own", name, 8, 1000)
        control = RunControl.open(name, timeout=10)
        assert control.slots == 8 and control.stuck_after == 1.0
        actor = control.join("py-actor", role=1)
        actor.beat()
        control.advance(5)
        actor.fail(7)
        summary = result(proc)
        control.close()
    assert summary["stopped"] and summary["epoch"] == 5
    assert summary["members"] == [
        {"name": "py-actor", "state": "ERROR", "error_code": 7, "slot": actor.slot}
    ]
    assert summary["stop_reason"] == actor.slot + 1
    assert not os.path.exists(path)
