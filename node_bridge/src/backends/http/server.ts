/**
 * The http:// server: one `Session` per keep-alive TCP connection (see index.ts).
 */

import * as http from "node:http";
import * as net from "node:net";
import { decode as msgpackDecode } from "@msgpack/msgpack";
import type { AnyStructCodec, SchemaModule } from "../../codec";
import { ConnectError } from "../../errors";
import {
  DEFAULT_MAX_BODY,
  ErrorCode,
  FINAL_TAIL_RESPONSES,
  type MessageIds,
  PER_ENV_RESPONSES,
  type RecvTail,
  decodeHello,
  encodeError,
  encodeHello,
  errorName,
  fingerprintHex16,
  helloFromJson,
  messageIds,
  parseError,
  readFinalTail,
  splitRecvTail,
} from "../../protocol";
import type { EnvHost } from "../../runtime/host";
import { LATER, type Session, sessionsOf } from "../../runtime/session";
import {
  ConnectionGuard,
  type ConnectionStats,
  type ConnectionWatch,
  type Expiry,
  type ServerLimits,
  cannotMakeEnvs,
  linger,
  newStats,
  serverLimits,
} from "../../stream";
import type { Listener, ListenOptions } from "../backend";
import {
  BARE_LF_TEXT,
  HEX16,
  MAX_HEAD,
  MAX_HEADERS,
  METHODS,
  REASONS,
  STATUS_OF_ERROR,
  TRANSFER_ENCODING_TEXT,
  isLoopback,
  jsonable,
  listHas,
  netloc,
  parseJsonBody,
  parseUrl,
  quoted,
  requestHeadError,
  stringifyJson,
  withJsonHint,
} from "./wire";

// -- server --------------------------------------------------------------------------------------

export type Json = Record<string, unknown>;

/** Per-connection state: the session and the bookkeeping of the response buffer. */
export interface Connection {
  readonly session: Session;
  /** Its deadlines (idle, reading, sending), enforced by the listener's guard. */
  readonly watch: ConnectionWatch | null;
  /** Responses ended whose bytes may still reference the session's buffer. */
  inflight: number;
  /**
   * The requests whose answer has not run yet, in arrival order. Node emits a pipelined
   * request's 'request' event while the body of the one before is still being read (its 'end'
   * comes a tick later): each request's answer waits for those before it, so the session sees
   * them in order, as the Python server does (an async-state rule must not be skipped).
   */
  readonly turns: Turn[];
  /** Requests whose response has not finished (been handed to the socket, or dropped). */
  open: number;
  /** Set once a response closes the connection: the requests after it are not answered. */
  ended: boolean;
  /** Set once the bytes after the last request are refused (a parse error): the 400 is sent. */
  refusing: boolean;
  /** The parse error's 400, waiting for the answers of the requests before it. */
  afterAll: (() => void) | null;
}

/** One request's place in its connection's order: `run` answers it, once it may. */
interface Turn {
  run: (() => void) | null;
}

export const CONNECTION = Symbol("transport.http.connection");
/** Set on a socket refused over max_connections: its requests are not answered. */
export const REFUSED = Symbol("transport.http.refused");
export type TaggedSocket = net.Socket & { [CONNECTION]?: Connection; [REFUSED]?: boolean };

const LIMIT_REASONS: Readonly<Record<number, string>> = { 408: "Request Timeout", 503: "Service Unavailable" };

/** A whole HTTP error response with the ERROR contract body, Connection: close. */
function rawErrorResponse(status: number, code: number, text: string, extra = ""): Buffer {
  const body = encodeError(code, text);
  const head =
    `HTTP/1.1 ${status} ${LIMIT_REASONS[status] ?? "Error"}\r\nContent-Type: application/octet-stream\r\n` +
    `${extra}X-Transport-Error: ${code}\r\nContent-Length: ${body.byteLength}\r\nConnection: close\r\n\r\n`;
  return Buffer.concat([Buffer.from(head, "latin1"), body]);
}

