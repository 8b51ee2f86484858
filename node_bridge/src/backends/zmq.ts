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
 * Dead peers: the Dealer's event observer reports `disconnect` (a closed or reset connection,
 * or ZMTP heartbeats that stopped); a disconnect while a request waits is `PeerGoneError`, no
 * reply by the deadline `TransportTimeoutError`. tcp may use CURVE with a ZAP allow list.
 */

import { createPrivateKey, createPublicKey, randomBytes } from "node:crypto";
import { chmodSync, existsSync, lstatSync, readFileSync, readdirSync, statSync, unlinkSync } from "node:fs";
import * as net from "node:net";
import { isIP } from "node:net";
import { join } from "node:path";
import * as zmq from "zeromq";
import {
  BadFrameError,
  ConnectError,
  PeerGoneError,
  TransportError,
  TransportTimeoutError,
} from "../errors";
import * as pac_env from "../generated/pac_env";
import {
  BODY_OFFSET,
  CLOSING_ERRORS,
  DEFAULT_MAX_BODY,
  ErrorCode,
  HEADER_SIZE,
  encodeError,
  messageIds,
  packHeader,
  readU32,
} from "../protocol";
import type { Session } from "../session";
import { type Channel, type ChannelOptions, type ConnectionStats, newStats } from "../stream";
import type { Listener, ListenOptions, OpenOptions } from "./index";

/** Bodies at least this large are handed to libzmq without a copy (and the buffer is given up). */
export const ZERO_COPY_THRESHOLD = 64 << 10;
/** zeromq.js copies message parts up to this size itself (and wraps larger ones). */
const ZMQJS_COPY_LIMIT = 128;
/** ZMTP heartbeat interval in ms; a peer silent for 3 intervals is disconnected. */
export const DEFAULT_HEARTBEAT_MS = 1000;
/** Sessions a server keeps (least recently used beyond this are dropped). */
export const MAX_SESSIONS = 1024;

export const ENV_SERVER_SECRET = "TRANSPORT_ZMQ_SERVER_SECRET";
export const ENV_SERVER_PUBLIC = "TRANSPORT_ZMQ_SERVER_PUBLIC";
export const ENV_CLIENT_SECRET = "TRANSPORT_ZMQ_CLIENT_SECRET";
export const ENV_CLIENTS_DIR = "TRANSPORT_ZMQ_CLIENTS_DIR";
export const ENV_ALLOWED_CLIENTS = "TRANSPORT_ZMQ_ALLOWED_CLIENTS";

const PARAMS = new Set(["server_key", "client_key", "clients", "allow_insecure", "heartbeat"]);
const ZAP_ENDPOINT = "inproc://zeromq.zap.01";
const EMPTY: Buffer = Buffer.alloc(0);

// -- addresses ------------------------------------------------------------------------------------

/** A parsed zmq URL: `transport` is "ipc" or "tcp"; `port` 0 asks for any free port. */
export class Address {
  constructor(
    readonly url: string,
    readonly transport: "ipc" | "tcp",
    readonly path: string,
    readonly host: string,
    readonly port: number,
    readonly params: ReadonlyMap<string, string>,
  ) {}

  get endpoint(): string {
    if (this.transport === "ipc") return `ipc://${this.path}`;
    const host = this.host.includes(":") ? `[${this.host}]` : this.host;
    return `tcp://${host}:${this.port ? this.port : "*"}`;
  }

  get isLoopback(): boolean {
    if (this.transport === "ipc" || this.host === "localhost") return true;
    const kind = isIP(this.host);
    if (kind === 4) return this.host.startsWith("127.");
    if (kind === 6) return /^(0*:)*:?0*1$/.test(this.host) || this.host === "::1";
    return false;
  }

  flag(name: string): boolean {
    return ["1", "true", "yes"].includes((this.params.get(name) ?? "0").toLowerCase());
  }

  withPort(port: number): string {
    const host = this.host.includes(":") ? `[${this.host}]` : this.host;
    const q = this.url.indexOf("?");
    return `zmq+tcp://${host}:${port}` + (q >= 0 ? this.url.slice(q) : "");
  }
}

