"""transport-probe prints env-steps/s (issue 24 item 4): a column of the table, one summary line
per batch size naming every backend x server row's env-steps/s, the same in the markdown block
and in --help; and a real ``--batch 256`` run prints it for its row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.test_probe_report import ORDER, floors, make_row, results_with
from transport.probe import report
from transport.probe.loops import LoopStats
from transport.probe.runner import Row


def _rows() -> list[Row]:
    """make_row: 100 round trips in 0.1 s (1000 round trips/s, x batch env-steps/s)."""
    slow = make_row("http", "node", 2000.0, batch=256)
    slow.stats = LoopStats(50, 10**8)  # 500 round trips/s
    return [
        slow,
        make_row("unix", "python", 1000.0, batch=256),
        make_row("unix", "python", 300.0, batch=64),
        make_row("unix", "python", 50.0, message="health"),
    ]


def test_the_table_has_an_env_steps_column() -> None:
    results = results_with(_rows(), floors((64, 256)))
    table = report.text_table(report.transport_rows(results, ORDER))
    header = table.splitlines()[0]
    assert "  env-steps/s  " in header and "steps/s" not in header.replace("env-steps/s", "")
    column = [c for c, _ in report.COLUMNS].index("env-steps/s")  # cells hold no spaces
    cells = {tuple(line.split()[:3]): line.split()[column] for line in table.splitlines()[2:]}
    assert cells[("unix", "python", "256")] == "256,000"
    assert cells[("http", "node", "256")] == "128,000"
    assert cells[("unix", "python", "64")] == "64,000"
    assert cells[("unix", "python", "health")] == "-"


def test_the_summary_gives_env_steps_per_backend_per_batch() -> None:
    results = results_with(_rows(), floors((64, 256)))
    rows = report.transport_rows(results, ORDER)
    lines = report.throughput_lines(rows)
    assert lines == [
        "env-steps/s at batch 64: unix Python 64,000",
        "env-steps/s at batch 256: unix Python 256,000, http Node 128,000",
    ]
    text = report.summary_text(rows)
    assert text.splitlines()[-1].strip() == lines[-1]
    machine = {"cpu_model": "cpu", "cpu_count": 2, "affinity": "0-1", "kernel": "linux"}
    machine |= {"python": "3", "node": None, "pyzmq": None, "libzmq": None, "numpy": "2"}
    block = report.markdown_block(results, machine, "transport-probe --batch 256", ORDER)
    assert f"- {lines[-1]}" in block and "| env-steps/s |" in block
    assert report.throughput_lines([]) == []


def test_help_explains_env_steps() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "transport.tools.probe_cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "env-steps/s" in out and "--batch 256" in out


def test_a_batch_256_run_prints_env_steps(tmp_path: Path) -> None:
    """One short real row (unix, Python server, 256 envs): the table, the summary line and the
    JSON agree on its env-steps/s."""
    out = tmp_path / "probe.json"
    argv = [sys.executable, "-m", "transport.tools.probe_cli", "--backends", "unix"]
    argv += ["--lang", "python", "--batch", "256", "--no-floor", "--no-plot", "--quiet"]
    argv += ["--count", "30", "--warmup", "5", "--duration", "0.3", "--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["batch"] == 256 and row["steps_per_s"] > 0
    match = re.search(r"env-steps/s at batch 256: unix Python ([\d,]+)", done.stdout)
    assert match is not None, done.stdout
    # the line prints the rate to the unit, the JSON keeps it to 0.1: within 0.5 + 0.05
    assert abs(int(match.group(1).replace(",", "")) - row["steps_per_s"]) <= 0.55
