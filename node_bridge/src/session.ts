/**
 * Serving envs: the request handling every Node backend's server shares (transport/server.py).
 *
 * A backend accepts connections and moves frames; for each connection it makes a `Session` and
 * calls `handle(msgType, buf, offset, length)`, which answers into one preallocated response
 * buffer: the header at HEADER_OFFSET (7..15) and the body at BODY_OFFSET (16), so a stream
 * backend writes `frame()` in one call. Step results are encoded straight into that buffer at
 * `BODY_OFFSET + i * size` (the StepResult codec's `encodeInto`): a steady-state step allocates
 * no result bytes. The checks, their order and their error codes are Python's: HELLO first,
 * then per message the body size, the batch size, and per env "reset first", "done: reset
 * first", the action range and the action mask, all before any env steps.
 */

import type { AnyStructCodec, SchemaModule } from "./codec";
import type { Env, EnvFactory, Spaces } from "./env";
import { CodecError, ProtocolError, TransportError } from "./errors";
import * as pac_env from "./generated/pac_env";
import type { FieldJson } from "./ir";
import {
  BODY_OFFSET,
  CLOSING_ERRORS,
  ErrorCode,
  HEADER_OFFSET,
  type MessageIds,
  RequestError,
  checkHello,
  decodeHello,
  encodeError,
  encodeHello,
  messageIds,
  packHeader,
} from "./protocol";
import { FingerprintMismatchError, VersionMismatchError } from "./errors";

/** Options every session of one server shares. */
export interface SessionOptions {
  /** The schema the server speaks (default: the reference pac_env). */
  readonly schema?: SchemaModule;
  /** The env name the HELLO_RESP info carries. */
  readonly envName?: string;
  /** The seed of each connection's first unseeded reset (env i gets seed + i). */
  readonly seed?: bigint | number | null;
  /** "node" (the HELLO_RESP info's `server`). */
  readonly serverLang?: string;
}

type AnyEnv = Env<unknown>;

function bodyCodec(schema: SchemaModule, message: string): AnyStructCodec {
  const body = schema.messages[message]?.body;
  if (body === undefined || body === null) {
    throw new ProtocolError(`message ${message} of schema ${schema.name} has no body struct`);
  }
  const codec = schema.structs[body];
  if (codec === undefined) throw new ProtocolError(`schema ${schema.name} has no struct ${body}`);
  return codec;
}

function fieldWithRole(schema: SchemaModule, struct: string, ...roles: string[]): FieldJson | null {
  const fields = schema.ir.structs[struct]?.fields ?? [];
  for (const role of roles) {
    const field = fields.find((f) => f.role === role);
    if (field) return field;
  }
  return null;
}

function firstField(schema: SchemaModule, struct: string, index = 0): FieldJson {
  const field = schema.ir.structs[struct]?.fields[index];
  if (field === undefined) throw new ProtocolError(`struct ${struct} has no field ${index}`);
  return field;
}

function elementType(field: FieldJson): string {
  const bracket = field.type.indexOf("[");
  return bracket < 0 ? field.type : field.type.slice(0, bracket);
}

type Reader = (dv: DataView, at: number) => number;

const READERS: Readonly<Record<string, Reader>> = {
  u8: (dv, at) => dv.getUint8(at),
  bool: (dv, at) => dv.getUint8(at),
  i8: (dv, at) => dv.getInt8(at),
  u16: (dv, at) => dv.getUint16(at, true),
  i16: (dv, at) => dv.getInt16(at, true),
  u32: (dv, at) => dv.getUint32(at, true),
  i32: (dv, at) => dv.getInt32(at, true),
  f32: (dv, at) => dv.getFloat32(at, true),
  f64: (dv, at) => dv.getFloat64(at, true),
  u64: (dv, at) => Number(dv.getBigUint64(at, true)),
  i64: (dv, at) => Number(dv.getBigInt64(at, true)),
};

function readerOf(field: FieldJson): { read: Reader; size: number } {
  const type = elementType(field);
  const read = READERS[type];
  if (read === undefined) throw new ProtocolError(`field ${field.name} has non-scalar type ${type}`);
  return { read, size: field.size / field.count };
}

function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

