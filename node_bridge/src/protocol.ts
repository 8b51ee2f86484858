/**
 * The protocol layer shared by every backend: frame header, HELLO handshake, ERROR messages.
 *
 * The wire format is docs/protocol.md (seed 000 Appendix A plus HELLO and ERROR), declared once
 * in `schema/protocol.toml` (the protocol envelope): every constant here (error codes, which
 * close the connection, HTTP statuses and routes, auto-reset modes, message ids, the header,
 * HELLO and ERROR head sizes) comes from its generated module `./generated/protocol`. This
 * module mirrors transport/protocol.py function for function. Message ids are read from a
 * schema's `[messages]` by name (`messageIds(schema)`; every env schema has the envelope's), so
 * any such schema can ride the same client and server.
 */

import { decode as msgpackDecode, encode as msgpackEncode } from "@msgpack/msgpack";
import { type SchemaModule, loadSchema } from "./codec";
import { type SchemaJson, parseIrText } from "./ir";
import {
  BadFrameError,
  EnvError,
  NO_PROGRESS_TEXT,
  NoProgressError,
  FingerprintMismatchError,
  ProtocolError,
  RemoteError,
  VersionMismatchError,
} from "./errors";
import * as envelope from "./generated/protocol";

/** major << 8 | minor; peers with different majors refuse each other. */
export const PROTOCOL_VERSION = 0x0100;

/** Bytes of the frame header (`FrameHeader`: u8 msg_type 0, u32 msg_id 1, u32 body_len 5). */
export const HEADER_SIZE = envelope.FrameHeaderCodec.size;
/**
 * Buffers hold the header at 7..15 so that bodies start 16-byte aligned (zero-copy Float32Array
 * views need aligned data), as on the Python side.
 */
export const BODY_OFFSET = 16;
export const HEADER_OFFSET = BODY_OFFSET - HEADER_SIZE;
export const DEFAULT_MAX_BODY = 64 << 20;

export const HELLO_SIZE = envelope.HelloCodec.size;
export const ERROR_HEAD_SIZE = envelope.ErrorHeadCodec.size;
export const MAX_ERROR_TEXT = 0xffff;

/**
 * Who resets an env whose episode ended (docs/protocol.md, "Auto-reset"): HELLO_REQ flags bits
 * 0-1, echoed by HELLO_RESP and named in its info tail (`"autoreset": "next_step"`).
 *
 * DISABLED: the client sends a reset (a step on a done env is NOT_RESET).
 * NEXT_STEP: the next step of a done env ignores its action and resets it (gymnasium 1.x).
 * SAME_STEP: the step that ends an episode resets the env at once; the response carries the
 * reset result in place and the final result in a tail (SB3 VecEnv).
 */
export const AutoReset = envelope.AutoReset;
export type AutoReset = envelope.AutoReset;
export type AutoResetName = "disabled" | "next_step" | "same_step";

/** The HELLO flags bits that carry the auto-reset mode. */
export const AUTORESET_MASK = 0x3;
/** Size of the SAME_STEP tail's count and of each final's env index (u32 each). */
export const FINAL_COUNT_SIZE = 4;

const AUTORESET_NAMES: readonly AutoResetName[] = ["disabled", "next_step", "same_step"];

/** "disabled" | "next_step" | "same_step" (the HELLO_RESP info value). */
export function autoresetName(mode: AutoReset): AutoResetName {
  return AUTORESET_NAMES[mode] as AutoResetName;
}

/** Whether responses under `mode` carry final results (a shm region needs final areas). */
export function carriesFinals(mode: AutoReset): boolean {
  return mode === AutoReset.SAME_STEP;
}

/** Responses of one result per env (then OBSERVE_RESP's infos, STEP_BATCH_RESP's final tail). Python: `PER_ENV_RESPONSES`. */
export const PER_ENV_RESPONSES: ReadonlySet<string> = new Set(["RESET_RESP", "STEP_BATCH_RESP", "OBSERVE_RESP"]);
/** Responses whose results a final tail may follow (`readFinalTail`; `carriesFinals`). Python: `FINAL_TAIL_RESPONSES`. */
export const FINAL_TAIL_RESPONSES: ReadonlySet<string> = new Set(["STEP_RESP", "STEP_MULTI_RESP", "STEP_BATCH_RESP"]);

/** One final result of a tail: the env's index and where its result's bytes start. */
export interface FinalAt {
  index: number;
  at: number;
}

/**
 * A SAME_STEP step response's final tail after `resultsLength` bytes of results: u32 k, then
 * k x (u32 env index, final result); at most `most` of them. Python: `read_final_tail`.
 */
