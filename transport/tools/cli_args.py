"""Argument parsing shared by the command-line tools (issue 22 item 7).

Every tool refuses a bad command line the same way: one line on stderr,
``PROG: error: MESSAGE (see PROG --help)``, and exit status 2; never argparse's usage block,
never a traceback. ``schema_path`` is the argument type of a schema file: it refuses what would
hang (a FIFO), never end (``/dev/zero``) or exhaust memory (a huge file) before anything reads it.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import NoReturn

from transport.errors import SchemaError
from transport.schema.compiler import check_schema_file


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose usage errors are one line and exit 2.

    Sub-parsers made by ``add_subparsers`` are of this class too (argparse's default), so
    ``transport-schema inspect`` says ``(see transport-schema inspect --help)``.
    """

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE (see PROG --help)`` on stderr and exit 2."""
        text = " ".join(message.split())  # argparse's messages may span lines
        sys.stderr.write(f"{self.prog}: error: {text} (see {self.prog} --help)\n")
        sys.exit(2)


def schema_path(text: str) -> Path:
    """The argument type of a schema file: a regular file no larger than the schema cap.

    The check runs before any read (``transport.schema.compiler.check_schema_file``), so a FIFO,
    a device or a directory is refused at once; the loader checks again on the open file.
    """
    if not text:
        raise argparse.ArgumentTypeError("an empty path is not a schema file")
    try:
        check_schema_file(Path(text))
    except SchemaError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return Path(text)


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (``nan``, ``inf``, 0 and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value
