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


class Channel(Protocol):
    """What a backend gives the client: one request/response exchange at a time."""

    info: dict[str, Any]

    @property
    def buffer(self) -> bytearray:
        """The receive buffer; response bodies start at ``BODY_OFFSET`` in it."""
        ...

    @property
    def generation(self) -> int:
        """Changes when ``buffer`` is replaced (views of the old one must be rebuilt)."""
        ...

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        """Send a request; return the response's msg_type and body (valid until the next call)."""
        ...

    def close(self) -> None: ...


class Listener(Protocol):
    """A backend's server: ``start()`` binds (errors surface there), ``serve_forever()`` serves
    until ``close()``, which removes what ``start()`` created (socket files, segments)."""

    url: str

    def start(self) -> None: ...

    def serve_forever(self) -> None: ...

    def close(self) -> None: ...
