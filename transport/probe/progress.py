"""Progress on stderr: a bar on a terminal (or with --progress), plain lines otherwise (CI)."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """``begin(label)`` before a cell, ``end(label, summary)`` after it.

    ``bar``: redraw one line (``\\r``) with a bar, the cell count, the elapsed time and the
    current cell; otherwise print one plain line per finished cell. ``quiet``: print nothing.
    """

    def __init__(
        self, total: int, *, bar: bool, quiet: bool = False, stream: TextIO | None = None
    ) -> None:
        self.total = max(total, 1)
        self.bar = bar and not quiet
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.started = time.monotonic()

    def begin(self, label: str) -> None:
        if self.bar:
            self._draw(f"{label} ...")

    def tick(self, label: str, phase: str, done: int, total: int) -> None:
        """Inside a cell: ``done`` of ``total`` round trips of ``phase`` (warm-up, measure)."""
        if self.bar:
            self._draw(f"{label} {phase} {done}/{total}")

    def ticker(self, label: str, phase: str, total: int) -> Callable[[int], None] | None:
        """A tick function for the measurement loops, or None (no bar: no per-loop cost)."""
        if not self.bar:
            return None
        return lambda done: self.tick(label, phase, done, total)

    def skip(self, label: str) -> None:
        """A cell skipped for a reason already reported: counted, no line of its own."""
        self.done += 1
        if self.bar:
            self._draw(label)

    def end(self, label: str, summary: str) -> None:
        self.done += 1
        if self.quiet:
            return
        if self.bar:
            self._clear()
            if summary.startswith(("FAILED", "skipped")):
                self.stream.write(f"  {label}: {summary}\n")
            self._draw(label)
        else:
            self.stream.write(f"probe [{self.done}/{self.total}] {label}: {summary}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar:
            self._clear()
            self.stream.flush()

    def _clear(self) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        self.stream.write("\r" + " " * (width - 1) + "\r")

    def _draw(self, label: str) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        slots = 24
        filled = int(slots * min(self.done, self.total) / self.total)
        elapsed = time.monotonic() - self.started
        text = (
            f"[{'#' * filled}{'.' * (slots - filled)}] {self.done}/{self.total} "
            f"{elapsed:5.0f} s  {label}"
        )
        self.stream.write("\r" + text[: width - 1])
        self.stream.flush()
