"""Adversarial runs of the channels (issue 22): seeded, bounded in time, real processes.

Board: publishers (Python and Node, chosen by the seed) publish versions whose every element
derives from the version, with invalid publishes mixed in, and are SIGKILLed at random moments
(often mid-publish: the arrays are large); the next one takes the lease over. A scribbler
process writes impossible words meanwhile (``active`` out of range or flipped, the version word
back, forward or beyond 2**63, a slot's seq odd, a slot's version beyond 2**63, the notify
word). Python and Node readers must never return a torn version or go back, and raise only the
channels' typed errors; after the run a clean publish is read whole.

Ring: producers (Python and Node) SIGKILLed at random moments and replaced, the consumer
SIGKILLed and replaced (a lease takeover), the futex words and counters scribbled: every record
the consumers take is whole (checksummed), per producer in order, and only typed errors.

``CHANNELS_FUZZ_SEED`` (default 22) and ``CHANNELS_FUZZ_SECONDS`` (default 4) set the run; a
failure prints the seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from tests.channels_util import (
    CTX,
    board_arrays,
    board_consistent,
    check_probe,
    fill_probe,
    start,
    stop,
    unique,
    watchdog,
)
from tests.test_board_torn import CLI, HAVE_NODE, bad_arrays, count_reads, node_result
from transport import native
from transport.channels import ChannelError, PolicyBoard, Ring
from transport.channels.board import _WORDS
from transport.channels.ring import _RING
from transport.generated import experience

SEED = int(os.environ.get("CHANNELS_FUZZ_SEED", "22"))
SECONDS = float(os.environ.get("CHANNELS_FUZZ_SECONDS", "4"))
SIZES = (1000, 37, 131072)  # a large last array: a SIGKILL often lands mid-copy
Mode = Literal["double_buffer", "seqlock"]


def node(*args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["node", str(CLI), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill(proc: Any) -> None:
    """SIGKILL a child (multiprocessing or Popen) and reap it."""
    if isinstance(proc, subprocess.Popen):
        proc.kill()
        proc.communicate(timeout=30)
    else:
        proc.kill()
        proc.join(30)


def alive(proc: Any) -> bool:
    return proc.poll() is None if isinstance(proc, subprocess.Popen) else bool(proc.is_alive())


# -- children --------------------------------------------------------------------------------------


def publish_forever(name: str, fail_every: int) -> None:
    """Child: publish ``board_arrays(version)`` until killed, an invalid publish before every
    ``fail_every``-th; anything but a typed error from an invalid publish exits 3."""
    board = PolicyBoard.open(name, timeout=10)
    i = 0
    while True:
        i += 1
        version = board.next_version()
        if i % fail_every == 0:
            try:
                board.publish(bad_arrays(version, i))
                os._exit(3)
            except ChannelError:
                pass
        arrays = board_arrays(version, SIZES)
        if board.publish(arrays) != version:
            os._exit(4)


def scribble_board(name: str, seed: int, seconds: float) -> None:
    """Child: write impossible words into the board at random moments for ``seconds``."""
    rng = np.random.default_rng(seed)
    board = PolicyBoard.open(name, timeout=10)
    seg = board.segment
    active = seg.word(_WORDS["active"])
    version = seg.word64(_WORDS["version"])
    notify = seg.word(_WORDS["notify"])
    seqs = [seg.word64(_WORDS[f"slot{i}_seq"]) for i in range(board.slot_count)]
    slot_versions = [seg.word64(_WORDS[f"slot{i}_version"]) for i in range(board.slot_count)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(float(rng.uniform(0.005, 0.08)))
        what = int(rng.integers(0, 8))
        current = native.load64_acquire(version)
        if what == 0:
            native.store_release(active, int(rng.choice([2, 3, 0xFFFFFFFF, 1 << 20])))
        elif what == 1:
            native.store_release(active, int(rng.integers(0, 2)))  # a valid slot, maybe wrong
        elif what == 2:
            native.store64_release(version, int(rng.integers(0, max(current, 1))))  # back
        elif what == 3:
            native.store64_release(version, int(rng.choice([2**64 - 1, 2**63 + 5])))
        elif what == 4:
            native.store64_release(version, current + int(rng.integers(1, 50)))  # forward
        elif what == 5:
            odd = int(rng.integers(1, 2**62)) * 2 + 1
            native.store64_release(seqs[int(rng.integers(0, len(seqs)))], odd)
        elif what == 6:
            s = int(rng.integers(0, len(slot_versions)))
            native.store64_release(slot_versions[s], 2**63 + int(rng.integers(0, 2**40)))
        else:
            native.store_release(notify, int(rng.integers(0, 2**32)))
    board.close()


def produce_forever(name: str, producer: int) -> None:
    """Child: push checksummed probe records until killed; typed errors (no consumer
    meanwhile) are waited out, anything else propagates (exit code 1)."""
    ring = Ring.open(name, experience.Probe64, timeout=10)
    prod = ring.producer()
    sent = 0
    while True:
        try:
            view = prod.reserve_many(4, timeout=0.5)
        except ChannelError:
            continue
        fill_probe(view, producer, sent)
        prod.commit()
        sent += len(view)


def consume_and_report(name: str, out: str) -> None:
    """Child: take records until killed; every 0.1 s (and at every problem) replace ``out``
    with a summary: records, bad (torn), out of order per producer, typed errors, untyped."""
    ring = Ring.open(name, experience.Probe64, timeout=10)
    cons = ring.consumer()
    last: dict[int, int] = {}
    summary: dict[str, Any] = {"records": 0, "bad": 0, "order": 0, "errors": {}, "untyped": []}

    def report() -> None:
        with open(out + ".tmp", "w") as fh:
            json.dump(summary, fh)
        os.replace(out + ".tmp", out)

    report()
    next_report = time.monotonic() + 0.1
    while True:
        try:
            batch = cons.take(64, timeout=0.3)
        except ChannelError as exc:
            errors = summary["errors"]
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            continue
        except Exception as exc:
            summary["untyped"].append(f"{type(exc).__name__}: {exc}")
            report()
            continue
        records = batch.copy()
        batch.release()
        ok = check_probe(records)
        summary["records"] += len(records)
        summary["bad"] += int((~ok).sum())
        for producer, index in zip(
            records["producer"][ok].tolist(), records["index"][ok].tolist(), strict=True
        ):
            if index <= last.get(producer, -1):
                summary["order"] += 1
            last[producer] = index
        if time.monotonic() >= next_report or not ok.all():
            report()
            next_report = time.monotonic() + 0.1


# -- the board ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["double_buffer", "seqlock"])
def test_fuzz_board_kills_takeovers_invalid_publishes_and_scribbles(mode: Mode) -> None:
    rng = np.random.default_rng([SEED, 0 if mode == "double_buffer" else 1])
    name = unique("fuzzb")
    with (
        watchdog(SECONDS * 6 + 90),
        PolicyBoard.create(name, board_arrays(0, SIZES), mode=mode) as board,
    ):
        results = CTX.Queue()
        reader = start(count_reads, name, SECONDS + 1.0, 1.0, results)
        nreader = node("read", name, SECONDS + 1.0, 1000) if HAVE_NODE else None
        scribbler = start(scribble_board, name, SEED, SECONDS)
        deadline = time.monotonic() + SECONDS
        rounds = {"python": 0, "node": 0}
        while time.monotonic() < deadline:
            lang = "node" if HAVE_NODE and rng.random() < 0.5 else "python"
            fail_every = int(rng.integers(2, 6))
            if lang == "node":
                pub: Any = node("publish-forever", name, fail_every)
            else:
                pub = start(publish_forever, name, fail_every)
            started = board.version
            wait_until = time.monotonic() + 20
            while board.version == started and alive(pub) and time.monotonic() < wait_until:
                time.sleep(0.005)  # until it published once (spawn and imports take a while)
            time.sleep(float(rng.uniform(0.0, 0.3)))
            assert alive(pub), f"seed {SEED}: the {lang} publisher exited by itself"
            kill(pub)  # often mid-publish; the next publisher takes the lease over
            rounds[lang] += 1
        stop(scribbler)
        version = board.next_version()  # the creator takes over last, repairing what is left
        assert board.publish(board_arrays(version, SIZES)) == version
        outcomes = [results.get(timeout=60)]
        stop(reader)
        if nreader is not None:
            outcomes.append({"node": True, **node_result(nreader)})
        other = PolicyBoard.open(name, board_arrays(0, SIZES))
        final, arrays = other.read(timeout=5)
        other.close()
    assert final == version and board_consistent(final, arrays), (SEED, final, version)
    for o in outcomes:
        assert o["torn"] == 0 and o["backwards"] == 0, (SEED, rounds, outcomes)
        assert o["untyped"] == [] and o["reads"] > 0, (SEED, rounds, outcomes)


# -- the ring -------------------------------------------------------------------------------------


def scribble_ring(name: str, seed: int, seconds: float) -> None:
    """Child: write the ring's futex words and counters at random moments for ``seconds``."""
    rng = np.random.default_rng(seed)
    ring = Ring.open(name, experience.Probe64, timeout=10)
    seg = ring.segment
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(float(rng.uniform(0.005, 0.05)))
        field = str(rng.choice(["data_word", "space_word", "overwritten", "lost"]))
        if field.endswith("_word"):
            native.store_release(seg.word(_RING[field]), int(rng.integers(0, 2**32)))
        else:
            native.store64_release(seg.word64(_RING[field]), int(rng.integers(0, 2**63)))
    ring.close()


