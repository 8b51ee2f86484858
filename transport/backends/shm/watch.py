"""A server's watch over its own region (docs/shm.md "A region changed under its server").

Another same-uid process can truncate, resize, remove or scribble on a live segment. The
server's wait loop only reads the doorbell and the state word, so before this watch an idle
server kept running while every new client was refused. Every ``WATCH_PERIOD_S`` (idle or
busy: one ``time.monotonic()`` per loop turn, one ``stat`` per period) the server asks:

- ``lost()``: is ``/dev/shm/transport-NAME`` still this server's inode, at the size it created?
  (checked before anything past the first page is read: a shrunk region is never touched).
  If not, the server must stop: it says why, and ``close()`` removes what is still its own.
- ``repair()``: do the control block fields the server wrote once (magic, version, num_envs,
  obs/act/slot sizes, fingerprint, owner pid and start time) and the schema area still hold
  what it wrote? If not, it rewrites them and says which changed (one line).
- ``foreign_holder()``: is the live process in ``client_pid`` a client? A client maps the
  region before it takes the lease and stores ``client_start_time`` right after; a live
  process that does not map it, or whose lease stays incomplete for ``UNFINISHED_LEASE_S``,
  is not one, and its lease is reclaimed.
"""

from __future__ import annotations

import logging
import os
import time

from transport.backends.shm.region import SHM_DIR, Region

log = logging.getLogger("transport.shm")

WATCH_PERIOD_S = 0.25
"""How often a server checks its region (idle or busy)."""
UNFINISHED_LEASE_S = 1.0
"""How long a live ``client_pid`` may keep ``client_start_time`` 0 (a lease being taken)."""

_HEX_FIELDS = {"magic": 8, "fingerprint": 16}


def _show(field: str, value: int) -> str:
    width = _HEX_FIELDS.get(field)
    return f"0x{value:0{width}X}" if width else str(value)


def maps_segment(pid: int, inode: int) -> bool | None:
    """Does process ``pid`` map the /dev/shm file of ``inode``? None: its maps cannot be read."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    ino = str(inode).encode()
    if ino not in data:  # the common answer for a process that does not map it: no parsing
        return False
    prefix = SHM_DIR.encode() + b"/"
    for line in data.splitlines():
        parts = line.split(None, 5)  # address perms offset dev inode path
        if len(parts) == 6 and parts[4] == ino and parts[5].startswith(prefix):
            return True
    return False


class RegionWatch:
    """What a server checks about its own region; see the module docstring."""

    def __init__(
        self, url: str, path: str, region: Region, fields: dict[str, int], area: bytes
    ) -> None:
        self.url = url
        self.path = path
        self.region = region
        self.size = region.size
        self.inode = region.inode
        self.fields = dict(fields)
        self.area = area
        self.area_at = region.size - len(area)
        self.next_at = time.monotonic() + WATCH_PERIOD_S
        """When the server looks next (``time.monotonic()``; it moves this on each look)."""
        self._verified: tuple[int, int] | None = None  # the holder known to be a client
        self._seen_pid = 0  # the live holder being looked at
        self._zero_since: float | None = None  # since when it has been attaching (start time 0)
        self._unmapped = False  # the last look found the holder not mapping the segment

    def lost(self) -> str | None:
        """Why the server cannot keep serving this region (gone, replaced, resized), or None."""
        where = f"while this server (pid {os.getpid()}) was serving"
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return (
                f"{self.url}: another process removed {self.path} {where}; the server stops "
                "(new clients cannot find the region)"
            )
        except OSError:
            return None  # cannot tell (the next look may)
        if st.st_ino != self.inode:
            return (
                f"{self.url}: another process replaced {self.path} with another segment {where}; "
                "the server stops and leaves that segment alone"
            )
        if st.st_size != self.size:
            what = "truncated" if st.st_size < self.size else "resized"
            return (
                f"{self.url}: another process {what} {self.path} (now {st.st_size} bytes, was "
                f"{self.size}) {where}; the server stops and removes it"
            )
        return None

    def repair(self) -> None:
        """Rewrite the control block fields and the schema area another process changed, and
        say which (one warning line). Only after ``lost()`` found the size intact."""
        region, changed = self.region, []
        for field, wrote in self.fields.items():
            found = region.get(field)
            if found != wrote:
                region.set(field, wrote)
                changed.append(
                    f"control block field {field} was changed to {_show(field, found)} (this "
                    f"server wrote {_show(field, wrote)})"
                )
        start, end = self.area_at, self.size
        if self.area and region.map[start:end] != self.area:
            region.map[start:end] = self.area
            changed.append("the schema area was changed")
        if changed:
            log.warning(
                "%s: %s by another process; the server rewrote it", self.url, "; ".join(changed)
            )

    def foreign_holder(self, pid: int, start_time: int) -> str | None:
        """Why the live process ``pid`` in ``client_pid`` (with ``client_start_time``) holds no
        real lease, or None (a client, or it cannot be told yet).

        "Does not map" must hold at two looks in a row (the words a look read may be stale).
        "Still 0 for a second" means seen attaching at every look for a second: any look that
        finds a completed lease (even one verified before: the same process takes the lease
        again with the same pid and start time) ends that attach, so the next attach is timed
        from its own first look and not from an earlier client's."""
        if start_time != 0:
            self._zero_since = None  # a completed lease: any attach seen before is over
        if self._verified == (pid, start_time):
            return None
        now = time.monotonic()
        if pid != self._seen_pid:
            self._seen_pid, self._zero_since, self._unmapped = pid, None, False
            if maps_segment(pid, self.inode) is False:
                self._unmapped = True  # told at the next look if it still holds no mapping
                return None
        elif self._unmapped:
            # at two looks in a row: one look's words may be stale (read before this server
            # stalled), and the same process, unmapped between a release and its next attach,
            # then holds the lease again with the same pid and start time
            if maps_segment(pid, self.inode) is False:
                return (
                    f"{self.url}: client pid {pid} is alive but does not map {self.path}: it is "
                    "not a client (another process wrote client_pid); reclaiming the lease"
                )
            self._unmapped = False
        if start_time == 0:
            # measured from the first check that saw this holder attaching, not from when the
            # pid was first seen: the same process may release and take the lease again
            if self._zero_since is None:
                self._zero_since = now
            if now - self._zero_since < UNFINISHED_LEASE_S:
                return None
            return (
                f"{self.url}: client pid {pid} never completed taking the lease "
                f"(client_start_time still 0 after {UNFINISHED_LEASE_S:g} s); reclaiming the lease"
            )
        self._verified = (pid, start_time)
        return None

    def forget(self) -> None:
        """The lease was reclaimed or released: the next holder is looked at afresh."""
        self._verified = None
        self._seen_pid = 0
        self._zero_since = None
        self._unmapped = False


CONTROL_FIELDS = (
    "magic",
    "version",
    "num_envs",
    "obs_size",
    "act_size",
    "slot_size",
    "fingerprint",
    "owner_pid",
    "owner_start_time",
)
"""The control block fields a server writes once, before READY (``CB`` names them)."""
