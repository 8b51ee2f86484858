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
 */

import { lookup } from "node:dns/promises";
import * as http from "node:http";
import { isIP } from "node:net";
import * as net from "node:net";
import type { AnyStructCodec, SchemaModule } from "../codec";
import {
  BadFrameError,
  ConnectError,
  PeerGoneError,
  ProtocolError,
  TransportError,
  TransportTimeoutError,
} from "../errors";
import * as pac_env from "../generated/pac_env";
import {
  BODY_OFFSET,
  DEFAULT_MAX_BODY,
  ErrorCode,
  type MessageIds,
  decodeHello,
  encodeError,
  encodeHello,
  errorName,
  fingerprintHex16,
  messageIds,
  parseError,
} from "../protocol";
import type { Session } from "../session";
import { type Channel, type ConnectionStats, linger, newStats } from "../stream";
import type { Listener, ListenOptions, OpenOptions } from "./index";

/** `/v1/<method>` -> the request message it carries. */
export const METHODS: Readonly<Record<string, string>> = {
  hello: "HELLO_REQ",
  reset: "RESET_REQ",
  reset_seed: "RESET_SEED_REQ",
  step: "STEP_REQ",
  step_multi: "STEP_MULTI_REQ",
  step_batch: "STEP_BATCH_REQ",
  health: "HEALTH_REQ",
  spaces: "SPACES_REQ",
};

/** HTTP status of each ERROR code (a 405 for a non-POST request carries UNKNOWN_MESSAGE). */
export const STATUS_OF_ERROR: Readonly<Record<number, number>> = {
  [ErrorCode.BAD_FRAME]: 400,
  [ErrorCode.UNKNOWN_MESSAGE]: 404,
  [ErrorCode.BAD_BODY_SIZE]: 400,
  [ErrorCode.BODY_TOO_LARGE]: 413,
  [ErrorCode.HELLO_REQUIRED]: 400,
  [ErrorCode.VERSION_MISMATCH]: 409,
  [ErrorCode.FINGERPRINT_MISMATCH]: 409,
  [ErrorCode.INVALID_ACTION]: 422,
  [ErrorCode.MASKED_ACTION]: 422,
  [ErrorCode.ENV_ERROR]: 500,
  [ErrorCode.BAD_BATCH]: 422,
  [ErrorCode.NOT_RESET]: 422,
  [ErrorCode.INTERNAL]: 500,
};

const REASONS: Readonly<Record<number, string>> = {
  200: "OK",
  400: "Bad Request",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  413: "Content Too Large",
  422: "Unprocessable Content",
  500: "Internal Server Error",
};

/** Largest request head (request line + headers) the server accepts, as on the Python side. */
export const MAX_HEAD = 16 << 10;
const HEX16 = /^[0-9a-f]{16}$/;

// -- URLs ----------------------------------------------------------------------------------------

export interface Address {
  /** As written in the URL (no brackets). */
  readonly host: string;
  readonly port: number;
  readonly allowRemote: boolean;
}

export function netloc(address: Address): string {
  const host = address.host.includes(":") ? `[${address.host}]` : address.host;
  return `${host}:${address.port}`;
}

