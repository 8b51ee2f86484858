"""The typed errors of the channels (all are ``TransportError``s)."""

from __future__ import annotations

from transport.errors import ConnectError, PeerGoneError, TransportError, TransportTimeoutError


class ChannelError(TransportError):
    """Base of every channel error."""


class ChannelInUseError(ChannelError, ConnectError):
    """The segment belongs to a live owner (never replaced), or to another user (this one may
    not read it: "cannot be read (permission denied; owner uid N)"), or a lease is held by a
    live peer."""


class ChannelNotFoundError(ChannelError, ConnectError):
    """No ready segment of that name appeared before the timeout."""


class ChannelMismatchError(ChannelError, ConnectError):
    """The segment is of another kind, layout version, size or payload fingerprint, or the path
    is no channel segment at all: a FIFO, a directory (``not a shared-memory segment``), a file
    without the channel magic or an empty one older than 10 s (``not a channel segment``)."""


class ChannelClosedError(ChannelError, PeerGoneError):
    """The other side closed the channel cleanly (or the owner closed the segment)."""


class PeerDiedError(ChannelError, PeerGoneError):
    """The process on the other side died (its pid is gone, a zombie, or reused)."""


class ChannelTimeoutError(ChannelError, TransportTimeoutError):
    """A bounded wait ended before the channel was ready."""


class TornReadError(ChannelError):
    """A board read kept racing publishes for longer than its retry budget."""


class ChannelCorruptError(ChannelError):
    """A word of the segment holds a value its protocol never writes (a board's ``active`` slot
    out of range, a version that went backwards): something other than the channel's own code
    wrote it. Raised instead of reading on; the board's publisher repairs such words."""