/** The part of Node's llhttp binding (`_http_common`) that finds where a refused request began. */
interface LlhttpParser {
  initialize(type: number, resource: object, maxHeaderSize: number, lenient: number): void;
  execute(data: Buffer): number | Error;
  close(): void;
  [callback: number]: unknown;
}
interface LlhttpBinding {
  new (): LlhttpParser;
  readonly REQUEST: number;
  readonly kLenientNone: number;
  readonly [callback: string]: number;
}

let llhttp: LlhttpBinding | null | undefined;

/** Node's own request parser (the one its http server runs), or null where it is not reachable. */
function llhttpParser(): LlhttpBinding | null {
  if (llhttp === undefined) {
    try {
      llhttp = (require("_http_common") as { HTTPParser?: LlhttpBinding }).HTTPParser ?? null;
    } catch {
      llhttp = null;
    }
  }
  return llhttp;
}

/** Bytes of `raw` replayed to find the refused request's start: beyond, the fallback text. */
const REPLAY_BUDGET = 4 << 20;

/**
 * Where, in the read llhttp refused (`raw`, refused at `at` with `code`), the refused request
 * begins: the first offset from which a fresh llhttp parser meets the same error at the same
 * byte while still in its first request. Earlier requests of the same read (pipelined) are
 * parsed whole from their own start, so they never count, nor does a body before it on the
 * same line. The CR/LF bytes before the request are included (the Python server's buffer has
 * them too). -1 when the request began in an earlier read.
 */
function refusedRequestStart(raw: Buffer, at: number, code: string): number {
  const HTTPParser = llhttpParser();
  if (HTTPParser === null || at >= raw.byteLength) return -1;
  const parser = new HTTPParser();
  let begun = 0;
  parser[HTTPParser.kOnMessageBegin as number] = () => {
    begun += 1;
  };
  for (const name of ["kOnHeaders", "kOnHeadersComplete", "kOnBody", "kOnMessageComplete", "kOnExecute"]) {
    parser[HTTPParser[name] as number] = () => 0;
  }
  let budget = REPLAY_BUDGET;
  try {
    for (let x = Math.max(0, at - MAX_HEAD - 4); x <= at && budget > 0; x++) {
      const c = raw[x] as number;
      if (x !== at && (c < 0x41 || c > 0x5a)) continue; // a request line starts with a method (A-Z)
      parser.initialize(HTTPParser.REQUEST, {}, MAX_HEAD, HTTPParser.kLenientNone);
      begun = 0;
      const result = parser.execute(raw.subarray(x, at + 1));
      const failed = result as { code?: string; bytesParsed?: number };
      budget -= result instanceof Error ? (failed.bytesParsed ?? 0) + 1 : at + 1 - x;
      if (result instanceof Error && failed.code === code && x + (failed.bytesParsed ?? -1) === at && begun === 1) {
        while (x > 0 && (raw[x - 1] === 0x0d || raw[x - 1] === 0x0a)) x--;
        return x;
      }
    }
  } catch {
    return -1;
  } finally {
    parser.close();
  }
  return -1;
}

/** The Python server's 400 text for a request line llhttp parsed and it does not (as rebuilt). */
function notRequestLine(req: http.IncomingMessage): string {
  // llhttp reads a line without a version ("POST /x}HTP/1.1") as HTTP/0.9: the line had none
  const version = req.httpVersion === "0.9" ? "" : ` HTTP/${req.httpVersion}`;
  const line = `${req.method ?? ""} ${req.url ?? ""}${version}`;
  return `not an HTTP/1.x request line: ${quoted(line.slice(0, 80))}`;
}

/**
 * The text of a parse error's 400: the Python server's words for the same bytes (its rules,
 * `requestHeadError`, run on the refused request), else words from llhttp's error code that
 * quote only the line that failed, never bytes of the requests before it.
 */
