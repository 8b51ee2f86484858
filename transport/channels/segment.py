"""One lifecycle for every channel segment (ring, board, run control), written once.

Every channel lives in ``/dev/shm/transport-<kind>-<name>`` (mode 0600, ``posix_fallocate``'d:
a full /dev/shm is an error at creation, never a SIGBUS) and starts with the 64-byte
``SegmentHeader`` of ``schema/channels.toml``::

    0        4        8        12       16                24       28       32
    +--------+--------+--------+--------+-----------------+--------+--------+
    | magic  | kind   |version | state  | fingerprint u64 |ownerpid|hdr size|
    +--------+--------+--------+--------+-----------------+--------+--------+
    32                 40                 48                 56       64
    +------------------+------------------+------------------+--------+
    | owner_start_time | size u64         | created_ns u64   | zero   |
    +------------------+------------------+------------------+--------+

The creator writes the magic, owner pid and start time first, then the rest and its kind's
body, then ``state = READY`` last with release. An opener waits (bounded) for READY, then checks
magic, kind, layout version, size and the payload fingerprint, each mismatch a typed error
naming both values. A segment whose owner is dead (pid gone, zombie, or reused: the start time
differs) is stale: replaced on creation, listed and removed by :func:`cleanup_stale`. Only a
header with the channel magic is ever stale: anything else named like a segment (a foreign or
empty file, a FIFO, a directory, another user's unreadable segment) is refused in one line and
never removed (docs/channels.md; what is not a file: transport/shm_segment.py). The owner marks
it CLOSED and unlinks it on close (only if the name still points at its inode).
Nothing here knows rings or boards: shm:// could adopt it as is.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from transport import native
from transport.channels.errors import (
    ChannelClosedError,
    ChannelError,
    ChannelInUseError,
    ChannelMismatchError,
    ChannelNotFoundError,
)
from transport.generated import channels as layout
from transport.shm_segment import (
    STALE_CREATING_AFTER,
    SegmentListing,
    check_segment_fd,
    check_segment_path,
    peek_segment,
    unreadable_note,
)

MAGIC = 0x48435054  # "TPCH"
LAYOUT_VERSION: int = int(layout.IR["version"])
HEADER_SIZE: int = layout.SegmentHeader.size  # 64
PREFIX = "transport-"
SHM_DIR = "/dev/shm"
Kind = layout.ChannelKind
State = layout.SegmentState
log = logging.getLogger(__name__)
_HDR = {f.name: f.offset for f in layout.SegmentHeader.ir.fields}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,180}$")


def segment_name(kind: Kind, name: str) -> str:
    """The shm_open name of a channel: ``/transport-<kind>-<name>``."""
    if not _NAME.match(name):
        raise ValueError(
            f"channel name {name!r}: 1-181 characters of A-Z a-z 0-9 . _ - (starting with a "
            "letter or digit)"
        )
    return f"/{PREFIX}{kind.name.lower()}-{name}"


def align(value: int, to: int = 64) -> int:
    return (value + to - 1) // to * to


def free_shm_bytes() -> int:
    """Bytes an unprivileged writer may still allocate in /dev/shm (-1 if unknown)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


