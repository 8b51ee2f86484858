"""The channels' pid leases while one is being taken: a taker that has won the compare-and-swap
but not yet written its start time must still be seen as the live holder. Before the fix, a
third process read the new pid beside the previous holder's start time, judged the holder dead
(pid reuse) and took the lease too: two board publishers (torn weights), two ring consumers.

Each test pauses a real taker in that gap (its ``proc_start_time`` blocks until released), then
a second process tries to take the same lease."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.channels_util import CTX, board_arrays, probe, start, stop, unique, watchdog
from transport import native
from transport.channels import ChannelInUseError, PolicyBoard, Ring

CLI = Path(__file__).resolve().parents[1] / "node_bridge" / "dist" / "channels" / "probe_cli.js"


def _pause_start_time(entered: Any, release: Any) -> None:
    """This process's next ``proc_start_time`` (the lease's) waits until ``release`` is set."""
    real = native.proc_start_time

    def paused(pid: int) -> int:
        native.proc_start_time = real
        entered.set()
        release.wait(30)
        return real(pid)

    native.proc_start_time = paused


def publish_once(name: str) -> None:
    """Child: take the publisher lease, publish version 1, give the lease back."""
    board = PolicyBoard.open(name, timeout=10)
    board.publish(board_arrays(1))
    board.close()


def publish_paused(name: str, entered: Any, release: Any) -> None:
    """Child: publish version 2, paused inside the lease's take."""
    board = PolicyBoard.open(name, timeout=10)
    _pause_start_time(entered, release)
    board.publish(board_arrays(2))
    board.close()


def consume_once(name: str) -> None:
    """Child: attach as the ring's consumer and close (the lease's start time stays behind)."""
    ring = Ring.open(name, probe(64), timeout=10)
    ring.consumer().close()
    ring.close()


def consume_paused(name: str, entered: Any, release: Any) -> None:
    """Child: attach as the consumer, paused inside the lease's take."""
    ring = Ring.open(name, probe(64), timeout=10)
    _pause_start_time(entered, release)
    ring.consumer().close()
    ring.close()


def _paused_taker(target: Any, name: str) -> tuple[Any, Any, Any]:
    entered, release = CTX.Event(), CTX.Event()
    proc = start(target, name, entered, release)
    assert entered.wait(30), "the taker never reached the lease"
    return proc, entered, release


def test_a_board_lease_being_taken_is_held() -> None:
    name = unique("lease-board")
    with watchdog(90):
        board = PolicyBoard.create(name, board_arrays(0))
        try:
            first = start(publish_once, name)
            stop(first)
            assert first.exitcode == 0
            taker, _, release = _paused_taker(publish_paused, name)
            try:
                with pytest.raises(ChannelInUseError, match="lease"):
                    board.publish(board_arrays(3))
            finally:
                release.set()
                stop(taker)
            assert taker.exitcode == 0  # the paused taker kept its lease and published
            version, arrays = board.read()
            assert version == 2 and arrays["tag"].tolist() == [2, 2 ^ 0x5A5A]
        finally:
            board.close()


def test_a_ring_consumer_lease_being_taken_is_held() -> None:
    name = unique("lease-ring")
    with watchdog(90):
        ring = Ring.create(name, probe(64), 8)
        try:
            first = start(consume_once, name)
            stop(first)
            assert first.exitcode == 0
            taker, _, release = _paused_taker(consume_paused, name)
            try:
                with pytest.raises(ChannelInUseError, match="lease"):
                    ring.consumer()
            finally:
                release.set()
                stop(taker)
            assert taker.exitcode == 0
        finally:
            ring.close()


@pytest.mark.skipif(
    shutil.which("node") is None or not CLI.is_file(),
    reason="node or node_bridge/dist is missing (cd node_bridge && npm run build)",
)
def test_node_sees_a_python_lease_being_taken_as_held() -> None:
    """The marker is part of the layout: a Node publisher must not take it either."""
    name = unique("lease-node")
    with watchdog(90):
        board = PolicyBoard.create(name, board_arrays(0))
        try:
            first = start(publish_once, name)
            stop(first)
            taker, _, release = _paused_taker(publish_paused, name)
            try:
                node = subprocess.run(
                    ["node", str(CLI), "board-publish", name, "1"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            finally:
                release.set()
                stop(taker)
            assert node.returncode != 0, node.stdout
            assert "lease is held" in node.stderr, node.stderr
            assert taker.exitcode == 0
            assert board.read()[0] == 2
        finally:
            board.close()