/** `zmq+ipc:///path[?...]` or `zmq+tcp://host:port[?...]` (empty host: 127.0.0.1). */
export function parseUrl(url: string): Address {
  const sep = url.indexOf("://");
  const scheme = sep < 0 ? "" : url.slice(0, sep).toLowerCase();
  if (sep < 0 || (scheme !== "zmq+ipc" && scheme !== "zmq+tcp")) {
    throw new ConnectError(`${JSON.stringify(url)} is not a zmq+ipc:// or zmq+tcp:// URL`);
  }
  const rest = url.slice(sep + 3);
  const q = rest.indexOf("?");
  const location = q < 0 ? rest : rest.slice(0, q);
  const params = new Map<string, string>();
  if (q >= 0) {
    for (const [key, value] of new URLSearchParams(rest.slice(q + 1))) {
      if (!PARAMS.has(key)) {
        throw new ConnectError(
          `${JSON.stringify(url)}: unknown query parameter ${JSON.stringify(key)} (known: ${[...PARAMS].sort().join(", ")})`,
        );
      }
      params.set(key, value);
    }
  }
  if (scheme === "zmq+ipc") {
    if (!location) throw new ConnectError(`${JSON.stringify(url)} names no socket path (expected zmq+ipc:///path)`);
    if (Buffer.byteLength(location) > 107) {
      throw new ConnectError(`ipc path ${JSON.stringify(location)} is longer than the 107 bytes Linux allows`);
    }
    return new Address(url, "ipc", location, "", 0, params);
  }
  const colon = location.lastIndexOf(":");
  if (colon < 0) throw new ConnectError(`${JSON.stringify(url)} names no port (expected zmq+tcp://host:port)`);
  const host = location.slice(0, colon).replace(/^\[|\]$/g, "") || "127.0.0.1";
  const portText = location.slice(colon + 1);
  let port = 0;
  if (portText !== "*" && portText !== "") {
    if (!/^[0-9]+$/.test(portText)) {
      throw new ConnectError(`${JSON.stringify(url)}: port ${JSON.stringify(portText)} is not a number`);
    }
    port = Number(portText);
    if (port > 65535) throw new ConnectError(`${JSON.stringify(url)}: port ${port} is out of range`);
  }
  return new Address(url, "tcp", "", host, port, params);
}

function heartbeatMs(address: Address): number {
  const text = address.params.get("heartbeat");
  if (text === undefined) return DEFAULT_HEARTBEAT_MS;
  const seconds = Number(text);
  if (text.trim() === "" || !Number.isFinite(seconds)) {
    throw new ConnectError(`heartbeat=${JSON.stringify(text)} is not a number of seconds`);
  }
  return Math.max(0, Math.trunc(seconds * 1000));
}

/** Options both sides set (docs/zmq.md): linger 0, the part size cap, heartbeats, IPv6. */
function commonOptions(address: Address, maxBody: number): Record<string, number | boolean> {
  const options: Record<string, number | boolean> = {
    linger: 0,
    maxMessageSize: Math.max(maxBody, HEADER_SIZE),
  };
  const heartbeat = heartbeatMs(address);
  if (heartbeat) {
    options.heartbeatInterval = heartbeat;
    options.heartbeatTimeout = 3 * heartbeat;
    options.heartbeatTimeToLive = 3 * heartbeat;
  }
  if (address.transport === "tcp" && address.host.includes(":")) options.ipv6 = true;
  return options;
}

// -- CURVE keys (Z85, key files) --------------------------------------------------------------------

const Z85_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
const Z85_VALUES = new Map([...Z85_CHARS].map((c, i) => [c, i]));

/** Z85 (ZeroMQ RFC 32) of bytes whose length is a multiple of 4. */
export function z85Encode(data: Uint8Array): string {
  if (data.byteLength % 4) throw new TransportError("z85 needs a multiple of 4 bytes");
  let out = "";
  for (let i = 0; i < data.byteLength; i += 4) {
    let value = ((data[i]! << 24) | (data[i + 1]! << 16) | (data[i + 2]! << 8) | data[i + 3]!) >>> 0;
    const chunk: string[] = [];
    for (let k = 0; k < 5; k++) {
      chunk.push(Z85_CHARS[value % 85]!);
      value = Math.floor(value / 85);
    }
    out += chunk.reverse().join("");
  }
  return out;
}

export function z85Decode(text: string): Buffer {
  if (text.length % 5) throw new TransportError("z85 text length is not a multiple of 5");
  const out = Buffer.alloc((text.length / 5) * 4);
  for (let i = 0, o = 0; i < text.length; i += 5, o += 4) {
    let value = 0;
    for (let k = 0; k < 5; k++) {
      const digit = Z85_VALUES.get(text[i + k]!);
      if (digit === undefined) throw new TransportError(`${JSON.stringify(text[i + k])} is not a z85 character`);
      value = value * 85 + digit;
    }
    if (value > 0xffffffff) throw new TransportError("z85 group out of range");
    out.writeUInt32BE(value, o);
  }
  return out;
}

function z85Key(text: string, what: string): Buffer {
  const key = text.trim();
  try {
    if (key.length !== 40) throw new Error("wrong length");
    return z85Decode(key);
  } catch (error) {
    throw new ConnectError(`${what} is not a 40-character Z85 CURVE key (${(error as Error).message})`);
  }
}

const X25519_PKCS8_PREFIX = Buffer.from("302e020100300506032b656e04220420", "hex");