function parseErrorText(error: NodeJS.ErrnoException): string {
  const code = error.code ?? "";
  if (code === "HPE_HEADER_OVERFLOW") return `request head is larger than ${MAX_HEAD} bytes`;
  const raw = (error as { rawPacket?: Buffer }).rawPacket;
  const at = (error as { bytesParsed?: number }).bytesParsed ?? -1;
  if (raw === undefined || at < 0 || at > raw.byteLength) return `not an HTTP/1.x request (${code || error.message})`;
  const start = refusedRequestStart(raw, at, code);
  const text = start >= 0 ? requestHeadError(raw.subarray(start)) : null;
  if (text !== null) return text;
  // the request began in an earlier read: the line that failed, from its start in this read
  const from = at > 0 ? raw.lastIndexOf(0x0a, at - 1) + 1 : 0;
  let to = from;
  while (to < raw.byteLength && raw[to] !== 0x0d && raw[to] !== 0x0a) to++;
  const line = raw.subarray(from, Math.min(to, from + 80)).toString("latin1");
  const reason = (error as { reason?: string }).reason ?? "";
  const bareLf = (i: number): boolean => i >= 0 && raw[i] === 0x0a && (i < 1 || raw[i - 1] !== 0x0d);
  if (code === "HPE_CR_EXPECTED" || bareLf(at - 1)) return BARE_LF_TEXT; // at the LF, or after it
  if (code === "HPE_UNEXPECTED_CONTENT_LENGTH" && reason.startsWith("Duplicate")) return "duplicate Content-Length headers";
  if (code === "HPE_UNEXPECTED_CONTENT_LENGTH" || code === "HPE_INVALID_TRANSFER_ENCODING") return TRANSFER_ENCODING_TEXT;
  if (code === "HPE_INVALID_CONTENT_LENGTH") {
    return `bad Content-Length ${quoted(line.slice(line.indexOf(":") + 1).replace(/^[ \t]+|[ \t]+$/g, "").slice(0, 40))}`;
  }
  if (code === "HPE_INVALID_HEADER_TOKEN") return `malformed header line ${quoted(line)}`;
  return `not an HTTP/1.x request line: ${quoted(line)}`;
}

export class HttpServer {
  readonly schema: SchemaModule;
  readonly ids: MessageIds;
  readonly maxBody: number;
  readonly fingerprint: string;
  readonly helloBody: Buffer;
  readonly msgTypes: ReadonlyMap<string, number>;
  readonly names: ReadonlyMap<number, string>;
  readonly sessions: () => Session;
  readonly stats: ConnectionStats;
  readonly guard: ConnectionGuard;
  readonly #replies = new Map<number, http.OutgoingHttpHeaders>();

  constructor(
    sessions: () => Session,
    schema: SchemaModule,
    maxBody: number,
    stats: ConnectionStats,
    limits: ServerLimits = serverLimits(),
  ) {
    this.sessions = sessions;
    this.guard = new ConnectionGuard(limits, (socket, why) => this.#expire(socket, why));
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
    const watch = this.guard.admit(socket);
    if (watch === null) {
      // over max_connections: 503 with the ERROR contract body, then close
      socket[REFUSED] = true;
      socket.on("error", () => undefined);
      socket.write(rawErrorResponse(503, ErrorCode.INTERNAL, this.guard.busyText(), "Retry-After: 1\r\n"));
      linger(socket);
      return;
    }
    this.stats.connections += 1;
    socket.setNoDelay(true);
    try {
      const session = this.sessions();
      socket[CONNECTION] = { session, inflight: 0, watch, turns: [], open: 0, ended: false, refusing: false, afterAll: null };
      socket.once("close", () => session.runtime.close()); // the client left: its envs are closed
    } catch (error) {
      process.emitWarning(`cannot create a session for a new http connection: ${String(error)}`);
      socket[REFUSED] = true; // 503 with the ERROR contract body saying why, then close
      socket.on("error", () => undefined);
      socket.write(rawErrorResponse(503, ErrorCode.INTERNAL, cannotMakeEnvs(error)));
      linger(socket);
    }
  }

  /** A connection past its deadline: a trickled request gets a 408, the others are closed. */
  #expire(socket: TaggedSocket, why: Expiry): void {
    if (why !== "read" || socket.destroyed || !socket.writable) {
      socket.destroy();
      return;
    }
    socket.write(rawErrorResponse(408, ErrorCode.BAD_FRAME, this.guard.readTimeoutText()));
    linger(socket);
  }

