"""Issue 22 item 2 for the actor-learner channels (Python): views kept past ``close()`` of a
board, ring or consumer never read unmapped memory, and a closed board, ring, producer,
consumer or run control raises ChannelClosedError from every method, never a crash.

``PolicyBoard.snapshot()`` hands out zero-copy views of a slot, ``Consumer.take()`` batches
that view the ring's records: they are kept by callers. ``close()`` with views left must keep
them readable with the values they had at close (a private copy, docs/shm.md "Lifetimes"),
no longer attached to the segment; without views it unmaps at once. Each misuse runs in a
child process: it must exit 0 and print the right values (a signal would mean a crash).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = """
import gc, json, os, sys
import numpy as np
from transport.channels import ChannelClosedError, PolicyBoard, Ring, RunControl
from transport.generated import experience

NAME = sys.argv[1]

def maps_with(name):
    with open("/proc/self/maps") as fh:
        return sum(1 for line in fh if name in line)

def closed_error(call):
    try:
        call()
    except ChannelClosedError:
        return "ChannelClosedError"
    except Exception as exc:
        return type(exc).__name__
    return "no error"
"""


def run_child(script: str) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter; it must exit 0 (no signal), its last line JSON."""
    name = f"tlife-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    code = PRELUDE + textwrap.dedent(script)
    child = subprocess.run(
        [sys.executable, "-c", code, name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    leftovers = [e for e in os.listdir("/dev/shm") if name in e]
    for entry in leftovers:
        os.unlink(os.path.join("/dev/shm", entry))
    assert child.returncode == 0, (
        f"the child died: returncode {child.returncode} (negative: a signal)\n"
        f"{child.stdout}\n{child.stderr}"
    )
    assert not leftovers, f"segments left in /dev/shm: {leftovers}"
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def test_board_snapshot_views_keep_their_values_after_close() -> None:
    out = run_child(
        """
        pub = PolicyBoard.create(NAME, {"w": np.zeros(1000, np.float32)})
        pub.publish({"w": np.arange(1000, dtype=np.float32)})
        reader = PolicyBoard.open(NAME)
        with reader.snapshot() as (version, views, still_valid):
            kept = views["w"]
        reader.close()
        pub.publish({"w": np.full(1000, 7, np.float32)})  # reaches no view of a closed reader
        after_reader = maps_with(NAME)
        pub.close()
        gc.collect()
        total = float(kept.sum())
        kept[:] = 1  # the private copy is writable and reaches nobody
        print(json.dumps({"version": version, "total": total, "first": float(kept[3]),
                          "maps_after_close": maps_with(NAME), "maps_reader_closed": after_reader}))
        """
    )
    assert out["version"] == 1
    assert out["total"] == float(sum(range(1000)))  # the values at close, not version 2's
    assert out["first"] == 1.0
    assert out["maps_after_close"] == 0  # no view holds the segment itself any more
    assert out["maps_reader_closed"] == 1  # only the publisher's mapping


def test_closed_board_raises_channel_closed_from_every_method() -> None:
    out = run_child(
        """
        pub = PolicyBoard.create(NAME, {"w": np.zeros(16, np.float32)})
        pub.publish({"w": np.ones(16, np.float32)})
        reader = PolicyBoard.open(NAME)
        reader.close()
        pub.close()
        pub.close()  # idempotent
        def snap(board):
            with board.snapshot():
                pass
        calls = {
            "version": lambda: reader.version,
            "newer_than": lambda: reader.newer_than(0),
            "wait_newer": lambda: reader.wait_newer(5, 0.1),
            "read": lambda: reader.read(),
            "snapshot": lambda: snap(reader),
            "publish": lambda: pub.publish({"w": np.ones(16, np.float32)}),
            "next_version": lambda: pub.next_version(),
            "pub_read": lambda: pub.read(),
        }
        print(json.dumps({k: closed_error(c) for k, c in calls.items()}))
        """
    )
    assert out == {k: "ChannelClosedError" for k in out}, out


def test_ring_batch_views_keep_their_values_after_close() -> None:
    out = run_child(
        """
        ring = Ring.create(NAME, experience.Probe64, 16)
        consumer = ring.consumer()
        producer = ring.producer()
        recs = np.zeros(5, experience.Probe64.dtype)
        recs["index"] = np.arange(5) + 100
        producer.push(recs)
        batch = consumer.take(16, timeout=5)
        held = consumer.take  # the bound method outlives the ring too
        ring.close()
        gc.collect()
        got = [int(i) for i in batch.field("index")]
        copied = batch.copy()["index"].tolist()
        batch.release()  # after close: nothing to give back, no crash
        calls = {
            "take": lambda: held(4, timeout=0),
            "reserve": lambda: producer.reserve(timeout=0),
            "push": lambda: producer.push(recs, timeout=0),
            "committed": lambda: producer.committed,
            "stats": lambda: ring.stats(),
            "head": lambda: ring.head,
            "producer_states": lambda: ring.producer_states(),
            "new_consumer": lambda: ring.consumer(),
            "new_producer": lambda: ring.producer(),
        }
        errors = {k: closed_error(c) for k, c in calls.items()}
        consumer.close()
        producer.close()
        print(json.dumps({"got": got, "copied": copied, "errors": errors,
                          "maps": maps_with(NAME)}))
        """
    )
    assert out["got"] == [100, 101, 102, 103, 104]
    assert out["copied"] == out["got"]
    assert out["errors"] == {k: "ChannelClosedError" for k in out["errors"]}, out["errors"]
    assert out["maps"] == 0


def test_closed_consumer_and_producer_raise_channel_closed() -> None:
    out = run_child(
        """
        ring = Ring.create(NAME, experience.Probe64, 16)
        opened = Ring.open(NAME, experience.Probe64)
        consumer = opened.consumer()
        producer = ring.producer()
        producer.push(np.zeros(3, experience.Probe64.dtype))
        batch = consumer.take(16, timeout=5)
        view = batch.views[0]
        consumer.close()
        producer.close()
        errors = {
            "take": closed_error(lambda: consumer.take(1, timeout=0)),
            "reserve": closed_error(lambda: producer.reserve(timeout=0)),
            "commit": closed_error(lambda: producer.commit()),
        }
        opened.close()
        gc.collect()
        n = len(view)
        ring.close()
        print(json.dumps({"errors": errors, "n": n, "maps": maps_with(NAME)}))
        """
    )
    assert out["errors"] == {k: "ChannelClosedError" for k in out["errors"]}, out["errors"]
    assert out["n"] == 3
    assert out["maps"] == 0


def test_closed_run_control_and_member_raise_channel_closed() -> None:
    out = run_child(
        """
        control = RunControl.create(NAME)
        member = control.join("actor")
        control.close()
        calls = {
            "epoch": lambda: control.epoch,
            "advance": lambda: control.advance(),
            "stopped": lambda: control.stopped,
            "stop": lambda: control.stop(),
            "wait_stop": lambda: control.wait_stop(0.1),
            "join": lambda: control.join("x"),
            "members": lambda: control.members(),
            "beat": lambda: member.beat(),
            "fail": lambda: member.fail(2),
        }
        errors = {k: closed_error(c) for k, c in calls.items()}
        errors["leave"] = closed_error(lambda: member.leave())  # like close(): a no-op now
        del member
        gc.collect()
        print(json.dumps({"errors": errors, "maps": maps_with(NAME)}))
        """
    )
    leave = out["errors"].pop("leave")
    assert out["errors"] == {k: "ChannelClosedError" for k in out["errors"]}, out["errors"]
    assert leave == "no error"
    assert out["maps"] == 0


def test_close_without_views_unmaps_at_once() -> None:
    out = run_child(
        """
        board = PolicyBoard.create(NAME, {"w": np.zeros(4, np.float32)})
        ring = Ring.create(NAME, experience.Probe64, 8)
        ring.consumer()
        control = RunControl.create(NAME)
        before = maps_with(NAME)
        board.close(); ring.close(); control.close()
        print(json.dumps({"before": before, "after": maps_with(NAME)}))
        """
    )
    assert out == {"before": 3, "after": 0}
