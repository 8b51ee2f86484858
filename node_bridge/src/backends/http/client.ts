/**
 * The http:// client channel: one keep-alive connection, one request at a time.
 */

import * as http from "node:http";
import * as net from "node:net";
import type { SchemaModule } from "../../codec";
import {
  BadFrameError,
  ConnectError,
  PeerGoneError,
  ProtocolError,
  TransportTimeoutError,
  replyTooLarge,
  requestInFlight,
} from "../../errors";
import * as pac_env from "../../generated/pac_env";
import { BODY_OFFSET, DEFAULT_MAX_BODY, type MessageIds, fingerprintHex16, messageIds, parseError } from "../../protocol";
import { type Channel, timeoutOption } from "../../stream";
import type { OpenOptions } from "../backend";
import { Address, METHODS, netloc, parseUrl } from "./wire";

// -- client --------------------------------------------------------------------------------------

export function connectOnce(host: string, port: number, timeoutMs: number): Promise<net.Socket> {
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
  #schema!: SchemaModule;
  #ids!: MessageIds;
  readonly #paths = new Map<number, string>();
  readonly #headers = new Map<string, http.OutgoingHttpHeaders>();
  #fingerprint!: string;
  #gone = "";
  #busy = false;
  #socket: net.Socket | null;
  /** The connection, for ref/unref (the agent holds it once it took it). */
  readonly #conn: net.Socket;

  constructor(socket: net.Socket, address: Address, schema: SchemaModule, options: OpenOptions) {
    this.#socket = socket;
    this.#conn = socket;
    this.#address = address;
    this.timeoutMs = timeoutOption(options.timeoutMs);
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.#pin(schema);
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

  /** The schema every request's fingerprint header names. */
  get schema(): SchemaModule {
    return this.#schema;
  }

  /** Speak `schema` from now on, on this connection: the schema a discovering HELLO found (the
   * server's session is this connection's; reconnecting would make it build a second one). */
  adopt(schema: SchemaModule): void {
    this.#pin(schema);
  }

  #pin(schema: SchemaModule): void {
    this.#schema = schema;
    this.#ids = messageIds(schema);
    this.#fingerprint = fingerprintHex16(schema.fingerprint);
    this.#paths.clear();
    this.#headers.clear();
    for (const [method, name] of Object.entries(METHODS)) {
      this.#paths.set((this.#ids as unknown as Record<string, number>)[name] as number, `/v1/${method}`);
    }
  }

  request(msgType: number, body: Uint8Array): Promise<number> {
    if (this.#gone) return Promise.reject(new PeerGoneError(this.#gone));
    if (this.#busy) {
      return Promise.reject(requestInFlight());
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
      // hello carries the fingerprint in its body (and asks to discover the schema there)
      if (msgType === this.#ids.HELLO_REQ) delete headers["X-Transport-Fingerprint"];
      if (this.#headers.size > 64) this.#headers.clear();
      this.#headers.set(key, headers);
    }
    this.#busy = true;
    // an idle client does not keep node running: the agent unrefs its free connection, a request
    // refs it (a timed-out one unrefs it again, below, while its late response is read)
    this.#conn.ref();
    return new Promise<number>((resolve, reject) => {
      let settled = false;
      let timer: NodeJS.Timeout | null = null;
      let timedOut = false;
      const fail = (error: Error, abandon: boolean): void => {
        if (settled) {
          // a late response that cannot be read to its end: the connection is lost
          if (abandon && timedOut) this.#abandon(`the connection was abandoned after: ${error.message}`);
          return;
        }
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
          // the connection stays (resynchronisation): a request already sent reads its late
          // response to the end and drops it (HTTP/1.1 answers in order), and the next request
          // waits in the agent's queue for the connection; one still queued is dropped unsent
          fail(new TransportTimeoutError(`no complete response within ${this.timeoutMs} ms`), false);
          this.#conn.unref();
          if (req.socket) timedOut = true;
          else req.destroy(); // never sent: its "error" (settled, not timedOut) is ignored
        }, this.timeoutMs);
      }
      req.on("error", (error: NodeJS.ErrnoException) => {
        if (error instanceof PeerGoneError) fail(error, true);
        else if (error.code?.startsWith("HPE_")) fail(malformedResponse(error), true);
        else fail(new PeerGoneError(`the server closed the connection (${error.code ?? error.message})`), true);
      });
      req.on("response", (res: http.IncomingMessage) => {
        const status = res.statusCode ?? 0;
        const declared = Number(res.headers["content-length"]);
        if (!Number.isInteger(declared)) {
          fail(
            status !== 200 && res.headers["x-transport-error"] === undefined
              ? new ConnectError(`the peer answered HTTP ${status} without a transport ERROR body: not a transport server?`)
              : new ProtocolError(`HTTP ${status} response without Content-Length`),
            true,
          );
          req.destroy();
          return;
        }
        // a body over maxBody is read to its end and dropped: the keep-alive connection stays in
        // step (a timeout meanwhile drops the rest as any late response; Python: `_drop_body`)
        const tooLarge = declared > this.maxBody;
        if (!tooLarge && BODY_OFFSET + declared > this.buffer.byteLength) {
          this.buffer = Buffer.alloc(Math.max(BODY_OFFSET + declared, 2 * this.buffer.byteLength));
          this.generation += 1;
        }
        let got = 0;
        res.on("data", (chunk: Buffer) => {
          if (settled) return; // the late response to a request that timed out: dropped
          if (got + chunk.byteLength > declared) {
            fail(new ProtocolError("the server sent bytes beyond the response body"), true);
            req.destroy();
            return;
          }
          if (!tooLarge) chunk.copy(this.buffer, BODY_OFFSET + got);
          got += chunk.byteLength;
        });
        res.on("aborted", () => fail(new PeerGoneError("the server closed the connection in the middle of a response"), true));
        res.on("error", () => fail(new PeerGoneError("the server closed the connection in the middle of a response"), true));
        res.on("end", () => {
          if (settled) {
            if ((res.headers.connection ?? "").toLowerCase().includes("close")) {
              this.#abandon("the server closed the connection (Connection: close)");
            }
            return;
          }
          if (got !== declared) {
            fail(new PeerGoneError("the server closed the connection in the middle of a response"), true);
            return;
          }
          if ((res.headers.connection ?? "").toLowerCase().includes("close")) {
            this.#abandon("the server closed the connection (Connection: close)");
          }
          if (tooLarge) {
            fail(replyTooLarge(declared, this.maxBody), false);
            return;
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
              // a transport server answers every refusal with an ERROR body: this peer is
              // something else (a web server, a proxy's error page)
              const text = view.subarray(0, 120).toString("utf8").replace(/\s+/g, " ").trim();
              fail(
                new ConnectError(
                  `the peer answered HTTP ${status} without a transport ERROR body: ` +
                    `not a transport server?${text ? ` (it said: ${JSON.stringify(text)})` : ""}`,
                ),
                true,
              );
              return;
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

/** llhttp's codes for a first line that is not an HTTP/1.x status line. */
const NOT_A_STATUS_LINE = new Set(["HPE_INVALID_CONSTANT", "HPE_INVALID_VERSION", "HPE_INVALID_STATUS"]);

/**
 * A response llhttp cannot parse: a ProtocolError, not a closed connection (the peer sent bytes).
 * A first line that is not an HTTP/1.x status line means the peer speaks something else (an SSH
 * banner): said as Python's client says it (its check_status_start).
 */
function malformedResponse(error: NodeJS.ErrnoException & { rawPacket?: unknown; reason?: unknown }): ProtocolError {
  const code = error.code ?? "";
  if (NOT_A_STATUS_LINE.has(code)) {
    const raw = Buffer.isBuffer(error.rawPacket) ? error.rawPacket.subarray(0, 48).toString("latin1") : "";
    return new ProtocolError(`the peer does not speak HTTP/1.x: its answer begins ${JSON.stringify(raw)}, not an HTTP/1.x status line`);
  }
  return new ProtocolError(`malformed HTTP response (${code}: ${typeof error.reason === "string" ? error.reason : error.message})`);
}

/** Connect, retrying with backoff while the server is not up yet, until the deadline. */
export async function openChannel(url: string, options: OpenOptions = {}): Promise<HttpChannel> {
  const address = parseUrl(url);
  const timeoutMs = timeoutOption(options.timeoutMs);
  const deadline = Date.now() + (timeoutMs ?? 10_000);
  let delay = 5;
  for (;;) {
    let socket: net.Socket;
    try {
      socket = await connectOnce(address.host, address.port, deadline - Date.now());
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
    // outside the try: an argument error (a bad schema) is not a connection failure
    try {
      return new HttpChannel(socket, address, options.schema ?? pac_env.SCHEMA, options);
    } catch (error) {
      socket.destroy();
      throw error;
    }
  }
}
