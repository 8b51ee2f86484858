"""Experience rings across real processes: order, loss, corruption, wrap-around, SIGKILL."""

from __future__ import annotations

import os
import signal
import stat
import time

import numpy as np
import pytest

from tests.channels_util import (
    CTX,
    check_probe,
    consume_forever,
    create_and_hang,
    fill_probe,
    produce,
    produce_forever,
    start,
    stop,
    unique,
    watchdog,
)
from transport.channels import (
    ChannelClosedError,
    ChannelInUseError,
    ChannelMismatchError,
    ChannelTimeoutError,
    Consumer,
    PeerDiedError,
    Ring,
    list_segments,
)
from transport.channels.__main__ import main as channels_cli
from transport.generated import experience


def drain(consumer: Consumer, expected: int) -> np.ndarray:
    """Every record until ``expected`` came, copied. A producer that starts late may find the
    others closed: the consumer then sees an end of stream and looks again."""
    got: list[np.ndarray] = []
    deadline = time.monotonic() + 60
    while sum(map(len, got)) < expected and time.monotonic() < deadline:
        try:
            batch = consumer.take(64, timeout=20)
        except ChannelClosedError:
            time.sleep(0.02)
            continue
        got.append(batch.copy())
        batch.release()
    return np.concatenate(got) if got else np.zeros(0, consumer.ring.record.dtype)


@pytest.mark.parametrize("record_size", [64, 2557])
def test_one_producer_in_order_none_lost_none_corrupted(record_size: int) -> None:
    name = unique("ring1")
    record = experience.Probe64 if record_size == 64 else experience.Probe2557
    with watchdog(60), Ring.create(name, record, 64) as ring:
        consumer = ring.consumer()
        proc = start(produce, name, record_size, 0, 5000, 9, 1)
        records = drain(consumer, 5000)
        stop(proc)
        assert proc.exitcode == 0
        assert records["index"].tolist() == list(range(5000))
        assert check_probe(records).all()
        assert ring.stats()["lost"] == 0 and ring.overwritten == 0
        mode = stat.S_IMODE(os.stat(ring.segment.path).st_mode)
        assert mode == 0o600


def test_four_producers_each_in_order() -> None:
    name = unique("ring4")
    with watchdog(90), Ring.create(name, experience.Probe64, 32, multi_producer=True) as ring:
        consumer = ring.consumer()
        procs = [start(produce, name, 64, p, 3000, 5, 100 + p) for p in range(4)]
        records = drain(consumer, 12000)
        for proc in procs:
            stop(proc)
            assert proc.exitcode == 0
        assert check_probe(records).all()
        for p in range(4):
            mine = records["index"][records["producer"] == p]
            assert mine.tolist() == list(range(3000))
        assert len(records) == 12000 and ring.lost == 0


def test_overwrite_drops_oldest_and_counts() -> None:
    name = unique("ringow")
    with watchdog(60), Ring.create(name, experience.Probe64, 16, policy="overwrite") as ring:
        producer = ring.producer()
        consumer = ring.consumer()
        total = 0
        seen = []
        rng = np.random.default_rng(3)
        for _ in range(200):
            n = int(rng.integers(1, 40))
            for _ in range(n):
                view = producer.reserve_many(1, timeout=1)
                fill_probe(view, 0, total)
                producer.commit()
                total += 1
            try:
                batch = consumer.take(int(rng.integers(1, 8)), timeout=0)
            except ChannelTimeoutError:
                continue
            assert check_probe(batch.copy()).all()
            seen.extend(batch.field("index").tolist())
            batch.release()
        producer.close()
        seen.extend(drain(consumer, total - len(seen) - ring.overwritten)["index"].tolist())
        assert seen == sorted(seen)  # in order, none twice
        assert len(seen) + ring.overwritten == total
        assert ring.overwritten > 0