@pytest.mark.parametrize("policy", ["block", "overwrite"])
def test_fuzz_ring_producer_and_consumer_kills_and_scribbles(
    policy: Literal["block", "overwrite"], tmp_path: Path
) -> None:
    rng = np.random.default_rng([SEED, 2 if policy == "block" else 3])
    name = unique("fuzzr")
    with (
        watchdog(SECONDS * 6 + 90),
        Ring.create(
            name, experience.Probe64, 64, multi_producer=True, max_producers=64, policy=policy
        ),
    ):
        reports: list[str] = []

        def new_consumer() -> Any:
            reports.append(str(tmp_path / f"consumer{len(reports)}.json"))
            proc = start(consume_and_report, name, reports[-1])
            while not os.path.exists(reports[-1]) and proc.is_alive():
                time.sleep(0.01)
            return proc

        consumer = new_consumer()
        scribbler = start(scribble_ring, name, SEED, SECONDS)
        producers: list[tuple[Any, str]] = []
        deadline = time.monotonic() + SECONDS
        next_consumer_kill = time.monotonic() + float(rng.uniform(0.3, 1.0))
        producer_id = 0
        while time.monotonic() < deadline:
            while len(producers) < 3:
                lang = "node" if HAVE_NODE and rng.random() < 0.5 else "python"
                if lang == "node":
                    proc: Any = node("ring-produce-forever", name, producer_id)
                else:
                    proc = start(produce_forever, name, producer_id)
                producers.append((proc, lang))
                producer_id += 1
            time.sleep(float(rng.uniform(0.1, 0.4)))
            victim = int(rng.integers(0, len(producers)))
            proc, lang = producers.pop(victim)
            assert alive(proc), f"seed {SEED}: a {lang} producer exited by itself"
            kill(proc)  # often mid-reservation: the consumer skips what it never committed
            if time.monotonic() >= next_consumer_kill:
                kill(consumer)  # a consumer killed holding records: the next one takes over
                consumer = new_consumer()
                next_consumer_kill = time.monotonic() + float(rng.uniform(0.3, 1.0))
        stop(scribbler)
        for proc, _ in producers:
            kill(proc)
        time.sleep(0.3)
        kill(consumer)
    summaries = [json.loads(Path(r).read_text()) for r in reports]
    for s in summaries:
        assert s["bad"] == 0 and s["order"] == 0 and s["untyped"] == [], (SEED, summaries)
    assert sum(s["records"] for s in summaries) > 0, (SEED, summaries)