/** One client's conversation with a server: HELLO, then requests answered in place. */
export class Session {
  readonly schema: SchemaModule;
  readonly ids: MessageIds;
  readonly envs: readonly AnyEnv[];
  readonly numEnvs: number;
  readonly spaces: Spaces;
  readonly info: Record<string, unknown>;
  readonly firstSeed: bigint | null;
  helloDone = false;
  /** Set when the connection must be closed after sending the current response. */
  closing = false;
  /** The response buffer: header at 7..15, body at 16. Replaced by `detachBuffer()`. */
  buffer: Buffer;
  /** Length of the current response body (at BODY_OFFSET). */
  bodyLength = 0;

  readonly #result: AnyStructCodec;
  readonly #resultSize: number;
  readonly #actionAt: number;
  readonly #stepRequestSize: number;
  readonly #multiSize: number;
  readonly #multiAt: number;
  readonly #seedAt: number;
  readonly #seedSize: number;
  readonly #spacesCodec: AnyStructCodec;
  readonly #spacesNames: readonly [string, string];
  readonly #mask: { at: number; read: Reader; size: number; count: number } | null;
  readonly #done: { at: number; read: Reader } | null;
  readonly #masks: Uint8Array;
  readonly #isDone: Uint8Array;
  readonly #wasReset: Uint8Array;
  readonly #actions: Int32Array;
  readonly #hello: Buffer;
  #frames = new Map<number, Buffer>();
  #bodies = new Map<number, Buffer>();
  #dv: DataView;