def test_overwrite_never_touches_held_records() -> None:
    name = unique("ringhold")
    with watchdog(30), Ring.create(name, experience.Probe64, 8, policy="overwrite") as ring:
        producer, consumer = ring.producer(), ring.consumer()
        producer.push(_probes(0, 8))
        batch = consumer.take(3, timeout=0)  # holds records 0..2 (slots 0..2)
        with pytest.raises(ChannelTimeoutError):  # record 8 needs slot 0, which is held
            producer.reserve_many(1, timeout=0.2)
        assert ring.overwritten == 0
        assert check_probe(batch.copy()).all() and batch.field("index").tolist() == [0, 1, 2]
        batch.release()
        producer.push(_probes(8, 5), timeout=1)  # 3 free slots, then drops the oldest: 3, 4
        assert ring.overwritten == 2
        rest = consumer.take(64, timeout=0)
        indices = rest.field("index").tolist()
        rest.release()
        assert indices == list(range(5, 13))


def _probes(first: int, n: int) -> np.ndarray:
    out = experience.Probe64.zeros(n)
    fill_probe(out, 0, first)
    return out


@pytest.mark.parametrize("capacity", [4, 8])
def test_wraparound_at_every_offset(capacity: int) -> None:
    """For each start offset and each batch size: one view, or two where the ring wraps."""
    with watchdog(60):
        for offset in range(capacity):
            for size in range(1, capacity + 1):
                with Ring.create(unique("wrap"), experience.Probe64, capacity) as ring:
                    producer, consumer = ring.producer(), ring.consumer()
                    if offset:
                        producer.push(_probes(0, offset))
                        consumer.take(offset, timeout=0).release()
                    producer.push(_probes(offset, size))
                    batch = consumer.take(capacity, timeout=0)
                    wraps = offset % capacity + size > capacity
                    assert len(batch.views) == (2 if wraps else 1)
                    assert batch.count == size and batch.first == offset
                    assert batch.field("index").tolist() == list(range(offset, offset + size))
                    assert all(np.shares_memory(v, ring.records) for v in batch.views)
                    batch.release()


def test_block_times_out_when_full_and_zero_copy_reserve() -> None:
    with watchdog(30), Ring.create(unique("full"), experience.Probe64, 4) as ring:
        producer, consumer = ring.producer(), ring.consumer()
        view = producer.reserve_many(4)
        assert np.shares_memory(view, ring.records)
        fill_probe(view, 0, 0)
        producer.commit()
        with pytest.raises(ChannelTimeoutError):
            producer.reserve(timeout=0.1)
        consumer.take(1, timeout=0).release()
        record = producer.reserve(timeout=0.1)
        record["index"] = 4
        assert producer.commit() == 4


def test_sigkill_producer_gives_consumer_a_typed_error() -> None:
    name = unique("killp")
    with watchdog(60), Ring.create(name, experience.Probe64, 64) as ring:
        consumer = ring.consumer()
        proc = start(produce_forever, name, 64, 0)
        rng = np.random.default_rng(7)
        taken = 0
        kill_after = int(rng.integers(100, 20000))
        with pytest.raises(PeerDiedError):
            while True:
                batch = consumer.take(16, timeout=10)
                assert check_probe(batch.copy()).all()
                taken += batch.count
                batch.release()
                if taken >= kill_after and proc.is_alive():
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.join(10)
        assert ring.stats()["pending"] == 0


def test_sigkill_one_of_four_producers_others_continue() -> None:
    name = unique("kill4")
    with watchdog(90), Ring.create(name, experience.Probe64, 16, multi_producer=True) as ring:
        consumer = ring.consumer()
        victim = start(produce_forever, name, 64, 9)
        procs = [start(produce, name, 64, p, 2000, 4, 10 + p) for p in range(3)]
        got = []
        killed = False
        while True:
            try:
                batch = consumer.take(32, timeout=20)
            except PeerDiedError:
                break
            except ChannelClosedError:  # the others closed before the victim attached
                assert not killed
                time.sleep(0.02)
                continue
            got.append(batch.copy())
            batch.release()
            seen = {int(p) for g in got for p in np.unique(g["producer"])}
            # kill only once every producer has attached and sent (a late starter under load
            # would otherwise find the ring ended: the consumer stops at the death)
            if not killed and seen >= {0, 1, 2, 9} and sum(len(g) for g in got) > 3000:
                os.kill(victim.pid, signal.SIGKILL)
                victim.join(10)
                killed = True
        for proc in procs:
            stop(proc)
        records = np.concatenate(got)
        assert check_probe(records).all()
        for p in range(3):
            assert records["index"][records["producer"] == p].tolist() == list(range(2000))
        victims = records["index"][records["producer"] == 9]
        assert victims.tolist() == list(range(len(victims)))  # a prefix: in order, no gap
        assert ring.lost <= 4  # at most the victim's one reservation


