"""The PNGs: what to pick, readable in ten seconds.

Figure 1 (``--plot FILE``): one panel per batch size with the latency CDF of that batch's
transport rows only (log x, "nines" y so the tail is as visible as the median), one color per
backend and one line style per server language (python solid, node dashed), a dot at each p50;
the C floors of the panel's rows (``runner.c_floor_for``: spin or futex, Unix or TCP socket of
the same bytes; at most four) as thin grey vertical lines at their p50, labelled; one small
legend for the figure (backends, languages, floor). With ``--sweep`` / ``--payload``, one more
panel: p50 (bold) and p99 (faint) against payload bytes.

Figure 2 (``FILE-bars.png``, ``bars_path``): per batch size, one bar per backend x server
language: the p50 (python solid, node hatched, the backend's color), a whisker up to the p99,
and a short grey mark at the p50 of the floor that row is compared with.

Every number comes from the same histogram as its table row. Artists carry a ``gid``
(``row:<label>``, ``floor:<name>``, ``bar:<label>``) so tests read the figure's structure.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from transport.probe.runner import Row, c_floor_for, floor_for

LANG_STYLE: dict[str, Any] = {"python": "-", "node": "--"}
LANG_HATCH = {"python": "", "node": "////"}
LANG_NAMES = {"python": "Python server", "node": "Node server"}
FLOOR_GREY = "0.55"
NINES = (0, 1, 2, 3, 4, 5)
PanelKey = tuple[bool, int, str]


def bars_path(path: str | Path) -> Path:
    """Where figure 2 goes: next to figure 1, ``<stem>-bars<suffix>``."""
    p = Path(path)
    return p.with_name(f"{p.stem}-bars{p.suffix or '.png'}")


def _us(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _colors(backends: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {b: cmap(i % 10) for i, b in enumerate(backends)}


def _nines(fractions: Any, total: int) -> Any:
    import numpy as np

    tail = np.maximum(1.0 - np.asarray(fractions, dtype=float), 1.0 / max(total, 1))
    return -np.log10(tail)


def _key(row: Row) -> PanelKey:
    return (row.point.message != "health", row.point.batch, row.point.message)


def _panel_title(rows: list[Row]) -> str:
    row = rows[0]
    what = "health round trip" if row.point.message == "health" else f"batch {row.point.batch}"
    return f"{what}: {row.payload_bytes:,}-byte response"


def panels_of(rows: list[Row], backends: list[str]) -> list[tuple[PanelKey, list[Row]]]:
    """The transport rows (sweep points excluded) grouped by batch, each group in backend
    order, python before node."""
    rank = {b: i for i, b in enumerate(backends)}
    lang = {"python": 0, "node": 1}
    groups: dict[PanelKey, list[Row]] = {}
    for row in rows:
        if row.point.target_bytes is None and not row.is_floor:
            groups.setdefault(_key(row), []).append(row)
    return [
        (
            key,
            sorted(
                groups[key],
                key=lambda r: (rank.get(r.backend, len(rank)), r.backend, lang.get(r.server, 2)),
            ),
        )
        for key in sorted(groups)
    ]


def applying_floors(rows: list[Row], floors: list[Row]) -> list[Row]:
    """The C floors of the rows' kinds (``runner.c_floor_for``: spin or futex for shared
    memory, the Unix or TCP socket floor of the same bytes), each once, fastest first: a few
    reference lines per panel. Each row's own floor, raw ones included, is in the table and
    on its bar in figure 2."""
    found: dict[int, Row] = {}
    for row in rows:
        floor = c_floor_for(row, floors)
        if floor is not None:
            found[id(floor)] = floor
    return sorted(found.values(), key=lambda f: f.p50_us)


def _floor_name(floor: Row) -> str:
    return f"{floor.backend}/{floor.server}" if floor.backend.startswith("raw-") else floor.backend


def _floor_lines(ax: Any, floors: list[Row]) -> None:
    """Thin grey vertical lines at the floors' p50 (floors within 10 % share one line), each
    labelled low in the panel, where the curves have not started yet: left of its line (right
    of it near the panel's left edge), one label per text line, the lowest floor lowest."""
    merged: list[tuple[float, list[str]]] = []
    for floor in floors:
        p50 = floor.us(50)
        if merged and p50 <= merged[-1][0] * 1.10:
            merged[-1][1].append(_floor_name(floor))
        else:
            merged.append((p50, [_floor_name(floor)]))
    ax.autoscale_view()
    low, high = (math.log10(v) for v in ax.get_xlim())
    for i, (p50, names) in enumerate(merged):
        ax.axvline(p50, color=FLOOR_GREY, linewidth=0.8, gid=f"floor:{names[0]}")
        where = (math.log10(p50) - low) / max(high - low, 1e-9)
        ax.text(
            p50,
            0.03 + 0.06 * i,
            f" {' = '.join(names)} {_us(p50)} us ",
            va="bottom",
            ha="right" if where > 0.4 else "left",
            fontsize=6.5,
            color="0.25",
            transform=ax.get_xaxis_transform(),
            bbox={"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 0.6},
        )


def _cdf_panel(ax: Any, rows: list[Row], floors: list[Row], colors: dict[str, Any]) -> None:
    import numpy as np

    top = 0.0
    for row in rows:
        values, fractions = row.hist.cdf()
        if values.size == 0:
            continue
        x = np.concatenate(([values[0]], values)) / 1000.0
        y = _nines(np.concatenate(([0.0], fractions)), row.hist.total)
        top = max(top, float(y.max()))
        color = colors.get(row.backend, "C9")
        ax.step(
            x,
            y,
            where="post",
            color=color,
            linestyle=LANG_STYLE.get(row.server, "-."),
            linewidth=1.7,
            gid=f"row:{row.label}",
        )
        ax.plot([row.us(50)], [_nines([0.5], 2)[0]], "o", color=color, markersize=3.5)
    ax.set_xscale("log")
    _floor_lines(ax, applying_floors(rows, floors))
    ceiling = max(3.0, math.ceil(top))
    ax.set_ylim(0, ceiling)
    ticks = [float(n) for n in NINES if n <= ceiling]
    ticks.insert(1, math.log10(2.0))  # the median
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{100 - 100 / 10**n:.4g}%" for n in ticks])
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("round-trip latency (us, log scale): left is faster")
    ax.set_ylabel("percentile (samples at or below)")
    ax.set_title(_panel_title(rows), fontsize=10)


def _sweep_panel(ax: Any, rows: list[Row], floors: list[Row], colors: dict[str, Any]) -> None:
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.backend, row.server), []).append(row)
    for (backend, server), group in groups.items():
        group.sort(key=lambda r: r.payload_bytes)
        x = [r.payload_bytes for r in group]
        color = colors.get(backend, "C9")
        style = LANG_STYLE.get(server, "-.")
        ax.plot(
            x,
            [r.us(50) for r in group],
            style,
            marker="o",
            color=color,
            ms=3.5,
            gid=f"row:{backend}/{server}/sweep",
        )
        ax.plot(x, [r.us(99) for r in group], style, color=color, alpha=0.35, linewidth=1)
    for floor in applying_floors(rows, floors):
        if floor.point.message == "pingpong":  # the socket floors vary with the payload
            ax.axhline(floor.us(50), color=FLOOR_GREY, linewidth=0.8, gid=f"floor:{floor.backend}")
            ax.text(
                0.01,
                floor.us(50),
                f"{floor.backend} {_us(floor.us(50))} us",
                va="bottom",
                fontsize=6.5,
                color="0.25",
                transform=ax.get_yaxis_transform(),
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("response payload (bytes, log scale)")
    ax.set_ylabel("round-trip latency (us): p50 bold, p99 faint")
    ax.set_title("payload sweep", fontsize=10)


def _style_legend(fig: Any, backends: list[str], langs: list[str], colors: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors.get(b, "C9"), linewidth=3) for b in backends]
    labels = list(backends)
    handles += [Line2D([], [], color="0.2", linestyle=LANG_STYLE.get(x, "-.")) for x in langs]
    labels += [LANG_NAMES.get(x, f"{x} server") for x in langs]
    handles.append(Line2D([], [], color=FLOOR_GREY, linewidth=0.8))
    labels.append("C floor (p50) of those rows' kind")
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=len(labels),
        fontsize=8,
        frameon=False,
        handlelength=2.6,
    )