export function readFinalTail(body: Uint8Array, resultsLength: number, size: number, most: number): FinalAt[] {
  if (body.byteLength < resultsLength + FINAL_COUNT_SIZE) {
    throw new ProtocolError(`step response of ${body.byteLength} bytes lacks its final tail`);
  }
  const count = readU32(body, resultsLength);
  if (count > most || body.byteLength !== resultsLength + FINAL_COUNT_SIZE + count * (FINAL_COUNT_SIZE + size)) {
    throw new ProtocolError(`final tail says ${count} results; body is ${body.byteLength} bytes`);
  }
  const finals: FinalAt[] = [];
  for (let k = 0; k < count; k++) {
    const start = resultsLength + FINAL_COUNT_SIZE + k * (FINAL_COUNT_SIZE + size);
    finals.push({ index: readU32(body, start), at: start + FINAL_COUNT_SIZE });
  }
  return finals;
}

/** A RECV_RESP cut at its tail: `count` results, then `[env ids, ended env ids, their final results' bytes]`. */
export interface RecvTail {
  count: number;
  envIds: number[];
  ended: number[];
  finals: Uint8Array;
}

/**
 * Where a RECV_RESP's tail starts: the one count <= `most` whose msgpack parses to exactly the
 * rest of the body with that many env ids (results are fixed size; the tail is not). Python:
 * `split_recv_tail`.
 */
export function splitRecvTail(body: Uint8Array, size: number, most: number): RecvTail {
  for (let count = 0; count <= most && count * size < body.byteLength; count++) {
    const at = count * size;
    if (body[at] !== 0x93) continue; // a fixarray of 3
    let tail: unknown;
    try {
      tail = msgpackDecode(body.subarray(at));
    } catch {
      continue; // not the tail: the bytes of a result
    }
    if (!Array.isArray(tail) || tail.length !== 3) continue;
    const [envIds, ended, finals] = tail as unknown[];
    if (
      Array.isArray(envIds) &&
      envIds.length === count &&
      Array.isArray(ended) &&
      finals instanceof Uint8Array &&
      finals.byteLength === ended.length * size
    ) {
      return { count, envIds: envIds.map(Number), ended: ended.map(Number), finals };
    }
  }
  throw new ProtocolError(`RECV_RESP of ${body.byteLength} bytes has no [env ids, ended, finals] tail`);
}

/** A mode from its name (any case) or number; throws a TypeError for anything else. */
export function toAutoReset(mode: AutoReset | AutoResetName | string | number): AutoReset {
  const index =
    typeof mode === "number" ? mode : AUTORESET_NAMES.indexOf(mode.toLowerCase() as AutoResetName);
  if (!Number.isInteger(index) || index < 0 || index >= AUTORESET_NAMES.length) {
    throw new TypeError(
      `unknown auto-reset mode ${JSON.stringify(mode)} (choose from ${AUTORESET_NAMES.join(", ")})`,
    );
  }
  return index as AutoReset;
}

/** ERROR message codes (docs/protocol.md). */
export const ErrorCode = envelope.ErrorCode;
export type ErrorCode = envelope.ErrorCode;

/** A shm slot's command word (docs/shm.md): STEP 0 .. STEP_MULTI 5. */
export const SlotCommand = envelope.SlotCommand;
export type SlotCommand = envelope.SlotCommand;

/** A shm region's state word: CREATING 0, READY 1 (written last), CLOSED 2. */
export const RegionState = envelope.RegionState;
export type RegionState = envelope.RegionState;

const ERROR_NAMES: ReadonlyMap<number, string> = new Map(
  Object.entries(ErrorCode).map(([name, code]) => [code, name]),
);

/** The name of an error code (`"INVALID_ACTION"`), `"UNKNOWN"` for a code we do not know. */
export function errorName(code: number): string {
  return ERROR_NAMES.get(code) ?? "UNKNOWN";
}

type ErrorName = keyof typeof envelope.ERRORS;
type ErrorSpec = { readonly http: number; readonly closes: boolean };
const ERROR_SPECS = Object.entries(envelope.ERRORS) as [ErrorName, ErrorSpec][];

/** After these the server closes the connection: the stream or the peer cannot be trusted. */
export const CLOSING_ERRORS: ReadonlySet<number> = new Set<number>(
  ERROR_SPECS.filter(([, spec]) => spec.closes).map(([name]) => ErrorCode[name]),
);

