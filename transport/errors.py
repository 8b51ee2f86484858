"""One typed error tree for the whole library (modelled on httpx's).

Every error the library raises derives from ``TransportError``. Codec errors carry a stable
``code`` string that the TypeScript side uses too, so the conformance suite can check that both
languages refuse the same input for the same reason.
"""

from __future__ import annotations

from typing import Any


class TransportError(Exception):
    """Base class of every error raised by the transport library."""


class SchemaError(TransportError):
    """A schema file is invalid. The message names the file, the struct and the field."""

    def __init__(self, message: str, *, file: str = "", struct: str = "", field: str = "") -> None:
        self.file = file
        self.struct = struct
        self.field = field
        self.reason = message
        place = ", ".join(
            part
            for part in (f"struct {struct}" if struct else "", f"field {field}" if field else "")
            if part
        )
        text = f"{place}: {message}" if place else message
        super().__init__(f"{file}: {text}" if file else text)


class CodecError(TransportError):
    """A value or a buffer cannot be encoded or decoded under a struct's layout."""

    code = "codec"

    def __init__(self, message: str, *, struct: str = "", field: str = "") -> None:
        self.struct = struct
        self.field = field
        self.reason = message
        location = f"{struct}.{field}" if struct and field else struct or field
        super().__init__(f"{location}: {message}" if location else message)


class BufferSizeError(CodecError):
    """The buffer is shorter than the struct (or not the exact size where one is required)."""

    code = "buffer_size"


class ValueRangeError(CodecError):
    """An integer does not fit the field's type, or a value has the wrong kind."""

    code = "out_of_range"


class ValueTypeError(CodecError):
    """A value has the wrong kind for its field (a string for a number, an int for a bool)."""

    code = "wrong_type"


class ArrayLengthError(CodecError):
    """An array value does not have the field's fixed element count."""

    code = "array_length"


class InvalidBoolError(CodecError):
    """A bool byte other than 0 or 1 was found in strict decoding."""

    code = "invalid_bool"


class InvalidEnumError(CodecError):
    """An enum value is not declared by the enum (encoding, or strict decoding)."""

    code = "invalid_enum"


class NonCanonicalError(CodecError):
    """A NaN other than the canonical quiet NaN was found in strict decoding."""

    code = "non_canonical"


class MissingFieldError(CodecError):
    """No value was given for a field of the struct."""

    code = "missing_field"


class UnknownFieldError(CodecError):
    """A value was given for a name that is not a field of the struct."""

    code = "unknown_field"


class ConnectError(TransportError):
    """The peer could not be reached before the deadline (nothing listens, refused, bad URL)."""


class RegionInUseError(ConnectError):
    """An shm:// region leased by another live client (one client per region): ``holder`` is
    its pid (this process's own when another client of this process holds it)."""

    def __init__(self, text: str, holder: int) -> None:
        self.holder = holder
        super().__init__(text)


class TransportTimeoutError(TransportError):
    """A wait for the peer passed its deadline; the peer may be alive but silent."""


class PeerGoneError(TransportError):
    """The peer closed the connection or died while a request was outstanding."""


class ProtocolError(TransportError):
    """The peer sent something the protocol does not allow (bad frame, wrong msg_id, ...)."""


class BadFrameError(ProtocolError):
    """A frame header or body that cannot be valid (unknown type, wrong size, too large)."""

    msg_id: int = 0  # the offending frame's msg_id, when its header could be read


class ReplyTooLargeError(BadFrameError):
    """A reply larger than this client's ``max_body`` (``body_len`` bytes over ``max_body``):
    the client's own limit, not a disagreement between the peers, so its hint says how to raise
    it. Every socket client drops the reply and keeps the connection (shm has no such limit)."""

    body_len: int = 0
    max_body: int = 0