/** The CURVE (X25519) public key of a 32-byte secret key. */
export function curvePublic(secret: Uint8Array): Buffer {
  const der = Buffer.concat([X25519_PKCS8_PREFIX, Buffer.from(secret)]);
  const key = createPrivateKey({ key: der, format: "der", type: "pkcs8" });
  const x = createPublicKey(key).export({ format: "jwk" }).x;
  if (typeof x !== "string") throw new TransportError("cannot derive a CURVE public key");
  return Buffer.from(x, "base64url");
}

/** A ZPL certificate as pyzmq writes it (`zmq.auth.create_certificates`). */
export function loadKeyFile(path: string, secret: boolean): { publicKey: Buffer; secretKey: Buffer | null } {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new ConnectError(`cannot read the CURVE key file ${path}: ${(error as Error).message}`);
  }
  const field = (name: string): string | null => {
    const match = new RegExp(`^\\s*${name}\\s*=\\s*"?([^"\\s]+)"?\\s*$`, "m").exec(text);
    return match ? match[1]! : null;
  };
  const publicText = field("public-key");
  if (publicText === null) throw new ConnectError(`cannot read the CURVE key file ${path}: no public-key`);
  const publicKey = z85Key(publicText, `the public key in ${path}`);
  const secretText = field("secret-key");
  if (secret && secretText === null) throw new ConnectError(`${path} holds no secret key (use the .key_secret file)`);
  return { publicKey, secretKey: secretText === null ? null : z85Key(secretText, `the secret key in ${path}`) };
}

function allowedClients(address: Address): Set<string> {
  const allowed = new Set<string>();
  const directory = address.params.get("clients") || process.env[ENV_CLIENTS_DIR];
  if (directory) {
    if (!existsSync(directory) || !statSync(directory).isDirectory()) {
      throw new ConnectError(`the allowed-clients directory ${directory} does not exist`);
    }
    for (const name of readdirSync(directory).sort()) {
      if (name.endsWith(".key")) allowed.add(z85Encode(loadKeyFile(join(directory, name), false).publicKey));
    }
  }
  for (const text of (process.env[ENV_ALLOWED_CLIENTS] ?? "").split(",")) {
    if (text.trim()) allowed.add(z85Encode(z85Key(text, `a key in ${ENV_ALLOWED_CLIENTS}`)));
  }
  return allowed;
}

export interface ServerCurve {
  readonly publicKey: Buffer;
  readonly secretKey: Buffer;
  /** Z85 text of every admitted client public key. */
  readonly allowed: ReadonlySet<string>;
}

/** The server's key pair and allow list when it uses CURVE, else null. */
export function serverCurve(address: Address): ServerCurve | null {
  if (address.transport !== "tcp") {
    if (address.params.has("server_key") || address.params.has("clients")) {
      throw new ConnectError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode");
    }
    return null;
  }
  let publicKey: Buffer;
  let secretKey: Buffer;
  const path = address.params.get("server_key");
  if (path) {
    const pair = loadKeyFile(path, true);
    publicKey = pair.publicKey;
    secretKey = pair.secretKey as Buffer;
  } else if (process.env[ENV_SERVER_SECRET]) {
    secretKey = z85Key(process.env[ENV_SERVER_SECRET], ENV_SERVER_SECRET);
    publicKey = curvePublic(secretKey);
  } else {
    return null;
  }
  const allowed = allowedClients(address);
  if (allowed.size === 0) {
    throw new ConnectError(
      "a CURVE server needs the public keys of the clients it admits: " +
        `?clients=DIR, ${ENV_CLIENTS_DIR}=DIR or ${ENV_ALLOWED_CLIENTS}=KEY,KEY`,
    );
  }
  return { publicKey, secretKey, allowed };
}

export interface ClientCurve {
  readonly serverPublic: Buffer;
  readonly publicKey: Buffer;
  readonly secretKey: Buffer;
}

/** The server's public key and this client's key pair when it uses CURVE, else null. */
export function clientCurve(address: Address): ClientCurve | null {
  if (address.transport !== "tcp") {
    if (address.params.has("server_key") || address.params.has("client_key")) {
      throw new ConnectError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode");
    }
    return null;
  }
  let serverPublic: Buffer | null = null;
  const serverPath = address.params.get("server_key");
  if (serverPath) serverPublic = loadKeyFile(serverPath, false).publicKey;
  else if (process.env[ENV_SERVER_PUBLIC]) serverPublic = z85Key(process.env[ENV_SERVER_PUBLIC], ENV_SERVER_PUBLIC);
  let publicKey: Buffer | null = null;
  let secretKey: Buffer | null = null;
  const clientPath = address.params.get("client_key");
  if (clientPath) {
    const pair = loadKeyFile(clientPath, true);
    publicKey = pair.publicKey;
    secretKey = pair.secretKey;
  } else if (process.env[ENV_CLIENT_SECRET]) {
    secretKey = z85Key(process.env[ENV_CLIENT_SECRET], ENV_CLIENT_SECRET);
    publicKey = curvePublic(secretKey);
  }
  if (serverPublic === null && secretKey === null) return null;
  if (serverPublic === null) {
    throw new ConnectError(`a CURVE client needs the server's public key (?server_key=FILE or ${ENV_SERVER_PUBLIC})`);
  }
  if (secretKey === null || publicKey === null) {
    throw new ConnectError(`a CURVE client needs its own key pair (?client_key=FILE or ${ENV_CLIENT_SECRET})`);
  }
  return { serverPublic, publicKey, secretKey };
}