/** The HTTP status of each ERROR code (a 405 for a non-POST request carries UNKNOWN_MESSAGE). */
export const HTTP_STATUS: Readonly<Record<number, number>> = Object.fromEntries(
  ERROR_SPECS.map(([name, spec]) => [ErrorCode[name], spec.http]),
);

/** `POST /v1/<method>` -> the name of the request message it carries. */
export const HTTP_ROUTES: Readonly<Record<string, string>> = envelope.HTTP_ROUTES;

type MessageName = keyof typeof envelope.MessageId;
const MESSAGE_NAMES = Object.keys(envelope.MessageId) as MessageName[];

/** The message ids this protocol uses, by name (Python's `MessageIds`). */
export type MessageIds = { readonly [K in MessageName]: number };

/** The protocol's message ids read from a schema's `[messages]` by name. */
export function messageIds(schema: SchemaModule): MessageIds {
  const missing = MESSAGE_NAMES.filter((name) => !(name in schema.messages));
  if (missing.length) {
    throw new ProtocolError(
      `schema ${schema.name} lacks the protocol messages ${missing.join(", ")}`,
    );
  }
  const ids: Record<string, number> = {};
  for (const name of MESSAGE_NAMES) ids[name] = (schema.messages[name] as { id: number }).id;
  return Object.freeze(ids) as MessageIds;
}

/** The envelope's message ids: the same in every env schema. */
export const MESSAGE_IDS: MessageIds = messageIds(envelope.SCHEMA);

/** A decoded HELLO_REQ / HELLO_RESP: version, flags, fingerprint and the server's info. */
export interface Hello {
  readonly version: number;
  readonly flags: number;
  readonly fingerprint: bigint;
  readonly info: Record<string, unknown>;
}

/** A parsed frame header. */
export interface FrameHeader {
  msgType: number;
  msgId: number;
  bodyLen: number;
}

/** Write a frame header at `offset`. */
export function packHeader(
  buf: Uint8Array,
  offset: number,
  msgType: number,
  msgId: number,
  bodyLen: number,
): void {
  buf[offset] = msgType;
  writeU32(buf, offset + 1, msgId);
  writeU32(buf, offset + 5, bodyLen);
}

/** (msg_type, msg_id, body_len); a body_len over `maxBody` is refused before any read. */
export function parseHeader(buf: Uint8Array, offset: number, maxBody: number): FrameHeader {
  const msgType = buf[offset] as number;
  const msgId = readU32(buf, offset + 1);
  const bodyLen = readU32(buf, offset + 5);
  if (bodyLen > maxBody) {
    const error = new BadFrameError(`body_len ${bodyLen} exceeds the maximum ${maxBody}`);
    error.msgId = msgId;
    throw error;
  }
  return { msgType, msgId, bodyLen };
}

export function readU32(buf: Uint8Array, at: number): number {
  return (
    ((buf[at] as number) |
      ((buf[at + 1] as number) << 8) |
      ((buf[at + 2] as number) << 16) |
      ((buf[at + 3] as number) << 24)) >>>
    0
  );
}

export function writeU32(buf: Uint8Array, at: number, value: number): void {
  buf[at] = value & 0xff;
  buf[at + 1] = (value >>> 8) & 0xff;
  buf[at + 2] = (value >>> 16) & 0xff;
  buf[at + 3] = (value >>> 24) & 0xff;
}

function u64Hex(value: bigint): string {
  return BigInt.asUintN(64, value).toString(16).padStart(16, "0");
}

/** 16 hex digits of a u64 fingerprint, as `transport-schema inspect --json` shows it. */
export function fingerprintHex16(value: bigint): string {
  return u64Hex(value);
}

/**
 * HELLO_REQ flags bit 15: the client is leaving. A zmq server (which is not told when a peer
 * goes) ends that client's session and closes its envs, and answers nothing; the other
 * backends end a session when its connection ends (docs/protocol.md "Goodbye").
 */
export const GOODBYE_FLAG = 0x8000;

/** The HELLO_REQ body a zmq client sends as it closes (its fingerprint is not checked). */
export function encodeGoodbye(): Buffer {
  return encodeHello(0n, undefined, GOODBYE_FLAG);
}

/** Whether a HELLO_REQ body says goodbye (`GOODBYE_FLAG`). */
export function isGoodbye(body: Uint8Array): boolean {
  return body.byteLength >= HELLO_SIZE && ((body[3] as number) & (GOODBYE_FLAG >> 8)) !== 0;
}

