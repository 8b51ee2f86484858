"""transport-probe's outputs from synthetic rows (no server): which floor each row is compared
with, the table's sections, the closing summary, and the structure of both figures."""

from __future__ import annotations

import re
from typing import Any

import pytest

from transport.probe import report
from transport.probe.histogram import LogHistogram
from transport.probe.loops import LoopStats
from transport.probe.runner import Point, Results, Row, apply_floor

ORDER = ["shm", "zmq+ipc", "unix", "zmq+tcp", "http"]


def make_row(
    backend: str,
    server: str,
    p50_us: float,
    p99_us: float | None = None,
    *,
    batch: int = 1,
    message: str = "step",
    url: str = "",
) -> Row:
    """A row whose histogram has 90 samples at ``p50_us`` and 10 at ``p99_us``."""
    hist = LogHistogram()
    for _ in range(90):
        hist.record(int(p50_us * 1000))
    for _ in range(10):
        hist.record(int((p99_us or p50_us * 3) * 1000))
    point = Point(batch, message)
    payload = 4 if message == "pingpong" else batch * 2557
    return Row(backend, server, point, payload, 4 * batch, hist, LoopStats(100, 10**8), "closed",
               url=url)  # fmt: skip


def floors(batches: tuple[int, ...] = (1,)) -> list[Row]:
    out = [make_row("c-floor-spin", "c", 0.4, message="pingpong"),
           make_row("c-floor-futex", "c", 20.0, message="pingpong")]  # fmt: skip
    for b in batches:
        out += [
            make_row("c-floor-unix", "c", 25.0 * b**0.3, batch=b),
            make_row("c-floor-tcp", "c", 30.0 * b**0.3, batch=b),
            make_row("raw-unix", "python", 40.0 * b**0.3, batch=b),
            make_row("raw-unix", "node", 60.0 * b**0.3, batch=b),
            make_row("raw-http", "node", 150.0 * b**0.3, batch=b),
        ]
    return out


def results_with(rows: list[Row], floor_rows: list[Row]) -> Results:
    results = Results(rows=rows, floors=floor_rows)
    apply_floor(results)
    return results


def test_each_row_is_compared_with_the_floor_that_applies() -> None:
    """The futex floor when the row sleeps, the spin floor when it spins, the raw socket of its
    scheme and language for sockets, the C socket floor where there is no raw one."""
    rows = {
        "shm spinning": make_row("shm", "python", 8.0, url="shm://a?num_envs=1"),
        "shm sleeping": make_row("shm", "node", 30.0, url="shm://b?num_envs=1&wait=futex"),
        "shm spin=0": make_row("shm", "python", 31.0, url="shm://c?num_envs=1&spin=0"),
        "unix python": make_row("unix", "python", 60.0),
        "unix node": make_row("unix", "node", 90.0),
        "http python": make_row("http", "python", 70.0),
        "http node": make_row("http", "node", 300.0),
        "zmq+ipc python": make_row("zmq+ipc", "python", 80.0),  # no raw floor measured
    }
    results = results_with(list(rows.values()), floors())
    expected = {
        "shm spinning": ("c-floor-spin", 0.4),
        "shm sleeping": ("c-floor-futex", 20.0),
        "shm spin=0": ("c-floor-futex", 20.0),
        "unix python": ("raw-unix", 40.0),
        "unix node": ("raw-unix", 60.0),
        "http python": ("c-floor-tcp", 30.0),
        "http node": ("raw-http", 150.0),
        "zmq+ipc python": ("c-floor-unix", 25.0),
    }
    for name, (floor, floor_p50) in expected.items():
        row = rows[name]
        assert row.floor_name == floor, name
        assert row.ratio_to_floor == pytest.approx(row.p50_us / floor_p50, rel=0.02), name
    # the table names the floor of each row; raw floors with the row's server language
    table = report.text_table(report.transport_rows(results, ORDER))
    header, _, *lines = table.splitlines()
    assert header.split()[-2:] == ["floor", "floor"]  # "x floor", then "floor"
    cells = {(c[0], c[1], c[-1]) for c in (line.split() for line in lines)}
    assert ("shm", "node", "c-floor-futex") in cells and ("shm", "python", "c-floor-spin") in cells
    assert ("unix", "node", "raw-unix/node") in cells and ("http", "python", "c-floor-tcp") in cells