  constructor(envs: readonly AnyEnv[], options: SessionOptions = {}) {
    if (envs.length < 1) throw new TransportError("a session needs at least one env");
    const schema = options.schema ?? pac_env.SCHEMA;
    this.schema = schema;
    this.ids = messageIds(schema);
    this.envs = envs;
    this.numEnvs = envs.length;
    const seed = options.seed;
    this.firstSeed = seed === undefined || seed === null ? null : BigInt(seed);
    this.info = {
      num_envs: this.numEnvs,
      env: options.envName ?? "",
      server: options.serverLang ?? "node",
    };
    this.#hello = encodeHello(schema.fingerprint, this.info);

    this.#result = bodyCodec(schema, "STEP_RESP");
    this.#resultSize = this.#result.size;
    const stepRequest = bodyCodec(schema, "STEP_REQ");
    const action = fieldWithRole(schema, stepRequest.name, "action");
    if (action === null || elementType(action) !== "i32") {
      throw new ProtocolError("the STEP_REQ body struct has no i32 field with role 'action'");
    }
    this.#actionAt = action.offset;
    this.#stepRequestSize = stepRequest.size;
    const multi = bodyCodec(schema, "STEP_MULTI_REQ");
    this.#multiSize = multi.size;
    this.#multiAt = firstField(schema, multi.name).offset;
    const reset = bodyCodec(schema, "RESET_SEED_REQ");
    this.#seedAt = firstField(schema, reset.name).offset;
    this.#seedSize = reset.size;
    this.#spacesCodec = bodyCodec(schema, "SPACES_RESP");
    this.#spacesNames = [
      firstField(schema, this.#spacesCodec.name, 0).name,
      firstField(schema, this.#spacesCodec.name, 1).name,
    ];

    this.spaces = envs[0]!.spaces();
    const actN = this.spaces.actN;
    const maskField = fieldWithRole(schema, this.#result.name, "action_mask");
    this.#mask =
      maskField && maskField.count === actN
        ? { at: maskField.offset, ...readerOf(maskField), count: maskField.count }
        : null;
    const doneField = fieldWithRole(schema, this.#result.name, "done", "terminated");
    this.#done = doneField ? { at: doneField.offset, read: readerOf(doneField).read } : null;
    this.#masks = new Uint8Array(this.numEnvs * actN).fill(1);
    this.#isDone = new Uint8Array(this.numEnvs);
    this.#wasReset = new Uint8Array(this.numEnvs);
    this.#actions = new Int32Array(Math.max(this.numEnvs, 8));

    this.buffer = Buffer.alloc(BODY_OFFSET + Math.max(this.numEnvs, 8) * this.#resultSize + 4096);
    this.#dv = new DataView(this.buffer.buffer, this.buffer.byteOffset, this.buffer.byteLength);
  }

  /**
   * Answer one request whose body is `buf[offset, offset + length)`: returns the response
   * msg_type; the body is `body()` (`bodyLength` bytes at BODY_OFFSET of `buffer`). Never throws
   * for a bad request: refusals become ERROR responses, and `closing` is set when the connection
   * must be closed after sending it.
   */
  handle(msgType: number, buf: Uint8Array, offset: number, length: number): number {
    const ids = this.ids;
    try {
      if (msgType === ids.HELLO_REQ) return this.#helloRequest(buf, offset, length);
      if (
        msgType !== ids.RESET_REQ &&
        msgType !== ids.RESET_SEED_REQ &&
        msgType !== ids.STEP_REQ &&
        msgType !== ids.STEP_MULTI_REQ &&
        msgType !== ids.STEP_BATCH_REQ &&
        msgType !== ids.HEALTH_REQ &&
        msgType !== ids.SPACES_REQ
      ) {
        throw new RequestError(
          ErrorCode.UNKNOWN_MESSAGE,
          `msg_type 0x${msgType.toString(16).toUpperCase().padStart(2, "0")} is not a request`,
        );
      }
      if (!this.helloDone) throw new RequestError(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first");
      switch (msgType) {
        case ids.STEP_REQ:
          return this.#step(buf, offset, length);
        case ids.STEP_BATCH_REQ:
          return this.#stepBatch(buf, offset, length);
        case ids.RESET_REQ:
          this.#expectSize(length, 0, "RESET_REQ");
          return this.#resetAll(null);
        case ids.RESET_SEED_REQ:
          return this.#resetSeed(buf, offset, length);
        case ids.STEP_MULTI_REQ:
          return this.#stepMulti(buf, offset, length);
        case ids.HEALTH_REQ:
          this.#expectSize(length, 0, "HEALTH_REQ");
          this.buffer[BODY_OFFSET] = 1;
          this.bodyLength = 1;
          return ids.HEALTH_RESP;
        default:
          return this.#spacesRequest(length);
      }
    } catch (error) {
      if (error instanceof RequestError) return this.error(error.code, error.text);
      return this.error(ErrorCode.ENV_ERROR, describeError(error)); // an env bug must not kill us
    }
  }

  /** Put an ERROR body in the response buffer; sets `closing` for the closing codes. */
  error(code: ErrorCode, text: string): number {
    if (CLOSING_ERRORS.has(code)) this.closing = true;
    this.#setBody(encodeError(code, text));
    return this.ids.ERROR;
  }

  /** The current response body (a view of `buffer`, valid until the next request). */
  body(): Buffer {
    const length = this.bodyLength;
    let view = this.#bodies.get(length);
    if (view === undefined) {
      view = this.buffer.subarray(BODY_OFFSET, BODY_OFFSET + length);
      if (this.#bodies.size > 64) this.#bodies.clear();
      this.#bodies.set(length, view);
    }
    return view;
  }

  /** Header + current body as one contiguous view of `buffer` (no copy). */
  frame(msgType: number, msgId: number): Buffer {
    const length = this.bodyLength;
    packHeader(this.buffer, HEADER_OFFSET, msgType, msgId, length);
    let view = this.#frames.get(length);
    if (view === undefined) {
      view = this.buffer.subarray(HEADER_OFFSET, BODY_OFFSET + length);
      if (this.#frames.size > 64) this.#frames.clear();
      this.#frames.set(length, view);
    }
    return view;
  }

  /**
   * Give the current buffer away (a pending socket write still holds it) and answer the next
   * requests in a fresh one. Called by backends only when a write did not complete at once.
   */
  detachBuffer(minimum = this.buffer.byteLength): void {
    this.buffer = Buffer.alloc(Math.max(minimum, this.buffer.byteLength));
    this.#dv = new DataView(this.buffer.buffer, this.buffer.byteOffset, this.buffer.byteLength);
    this.#frames = new Map();
    this.#bodies = new Map();
  }

  /** Hello body this server answers with (own Hello + msgpack info). */
  helloBody(): Buffer {
    return this.#hello;
  }

  // -- requests --------------------------------------------------------------------------------

  #setBody(body: Uint8Array): void {
    if (BODY_OFFSET + body.byteLength > this.buffer.byteLength) {
      this.detachBuffer(BODY_OFFSET + body.byteLength);
    }
    this.buffer.set(body, BODY_OFFSET);
    this.bodyLength = body.byteLength;
  }

  #helloRequest(buf: Uint8Array, offset: number, length: number): number {
    try {
      const hello = decodeHello(buf.subarray(offset, offset + length));
      checkHello(hello, this.schema.fingerprint, "client");
    } catch (error) {
      if (error instanceof FingerprintMismatchError) {
        return this.error(ErrorCode.FINGERPRINT_MISMATCH, error.message);
      }
      if (error instanceof VersionMismatchError) {
        return this.error(ErrorCode.VERSION_MISMATCH, error.message);
      }
      if (error instanceof ProtocolError) return this.error(ErrorCode.BAD_FRAME, error.message);
      throw error;
    }
    this.helloDone = true;
    this.#setBody(this.#hello);
    return this.ids.HELLO_RESP;
  }

  #expectSize(length: number, size: number, what: string): void {
    if (length !== size) {
      throw new RequestError(
        ErrorCode.BAD_BODY_SIZE,
        `${what} body is ${length} bytes, expected ${size}`,
      );
    }
  }

  #write(index: number, output: unknown): void {
    const at = BODY_OFFSET + index * this.#resultSize;
    try {
      this.#result.encodeInto(output, this.buffer, at);
    } catch (error) {
      if (error instanceof CodecError) {
        throw new RequestError(
          ErrorCode.ENV_ERROR,
          `env ${index} returned bad values: ${error.message}`,
        );
      }
      throw error;
    }
    this.#remember(index, at);
  }

  #remember(index: number, at: number): void {
    const dv = this.#dv;
    const mask = this.#mask;
    if (mask !== null) {
      const actN = mask.count;
      const base = index * actN;
      const masks = this.#masks;
      const start = at + mask.at;
      if (mask.size === 1) {
        const buffer = this.buffer;
        for (let a = 0; a < actN; a++) masks[base + a] = buffer[start + a] as number;
      } else {
        for (let a = 0; a < actN; a++) masks[base + a] = mask.read(dv, start + a * mask.size) ? 1 : 0;
      }
    }
    if (this.#done !== null) this.#isDone[index] = this.#done.read(dv, at + this.#done.at) ? 1 : 0;
    this.#wasReset[index] = 1;
  }

  #checkAction(index: number, action: number): void {
    if (!this.#wasReset[index]) {
      throw new RequestError(ErrorCode.NOT_RESET, `env ${index}: step before the first reset`);
    }
    if (this.#isDone[index]) {
      throw new RequestError(ErrorCode.NOT_RESET, `env ${index}: episode is done; reset first`);
    }
    const actN = this.spaces.actN;
    if (!(action >= 0 && action < actN)) {
      throw new RequestError(
        ErrorCode.INVALID_ACTION,
        `env ${index}: action ${action} is outside 0..${actN - 1}`,
      );
    }
    if (!this.#masks[index * actN + action]) {
      throw new RequestError(ErrorCode.MASKED_ACTION, `env ${index}: action ${action} is masked out`);
    }
  }

  #resetAll(requested: bigint | null): number {
    let seed = requested;
    if (seed === null && this.firstSeed !== null && !this.#wasReset.includes(1)) {
      seed = this.firstSeed;
    }
    const envs = this.envs;
    for (let i = 0; i < envs.length; i++) {
      this.#write(i, seed === null ? envs[i]!.reset() : envs[i]!.reset(seed + BigInt(i)));
    }
    this.bodyLength = this.numEnvs * this.#resultSize;
    return this.ids.RESET_RESP;
  }

  #resetSeed(buf: Uint8Array, offset: number, length: number): number {
    this.#expectSize(length, this.#seedSize, "RESET_SEED_REQ");
    const dv = new DataView(buf.buffer, buf.byteOffset + offset, length);
    return this.#resetAll(dv.getBigUint64(this.#seedAt, true));
  }