  /** CONNECT (a tunnel request): refused as the Python server refuses its request line. */
  onConnect(req: http.IncomingMessage, socket: net.Socket): void {
    const method = req.method ?? "";
    const text = (req.url ?? "").startsWith("/") && req.httpVersionMajor === 1
      ? `not an HTTP/1.x request line: unknown method ${quoted(method.slice(0, 16))}`
      : notRequestLine(req);
    const body = encodeError(ErrorCode.BAD_FRAME, text);
    socket.write(
      "HTTP/1.1 400 Bad Request\r\nContent-Type: application/octet-stream\r\n" +
        `X-Transport-Error: ${ErrorCode.BAD_FRAME}\r\nContent-Length: ${body.byteLength}\r\n` +
        "Connection: close\r\n\r\n",
    );
    socket.write(body);
    linger(socket);
  }

  /**
   * Bytes that are not a request: a 400 BAD_FRAME, then close. When they followed valid
   * requests in the same write, those are answered first (as by the Python server, which reads
   * requests one at a time): the 400 waits until their responses are sent.
   */
  onClientError(error: NodeJS.ErrnoException, socket: net.Socket): void {
    if ((socket as TaggedSocket)[REFUSED]) return; // already answered 503 and lingering
    const code = error.code ?? "";
    if (code === "ECONNRESET" || !socket.writable || socket.destroyed) {
      socket.destroy();
      return;
    }
    const conn = (socket as TaggedSocket)[CONNECTION];
    if (conn !== undefined) {
      if (conn.refusing) return; // more bytes after the refused ones: one 400 is enough
      conn.refusing = true;
      if (conn.open > 0) {
        conn.afterAll = () => this.#refuseBytes(error, socket);
        return;
      }
    }
    this.#refuseBytes(error, socket);
  }

