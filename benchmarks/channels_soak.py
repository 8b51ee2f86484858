"""The board's torn-read stress and the idle-CPU check of the channels (issue 13).

  python -m benchmarks.channels_soak [--seconds 60] [--json out.json]

Torn reads: for each mode, one publisher process publishes checksummed versions back to back
(4 MB: every element derives from the version, and a crc32 of the payload is published with
it) while two Python reader processes and one Node reader read as fast as they can for
``--seconds``; every read is checked. Goal: zero torn or mixed reads.

Idle CPU: a consumer blocked in ``take`` on an empty ring, a producer blocked in ``reserve`` on a
full one, a board reader in ``wait_newer`` and a member in ``wait_stop``: their CPU time over
3 s (from /proc/<pid>/stat). Goal: 0%.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transport.channels import ChannelTimeoutError, PolicyBoard, Ring, RunControl
from transport.generated import experience

CTX = mp.get_context("spawn")
ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "node_bridge" / "dist" / "channels" / "probe_cli.js"
WORDS = 1 << 20  # 4 MB of float32


def arrays(version: int) -> dict[str, np.ndarray]:
    """tests/channels_util.py ``board_arrays`` shapes (the Node reader checks the same rule),
    plus a big array and its crc32."""
    big = np.full(WORDS, version * 3 + 2, dtype=np.float32)
    out = {
        "w0": np.full(1000, version * 3, dtype=np.float32),
        "w1": np.full(37, version * 3 + 1, dtype=np.float32),
        "w2": big,
        "tag": np.array([version, version ^ 0x5A5A], dtype=np.int64),
    }
    return out


def consistent(version: int, got: dict[str, np.ndarray]) -> bool:
    if got["tag"].tolist() != [version, version ^ 0x5A5A]:
        return False
    return all(bool((got[f"w{i}"] == version * 3 + i).all()) for i in range(3))


def publisher(name: str, seconds: float, result: Any) -> None:
    board = PolicyBoard.open(name, timeout=10)
    deadline = time.monotonic() + seconds
    version = 0
    crc = []
    while time.monotonic() < deadline:
        a = arrays(version + 1)
        crc.append(zlib.crc32(a["w2"].tobytes()))
        version = board.publish(a)
    board.close()
    result.put(("publisher", version, len(set(crc)) == len(crc)))


def reader(name: str, seconds: float, result: Any) -> None:
    board = PolicyBoard.open(name, timeout=10)
    out = None
    reads = torn = last = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        version, out = board.read(out, timeout=30)
        if version == 0:
            continue
        reads += 1
        if not consistent(version, out) or version < last:
            torn += 1
        last = version
    board.close()
    result.put(("reader", reads, torn))


def torn_reads(seconds: float) -> list[dict[str, Any]]:
    rows = []
    for mode in ("double_buffer", "seqlock"):
        name = f"soak-{os.getpid()}-{mode}"
        with PolicyBoard.create(name, arrays(0), mode=mode) as board:  # type: ignore[arg-type]
            q = CTX.Queue()
            procs = [
                CTX.Process(target=reader, args=(name, seconds, q), daemon=True) for _ in range(2)
            ]
            procs.append(CTX.Process(target=publisher, args=(name, seconds, q), daemon=True))
            for p in procs:
                p.start()
            node = None
            if CLI.is_file():
                node = subprocess.Popen(
                    ["node", str(CLI), "board-read", name, str(seconds)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            got = [q.get(timeout=seconds + 120) for _ in procs]
            for p in procs:
                p.join(30)
            node_result = {"reads": 0, "torn": 0}
            if node is not None:
                out, _ = node.communicate(timeout=120)
                node_result = json.loads(out.strip().splitlines()[-1])
            readers = [g for g in got if g[0] == "reader"]
            pub = next(g for g in got if g[0] == "publisher")
            row = {
                "bench": "soak",
                "mode": mode,
                "seconds": seconds,
                "versions": pub[1],
                "python_reads": sum(r[1] for r in readers),
                "python_torn": sum(r[2] for r in readers),
                "node_reads": node_result["reads"],
                "node_torn": node_result["torn"],
                "final_consistent": consistent(*board.read()),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_take(name: str) -> None:
    ring = Ring.open(name, experience.Probe64)
    consumer = ring.consumer()
    try:
        consumer.take(1, timeout=6)
    except ChannelTimeoutError:
        pass


def idle_reserve(name: str) -> None:
    ring = Ring.open(name, experience.Probe64)
    producer = ring.producer()
    producer.push(experience.Probe64.zeros(ring.capacity))
    try:
        producer.reserve(timeout=6)
    except ChannelTimeoutError:
        pass


def idle_board(name: str) -> None:
    board = PolicyBoard.open(name)
    try:
        board.wait_newer(0, timeout=6)
    except ChannelTimeoutError:
        pass


def idle_control(name: str) -> None:
    RunControl.open(name).wait_stop(6)


def idle_cpu() -> list[dict[str, Any]]:
    rows = []
    pid = os.getpid()
    cases = [
        ("consumer in take", Ring.create(f"idle1-{pid}", experience.Probe64, 8), idle_take),
        ("producer in reserve", Ring.create(f"idle2-{pid}", experience.Probe64, 8), idle_reserve),
        ("reader in wait_newer", PolicyBoard.create(f"idle3-{pid}", arrays(0)), idle_board),
        ("member in wait_stop", RunControl.create(f"idle4-{pid}"), idle_control),
    ]
    for what, channel, target in cases:
        proc = CTX.Process(target=target, args=(channel.segment.name,), daemon=True)
        proc.start()
        time.sleep(2.0)  # import, attach, spin budget spent
        before = cpu_seconds(proc.pid)
        time.sleep(3.0)
        used = cpu_seconds(proc.pid) - before
        proc.join(10)
        channel.close()
        row = {"bench": "idle", "what": what, "cpu_percent": 100 * used / 3.0}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    rows = idle_cpu() + torn_reads(args.seconds)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r.get("python_torn") or r.get("node_torn")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
