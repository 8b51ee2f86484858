"""Regressions of issue 22 item 1: a failed ``PolicyBoard.publish()``, a publisher killed
mid-publish and a publisher takeover never leave readers accepting torn versions or unable to
read new ones; impossible words in the board are typed errors.

Every version is ``board_arrays(version)``: every element derives from the version, so a torn
read (arrays not all of the version the read returned) is visible. Readers run in other
processes, Python and Node (node_bridge/dist/testing/board_torn_cli.js), both modes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from tests.channels_util import (
    CTX,
    board_arrays,
    board_consistent,
    start,
    stop,
    unique,
    watchdog,
)
from transport import native
from transport.channels import (
    ChannelError,
    ChannelMismatchError,
    PolicyBoard,
    TornReadError,
)

MODES = ["double_buffer", "seqlock"]
CLI = Path(__file__).resolve().parents[1] / "node_bridge" / "dist" / "testing" / "board_torn_cli.js"
HAVE_NODE = shutil.which("node") is not None and CLI.is_file()
needs_node = pytest.mark.skipif(
    not HAVE_NODE, reason="node or node_bridge/dist is missing (cd node_bridge && npx tsc -p .)"
)
Mode = Literal["double_buffer", "seqlock"]


def next_version(board: PolicyBoard) -> int:
    """The version the board's next publish gets (takes the lease, repairing first)."""
    return board.next_version()


def bad_arrays(version: int, kind: int) -> dict[str, Any]:
    """An invalid publish whose first arrays are valid (a publish that copies before it checks
    leaves a half-written slot): the last array of the wrong shape, dtype, missing, or no
    array at all."""
    arrays: dict[str, Any] = dict(board_arrays(version))
    if kind % 4 == 0:
        arrays["tag"] = np.array([version], dtype=np.int64)
    elif kind % 4 == 1:
        arrays["tag"] = np.array([version + 0.5, 1.5])  # float64 into int64: not same_kind
    elif kind % 4 == 2:
        del arrays["tag"]
    else:
        arrays["tag"] = "not an array"
    return arrays


def seq_words(board: PolicyBoard) -> list[int]:
    return [native.load64_acquire(board._seq[s]) for s in range(board.slot_count)]