/** The HELLO body: `Hello {u16 version, u16 flags, u64 fingerprint}`, then the msgpack info. */
export function encodeHello(
  fingerprint: bigint,
  info?: Record<string, unknown>,
  flags = 0,
): Buffer {
  const tail = info === undefined ? null : msgpackEncode(info);
  const out = Buffer.alloc(HELLO_SIZE + (tail ? tail.byteLength : 0));
  out.writeUInt16LE(PROTOCOL_VERSION, 0);
  out.writeUInt16LE(flags, 2);
  out.writeBigUInt64LE(BigInt.asUintN(64, fingerprint), 4);
  if (tail) out.set(tail, HELLO_SIZE);
  return out;
}

/**
 * The msgpack family of a value from its first byte, as a HELLO refusal names it (Python:
 * `msgpack_kind`, from the decoded value): nil, bool, int, float, str, bin, array, map or ext.
 */
export function msgpackKind(first: number): string {
  const b = first;
  if (b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3)) return "int";
  if (b <= 0x8f || b === 0xde || b === 0xdf) return "map";
  if (b <= 0x9f || b === 0xdc || b === 0xdd) return "array";
  if (b <= 0xbf || (b >= 0xd9 && b <= 0xdb)) return "str";
  if (b === 0xc0) return "nil";
  if (b === 0xc2 || b === 0xc3) return "bool";
  if (b >= 0xc4 && b <= 0xc6) return "bin";
  if (b === 0xca || b === 0xcb) return "float";
  return "ext";
}

/** The deepest nesting of maps and arrays a HELLO tail may have (the tail map itself is 1). */
export const HELLO_TAIL_MAX_DEPTH = 32;

const STRICT_UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * A HELLO msgpack tail, by the rules Python's `decode_hello` applies (docs/decisions.md): one
 * map and nothing after it; string keys (at every depth), each once per map; strict UTF-8;
 * nil, bool, int, float, str, bin, array, map only (no ext); at most HELLO_TAIL_MAX_DEPTH
 * levels. `@msgpack/msgpack` accepts integer keys and replaces bad UTF-8, so this reads it.
 */
