"""The channel benchmarks under pytest, with the goals of issue 13 checked on the numbers.

  pytest benchmarks/test_channels_bench.py --benchmark-enable -s        # quick sizes
  python -m benchmarks.channels_bench --json out.json                     # the full run
  python -m benchmarks.channels_soak --seconds 60                         # torn reads, idle CPU

The goals are reported (printed), not asserted as timings: the machine is shared and the
numbers move; the assertions are the correctness ones (every record arrived).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import channels_bench


@pytest.mark.benchmark(group="channels")
def test_ring_throughput_against_baselines(benchmark: Any) -> None:
    if benchmark.disabled:
        pytest.skip("benchmarks run with --benchmark-enable")
    rows = channels_bench.ring_rows(quick=True)
    by = {(r["transport"], r["record_bytes"], r["producers"]): r for r in rows}
    for size in (2557, 64):
        for producers in (1, 4):
            ring = by[("ring", size, producers)]["records_per_s"]
            for base in ("mp.Queue", "faster-fifo", "shm+lock"):
                ratio = ring / by[(base, size, producers)]["records_per_s"]
                print(f"ring {size} B x{producers}: {ratio:.1f}x {base}")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


@pytest.mark.benchmark(group="channels")
def test_board_against_memcpy(benchmark: Any) -> None:
    if benchmark.disabled:
        pytest.skip("benchmarks run with --benchmark-enable")
    for row in channels_bench.board_rows(quick=True):
        for mode in ("double_buffer", "seqlock"):
            ratio = row[f"{mode}_publish_s"] / row["memcpy_s"]
            print(f"board {row['bytes']} B {mode}: publish = {ratio:.2f}x memcpy")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