const URL_PATTERN = /^http:\/\/(\[[^\]/]*\]|[^/:?#[\]]*)(?::([0-9]*))?(\/)?(?:\?([^#]*))?$/i;

/** `http://host:port` (a listener may ask for port 0 and `?allow_remote=1`). */
export function parseUrl(url: string, listener = false): Address {
  if (!/^http:\/\//i.test(url)) throw new ConnectError(`${JSON.stringify(url)} is not an http:// URL`);
  const match = URL_PATTERN.exec(url);
  if (match === null) {
    throw new ConnectError(
      `${JSON.stringify(url)}: an http:// endpoint URL takes no path (use http://host:port)`,
    );
  }
  let host = match[1] ?? "";
  if (host.startsWith("[")) host = host.slice(1, -1);
  const portText = match[2];
  if (portText === undefined || portText === "") {
    throw new ConnectError(`${JSON.stringify(url)} names no port (expected http://host:port)`);
  }
  const port = Number(portText);
  if (!Number.isInteger(port) || port > 65535) {
    throw new ConnectError(`${JSON.stringify(url)} is not a valid http URL: port out of range`);
  }
  if (port === 0 && !listener) throw new ConnectError(`${JSON.stringify(url)}: cannot connect to port 0`);
  let allowRemote = false;
  for (const [key, value] of new URLSearchParams(match[4] ?? "")) {
    if (key === "allow_remote" && listener) {
      allowRemote = ["1", "true", "yes", ""].includes(value.toLowerCase());
    } else {
      throw new ConnectError(`${JSON.stringify(url)}: unknown URL parameter ${JSON.stringify(key)}`);
    }
  }
  return { host, port, allowRemote };
}

function isLoopbackIp(ip: string): boolean {
  const plain = ip.split("%")[0] as string;
  if (isIP(plain) === 4) return plain.startsWith("127.");
  if (isIP(plain) === 6) {
    const lower = plain.toLowerCase();
    if (lower === "::1" || lower === "0:0:0:0:0:0:0:1") return true;
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(lower);
    return mapped !== null && (mapped[1] as string).startsWith("127.");
  }
  return false;
}

async function isLoopback(host: string): Promise<boolean> {
  if (!host) return false; // "all interfaces"
  if (isIP(host.split("%")[0] as string)) return isLoopbackIp(host);
  try {
    const infos = await lookup(host, { all: true });
    return infos.length > 0 && infos.every((info) => isLoopbackIp(info.address));
  } catch {
    return false;
  }
}

// -- JSON (curl) ---------------------------------------------------------------------------------

function jsonable(value: unknown): unknown {
  if (typeof value === "number") {
    if (Number.isNaN(value)) return "nan";
    if (value === Infinity) return "inf";
    if (value === -Infinity) return "-inf";
    return value;
  }
  if (typeof value === "bigint") {
    return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  }
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    return Array.from(value as unknown as ArrayLike<number | bigint>, jsonable);
  }
  if (Array.isArray(value)) return value.map(jsonable);
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) out[key] = jsonable(item);
    return out;
  }
  return value;
}

// -- server --------------------------------------------------------------------------------------

type Json = Record<string, unknown>;

/** Per-connection state: the session and the bookkeeping of the response buffer. */
interface Connection {
  readonly session: Session;
  /** Responses ended whose bytes may still reference the session's buffer. */
  inflight: number;
}

const CONNECTION = Symbol("transport.http.connection");
type TaggedSocket = net.Socket & { [CONNECTION]?: Connection };

class HttpServer {
  readonly schema: SchemaModule;
  readonly ids: MessageIds;
  readonly maxBody: number;
  readonly fingerprint: string;
  readonly helloBody: Buffer;
  readonly msgTypes: ReadonlyMap<string, number>;
  readonly names: ReadonlyMap<number, string>;
  readonly sessions: () => Session;
  readonly stats: ConnectionStats;
  readonly #replies = new Map<number, http.OutgoingHttpHeaders>();

  constructor(sessions: () => Session, schema: SchemaModule, maxBody: number, stats: ConnectionStats) {
    this.sessions = sessions;
    this.schema = schema;
    this.ids = messageIds(schema);
    this.maxBody = maxBody;
    this.stats = stats;
    this.fingerprint = fingerprintHex16(schema.fingerprint);
    this.helloBody = encodeHello(schema.fingerprint);
    const types = new Map<string, number>();
    for (const [method, name] of Object.entries(METHODS)) {
      types.set(method, (this.ids as unknown as Record<string, number>)[name] as number);
    }
    this.msgTypes = types;
    this.names = new Map(Object.entries(schema.messages).map(([name, m]) => [m.id, name]));
  }

