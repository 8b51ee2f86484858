"""Command-line tools: transport-schema, transport-conformance, transport-serve, transport-probe."""

from __future__ import annotations

import functools
import os
import select
import sys
from collections.abc import Callable
from typing import ParamSpec

P = ParamSpec("P")

SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for `cat` cut off by `| head`


def _stdout_closed() -> bool:
    """The reader of stdout is gone: the write end of a pipe then polls as POLLERR."""
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def quiet_on_broken_pipe(main: Callable[P, int]) -> Callable[P, int]:
    """A reader that stops early (``| head``) ends the tool quietly, as it does ``cat``."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            if not _stdout_closed():
                raise  # a broken pipe elsewhere (a peer's socket) is not ours to hide
            # point stdout at /dev/null so the interpreter's final flush raises nothing more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return SIGPIPE_EXIT

    return run