/** zeromq.js string options take Buffers too (binary routing ids, 32-byte keys). */
function binary(value: Buffer): string {
  return value as unknown as string;
}

function asBuffer(data: Uint8Array): Buffer {
  return Buffer.isBuffer(data) ? data : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
}

/** What to hand zeromq.js for a body that lives in a buffer we will overwrite later. */
function sendable(body: Buffer): { part: Buffer; given: boolean } {
  const length = body.byteLength;
  if (length <= ZMQJS_COPY_LIMIT) return { part: body, given: false }; // copied by zeromq.js now
  if (length < ZERO_COPY_THRESHOLD) return { part: Buffer.from(body), given: false }; // our one copy
  return { part: body, given: true }; // libzmq reads it in place: the buffer is given away
}

function errorCode(error: unknown): string {
  return String((error as { code?: unknown }).code ?? (error as Error).message ?? error);
}

// -- client ---------------------------------------------------------------------------------------

function describeFailure(type: string, error: unknown): string {
  const status = (error as { status?: unknown } | undefined)?.status;
  if (type === "handshake:error:auth") {
    return `the server refused this client's CURVE key (ZAP status ${status ?? "?"})`;
  }
  if (type === "handshake:error:protocol") {
    return "the ZMTP handshake failed (CURVE on one side only, or the wrong server key?)";
  }
  return "the ZMTP handshake failed (wrong server key, or not a ZeroMQ server?)";
}

interface Wait {
  resolve: (parts: Buffer[]) => void;
  reject: (error: Error) => void;
}

/**
 * The client side: a Dealer whose replies are matched to requests by msg_id. `request` is
 * `sendRequest` + `recvResponse`; callers may pipeline with the two halves (a reply whose msg_id
 * is not the awaited one is discarded).
 */
export class ZmqChannel implements Channel {
  info: Record<string, unknown> = {};
  buffer: Buffer;
  bodyLength = 0;
  generation = 0;
  timeoutMs: number | null;
  readonly address: Address;
  readonly maxBody: number;

  readonly #sock: zmq.Dealer;
  readonly #header = Buffer.alloc(HEADER_SIZE);
  #nextId = 1;
  #connected = false;
  #lost = false;
  #failure = "";
  #closed = false;
  #receiving: Promise<Buffer[]> | null = null;
  #wait: Wait | null = null;
  #connectWaiters: Array<() => void> = [];

  constructor(address: Address, options: ChannelOptions = {}) {
    this.address = address;
    this.timeoutMs = options.timeoutMs === undefined ? 10_000 : options.timeoutMs;
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.buffer = Buffer.alloc(BODY_OFFSET + (64 << 10));
    const curve = clientCurve(address);
    const sock = new zmq.Dealer({
      ...commonOptions(address, this.maxBody),
      routingId: binary(Buffer.concat([Buffer.from("T"), randomBytes(16)])),
      immediate: true, // never queue a request for a server that is not there
      reconnectInterval: 100,
      reconnectMaxInterval: 1000,
      sendTimeout: 0, // a send without a connection fails at once; we wait for one ourselves
    });
    try {
      if (curve !== null) {
        sock.curveServerKey = binary(curve.serverPublic);
        sock.curvePublicKey = binary(curve.publicKey);
        sock.curveSecretKey = binary(curve.secretKey);
      }
      const events = sock.events;
      events.on("handshake", () => {
        this.#connected = true;
        this.#failure = "";
        this.#wakeConnectWaiters();
      });
      events.on("disconnect", () => {
        if (this.#connected) {
          this.#lost = true;
          this.#connected = false;
          this.#failWait();
        }
      });
      for (const type of ["handshake:error:auth", "handshake:error:protocol", "handshake:error:other"] as const) {
        events.on(type, (event: { error?: unknown }) => {
          this.#failure = describeFailure(type, event.error);
          this.#wakeConnectWaiters();
        });
      }
      sock.connect(address.endpoint);
    } catch (error) {
      sock.close();
      throw new ConnectError(`cannot connect to ${address.endpoint}: ${(error as Error).message}`);
    }
    this.#sock = sock;
  }