def reply_too_large(body_len: int, max_body: int, msg_id: int = 0) -> ReplyTooLargeError:
    """The error of a reply of ``body_len`` bytes over the client's ``max_body`` (one text for
    every client backend; Node: ``replyTooLarge``)."""
    error = ReplyTooLargeError(
        f"the server's reply is {body_len} bytes, over this client's max_body of {max_body} bytes"
    )
    error.body_len, error.max_body, error.msg_id = body_len, max_body, msg_id
    return error


class VersionMismatchError(ProtocolError):
    """The peers speak different major protocol versions."""


class FingerprintMismatchError(ProtocolError):
    """The peers compiled different schemas; the message names both fingerprints."""

    def __init__(self, message: str, *, local: int = 0, remote: int = 0) -> None:
        self.local = local
        self.remote = remote
        super().__init__(message)


class RegionMismatchError(ProtocolError):
    """A control-block field of an shm:// region differs from what this side expects."""

    def __init__(self, url: str, field: str, expected: object, found: object) -> None:
        self.field = field
        self.expected = expected
        self.found = found
        super().__init__(f"{url}: control block field {field}: expected {expected}, found {found}")


class WorkerDiedError(TransportError):
    """A worker process of a pool died or did not start: its envs lost their state."""


class ActionError(TransportError, ValueError):
    """An action argument that fits neither one env's action nor one action per env, or whose
    values the action field cannot hold: raised by the client before any bytes move, the same
    on every backend. The message names the action space, what was given and what to pass."""


class AdapterError(TransportError):
    """An adapter cannot work with this server (wrong number of envs, missing roles, no URL)."""


class RemoteError(TransportError):
    """The peer answered ERROR: ``code`` is the protocol error code, ``text`` its message."""

    def __init__(self, code: int, name: str, text: str) -> None:
        self.code = code
        self.name = name
        self.text = text
        super().__init__(f"{name} ({code}): {text}")


REMOTE_TRACEBACK_MARKER = "\n--- server traceback (last frames) ---\n"
"""Separates an ENV_ERROR text's message from the env's trimmed traceback that follows it (the
server's runtime writes it; ``EnvError`` splits it off into ``remote_traceback``)."""


class EnvError(RemoteError):
    """The server's env raised (ERROR code 10, ENV_ERROR). ``env_id`` is the index of the env
    that failed (the text starts with ``env {i}:``), or None when the server did not say.
    ``remote_traceback`` holds the last frames of the env's traceback as the server formatted
    them ("" when it sent none); ``str()`` shows them after the message.

    The server reset that env (or recreated it) and the other envs of the request did their
    step: the next request works.
    """

    def __init__(self, code: int, name: str, text: str, env_id: int | None = None) -> None:
        message, _, remote_traceback = text.partition(REMOTE_TRACEBACK_MARKER)
        super().__init__(code, name, message)
        self.env_id = env_id
        self.remote_traceback = remote_traceback
        if remote_traceback:
            self.args = (f"{self.args[0]}{REMOTE_TRACEBACK_MARKER}{remote_traceback}",)


class NoProgressError(EnvError):
    """An env of a decision-boundary run stopped advancing (the server's no-progress watchdog:
    frames 0 for ``stall_requests`` requests in a row, or no decision within ``max_frames``).
    ``requests``: the env's request numbers since its reset that made no progress (first, last);
    ``last_state``: the env's last result (scalar and counter fields). The server reset the env.
    """

    def __init__(
        self,
        code: int,
        name: str,
        text: str,
        env_id: int | None,
        requests: tuple[int, int],
        last_state: dict[str, Any],
    ) -> None:
        super().__init__(code, name, text, env_id)
        self.requests = requests
        self.last_state = last_state


CODEC_ERRORS: dict[str, type[CodecError]] = {
    cls.code: cls
    for cls in (
        BufferSizeError,
        ValueRangeError,
        ValueTypeError,
        ArrayLengthError,
        InvalidBoolError,
        InvalidEnumError,
        NonCanonicalError,
        MissingFieldError,
        UnknownFieldError,
    )
}
