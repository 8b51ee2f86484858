"""The outputs of a run: the text table, the JSON document and the RESULTS.md block.

The table, the JSON rows and the plot are all computed from the same ``Row`` histograms.
"""

from __future__ import annotations

import json
import os
import stat
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
    ("env-steps/s", ">"),
    ("x floor", ">"),
    ("floor", "<"),
)
LANG_NAMES = {"python": "Python", "node": "Node", "c": "C"}


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
    ratio = "-" if row.ratio_to_floor is None else _ratio(row.ratio_to_floor)
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
        _floor_cell(row),
    ]


def _ratio(r: float) -> str:
    return f"{r:.1f}" if r >= 1 else f"{r:.2g}"


def _floor_cell(row: Row) -> str:
    """The floor a row is compared with, as the floors section names it."""
    if row.floor_name is None:
        return "-"
    if row.floor_name.startswith("raw-"):
        return f"{row.floor_name}/{row.server}"
    return row.floor_name


def sorted_rows(results: Results, order: list[str]) -> list[Row]:
    """Floors first (the JSON's order), then the transport rows (``transport_rows``)."""
    return results.floors + transport_rows(results, order)


def transport_rows(results: Results, order: list[str]) -> list[Row]:
    """The measured rows: backends in ``order``, python before node, by payload."""
    rank = {name: i for i, name in enumerate(order)}
    lang = {"python": 0, "node": 1}
    return sorted(
        results.rows,
        key=lambda r: (
            rank.get(r.backend, len(rank)),
            r.backend,
            lang.get(r.server, 2),
            r.payload_bytes,
        ),
    )


def _aligned(rows: list[list[str]], aligns: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(aligns))]

    def line(cells: list[str]) -> str:
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, aligns, widths, strict=True))

    out = [line(rows[0]).rstrip(), "  ".join("-" * w for w in widths)]
    return out + [line(r).rstrip() for r in rows[1:]]


def text_table(rows: list[Row]) -> str:
    """The transport rows, one line each (floors: ``floors_text``)."""
    header = [name for name, _ in COLUMNS]
    return "\n".join(_aligned([header, *[table_cells(r) for r in rows]], [a for _, a in COLUMNS]))


def _point_key(row: Row) -> tuple[bool, int, str]:
    return (row.point.message != "health", row.point.batch, row.point.message)


def _point_name(row: Row) -> str:
    return "health" if row.point.message == "health" else f"batch {row.point.batch}"


def _pingpong_line(row: Row) -> str:
    return (
        f"{row.backend} ({row.payload_bytes} bytes each way, applies to every batch): "
        f"p50 {_num(row.us(50))} us, p99 {_num(row.us(99))} us"
    )


def floor_grid(floors: list[Row]) -> tuple[list[str], list[list[str]], list[str]]:
    """The socket floors as one line per floor and server language, one column per batch
    (``p50 (p99)`` us), plus the batch-free shared-memory floors as sentences."""
    pingpong = [_pingpong_line(f) for f in floors if f.point.message == "pingpong"]
    sized = [f for f in floors if f.point.message != "pingpong"]
    points: dict[tuple[bool, int, str], str] = {}
    for f in sorted(sized, key=_point_key):
        points.setdefault(_point_key(f), f"{_point_name(f)} p50 (p99)")
    grid: dict[tuple[str, str], dict[tuple[bool, int, str], str]] = {}
    for f in sized:
        cell = f"{_num(f.us(50))} ({_num(f.us(99))})"
        grid.setdefault((f.backend, f.server), {})[_point_key(f)] = cell
    header = ["floor", "server", *points.values()]
    lines = [
        [name, server, *(cells.get(k, "-") for k in points)]
        for (name, server), cells in grid.items()
    ]
    return header, lines, pingpong


def floors_text(floors: list[Row]) -> str:
    """The floors section: what no transport of that kind can beat on this machine."""
    if not floors:
        return ""
    header, lines, pingpong = floor_grid(floors)
    out = ["floors (us; what no transport waiting that way or on that socket can beat):"]
    out += [f"  {line}" for line in pingpong]
    if lines:
        aligns = ["<", "<", *[">"] * (len(header) - 2)]
        out += [f"  {line}" for line in _aligned([header, *lines], aligns)]
    return "\n".join(out)