export function decodeHelloTail(tail: Uint8Array): Record<string, unknown> {
  const dv = new DataView(tail.buffer, tail.byteOffset, tail.byteLength);
  let at = 0;
  let refusal: string | null = null; // ext or too deep: refused after the shape, as in Python
  const truncated = (): never => {
    throw new BadFrameError("HELLO tail is not one msgpack value: truncated");
  };
  const take = (n: number): number => {
    if (at + n > tail.byteLength) truncated();
    const start = at;
    at += n;
    return start;
  };
  const str = (n: number): string => {
    const start = take(n);
    try {
      return STRICT_UTF8.decode(tail.subarray(start, start + n));
    } catch (error) {
      throw new BadFrameError(`HELLO tail has a string that is not UTF-8: ${(error as Error).message}`);
    }
  };
  const u64 = (start: number, signed: boolean): number | bigint => {
    const big = signed ? dv.getBigInt64(start) : dv.getBigUint64(start);
    return Number.isSafeInteger(Number(big)) ? Number(big) : big;
  };
  const container = (depth: number): void => {
    if (depth > HELLO_TAIL_MAX_DEPTH) {
      // stop here (no unbounded recursion); Python refuses the same tail with the same code
      throw new BadFrameError(`HELLO tail nests deeper than ${HELLO_TAIL_MAX_DEPTH} maps and arrays`);
    }
  };
  const array = (n: number, depth: number): unknown[] => {
    container(depth);
    const out: unknown[] = [];
    for (let i = 0; i < n; i++) out.push(value(depth + 1));
    return out;
  };
  const map = (n: number, depth: number): Record<string, unknown> => {
    container(depth);
    const out: Record<string, unknown> = {};
    for (let i = 0; i < n; i++) {
      const keyAt = at;
      const key = value(depth + 1);
      if (typeof key !== "string") {
        const kind = msgpackKind(tail[keyAt] as number);
        const shown = kind === "int" ? String(key) : `of type ${kind}`;
        throw new BadFrameError(`HELLO tail has a map key ${shown}: every key must be a string`);
      }
      if (Object.prototype.hasOwnProperty.call(out, key)) {
        throw new BadFrameError(`HELLO tail has the map key ${JSON.stringify(key)} twice`);
      }
      Object.defineProperty(out, key, { value: value(depth + 1), enumerable: true, writable: true, configurable: true });
    }
    return out;
  };
  const ext = (n: number): null => {
    take(1 + n);
    refusal ??= "HELLO tail holds an ext type (msgpack ext types are refused)";
    return null;
  };
  const value = (depth: number): unknown => {
    const b = dv.getUint8(take(1));
    if (b <= 0x7f) return b;
    if (b >= 0xe0) return b - 0x100;
    if ((b & 0xf0) === 0x80) return map(b & 0x0f, depth);
    if ((b & 0xf0) === 0x90) return array(b & 0x0f, depth);
    if ((b & 0xe0) === 0xa0) return str(b & 0x1f);
    switch (b) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: { const n = dv.getUint8(take(1)); return Uint8Array.from(tail.subarray(take(n), at)); }
      case 0xc5: { const n = dv.getUint16(take(2)); return Uint8Array.from(tail.subarray(take(n), at)); }
      case 0xc6: { const n = dv.getUint32(take(4)); return Uint8Array.from(tail.subarray(take(n), at)); }
      case 0xc7: return ext(dv.getUint8(take(1)));
      case 0xc8: return ext(dv.getUint16(take(2)));
      case 0xc9: return ext(dv.getUint32(take(4)));
      case 0xca: return dv.getFloat32(take(4));
      case 0xcb: return dv.getFloat64(take(8));
      case 0xcc: return dv.getUint8(take(1));
      case 0xcd: return dv.getUint16(take(2));
      case 0xce: return dv.getUint32(take(4));
      case 0xcf: return u64(take(8), false);
      case 0xd0: return dv.getInt8(take(1));
      case 0xd1: return dv.getInt16(take(2));
      case 0xd2: return dv.getInt32(take(4));
      case 0xd3: return u64(take(8), true);
      case 0xd4: return ext(1);
      case 0xd5: return ext(2);
      case 0xd6: return ext(4);
      case 0xd7: return ext(8);
      case 0xd8: return ext(16);
      case 0xd9: return str(dv.getUint8(take(1)));
      case 0xda: return str(dv.getUint16(take(2)));
      case 0xdb: return str(dv.getUint32(take(4)));
      case 0xdc: return array(dv.getUint16(take(2)), depth);
      case 0xdd: return array(dv.getUint32(take(4)), depth);
      case 0xde: return map(dv.getUint16(take(2)), depth);
      case 0xdf: return map(dv.getUint32(take(4)), depth);
      default:
        throw new BadFrameError(`HELLO tail is not one msgpack value: byte 0x${b.toString(16)} at ${at - 1}`);
    }
  };
  const decoded = value(1);
  if (at !== tail.byteLength) {
    throw new BadFrameError(`HELLO tail is not one msgpack value: ${tail.byteLength - at} byte(s) after it`);
  }
  const kind = msgpackKind(tail[0] as number);
  if (kind !== "map") throw new BadFrameError(`HELLO tail is a msgpack ${kind}, expected a map`);
  if (refusal !== null) throw new BadFrameError(refusal);
  return decoded as Record<string, unknown>;
}

export function decodeHello(body: Uint8Array): Hello {
  if (body.byteLength < HELLO_SIZE) {
    throw new BadFrameError(
      `HELLO body is ${body.byteLength} bytes, expected at least ${HELLO_SIZE}`,
    );
  }
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const version = dv.getUint16(0, true);
  const flags = dv.getUint16(2, true);
  const fingerprint = dv.getBigUint64(4, true);
  let info: Record<string, unknown> = {};
  if (body.byteLength > HELLO_SIZE) info = decodeHelloTail(body.subarray(HELLO_SIZE));
  return { version, flags, fingerprint, info };
}

// -- schema discovery (docs/client.md "Connecting without a schema file"; Python: protocol.py) --
// HELLO_REQ tail: "schema_name" (the client's schema, named in a mismatch) or "discover": true
// with fingerprint 0 (no schema). HELLO_RESP tail: "schema_name" (the server's) and, answering
// a discovery, "schema_ir": the compiled IR as JSON text.
export const SCHEMA_NAME_KEY = "schema_name";
export const DISCOVER_KEY = "discover";
export const SCHEMA_IR_KEY = "schema_ir";
/** The fingerprint a discovering HELLO_REQ carries (with `discover: true` in its tail). */
export const DISCOVER_FINGERPRINT = 0n;

/** A HELLO_REQ from a client without a schema: fingerprint 0 and `discover: true`. */
export function isDiscovery(hello: Hello): boolean {
  return hello.fingerprint === DISCOVER_FINGERPRINT && hello.info[DISCOVER_KEY] === true;
}

/** A client's HELLO_REQ: pinned to `schema` (fingerprint and name), or a discovery request. */
export function encodeHelloRequest(schema: SchemaModule | null, autoreset = 0): Buffer {
  if (schema === null) return encodeHello(DISCOVER_FINGERPRINT, { [DISCOVER_KEY]: true }, autoreset);
  return encodeHello(schema.fingerprint, { [SCHEMA_NAME_KEY]: schema.name }, autoreset);
}