  /** The 400 BAD_FRAME of a parse error (Python's texts for the same refusals), then close. */
  #refuseBytes(error: NodeJS.ErrnoException, socket: net.Socket): void {
    if (!socket.writable || socket.destroyed) {
      socket.destroy();
      return;
    }
    const body = encodeError(ErrorCode.BAD_FRAME, parseErrorText(error));
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
    res.sendDate = false; // the Python server's headers: no Date (docs/protocol.md "HTTP mapping")
    const socket = req.socket as TaggedSocket;
    const conn = socket[CONNECTION];
    const accept = (req.headers.accept ?? "").toLowerCase().includes("application/json");
    if (conn === undefined) {
      if (!socket[REFUSED]) socket.destroy(); // a refused socket lingers with its 503
      return;
    }
    conn.watch?.reading(); // the head is in: the body must follow within readTimeoutMs
    // this request's turn: it is answered after every request that came before it
    const turn: Turn = { run: null };
    conn.turns.push(turn);
    conn.open += 1;
    let finished = false;
    const settle = (): void => {
      if (finished) return;
      finished = true;
      conn.open -= 1;
      const refusal = conn.afterAll;
      if (conn.open === 0 && refusal !== null) {
        conn.afterAll = null;
        refusal();
      }
    };
    res.once("finish", settle);
    res.once("close", settle);
    const reply = (run: () => void): void => {
      turn.run = run;
      this.#nextTurns(conn);
    };
    // a head the Python server cannot parse: its 400 is binary, whatever Accept says (as a
    // parse error's), since the head's fields are not read
    if (req.httpVersionMajor !== 1 || !(req.url ?? "").startsWith("/")) {
      // as the Python server: only HTTP/1.x with an origin-form target is a request line
      const text = notRequestLine(req);
      reply(() => this.#refuse(res, conn, 400, ErrorCode.BAD_FRAME, text, true, false));
      return;
    }
    if (req.rawHeaders.length / 2 > MAX_HEADERS) {
      reply(() => this.#refuse(res, conn, 400, ErrorCode.BAD_FRAME, `more than ${MAX_HEADERS} header lines`, true, false));
      return;
    }
    if (req.headers["transfer-encoding"] !== undefined) {
      reply(() => this.#refuse(res, conn, 400, ErrorCode.BAD_FRAME, TRANSFER_ENCODING_TEXT, true, false));
      return;
    }
    if (expectContinue) {
      // Node closes after an answer that skipped the 100 Continue: here the body is read whole
      // before any answer, so the connection stays usable (as the Python server keeps it)
      (res as unknown as { _expect_continue: boolean })._expect_continue = false;
    }
    if (req.httpVersionMinor === 0 && res.shouldKeepAlive && listHas(req.headers.connection, "close")) {
      res.shouldKeepAlive = false; // "close" in any Connection line closes (llhttp lets keep-alive win on 1.0)
    }
    const lengthText = req.headers["content-length"];
    const length = lengthText === undefined ? 0 : Number(lengthText);
    if (length > this.maxBody) {
      // the exact value (a Number rounds past 2**53), without leading zeros: Python's int
      const text = `Content-Length ${BigInt(lengthText as string)} exceeds the maximum ${this.maxBody}`;
      reply(() => this.#refuse(res, conn, 413, ErrorCode.BODY_TOO_LARGE, text, true, accept));
      return;
    }
    if (length === 0) {
      reply(() => this.#answer(req, res, conn, accept, EMPTY, 0, 0));
      return;
    }
    if (expectContinue && listHas(req.headers.expect, "100-continue")) {
      // only while the body is still to come: after this read, not when it came with the head
      setImmediate(() => {
        if (!req.complete && !res.headersSent && !socket.destroyed) res.writeContinue();
      });
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
      reply(() => {
        if (res.headersSent || socket.destroyed) return;
        if (got !== length || first === null) {
          this.#refuse(res, conn, 400, ErrorCode.BAD_FRAME, "the request body is shorter than its Content-Length", true, accept);
          return;
        }
        const body = parts === null ? (first as Buffer) : Buffer.concat(parts, got);
        this.#answer(req, res, conn, accept, body, 0, got);
      });
    });
  }

  /**
   * Answer the requests at the front of the connection's order whose answer is ready; once a
   * response closed the connection, the requests after it are dropped unanswered (as by the
   * Python server, which reads nothing after such a response).
   */
  #nextTurns(conn: Connection): void {
    const turns = conn.turns;
    while (turns.length > 0) {
      const run = (turns[0] as Turn).run;
      if (run === null) return;
      turns.shift();
      if (!conn.ended) run();
    }
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
    // the right value as sent: no work; else only spaces and tabs are header whitespace
    // (String.trim would also drop U+00A0) and only A-Z are lowered, as Python's bytes.lower
    const fingerprint =
      header === this.fingerprint || typeof header !== "string"
        ? (header as string | undefined)
        : header.replace(/^[ \t]+|[ \t]+$/g, "").replace(/[A-Z]+/g, (upper) => upper.toLowerCase());
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
    if (type === ids.ERROR && body === bodyBuf) {
      // a body not declared as JSON: a JSON-looking one refused for its size gets a hint (curl -d)
      this.#replyError(res, conn, accept, length > 0 ? bodyBuf[bodyAt] : undefined);
      return;
    }
    if (type === LATER) {
      // a RECV waiting for worker threads: answer when it is ready (other requests go on)
      void (session.later as Promise<number>).then((later) => {
        if (!res.headersSent && !res.destroyed) this.#reply(res, conn, accept, later);
      });
      return;
    }
    this.#reply(res, conn, accept, type);
  }

  /** Send the session's response of msg_type `type` (an ERROR body with its HTTP status). */
  #reply(res: http.ServerResponse, conn: Connection, accept: boolean, type: number): void {
    const session = conn.session;
    const ids = this.ids;
    if (type === ids.ERROR) {
      this.#replyError(res, conn, accept);
      return;
    }
    const close = session.closing;
    if (accept) {
      const data = this.#renderJson(type, session.body(), session);
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

  /** The session's ERROR; `first`: the first byte of a body not declared as JSON (a hint). */
  #replyError(res: http.ServerResponse, conn: Connection, accept: boolean, first?: number): void {
    const session = conn.session;
    // small; the session buffer is reused next request
    const body = first === undefined ? Buffer.from(session.body()) : withJsonHint(Buffer.from(session.body()), first);
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
    if (close || !res.shouldKeepAlive) {
      conn.ended = true;
      const socket = res.socket;
      if (socket !== null) {
        // after the answer: half-close and drain, so the peer reads it instead of a reset
        (socket as unknown as { destroySoon: () => void }).destroySoon = () => linger(socket);
      }
      res.shouldKeepAlive = false;
      // Content-Length before Connection, as on every other answer (the Python server's order)
      headers = { ...headers, "Content-Length": String(body.byteLength), Connection: "close" };
    } else if (headers["Content-Length"] === undefined) {
      headers = { ...headers, "Content-Length": String(body.byteLength) };
    }
    res.writeHead(status, REASONS[status] ?? "Error", headers);
    const watch = conn.watch;
    if (watch !== null) {
      watch.sending();
      const socket = res.socket;
      res.once("finish", () => watch.idle(socket?.bytesRead ?? 0));
    }
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
    const value: unknown = parseJsonBody(text); // exact u64s, bounded depth (as Python's)
    if (METHODS[method] === "HELLO_REQ") return helloFromJson(value); // the JSON HELLO_RESP's shape (protocol.md)
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

  #renderJson(type: number, body: Uint8Array, session: Session | null = null): Buffer {
    const name = this.names.get(type) ?? `0x${type.toString(16).toUpperCase().padStart(2, "0")}`;
    let out: Json = { message: name, msg_type: type };
    if (type === this.ids.ERROR) {
      const parsed = parseError(body) ?? { code: ErrorCode.INTERNAL, text: "" };
      out = { error: parsed.code, name: errorName(parsed.code), text: parsed.text };
    } else if (type === this.ids.HELLO_RESP) {
      const hello = decodeHello(body);
      out.protocol_version = `${hello.version >> 8}.${hello.version & 255}`;
      out.flags = hello.flags;
      out.fingerprint = fingerprintHex16(hello.fingerprint);
      out.info = hello.info;
    } else if (session !== null) {
      const message = this.schema.messages[name];
      if (message !== undefined && message.body !== null) {
        const codec = this.schema.structs[message.body] as AnyStructCodec;
        out = { ...out, ...renderRecords(name, message.batch === true, codec, body, session) };
      }
    }
    return Buffer.from(`${stringifyJson(jsonable(out))}\n`, "utf8");
  }
}

/**
 * A response's records and what its tail carries, as JSON fields (docs/protocol.md, "JSON
 * answers"; Python: `_Connection._render_records`): `result` (one record) or `results`, then
 * `env_ids` and `finals` (RECV_RESP), `finals` (a step response's final tail) or `infos`
 * (OBSERVE_RESP). Only whole records before the tail are results: a tail is never read as more.
 */
function renderRecords(name: string, batch: boolean, codec: AnyStructCodec, body: Uint8Array, session: Session): Json {
  const size = codec.size;
  const whole = size ? Math.floor(body.byteLength / size) : 0;
  const result = session.runtime.result; // the env's result struct: what final tails carry
  let count: number;
  let recv: RecvTail | null = null;
  if (name === "RECV_RESP") {
    recv = splitRecvTail(body, size, session.numEnvs);
    count = recv.count;
  } else if (PER_ENV_RESPONSES.has(name)) {
    count = Math.min(session.numEnvs, whole);
  } else {
    count = batch ? whole : Math.min(1, whole);
  }
  const records: unknown[] = [];
  for (let i = 0; i < count; i++) records.push(codec.decode(body, i * size, false));
  const out: Json = count === 1 ? { result: records[0] } : { results: records };
  const tail = body.subarray(count * size);
  if (recv !== null) {
    const finals = recv.finals;
    out.env_ids = recv.envIds;
    out.finals = recv.ended.map((index, k) => finalJson(result, index, finals.subarray(k * result.size, (k + 1) * result.size)));
  } else if (name === "OBSERVE_RESP") {
    out.infos = tail.byteLength ? binAsHex(msgpackDecode(tail, { useBigInt64: true })) : [];
  } else if (FINAL_TAIL_RESPONSES.has(name) && tail.byteLength) {
    const finals = readFinalTail(tail, 0, result.size, session.numEnvs);
    out.finals = finals.map(({ index, at }) => finalJson(result, index, tail.subarray(at, at + result.size)));
  }
  return out;
}

/** msgpack bin values of an info map as hex text, as Python's JSON answer writes bytes. */
function binAsHex(value: unknown): unknown {
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("hex");
  if (Array.isArray(value)) return value.map(binAsHex);
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, binAsHex(item)]));
  }
  return value;
}

