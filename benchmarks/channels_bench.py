"""Benchmarks of the channels (issue 13), in one run: rings next to multiprocessing.Queue,
faster-fifo and a shared_memory + lock ring written the obvious way; the policy board next to
torch share_memory_() tensors under a lock, pickling through a pipe, and a plain memcpy.

Run (or through pytest: benchmarks/test_channels_bench.py):
  python -m benchmarks.channels_bench [--quick] [--json out.json]

Ring rows: P producer processes send N records of the record size each to one consumer (this
process). records/s = all records / (first send .. last receive). Latency: a separate paced run
(one producer, a record every 200 us): receive time - send time (CLOCK_MONOTONIC, both
processes), p50 and p99. Board rows: median seconds of one publish / one read.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import platform
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transport.channels import ChannelClosedError, PeerDiedError, PolicyBoard, Ring
from transport.generated import experience

CTX = mp.get_context("spawn")
BATCH = 64


def _record(size: int) -> Any:
    return experience.Probe64 if size == 64 else experience.Probe2557


def _now() -> int:
    return time.monotonic_ns()


def _pace(interval_ns: int, last: int) -> int:
    target = last + interval_ns
    while _now() < target:
        pass
    return target


# -- producers (child processes) -------------------------------------------------------------


def ring_producer(
    name: str, size: int, p: int, n: int, pace_ns: int, go: Any, wait: str = "futex"
) -> None:
    ring = Ring.open(name, _record(size), timeout=20, wait=wait)
    prod = ring.producer()
    template = _record(size).zeros(BATCH)
    template["producer"] = p
    go.wait()
    sent = 0
    last = _now()
    while sent < n:
        want = 1 if pace_ns else min(BATCH, n - sent)
        if pace_ns:
            last = _pace(pace_ns, last)
        view = prod.reserve_many(want, timeout=60)
        k = len(view)
        view[...] = template[:k]
        view["index"] = np.arange(sent, sent + k)
        view["send_ns"] = _now()
        prod.commit()
        sent += k
    prod.close()
    ring.close()


def queue_producer(kind: str, q: Any, size: int, p: int, n: int, pace_ns: int, go: Any) -> None:
    payload = bytearray(size)
    go.wait()
    last = _now()
    if kind == "faster-fifo" and not pace_ns:
        sent = 0
        while sent < n:
            k = min(BATCH, n - sent)
            msgs = []
            for _ in range(k):
                payload[:8] = _now().to_bytes(8, "little")
                msgs.append(bytes(payload))
            q.put_many(msgs, timeout=60)
            sent += k
    else:
        for _ in range(n):
            if pace_ns:
                last = _pace(pace_ns, last)
            payload[:8] = _now().to_bytes(8, "little")
            q.put(bytes(payload), timeout=60)
    q.put(None, timeout=60)


class LockRing:
    """The obvious shared_memory ring: one lock, head and tail in shared Values, bytes copied
    in and out under the lock, sleep(0) while empty or full."""

    def __init__(self, size: int, capacity: int) -> None:
        self.size = size
        self.capacity = capacity
        self.shm = shared_memory.SharedMemory(create=True, size=size * capacity)
        self.lock = CTX.Lock()
        self.head = CTX.Value("q", 0, lock=False)
        self.tail = CTX.Value("q", 0, lock=False)
        self.done = CTX.Value("i", 0, lock=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["shm"] = self.shm.name
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.shm = shared_memory.SharedMemory(name=state["shm"])

    def put(self, data: bytes) -> None:
        while True:
            with self.lock:
                if self.head.value - self.tail.value < self.capacity:
                    at = (self.head.value % self.capacity) * self.size
                    self.shm.buf[at : at + self.size] = data
                    self.head.value += 1
                    return
            time.sleep(0)

    def get(self) -> bytes | None:
        with self.lock:
            if self.tail.value < self.head.value:
                at = (self.tail.value % self.capacity) * self.size
                data = bytes(self.shm.buf[at : at + self.size])
                self.tail.value += 1
                return data
        return None


def lockring_producer(r: LockRing, size: int, p: int, n: int, pace_ns: int, go: Any) -> None:
    payload = bytearray(size)
    go.wait()
    last = _now()
    for _ in range(n):
        if pace_ns:
            last = _pace(pace_ns, last)
        payload[:8] = _now().to_bytes(8, "little")
        r.put(bytes(payload))
    with r.lock:
        r.done.value += 1
    r.shm.close()


# -- one ring row ------------------------------------------------------------------------------


def run_ring(kind: str, size: int, producers: int, n: int, pace_ns: int = 0) -> dict[str, Any]:
    """Records/s and latency percentiles of one transport."""
    go = CTX.Event()
    lat: list[np.ndarray] = []
    received = 0
    procs = []
    resource: Any = None
    if kind.startswith("ring"):
        wait = "balanced" if kind == "ring-balanced" else "futex"
        name = f"bench-{os.getpid()}-{size}-{producers}-{pace_ns}"
        resource = Ring.create(name, _record(size), 1024, multi_producer=producers > 1, wait=wait)
        consumer = resource.consumer()
        procs = [
            CTX.Process(
                target=ring_producer, args=(name, size, p, n, pace_ns, go, wait), daemon=True
            )
            for p in range(producers)
        ]
    elif kind in ("mp.Queue", "faster-fifo"):
        if kind == "mp.Queue":
            resource = CTX.Queue(maxsize=1024)
        else:
            import faster_fifo

            resource = faster_fifo.Queue(max_size_bytes=1024 * (size + 64))
        procs = [
            CTX.Process(
                target=queue_producer, args=(kind, resource, size, p, n, pace_ns, go), daemon=True
            )
            for p in range(producers)
        ]
    else:
        resource = LockRing(size, 1024)
        procs = [
            CTX.Process(
                target=lockring_producer, args=(resource, size, p, n, pace_ns, go), daemon=True
            )
            for p in range(producers)
        ]
    for proc in procs:
        proc.start()
    if kind.startswith("ring"):  # every producer attached: none finds the others closed
        while len(resource.producer_states()) < producers:
            time.sleep(0.01)
    time.sleep(0.5)
    total = producers * n
    go.set()
    t0 = _now()
    give_up = time.monotonic() + 120  # a baseline that stalls ends the row, not the run
    if kind.startswith("ring"):
        while received < total and time.monotonic() < give_up:
            try:
                batch = consumer.take(256, timeout=60)
            except (ChannelClosedError, PeerDiedError):
                break
            now = _now()
            for view in batch.views:
                lat.append(now - view["send_ns"].astype(np.int64))
            received += batch.count
            batch.release()
    elif kind in ("mp.Queue", "faster-fifo"):
        ended = 0
        while ended < producers and time.monotonic() < give_up:
            if kind == "faster-fifo":
                msgs = resource.get_many(timeout=60, max_messages_to_get=256)
            else:
                msgs = [resource.get(timeout=60)]
            now = _now()
            stamps = []
            for m in msgs:
                if m is None:
                    ended += 1
                    continue
                stamps.append(int.from_bytes(m[:8], "little"))
                received += 1
            if stamps:
                lat.append(now - np.array(stamps, dtype=np.int64))
    else:
        while time.monotonic() < give_up:
            data = resource.get()
            if data is None:
                if resource.done.value == producers and resource.tail.value == resource.head.value:
                    break
                time.sleep(0)
                continue
            lat.append(np.array([_now() - int.from_bytes(data[:8], "little")], dtype=np.int64))
            received += 1
    elapsed = (_now() - t0) / 1e9
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    if kind.startswith("ring"):
        consumer.close()
        resource.close()
    elif kind == "shm+lock":
        resource.shm.close()
        resource.shm.unlink()
    latencies = np.concatenate(lat) / 1000.0 if lat else np.zeros(1)
    return {
        "received": received,
        "records_per_s": received / elapsed,
        "mb_per_s": received * size / elapsed / 1e6,
        "p50_us": float(np.percentile(latencies, 50)),
        "p99_us": float(np.percentile(latencies, 99)),
    }


RING_N = {
    "ring": 200_000,
    "ring-balanced": 200_000,
    "faster-fifo": 100_000,
    "shm+lock": 20_000,
    "mp.Queue": 30_000,
}


def ring_rows(quick: bool) -> list[dict[str, Any]]:
    rows = []
    scale = 0.1 if quick else 1.0
    for size in (2557, 64):
        for producers in (1, 4):
            for kind in ("ring", "ring-balanced", "faster-fifo", "shm+lock", "mp.Queue"):
                n = max(1000, int(RING_N[kind] * scale) // producers)
                thr = run_ring(kind, size, producers, n)
                lat = run_ring(kind, size, 1, max(500, int(2000 * scale)), pace_ns=200_000)
                row = {
                    "bench": "ring",
                    "transport": kind,
                    "record_bytes": size,
                    "producers": producers,
                    "records_per_s": thr["records_per_s"],
                    "mb_per_s": thr["mb_per_s"],
                    "loaded_p50_us": thr["p50_us"],
                    "p50_us": lat["p50_us"],
                    "p99_us": lat["p99_us"],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


# -- board ------------------------------------------------------------------------------------


def _weights(total_bytes: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    parts = (0.5, 0.25, 0.2, 0.05)
    return {
        f"layer{i}": rng.random(int(total_bytes * f) // 4, dtype=np.float32)
        for i, f in enumerate(parts)
    }


def _median_time(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def pipe_reader(conn: Any) -> None:
    while True:
        obj = conn.recv()
        if obj is None:
            return
        conn.send(b"k")


def board_rows(quick: bool) -> list[dict[str, Any]]:
    sizes = (1 << 20, 10 << 20) if quick else (1 << 20, 10 << 20, 100 << 20)
    rows = []
    for total in sizes:
        row = board_row(total, {1 << 20: 50, 10 << 20: 15, 100 << 20: 5}[total])
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def board_row(total: int, reps: int) -> dict[str, Any]:
    """One size: memcpy, the board in both modes, torch shared tensors + lock, pickle + pipe."""
    import torch

    w = _weights(total)
    nbytes = sum(a.nbytes for a in w.values())
    out = {k: np.empty_like(v) for k, v in w.items()}

    def memcpy() -> None:
        for k, v in w.items():
            np.copyto(out[k], v)

    row: dict[str, Any] = {
        "bench": "board",
        "bytes": nbytes,
        "memcpy_s": _median_time(memcpy, reps),
    }
    for mode in ("double_buffer", "seqlock"):
        name = f"bench-{os.getpid()}-{mode}-{total}"
        with PolicyBoard.create(name, w, mode=mode) as board:  # type: ignore[arg-type]
            row[f"{mode}_publish_s"] = _median_time(lambda b=board: b.publish(w), reps)
            row[f"{mode}_read_s"] = _median_time(lambda b=board: b.read(out), reps)
    shared = {k: torch.from_numpy(v.copy()).share_memory_() for k, v in w.items()}
    src = {k: torch.from_numpy(v) for k, v in w.items()}
    dst = {k: torch.from_numpy(v) for k, v in out.items()}
    lock = CTX.Lock()

    def torch_publish() -> None:
        with lock:
            for k, t in shared.items():
                t.copy_(src[k])

    def torch_read() -> None:
        with lock:
            for k, t in shared.items():
                dst[k].copy_(t)

    row["torch_shared_lock_publish_s"] = _median_time(torch_publish, reps)
    row["torch_shared_lock_read_s"] = _median_time(torch_read, reps)
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=pipe_reader, args=(child,), daemon=True)
    proc.start()

    def pickled() -> None:
        parent.send(w)
        parent.recv()

    pickled()  # warm-up
    row["pickle_pipe_s"] = _median_time(pickled, max(3, reps // 3))
    row["pickle_bytes"] = len(pickle.dumps(w, protocol=pickle.HIGHEST_PROTOCOL))
    parent.send(None)
    proc.join(30)
    return row


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    system = f"Linux {platform.release()}, Python {platform.python_version()}"
    return f"{model}, {os.cpu_count()} CPUs, {system}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a tenth of the records, no 100 MB board"
    )
    parser.add_argument("--json", default="", help="write every row here")
    parser.add_argument("--only", choices=("ring", "board"), default=None)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    if args.only in (None, "ring"):
        rows += ring_rows(args.quick)
    if args.only in (None, "board"):
        rows += board_rows(args.quick)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