  /** Check every action, then step every env (nothing steps when one action is refused). */
  #stepEnvs(count: number): void {
    const actions = this.#actions;
    for (let i = 0; i < count; i++) this.#checkAction(i, actions[i] as number);
    const envs = this.envs;
    for (let i = 0; i < count; i++) this.#write(i, envs[i]!.step(actions[i] as number));
  }

  #readActions(buf: Uint8Array, at: number, stride: number, count: number): void {
    const actions = this.#actions;
    for (let i = 0; i < count; i++) {
      const p = at + i * stride;
      actions[i] =
        (buf[p] as number) |
        ((buf[p + 1] as number) << 8) |
        ((buf[p + 2] as number) << 16) |
        ((buf[p + 3] as number) << 24);
    }
  }

  #step(buf: Uint8Array, offset: number, length: number): number {
    if (this.numEnvs !== 1) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        `STEP_REQ needs a 1-env server; this one has ${this.numEnvs}`,
      );
    }
    this.#expectSize(length, this.#stepRequestSize, "STEP_REQ");
    this.#readActions(buf, offset + this.#actionAt, this.#stepRequestSize, 1);
    this.#stepEnvs(1);
    this.bodyLength = this.#resultSize;
    return this.ids.STEP_RESP;
  }

  #stepMulti(buf: Uint8Array, offset: number, length: number): number {
    if (this.numEnvs !== 8) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        `STEP_MULTI_REQ needs an 8-env server; this one has ${this.numEnvs}`,
      );
    }
    this.#expectSize(length, this.#multiSize, "STEP_MULTI_REQ");
    this.#readActions(buf, offset + this.#multiAt, 4, 8);
    this.#stepEnvs(8);
    this.bodyLength = 8 * this.#resultSize;
    return this.ids.STEP_MULTI_RESP;
  }

  #stepBatch(buf: Uint8Array, offset: number, length: number): number {
    const size = this.#stepRequestSize;
    if (length !== this.numEnvs * size) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        `STEP_BATCH_REQ carries ${size ? Math.floor(length / size) : 0} actions ` +
          `(${length} bytes); this server has ${this.numEnvs} envs`,
      );
    }
    this.#readActions(buf, offset + this.#actionAt, size, this.numEnvs);
    this.#stepEnvs(this.numEnvs);
    this.bodyLength = this.numEnvs * this.#resultSize;
    return this.ids.STEP_BATCH_RESP;
  }

  #spacesRequest(length: number): number {
    this.#expectSize(length, 0, "SPACES_REQ");
    const [obs, act] = this.#spacesNames;
    this.#spacesCodec.encodeInto(
      { [obs]: this.spaces.obsN, [act]: this.spaces.actN },
      this.buffer,
      BODY_OFFSET,
    );
    this.bodyLength = this.#spacesCodec.size;
    return this.ids.SPACES_RESP;
  }
}

