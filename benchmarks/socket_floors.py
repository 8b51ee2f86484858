"""Socket backends against their raw floors (issue 17 item 9), over several probe runs.

    python benchmarks/socket_floors.py [--rounds 5] [--batch 1] [--markdown benchmarks/RESULTS.md]

Runs `transport-probe --backends unix,zmq+ipc,zmq+tcp,http --batch B` ``--rounds`` times and
keeps, per row, the best p50 of the rounds (the least disturbed by the machine's other tenants;
wake-ups on this VM are bimodal) and the median of the rounds' p50s; each transport row is set
next to the raw floor of its scheme and server language (transport/probe/raw.py) or, for Python
http, the C TCP floor. Goal: every ratio <= 1.2 at batch 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- socket-floors:begin -->"
END = "<!-- socket-floors:end -->"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", default="1")
    parser.add_argument("--backends", default="unix,zmq+ipc,zmq+tcp,http")
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    p50s: dict[tuple[str, str, int], list[float]] = {}
    floor_of: dict[tuple[str, str, int], str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            out = Path(tmp) / f"round{i}.json"
            command = [
                sys.executable, "-m", "transport.tools.probe_cli", "--backends", args.backends,
                "--batch", args.batch, "--no-plot", "--quiet", "--json", str(out),
            ]  # fmt: skip
            subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            for row in json.loads(out.read_text())["rows"]:
                key = (row["backend"], row["server"], row["batch"])
                p50s.setdefault(key, []).append(row["p50_us"])
                if row.get("floor"):
                    floor_of[key] = row["floor"]
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    lines = [
        "| backend | server | batch | best p50 us | median p50 us | floor | floor best p50 us "
        "| best / floor best | median / floor median |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for key, values in sorted(p50s.items()):
        backend, server, batch = key
        if backend.startswith(("raw-", "c-floor")):
            continue
        floor = floor_of.get(key, "")
        fkey = (floor, server if floor.startswith("raw-") else "c", batch)
        fvalues = p50s.get(fkey) or p50s.get((floor, "c", 1), [])
        best, median = min(values), statistics.median(values)
        fbest = min(fvalues) if fvalues else float("nan")
        fmedian = statistics.median(fvalues) if fvalues else float("nan")
        lines.append(
            f"| {backend} | {server} | {batch} | {best:.1f} | {median:.1f} | {floor} "
            f"| {fbest:.1f} | {best / fbest:.2f} | {median / fmedian:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.markdown is not None:
        text = args.markdown.read_text() if args.markdown.exists() else ""
        block = f"{BEGIN}\n{table}\n{END}"
        if BEGIN in text and END in text:
            text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
        else:
            text += "\n" + block + "\n"
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
