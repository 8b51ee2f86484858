/**
 * http://host:port: each request is one `POST /v1/<method>` on a keep-alive HTTP/1.1
 * connection, the mapping of docs/protocol.md "HTTP mapping", behaviour for behaviour the
 * Python backend's (transport/backends/http.py), over `node:http`.
 *
 * Server: `setNoDelay(true)` on every socket, no idle/request timeouts (a session lives as long
 * as its connection), one `Session` per TCP connection. Every request but `hello` carries
 * `X-Transport-Fingerprint: <16 hex>`: missing is 400 HELLO_REQUIRED (5), malformed 400
 * BAD_FRAME (1), different 409 FINGERPRINT_MISMATCH (7, text naming both, connection closed). A
 * right header on a connection that never said hello counts as the hello; an empty `hello`
 * body with the right header stands for our own Hello. Statuses: 200 (`X-Transport-Msg-Type`),
 * 400 malformed / bad body, 404 unknown method (kept), 405 not POST (`Allow: POST`, kept), 409
 * fingerprint or version, 413 Content-Length over the maximum (refused from the head, the body
 * is never read, connection closed), 422 invalid or masked action, bad batch, not reset, 500
 * env error / internal. Refusals carry the ERROR body and `X-Transport-Error: <code>`.
 * `Accept: application/json` renders any response as JSON, `Content-Type: application/json`
 * bodies are encoded with the schema's codecs (curl). Bytes that are not HTTP get a 400 and
 * the connection is closed; other connections go on. Binds loopback only unless
 * `allowRemote` (or `?allow_remote=1`).
 *
 * Client: `node:http` with a keep-alive Agent (maxSockets 1, noDelay) on one connection; the
 * agent may not open a second one, so a server that closes the connection (`Connection:
 * close`, EOF, reset) is `PeerGoneError` on the next request: no silent reconnect (the
 * session's envs lived on the old connection).
 *
 * Files: wire.ts (methods, statuses, URLs, JSON rendering), server.ts, client.ts.
 */

export * from "./wire";
export { HttpListener, listen } from "./server";
export { HttpChannel, openChannel } from "./client";
