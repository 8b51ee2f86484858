/**
 * zmq+ipc:///path and zmq+tcp://host:port: the protocol's frames over ZeroMQ (docs/zmq.md),
 * interoperating byte for byte with transport/backends/zmq.py.
 *
 * One protocol frame is one two-part ZeroMQ message `[header (9 bytes), body]`. The server is a
 * `Router` (one Session per client routing id, any number of clients on one socket); the client
 * is a `Dealer` whose replies are matched to requests by msg_id (a late reply to an abandoned
 * request is dropped), so requests can be pipelined (`sendRequest` / `recvResponse`).
 *
 * Copies (zeromq.js copies parts of at most 128 bytes itself, and wraps larger ones without a
 * copy, in both directions):
 * - server receive: none of ours: the body part's Buffer (libzmq's message, wrapped by
 *   zeromq.js) is handed to `Session.handle` as it is.
 * - server send: the body is built in the Session's buffer. Up to 128 bytes zeromq.js copies it
 *   synchronously; up to `ZERO_COPY_THRESHOLD` we copy it once into a fresh Buffer (libzmq sends
 *   it later from its I/O thread, and a pipelined next request would overwrite the Session's
 *   buffer under it); at or above it the Session's buffer itself is handed over and the Session
 *   gets a fresh one (`detachBuffer`).
 * - client send: the same rule for request bodies (at or above the threshold the caller's buffer
 *   goes to libzmq: it must not change until the reply arrives, which `Client` guarantees).
 * - client receive: one copy, libzmq's message -> the channel buffer at BODY_OFFSET (16-byte
 *   aligned views; libzmq cannot receive into a caller's buffer, same as Python).
 *
 * Dead peers: libzmq's hiccup message (ZMQ_HICCUP_MSG) arrives in the Dealer's reply queue when
 * the connection closes, resets or its ZMTP heartbeats stop; it is `PeerGoneError` for the waiting
 * request and every later one (no reconnection: ZMQ_RECONNECT_STOP after a disconnect; the
 * server's session went with it). No reply by the deadline is `TransportTimeoutError`. The event
 * observer is read only while connecting, so an idle client holds nothing on node's event loop.
 * tcp may use CURVE with a ZAP allow list.
 *
 * Files: wire.ts (constants, addresses, CURVE keys), client.ts, server.ts.
 */

export * from "./wire";
export { ZmqChannel, openChannel } from "./client";
export { ZmqListener, listen } from "./server";