def test_sigkill_consumer_unblocks_producer_with_typed_error() -> None:
    name = unique("killc")
    with watchdog(60), Ring.create(name, experience.Probe64, 8) as ring:
        producer = ring.producer()
        ready = CTX.Event()
        proc = start(consume_forever, name, 64, ready)
        assert ready.wait(20)
        producer.push(_probes(0, 8), timeout=5)  # full
        while ring.stats()["held"] != 1:  # the child holds record 0
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        with pytest.raises(PeerDiedError):
            producer.reserve(timeout=10)
        # a new consumer takes the lease over and gets every record the dead one did not take
        consumer = ring.consumer()
        batch = consumer.take(8, timeout=0)
        assert batch.field("index").tolist() == list(range(1, 8))
        batch.release()


def test_stale_ring_of_a_dead_owner_is_replaced_live_one_never() -> None:
    name = unique("stale")
    with watchdog(60):
        ready = CTX.Event()
        proc = start(create_and_hang, name, ready)
        assert ready.wait(20)
        with pytest.raises(ChannelInUseError):
            Ring.create(name, experience.Probe64, 8)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        listed = [s for s in list_segments() if s.path.endswith(name)]
        assert listed and listed[0].stale and listed[0].kind == "ring"
        with Ring.create(name, experience.Probe64, 8) as ring:  # replaced on create
            assert ring.segment.owner_pid == os.getpid()
        proc = start(create_and_hang, name, ready := CTX.Event())
        assert ready.wait(20)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert channels_cli(["--cleanup", "--json"]) == 0  # python -m transport.channels
        assert not os.path.exists(listed[0].path)
        with Ring.create(name, experience.Probe64, 8) as ring:
            assert ring.segment.owner_pid == os.getpid()


def test_open_checks_record_type_and_single_producer_lease() -> None:
    name = unique("fp")
    with watchdog(30), Ring.create(name, experience.Probe64, 8) as ring:
        with pytest.raises(ChannelMismatchError, match="fingerprint"):
            Ring.open(name, experience.Probe2557, timeout=1)
        first = ring.producer()
        with pytest.raises(ChannelInUseError):
            Ring.open(name, experience.Probe64, timeout=1).producer()
        first.close()
        ring.consumer()
        with pytest.raises(ChannelInUseError):
            ring.consumer()  # the lease holder is alive (this process)


def test_batches_released_out_of_order_free_records_oldest_first() -> None:
    with watchdog(30), Ring.create(unique("order"), experience.Probe64, 8) as ring:
        producer, consumer = ring.producer(), ring.consumer()
        producer.push(_probes(0, 8))
        older = consumer.take(3, timeout=0)
        younger = consumer.take(3, timeout=0)
        younger.release()  # must not free the older batch's slots
        assert ring.stats()["held"] == 6
        with pytest.raises(ChannelTimeoutError):
            producer.reserve(timeout=0.1)
        assert older.field("index").tolist() == [0, 1, 2] and check_probe(older.copy()).all()
        older.release()  # now both go
        assert ring.stats()["held"] == 0
        producer.push(_probes(8, 6), timeout=1)


def test_overwrite_producer_takes_back_a_dead_consumers_records() -> None:
    name = unique("owdead")
    with watchdog(60), Ring.create(name, experience.Probe64, 8, policy="overwrite") as ring:
        producer = ring.producer()
        ready = CTX.Event()
        proc = start(consume_forever, name, 64, ready)
        assert ready.wait(20)
        producer.push(_probes(0, 8), timeout=5)
        while ring.stats()["held"] != 1:  # the child holds record 0 (slot 0)
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        producer.push(_probes(8, 8), timeout=10)  # slot 0 is free again once the death is seen
        assert ring.stats()["held"] == 0 and ring.overwritten >= 7
