"""Helpers of the channel tests (tests/test_channels*.py): checksummed probe records, child
process entry points (spawn imports them by module name), a watchdog, unique names."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from transport.channels import ChannelClosedError, PeerDiedError, Ring
from transport.generated import experience

CTX = mp.get_context("spawn")


def unique(prefix: str) -> str:
    return f"t{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def fill_probe(records: np.ndarray, producer: int, first_index: int) -> None:
    """Write checksummed probe records: payload bytes depend on (producer, index)."""
    n = len(records)
    index = np.arange(first_index, first_index + n, dtype=np.uint64)
    width = records.dtype["payload"].shape[0]
    payload = (index[:, None] * 7 + producer * 13 + np.arange(width, dtype=np.uint64)) & 0xFF
    records["payload"] = payload.astype(np.uint8)
    records["index"] = index
    records["producer"] = producer
    records["checksum"] = (payload.sum(axis=1) + index) & 0xFFFFFFFF
    records["send_ns"] = time.monotonic_ns()


def check_probe(records: np.ndarray) -> np.ndarray:
    """A bool per record: its checksum and payload match its (producer, index)."""
    index = records["index"].astype(np.uint64)
    width = records.dtype["payload"].shape[0]
    producer = records["producer"].astype(np.uint64)
    expected = (
        index[:, None] * 7 + producer[:, None] * 13 + np.arange(width, dtype=np.uint64)
    ) & 0xFF
    ok_payload = (records["payload"] == expected).all(axis=1)
    ok_sum = records["checksum"] == ((expected.sum(axis=1) + index) & 0xFFFFFFFF)
    return ok_payload & ok_sum  # type: ignore[no-any-return]


def probe(record_size: int) -> Any:
    return experience.Probe64 if record_size == 64 else experience.Probe2557


def produce(name: str, record_size: int, producer: int, count: int, batch: int, seed: int) -> None:
    """Child: push ``count`` probe records in reservations of 1..batch records, then close."""
    rng = np.random.default_rng(seed)
    ring = Ring.open(name, probe(record_size), timeout=10)
    with ring.producer() as prod:
        sent = 0
        while sent < count:
            want = min(int(rng.integers(1, batch + 1)), count - sent)
            view = prod.reserve_many(want, timeout=20)
            fill_probe(view, producer, sent)
            prod.commit()
            sent += len(view)
    ring.close()


def produce_forever(name: str, record_size: int, producer: int) -> None:
    """Child: push records until killed."""
    ring = Ring.open(name, probe(record_size), timeout=10)
    prod = ring.producer()
    sent = 0
    while True:
        view = prod.reserve_many(4, timeout=30)
        fill_probe(view, producer, sent)
        prod.commit()
        sent += len(view)


def consume_forever(name: str, record_size: int, ready: Any) -> None:
    """Child: take one record and hold it, then sleep until killed."""
    ring = Ring.open(name, probe(record_size), timeout=10)
    cons = ring.consumer()
    ready.set()
    try:
        cons.take(1, timeout=30)
    except (ChannelClosedError, PeerDiedError):
        pass
    time.sleep(60)


def create_and_hang(name: str, ready: Any) -> None:
    """Child: create a ring and wait to be killed (its segment is left stale)."""
    Ring.create(name, experience.Probe64, 8)
    ready.set()
    time.sleep(60)


def start(target: Any, *args: Any) -> Any:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def stop(proc: Any) -> None:
    proc.join(timeout=20)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


@contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Fail the test (TimeoutError in the main thread) if it runs longer than ``seconds``."""

    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"watchdog: the test ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def board_arrays(version: int, sizes: tuple[int, ...] = (1000, 37, 4096)) -> dict[str, np.ndarray]:
    """A checksummable version: every element of every array derives from ``version``."""
    out = {f"w{i}": np.full(n, version * 3 + i, dtype=np.float32) for i, n in enumerate(sizes)}
    out["tag"] = np.array([version, version ^ 0x5A5A], dtype=np.int64)
    return out


def board_consistent(version: int, arrays: dict[str, np.ndarray]) -> bool:
    """Every array holds ``version`` (no torn or mixed read)."""
    if arrays["tag"].tolist() != [version, version ^ 0x5A5A]:
        return False
    return all(bool((arrays[f"w{i}"] == version * 3 + i).all()) for i in range(len(arrays) - 1))


def publish_versions(name: str, count: int, pause: float) -> None:
    """Child: publish versions 1..count (then exit)."""
    from transport.channels import PolicyBoard

    board = PolicyBoard.open(name, board_arrays(0), timeout=10)
    for version in range(1, count + 1):
        assert board.publish(board_arrays(version)) == version
        if pause:
            time.sleep(pause)
    board.close()


def read_versions(name: str, seconds: float, result: Any) -> None:
    """Child: read for ``seconds``; put (reads, torn, last version) on ``result``."""
    from transport.channels import PolicyBoard

    board = PolicyBoard.open(name, timeout=10)
    out = None
    reads = torn = last = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        version, out = board.read(out)
        if version == 0:
            continue
        reads += 1
        torn += not board_consistent(version, out)
        if version < last:
            torn += 1  # versions never go backwards
        last = version
    board.close()
    result.put((reads, torn, last))


def control_member(name: str, beat_for: float, then: str) -> None:
    """Child: join, beat for ``beat_for`` s, then "leave", "fail", "hang" or "wait_stop"."""
    from transport.channels import RunControl

    control = RunControl.open(name, timeout=10)
    member = control.join(f"child-{then}", role=1)
    deadline = time.monotonic() + beat_for
    while time.monotonic() < deadline:
        member.beat()
        control.advance()
        time.sleep(0.01)
    if then == "leave":
        member.leave()
    elif then == "fail":
        member.fail(7)
    elif then == "hang":
        time.sleep(60)
    elif then == "wait_stop":
        assert control.wait_stop(30)
        member.leave()
    control.close()
