"""The two small interfaces every backend implements (registry: ``transport.backends``).

A backend module provides:

- ``open_channel(url, *, timeout, max_body, schema) -> Channel``: the client side, one
  request/response exchange at a time, under the one ``transport.client.Client``;
- ``Listener(url, host, *, max_body) -> Listener``: the server side, serving the envs of an
  ``EnvHost`` (``transport.runtime``) to its clients. A listener moves bytes (or exposes shm
  slots) and hands requests to the runtime; it knows nothing of observations, masks or
  auto-reset.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from transport.codec import StructCodec
from transport.errors import ProtocolError
from transport.protocol import BODY_OFFSET, read_final_tail

MAX_NUM_ENVS = 65536
"""The most envs one server serves per connection (or per shm region); clients refuse more."""


class Channel(Protocol):
    """What a backend gives the one ``transport.client.Client``: one exchange at a time.

    ``request`` sends a request body and returns the response's msg_type and body (ERROR bodies
    included: the client maps them to typed errors, one function for every backend). Results
    are read through ``result_records``: views of the channel's memory (a receive buffer, or an
    shm region's slots), so a steady-state step allocates nothing and copies nothing more.
    """

    url: str
    """The URL this channel is connected to (auto:// resolves to the backend it chose)."""
    info: dict[str, Any]
    """The server's info map (HELLO_RESP), set by the handshake."""

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        """Send a request; return the response's msg_type and body (valid until the next call)."""
        ...

    def request_area(self, codec: StructCodec, count: int) -> tuple[np.ndarray, Any]:
        """Where the client writes ``count`` request records (``codec``'s fields) and the body to
        pass to ``request`` for them: a buffer of the client's own, or (shm) the slots
        themselves, so a request body is never copied on its way."""
        ...

    def result_records(
        self, body: memoryview, codec: StructCodec, count: int | None, finals: bool
    ) -> np.ndarray:
        """The results of the response ``body`` that ``request`` just returned: a (count,)
        record array (a 0-d record for ``count`` None), views valid until the next request.
        The same array object comes back while the channel's memory stays, so callers may
        cache views of its fields. ``finals``: a SAME_STEP step response, whose final results
        ``final_records`` then returns. Raises ``ProtocolError`` for a body of the wrong size."""
        ...

    def final_records(self) -> list[tuple[int, np.ndarray]]:
        """(env index, final result record) of each episode the last step ended (SAME_STEP)."""
        ...

    def close(self) -> None: ...


class BufferChannel:
    """Base of the channels whose response bodies land in ``buffer`` at ``BODY_OFFSET`` (unix,
    http, zmq): results are views of that buffer; SAME_STEP final results are parsed from the
    response's tail (u32 count, then u32 env index + result each) and copied."""

    def __init__(self, url: str = "") -> None:
        self.url = url
        self.info: dict[str, Any] = {}
        self._records: dict[int | None, tuple[int, np.ndarray]] = {}
        self._finals: list[tuple[int, np.ndarray]] = []

    @property
    def buffer(self) -> bytearray:
        """The receive buffer; response bodies start at ``BODY_OFFSET`` in it."""
        raise NotImplementedError

    @property
    def generation(self) -> int:
        """Changes when ``buffer`` is replaced (views of the old one must be rebuilt)."""
        raise NotImplementedError

    def request_area(self, codec: StructCodec, count: int) -> tuple[np.ndarray, Any]:
        body = bytearray(codec.size * count)
        return codec.view(body, count=count), body

    def result_records(
        self, body: memoryview, codec: StructCodec, count: int | None, finals: bool
    ) -> np.ndarray:
        length = codec.size * (1 if count is None else count)
        if body.nbytes != length:
            if not finals:
                raise ProtocolError(f"response has {body.nbytes} bytes, expected {length}")
            tail = read_final_tail(body, length, codec.size, 1 if count is None else count)
            # copies: the next response overwrites the buffer
            self._finals = [(i, codec.view(bytes(body[at : at + codec.size]))) for i, at in tail]
        elif self._finals:
            self._finals = []
        generation = self.generation
        cached = self._records.get(count)
        if cached is not None and cached[0] == generation:
            return cached[1]
        records = codec.view(self.buffer, BODY_OFFSET, count=count)
        self._records[count] = (generation, records)
        return records

    def final_records(self) -> list[tuple[int, np.ndarray]]:
        return self._finals


class Listener(Protocol):
    """A backend's server: ``start()`` binds (errors surface there), ``serve_forever()`` serves
    until ``close()``, which removes what ``start()`` created (socket files, segments)."""

    url: str

    def start(self) -> None: ...

    def serve_forever(self) -> None: ...

    def close(self) -> None: ...