  get connected(): boolean {
    return this.#connected;
  }

  /** Send a request and await its reply: resolves to the reply's msg_type (body in `buffer`). */
  async request(msgType: number, body: Uint8Array): Promise<number> {
    const deadline = this.timeoutMs === null ? null : Date.now() + this.timeoutMs;
    const msgId = await this.sendRequest(msgType, body, deadline);
    return this.recvResponse(msgId, deadline);
  }

  /** Queue one request; resolves to its msg_id. Waits for a connection until the deadline. */
  async sendRequest(msgType: number, body: Uint8Array, deadline: number | null = null): Promise<number> {
    this.#checkUsable();
    const msgId = this.#nextId;
    this.#nextId = (msgId + 1) >>> 0 || 1;
    const data = asBuffer(body);
    packHeader(this.#header, 0, msgType, msgId, data.byteLength);
    const { part } = sendable(data);
    for (;;) {
      try {
        // sendTimeout 0: resolved or rejected synchronously; the 9-byte header is copied
        await this.#sock.send([this.#header, part]);
        return msgId;
      } catch (error) {
        if (this.#closed) throw new PeerGoneError("the channel is closed");
        if (errorCode(error) !== "EAGAIN") {
          throw new PeerGoneError(`cannot send to ${this.address.endpoint}: ${(error as Error).message}`);
        }
      }
      await this.#waitForConnection(deadline, "send");
    }
  }

  /** The reply to `msgId`: its msg_type; the body is `buffer[BODY_OFFSET, +bodyLength)`. */
  async recvResponse(msgId: number, deadline: number | null = null): Promise<number> {
    for (;;) {
      this.#checkUsable();
      const parts = await this.#next(deadline);
      const header = parts[0];
      if (parts.length !== 2 || header === undefined || header.byteLength !== HEADER_SIZE) {
        throw new BadFrameError(`reply header part is ${header?.byteLength ?? 0} bytes, or has no body part`);
      }
      const replyId = readU32(header, 1);
      const bodyLen = readU32(header, 5);
      if (replyId !== msgId) continue; // a stale reply to an abandoned request
      if (bodyLen > this.maxBody) {
        const error = new BadFrameError(`reply body_len ${bodyLen} exceeds the maximum ${this.maxBody}`);
        error.msgId = replyId;
        throw error;
      }
      const body = parts[1] as Buffer;
      if (body.byteLength !== bodyLen) {
        throw new BadFrameError(`reply body part is ${body.byteLength} bytes, its header says ${bodyLen}`);
      }
      if (BODY_OFFSET + bodyLen > this.buffer.byteLength) {
        this.buffer = Buffer.alloc(Math.max(BODY_OFFSET + bodyLen, 2 * this.buffer.byteLength));
        this.generation += 1;
      }
      body.copy(this.buffer, BODY_OFFSET); // the one copy: libzmq's message -> aligned buffer
      this.bodyLength = bodyLen;
      return header[0] as number;
    }
  }

  /** Wait (until the deadline) for the ZMTP handshake; `ConnectError` otherwise. */
  async waitConnected(deadline: number): Promise<void> {
    while (!this.#connected) {
      if (this.#closed) throw new ConnectError("the channel is closed");
      if (this.#failure.startsWith("the server refused")) {
        throw new ConnectError(`${this.address.endpoint}: ${this.#failure}`);
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        const detail = this.#failure ? `; last failure: ${this.#failure}` : "";
        throw new ConnectError(`nothing accepted a ZeroMQ connection on ${this.address.endpoint}${detail}`);
      }
      await this.#connectEvent(Math.min(remaining, 100));
    }
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const wait = this.#wait;
    this.#wait = null;
    wait?.reject(new PeerGoneError("the channel was closed while a request was outstanding"));
    this.#wakeConnectWaiters();
    this.#sock.close();
  }

  // -- internals -------------------------------------------------------------------------------

  #checkUsable(): void {
    if (this.#closed) throw new PeerGoneError("the channel is closed");
    if (this.#lost) {
      this.#lost = false;
      throw new PeerGoneError(
        `the connection to ${this.address.endpoint} was closed or its heartbeats stopped`,
      );
    }
  }

  /** The next message, or a rejection at the deadline or when the connection is lost. */
  #next(deadline: number | null): Promise<Buffer[]> {
    let receiving = this.#receiving;
    if (receiving === null) {
      // one receive is outstanding at a time (zeromq.js); a timed-out one is picked up later
      receiving = this.#sock.receive();
      this.#receiving = receiving;
      receiving.then(
        () => undefined,
        () => undefined,
      );
    }
    return new Promise<Buffer[]>((resolve, reject) => {
      let timer: NodeJS.Timeout | null = null;
      const wait: Wait = {
        resolve,
        reject: (error: Error) => {
          if (timer !== null) clearTimeout(timer);
          if (this.#wait === wait) this.#wait = null;
          reject(error);
        },
      };
      this.#wait = wait;
      if (deadline !== null) {
        timer = setTimeout(() => {
          wait.reject(
            this.#connected
              ? new TransportTimeoutError(`no reply from ${this.address.endpoint} within ${this.timeoutMs} ms`)
              : new PeerGoneError(`no connection to ${this.address.endpoint} (no reply within ${this.timeoutMs} ms)`),
          );
        }, Math.max(0, deadline - Date.now()));
      }
      receiving.then(
        (parts) => {
          if (this.#wait !== wait) return; // abandoned: the message stays for the next wait
          if (timer !== null) clearTimeout(timer);
          this.#wait = null;
          this.#receiving = null;
          resolve(parts);
        },
        (error: unknown) => {
          if (this.#receiving === receiving) this.#receiving = null;
          wait.reject(
            this.#closed
              ? new PeerGoneError("the channel is closed")
              : new PeerGoneError(`receiving from ${this.address.endpoint} failed: ${errorCode(error)}`),
          );
        },
      );
    });
  }

  #failWait(): void {
    const wait = this.#wait;
    if (wait === null) return;
    this.#lost = false; // reported to this request
    wait.reject(new PeerGoneError(`the connection to ${this.address.endpoint} was closed or its heartbeats stopped`));
  }

  #connectEvent(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.#connectWaiters.push(done);
    });
  }

  #wakeConnectWaiters(): void {
    const waiters = this.#connectWaiters;
    this.#connectWaiters = [];
    for (const wake of waiters) wake();
  }