class Segment:
    """A mapped channel segment: its header as a record, the mapping for the kind's views.

    The mapping is a ``native.SharedMapping``: every view made of ``map`` (the kinds' NumPy
    views, the board's snapshot views, the ring's batches) holds it, and it is unmapped with the
    last of them. ``close()`` ends this process's use of the segment at once: without views left
    it unmaps, with views left it swaps a private copy of the pages under them (docs/shm.md,
    "Lifetimes"), so a view kept past ``close()`` reads its values at close, never unmapped
    memory. The raw pointers (``word``, ``word64``, ``state_word``) must not be used after close:
    the kinds check ``closed`` (``require_open``) first.
    """

    def __init__(self, kind: Kind, name: str, fd: int, size: int, *, owner: bool) -> None:
        self.kind = kind
        self.name = name
        self.shm_name = segment_name(kind, name)
        self.path = os.path.join(SHM_DIR, self.shm_name[1:])
        self.size = size
        self._owner = owner
        self.pid = os.getpid()  # the process that mapped it (a forked child has a copy)
        self.inode = os.fstat(fd).st_ino
        try:
            self.mapping = native.SharedMapping(fd, size)
        except OSError as exc:
            raise ChannelError(f"cannot map {self.path}: {exc.strerror}") from exc
        self.map: Any = self.mapping.buffer
        """The writable buffer of the mapping: every view is made of it and keeps it alive."""
        self.header = layout.SegmentHeader.view(self.map)
        self.state_word = native.word(self.map, _HDR["state"])
        self.closed = False

    # -- creation and opening -------------------------------------------------------------

    @classmethod
    def create(
        cls,
        kind: Kind,
        name: str,
        size: int,
        *,
        fingerprint: int = 0,
        init: Callable[[Segment], None] | None = None,
    ) -> Segment:
        """Create the segment exclusively (a stale one is replaced, a live one never), write the
        header and, through ``init``, the kind's body; READY is written last."""
        shm_name = segment_name(kind, name)
        path = os.path.join(SHM_DIR, shm_name[1:])
        free = free_shm_bytes()
        if 0 <= free < size:
            raise ChannelError(_no_room(path, size, free, "no space"))
        for _ in range(5):
            try:
                fd = native.shm_create(shm_name, size)
            except FileExistsError:
                info = _inspect_or_none(path)
                if info is not None and not info.stale:
                    # live, starting up, unreadable or not ours: never replaced
                    raise info.refusal() from None
                try:
                    native.shm_unlink(shm_name)
                except FileNotFoundError:
                    pass
                continue
            except OSError as exc:
                raise ChannelError(
                    _no_room(path, size, free_shm_bytes(), str(exc.strerror))
                ) from exc
            try:
                seg = cls(kind, name, fd, size, owner=True)
            finally:
                os.close(fd)
            h = seg.header
            h["magic"] = MAGIC  # first: a header without it is never a creator's
            h["owner_pid"] = os.getpid()
            h["owner_start_time"] = native.proc_start_time(os.getpid())
            h["kind"] = int(kind)
            h["version"] = LAYOUT_VERSION
            h["fingerprint"] = fingerprint
            h["header_size"] = HEADER_SIZE
            h["size"] = size
            h["created_ns"] = time.time_ns()
            try:
                if init is not None:
                    init(seg)
            except BaseException:
                seg.close()
                raise
            native.store_release(seg.state_word, int(State.READY))
            return seg
        raise ChannelError(f"could not replace the stale segment {path}")

    @classmethod
    def open(
        cls,
        kind: Kind,
        name: str,
        *,
        fingerprint: int | None = None,
        timeout: float = 10.0,
    ) -> Segment:
        """Map an existing READY segment (waiting up to ``timeout`` for it) and validate it.
        A path that is not a channel segment (a FIFO, a directory, a file without the channel
        magic, an empty file older than 10 s) is a ChannelMismatchError at once, one another
        user's that this one may not read a ChannelInUseError; neither is waited for."""
        shm_name = segment_name(kind, name)
        path = os.path.join(SHM_DIR, shm_name[1:])
        deadline = time.monotonic() + timeout
        why = "it does not exist"
        while True:
            seg = cls._try_open(kind, name, shm_name)
            if isinstance(seg, Segment):
                try:
                    seg._validate(fingerprint)
                except BaseException:
                    seg.close()
                    raise
                return seg
            why = seg
            if time.monotonic() >= deadline:
                raise ChannelNotFoundError(f"{path}: no ready {kind.name.lower()} ({why})")
            time.sleep(0.01)

    @classmethod
    def _try_open(cls, kind: Kind, name: str, shm_name: str) -> Segment | str:
        path = os.path.join(SHM_DIR, shm_name[1:])
        try:
            fd = native.shm_open(shm_name)
        except FileNotFoundError:
            return "it does not exist"
        except PermissionError as exc:
            try:
                uid = os.lstat(path).st_uid
            except OSError:
                return "it does not exist"
            raise ChannelInUseError(f"{path} cannot be read ({unreadable_note(exc, uid)})") from exc
        except OSError as exc:  # EISDIR, ELOOP: not a file
            check_segment_path(path, exc, ChannelMismatchError)
            raise ChannelError(f"cannot open {path}: {exc.strerror}") from exc
        try:
            st = check_segment_fd(fd, path, ChannelMismatchError)  # a FIFO opens O_RDWR at once
            head = os.pread(fd, HEADER_SIZE, 0)
            what = _what(head)
            if what == "FOREIGN" or (
                what == "EMPTY" and time.time() - st.st_mtime > STALE_CREATING_AFTER
            ):
                raise ChannelMismatchError(_not_ours(path))
            if what == "EMPTY":
                return "it has no header yet"
            seg = cls(kind, name, fd, st.st_size, owner=False)
        finally:
            os.close(fd)
        state = native.load_acquire(seg.state_word)
        if state != State.READY:
            seg.close()
            return "it is being created" if state == State.CREATING else "it was closed"
        return seg

    def _validate(self, fingerprint: int | None) -> None:
        h = self.header
        checks: list[tuple[str, int, int]] = [
            ("magic", MAGIC, int(h["magic"])),
            ("kind", int(self.kind), int(h["kind"])),
            ("version", LAYOUT_VERSION, int(h["version"])),
            ("size", int(h["size"]), self.size),
        ]
        if fingerprint is not None:
            checks.append(("fingerprint", fingerprint, int(h["fingerprint"])))
        for field, expected, found in checks:
            if expected != found:
                raise ChannelMismatchError(
                    f"{self.path}: {field} is {found:#x}, expected {expected:#x}"
                    if field in ("magic", "fingerprint")
                    else f"{self.path}: {field} is {found}, expected {expected}"
                )
        if not native.peer_alive(int(h["owner_pid"]), int(h["owner_start_time"])):
            raise ChannelNotFoundError(
                f"{self.path} is stale: its owner pid {int(h['owner_pid'])} is dead"
            )

    # -- access -----------------------------------------------------------------------------

    def require_open(self, what: str = "") -> None:
        """ChannelClosedError once this process closed the segment (its pointers are gone)."""
        if self.closed:
            raise ChannelClosedError(
                f"{self.path}: {what + ': ' if what else ''}this {self.kind.name.lower()} "
                "was closed by this process"
            )

    def word(self, offset: int) -> Any:
        self.require_open()
        return native.word(self.map, offset)

    def word64(self, offset: int) -> Any:
        self.require_open()
        return native.word64(self.map, offset)

    def array(self, dtype: Any, offset: int, shape: tuple[int, ...]) -> np.ndarray:
        self.require_open()
        return np.ndarray(shape, dtype=dtype, buffer=self.map, offset=offset)

    @property
    def state(self) -> int:
        """The state word (CLOSED once this process closed the segment: no pointer is read)."""
        if self.closed:
            return int(State.CLOSED)
        return native.load_acquire(self.state_word)

    @property
    def owner_pid(self) -> int:
        self.require_open()
        return int(self.header["owner_pid"])

    @property
    def owner_alive(self) -> bool:
        return native.peer_alive(self.owner_pid, int(self.header["owner_start_time"]))

    def mark_closed(self) -> None:
        """State CLOSED (release) and wake whoever sleeps on the state word."""
        self.require_open()
        native.store_release(self.state_word, int(State.CLOSED))
        native.futex_wake(self.state_word)

    def unlink_if_ours(self) -> bool:
        """shm_unlink, only if the name still points at this mapping's inode."""
        try:
            if os.stat(self.path).st_ino != self.inode:
                return False
            native.shm_unlink(self.shm_name)
        except FileNotFoundError:
            return False
        return True

    @property
    def owner(self) -> bool:
        """This process created the segment (a child forked from the creator is not its owner:
        its copy of a ring or board closing, as ``sys.exit`` through a ``with`` block does,
        must not close or unlink the parent's)."""
        return self._owner and not self.forked

    @property
    def forked(self) -> bool:
        """This object was mapped in another process, which forked this one."""
        return os.getpid() != self.pid

    def close(self, *, unlink: bool | None = None) -> None:
        """End this process's use of the segment; the owner (or ``unlink=True``) first marks it
        CLOSED and unlinks it. The kinds drop their own views first; views still alive (kept by
        the caller) keep a private copy of the mapping taken now, unmapped when the last of
        them dies; with none left it is unmapped now (docs/shm.md, "Lifetimes")."""
        if self.closed:
            return
        if (self.owner if unlink is None else unlink) and not self.forked:
            self.mark_closed()
            self.unlink_if_ours()
        self.closed = True
        self.header = layout.SegmentHeader.zeros()
        self.state_word = None
        self.map = None
        self.mapping.close()