DISTURBED = 0.9
"""A row at under this many times its C floor beat it by more than noise: the floor ran while
the machine was busy (``floor_notes``)."""


def _beats_c_floor(row: Row) -> bool:
    """``row`` is under ``DISTURBED`` times its C floor (``c-floor-*``: bytes moved with no
    protocol at all, which no transport can beat; a raw floor is a bare server in Python or
    Node, which a tuned server may beat)."""
    ratio, name = row.ratio_to_floor, row.floor_name
    return (
        not row.is_floor
        and ratio is not None
        and ratio < DISTURBED
        and name is not None
        and name.startswith("c-floor-")
    )


def floor_notes(rows: list[Row]) -> list[str]:
    """One line per C floor that a row beat by more than noise (``_beats_c_floor``): that
    floor ran while a core was taken (a spin floor whose two processes shared one core, another
    job on the machine) and the ratios against it say nothing; the line says so and what to
    do."""
    worst: dict[tuple[str, str], Row] = {}
    for row in rows:
        if not _beats_c_floor(row):
            continue
        key = (_floor_cell(row), _point_name(row))
        if key not in worst or (row.ratio_to_floor or 0.0) < (worst[key].ratio_to_floor or 0.0):
            worst[key] = row
    out = []
    for (floor, point), row in sorted(worst.items()):
        floor_p50 = row.p50_us / (row.ratio_to_floor or 1.0)
        out.append(
            f"{floor} at {point} ({_num(floor_p50)} us p50) is slower than {_who(row)} "
            f"({_num(row.p50_us)} us): the floor ran while a core was taken, so its ratios say "
            "nothing; rerun on a quiet machine (a larger --count evens it out)"
        )
    return out


def _lang(row: Row) -> str:
    return LANG_NAMES.get(row.server, row.server)


def _who(row: Row) -> str:
    return f"{row.backend}, {_lang(row)} server"


def summary_lines(rows: list[Row]) -> list[str]:
    """One sentence per batch size: the fastest row by p50, how many times faster than unix
    (the plain socket every machine has; when unix itself wins, than the runner-up backend),
    and how close it is to its floor."""
    groups: dict[tuple[bool, int, str], list[Row]] = {}
    for row in rows:
        if not row.is_floor:
            groups.setdefault(_point_key(row), []).append(row)
    out: list[str] = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda r: r.p50_us)
        best = group[0]
        what = _point_name(best)
        lead = (
            "fastest here"
            if not out
            else (
                "for health round trips"
                if what == "health"
                else f"for batches of {best.point.batch}"
            )
        )
        if not out and len(groups) > 1:
            lead += f" ({what})"
        text = f"{lead}: {_who(best)}, {_num(best.p50_us)} us p50"
        others = [r for r in group if r.backend != best.backend]
        unix = [r for r in others if r.backend == "unix"]
        if (unix or others) and best.p50_us > 0:
            versus = (unix or others)[0]
            ratio = versus.p50_us / best.p50_us
            text += (
                f", {ratio:.1f}x faster than {versus.backend} "
                f"({_lang(versus)} server, {_num(versus.p50_us)} us)"
            )
        if _beats_c_floor(best):
            text += f", faster than its floor ({_floor_cell(best)}: disturbed, see the floors)"
        elif best.ratio_to_floor is not None:
            text += f", {_ratio(best.ratio_to_floor)}x its floor ({_floor_cell(best)})"
        out.append(text)
    return out


def throughput_lines(rows: list[Row]) -> list[str]:
    """One line per batch size of step rows: each backend x server row's env-steps/s (round
    trips/s x batch), highest first, so ``--batch 256`` answers "how many env steps per second"
    per backend at a glance. Health round trips and floors carry no env steps: left out."""
    groups: dict[int, list[Row]] = {}
    for row in rows:
        if not row.is_floor and row.point.message == "step":
            groups.setdefault(row.point.batch, []).append(row)
    out = []
    for batch in sorted(groups):
        ranked = sorted(groups[batch], key=lambda r: -r.steps_per_s)
        cells = ", ".join(f"{r.backend} {_lang(r)} {r.steps_per_s:,.0f}" for r in ranked)
        out.append(f"env-steps/s at batch {batch}: {cells}")
    return out


