"""The outputs of a run: the text table, the JSON document and the RESULTS.md block.

The table, the JSON rows and the plot are all computed from the same ``Row`` histograms.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from transport.probe.floor import FLOOR_OF_SCHEME, REFERENCE, native_floor_source
from transport.probe.machine import summary
from transport.probe.runner import Results, Row, Settings

SCHEMA_VERSION = 1
BEGIN = "<!-- probe:begin -->"
END = "<!-- probe:end -->"

COLUMNS = (
    ("backend", "<"),
    ("server", "<"),
    ("batch", ">"),
    ("payload B", ">"),
    ("p50 us", ">"),
    ("p90 us", ">"),
    ("p99 us", ">"),
    ("p99.9 us", ">"),
    ("max us", ">"),
    ("steps/s", ">"),
    ("x floor", ">"),
)


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table_cells(row: Row) -> list[str]:
    batch = "health" if row.point.message == "health" else str(row.point.batch)
    steps = f"{row.steps_per_s:,.0f}" if row.point.message == "step" else "-"
    ratio = "-"
    if row.ratio_to_floor is not None:
        r = row.ratio_to_floor
        ratio = f"{r:.1f}" if r >= 1 else f"{r:.2g}"
    return [
        row.backend,
        row.server,
        batch,
        f"{row.payload_bytes:,}",
        _num(row.us(50)),
        _num(row.us(90)),
        _num(row.us(99)),
        _num(row.us(99.9)),
        _num(row.hist.max / 1000.0),
        steps,
        ratio,
    ]


def sorted_rows(results: Results, order: list[str]) -> list[Row]:
    rank = {name: i for i, name in enumerate(order)}
    lang = {"python": 0, "node": 1}
    return results.floors + sorted(
        results.rows,
        key=lambda r: (
            rank.get(r.backend, len(rank)),
            r.backend,
            lang.get(r.server, 2),
            r.payload_bytes,
        ),
    )


def text_table(rows: list[Row]) -> str:
    header = [name for name, _ in COLUMNS]
    body = [table_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [f"{c:{align}{w}}" for c, (_, align), w in zip(cells, COLUMNS, widths, strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in body]
    return "\n".join(out)


def markdown_table(rows: list[Row]) -> str:
    header = [name for name, _ in COLUMNS]
    aligns = ["---" if a == "<" else "---:" for _, a in COLUMNS]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(aligns) + "|"]
    out += ["| " + " | ".join(table_cells(r)) + " |" for r in rows]
    return "\n".join(out)


def problems_text(results: Results) -> str:
    lines: list[str] = []
    for kind, problems in (("skipped", results.skipped), ("FAILED", results.failed)):
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for p in problems:
            key = (p.backend, p.server, p.reason)
            batch = "-" if p.batch is None else str(p.batch)
            if batch not in grouped.setdefault(key, []):
                grouped[key].append(batch)
        for (backend, server, reason), batches in grouped.items():
            lines.append(f"{kind}: {backend}/{server} (batch {','.join(batches)}): {reason}")
    return "\n".join(lines)


def settings_json(settings: Settings) -> dict[str, Any]:
    return {
        "backends": settings.backends,
        "langs": settings.langs,
        "points": [
            {"batch": p.batch, "message": p.message, "target_bytes": p.target_bytes}
            for p in settings.points
        ],
        "count": settings.count,
        "warmup": settings.warmup,
        "duration_s": settings.duration,
        "mode": "closed" if settings.rate is None else "open",
        "rate": settings.rate,
        "timeout_s": settings.timeout,
        "env": "echo",
        "histogram": "log buckets, 2 significant digits (<= 0.78 % bucket width), ns",
    }


FLOOR_DEFINITION = (
    "ratio_to_floor = row p50 / the p50 of the floor that applies to the row: the raw floor "
    "(raw-<scheme>) of its scheme and server language at the same batch where there is one, "
    f"else floor_of_backend (the same batch for socket floors; {REFERENCE} for any other backend)"
)


def document(
    results: Results,
    settings: Settings,
    machine: dict[str, Any],
    command: str,
    order: list[str],
) -> dict[str, Any]:
    floor = results.reference_floor
    return {
        "tool": "transport-probe",
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "started": datetime.fromtimestamp(results.started, UTC).isoformat(),
        "elapsed_s": round(results.elapsed_s, 2),
        "machine": machine,
        "settings": settings_json(settings),
        "floor": {
            "reference": floor.backend if floor is not None else None,
            "reference_p50_us": floor.p50_us if floor is not None else None,
            "definition": FLOOR_DEFINITION,
            "floor_of_backend": dict(FLOOR_OF_SCHEME),
            "source": native_floor_source(),
        },
        "rows": [r.to_json() for r in sorted_rows(results, order)],
        "skipped": [p.to_json() for p in results.skipped],
        "failed": [p.to_json() for p in results.failed],
        "ok": not results.failed,
    }


def write_json(doc: dict[str, Any], path: str) -> None:
    text = json.dumps(doc, indent=1) + "\n"
    if path == "-":
        print(text, end="")
        return
    _atomic_write(Path(path), text)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def markdown_block(
    results: Results, machine: dict[str, Any], command: str, order: list[str]
) -> str:
    """The text between (and including) the probe markers."""
    when = datetime.fromtimestamp(results.started, UTC).strftime("%Y-%m-%d %H:%M UTC")
    floor_text = (
        "`x floor` = p50 / the p50 of the floor that applies to the row: `raw-<scheme>` of the "
        "same server language and bytes (a bare echo server on the same socket stack, no "
        "protocol) where there is one, else `c-floor-spin` for shm, `c-floor-unix` of the same "
        "bytes for unix and zmq+ipc, `c-floor-tcp` of the same bytes for http and zmq+tcp"
        if results.floors
        else "`x floor`: no floor measured"
    )
    parts = [
        BEGIN,
        "## transport-probe: step round trips, every backend, one run",
        "",
        "Generated by `transport-probe` (do not edit by hand: the next run rewrites this block).",
        "",
        "```",
        command,
        "```",
        "",
        f"{when}, commit {machine.get('transport_commit') or 'n/a'}. Machine: {summary(machine)}.",
        "",
        "Echo env (transport cost only); a round trip of batch B is one batched step of B envs "
        f"(`payload B` = response bytes). Latencies from log-bucket histograms; {floor_text}. "
        "See docs/probe.md.",
        "",
        markdown_table(sorted_rows(results, order)),
    ]
    problems = problems_text(results)
    if problems:
        parts += ["", *[f"- {line}" for line in problems.splitlines()]]
    parts.append(END)
    return "\n".join(parts)


def replace_block(existing: str | None, block: str, begin: str = BEGIN, end: str = END) -> str:
    """``existing`` with its block between ``begin`` and ``end`` replaced by ``block`` (appended
    if it has none). Everything outside the markers is kept byte for byte."""
    if existing is None or existing == "":
        return "# Benchmark results\n\n" + block + "\n"
    start = existing.find(begin)
    if start >= 0:
        stop = existing.find(end, start)
        if stop < 0:
            raise ValueError(f"the file has {begin} but no {end} after it: fix it by hand")
        return existing[:start] + block + existing[stop + len(end) :]
    sep = "" if existing.endswith("\n\n") else ("\n" if existing.endswith("\n") else "\n\n")
    return existing + sep + block + "\n"


def update_markdown(path: str, block: str, begin: str = BEGIN, end: str = END) -> None:
    target = Path(path)
    existing = target.read_text() if target.exists() else None
    _atomic_write(target, replace_block(existing, block, begin, end))