function finalJson(codec: AnyStructCodec, index: number, bytes: Uint8Array): Json {
  return { env_id: index, result: codec.decode(Buffer.from(bytes), 0, false) };
}

export const EMPTY = Buffer.alloc(0);

/** A listening HTTP server: one Session per TCP connection. */
export class HttpListener implements Listener {
  url: string;
  readonly stats: ConnectionStats;
  readonly server: http.Server;
  readonly guard: ConnectionGuard | null;
  #closed: Promise<void> | null = null;

  constructor(url: string, server: http.Server, stats: ConnectionStats, guard: ConnectionGuard | null = null) {
    this.url = url;
    this.server = server;
    this.stats = stats;
    this.guard = guard;
  }

  /** Stop accepting and drop every connection. */
  close(): Promise<void> {
    if (this.#closed) return this.#closed;
    this.guard?.close();
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
  host: EnvHost,
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
  const handler = new HttpServer(
    sessionsOf(host),
    host.schema,
    options.maxBody ?? DEFAULT_MAX_BODY,
    stats,
    serverLimits(options.limits),
  );
  const server = http.createServer({
    keepAlive: true,
    noDelay: true,
    requestTimeout: 0,
    headersTimeout: 0,
    maxHeaderSize: MAX_HEAD,
    requireHostHeader: false, // as the Python server: Host names nothing here (docs/protocol.md)
  });
  server.keepAliveTimeout = 0;
  server.maxHeadersCount = 0; // keep every header line (MAX_HEAD bounds them) so that more than MAX_HEADERS is refused
  server.on("connection", (socket: net.Socket) => handler.onConnection(socket));
  server.on("request", (req, res) => handler.onRequest(req, res));
  server.on("checkContinue", (req, res) => handler.onRequest(req, res, true));
  // an Expect other than 100-continue is ignored, as by the Python server (no built-in 417)
  server.on("checkExpectation", (req, res) => handler.onRequest(req, res));
  server.on("clientError", (error, socket) => handler.onClientError(error, socket as net.Socket));
  server.on("connect", (req: http.IncomingMessage, socket: net.Socket) => handler.onConnect(req, socket));
  await new Promise<void>((resolve, reject) => {
    const onError = (error: NodeJS.ErrnoException): void => {
      handler.guard.close();
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
  return new HttpListener(`http://${netloc({ ...address, port: bound.port })}`, server, stats, handler.guard);
}