def node(*args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(["node", str(CLI), *map(str, args)], stdout=subprocess.PIPE, text=True)


def node_result(proc: subprocess.Popen[str], timeout: float = 90) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- children (spawn imports them by module name) -----------------------------------------------


def count_reads(name: str, seconds: float, timeout: float, result: Any) -> None:
    """Child: read for ``seconds``; put a summary on ``result``: reads, torn (a read not all of
    its version), backwards, typed errors by class, anything else as text."""
    import time

    board = PolicyBoard.open(name, timeout=10)
    out = None
    reads = torn = backwards = last = 0
    errors: dict[str, int] = {}
    untyped: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(untyped) < 20:
        try:
            version, out = board.read(out, timeout=timeout)
        except ChannelError as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            continue
        except Exception as exc:  # the regression: IndexError, OverflowError, ...
            untyped.append(f"{type(exc).__name__}: {exc}")
            continue
        if version == 0:
            continue
        reads += 1
        torn += not board_consistent(version, out)
        backwards += version < last
        last = version
    board.close()
    result.put(
        {
            "reads": reads,
            "torn": torn,
            "backwards": backwards,
            "last": last,
            "errors": errors,
            "untyped": untyped,
        }
    )


def publish_with_failures(name: str, seconds: float, fail_every: int, result: Any) -> None:
    """Child: publish for ``seconds``; every ``fail_every``-th version is preceded by an invalid
    publish (which must raise a typed error and change nothing)."""
    import time

    board = PolicyBoard.open(name, board_arrays(0), timeout=10)
    published = failed = 0
    untyped: list[str] = []
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        i += 1
        version = next_version(board)
        if i % fail_every == 0:
            try:
                board.publish(bad_arrays(version, i // fail_every))
                untyped.append(f"invalid publish {i} was accepted")
            except ChannelError:
                failed += 1
            except Exception as exc:
                failed += 1
                untyped.append(f"{type(exc).__name__}: {exc}")
        got = board.publish(board_arrays(version))
        if got != version:
            untyped.append(f"published {got}, expected {version}")
        published += 1
    board.close()
    result.put({"published": published, "failed": failed, "untyped": untyped})


def die_mid_publish(name: str, count: int) -> None:
    """Child: publish ``count`` versions, then do half of the next publish the way publish
    does (its slot's seq odd, the first array copied) and die there by SIGKILL."""
    board = PolicyBoard.open(name, board_arrays(0), timeout=10)
    for _ in range(count):
        board.publish(board_arrays(next_version(board)))
    if board.mode.name == "DOUBLE_BUFFER":
        slot = 1 - native.load_acquire(board._active)
    else:
        slot = 0
    seq = native.load64_acquire(board._seq[slot])
    native.store64_release(board._seq[slot], seq + 1)
    np.copyto(board.slots[slot]["w0"], board_arrays(board.version + 1)["w0"])
    os.kill(os.getpid(), signal.SIGKILL)


def run_died(target: Any, *args: Any) -> None:
    proc = start(target, *args)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL, proc.exitcode


# -- a publish that fails ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", range(4), ids=["shape", "dtype", "missing", "not-an-array"])
@pytest.mark.parametrize("mode", MODES)
def test_a_failed_publish_changes_nothing(mode: Mode, kind: int) -> None:
    """An invalid publish raises ChannelMismatchError before it touches the slot: every slot's
    seq stays even, the last version stays readable, every later version is readable whole.
    (Before: the slot was left odd and every later publish flipped its parity.)"""
    with watchdog(60), PolicyBoard.create(unique("failpub"), board_arrays(0), mode=mode) as board:
        reader = PolicyBoard.open(board.name, board_arrays(0))
        assert board.publish(board_arrays(1)) == 1
        before = seq_words(board)
        with pytest.raises(ChannelMismatchError):
            board.publish(bad_arrays(2, kind))
        assert seq_words(board) == before
        version, out = reader.read(timeout=2)
        assert version == 1 and board_consistent(1, out)
        for v in range(2, 7):
            assert board.publish(board_arrays(v)) == v
            assert all(s % 2 == 0 for s in seq_words(board)), seq_words(board)
            version, out = reader.read(timeout=2)
            assert version == v and board_consistent(v, out), (v, version)
        reader.close()


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_mid_copy_leaves_no_torn_version(
    mode: Mode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception in the middle of the copy (Ctrl-C, a failing conversion) leaves the slot
    odd: no reader returns it; the next publish repairs the slot and is read whole."""
    with watchdog(30), PolicyBoard.create(unique("midcopy"), board_arrays(0), mode=mode) as board:
        reader = PolicyBoard.open(board.name, board_arrays(0))
        board.publish(board_arrays(1))
        real_copyto = np.copyto
        calls: list[int] = []

        def interrupted(*args: Any, **kwargs: Any) -> None:
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            real_copyto(*args, **kwargs)

        monkeypatch.setattr(np, "copyto", interrupted)
        with pytest.raises(KeyboardInterrupt):
            board.publish(board_arrays(2))
        monkeypatch.setattr(np, "copyto", real_copyto)
        if mode == "double_buffer":  # the half-written slot is not the one readers read
            version, out = reader.read(timeout=1)
            assert version == 1 and board_consistent(1, out)
        else:
            with pytest.raises(TornReadError):
                reader.read(timeout=0.3)
        for v in (2, 3, 4):
            assert board.publish(board_arrays(v)) == v
            version, out = reader.read(timeout=2)
            assert version == v and board_consistent(v, out), (v, version)
        reader.close()


@pytest.mark.parametrize("mode", MODES)
def test_failed_publishes_under_load_python_and_node_readers_never_torn(mode: Mode) -> None:
    """A publisher whose every third version follows an invalid publish, two Python readers and
    a Node reader for 3 s: no torn read, none backwards, no error (before: thousands of torn
    reads and TornReadErrors, the odd slots unreadable)."""
    name = unique("failload")
    with watchdog(120), PolicyBoard.create(name, board_arrays(0), mode=mode):
        results = CTX.Queue()
        readers = [start(count_reads, name, 3.0, 2.0, results) for _ in range(2)]
        nreader = node("read", name, 3.0, 2000) if HAVE_NODE else None
        writer = start(publish_with_failures, name, 3.5, 3, results)
        outcomes = [results.get(timeout=60) for _ in range(3)]
        for proc in [*readers, writer]:
            stop(proc)
        if nreader is not None:
            outcomes.append({"node": True, **node_result(nreader)})
    published = [o for o in outcomes if "published" in o]
    reads = [o for o in outcomes if "reads" in o]
    for o in reads:
        assert o["torn"] == 0 and o["backwards"] == 0, outcomes
        assert o["errors"] == {} and o["untyped"] == [], outcomes
    assert published[0]["untyped"] == [] and published[0]["failed"] > 0, published
    assert sum(o["reads"] for o in reads) > 0


# -- a publisher killed mid-publish, then a takeover ---------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_takeover_after_a_publisher_died_mid_publish(mode: Mode) -> None:
    """A publisher dies (SIGKILL) with its slot half written and odd; a new publisher takes the
    lease, repairs the parity and every version it publishes is readable whole. (Before: seqlock
    readers could read none of the new publisher's versions, double buffer every other one.)"""
    name = unique("takeover")
    with watchdog(60), PolicyBoard.create(name, board_arrays(0), mode=mode) as board:
        run_died(die_mid_publish, name, 3)
        reader = PolicyBoard.open(name, board_arrays(0))
        if mode == "double_buffer":  # the last whole version is still there meanwhile
            version, out = reader.read(timeout=2)
            assert version == 3 and board_consistent(3, out)
        else:
            with pytest.raises(ChannelError):  # no whole version left: a typed error
                reader.read(timeout=0.3)
        for _ in range(5):
            v = next_version(board)
            assert v >= 4 and board.publish(board_arrays(v)) == v
            version, out = reader.read(timeout=2)
            assert version == v and board_consistent(v, out), (v, version)
        reader.close()


# -- impossible words ------------------------------------------------------------------------------


@pytest.mark.parametrize("active", [2, 7, 0xFFFFFFFF])
def test_an_impossible_active_slot_is_a_typed_error_and_the_publisher_repairs_it(
    active: int,
) -> None:
    with watchdog(30), PolicyBoard.create(unique("active"), board_arrays(0)) as board:
        reader = PolicyBoard.open(board.name, board_arrays(0))
        board.publish(board_arrays(1))
        native.store_release(board._active, active)
        with pytest.raises(ChannelError, match="active"):
            reader.read(timeout=1)
        with pytest.raises(ChannelError, match="active"), reader.snapshot():
            pass
        assert board.publish(board_arrays(2)) == 2
        version, out = reader.read(timeout=2)
        assert version == 2 and board_consistent(2, out)
        reader.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_version_word_that_goes_backwards_is_a_typed_error(mode: Mode) -> None:
    """The announced version goes back below what a reader already read: the reader raises a
    typed error (before: it retried until TornReadError); the publisher keeps its own count."""
    with watchdog(30), PolicyBoard.create(unique("back"), board_arrays(0), mode=mode) as board:
        reader = PolicyBoard.open(board.name, board_arrays(0))
        for v in range(1, 6):
            board.publish(board_arrays(v))
        assert reader.read(timeout=2)[0] == 5
        native.store64_release(board._version, 2)
        with pytest.raises(ChannelError, match="back"):
            reader.read(timeout=1)
        assert board.publish(board_arrays(6)) == 6
        version, out = reader.read(timeout=2)
        assert version == 6 and board_consistent(6, out)
        reader.close()


@pytest.mark.parametrize("word", [2**64 - 1, 2**63])
def test_an_impossible_version_word_never_overflows(word: int) -> None:
    """A version word of 2**64 - 1 made ``publish`` raise OverflowError; a new publisher finding
    it (or its own publisher) ignores a version no board can reach."""
    with watchdog(30), PolicyBoard.create(unique("huge"), board_arrays(0)) as board:
        board.publish(board_arrays(1))
        native.store64_release(board._version, word)
        assert board.publish(board_arrays(2)) == 2
        other = PolicyBoard.open(board.name, board_arrays(0))
        version, out = other.read(timeout=2)
        assert version == 2 and board_consistent(2, out)
        board.close()  # gives up the lease; the board stays (other maps it)
        native.store64_release(other._version, word)
        assert next_version(other) == 3 and other.publish(board_arrays(3)) == 3
        assert other.read(timeout=2)[0] == 3
        other.close()


def test_an_odd_slot_left_by_a_scribble_is_repaired_by_the_next_publish() -> None:
    with watchdog(30), PolicyBoard.create(unique("odd"), board_arrays(0), mode="seqlock") as b:
        reader = PolicyBoard.open(b.name, board_arrays(0))
        b.publish(board_arrays(1))
        native.store64_release(b._seq[0], native.load64_acquire(b._seq[0]) + 1)
        with pytest.raises(TornReadError):
            reader.read(timeout=0.2)
        assert b.publish(board_arrays(2)) == 2
        version, out = reader.read(timeout=2)
        assert version == 2 and board_consistent(2, out)
        reader.close()


# -- across languages ------------------------------------------------------------------------------


@needs_node
@pytest.mark.parametrize("mode", MODES)
def test_node_publisher_with_failures_python_readers(mode: Mode) -> None:
    """A Node publisher whose every third version follows an invalid publish (missing, short,
    wrong element kind): Python readers never read a torn version and get no error."""
    name = unique("nfail")
    with watchdog(120), PolicyBoard.create(name, board_arrays(0), mode=mode):
        results = CTX.Queue()
        readers = [start(count_reads, name, 2.5, 2.0, results) for _ in range(2)]
        writer = node("publish", name, 3000, 3)
        outcomes = [results.get(timeout=60) for _ in readers]
        for proc in readers:
            stop(proc)
        summary = node_result(writer)
    assert summary["untyped"] == [] and summary["failed"] > 0, summary
    for o in outcomes:
        assert o["torn"] == 0 and o["backwards"] == 0, outcomes
        assert o["errors"] == {} and o["untyped"] == [], outcomes


@needs_node
@pytest.mark.parametrize("mode", MODES)
def test_node_publisher_dies_mid_publish_python_takes_over_node_reads(mode: Mode) -> None:
    """A Node publisher SIGKILLed mid-publish; Python takes the lease over and publishes; a
    Node reader reads every version whole (and Python ones too)."""
    name = unique("ntake")
    with watchdog(120), PolicyBoard.create(name, board_arrays(0), mode=mode) as board:
        dead = node("die-mid-publish", name, 3)
        dead.communicate(timeout=60)
        assert dead.returncode == -signal.SIGKILL
        nreader = node("read", name, 2.0, 2000)
        reader = PolicyBoard.open(name, board_arrays(0))
        import time

        deadline = time.monotonic() + 2.5
        last = 0
        while time.monotonic() < deadline:
            v = next_version(board)
            assert board.publish(board_arrays(v)) == v
            version, out = reader.read(timeout=2)
            assert version >= last and board_consistent(version, out), (v, version)
            last = version
        assert last >= 4
        summary = node_result(nreader)
        reader.close()
    assert summary["torn"] == 0 and summary["backwards"] == 0, summary
    assert summary["errors"] == {} and summary["untyped"] == [], summary
    assert summary["reads"] > 0 and summary["last"] >= 4, summary


@needs_node
@pytest.mark.parametrize("mode", MODES)
def test_python_publisher_dies_mid_publish_node_takes_over(mode: Mode) -> None:
    """A Python publisher SIGKILLed mid-publish; a Node publisher takes the lease over and
    publishes 300 versions; Python reads them whole (before: in seqlock mode none)."""
    name = unique("ptake")
    with watchdog(120), PolicyBoard.create(name, board_arrays(0), mode=mode):
        run_died(die_mid_publish, name, 3)
        reader = PolicyBoard.open(name, board_arrays(0))
        writer = node("publish", name, 300, 0)
        out, last = None, 0
        while writer.poll() is None:
            try:
                version, out = reader.read(out, timeout=0.5)
            except ChannelError:  # seqlock: no whole version until Node's first publish
                assert mode == "seqlock" and last == 0
                continue
            assert board_consistent(version, out) and version >= last, (version, last)
            last = version
        summary = node_result(writer)
        version, out = reader.read(out, timeout=2)
        reader.close()
    assert summary["untyped"] == [] and summary["published"] == 300, summary
    assert version == summary["last"] >= 303 and board_consistent(version, out)