  async #waitForConnection(deadline: number | null, what: string): Promise<void> {
    this.#checkUsable();
    if (deadline !== null && Date.now() >= deadline) {
      if (this.#connected) throw new TransportTimeoutError(`could not ${what} to ${this.address.endpoint} in time`);
      const detail = this.#failure ? `: ${this.#failure}` : "";
      throw new PeerGoneError(`no connection to ${this.address.endpoint}${detail}`);
    }
    const remaining = deadline === null ? 50 : Math.max(1, Math.min(50, deadline - Date.now()));
    await this.#connectEvent(remaining);
  }
}

/** Connect a Dealer and wait (until the deadline) for the handshake with the server. */
export async function openChannel(url: string, options: OpenOptions = {}): Promise<ZmqChannel> {
  const address = parseUrl(url);
  const channel = new ZmqChannel(address, options);
  const timeoutMs = options.timeoutMs ?? 10_000;
  try {
    await channel.waitConnected(Date.now() + timeoutMs);
  } catch (error) {
    channel.close();
    throw error;
  }
  return channel;
}

// -- server ---------------------------------------------------------------------------------------

/** True when something accepts connections on `path` (a silent socket counts as live). */
function isLive(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.createConnection({ path });
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(true);
    }, 1000);
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(false);
    });
  });
}

async function claimPath(path: string): Promise<void> {
  let stat: ReturnType<typeof lstatSync> | undefined;
  try {
    stat = lstatSync(path);
  } catch {
    return;
  }
  if (!stat.isSocket()) throw new ConnectError(`${path} exists and is not a socket; not replacing it`);
  if (await isLive(path)) throw new ConnectError(`${path} is in use by a live server`);
  try {
    unlinkSync(path); // stale: its server is gone
  } catch {
    // someone else removed it
  }
}

/** ZAP (RFC 27) handler admitting exactly the allowed CURVE client keys. */
async function serveZap(sock: zmq.Reply, allowed: ReadonlySet<string>): Promise<void> {
  for (;;) {
    let request: Buffer[];
    try {
      request = await sock.receive();
    } catch {
      return; // closed
    }
    const [version, requestId, , , , mechanism, key] = request;
    let status = "400";
    let text = "unknown key";
    if (version?.toString() !== "1.0") {
      status = "500";
      text = "unsupported ZAP version";
    } else if (mechanism?.toString() === "CURVE" && key !== undefined && key.byteLength === 32) {
      const z85 = z85Encode(key);
      if (allowed.has(z85)) {
        status = "200";
        text = "OK";
      } else {
        process.emitWarning(`refused a CURVE client with key ${z85}`);
      }
    } else {
      text = "only CURVE clients are admitted";
    }
    try {
      await sock.send(["1.0", requestId ?? EMPTY, status, text, "", ""]);
    } catch {
      return;
    }
  }
}

/**
 * A Router serving every client; one Session per client routing id. A HELLO from a client that
 * already said hello starts a fresh Session; errors that close a stream connection drop the
 * session instead (a Router cannot close one peer): the client must HELLO again.
 */
