"""The PNG: latency CDFs per batch size (log x, "nines" y), and latency vs payload for a sweep.

Every curve comes from the same histogram as its table row: the CDF's points are the upper
edges of the non-empty buckets, so the p50 / p99 read off the plot are the table's. Each
backend has one color, each server language one line style (python solid, node dashed, the C
floor dotted black/gray), and the legend of each panel is sorted by p50 with the p50 in it.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from transport.probe.runner import Row

LANG_STYLE = {"python": "-", "node": "--", "c": ":"}
FLOOR_COLOR = {"c-floor-futex": "black", "c-floor-spin": "0.55"}
NINES = (0, 1, 2, 3, 4, 5)


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


def _cdf_panel(ax: Any, rows: list[Row], floors: list[Row], colors: dict[str, Any]) -> None:
    import numpy as np

    top = 0.0
    entries: list[tuple[float, Any, str]] = []
    for row in [*floors, *rows]:
        values, fractions = row.hist.cdf()
        if values.size == 0:
            continue
        x = np.concatenate(([values[0]], values)) / 1000.0
        y = _nines(np.concatenate(([0.0], fractions)), row.hist.total)
        top = max(top, float(y.max()))
        color = FLOOR_COLOR.get(row.backend, colors.get(row.backend, "C9"))
        (line,) = ax.step(
            x,
            y,
            where="post",
            color=color,
            linestyle=LANG_STYLE.get(row.server, "-."),
            linewidth=1.6,
        )
        p50, p99 = row.us(50), row.us(99)
        ax.plot([p50], [_nines([0.5], 2)[0]], "o", color=color, markersize=3.5)
        entries.append((p50, line, f"{row.label}  p50 {_us(p50)}  p99 {_us(p99)} us"))
    entries.sort(key=lambda e: e[0])
    ax.set_xscale("log")
    ax.set_ylim(0, max(3.0, math.ceil(top)))
    ticks = [float(n) for n in NINES if n <= max(3.0, math.ceil(top))]
    ticks.insert(1, math.log10(2.0))  # the median
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{100 - 100 / 10**n:.4g}%" for n in ticks])
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlabel("round-trip latency (us, log scale)")
    ax.set_ylabel("percentile (samples at or below)")
    ax.legend(
        [e[1] for e in entries],
        [e[2] for e in entries],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=1,
        fontsize=7.5,
        frameon=False,
        title="sorted by p50",
        title_fontsize=8,
    )


def _sweep_panel(ax: Any, rows: list[Row], floors: list[Row], colors: dict[str, Any]) -> None:
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.backend, row.server), []).append(row)
    entries: list[tuple[float, Any, str]] = []
    for (backend, server), group in groups.items():
        group.sort(key=lambda r: r.payload_bytes)
        x = [r.payload_bytes for r in group]
        color = colors.get(backend, "C9")
        style = LANG_STYLE.get(server, "-.")
        (line,) = ax.plot(x, [r.us(50) for r in group], style, marker="o", color=color, ms=3.5)
        ax.plot(x, [r.us(99) for r in group], style, color=color, alpha=0.35, linewidth=1)
        entries.append((group[-1].us(50), line, f"{backend}/{server}"))
    for floor in floors:
        line = ax.axhline(
            floor.us(50), color=FLOOR_COLOR.get(floor.backend, "0.3"), linestyle=":", linewidth=1.2
        )
        entries.append((-1.0, line, f"{floor.label} p50 {_us(floor.us(50))} us"))
    entries.sort(key=lambda e: e[0])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlabel("response payload (bytes, log scale)")
    ax.set_ylabel("round-trip latency (us): p50 bold, p99 faint")
    ax.set_title("payload sweep", fontsize=10)
    ax.legend(
        [e[1] for e in entries],
        [e[2] for e in entries],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
        fontsize=7.5,
        frameon=False,
        title="sorted by p50 at the largest payload",
        title_fontsize=8,
    )


def plot(rows: list[Row], floors: list[Row], path: str, *, title: str, backends: list[str]) -> None:
    """Write the PNG (matplotlib's Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = _colors(backends)
    plain = [r for r in rows if r.point.target_bytes is None]
    sweep = [r for r in rows if r.point.target_bytes is not None]
    panels: dict[tuple[str, int], list[Row]] = {}
    for row in plain:
        panels.setdefault((row.point.message, row.point.batch), []).append(row)
    keys = sorted(panels, key=lambda k: (k[0] != "health", k[1]))
    n = len(keys) + (1 if sweep else 0)
    if n == 0:
        keys, n = [("floor", 1)], 1
        panels[("floor", 1)] = []
    legend_rows = max([len(v) for v in panels.values()] + [len(sweep) // 2 + 1]) + len(floors)
    height = 5.0 + 0.17 * legend_rows
    widths = [6.2] * len(keys) + ([8.5] if sweep else [])
    fig, axes = plt.subplots(
        1, n, figsize=(sum(widths), height), squeeze=False, width_ratios=widths
    )
    for ax, key in zip(axes[0], keys, strict=False):
        group = panels[key]
        _cdf_panel(ax, group, floors, colors)
        if key[0] == "floor":
            ax.set_title("C floor", fontsize=10)
        else:
            payload = group[0].payload_bytes if group else 0
            what = "health" if key[0] == "health" else f"batch {key[1]}"
            ax.set_title(f"{what}: {payload:,}-byte response", fontsize=10)
    if sweep:
        _sweep_panel(axes[0][-1], sweep, floors, colors)
    width_chars = int(sum(widths) * 12)
    fig.suptitle("\n".join(textwrap.wrap(title, width_chars)), fontsize=9.5)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
