/**
 * zmq+ipc:// / zmq+tcp:// details shared by both sides: constants, addresses and their
 * parameters, CURVE keys (Z85, key files) and the rules of which bodies are copied.
 */

import { createPrivateKey, createPublicKey } from "node:crypto";
import { closeSync, existsSync, fstatSync, openSync, readFileSync, readdirSync, statSync } from "node:fs";
import { isIP } from "node:net";
import { join } from "node:path";
import { ConnectError, TransportError } from "../../errors";
import { singleParams } from "../url_params";
import { HEADER_SIZE } from "../../protocol";


/** Bodies at least this large are handed to libzmq without a copy (and the buffer is given up). */
export const ZERO_COPY_THRESHOLD = 64 << 10;
/** zeromq.js copies message parts up to this size itself (and wraps larger ones). */
export const ZMQJS_COPY_LIMIT = 128;
/** ZMTP heartbeat interval in ms; a peer silent for 3 intervals is disconnected. */
export const DEFAULT_HEARTBEAT_MS = 1000;
/** Sessions a server keeps (least recently used beyond this are dropped). */
export const MAX_SESSIONS = 1024;

export const ENV_SERVER_SECRET = "TRANSPORT_ZMQ_SERVER_SECRET";
export const ENV_SERVER_PUBLIC = "TRANSPORT_ZMQ_SERVER_PUBLIC";
export const ENV_CLIENT_SECRET = "TRANSPORT_ZMQ_CLIENT_SECRET";
export const ENV_CLIENTS_DIR = "TRANSPORT_ZMQ_CLIENTS_DIR";
export const ENV_ALLOWED_CLIENTS = "TRANSPORT_ZMQ_ALLOWED_CLIENTS";

export const PARAMS = new Set(["server_key", "client_key", "clients", "allow_insecure", "heartbeat"]);
export const ZAP_ENDPOINT = "inproc://zeromq.zap.01";
export const EMPTY: Buffer = Buffer.alloc(0);

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
  const params = singleParams(url, q < 0 ? "" : rest.slice(q + 1));
  for (const key of params.keys()) {
    if (!PARAMS.has(key)) {
      throw new ConnectError(
        `${JSON.stringify(url)}: unknown query parameter ${JSON.stringify(key)} (known: ${[...PARAMS].sort().join(", ")})`,
      );
    }
  }
  const heartbeat = params.get("heartbeat");
  if (heartbeat !== undefined) heartbeatSeconds(heartbeat); // a bad interval is refused with the URL
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

/** The longest `?heartbeat=` interval in seconds (a day: 3 intervals in ms fit libzmq's int). */
export const MAX_HEARTBEAT_S = 86400;

/** `?heartbeat=SECONDS`: 0 (off) or 0.001..MAX_HEARTBEAT_S; anything else is refused. */
function heartbeatSeconds(text: string): number {
  const seconds = Number(text);
  if (text.trim() === "" || Number.isNaN(seconds)) {
    throw new ConnectError(`heartbeat=${JSON.stringify(text)} is not a number of seconds`);
  }
  if (!Number.isFinite(seconds) || !(seconds === 0 || (seconds >= 0.001 && seconds <= MAX_HEARTBEAT_S))) {
    throw new ConnectError(`heartbeat=${JSON.stringify(text)} must be 0 (off) or 0.001..${MAX_HEARTBEAT_S} seconds`);
  }
  return seconds;
}

export function heartbeatMs(address: Address): number {
  const text = address.params.get("heartbeat");
  if (text === undefined) return DEFAULT_HEARTBEAT_MS;
  return Math.trunc(heartbeatSeconds(text) * 1000);
}