export class ZmqListener implements Listener {
  url: string;
  readonly address: Address;
  readonly stats: ConnectionStats = newStats();
  readonly maxBody: number;
  readonly maxSessions: number;

  readonly #sessions = new Map<string, Session>();
  readonly #factory: () => Session;
  readonly #errorType: number;
  readonly #header = Buffer.alloc(HEADER_SIZE);
  #sock: zmq.Router | null = null;
  #zap: zmq.Reply | null = null;
  #inode: number | null = null;
  #loop: Promise<void> | null = null;
  #closed: Promise<void> | null = null;

  constructor(url: string, sessions: () => Session, options: ListenOptions = {}, maxSessions = MAX_SESSIONS) {
    this.url = url;
    this.address = parseUrl(url);
    this.#factory = sessions;
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.maxSessions = maxSessions;
    this.#errorType = messageIds(options.schema ?? pac_env.SCHEMA).ERROR;
  }

  /** Bind now; refuses a live ipc path or a tcp port in use, and insecure remote binds. */
  async start(allowRemote = false): Promise<void> {
    const address = this.address;
    const curve = serverCurve(address);
    if (address.transport === "tcp" && !address.isLoopback && curve === null) {
      if (!address.flag("allow_insecure") && !allowRemote) {
        throw new ConnectError(
          `refusing to bind ${address.host} without CURVE keys: anyone who can reach it could drive ` +
            "the envs; give ?server_key=FILE&clients=DIR (or " +
            `${ENV_SERVER_SECRET}) or add ?allow_insecure=1`,
        );
      }
    }
    if (address.transport === "ipc") await claimPath(address.path);
    const context = new zmq.Context({ ioThreads: 1 });
    const sock = new zmq.Router({
      ...commonOptions(address, this.maxBody),
      context,
      handover: true, // a reconnecting client keeps its session
      mandatory: true, // a reply to a gone client fails (EHOSTUNREACH): its session is dropped
      sendTimeout: 0, // never wait on a client that does not read its replies
    });
    let zap: zmq.Reply | null = null;
    try {
      if (curve !== null) {
        zap = new zmq.Reply({ context, linger: 0 });
        await zap.bind(ZAP_ENDPOINT); // before the Router binds: no handler would admit anyone
        void serveZap(zap, curve.allowed);
        sock.curveServer = true;
        sock.curvePublicKey = binary(curve.publicKey);
        sock.curveSecretKey = binary(curve.secretKey);
        sock.zapDomain = "transport";
      }
      await this.#bind(sock, address);
    } catch (error) {
      sock.close();
      zap?.close();
      throw error;
    }
    this.#sock = sock;
    this.#zap = zap;
    this.#loop = this.#serve(sock);
  }