def summary_text(rows: list[Row]) -> str:
    lines = summary_lines(rows) + throughput_lines(rows)
    return "\n".join(["summary:", *[f"  {line}" for line in lines]]) if lines else ""


def markdown_table(rows: list[Row]) -> str:
    header = [name for name, _ in COLUMNS]
    aligns = ["---" if a == "<" else "---:" for _, a in COLUMNS]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(aligns) + "|"]
    out += ["| " + " | ".join(table_cells(r)) + " |" for r in rows]
    return "\n".join(out)


def markdown_floors(floors: list[Row]) -> str:
    header, lines, pingpong = floor_grid(floors)
    out = [f"- {line}" for line in pingpong]
    if lines:
        out += ["", "| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def problems_text(results: Results) -> str:
    lines: list[str] = []
    for kind, problems in (("skipped", results.skipped), ("FAILED", results.failed)):
        grouped: dict[tuple[str, str, str, str | None], list[str]] = {}
        for p in problems:
            key = (p.backend, p.server, p.reason, p.env)
            batch = "-" if p.batch is None else str(p.batch)
            if batch not in grouped.setdefault(key, []):
                grouped[key].append(batch)
        for (backend, server, reason, env), batches in grouped.items():
            where = f"batch {','.join(batches)}" + ("" if env is None else f", env {env}")
            lines.append(f"{kind}: {backend}/{server} ({where}): {reason}")
    return "\n".join(lines)


def env_phrase(rows: list[Row], env: str = "echo") -> str:
    """What the servers served: "Echo env (transport cost only)", or the ``--url`` server's.
    ``env`` names it when no row was measured (``Settings.env``: the reference servers' env,
    or for ``--url`` the env the server's HELLO named, "unknown" when none did)."""
    envs = sorted({r.env for r in rows if not r.is_floor}) or [env]
    if envs == ["unknown"]:
        return "unknown env (the server's own: no handshake named it)"
    if envs == ["echo"]:
        return "Echo env (transport cost only)"
    if envs == ["vector-echo"]:
        return "Vector echo env (one object steps all envs: transport cost only)"
    return f"{', '.join(envs)} env (the server's own env: its step cost is included)"


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
        "env": settings.env,
        "histogram": "log buckets, 2 significant digits (<= 0.78 % bucket width), ns",
    }