const irTexts = new WeakMap<SchemaModule, string>();

/** The compiled IR of `schema` as JSON text (what a discovering client loads). */
export function schemaIrText(schema: SchemaModule): string {
  let text = irTexts.get(schema);
  if (text === undefined) {
    text = JSON.stringify(schema.ir);
    irTexts.set(schema, text);
  }
  return text;
}

/** A server's HELLO_RESP tail: `info`, its schema's name, and its IR when `hello` discovers. */
export function helloResponseInfo(
  schema: SchemaModule,
  hello: Hello | null,
  info: Record<string, unknown>,
): Record<string, unknown> {
  const tail: Record<string, unknown> = { ...info, [SCHEMA_NAME_KEY]: schema.name };
  if (hello !== null && isDiscovery(hello)) tail[SCHEMA_IR_KEY] = schemaIrText(schema);
  return tail;
}

/** The schema of a discovered IR (JSON text), refused unless it hashes to `announced` (the
 * fingerprint the peer announced in its HELLO head or control block). Python: schema_from_ir_text. */
export function schemaFromIrText(text: unknown, announced: bigint, peer: string): SchemaModule {
  if (typeof text !== "string") throw new ProtocolError(`${peer} sent no schema IR (${SCHEMA_IR_KEY} is not a string)`);
  let schema: SchemaModule;
  try {
    schema = loadSchema(parseIrText(text) as SchemaJson);
  } catch (error) {
    throw new ProtocolError(`${peer} sent a schema IR that does not load: ${(error as Error).message}`);
  }
  if (schema.fingerprint !== BigInt.asUintN(64, announced)) {
    throw new FingerprintMismatchError(
      `${peer} announced fingerprint ${u64Hex(announced)} but its schema ${schema.name} hashes to ${u64Hex(schema.fingerprint)}`,
      schema.fingerprint,
      announced,
    );
  }
  return schema;
}

/** A fingerprint mismatch naming both schemas (name and fingerprint of each side). */
export function mismatchText(serverName: string, serverFp: bigint, clientName: string, clientFp: bigint): string {
  return (
    `the server serves ${serverName || "an unnamed schema"} (fp ${u64Hex(serverFp)}), ` +
    `this client was built for ${clientName || "an unnamed schema"} (fp ${u64Hex(clientFp)})`
  );
}

/** Refuse a peer whose major version or schema fingerprint differs (both sides call it). */
export function checkHello(hello: Hello, fingerprint: bigint, peer: string): void {
  if (hello.version >> 8 !== PROTOCOL_VERSION >> 8) {
    throw new VersionMismatchError(
      `protocol version mismatch: ${peer} speaks ${hello.version >> 8}.${hello.version & 255},` +
        ` this side ${PROTOCOL_VERSION >> 8}.${PROTOCOL_VERSION & 255}`,
    );
  }
  if (hello.fingerprint !== BigInt.asUintN(64, fingerprint)) {
    throw new FingerprintMismatchError(
      `schema fingerprint mismatch: ${peer} has ${u64Hex(hello.fingerprint)}, ` +
        `this side has ${u64Hex(fingerprint)}`,
      fingerprint,
      hello.fingerprint,
    );
  }
}

/** The ERROR body: `ErrorHead {u16 code, u16 text_len}` + UTF-8 text (cut at 65535 bytes). */
export function encodeError(code: number, text: string): Buffer {
  let raw = Buffer.from(text, "utf8");
  if (raw.byteLength > MAX_ERROR_TEXT) {
    // never cut a character in half: drop a trailing partial sequence
    let end = MAX_ERROR_TEXT;
    while (end > 0 && ((raw[end] as number) & 0xc0) === 0x80) end--;
    raw = raw.subarray(0, end);
  }
  const out = Buffer.allocUnsafe(ERROR_HEAD_SIZE + raw.byteLength);
  out.writeUInt16LE(code, 0);
  out.writeUInt16LE(raw.byteLength, 2);
  out.set(raw, ERROR_HEAD_SIZE);
  return out;
}

/** An ERROR body's code and text, or null when the body is not a well-formed ERROR. */
export function parseError(body: Uint8Array): { code: number; text: string } | null {
  if (body.byteLength < ERROR_HEAD_SIZE) return null;
  const code = (body[0] as number) | ((body[1] as number) << 8);
  const textLen = (body[2] as number) | ((body[3] as number) << 8);
  if (body.byteLength !== ERROR_HEAD_SIZE + textLen) return null;
  const text = Buffer.from(body.buffer, body.byteOffset + ERROR_HEAD_SIZE, textLen).toString(
    "utf8",
  );
  return { code, text };
}