  async #bind(sock: zmq.Router, address: Address): Promise<void> {
    let old: number | null = null;
    if (address.transport === "ipc") {
      try {
        old = process.umask(0o177); // the file is born 0600
      } catch {
        old = null; // worker threads cannot change the umask: chmod below still applies
      }
    }
    try {
      await sock.bind(address.endpoint);
    } catch (error) {
      const where = address.path || `${address.host}:${address.port}`;
      const code = errorCode(error);
      if (code === "EADDRINUSE") throw new ConnectError(`${where} is in use (EADDRINUSE)`);
      throw new ConnectError(`cannot bind ${where}: ${(error as Error).message}`);
    } finally {
      if (old !== null) process.umask(old);
    }
    if (address.transport === "ipc") {
      chmodSync(address.path, 0o600);
      this.#inode = statSync(address.path).ino;
    } else {
      const endpoint = sock.lastEndpoint ?? "";
      this.url = address.withPort(Number(endpoint.slice(endpoint.lastIndexOf(":") + 1)));
    }
  }

  async #serve(sock: zmq.Router): Promise<void> {
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await sock.receive();
      } catch (error) {
        if (this.#closed !== null || sock.closed) return;
        process.emitWarning(`zmq listener ${this.url}: receive failed: ${errorCode(error)}`);
        continue;
      }
      try {
        this.#serveOne(sock, parts);
      } catch (error) {
        process.emitWarning(`zmq listener ${this.url}: ${String(error)}`);
      }
    }
  }

  /** Handle one message `[identity, (""), header, body]` and answer it. */
  #serveOne(sock: zmq.Router, parts: Buffer[]): void {
    const identity = parts[0] as Buffer;
    if (parts.length < 2) return;
    let at = 1;
    const envelope = (parts[1] as Buffer).byteLength === 0 && parts.length > 2; // a REQ client
    if (envelope) at = 2;
    const header = parts[at] as Buffer;
    const n = header.byteLength;
    let msgType = 0;
    let msgId = 0;
    let bodyLen = 0;
    if (n >= HEADER_SIZE) {
      msgType = header[0] as number;
      msgId = readU32(header, 1);
      bodyLen = readU32(header, 5);
    }
    let problem: [number, string] | null = null;
    if (n !== HEADER_SIZE) problem = [ErrorCode.BAD_FRAME, `the header part is ${n} bytes, expected 9`];
    else if (bodyLen > this.maxBody) {
      problem = [ErrorCode.BODY_TOO_LARGE, `body_len ${bodyLen} exceeds the maximum ${this.maxBody}`];
    }
    let body: Buffer = EMPTY;
    if (parts.length > at + 1) {
      body = parts[at + 1] as Buffer;
      if (problem === null && body.byteLength !== bodyLen) {
        problem = [ErrorCode.BAD_FRAME, `the body part is ${body.byteLength} bytes, its header says ${bodyLen}`];
      }
      if (parts.length > at + 2 && problem === null) {
        problem = [ErrorCode.BAD_FRAME, "a frame is [header, body]: 2 parts"];
      }
    } else if (problem === null && bodyLen) {
      problem = [ErrorCode.BAD_FRAME, `header says ${bodyLen} body bytes, no body part`];
    }
    const key = identity.toString("latin1");
    if (problem !== null) {
      const [code, text] = problem;
      if (CLOSING_ERRORS.has(code)) this.#sessions.delete(key);
      this.#reply(sock, identity, key, envelope, this.#errorType, msgId, encodeError(code, text), null);
      return;
    }
    const session = this.#sessionFor(key, msgType);
    if (session === null) {
      const error = encodeError(ErrorCode.INTERNAL, "the server could not create a session");
      this.#reply(sock, identity, key, envelope, this.#errorType, msgId, error, null);
      return;
    }
    const type = session.handle(msgType, body, 0, bodyLen);
    if (session.closing) this.#sessions.delete(key);
    this.#reply(sock, identity, key, envelope, type, msgId, session.body(), session);
  }

  #sessionFor(key: string, msgType: number): Session | null {
    const sessions = this.#sessions;
    let session = sessions.get(key);
    if (session !== undefined) {
      if (!(session.helloDone && msgType === session.ids.HELLO_REQ)) {
        if (sessions.size > 1) {
          sessions.delete(key); // most recently used last
          sessions.set(key, session);
        }
        return session;
      }
      sessions.delete(key); // a second HELLO: a fresh session, fresh envs
    }
    try {
      session = this.#factory();
    } catch (error) {
      process.emitWarning(`cannot create a session for a new client on ${this.url}: ${String(error)}`);
      return null;
    }
    this.stats.connections += 1;
    sessions.set(key, session);
    while (sessions.size > this.maxSessions) {
      const oldest = sessions.keys().next().value as string;
      sessions.delete(oldest);
    }
    return session;
  }

  #reply(
    sock: zmq.Router,
    identity: Buffer,
    key: string,
    envelope: boolean,
    msgType: number,
    msgId: number,
    body: Buffer,
    session: Session | null,
  ): void {
    packHeader(this.#header, 0, msgType, msgId, body.byteLength);
    // a body we built for this reply alone is never reused: hand it over as it is
    const { part, given } = session === null ? { part: body, given: false } : sendable(body);
    const parts = envelope ? [identity, EMPTY, this.#header, part] : [identity, this.#header, part];
    // sendTimeout 0: the send happens now (header and identity copied); failures come async
    sock.send(parts).then(undefined, (error: unknown) => {
      const code = errorCode(error);
      if (code === "EHOSTUNREACH") this.#sessions.delete(key); // the client is gone: so is its session
      else process.emitWarning(`dropped a reply to a client whose queue is full: ${code}`);
    });
    if (given && session !== null) {
      session.detachBuffer(); // libzmq owns the old buffer until it has sent it
      this.stats.detached += 1;
    }
  }

  /** Stop serving, close the sockets and remove the ipc file (if still ours). */
  close(): Promise<void> {
    if (this.#closed !== null) return this.#closed;
    this.#closed = (async () => {
      this.#sock?.close();
      this.#zap?.close();
      await this.#loop?.catch(() => undefined);
      this.#sessions.clear();
      if (this.address.transport === "ipc" && this.#inode !== null) {
        try {
          if (statSync(this.address.path).ino === this.#inode) unlinkSync(this.address.path);
        } catch {
          // already gone (libzmq unlinks the ipc file it bound on close)
        }
      }
    })();
    return this.#closed;
  }

  /** Sessions alive now (tests). */
  get sessionCount(): number {
    return this.#sessions.size;
  }
}

/** Bind a Router at `url` (ready for clients when this resolves). */
export async function listen(url: string, sessions: () => Session, options: ListenOptions = {}): Promise<ZmqListener> {
  const listener = new ZmqListener(url, sessions, options);
  await listener.start(options.allowRemote ?? false);
  return listener;
}