def _present(rows: list[Row], backends: list[str]) -> tuple[list[str], list[str]]:
    names = {r.backend for r in rows if not r.is_floor}
    ordered = [b for b in backends if b in names] + sorted(names - set(backends))
    langs = {r.server for r in rows if not r.is_floor}
    return ordered, [x for x in ("python", "node") if x in langs] + sorted(langs - set(LANG_STYLE))


def _suptitle(fig: Any, title: str, width_in: float) -> None:
    fig.suptitle("\n".join(textwrap.wrap(title, int(width_in * 13))), fontsize=9)


def cdf_figure(rows: list[Row], floors: list[Row], *, title: str, backends: list[str]) -> Any:
    """Figure 1: one CDF panel per batch size (+ the sweep panel)."""
    import matplotlib.pyplot as plt

    colors = _colors(backends)
    panels = panels_of(rows, backends)
    sweep = [r for r in rows if r.point.target_bytes is not None and not r.is_floor]
    n = max(1, len(panels) + (1 if sweep else 0))
    width = max(7.5, 5.6 * n)
    fig, axes = plt.subplots(1, n, figsize=(width, 5.4), squeeze=False)
    for ax, (_, group) in zip(axes[0], panels, strict=False):
        _cdf_panel(ax, group, floors, colors)
    if sweep:
        _sweep_panel(axes[0][len(panels)], sweep, floors, colors)
    if not panels and not sweep:
        axes[0][0].text(0.5, 0.5, "no transport rows measured", ha="center", va="center")
        axes[0][0].set_axis_off()
    shown, langs = _present(rows, backends)
    _style_legend(fig, shown, langs, colors)
    _suptitle(fig, title, width)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def bars_figure(rows: list[Row], floors: list[Row], *, title: str, backends: list[str]) -> Any:
    """Figure 2: p50 bars with p99 whiskers per backend x server language, one panel per batch."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colors = _colors(backends)
    panels = panels_of(rows, backends)
    n = max(1, len(panels))
    width = max(6.0, sum(max(3.6, 0.5 * len(group) + 1.2) for _, group in panels))
    fig, axes = plt.subplots(1, n, figsize=(width, 4.8), squeeze=False)
    for ax, (_, group) in zip(axes[0], panels, strict=False):
        names = list(dict.fromkeys(r.backend for r in group))
        langs = list(dict.fromkeys(r.server for r in group))
        step = 0.8 / max(len(langs), 1)
        for row in group:
            x = names.index(row.backend) - 0.4 + step * (langs.index(row.server) + 0.5)
            p50, p99 = row.us(50), row.us(99)
            ax.bar(
                x,
                p50,
                width=step * 0.92,
                color=colors.get(row.backend, "C9"),
                hatch=LANG_HATCH.get(row.server, ".."),
                edgecolor="white",
                linewidth=0.0,
                gid=f"bar:{row.label}",
            )
            ax.errorbar(
                x, p50, yerr=[[0.0], [max(p99 - p50, 0.0)]], fmt="none", ecolor="0.15", capsize=3
            )
            ax.annotate(
                _us(p50),
                (x, p50),
                xytext=(0, -2),
                textcoords="offset points",
                ha="center",
                va="top",
                fontsize=6.5,
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 0.8},
            )
            floor = floor_for(row, floors)
            if floor is not None:
                ax.hlines(
                    floor.us(50),
                    x - step * 0.46,
                    x + step * 0.46,
                    color=FLOOR_GREY,
                    linewidth=2.0,
                    gid=f"floor:{_floor_name(floor)}",
                )
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names)
        ax.set_yscale("log")
        ax.grid(True, axis="y", which="major", alpha=0.3)
        ax.set_ylabel("round trip (us, log): bar p50, whisker p99")
        ax.set_title(_panel_title(group), fontsize=10)
    if not panels:
        axes[0][0].text(0.5, 0.5, "no transport rows measured", ha="center", va="center")
        axes[0][0].set_axis_off()
    _, langs = _present(rows, backends)
    handles: list[Any] = [
        Patch(facecolor="0.6", hatch=LANG_HATCH.get(x, ".."), edgecolor="white") for x in langs
    ]
    labels = [LANG_NAMES.get(x, f"{x} server") for x in langs]
    handles.append(Line2D([], [], color=FLOOR_GREY, linewidth=2.0))
    labels.append("its floor (p50)")
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    _suptitle(fig, title, width)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot(
    rows: list[Row], floors: list[Row], path: str, *, title: str, backends: list[str]
) -> list[str]:
    """Write figure 1 to ``path`` and, when there are batch rows (not only a sweep), figure 2
    to ``bars_path(path)`` (Agg: no display). Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figures = [(cdf_figure(rows, floors, title=title, backends=backends), Path(path))]
    if panels_of(rows, backends) or not rows:
        figures.append((bars_figure(rows, floors, title=title, backends=backends), bars_path(path)))
    for figure, target in figures:
        figure.savefig(target, dpi=110)
        plt.close(figure)
    return [str(target) for _, target in figures]