/** The typed error an ERROR body stands for (`errorFromCode` of its code and text). */
export function decodeError(body: Uint8Array): RemoteError | ProtocolError {
  if (body.byteLength < ERROR_HEAD_SIZE) {
    return new BadFrameError(`ERROR body is ${body.byteLength} bytes, shorter than its head`);
  }
  const textLen = (body[2] as number) | ((body[3] as number) << 8);
  const parsed = parseError(body);
  if (parsed === null) {
    return new BadFrameError(
      `ERROR body is ${body.byteLength} bytes, its head says ${ERROR_HEAD_SIZE + textLen}`,
    );
  }
  return errorFromCode(parsed.code, parsed.text);
}

/**
 * The typed error of a protocol error code and its text: the one mapping every client uses (a
 * stream ERROR body, an HTTP refusal, a shm slot's status and error text). Mismatches keep their
 * own types. Python: `error_from_code` (which also gives ENV_ERROR its own `EnvError` type).
 */
export function errorFromCode(code: number, text: string): RemoteError | ProtocolError {
  if (code === ErrorCode.FINGERPRINT_MISMATCH) {
    return new FingerprintMismatchError(`server refused the session: ${text}`);
  }
  if (code === ErrorCode.VERSION_MISMATCH) {
    return new VersionMismatchError(`server refused the session: ${text}`);
  }
  if (code === ErrorCode.ENV_ERROR) {
    const stalled = NO_PROGRESS_TEXT.exec(text); // the runtime's watchdog (decision-boundary runs)
    if (stalled !== null) {
      const state = JSON.parse(stalled[3] as string) as Record<string, unknown>;
      return new NoProgressError(code, errorName(code), text, [Number(stalled[1]), Number(stalled[2])], state);
    }
    return new EnvError(code, errorName(code), text);
  }
  return new RemoteError(code, errorName(code), text);
}

/** An auto-reset mode from a HELLO (flags bits or the shm slot word); BAD_FRAME `text` otherwise. */
export function checkAutoreset(mode: number, text: () => string): AutoReset {
  if (mode !== AutoReset.DISABLED && mode !== AutoReset.NEXT_STEP && mode !== AutoReset.SAME_STEP) {
    throw new RequestError(ErrorCode.BAD_FRAME, text());
  }
  return mode;
}

/**
 * A server's reading of a HELLO_REQ body: the hello and the auto-reset mode it asks for, or a
 * `RequestError` to answer (BAD_FRAME, VERSION_MISMATCH, FINGERPRINT_MISMATCH). Every server, and
 * the shm channel that answers for its region, decides the same way (Python: `accept_hello`).
 */
export function acceptHello(body: Uint8Array, schema: SchemaModule | bigint): { hello: Hello; mode: AutoReset } {
  const fingerprint = typeof schema === "bigint" ? schema : schema.fingerprint;
  let hello: Hello | undefined;
  try {
    hello = decodeHello(body);
    checkHello(hello, isDiscovery(hello) ? DISCOVER_FINGERPRINT : fingerprint, "client");
  } catch (error) {
    if (error instanceof FingerprintMismatchError) {
      let text = error.message;
      if (typeof schema !== "bigint" && hello !== undefined) {
        const clientName = hello.info[SCHEMA_NAME_KEY];
        text = mismatchText(schema.name, fingerprint, typeof clientName === "string" ? clientName : "", hello.fingerprint);
      }
      throw new RequestError(ErrorCode.FINGERPRINT_MISMATCH, text);
    }
    if (error instanceof VersionMismatchError) throw new RequestError(ErrorCode.VERSION_MISMATCH, error.message);
    if (error instanceof ProtocolError) throw new RequestError(ErrorCode.BAD_FRAME, error.message);
    throw error;
  }
  return { hello, mode: helloMode(hello.flags) };
}

/**
 * The auto-reset mode of a HELLO_REQ's `flags`, or the BAD_FRAME to answer: only bits 0-1 (the
 * mode: 0, 1 or 2) are defined; the goodbye bit is zmq's alone (its server reads it before a HELLO
 * gets here); any other bit is refused (Python: `hello_mode`, the same words).
 */