def test_floors_have_their_own_short_section() -> None:
    results = results_with(
        [make_row("unix", "python", 60.0, batch=b) for b in (1, 8, 64)], floors((1, 8, 64))
    )
    table = report.text_table(report.transport_rows(results, ORDER))
    assert [line.split()[0] for line in table.splitlines()[2:]] == ["unix"] * 3  # no floors
    text = report.floors_text(results.floors)
    lines = text.splitlines()
    assert lines[0].startswith("floors")
    assert lines[1].strip().startswith("c-floor-spin (4 bytes each way, applies to every batch)")
    assert lines[2].strip().startswith("c-floor-futex")
    header = lines[3].split()
    assert header[:2] == ["floor", "server"] and "batch 64 p50 (p99)" in lines[3]
    grid = [line.split()[:2] for line in lines[5:]]  # one line per floor x server language
    assert grid == [["c-floor-unix", "c"], ["c-floor-tcp", "c"], ["raw-unix", "python"],
                    ["raw-unix", "node"], ["raw-http", "node"]]  # fmt: skip
    assert len(lines) == 10  # 5 floors x 3 batches in 5 lines, not 17
    assert report.floors_text([]) == ""


def _summary(rows: list[Row]) -> list[str]:
    results = results_with(rows, floors((1, 64)))
    return report.summary_lines(report.transport_rows(results, ORDER))


def test_the_summary_names_the_fastest_per_batch_against_unix() -> None:
    rows = [
        make_row("shm", "node", 3.4, url="shm://a?num_envs=1"),
        make_row("shm", "python", 5.0, url="shm://b?num_envs=1"),
        make_row("unix", "python", 57.8),
        make_row("unix", "node", 80.0),
        make_row("http", "node", 300.0),
        make_row("unix", "python", 100.0, batch=64),
        make_row("zmq+ipc", "node", 120.0, batch=64),
        make_row("http", "python", 400.0, batch=64),
    ]
    first, second = _summary(rows)
    match = re.fullmatch(
        r"fastest here \(batch 1\): shm, Node server, (\S+) us p50, (\S+)x faster than unix "
        r"\(Python server, (\S+) us\), (\S+)x its floor \(c-floor-spin\)",
        first,
    )
    assert match is not None, first
    p50, faster, unix, floor_ratio = (float(g) for g in match.groups())
    assert p50 == pytest.approx(3.4, rel=0.02) and unix == pytest.approx(57.8, rel=0.02)
    assert faster == pytest.approx(57.8 / 3.4, rel=0.03)
    assert floor_ratio == pytest.approx(3.4 / 0.4, rel=0.03)
    # unix itself is the fastest at 64: compared with the runner-up backend instead
    assert second.startswith("for batches of 64: unix, Python server, 100 us p50, 1.2x faster ")
    assert "than zmq+ipc (Node server, 120 us)" in second
    (alone,) = report.summary_lines([make_row("unix", "python", 50.0)])
    assert re.fullmatch(r"fastest here: unix, Python server, 50\.\d us p50", alone), alone
    assert report.summary_lines([]) == []


# -- the figures -----------------------------------------------------------------------------------


def _run_rows() -> tuple[list[Row], list[Row]]:
    rows = []
    for b in (1, 8):
        for backend, base in (("shm", 8.0), ("unix", 60.0), ("http", 90.0)):
            for server, slower in (("python", 1.0), ("node", 1.5)):
                url = f"shm://x{b}{server}?num_envs={b}" if backend == "shm" else ""
                rows.append(make_row(backend, server, base * slower * b**0.2, batch=b, url=url))
    return rows, floors((1, 8))


def _gids(ax: Any, prefix: str) -> list[str]:
    return [a.get_gid() for a in ax.get_children() if str(a.get_gid()).startswith(prefix)]


