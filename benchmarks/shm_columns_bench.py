"""The shm column layout against the derived slot layout (issue 25 item 2), end to end.

    python benchmarks/shm_columns_bench.py [--envs 256] [--steps 25]

A Python server (the contract env) and a Python client over shm://, schema/image_columns.toml
(``[env] shm = "columns"``) and the same schema with the derived slot layout: the median step
time of each, then the server's row -> column copy alone (every result field of N envs, one
vectorised copy each: what the column layout adds to a step on the server). A measurement,
not a test: it asserts nothing. The contract env writes every element of its results from a
hash, so its step time dwarfs the transport's; the copy line isolates the layout's cost.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transport.api import connect  # noqa: E402
from transport.backends.shm.region import ShmLayout, column_views  # noqa: E402
from transport.codec import Schema  # noqa: E402
from transport.generated import image_columns  # noqa: E402
from transport.schema import load_schema  # noqa: E402
from transport.testing.servers import ServeProcess  # noqa: E402

COLUMNS_FILE = ROOT / "schema" / "image_columns.toml"


def step_ms(path: Path, label: str, n: int, steps: int) -> float:
    """Median ms of ``client.step`` (N actions) against a Python contract server over shm."""
    url = f"shm://columns-bench-{label}-{os.getpid()}?num_envs={n}"
    server = ServeProcess(url, str(path), num_envs=n, max_body=1 << 26, ready_timeout=120)
    try:
        with connect(server.url, Schema(load_schema(path)), autoreset="next_step") as client:
            client.reset(seed=1)
            actions = np.zeros(n, dtype=np.int32)  # action 0 is never masked (contract env)
            times = []
            for _ in range(steps + 3):
                start = time.perf_counter()
                client.step(actions)
                times.append(time.perf_counter() - start)
            return statistics.median(times[3:]) * 1e3
    finally:
        server.stop()


def copy_ms(n: int, reps: int = 50) -> float:
    """Median ms of the server's row -> column copy of N results (every field)."""
    layout = ShmLayout.of(image_columns.SCHEMA)
    rows = np.zeros(n, dtype=layout.result_dtype)
    rows["observation"] = 7
    buffer = mmap.mmap(-1, layout.region_size(n))
    _, columns = column_views(layout, buffer, n)
    pairs = [(columns[name], rows[name]) for name in columns]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for column, field in pairs:
            column[:n] = field[:n]
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=25)
    args = parser.parse_args(argv)
    n = args.envs
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = Path(tmp) / "image_rows.toml"
        text = COLUMNS_FILE.read_text().replace('shm = "columns"\n', "")
        rows_file.write_text(text.replace('name = "image_columns"', 'name = "image_rows"'))
        columns = step_ms(COLUMNS_FILE, "columns", n, args.steps)
        rows = step_ms(rows_file, "rows", n, args.steps)
    copy = copy_ms(n)
    print(f"N={n} image u8[3,84,84], Python server + client over shm, median per step:")
    print(f"  column layout {columns:.2f} ms, derived slot layout {rows:.2f} ms")
    print(f"  the server's row -> column copy (all result fields): {copy:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