export function helloMode(flags: number): AutoReset {
  const hex = (value: number): string => `0x${value.toString(16).toUpperCase().padStart(4, "0")}`;
  const head = `HELLO flags ${hex(flags)}: `;
  if (flags & GOODBYE_FLAG) {
    throw new RequestError(
      ErrorCode.BAD_FRAME,
      head + "the goodbye bit (0x8000) ends a zmq session only; close the connection instead",
    );
  }
  const unknown = flags & ~AUTORESET_MASK;
  if (unknown) {
    throw new RequestError(
      ErrorCode.BAD_FRAME,
      head + `unknown bits ${hex(unknown)} (only bits 0-1, the auto-reset mode, are defined)`,
    );
  }
  const mode = flags & AUTORESET_MASK;
  return checkAutoreset(mode, () => head + `no auto-reset mode ${mode} (0 disabled, 1 next_step, 2 same_step)`);
}

/** Thrown inside a server's dispatcher: becomes one ERROR response (never leaves the server). */
export class RequestError extends Error {
  readonly code: ErrorCode;
  readonly text: string;

  constructor(code: ErrorCode, text: string) {
    super(`${errorName(code)}: ${text}`);
    this.code = code;
    this.text = text;
  }
}

// -- the JSON hello (HTTP, docs/protocol.md "JSON hello") --------------------------------------

/**
 * The keys of a JSON hello request: the answer's (`protocol_version`, `flags`, `fingerprint`,
 * `info`: the msgpack tail) and the tail's two request keys at the top level.
 */
export const JSON_HELLO_KEYS = ["protocol_version", "flags", "fingerprint", "info", SCHEMA_NAME_KEY, DISCOVER_KEY] as const;

/** A JSON number that is a whole number in 0..top; an Error otherwise (Python: the same words). */
function jsonWhole(value: unknown, what: string, top: bigint): bigint {
  const whole =
    typeof value === "bigint" ? value : typeof value === "number" && Number.isInteger(value) ? BigInt(value) : null;
  if (whole === null || whole < 0n || whole > top) throw new Error(`${what} must be a whole number in 0..${top}`);
  return whole;
}

/**
 * The HELLO_REQ body a JSON hello request stands for: the shape the JSON HELLO_RESP has
 * (`protocol_version` as `"1.0"` or `major << 8 | minor`; `fingerprint` as 16 hex digits or an
 * integer; `flags`; `info`: the tail map), plus `schema_name` and `discover` accepted at the top
 * level (Python: `hello_from_json`, the same words).
 */
export function helloFromJson(value: unknown): Buffer {
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error("expected a JSON object of Hello fields");
  }
  const fields = value as Record<string, unknown>;
  for (const key of Object.keys(fields)) {
    if (!(JSON_HELLO_KEYS as readonly string[]).includes(key)) {
      throw new Error(`unknown key ${JSON.stringify(key)} (a hello takes ${JSON_HELLO_KEYS.join(", ")})`);
    }
  }
  const has = (key: string): boolean => Object.prototype.hasOwnProperty.call(fields, key);
  let version: unknown = has("protocol_version") ? fields.protocol_version : PROTOCOL_VERSION;
  if (typeof version === "string") {
    const match = /^([0-9]{1,3})\.([0-9]{1,3})$/.exec(version);
    if (match === null || Number(match[1]) > 255 || Number(match[2]) > 255) {
      throw new Error('protocol_version must be "major.minor" (such as "1.0") or a number');
    }
    version = (Number(match[1]) << 8) | Number(match[2]);
  }
  const major = Number(jsonWhole(version, "protocol_version", 0xffffn));
  const flags = Number(jsonWhole(has("flags") ? fields.flags : 0, "flags", 0xffffn));
  if (!has("fingerprint")) throw new Error("no fingerprint given (16 hex digits, or 0 with discover: true)");
  let fingerprint: unknown = fields.fingerprint;
  if (typeof fingerprint === "string") {
    if (!/^[0-9a-fA-F]{16}$/.test(fingerprint)) throw new Error("fingerprint must be 16 hex digits or a number");
    fingerprint = BigInt(`0x${fingerprint}`);
  }
  const fp = jsonWhole(fingerprint, "fingerprint", (1n << 64n) - 1n);
  const given = has("info") ? fields.info : {};
  if (given === null || typeof given !== "object" || Array.isArray(given)) {
    throw new Error("info must be a JSON object (the HELLO tail)");
  }
  const info: Record<string, unknown> = { ...(given as Record<string, unknown>) };
  for (const key of [SCHEMA_NAME_KEY, DISCOVER_KEY]) if (has(key)) info[key] = fields[key];
  const body = encodeHello(fp, Object.keys(info).length ? info : undefined, flags);
  body.writeUInt16LE(major, 0);
  return body;
}