  onConnection(socket: TaggedSocket): void {
    this.stats.connections += 1;
    socket.setNoDelay(true);
    try {
      socket[CONNECTION] = { session: this.sessions(), inflight: 0 };
    } catch (error) {
      process.emitWarning(`cannot create a session for a new http connection: ${String(error)}`);
      socket.destroy();
    }
  }

  onClientError(error: NodeJS.ErrnoException, socket: net.Socket): void {
    const code = error.code ?? "";
    if (code === "ECONNRESET" || !socket.writable || socket.destroyed) {
      socket.destroy();
      return;
    }
    const raw = (error as { rawPacket?: Buffer }).rawPacket;
    const preview = raw ? JSON.stringify(raw.subarray(0, 80).toString("latin1")) : "";
    let text: string;
    if (code === "HPE_HEADER_OVERFLOW") text = `request head is larger than ${MAX_HEAD} bytes`;
    else if (code === "HPE_UNEXPECTED_CONTENT_LENGTH" || code === "HPE_INVALID_TRANSFER_ENCODING") {
      text = "Transfer-Encoding is not supported: send Content-Length";
    } else text = `not an HTTP/1.x request (${code || error.message}): ${preview}`;
    const body = encodeError(ErrorCode.BAD_FRAME, text);
    const head =
      "HTTP/1.1 400 Bad Request\r\nContent-Type: application/octet-stream\r\n" +
      `X-Transport-Error: ${ErrorCode.BAD_FRAME}\r\nContent-Length: ${body.byteLength}\r\n` +
      "Connection: close\r\n\r\n";
    socket.write(head);
    socket.write(body);
    linger(socket);
  }

