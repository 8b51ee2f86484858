"""What a ``/dev/shm/transport-*`` entry is, told without blocking and without following a link:
the one rule (in Python) for every shared-memory segment of the project, the shm:// regions
(transport/backends/shm/region.py) and the channels' segments (transport/channels/segment.py).

A path that is not a regular file (a directory, a FIFO, a link, a socket, a device) is never a
segment: it is refused with :func:`not_a_segment`'s words and never opened for reading (an
``open`` of a FIFO would block). Node: node_bridge/src/shm_segment.ts, the same words.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from transport.errors import ConnectError

STALE_CREATING_AFTER = 10.0
"""Seconds a header-less segment may take to get its header (a creator between shm_open and its
first write); older, it is foreign, never removed."""


class SegmentListing:
    """The listing rules of a ``/dev/shm/transport-*`` entry, the same for shm:// regions
    (``RegionInfo``) and channel segments (``channels.segment.SegmentInfo``): a subclass has the
    fields below and says which entries are ``ours`` (its magic) and how it calls the others
    (``NOT_OURS``)."""

    NOT_OURS = "not a transport segment"
    path: str
    size: int
    state: str  # the header's state name, or EMPTY, FOREIGN, UNREADABLE, NOT_A_FILE
    owner_pid: int
    owner_alive: bool
    age_s: float
    note: str

    @property
    def ours(self) -> bool:
        raise NotImplementedError

    @property
    def creating(self) -> bool:
        """A header-less entry young enough to be a creator's before its first header write."""
        return self.state == "EMPTY" and self.age_s <= STALE_CREATING_AFTER

    @property
    def stale(self) -> bool:
        """Replaceable: a header of ours whose owner is dead (or that got no owner in 10 s).
        Never an entry without our magic: it is not ours to remove."""
        if not self.ours:
            return False
        if self.owner_pid:
            return not self.owner_alive
        return self.age_s > STALE_CREATING_AFTER

    @property
    def verdict(self) -> str:
        """live, stale, creating, foreign or unreadable."""
        if self.state == "UNREADABLE":
            return "unreadable"
        if self.ours:
            return "stale" if self.stale else "live"
        return "creating" if self.creating else "foreign"

    def describe_other(self) -> str | None:
        """The listing line of an entry that is not ours (None for ours: its own words)."""
        if self.state == "UNREADABLE":
            return f"{self.path}  unreadable ({self.note})"
        if self.state == "NOT_A_FILE":
            return f"{self.path}  foreign  ({self.note}, not a shared-memory segment)"
        if not self.ours:
            what = "being created" if self.creating else self.NOT_OURS
            return f"{self.path}  {self.verdict}  ({what}: {self.size} bytes)"
        return None


class NotASegmentError(ConnectError):
    """The URL's /dev/shm path is there but is not a segment (a FIFO, a directory, ...): the
    machine's state, no server to start, so a client adds no "is a server serving this URL?"
    hint (``local_config``, as for a bad key file). Node: ``NotASegmentError``."""

    local_config = True


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, in words ("a directory", "a FIFO", ...)."""
    for test, words in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def not_a_segment(path: str, mode: int) -> str:
    """The one refusal text (clients and servers) for a path that is not a regular file."""
    return f"{path} is {file_kind(mode)}, not a shared-memory segment: remove it if nothing uses it"


def check_segment_fd(
    fd: int, path: str, error: type[Exception] = NotASegmentError
) -> os.stat_result:
    """fstat of an opened segment; ``error`` (a NotASegmentError unless given) when it is not a
    regular file (a FIFO, ...)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise error(not_a_segment(path, st.st_mode))
    return st


def check_segment_path(path: str, exc: OSError, error: type[Exception] = NotASegmentError) -> None:
    """After shm_open failed with ``exc`` (EINVAL or EISDIR for a directory, ELOOP for a link):
    ``error`` (a NotASegmentError unless given) naming what the path is when it is not a regular
    file; else returns."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise error(not_a_segment(path, st.st_mode)) from exc


def unreadable_note(exc: OSError, uid: int) -> str:
    """Why a segment cannot be read, for a listing or a refusal: "permission denied; owner uid
    N"."""
    return f"{(exc.strerror or str(exc)).lower()}; owner uid {uid}"


@dataclass(frozen=True)
class Peek:
    """A look at a path: its ``lstat`` and, for a regular file this process may read, its first
    bytes. ``what`` is "file", "not-a-file" (``note``: "a directory", ...) or "unreadable"
    (``note``: "permission denied; owner uid N")."""

    st: os.stat_result
    what: str
    note: str = ""
    head: bytes = b""


def peek_segment(path: str, size: int) -> Peek:
    """``lstat``, then ``open(O_RDONLY|O_NONBLOCK|O_NOFOLLOW)`` and ``fstat`` (the entry may have
    been replaced since), then up to ``size`` bytes from offset 0. Nothing is followed, no FIFO
    blocks. FileNotFoundError when the path is gone."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        return Peek(st, "not-a-file", file_kind(st.st_mode))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return Peek(st, "unreadable", unreadable_note(exc, st.st_uid))
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode):
            return Peek(st, "not-a-file", file_kind(fst.st_mode))
        head = os.pread(fd, size, 0)
    except OSError as exc:
        return Peek(st, "unreadable", unreadable_note(exc, st.st_uid))
    finally:
        os.close(fd)
    return Peek(fst, "file", head=head)