def _no_room(path: str, size: int, free: int, why: str) -> str:
    return (
        f"cannot create {path} ({size} bytes): {why}; /dev/shm has {free} bytes free. Enlarge "
        "/dev/shm (docker run --shm-size=1g) or remove stale segments "
        "(python -m transport.channels --cleanup)"
    )


# -- inspection and cleanup -----------------------------------------------------------------


def _what(head: bytes) -> str:
    """ours (the channel magic), EMPTY (under a header, or an all-zero one: a creator between
    shm_open and its first write) or FOREIGN (anything else)."""
    if len(head) < HEADER_SIZE or not any(head):
        return "EMPTY"
    return "ours" if int(layout.SegmentHeader.view(head)["magic"]) == MAGIC else "FOREIGN"


def _not_ours(path: str) -> str:
    return f"{path} exists and is not a channel segment: remove it if nothing uses it"


_OTHERS = ("EMPTY", "FOREIGN", "UNREADABLE", "NOT_A_FILE")


@dataclass(frozen=True)
class SegmentInfo(SegmentListing):
    """What ``python -m transport.channels --list`` shows about one
    ``/dev/shm/transport-{ring,board,control}-*`` entry.

    ``state``: a channel segment's SegmentState name (READY, CREATING, CLOSED, UNKNOWN); EMPTY
    (shorter than a header, or an all-zero one: a creator between shm_open and its first write,
    for up to 10 s); FOREIGN (anything else: not ours); UNREADABLE (``note`` says why);
    NOT_A_FILE (``note``: "a directory", "a FIFO", ...). Only a segment with the channel magic
    whose owner is dead (or that got no owner in 10 s) is stale: nothing else is ever removed.
    """

    path: str
    kind: str
    size: int
    state: str
    owner_pid: int
    owner_alive: bool
    age_s: float
    uid: int = -1
    note: str = ""
    NOT_OURS = "not a channel segment"

    @property
    def ours(self) -> bool:
        """A header with the channel magic."""
        return self.state not in _OTHERS

    def describe(self) -> str:
        """One ``--list`` line."""
        other = self.describe_other()
        if other is not None:
            return other
        owner = f"pid {self.owner_pid} {'alive' if self.owner_alive else 'dead'}"
        stale = "  STALE" if self.stale else ""
        return f"{self.path}  {self.kind}  {self.size} bytes  {self.state}  {owner}{stale}"

    def refusal(self) -> ChannelError:
        """Why a creator cannot replace this entry (it is not stale): a ChannelInUseError for a
        live owner, a creator starting up or another user's segment, a ChannelMismatchError for
        what is not a channel segment."""
        if self.state == "UNREADABLE":
            return ChannelInUseError(
                f"{self.path} cannot be read ({self.note}); it is not replaced"
            )
        if self.state == "NOT_A_FILE":
            return ChannelMismatchError(
                f"{self.path} is {self.note}, not a shared-memory segment: remove it if nothing "
                "uses it"
            )
        if self.ours or self.creating:
            who = f"pid {self.owner_pid}" if self.owner_pid else "a process starting up"
            return ChannelInUseError(
                f"{self.path} is in use by a live owner ({who}); it is not replaced"
            )
        return ChannelMismatchError(_not_ours(self.path))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stale": self.stale, "verdict": self.verdict}