  /** A request head arrived: refuse what can be refused from the head, else read the body. */
  onRequest(req: http.IncomingMessage, res: http.ServerResponse, expectContinue = false): void {
    const socket = req.socket as TaggedSocket;
    const conn = socket[CONNECTION];
    const accept = (req.headers.accept ?? "").toLowerCase().includes("application/json");
    if (conn === undefined) {
      socket.destroy();
      return;
    }
    if (req.headers["transfer-encoding"] !== undefined) {
      this.#refuse(res, conn, 400, ErrorCode.BAD_FRAME,
        "Transfer-Encoding is not supported: send Content-Length", true, accept);
      return;
    }
    const length = Number(req.headers["content-length"] ?? "0");
    if (length > this.maxBody) {
      this.#refuse(res, conn, 413, ErrorCode.BODY_TOO_LARGE,
        `Content-Length ${length} exceeds the maximum ${this.maxBody}`, true, accept);
      return;
    }
    if (expectContinue) res.writeContinue();
    if (length === 0) {
      this.#answer(req, res, conn, accept, EMPTY, 0, 0);
      return;
    }
    let first: Buffer | null = null;
    let parts: Buffer[] | null = null;
    let got = 0;
    req.on("data", (chunk: Buffer) => {
      got += chunk.byteLength;
      if (first === null) first = chunk;
      else (parts ??= [first]).push(chunk);
    });
    req.on("end", () => {
      if (res.headersSent || socket.destroyed) return;
      if (got !== length || first === null) {
        this.#refuse(res, conn, 400, ErrorCode.BAD_FRAME, "the request body is shorter than its Content-Length", true, accept);
        return;
      }
      const body = parts === null ? (first as Buffer) : Buffer.concat(parts, got);
      this.#answer(req, res, conn, accept, body, 0, got);
    });
  }

  #answer(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    conn: Connection,
    accept: boolean,
    bodyBuf: Buffer,
    bodyAt: number,
    bodyLen: number,
  ): void {
    const session = conn.session;
    if (req.method !== "POST") {
      this.#refuse(res, conn, 405, ErrorCode.UNKNOWN_MESSAGE,
        `method ${req.method ?? ""} is not allowed: use POST /v1/<method>`, false, accept, { Allow: "POST" });
      return;
    }
    const url = req.url ?? "";
    const query = url.indexOf("?");
    const path = query < 0 ? url : url.slice(0, query);
    const method = path.startsWith("/v1/") ? path.slice(4) : null;
    const msgType = method === null ? undefined : this.msgTypes.get(method);
    if (msgType === undefined || method === null) {
      const list = Object.keys(METHODS).map((m) => `/v1/${m}`).join(", ");
      this.#refuse(res, conn, 404, ErrorCode.UNKNOWN_MESSAGE, `no such endpoint; methods: ${list}`, false, accept);
      return;
    }
    const ids = this.ids;
    const isHello = msgType === ids.HELLO_REQ;
    const header = req.headers["x-transport-fingerprint"];
    const fingerprint = typeof header === "string" ? header.trim().toLowerCase() : undefined;
    if (fingerprint === undefined) {
      if (!isHello) {
        this.#refuse(res, conn, 400, ErrorCode.HELLO_REQUIRED,
          "X-Transport-Fingerprint: <16 hex digits> is required on every request", false, accept);
        return;
      }
    } else if (!HEX16.test(fingerprint)) {
      this.#refuse(res, conn, 400, ErrorCode.BAD_FRAME,
        `X-Transport-Fingerprint ${JSON.stringify(fingerprint.slice(0, 40))} is not 16 hex digits`, false, accept);
      return;
    } else if (fingerprint !== this.fingerprint) {
      this.#refuse(res, conn, 409, ErrorCode.FINGERPRINT_MISMATCH,
        `schema fingerprint mismatch: client has ${fingerprint}, this side has ${this.fingerprint}`, true, accept);
      return;
    }
    let body = bodyBuf;
    let at = bodyAt;
    let length = bodyLen;
    if ((req.headers["content-type"] ?? "").toLowerCase().startsWith("application/json")) {
      try {
        body = this.#encodeJsonBody(method, body.subarray(at, at + length));
      } catch (error) {
        const text = error instanceof Error ? error.message : String(error);
        this.#refuse(res, conn, 400, ErrorCode.BAD_BODY_SIZE, `JSON body for /v1/${method}: ${text}`, false, accept);
        return;
      }
      at = 0;
      length = body.byteLength;
    }
    if (conn.inflight > 0) {
      // a previous response (pipelining) may still hold the session's buffer
      session.detachBuffer();
      this.stats.detached += 1;
    }
    if (isHello && fingerprint !== undefined && length === 0) {
      body = this.helloBody; // curl: the header says it
      at = 0;
      length = body.byteLength;
    }
    if (!isHello && !session.helloDone) {
      // the header stands for the HELLO
      const type = session.handle(ids.HELLO_REQ, this.helloBody, 0, this.helloBody.byteLength);
      if (type === ids.ERROR) {
        this.#replyError(res, conn, accept);
        return;
      }
    }
    const type = session.handle(msgType, body, at, length);
    if (type === ids.ERROR) {
      this.#replyError(res, conn, accept);
      return;
    }
    const close = session.closing;
    if (accept) {
      const data = this.#renderJson(type, session.body());
      this.#send(res, conn, 200, { "Content-Type": "application/json", "X-Transport-Msg-Type": String(type) }, data, close);
      return;
    }
    const bodyOut = session.body();
    let headers = close ? undefined : this.#replies.get(type * 0x10000000 + bodyOut.byteLength);
    if (headers === undefined) {
      headers = {
        "Content-Type": "application/octet-stream",
        "X-Transport-Msg-Type": String(type),
        "Content-Length": String(bodyOut.byteLength),
      };
      if (!close) {
        if (this.#replies.size > 64) this.#replies.clear();
        this.#replies.set(type * 0x10000000 + bodyOut.byteLength, headers);
      }
    }
    this.#send(res, conn, 200, headers, bodyOut, close, true);
  }

  #replyError(res: http.ServerResponse, conn: Connection, accept: boolean): void {
    const session = conn.session;
    const body = Buffer.from(session.body()); // small; the session buffer is reused next request
    const code = body.byteLength >= 2 ? body.readUInt16LE(0) : ErrorCode.INTERNAL;
    this.#sendError(res, conn, STATUS_OF_ERROR[code] ?? 500, code, body, session.closing, accept, {});
  }

  #refuse(
    res: http.ServerResponse,
    conn: Connection,
    status: number,
    code: ErrorCode,
    text: string,
    close: boolean,
    accept: boolean,
    extra: http.OutgoingHttpHeaders = {},
  ): void {
    this.#sendError(res, conn, status, code, encodeError(code, text), close, accept, extra);
  }

  #sendError(
    res: http.ServerResponse,
    conn: Connection,
    status: number,
    code: number,
    body: Buffer,
    close: boolean,
    accept: boolean,
    extra: http.OutgoingHttpHeaders,
  ): void {
    const data = accept ? this.#renderJson(this.ids.ERROR, body) : body;
    const headers: http.OutgoingHttpHeaders = {
      "Content-Type": accept ? "application/json" : "application/octet-stream",
      ...extra,
      "X-Transport-Error": String(code),
    };
    this.#send(res, conn, status, headers, data, close);
  }

  #send(
    res: http.ServerResponse,
    conn: Connection,
    status: number,
    headers: http.OutgoingHttpHeaders,
    body: Buffer,
    close: boolean,
    shared = false,
  ): void {
    if (close) {
      const socket = res.socket;
      if (socket !== null) {
        // after the answer: half-close and drain, so the peer reads it instead of a reset
        (socket as unknown as { destroySoon: () => void }).destroySoon = () => linger(socket);
      }
      res.shouldKeepAlive = false;
      headers = { ...headers, Connection: "close", "Content-Length": String(body.byteLength) };
    } else if (headers["Content-Length"] === undefined) {
      headers = { ...headers, "Content-Length": String(body.byteLength) };
    }
    res.writeHead(status, REASONS[status] ?? "Error", headers);
    if (shared) {
      conn.inflight += 1;
      res.once("finish", () => {
        conn.inflight -= 1;
      });
      res.once("close", () => {
        if (!res.writableFinished) conn.inflight = Math.max(0, conn.inflight - 1);
      });
    }
    res.end(body);
  }

  #encodeJsonBody(method: string, raw: Buffer): Buffer {
    const text = raw.toString("utf8").trim();
    if (!text) return EMPTY; // no body is no body, whatever its declared type
    const value: unknown = JSON.parse(text);
    const message = this.schema.messages[METHODS[method] as string];
    if (message === undefined || message.body === null) {
      const empty =
        value === null ||
        (Array.isArray(value) && value.length === 0) ||
        (typeof value === "object" && value !== null && Object.keys(value).length === 0);
      if (!empty) throw new Error(`/v1/${method} takes no body`);
      return EMPTY;
    }
    const codec = this.schema.structs[message.body] as AnyStructCodec;
    const items: unknown[] = Array.isArray(value) ? value : [value];
    if (!items.every((item) => item !== null && typeof item === "object" && !Array.isArray(item))) {
      throw new Error(`expected a JSON object (or a list of them) of ${codec.name} fields`);
    }
    return Buffer.concat(items.map((item) => codec.encode(item)));
  }

  #renderJson(type: number, body: Uint8Array): Buffer {
    const name = this.names.get(type) ?? `0x${type.toString(16).toUpperCase().padStart(2, "0")}`;
    let out: Json = { message: name, msg_type: type };
    if (type === this.ids.ERROR) {
      const parsed = parseError(body) ?? { code: ErrorCode.INTERNAL, text: "" };
      out = { error: parsed.code, name: errorName(parsed.code), text: parsed.text };
    } else if (type === this.ids.HELLO_RESP) {
      const hello = decodeHello(body);
      out.protocol_version = `${hello.version >> 8}.${hello.version & 255}`;
      out.fingerprint = fingerprintHex16(hello.fingerprint);
      out.info = hello.info;
    } else {
      const message = this.schema.messages[name];
      if (message !== undefined && message.body !== null) {
        const codec = this.schema.structs[message.body] as AnyStructCodec;
        const count = codec.size ? Math.floor(body.byteLength / codec.size) : 0;
        const records: unknown[] = [];
        for (let i = 0; i < count; i++) records.push(codec.decode(body, i * codec.size, false));
        if (count === 1) out.result = records[0];
        else out.results = records;
      }
    }
    return Buffer.from(`${JSON.stringify(jsonable(out))}\n`, "utf8");
  }
}