/** Options both sides set (docs/zmq.md): linger 0, the part size cap, heartbeats, IPv6. */
export function commonOptions(address: Address, maxBody: number): Record<string, number | boolean> {
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

export const Z85_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
export const Z85_VALUES = new Map([...Z85_CHARS].map((c, i) => [c, i]));

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

/**
 * A CURVE key this process was given (a key file, a key variable, the URL's key parameters) is
 * unusable: this process's own configuration, so a client says no "is a server serving this
 * URL?" hint after it (`localConfig`). Python: `CurveKeyError`.
 */
export class CurveKeyError extends ConnectError {
  readonly localConfig = true;
}

export function z85Key(text: string, what: string): Buffer {
  const key = text.trim();
  try {
    if (key.length !== 40) throw new Error("wrong length");
    return z85Decode(key);
  } catch (error) {
    throw new CurveKeyError(`${what} is not a 40-character Z85 CURVE key (${(error as Error).message})`);
  }
}

export const X25519_PKCS8_PREFIX = Buffer.from("302e020100300506032b656e04220420", "hex");

/** The CURVE (X25519) public key of a 32-byte secret key. */
export function curvePublic(secret: Uint8Array): Buffer {
  const der = Buffer.concat([X25519_PKCS8_PREFIX, Buffer.from(secret)]);
  const key = createPrivateKey({ key: der, format: "der", type: "pkcs8" });
  const x = createPublicKey(key).export({ format: "jwk" }).x;
  if (typeof x !== "string") throw new TransportError("cannot derive a CURVE public key");
  return Buffer.from(x, "base64url");
}

/** strerror's words for the errors a key file's read can meet (Python says `exc.strerror`). */
const ERRNO_TEXT: Readonly<Record<string, string>> = {
  ENOENT: "No such file or directory",
  EISDIR: "Is a directory",
  ENOTDIR: "Not a directory",
  EACCES: "Permission denied",
  EPERM: "Operation not permitted",
  ELOOP: "Too many levels of symbolic links",
  ENAMETOOLONG: "File name too long",
  EIO: "Input/output error",
};

/** The text of a key file and its permission bits (0 for a file without a name, such as a
 * memfd: no other user can open it, whatever its mode says). */
function readKeyText(path: string): { text: string; mode: number } {
  let fd = -1;
  try {
    fd = openSync(path, "r");
    const info = fstatSync(fd);
    const mode = info.nlink > 0 ? info.mode & 0o7777 : 0;
    return { text: readFileSync(fd, "utf8"), mode };
  } catch (error) {
    const code = String((error as { code?: unknown }).code ?? "");
    const reason = ERRNO_TEXT[code] ?? (error as Error).message;
    throw new CurveKeyError(`cannot read the CURVE key file ${path}: ${reason}`);
  } finally {
    if (fd >= 0) closeSync(fd);
  }
}

/**
 * A ZPL certificate as pyzmq writes it (`keygen`): a secret key's file must be private (`chmod
 * 600`, as ssh asks of its keys) and its public key the secret's. Python: `_load_key_file`, in
 * the same words.
 */
export function loadKeyFile(path: string, secret: boolean): { publicKey: Buffer; secretKey: Buffer | null } {
  const { text, mode } = readKeyText(path);
  const field = (name: string): string | null => {
    const match = new RegExp(`^\\s*${name}\\s*=\\s*"?([^"\\s]+)"?\\s*$`, "m").exec(text);
    return match ? match[1]! : null;
  };
  const publicText = field("public-key");
  if (publicText === null) throw new CurveKeyError(`cannot read the CURVE key file ${path}: no public-key`);
  const publicKey = z85Key(publicText, `the public key in ${path}`);
  const secretText = field("secret-key");
  if (secret && secretText === null) throw new CurveKeyError(`${path} holds no secret key (use the .key_secret file)`);
  if (secretText === null) return { publicKey, secretKey: null };
  const secretKey = z85Key(secretText, `the secret key in ${path}`);
  if (!curvePublic(secretKey).equals(publicKey)) {
    throw new CurveKeyError(
      `the public key in ${path} is not its secret key's (the file was changed: make a new pair with keygen)`,
    );
  }
  if (secret && mode & 0o077) {
    throw new CurveKeyError(
      `${path} holds a CURVE secret key but group or others may read or change it ` +
        `(mode ${mode.toString(8).padStart(4, "0")}): chmod 600 ${path}`,
    );
  }
  return { publicKey, secretKey };
}

/** The URL's `name=PATH` (null when absent); an empty value is an error, not absent. */
function urlPath(address: Address, name: string): string | null {
  const value = address.params.get(name);
  if (value === undefined) return null;
  if (!value) throw new CurveKeyError(`?${name}= is empty: give a path (percent-encoded), or leave the parameter out`);
  return value;
}

function checkNotWorldWritable(path: string, what: string): void {
  const mode = statSync(path).mode & 0o7777;
  if (mode & 0o002) {
    throw new CurveKeyError(
      `${what} ${path} is writable by anyone (mode ${mode.toString(8).padStart(4, "0")}), who could admit a key ` +
        `of their own: chmod o-w ${path}`,
    );
  }
}

/** The admitted client keys: the URL's `clients=DIR` alone when given (the URL wins over the
 * environment), else the environment's directory and list. */
export function allowedClients(address: Address): Set<string> {
  const allowed = new Set<string>();
  let directory = urlPath(address, "clients");
  const fromUrl = directory !== null;
  if (!fromUrl) directory = process.env[ENV_CLIENTS_DIR] || null;
  if (directory !== null) {
    if (!existsSync(directory) || !statSync(directory).isDirectory()) {
      throw new CurveKeyError(`the allowed-clients directory ${directory} does not exist`);
    }
    checkNotWorldWritable(directory, "the allowed-clients directory");
    for (const name of readdirSync(directory).sort()) {
      if (!name.endsWith(".key")) continue;
      const path = join(directory, name);
      const { publicKey } = loadKeyFile(path, false);
      checkNotWorldWritable(path, "the CURVE key file");
      allowed.add(z85Encode(publicKey));
    }
  }
  if (!fromUrl) {
    for (const text of (process.env[ENV_ALLOWED_CLIENTS] ?? "").split(",")) {
      if (text.trim()) allowed.add(z85Encode(z85Key(text, `a key in ${ENV_ALLOWED_CLIENTS}`)));
    }
  }
  return allowed;
}

function allowListSource(address: Address): string | null {
  if (address.params.has("clients")) return "?clients=DIR";
  for (const name of [ENV_CLIENTS_DIR, ENV_ALLOWED_CLIENTS]) if ((process.env[name] ?? "").trim()) return name;
  return null;
}

export interface ServerCurve {
  readonly publicKey: Buffer;
  readonly secretKey: Buffer;
  /** Z85 text of every admitted client public key. */
  readonly allowed: ReadonlySet<string>;
}

/** The server's key pair and allow list when it uses CURVE, else null. An allow list without
 * the server's key pair is refused: it would serve without CURVE. */
export function serverCurve(address: Address): ServerCurve | null {
  if (address.transport !== "tcp") {
    if (address.params.has("server_key") || address.params.has("clients")) {
      throw new CurveKeyError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode");
    }
    return null;
  }
  let publicKey: Buffer;
  let secretKey: Buffer;
  const path = urlPath(address, "server_key");
  if (path !== null) {
    const pair = loadKeyFile(path, true);
    publicKey = pair.publicKey;
    secretKey = pair.secretKey as Buffer;
  } else if (process.env[ENV_SERVER_SECRET]) {
    secretKey = z85Key(process.env[ENV_SERVER_SECRET], ENV_SERVER_SECRET);
    publicKey = curvePublic(secretKey);
  } else {
    const source = allowListSource(address);
    if (source !== null) {
      throw new CurveKeyError(
        `${source} admits clients by their CURVE keys, but this server has no key pair ` +
          `(?server_key=DIR/server.key_secret or ${ENV_SERVER_SECRET}): it would serve without CURVE`,
      );
    }
    return null;
  }
  const allowed = allowedClients(address);
  if (allowed.size === 0) {
    throw new CurveKeyError(
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
      throw new CurveKeyError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode");
    }
    return null;
  }
  let serverPublic: Buffer | null = null;
  const serverPath = urlPath(address, "server_key");
  if (serverPath !== null) serverPublic = loadKeyFile(serverPath, false).publicKey;
  else if (process.env[ENV_SERVER_PUBLIC]) serverPublic = z85Key(process.env[ENV_SERVER_PUBLIC], ENV_SERVER_PUBLIC);
  let publicKey: Buffer | null = null;
  let secretKey: Buffer | null = null;
  const clientPath = urlPath(address, "client_key");
  if (clientPath !== null) {
    const pair = loadKeyFile(clientPath, true);
    publicKey = pair.publicKey;
    secretKey = pair.secretKey;
  } else if (process.env[ENV_CLIENT_SECRET]) {
    secretKey = z85Key(process.env[ENV_CLIENT_SECRET], ENV_CLIENT_SECRET);
    publicKey = curvePublic(secretKey);
  }
  if (serverPublic === null && secretKey === null) return null;
  if (serverPublic === null) {
    throw new CurveKeyError(`a CURVE client needs the server's public key (?server_key=FILE or ${ENV_SERVER_PUBLIC})`);
  }
  if (secretKey === null || publicKey === null) {
    throw new CurveKeyError(`a CURVE client needs its own key pair (?client_key=FILE or ${ENV_CLIENT_SECRET})`);
  }
  return { serverPublic, publicKey, secretKey };
}

/** zeromq.js string options take Buffers too (binary routing ids, 32-byte keys). */
export function binary(value: Buffer): string {
  return value as unknown as string;
}

export function asBuffer(data: Uint8Array): Buffer {
  return Buffer.isBuffer(data) ? data : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
}

/** What to hand zeromq.js for a body that lives in a buffer we will overwrite later. */
export function sendable(body: Buffer): { part: Buffer; given: boolean } {
  const length = body.byteLength;
  if (length <= ZMQJS_COPY_LIMIT) return { part: body, given: false }; // copied by zeromq.js now
  if (length < ZERO_COPY_THRESHOLD) return { part: Buffer.from(body), given: false }; // our one copy
  return { part: body, given: true }; // libzmq reads it in place: the buffer is given away
}

export function errorCode(error: unknown): string {
  return String((error as { code?: unknown }).code ?? (error as Error).message ?? error);
}