def inspect_segment(path: str) -> SegmentInfo:
    """Read a channel segment's header without mapping it, without following a link and
    without blocking (transport/shm_segment.py). FileNotFoundError when it is gone."""
    peek = peek_segment(path, HEADER_SIZE)
    st = peek.st
    age = max(0.0, time.time() - st.st_mtime)

    def other(state: str, note: str = "") -> SegmentInfo:
        return SegmentInfo(path, "?", st.st_size, state, 0, False, age, st.st_uid, note)

    if peek.what == "not-a-file":
        return other("NOT_A_FILE", peek.note)
    if peek.what == "unreadable":
        return other("UNREADABLE", peek.note)
    what = _what(peek.head)
    if what != "ours":
        return other(what)
    h = layout.SegmentHeader.view(peek.head)
    pid = int(h["owner_pid"])
    try:
        kind = Kind(int(h["kind"])).name.lower()
        state = State(int(h["state"])).name
    except ValueError:
        kind, state = "?", "UNKNOWN"
    alive = native.peer_alive(pid, int(h["owner_start_time"])) if pid else False
    return SegmentInfo(path, kind, st.st_size, state, pid, alive, age, st.st_uid)


def _inspect_or_none(path: str) -> SegmentInfo | None:
    try:
        return inspect_segment(path)
    except FileNotFoundError:
        return None


def list_segments() -> list[SegmentInfo]:
    """Every ``/dev/shm/transport-{ring,board,control}-*`` entry, inspected: the channel
    segments and whatever else is named like one (``verdict`` foreign or unreadable)."""
    out: list[SegmentInfo] = []
    prefixes = tuple(f"{PREFIX}{k.name.lower()}-" for k in Kind)
    try:
        names = sorted(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return out
    for entry in names:
        if entry.startswith(prefixes):
            info = _inspect_or_none(os.path.join(SHM_DIR, entry))
            if info is not None:
                out.append(info)
    return out


def cleanup_stale(errors: list[str] | None = None) -> list[SegmentInfo]:
    """Unlink every stale channel segment (never a foreign, empty or unreadable entry); returns
    the ones removed. A segment that cannot be removed does not stop the others: its error is
    added to ``errors`` (logged when there is no such list)."""
    removed = []
    failed: list[str] = []
    for info in list_segments():
        if info.stale:
            try:
                native.shm_unlink("/" + os.path.basename(info.path))
                removed.append(info)
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"cannot remove {info.path}: {exc.strerror}")
    if errors is not None:
        errors.extend(failed)
    else:
        for text in failed:
            log.warning("%s", text)
    return removed
