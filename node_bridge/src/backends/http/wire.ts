/**
 * http:// wire details shared by the server and the client: the `/v1/<method>` table,
 * the HTTP status of each error code, URLs (loopback checks) and the JSON rendering for curl.
 */

import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { ConnectError } from "../../errors";
import { singleParams } from "../url_params";
import { ErrorCode, HTTP_ROUTES, HTTP_STATUS, encodeError, parseError } from "../../protocol";


/** `/v1/<method>` -> the request message it carries (declared in schema/protocol.toml). */
export const METHODS: Readonly<Record<string, string>> = HTTP_ROUTES;

/** HTTP status of each ERROR code (schema/protocol.toml; a 405 for a non-POST carries UNKNOWN_MESSAGE). */
export const STATUS_OF_ERROR: Readonly<Record<number, number>> = HTTP_STATUS;

export const REASONS: Readonly<Record<number, string>> = {
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
/** Most header lines a request may have, as on the Python side (more: 400 BAD_FRAME, closed). */
export const MAX_HEADERS = 64;
export const HEX16 = /^[0-9a-f]{16}$/;
/**
 * The 400 BAD_FRAME text both servers give a request head with a LF not preceded by CR (Python:
 * `BARE_LF_TEXT`): llhttp refuses it as it arrives, and the Python server does the same.
 */
export const BARE_LF_TEXT = "a bare LF ends a line of the request head: end every line with CRLF (RFC 9112 2.2)";

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

/**
 * Why a URL with user info is refused, on both sides and in both languages (Python:
 * `USERINFO_TEXT`): it was read as part of the host before.
 */
export const USERINFO_TEXT =
  "an http:// URL takes no user info (user@host): the protocol has no authentication (use http://host:port)";

export const URL_PATTERN = /^http:\/\/(\[[^\]/]*\]|[^/:?#[\]]*)(?::([0-9]*))?(\/)?(?:\?([^#]*))?$/i;

/** `http://host:port` (a listener may ask for port 0 and `?allow_remote=1`). */
export function parseUrl(url: string, listener = false): Address {
  if (!/^http:\/\//i.test(url)) throw new ConnectError(`${JSON.stringify(url)} is not an http:// URL`);
  if ((/^http:\/\/([^/?#]*)/i.exec(url)?.[1] ?? "").includes("@")) {
    const shown = url.replace(/^(http:\/\/)[^/?#]*@/i, "$1***@"); // never echo a password
    throw new ConnectError(`${JSON.stringify(shown)}: ${USERINFO_TEXT}`);
  }
  const match = URL_PATTERN.exec(url);
  const badPort = match === null ? /^http:\/\/(?:\[[^\]/]*\]|[^/:?#[\]]*):([^/?#]*)/i.exec(url) : null;
  if (badPort !== null && !/^[0-9]*$/.test(badPort[1] as string)) {
    throw new ConnectError(`${JSON.stringify(url)} is not a valid http URL: port ${JSON.stringify(badPort[1])} is not a number`);
  }
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
  for (const [key, value] of singleParams(url, match[4] ?? "")) {
    if (key === "allow_remote" && listener) {
      allowRemote = ["1", "true", "yes", ""].includes(value.toLowerCase());
    } else {
      throw new ConnectError(`${JSON.stringify(url)}: unknown URL parameter ${JSON.stringify(key)}`);
    }
  }
  return { host, port, allowRemote };
}

export function isLoopbackIp(ip: string): boolean {
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

export async function isLoopback(host: string): Promise<boolean> {
  if (!host) return false; // "all interfaces"
  if (isIP(host.split("%")[0] as string)) return isLoopbackIp(host);
  try {
    const infos = await lookup(host, { all: true });
    return infos.length > 0 && infos.every((info) => isLoopbackIp(info.address));
  } catch {
    return false;
  }
}

// -- request heads (the Python server's parser: transport/backends/http/server.py) ---------------

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const REQUEST_LINE = /^([A-Z][A-Z-]{0,15}) +(\/[\x21-\x7e]*) +HTTP\/1\.([01])$/;
const BARE_LF = /(?<!\r)\n/;
const HTTP_VERBS = new Set(
  ("ACL BIND CHECKOUT COPY DELETE GET HEAD LINK LOCK M-SEARCH MERGE MKACTIVITY MKCALENDAR MKCOL " +
    "MOVE NOTIFY OPTIONS PATCH POST PROPFIND PROPPATCH PURGE PUT QUERY REBIND REPORT SEARCH " +
    "SOURCE SUBSCRIBE TRACE UNBIND UNLINK UNLOCK UNSUBSCRIBE").split(" "),
);
const MAX_CONTENT_LENGTH = (1n << 64n) - 1n;

/** Request bytes as an error text shows them: JSON-quoted text of their latin-1 reading. */
export function quoted(latin1: string): string {
  return JSON.stringify(latin1);
}

/** Whether a comma-separated header value (repeated lines joined) has `element` (lowercase). */
export function listHas(value: string | undefined, element: string): boolean {
  if (value === undefined) return false;
  return value.toLowerCase().split(",").some((item) => item.replace(/^[ \t]+|[ \t]+$/g, "") === element);
}

/**
 * The 400 text the Python server gives a request whose bytes (from the start of the request,
 * blank lines before it included) are `data`, all of which arrived: its `_read_head`,
 * `_check_start` and `parse_request_head` rules, in their order. Null when those rules find
 * nothing wrong (llhttp refused what Python would wait on or accept). Node's parser refuses
 * the same requests; this gives its refusals the same words.
 */
export function requestHeadError(data: Uint8Array): string | null {
  const text = Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("latin1");
  let skip = 0;
  while (skip < text.length && (text[skip] === "\r" || text[skip] === "\n")) skip++;
  const end = text.indexOf("\r\n\r\n", skip);
  if (end >= 0) {
    if (end > MAX_HEAD) return `request head is larger than ${MAX_HEAD} bytes`;
    return headError(text.slice(skip, end));
  }
  if (BARE_LF.test(text.slice(skip))) return BARE_LF_TEXT;
  if (text.length >= MAX_HEAD) return `request head is larger than ${MAX_HEAD} bytes`;
  if (skip === text.length) return null;
  const lineEnd = text.indexOf("\r\n", skip);
  if (lineEnd >= 0) {
    const line = text.slice(skip, lineEnd);
    return REQUEST_LINE.test(line) ? null : `not an HTTP/1.x request line: ${quoted(line.slice(0, 80))}`;
  }
  const start = text.slice(skip, skip + 18);
  const verb = start.split(" ")[0] as string;
  if (!/^[A-Z-]{0,16}$/.test(verb) || (!start.includes(" ") && verb.length >= 17)) {
    return `not an HTTP request: ${quoted(start)}`;
  }
  return null;
}

/** `parse_request_head`'s refusal of a whole head (without its CRLFCRLF), or null. */
function headError(head: string): string | null {
  const lines = head.split("\r\n");
  if (head.split("\n").length !== lines.length) return BARE_LF_TEXT;
  const request = REQUEST_LINE.exec(lines[0] as string);
  if (request === null) return `not an HTTP/1.x request line: ${quoted((lines[0] as string).slice(0, 80))}`;
  const verb = request[1] as string;
  if (!HTTP_VERBS.has(verb)) return `not an HTTP/1.x request line: unknown method ${quoted(verb.slice(0, 16))}`;
  if (lines.length - 1 > MAX_HEADERS) return `more than ${MAX_HEADERS} header lines`;
  let length = false;
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    const raw = colon < 0 ? "" : line.slice(colon + 1);
    if (colon < 0 || !TOKEN.test(name) || !VALUE.test(raw)) return `malformed header line ${quoted(line.slice(0, 80))}`;
    const lower = name.toLowerCase();
    const value = raw.replace(/^[ \t]+|[ \t]+$/g, "");
    if (lower === "content-length") {
      if (!/^[0-9]+$/.test(value)) return `bad Content-Length ${quoted(value.slice(0, 40))}`;
      if (length) return "duplicate Content-Length headers";
      length = true;
      if (BigInt(value) > MAX_CONTENT_LENGTH) return `bad Content-Length ${quoted(value.slice(0, 40))}: larger than 2**64 - 1`;
    } else if (lower === "transfer-encoding") {
      return TRANSFER_ENCODING_TEXT;
    }
  }
  return null;
}

/** The 400 text of a request with Transfer-Encoding, on both servers. */
export const TRANSFER_ENCODING_TEXT = "Transfer-Encoding is not supported: send Content-Length";

/**
 * Appended to a BAD_BODY_SIZE text when the refused body looks like JSON but was not declared
 * as JSON (`curl -d` sends form data): Python's `JSON_TYPE_HINT`.
 */
export const JSON_TYPE_HINT = "a JSON body needs Content-Type: application/json";

/**
 * The session's ERROR body, with `JSON_TYPE_HINT` when it refused the size of a body whose first
 * byte (`first`) is `{` or `[` (only called on a refusal of a body not declared as JSON).
 */
export function withJsonHint(error: Buffer, first: number | undefined): Buffer {
  if (first !== 0x7b && first !== 0x5b) return error;
  const parsed = parseError(error);
  if (parsed === null || parsed.code !== ErrorCode.BAD_BODY_SIZE) return error;
  return encodeError(parsed.code, `${parsed.text}; ${JSON_TYPE_HINT}`);
}

// -- JSON (curl) ---------------------------------------------------------------------------------

export function jsonable(value: unknown): unknown {
  if (typeof value === "number") {
    if (Number.isNaN(value)) return "nan";
    if (value === Infinity) return "inf";
    if (value === -Infinity) return "-inf";
    return value;
  }
  if (typeof value === "bigint") {
    return Number.isSafeInteger(Number(value)) ? Number(value) : value; // exact: stringifyJson
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

/**
 * The deepest nesting of arrays and objects a JSON request body may have (the outer value is
 * level 1); deeper is a 400 on both servers (Python: `JSON_MAX_DEPTH`, docs/protocol.md).
 */
export const JSON_MAX_DEPTH = 32;

/** The one text both servers give a JSON body nested deeper than `JSON_MAX_DEPTH`. */
export const JSON_TOO_DEEP = `nests deeper than ${JSON_MAX_DEPTH} arrays and objects`;

const JSON_NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
const JSON_SPACE = /[ \t\n\r]*/y;

/**
 * Parse a JSON request body as Python's `json.loads` reads it: an integer literal outside the
 * safe range becomes an exact `bigint` (JSON.parse would round a u64 seed or fingerprint), and
 * nesting deeper than `JSON_MAX_DEPTH` is an error. Strings and the rest are JSON.parse's.
 */
export function parseJsonBody(text: string): unknown {
  let at = 0;
  const fail = (what: string): never => {
    throw new SyntaxError(`${what} at position ${at}`);
  };
  const space = (): void => {
    JSON_SPACE.lastIndex = at;
    JSON_SPACE.exec(text);
    at = JSON_SPACE.lastIndex;
  };
  const value = (depth: number): unknown => {
    space();
    const c = text[at];
    if (c === "{" || c === "[") {
      if (depth > JSON_MAX_DEPTH) throw new SyntaxError(JSON_TOO_DEEP);
      at++;
      const close = c === "{" ? "}" : "]";
      const out: unknown[] = [];
      const obj: Record<string, unknown> = {};
      space();
      if (text[at] === close) {
        at++;
        return c === "{" ? obj : out;
      }
      for (;;) {
        if (c === "{") {
          space();
          if (text[at] !== '"') fail("expected a string key");
          const key = string();
          space();
          if (text[at] !== ":") fail("expected ':'");
          at++;
          Object.defineProperty(obj, key, { value: value(depth + 1), enumerable: true, writable: true, configurable: true });
        } else {
          out.push(value(depth + 1));
        }
        space();
        if (text[at] === ",") {
          at++;
          continue;
        }
        if (text[at] === close) {
          at++;
          return c === "{" ? obj : out;
        }
        fail(`expected ',' or '${close}'`);
      }
    }
    if (c === '"') return string();
    if (text.startsWith("true", at)) return (at += 4), true;
    if (text.startsWith("false", at)) return (at += 5), false;
    if (text.startsWith("null", at)) return (at += 4), null;
    JSON_NUMBER.lastIndex = at;
    const match = JSON_NUMBER.exec(text);
    if (match === null) return fail("unexpected character");
    at = JSON_NUMBER.lastIndex;
    const literal = match[0];
    const number = Number(literal);
    if (match[1] === undefined && match[2] === undefined && !Number.isSafeInteger(number)) return BigInt(literal);
    return number;
  };
  const string = (): string => {
    const start = at;
    at++;
    for (;;) {
      const quote = text.indexOf('"', at);
      if (quote < 0) fail("unterminated string");
      let slashes = 0;
      while (text[quote - 1 - slashes] === "\\") slashes++;
      at = quote + 1;
      if (slashes % 2 === 0) break;
    }
    return JSON.parse(text.slice(start, at)) as string; // escapes and control characters: JSON.parse's rules
  };
  const out = value(1);
  space();
  if (at !== text.length) fail("unexpected data after the JSON value");
  return out;
}

/**
 * JSON text of a `jsonable` value with bigints written as exact integer literals, as Python's
 * json.dumps writes its ints (JSON.stringify refuses bigints).
 */
export function stringifyJson(value: unknown): string {
  if (typeof value === "bigint") return value.toString();
  if (Array.isArray(value)) return `[${value.map(stringifyJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const parts = Object.entries(value).map(([key, item]) => `${JSON.stringify(key)}:${stringifyJson(item)}`);
    return `{${parts.join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}