const EMPTY = Buffer.alloc(0);

/** A listening HTTP server: one Session per TCP connection. */
export class HttpListener implements Listener {
  url: string;
  readonly stats: ConnectionStats;
  readonly server: http.Server;
  #closed: Promise<void> | null = null;

  constructor(url: string, server: http.Server, stats: ConnectionStats) {
    this.url = url;
    this.server = server;
    this.stats = stats;
  }

  /** Stop accepting and drop every connection. */
  close(): Promise<void> {
    if (this.#closed) return this.#closed;
    this.#closed = new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
    return this.#closed;
  }
}

/** Bind and listen; with port 0, `url` carries the real port. */
export async function listen(
  url: string,
  sessions: () => Session,
  options: ListenOptions = {},
): Promise<HttpListener> {
  const address = parseUrl(url, true);
  if (!(options.allowRemote || address.allowRemote) && !(await isLoopback(address.host))) {
    throw new ConnectError(
      `refusing to bind ${address.host || "all interfaces"}: http:// binds loopback only by ` +
        "default (the protocol has no authentication); pass allowRemote: true or add " +
        "?allow_remote=1 to the URL to serve other machines",
    );
  }
  const stats = newStats();
  const handler = new HttpServer(sessions, options.schema ?? pac_env.SCHEMA, options.maxBody ?? DEFAULT_MAX_BODY, stats);
  const server = http.createServer({
    keepAlive: true,
    noDelay: true,
    requestTimeout: 0,
    headersTimeout: 0,
    maxHeaderSize: MAX_HEAD,
  });
  server.keepAliveTimeout = 0;
  server.on("connection", (socket: net.Socket) => handler.onConnection(socket));
  server.on("request", (req, res) => handler.onRequest(req, res));
  server.on("checkContinue", (req, res) => handler.onRequest(req, res, true));
  server.on("clientError", (error, socket) => handler.onClientError(error, socket as net.Socket));
  await new Promise<void>((resolve, reject) => {
    const onError = (error: NodeJS.ErrnoException): void => {
      reject(new ConnectError(`cannot bind ${url}: ${error.code ?? error.message}`));
    };
    server.once("error", onError);
    const host = address.host || undefined;
    server.listen({ port: address.port, host }, () => {
      server.removeListener("error", onError);
      resolve();
    });
  });
  server.on("error", (error) => process.emitWarning(`http listener ${url}: ${String(error)}`));
  const bound = server.address() as net.AddressInfo;
  return new HttpListener(`http://${netloc({ ...address, port: bound.port })}`, server, stats);
}

// -- client --------------------------------------------------------------------------------------

function connectOnce(host: string, port: number, timeoutMs: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection({ host, port, noDelay: true });
    const timer = setTimeout(() => {
      socket.destroy();
      const error = new Error("connect timed out") as NodeJS.ErrnoException;
      error.code = "ETIMEDOUT";
      reject(error);
    }, Math.max(1, timeoutMs));
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      resolve(socket);
    });
    socket.once("error", (error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(error);
    });
  });
}

