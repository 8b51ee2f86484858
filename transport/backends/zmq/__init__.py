"""zmq+ipc:///path and zmq+tcp://host:port: the protocol's frames over ZeroMQ (docs/zmq.md).

One protocol frame is one two-part ZeroMQ message ``[header (9 bytes), body]``. The server is a
ROUTER (one Session per client routing id, any number of clients on one socket); the client is a
DEALER, so requests can be pipelined and a late reply to an abandoned request is recognised by
its msg_id and dropped. Receives go through ``zmq_recv`` (``Socket.recv_into``) straight into the
channel buffer at BODY_OFFSET: the one copy that remains is libzmq's message -> that buffer (the
header comes first, so body_len is checked against the maximum before the buffer grows). Sends
of bodies of ``ZERO_COPY_THRESHOLD`` bytes or more hand the buffer to libzmq without a copy.

Dead peers: a socket monitor reports disconnects (a closed or reset connection, or ZMTP
heartbeats that stopped); a disconnect while a request waits is ``PeerGoneError``, and no reply
by the deadline is ``TransportTimeoutError``. tcp can be encrypted and authenticated with CURVE;
``python -m transport.backends.zmq keygen DIR`` makes key pairs.
"""

from __future__ import annotations

from transport.backends.zmq.client import ZmqChannel, client_context, open_channel
from transport.backends.zmq.curve import keygen, main
from transport.backends.zmq.server import Listener
from transport.backends.zmq.wire import (
    DEFAULT_HEARTBEAT,
    ENV_ALLOWED_CLIENTS,
    ENV_CLIENT_SECRET,
    ENV_CLIENTS_DIR,
    ENV_SERVER_PUBLIC,
    ENV_SERVER_SECRET,
    MAX_SESSIONS,
    ZERO_COPY_THRESHOLD,
    Address,
    parse_url,
)

__all__ = [
    "DEFAULT_HEARTBEAT",
    "ENV_ALLOWED_CLIENTS",
    "ENV_CLIENTS_DIR",
    "ENV_CLIENT_SECRET",
    "ENV_SERVER_PUBLIC",
    "ENV_SERVER_SECRET",
    "MAX_SESSIONS",
    "ZERO_COPY_THRESHOLD",
    "Address",
    "Listener",
    "ZmqChannel",
    "client_context",
    "keygen",
    "main",
    "open_channel",
    "parse_url",
]