def test_the_cdf_figure_shows_each_batch_its_own_rows_and_floors() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from transport.probe.plot import cdf_figure

    rows, floor_rows = _run_rows()
    results = results_with(rows, floor_rows)
    fig = cdf_figure(results.rows, results.floors, title="t", backends=ORDER)
    try:
        panels = fig.axes
        assert len(panels) == 2
        for ax, batch in zip(panels, (1, 8), strict=True):
            curves = [line for line in ax.get_lines() if str(line.get_gid()).startswith("row:")]
            assert len(curves) == 6  # 3 backends x 2 languages, this batch only
            assert all(line.get_gid().endswith(f"/b{batch}") for line in curves)
            colors = {
                line.get_gid().split(":")[1].split("/")[0]: line.get_color() for line in curves
            }
            assert len(set(map(str, colors.values()))) == 3  # one color per backend
            styles = {line.get_gid().split("/")[1]: line.get_linestyle() for line in curves}
            assert styles == {"python": "-", "node": "--"}  # one line style per language
            # a few grey lines: the C floors of the panel's kinds, each once (spin for shm, the
            # Unix and TCP socket floors of this batch's bytes); not futex (no row sleeps), not
            # the raw floors (one per scheme and language: on the bars)
            floor_lines = [
                line for line in ax.get_lines() if str(line.get_gid()).startswith("floor:")
            ]
            assert sorted(line.get_gid() for line in floor_lines) == [
                "floor:c-floor-spin", "floor:c-floor-tcp", "floor:c-floor-unix"]  # fmt: skip
            unix_floor = next(
                f for f in floor_rows if f.backend == "c-floor-unix" and f.point.batch == batch
            )
            (unix_line,) = [line for line in floor_lines if line.get_gid() == "floor:c-floor-unix"]
            assert unix_line.get_xdata()[0] == pytest.approx(unix_floor.us(50))  # at its p50
            assert ax.get_legend() is None  # one small legend for the figure
        (legend,) = fig.legends
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels[:5] == ["shm", "unix", "http", "Python server", "Node server"]
        assert len(labels) == 6 and "floor" in labels[5]
    finally:
        plt.close(fig)


def test_the_bars_figure_has_one_bar_per_backend_and_language() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from transport.probe.plot import bars_figure, bars_path

    rows, floor_rows = _run_rows()
    results = results_with(rows, floor_rows)
    fig = bars_figure(results.rows, results.floors, title="t", backends=ORDER)
    try:
        assert len(fig.axes) == 2
        for ax, batch in zip(fig.axes, (1, 8), strict=True):
            bars = [p for p in ax.patches if str(p.get_gid()).startswith("bar:")]
            assert len(bars) == 6
            by_label = {p.get_gid()[4:]: p for p in bars}
            row = next(r for r in results.rows if r.label == f"unix/node/b{batch}")
            assert by_label[row.label].get_height() == pytest.approx(row.us(50))  # bar = p50
            assert [t.get_text() for t in ax.get_xticklabels()] == ["shm", "unix", "http"]
            assert len(_gids(ax, "floor:")) == 6  # each bar's own floor mark
            whiskers = [
                c for c in ax.collections if c.get_gid() is None and len(c.get_segments()) == 1
            ]
            tops = sorted(max(s[:, 1]) for c in whiskers for s in c.get_segments())
            assert tops == pytest.approx(
                sorted(r.us(99) for r in results.rows if r.point.batch == batch)
            )
        (legend,) = fig.legends
        assert [t.get_text() for t in legend.get_texts()] == [
            "Python server", "Node server", "its floor (p50)"]  # fmt: skip
    finally:
        plt.close(fig)
    assert str(bars_path("out/probe.png")) == "out/probe-bars.png"


def test_a_floor_beaten_by_a_row_is_called_disturbed_not_a_ratio() -> None:
    """A floor that a row beats by more than noise ran while a core was taken (seen on this
    2-core machine: c-floor-shm at 17.3 us against the Python shm row's 7.58, a spin floor whose
    two processes shared a core): the summary does not print "0.44x its floor", the floors
    section names the floor, the row and what to do."""
    floor_rows = [*floors(), make_row("c-floor-shm", "c", 17.3)]
    fast = make_row("shm", "python", 7.58, url="shm://a?num_envs=1")
    fine = make_row("shm", "node", 30.0, url="shm://b?num_envs=1")
    results = results_with([fast, fine], floor_rows)
    assert fast.floor_name == "c-floor-shm" and fast.ratio_to_floor is not None
    assert fast.ratio_to_floor < report.DISTURBED
    notes = report.floor_notes(results.rows)
    assert len(notes) == 1
    assert re.match(
        r"c-floor-shm at batch 1 \(17\.\d us p50\) is slower than shm, Python", notes[0]
    )
    assert "rerun" in notes[0]
    summary = report.summary_lines(results.rows)[0]
    assert "faster than its floor (c-floor-shm: disturbed" in summary and "0.44" not in summary
    # a floor no row beats gets no note; nor does a raw floor (a bare Python or Node server,
    # which a tuned server may beat: its ratio stays)
    assert report.floor_notes(results_with([fine], floor_rows).rows) == []
    tuned = make_row("unix", "python", 30.0)  # raw-unix/python at 40 us
    assert tuned.floor_name is None
    raw = results_with([tuned], floor_rows)
    assert tuned.floor_name == "raw-unix" and report.floor_notes(raw.rows) == []
    assert "0.75x its floor (raw-unix/python)" in report.summary_lines(raw.rows)[0]
