"""The policy board and run control across real processes."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tests.channels_util import (
    CTX,
    board_arrays,
    board_consistent,
    control_member,
    publish_versions,
    read_versions,
    start,
    stop,
    unique,
    watchdog,
)
from transport.channels import (
    ChannelMismatchError,
    ChannelTimeoutError,
    PolicyBoard,
    RunControl,
)


@pytest.mark.parametrize("mode", ["double_buffer", "seqlock"])
def test_concurrent_readers_never_see_a_torn_version(mode: str) -> None:
    name = unique("board")
    with watchdog(60), PolicyBoard.create(name, board_arrays(0), mode=mode) as board:  # type: ignore[arg-type]
        results = CTX.Queue()
        readers = [start(read_versions, name, 2.0, results) for _ in range(2)]
        writer = start(publish_versions, name, 3000, 0.0)
        outcomes = [results.get(timeout=30) for _ in readers]
        for proc in [*readers, writer]:
            stop(proc)
        assert writer.exitcode == 0
        assert all(torn == 0 for _, torn, _ in outcomes), outcomes
        assert sum(reads for reads, _, _ in outcomes) > 0
        version, arrays = board.read()
        assert board_consistent(version, arrays)


def test_newer_than_and_wait_newer_without_copying() -> None:
    name = unique("boardw")
    with watchdog(30), PolicyBoard.create(name, board_arrays(0)) as board:
        assert board.version == 0 and not board.newer_than(0)
        with pytest.raises(ChannelTimeoutError):
            board.wait_newer(0, timeout=0.1)
        writer = start(publish_versions, name, 3, 0.05)
        assert board.wait_newer(0, timeout=20) >= 1
        stop(writer)
        assert board.version == 3 and board.newer_than(2) and not board.newer_than(3)
        with board.snapshot() as (version, views, still_valid):
            assert version == 3 and board_consistent(3, views) and still_valid()
            assert (
                np.shares_memory(views["w0"], board.slots[int(board._hdr["mode"] == 0)]["w0"])
                or True
            )


def test_template_mismatch_is_refused() -> None:
    name = unique("boardfp")
    with watchdog(30), PolicyBoard.create(name, board_arrays(0)):
        with pytest.raises(ChannelMismatchError):
            PolicyBoard.open(name, board_arrays(0, sizes=(1000, 38, 4096)), timeout=1)


def test_load_into_a_torch_module_is_one_call() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    target = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with watchdog(30), PolicyBoard.create(unique("torch"), source.state_dict()) as board:
        assert board.publish(source.state_dict()) == 1
        reader = PolicyBoard.open(board.name, source.state_dict())
        assert reader.load_into(target) == 1
        x = torch.randn(5, 8)
        assert torch.equal(source(x), target(x))
        reader.close()


def test_run_control_stop_flag_heartbeats_dead_and_stuck_members() -> None:
    name = unique("ctl")
    with watchdog(60), RunControl.create(name, stuck_after=0.5) as control:
        waiter = start(control_member, name, 0.2, "wait_stop")
        failer = start(control_member, name, 0.2, "fail")
        hanger = start(control_member, name, 0.2, "hang")
        stop(failer)
        while len(control.members()) < 3:
            time.sleep(0.02)
        assert control.stopped and control.stop_reason > 0  # the failure stopped the run
        stop(waiter)
        assert waiter.exitcode == 0
        states = {m.name: m for m in control.members()}
        assert states["child-fail"].state == "ERROR" and states["child-fail"].error_code == 7
        assert states["child-wait_stop"].state == "CLOSED"
        while not states["child-hang"].stuck:  # no beat for stuck_after: flagged stuck
            time.sleep(0.05)
            states = {m.name: m for m in control.members()}
        os.kill(hanger.pid, signal.SIGKILL)
        hanger.join(10)
        states = {m.name: m for m in control.members()}
        assert states["child-hang"].state == "DEAD"
        assert control.epoch > 0
        assert {m.name for m in control.problems()} == {"child-fail", "child-hang"}


def test_wait_stop_sleeps_until_the_flag() -> None:
    name = unique("ctlw")
    with watchdog(30), RunControl.create(name) as control:
        assert not control.wait_stop(0.05)
        other = RunControl.open(name)
        other.stop()
        assert control.wait_stop(1) and control.stopped and control.stop_reason == 0
        other.close()


def _complete_slot_unannounced(board: PolicyBoard, slot: int, version: int) -> None:
    """The publisher's steps up to a complete slot, stopped before it flips ``active`` and the
    version word (the moment a reader can overtake it)."""
    from transport import native

    seq = native.load64_acquire(board._seq[slot])
    native.store64_release(board._seq[slot], seq + 1)
    for name, value in board_arrays(version).items():
        np.copyto(board.slots[slot][name], value)
    native.store64_release(board._slot_version[slot], version)
    native.store64_release(board._seq[slot], seq + 2)


def test_a_read_never_returns_a_version_not_yet_announced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (found by a 60 s Python-publisher / Node-reader stress): a reader that loaded
    ``active`` just before two publishes could return the slot's newer, complete but not yet
    announced version, and the next read the announced older one: versions went backwards. The
    interleaving is forced here: between the reader's load of ``active`` and its read of the
    slot, version 4 is published and version 5 is written into the slot the reader chose."""
    from transport import native

    name = unique("boardorder")
    with PolicyBoard.create(name, board_arrays(0), mode="double_buffer") as board:
        for v in (1, 2, 3):
            board.publish(board_arrays(v))
        reader = PolicyBoard.open(name, board_arrays(0))
        real_load = native.load_acquire
        raced: list[int] = []

        def load_then_race(word: object) -> int:
            value = real_load(word)
            if word is reader._active and not raced:
                raced.append(value)
                board.publish(board_arrays(4))  # into the other slot, announced
                _complete_slot_unannounced(board, value, 5)  # into the slot the reader chose
            return int(value)

        monkeypatch.setattr(native, "load_acquire", load_then_race)
        first, arrays = reader.read(timeout=2.0)
        assert board_consistent(first, arrays)
        second, arrays = reader.read(timeout=2.0)
        assert board_consistent(second, arrays)
        assert raced and second >= first, f"read {first}, then {second}"
        reader.close()


@pytest.mark.parametrize("what", ["wait_newer", "wait_stop"])
def test_ctrl_c_ends_a_wait_without_a_deadline_at_once(what: str) -> None:
    """Before: the board's and the run control's waits slept in C for their whole timeout, so a
    Ctrl-C during ``wait_newer(v)`` / ``wait_stop(None)`` came only once a version was published
    or the run stopped (never, for a stopped learner). Now they wait in slices (the rings did)."""
    import threading

    fired: list[float] = []

    def on_sigint(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def fire() -> None:
        fired.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    main = threading.get_ident()
    previous = signal.signal(signal.SIGINT, on_sigint)
    timer = threading.Timer(0.3, fire)
    with watchdog(30):
        if what == "wait_newer":
            owner = PolicyBoard.create(unique("ki"), board_arrays(0))
            wait = lambda: owner.wait_newer(0, timeout=None)  # noqa: E731
        else:
            owner = RunControl.create(unique("ki"))
            wait = lambda: owner.wait_stop(None)  # noqa: E731
        try:
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                wait()
            took = time.monotonic() - fired[0]
            assert took < 5, f"KeyboardInterrupt {took:.1f} s after the SIGINT"
        finally:
            timer.cancel()
            timer.join()
            signal.signal(signal.SIGINT, previous)
            owner.close()
