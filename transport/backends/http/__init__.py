"""http://host:port: each request is one ``POST /v1/<method>`` on a keep-alive HTTP/1.1 connection.

The mapping is docs/protocol.md "HTTP mapping". Both ends are small hand-written HTTP/1.1 over
plain TCP sockets (``TCP_NODELAY``), not ``http.server``/``http.client``: those allocate and parse
much more per request than a step is worth.

Server (``Listener``): one thread and one ``Session`` per TCP connection (the session holds that
connection's envs, as on ``unix://``). Every request must carry ``X-Transport-Fingerprint: <16
hex>`` except ``hello``, whose body carries the fingerprint: a missing header is ``400`` with
ERROR HELLO_REQUIRED (5), a malformed one ``400`` BAD_FRAME (1), a different one ``409``
FINGERPRINT_MISMATCH (7, text naming both) and the connection is closed. A request with the right
header on a connection that has not said ``hello`` yet is served as if it had (so ``curl`` works
with one request); an empty ``hello`` body with the right header stands for our own ``Hello``.
Statuses: 200 success (``X-Transport-Msg-Type: <decimal>``), 400 malformed request / bad body,
404 unknown method, 405 not POST, 409 fingerprint or version, 413 body over
``max_body`` (refused from Content-Length, the body is never read), 422 invalid or masked action,
bad batch, not reset, 500 env error / internal. Refusals carry the ERROR body (ErrorHead + text)
and ``X-Transport-Error: <code>``. ``Accept: application/json`` renders any response as JSON and
``Content-Type: application/json`` request bodies are encoded with the schema's codecs (``curl``).
Garbage that is not HTTP gets a 400 and the connection is closed; other connections go on.
Env state lives in the connection's session: served from a factory, each new connection gets
fresh envs, so give ``curl`` several URLs in one command (it reuses the connection), e.g.
``curl -X POST -H 'X-Transport-Fingerprint: ..' -H 'Accept: application/json' URL/v1/reset
URL/v1/spaces``.

Client (``open_channel``): one persistent socket; each request is one ``sendmsg`` of a cached
header block and the body; the response head is read into a reused buffer (parsed heads are
cached by their bytes, so a steady-state step parses nothing) and the body is received into
``channel.buffer`` at ``BODY_OFFSET``. Refusals come back as ``(ERROR, body)``. The server closing
the connection (``Connection: close``, EOF, reset) is ``PeerGoneError``; there is no silent
reconnect.

Binds loopback only unless ``allow_remote=True`` (or ``?allow_remote=1`` in the URL).
"""

from __future__ import annotations

from transport.backends.http.client import HttpChannel, open_channel
from transport.backends.http.server import Listener
from transport.backends.http.wire import METHODS, STATUS_OF_ERROR, Address, parse_url

__all__ = [
    "METHODS",
    "STATUS_OF_ERROR",
    "Address",
    "HttpChannel",
    "Listener",
    "open_channel",
    "parse_url",
]