/** What `serve` accepts: one env (shared by every connection) or a factory of fresh envs. */
export type EnvOrFactory = Env<unknown> | EnvFactory<unknown> | (new () => Env<unknown>);

/** Options of a session factory. */
export interface SessionFactoryOptions extends SessionOptions {
  /** Envs per connection (N); needs a factory when above 1. */
  readonly numEnvs?: number;
}

function isEnv(value: unknown): value is Env<unknown> {
  return (
    typeof value === "object" &&
    value !== null &&
    typeof (value as Env<unknown>).reset === "function" &&
    typeof (value as Env<unknown>).step === "function"
  );
}

/** Makes one Session per connection: fresh envs from a factory, or one shared env. */
export function sessionFactory(
  envOrFactory: EnvOrFactory,
  options: SessionFactoryOptions = {},
): () => Session {
  const numEnvs = options.numEnvs ?? 1;
  if (!Number.isInteger(numEnvs) || numEnvs < 1) {
    throw new TransportError("numEnvs must be an integer of at least 1");
  }
  if (isEnv(envOrFactory)) {
    if (numEnvs !== 1) throw new TransportError("pass an env factory to serve more than one env");
    // Node runs one request at a time: a shared env needs no lock, only per-session bookkeeping.
    const shared = envOrFactory;
    return () => new Session([shared], options);
  }
  if (typeof envOrFactory !== "function") {
    throw new TransportError("serve() takes an env (reset, step, spaces) or an env factory");
  }
  const make = envOrFactory as (() => Env<unknown>) & (new () => Env<unknown>);
  const isClass = /^class[\s{]/.test(Function.prototype.toString.call(make));
  const create = isClass ? () => new make() : () => make();
  return () => {
    const envs: AnyEnv[] = [];
    for (let i = 0; i < numEnvs; i++) envs.push(create());
    return new Session(envs, options);
  };
}