FLOOR_RULE = (
    "p50 / the p50 of the floor that applies to the row (column floor): for sockets the raw "
    "floor raw-<scheme> of its scheme and server language at the same batch (a bare echo "
    "server on the same socket stack, no protocol), else the C socket floor of its bytes "
    "(c-floor-unix for unix and zmq+ipc, c-floor-tcp for http and zmq+tcp); for shm "
    "c-floor-shm (the row's request and response bytes copied through a shared mapping, "
    "spin-waited hand-offs) when the row waits by spinning (wait policy balanced or spin; "
    "c-floor-spin, 4 bytes, where c-floor-shm was not measured), "
    f"{REFERENCE} when it sleeps (wait=futex); {REFERENCE} for anything else"
)
FLOOR_DEFINITION = f"ratio_to_floor = {FLOOR_RULE}"
FLOOR_RULE_SHORT = (
    "p50 / the p50 of the floor in column floor (shm: c-floor-shm, the same bytes through "
    "shared memory, when the row spins while waiting, c-floor-futex when it sleeps; sockets: "
    "raw-<scheme>/<server>, a bare server of "
    "the same language moving the same bytes, else the C socket floor of those bytes)"
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
    _atomic_write(Path(path), text.encode())


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a whole or not at all: a temp file next to it, renamed over
    it. The file keeps its mode when it exists; a new one gets what ``open`` would give it
    (0666 less the umask), not mkstemp's 0600. A symlink is written through (its target is
    replaced), and an existing file that is not a regular one (``/dev/null``, a FIFO) is written
    in place, never replaced by a regular file."""
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "wb") as handle:
            handle.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            keep = stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask()
            os.fchmod(handle.fileno(), keep)
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def output_problem(path: str, *, markdown: bool = False) -> str | None:
    """Why ``path`` cannot take an output, checked before a run measures anything (so a bad
    path costs nothing), or None: it is empty, a directory, or its folder (the nearest one
    that exists: missing ones are created when written) is not a folder or is not writable (a
    file is created and removed there to know: ``os.access`` says yes to root even on /proc).
    ``markdown``: the file is also read, so it must be a regular file, readable, and not have a
    begin marker without an end marker after it."""
    if not path:
        return "an empty path"
    target = Path(path)
    if target.is_dir():
        return "is a directory"
    if target.exists():
        if markdown and not target.is_file():
            return "is not a regular file"
        if markdown:
            try:
                replace_block(_read_text(target), "")
            except OSError as exc:
                return f"cannot read it ({exc.strerror or exc})"
            except ValueError as exc:
                return str(exc)
    folder = Path(os.path.abspath(target)).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".transport-probe-check.")
    except OSError as exc:
        return f"cannot write in {folder} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def markdown_block(
    results: Results,
    machine: dict[str, Any],
    command: str,
    order: list[str],
    env: str = "echo",
) -> str:
    """The text between (and including) the probe markers (``env``: see ``env_phrase``)."""
    when = datetime.fromtimestamp(results.started, UTC).strftime("%Y-%m-%d %H:%M UTC")
    floor_text = f"`x floor` = {FLOOR_RULE}" if results.floors else "`x floor`: no floor measured"
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
        f"{env_phrase(results.rows, env)}; a round trip of batch B is one batched step of B envs "
        f"(`payload B` = response bytes). Latencies from log-bucket histograms; {floor_text}. "
        "See docs/probe.md.",
        "",
        markdown_table(transport_rows(results, order)),
    ]
    if results.floors:
        parts += ["", "Floors (us):", "", markdown_floors(results.floors)]
    summary_ = summary_lines(results.rows) + throughput_lines(results.rows)
    if summary_:
        parts += ["", "Summary:", "", *[f"- {line}" for line in summary_]]
    problems = problems_text(results)
    if problems:
        parts += ["", *[f"- {line}" for line in problems.splitlines()]]
    parts.append(END)
    return "\n".join(parts)


def _newline_of(text: str) -> str:
    """The file's line ending, as its first line ends ("\r\n" or "\n")."""
    first = text.find("\n")
    return "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"


def replace_block(existing: str | None, block: str, begin: str = BEGIN, end: str = END) -> str:
    """``existing`` with its block between ``begin`` and ``end`` replaced by ``block`` (appended
    if it has none). Everything outside the markers is kept byte for byte; the block's lines end
    as the file's first line does (a CRLF file gets a CRLF block)."""
    if existing is None or existing == "":
        return "# Benchmark results\n\n" + block + "\n"
    nl = _newline_of(existing)
    block = block.replace("\r\n", "\n").replace("\n", nl)
    start = existing.find(begin)
    if start >= 0:
        stop = existing.find(end, start)
        if stop < 0:
            raise ValueError(f"the file has {begin} but no {end} after it: fix it by hand")
        return existing[:start] + block + existing[stop + len(end) :]
    if existing.endswith(nl + nl):
        sep = ""
    elif existing.endswith("\n"):
        sep = nl
    else:
        sep = nl + nl
    return existing + sep + block + nl


def _read_text(path: Path) -> str:
    """The file's text as it is on disk: no newline translation, and bytes that are not UTF-8
    kept as they are (surrogateescape) so that writing it back changes none of them."""
    return path.read_bytes().decode("utf-8", errors="surrogateescape")


def update_markdown(path: str, block: str, begin: str = BEGIN, end: str = END) -> None:
    """Rewrite the probe block of ``path`` (``replace_block``), keeping every byte outside it
    and the file's mode (``_atomic_write``)."""
    target = Path(path)
    existing = _read_text(target) if target.exists() else None
    text = replace_block(existing, block, begin, end)
    _atomic_write(target, text.encode("utf-8", errors="surrogateescape"))