/** The client side: one keep-alive connection, one request at a time, the buffer reused. */
export class HttpChannel implements Channel {
  info: Record<string, unknown> = {};
  buffer: Buffer = Buffer.alloc(BODY_OFFSET + (64 << 10));
  bodyLength = 0;
  generation = 0;
  readonly timeoutMs: number | null;
  readonly maxBody: number;
  readonly #agent: http.Agent;
  readonly #address: Address;
  readonly #ids: MessageIds;
  readonly #paths = new Map<number, string>();
  readonly #headers = new Map<string, http.OutgoingHttpHeaders>();
  readonly #fingerprint: string;
  #gone = "";
  #busy = false;
  #socket: net.Socket | null;

  constructor(socket: net.Socket, address: Address, schema: SchemaModule, options: OpenOptions) {
    this.#socket = socket;
    this.#address = address;
    this.timeoutMs = options.timeoutMs === undefined ? 10_000 : options.timeoutMs;
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.#ids = messageIds(schema);
    this.#fingerprint = fingerprintHex16(schema.fingerprint);
    for (const [method, name] of Object.entries(METHODS)) {
      this.#paths.set((this.#ids as unknown as Record<string, number>)[name] as number, `/v1/${method}`);
    }
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1, maxFreeSockets: 1 });
    // the agent's only connection is the one we opened: no silent reconnect
    (agent as unknown as { createConnection: unknown }).createConnection = (
      _options: unknown,
      callback: (error: Error | null, socket?: net.Socket) => void,
    ): net.Socket | undefined => {
      const first = this.#socket;
      if (first !== null && !first.destroyed) {
        this.#socket = null;
        return first;
      }
      callback(new PeerGoneError(this.#gone || "the server closed the connection; open a new client"));
      return undefined;
    };
    this.#agent = agent;
    socket.on("close", () => {
      if (!this.#gone && !this.#busy) this.#gone = "the server closed the connection; open a new client";
    });
  }

  request(msgType: number, body: Uint8Array): Promise<number> {
    if (this.#gone) return Promise.reject(new PeerGoneError(this.#gone));
    if (this.#busy) {
      return Promise.reject(new TransportError("a request is already in flight on this client (await it first)"));
    }
    const path = this.#paths.get(msgType);
    if (path === undefined) {
      return Promise.reject(new BadFrameError(`msg_type 0x${msgType.toString(16).padStart(2, "0")} has no HTTP method`));
    }
    const length = body.byteLength;
    const key = `${path} ${length}`;
    let headers = this.#headers.get(key);
    if (headers === undefined) {
      headers = {
        Host: netloc(this.#address),
        "X-Transport-Fingerprint": this.#fingerprint,
        "Content-Type": "application/octet-stream",
        "Content-Length": String(length),
      };
      if (this.#headers.size > 64) this.#headers.clear();
      this.#headers.set(key, headers);
    }
    this.#busy = true;
    return new Promise<number>((resolve, reject) => {
      let settled = false;
      let timer: NodeJS.Timeout | null = null;
      const fail = (error: Error, abandon: boolean): void => {
        if (settled) return;
        settled = true;
        this.#busy = false;
        if (timer !== null) clearTimeout(timer);
        if (abandon) this.#abandon(`the connection was abandoned after: ${error.message}`);
        reject(error);
      };
      const req = http.request({
        agent: this.#agent,
        method: "POST",
        host: this.#address.host,
        port: this.#address.port,
        path,
        headers,
      });
      if (this.timeoutMs !== null) {
        timer = setTimeout(() => {
          fail(new TransportTimeoutError(`no complete response within ${this.timeoutMs} ms`), true);
          req.destroy();
        }, this.timeoutMs);
      }
      req.on("error", (error: NodeJS.ErrnoException) => {
        if (error instanceof PeerGoneError) fail(error, true);
        else fail(new PeerGoneError(`the server closed the connection (${error.code ?? error.message})`), true);
      });
      req.on("response", (res: http.IncomingMessage) => {
        const status = res.statusCode ?? 0;
        const declared = Number(res.headers["content-length"]);
        if (!Number.isInteger(declared)) {
          fail(new ProtocolError(`HTTP ${status} response without Content-Length`), true);
          req.destroy();
          return;
        }
        if (declared > this.maxBody) {
          fail(new BadFrameError(`response Content-Length ${declared} exceeds ${this.maxBody}`), true);
          req.destroy();
          return;
        }
        if (BODY_OFFSET + declared > this.buffer.byteLength) {
          this.buffer = Buffer.alloc(Math.max(BODY_OFFSET + declared, 2 * this.buffer.byteLength));
          this.generation += 1;
        }
        let got = 0;
        res.on("data", (chunk: Buffer) => {
          if (got + chunk.byteLength > declared) {
            fail(new ProtocolError("the server sent bytes beyond the response body"), true);
            req.destroy();
            return;
          }
          chunk.copy(this.buffer, BODY_OFFSET + got);
          got += chunk.byteLength;
        });
        res.on("aborted", () => fail(new PeerGoneError("the server closed the connection in the middle of a response"), true));
        res.on("error", () => fail(new PeerGoneError("the server closed the connection in the middle of a response"), true));
        res.on("end", () => {
          if (settled) return;
          if (got !== declared) {
            fail(new PeerGoneError("the server closed the connection in the middle of a response"), true);
            return;
          }
          if ((res.headers.connection ?? "").toLowerCase().includes("close")) {
            this.#abandon("the server closed the connection (Connection: close)");
          }
          this.bodyLength = got;
          let type: number;
          if (status === 200) {
            const header = res.headers["x-transport-msg-type"];
            if (typeof header !== "string" || !/^[0-9]{1,3}$/.test(header) || Number(header) > 255) {
              fail(new ProtocolError("HTTP 200 response without a valid X-Transport-Msg-Type"), true);
              return;
            }
            type = Number(header);
          } else {
            type = this.#ids.ERROR;
            const view = this.buffer.subarray(BODY_OFFSET, BODY_OFFSET + got);
            if (res.headers["x-transport-error"] === undefined || parseError(view) === null) {
              const text = view.subarray(0, 200).toString("utf8");
              const error = encodeError(ErrorCode.INTERNAL, `HTTP ${status} without an ERROR body: ${text}`);
              error.copy(this.buffer, BODY_OFFSET);
              this.bodyLength = error.byteLength;
            }
          }
          settled = true;
          this.#busy = false;
          if (timer !== null) clearTimeout(timer);
          resolve(type);
        });
      });
      if (length) req.end(body);
      else req.end();
    });
  }

  #abandon(reason: string): void {
    if (!this.#gone) this.#gone = `${reason}; open a new client`;
    this.#agent.destroy();
    this.#socket?.destroy();
    this.#socket = null;
  }

  close(): void {
    this.#abandon("the channel is closed");
    this.#gone = "the channel is closed";
  }
}

/** Connect, retrying with backoff while the server is not up yet, until the deadline. */
export async function openChannel(url: string, options: OpenOptions = {}): Promise<HttpChannel> {
  const address = parseUrl(url);
  const timeoutMs = options.timeoutMs === undefined ? 10_000 : options.timeoutMs;
  const deadline = Date.now() + (timeoutMs ?? 10_000);
  let delay = 5;
  for (;;) {
    try {
      const socket = await connectOnce(address.host, address.port, deadline - Date.now());
      return new HttpChannel(socket, address, options.schema ?? pac_env.SCHEMA, options);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code ?? "";
      if (code === "ECONNREFUSED") {
        if (Date.now() + delay > deadline) {
          throw new ConnectError(`nothing accepts connections on ${netloc(address)} (${code})`);
        }
        await new Promise((resolve) => setTimeout(resolve, delay));
        delay = Math.min(delay * 2, 200);
        continue;
      }
      if (code === "ETIMEDOUT") throw new ConnectError(`connecting to ${netloc(address)} timed out`);
      throw new ConnectError(`cannot connect to ${netloc(address)}: ${code || (error as Error).message}`);
    }
  }
}

