/**
 * Serving envs: the request handling every Node backend's server shares (transport/server.py).
 *
 * A backend accepts connections and moves frames; for each connection it makes a `Session` and
 * calls `handle(msgType, buf, offset, length)`, which answers into one preallocated response
 * buffer: the header at HEADER_OFFSET (7..15) and the body at BODY_OFFSET (16), so a stream
 * backend writes `frame()` in one call. Step results are encoded straight into that buffer at
 * `BODY_OFFSET + i * size` (the result codec's `encodeInto`, or `writeInto` with
 * `validate: false`): a steady-state step allocates no result bytes. The checks, their order and
 * their error codes are Python's: HELLO first, then per message the body size, the batch size,
 * and per env "reset first", "done: reset first", the action range and the action mask, all
 * before any env steps.
 *
 * Schema-generic: any generated schema module that declares the protocol messages by name
 * (`messageIds`), whose STEP_REQ body has an integer field with role "action" and whose
 * STEP_RESP body is the result struct (roles `action_mask`, `done` or `terminated`, both
 * optional) can be served; the default is pac_env.
 *
 * Auto-reset (docs/protocol.md): the mode the client asks for in HELLO_REQ flags holds for the
 * session. NEXT_STEP ignores the action of a done env and resets it; SAME_STEP resets an env
 * whose step ended its episode at once and appends the final results as a tail
 * (`u32 k`, k x (`u32 env index`, result)).
 *
 * Env errors (transport/server.py `_recover`): an env that throws in reset or step is answered
 * with ERROR ENV_ERROR, text `env {i}: <Name>: <message> (<fate>)` (several failures joined by
 * "; "); that env is reset, or recreated from the factory when its reset throws too, or left
 * needing a reset; the other envs of the request did step (or reset).
 */

import type { AnyStructCodec, SchemaModule } from "./codec";
import type { Env, EnvFactory, Spaces } from "./env";
import { CodecError, ProtocolError, TransportError } from "./errors";
import * as pac_env from "./generated/pac_env";
import { type FieldJson, episodeEndFields } from "./ir";
import {
  AUTORESET_MASK,
  AutoReset,
  BODY_OFFSET,
  CLOSING_ERRORS,
  ErrorCode,
  FINAL_COUNT_SIZE,
  HEADER_OFFSET,
  type MessageIds,
  RequestError,
  autoresetName,
  checkHello,
  decodeHello,
  encodeError,
  encodeHello,
  messageIds,
  packHeader,
  writeU32,
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
  /**
   * Check every env result against the schema before writing it (default true): a bad value
   * is ENV_ERROR "returned bad values". false writes results unchecked (the codec's
   * `writeInto`), for envs whose output is well-formed by construction.
   */
  readonly validate?: boolean;
  /** Recreates an env whose reset fails after it threw (a server with an env factory). */
  readonly factory?: () => Env<unknown>;
  /**
   * Runs the session's envs elsewhere (workers.ts `WorkerPool`, `--workers K`): made at the
   * first reset; the session's `envs` are then stand-ins that only answer `spaces()`.
   */
  readonly pool?: () => EnvPool;
}

/** The N envs of a session stepped in worker threads (workers.ts `WorkerPool`). */
export interface EnvPool {
  /** The N result records, written by `reset`, `step` and `restore`. */
  readonly results: Uint8Array;
  reset(seeds: ReadonlyArray<bigint | null>): ReadonlyArray<readonly [number, unknown]>;
  step(
    actions: ArrayLike<number>,
    mode: AutoReset,
  ): { readonly ended: readonly number[]; readonly failures: ReadonlyArray<readonly [number, unknown]> };
  finalRecord(index: number): Uint8Array;
  restore(index: number, seed: bigint | null): readonly [fate: string, ok: boolean];
  close(): void;
}

const closePools = new FinalizationRegistry<EnvPool>((pool) => pool.close());

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

/** A field's element type, enums resolved to their integer type ("i32" for "i32[8]"). */
function elementType(schema: SchemaModule, field: FieldJson): string {
  const bracket = field.type.indexOf("[");
  const type = bracket < 0 ? field.type : field.type.slice(0, bracket);
  return schema.ir.enums[type]?.type ?? type;
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

function readerOf(schema: SchemaModule, field: FieldJson): { read: Reader; size: number } {
  const type = elementType(schema, field);
  const read = READERS[type];
  if (read === undefined) throw new ProtocolError(`field ${field.name} has non-scalar type ${type}`);
  return { read, size: field.size / field.count };
}

/** An action's integer type: byte size and signedness (actions are read byte by byte). */
interface ActionType {
  readonly size: 1 | 2 | 4;
  readonly signed: boolean;
}

const ACTION_TYPES: Readonly<Record<string, ActionType>> = {
  i8: { size: 1, signed: true },
  u8: { size: 1, signed: false },
  i16: { size: 2, signed: true },
  u16: { size: 2, signed: false },
  i32: { size: 4, signed: true },
  u32: { size: 4, signed: false },
};

function actionTypeOf(schema: SchemaModule, field: FieldJson, what: string): ActionType {
  const type = elementType(schema, field);
  const found = ACTION_TYPES[type];
  if (found === undefined) {
    throw new ProtocolError(`the ${what} field ${field.name} has type ${type}: actions must be 8-32 bit integers`);
  }
  return found;
}

/** Python's `format_exception_only`: "Name: message". */
function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

/** A failure of one env during a request: its index and what it threw. */
type Failure = readonly [index: number, error: unknown];

/** One client's conversation with a server: HELLO, then requests answered in place. */
export class Session {
  readonly schema: SchemaModule;
  readonly ids: MessageIds;
  /** The envs of this session; an env that threw and could not be reset may be replaced. */
  readonly envs: AnyEnv[];
  readonly numEnvs: number;
  readonly spaces: Spaces;
  /** The HELLO_RESP info map before the auto-reset mode is added (key order is Python's). */
  readonly info: Record<string, unknown>;
  readonly firstSeed: bigint | null;
  readonly factory: (() => AnyEnv) | null;
  helloDone = false;
  /** Set when the connection must be closed after sending the current response. */
  closing = false;
  /** The auto-reset mode the client asked for in HELLO (disabled until then). */
  autoreset: AutoReset = AutoReset.DISABLED;
  /** The response buffer: header at 7..15, body at 16. Replaced by `detachBuffer()`. */
  buffer: Buffer;
  /** Length of the current response body (at BODY_OFFSET). */
  bodyLength = 0;

  readonly #result: AnyStructCodec;
  readonly #resultSize: number;
  readonly #validate: boolean;
  readonly #action: ActionType;
  readonly #actionAt: number;
  readonly #stepRequestSize: number;
  readonly #multi: ActionType;
  readonly #multiSize: number;
  readonly #multiAt: number;
  readonly #seedAt: number;
  readonly #seedSize: number;
  readonly #spacesCodec: AnyStructCodec;
  readonly #spacesNames: readonly [string, string];
  readonly #mask: { at: number; read: Reader; size: number; count: number } | null;
  /** The result fields whose truth ends an episode (`episodeEndFields`). */
  readonly #ends: ReadonlyArray<{ at: number; read: Reader }>;
  readonly #masks: Uint8Array;
  readonly #isDone: Uint8Array;
  readonly #wasReset: Uint8Array;
  readonly #actions: Float64Array; // exact for every 8-32 bit action type
  /** How many final results the current SAME_STEP response carries. */
  #finals = 0;
  #frames = new Map<number, Buffer>();
  #bodies = new Map<number, Buffer>();
  #dv: DataView;
  /** Makes the worker pool of `--workers K` (SessionOptions.pool); null: the envs run here. */
  readonly makePool: (() => EnvPool) | null;
  #pool: EnvPool | null = null;
  #seatActions: Int32Array | null = null; // STEP_MULTI's actions for an env with stepBatch

  constructor(envs: readonly AnyEnv[], options: SessionOptions = {}) {
    if (envs.length < 1) throw new TransportError("a session needs at least one env");
    const schema = options.schema ?? pac_env.SCHEMA;
    this.schema = schema;
    this.ids = messageIds(schema);
    this.envs = [...envs];
    this.numEnvs = envs.length;
    this.factory = options.factory ?? null;
    const seed = options.seed;
    this.firstSeed = seed === undefined || seed === null ? null : BigInt(seed);
    this.info = {
      num_envs: this.numEnvs,
      env: options.envName ?? "",
      server: options.serverLang ?? "node",
    };
    this.#validate = options.validate ?? true;
    this.makePool = options.pool ?? null;

    this.#result = bodyCodec(schema, "STEP_RESP");
    this.#resultSize = this.#result.size;
    const stepRequest = bodyCodec(schema, "STEP_REQ");
    const action = fieldWithRole(schema, stepRequest.name, "action");
    if (action === null) {
      throw new ProtocolError("the STEP_REQ body struct has no field with role 'action'");
    }
    this.#action = actionTypeOf(schema, action, "STEP_REQ action");
    this.#actionAt = action.offset;
    this.#stepRequestSize = stepRequest.size;
    const multi = bodyCodec(schema, "STEP_MULTI_REQ");
    const multiField = firstField(schema, multi.name);
    this.#multi = actionTypeOf(schema, multiField, "STEP_MULTI_REQ");
    this.#multiSize = multi.size;
    this.#multiAt = multiField.offset;
    const reset = bodyCodec(schema, "RESET_SEED_REQ");
    this.#seedAt = firstField(schema, reset.name).offset;
    this.#seedSize = reset.size;
    this.#spacesCodec = bodyCodec(schema, "SPACES_RESP");
    this.#spacesNames = [
      firstField(schema, this.#spacesCodec.name, 0).name,
      firstField(schema, this.#spacesCodec.name, 1).name,
    ];

    this.spaces = envs[0]!.spaces();
    // as in Python, the mask is checked for actions below its length (normally act_n)
    const maskField = fieldWithRole(schema, this.#result.name, "action_mask");
    this.#mask = maskField
      ? { at: maskField.offset, ...readerOf(schema, maskField), count: maskField.count }
      : null;
    this.#ends = episodeEndFields(schema.ir.structs[this.#result.name]).map((f) => ({
      at: f.offset,
      read: readerOf(schema, f).read,
    }));
    this.#masks = new Uint8Array(this.numEnvs * (this.#mask?.count ?? 0));
    this.#isDone = new Uint8Array(this.numEnvs);
    this.#wasReset = new Uint8Array(this.numEnvs);
    this.#actions = new Float64Array(Math.max(this.numEnvs, 8));

    // results (8 at least: STEP_MULTI), then the SAME_STEP tail: u32 k, k x (u32 index, result)
    const size = this.#resultSize;
    this.buffer = Buffer.alloc(
      BODY_OFFSET +
        Math.max(this.numEnvs, 8) * size +
        FINAL_COUNT_SIZE +
        this.numEnvs * (FINAL_COUNT_SIZE + size) +
        1024,
    );
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
      // a bug must not take the server down (env errors are recovered: #recover)
      return this.error(ErrorCode.INTERNAL, describeError(error));
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

  /** The HELLO_RESP body for an auto-reset mode: own Hello (flags = mode) + msgpack info. */
  helloBody(mode: AutoReset = this.autoreset): Buffer {
    // the same keys in the same order as Python: num_envs, env, server, autoreset
    return encodeHello(this.schema.fingerprint, { ...this.info, autoreset: autoresetName(mode) }, mode);
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
    let flags: number;
    try {
      const hello = decodeHello(buf.subarray(offset, offset + length));
      checkHello(hello, this.schema.fingerprint, "client");
      flags = hello.flags;
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
    const mode = flags & AUTORESET_MASK;
    if (mode > AutoReset.SAME_STEP) {
      return this.error(ErrorCode.BAD_FRAME, `unknown auto-reset mode in flags ${flags}`);
    }
    this.autoreset = mode as AutoReset;
    this.helloDone = true;
    this.#setBody(this.helloBody());
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

  /** Encode env `index`'s result into its slot and remember its mask and done flag. */
  #write(index: number, output: unknown): void {
    const at = BODY_OFFSET + index * this.#resultSize;
    if (this.#validate) {
      try {
        this.#result.encodeInto(output, this.buffer, at);
      } catch (error) {
        if (error instanceof CodecError) {
          throw new RequestError(
            ErrorCode.ENV_ERROR,
            `env ${index}: returned bad values: ${error.message}`,
          );
        }
        throw error;
      }
    } else {
      this.#result.writeInto(output, this.buffer, at);
    }
    this.#remember(index, at);
  }

  #remember(index: number, at: number): void {
    const dv = this.#dv;
    const mask = this.#mask;
    if (mask !== null) {
      const count = mask.count;
      const base = index * count;
      const masks = this.#masks;
      const start = at + mask.at;
      if (mask.size === 1) {
        const buffer = this.buffer;
        for (let a = 0; a < count; a++) masks[base + a] = buffer[start + a] as number;
      } else {
        for (let a = 0; a < count; a++) masks[base + a] = mask.read(dv, start + a * mask.size) ? 1 : 0;
      }
    }
    let ended = 0;
    for (const end of this.#ends) if (end.read(dv, at + end.at)) ended = 1;
    this.#isDone[index] = ended;
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
    const mask = this.#mask;
    if (mask !== null && action < mask.count && !this.#masks[index * mask.count + action]) {
      throw new RequestError(ErrorCode.MASKED_ACTION, `env ${index}: action ${action} is masked out`);
    }
  }

  /** The reset of env `index` (or a fresh env's) written to its slot. */
  #resetInto(index: number, env: AnyEnv, seed: bigint | null): void {
    this.#write(index, seed === null ? env.reset() : env.reset(seed));
  }

  #resetAll(requested: bigint | null): number {
    let seed = requested;
    if (seed === null && this.firstSeed !== null && !this.#wasReset.includes(1)) {
      seed = this.firstSeed;
    }
    if (this.makePool !== null) return this.#poolReset(seed);
    const envs = this.envs;
    let failures: Failure[] | null = null;
    for (let i = 0; i < envs.length; i++) {
      try {
        this.#resetInto(i, envs[i]!, seed === null ? null : seed + BigInt(i));
      } catch (error) {
        (failures ??= []).push([i, error]); // the other envs still reset
        continue;
      }
      this.#wasReset[i] = 1;
    }
    if (failures !== null) throw this.#recover(failures, seed);
    this.bodyLength = this.numEnvs * this.#resultSize;
    return this.ids.RESET_RESP;
  }

  #resetSeed(buf: Uint8Array, offset: number, length: number): number {
    this.#expectSize(length, this.#seedSize, "RESET_SEED_REQ");
    const dv = new DataView(buf.buffer, buf.byteOffset + offset, length);
    return this.#resetAll(dv.getBigUint64(this.#seedAt, true));
  }

  /** Step env `index` (or auto-reset it), honouring the session's auto-reset mode. */
  #stepOne(index: number, action: number): void {
    const mode = this.autoreset;
    if (mode === AutoReset.NEXT_STEP && this.#isDone[index]) {
      this.#resetInto(index, this.envs[index]!, null); // the action of a done env is ignored
      return;
    }
    this.#write(index, this.envs[index]!.step(action));
    if (mode === AutoReset.SAME_STEP && this.#isDone[index]) {
      this.#keepFinal(index);
      this.#resetInto(index, this.envs[index]!, null);
    }
  }

  /** Copy env `index`'s final result into the response tail (SAME_STEP). */
  #keepFinal(index: number, source?: Uint8Array): void {
    const size = this.#resultSize;
    const tail =
      BODY_OFFSET + this.numEnvs * size + FINAL_COUNT_SIZE + this.#finals * (FINAL_COUNT_SIZE + size);
    writeU32(this.buffer, tail, index);
    if (source !== undefined) {
      this.buffer.set(source, tail + FINAL_COUNT_SIZE);
    } else {
      const slot = BODY_OFFSET + index * size;
      this.buffer.copy(this.buffer, tail + FINAL_COUNT_SIZE, slot, slot + size);
    }
    this.#finals++;
  }

  /** Body length of a step response of `count` results; SAME_STEP adds the tail. */
  #resultsLength(count: number): number {
    const length = count * this.#resultSize;
    if (this.autoreset !== AutoReset.SAME_STEP) return length;
    writeU32(this.buffer, BODY_OFFSET + length, this.#finals);
    return length + FINAL_COUNT_SIZE + this.#finals * (FINAL_COUNT_SIZE + this.#resultSize);
  }

  /**
   * Check every action (NEXT_STEP: a done env's action is ignored, not checked), then step
   * every env; an env that throws is recovered after the others stepped.
   */
  #stepEnvs(count: number): void {
    const actions = this.#actions;
    const skipDone = this.autoreset === AutoReset.NEXT_STEP;
    for (let i = 0; i < count; i++) {
      if (skipDone && this.#isDone[i] && this.#wasReset[i]) continue;
      this.#checkAction(i, actions[i] as number);
    }
    this.#finals = 0;
    if (this.#pool !== null) return this.#poolStep();
    let failures: Failure[] | null = null;
    for (let i = 0; i < count; i++) {
      try {
        this.#stepOne(i, actions[i] as number);
      } catch (error) {
        (failures ??= []).push([i, error]); // the other envs still step
      }
    }
    if (failures !== null) throw this.#recover(failures, null);
  }

  /**
   * Reset (or recreate from the factory) each env that threw; the ERROR to answer. The text
   * starts with `env {i}:` (the first env that failed), so clients can name the env.
   */
  #recover(failures: readonly Failure[], seed: bigint | null): RequestError {
    const texts: string[] = [];
    for (const [index, error] of failures) {
      let detail: string;
      if (error instanceof RequestError) {
        const prefix = `env ${index}: `;
        detail = error.text.startsWith(prefix) ? error.text.slice(prefix.length) : error.text;
      } else {
        detail = describeError(error);
      }
      const fate = this.#restore(index, seed === null ? null : seed + BigInt(index));
      texts.push(`env ${index}: ${detail} (${fate})`);
    }
    return new RequestError(ErrorCode.ENV_ERROR, texts.join("; "));
  }

  /** Reset env `index` after it threw; if that throws too, recreate it from the factory. */
  #restore(index: number, seed: bigint | null): string {
    if (this.#pool !== null) {
      const [fate, ok] = this.#pool.restore(index, seed);
      this.#wasReset[index] = ok ? 1 : 0;
      if (ok) this.#copyResults(index, index + 1);
      return fate;
    }
    const env = this.envs[index]!;
    const attempts: Array<readonly [string, () => AnyEnv]> = [["the env was reset", () => env]];
    const factory = this.factory;
    if (factory !== null) attempts.push(["the env was recreated", factory]);
    for (const [fate, make] of attempts) {
      let fresh: AnyEnv;
      try {
        fresh = make();
        this.#resetInto(index, fresh, seed);
      } catch {
        continue;
      }
      this.envs[index] = fresh;
      this.#wasReset[index] = 1;
      return fate;
    }
    this.#wasReset[index] = 0; // every step is NOT_RESET until a reset succeeds
    return "the env could not be reset: send a reset";
  }

  // -- a worker pool (SessionOptions.pool) ------------------------------------------------------

  /** Copy the pool's results of envs [from, to) into their slots and remember masks and done. */
  #copyResults(from: number, to: number): void {
    const size = this.#resultSize;
    const pool = this.#pool!;
    this.buffer.set(pool.results.subarray(from * size, to * size), BODY_OFFSET + from * size);
    for (let i = from; i < to; i++) this.#remember(i, BODY_OFFSET + i * size);
  }

  #poolReset(seed: bigint | null): number {
    if (this.#pool === null) {
      this.#pool = this.makePool!();
      closePools.register(this, this.#pool);
    }
    const seeds: Array<bigint | null> = [];
    for (let i = 0; i < this.numEnvs; i++) seeds.push(seed === null ? null : seed + BigInt(i));
    const failures = this.#pool.reset(seeds);
    this.#copyResults(0, this.numEnvs);
    const failed = new Set(failures.map(([i]) => i));
    for (let i = 0; i < this.numEnvs; i++) if (!failed.has(i)) this.#wasReset[i] = 1;
    if (failures.length) throw this.#recover(failures, seed);
    this.bodyLength = this.numEnvs * this.#resultSize;
    return this.ids.RESET_RESP;
  }

  #poolStep(): void {
    const pool = this.#pool!;
    const { ended, failures } = pool.step(this.#actions, this.autoreset);
    this.#copyResults(0, this.numEnvs);
    for (const i of ended) this.#keepFinal(i, pool.finalRecord(i));
    if (failures.length) throw this.#recover(failures, null);
  }

  #readActions(buf: Uint8Array, at: number, stride: number, count: number, type: ActionType): void {
    const actions = this.#actions;
    for (let i = 0; i < count; i++) {
      const p = at + i * stride;
      let value: number;
      if (type.size === 4) {
        value =
          (buf[p] as number) |
          ((buf[p + 1] as number) << 8) |
          ((buf[p + 2] as number) << 16) |
          ((buf[p + 3] as number) << 24);
        if (!type.signed) value >>>= 0;
      } else if (type.size === 2) {
        value = (buf[p] as number) | ((buf[p + 1] as number) << 8);
        if (type.signed) value = (value << 16) >> 16;
      } else {
        value = buf[p] as number;
        if (type.signed) value = (value << 24) >> 24;
      }
      actions[i] = value;
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
    this.#readActions(buf, offset + this.#actionAt, this.#stepRequestSize, 1, this.#action);
    this.#stepEnvs(1);
    this.bodyLength = this.#resultsLength(1);
    return this.ids.STEP_RESP;
  }

  #stepMulti(buf: Uint8Array, offset: number, length: number): number {
    const stepBatch = this.#stepBatchMethod();
    if (this.numEnvs !== 8 && stepBatch === null) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        `STEP_MULTI_REQ needs an 8-env server or one env with stepBatch; this one has ${this.numEnvs} envs`,
      );
    }
    this.#expectSize(length, this.#multiSize, "STEP_MULTI_REQ");
    this.#readActions(buf, offset + this.#multiAt, this.#multi.size, 8, this.#multi);
    if (stepBatch !== null) this.#stepSeats(stepBatch, 8);
    else this.#stepEnvs(8);
    this.bodyLength = this.#resultsLength(8);
    return this.ids.STEP_MULTI_RESP;
  }

  /**
   * A 1-env server's `env.stepBatch`: STEP_MULTI then steps that one env (seed 000's self-play
   * game: one action per seat, one result per seat).
   */
  #stepBatchMethod(): ((actions: Int32Array) => ArrayLike<unknown>) | null {
    if (this.numEnvs !== 1 || this.makePool !== null) return null;
    const env = this.envs[0];
    return env?.stepBatch !== undefined ? env.stepBatch.bind(env) : null;
  }

  #stepSeats(stepBatch: (actions: Int32Array) => ArrayLike<unknown>, count: number): void {
    if (this.autoreset !== AutoReset.DISABLED) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        "STEP_MULTI_REQ to an env with stepBatch: the env's seats do not auto-reset " +
          "(connect with autoreset disabled)",
      );
    }
    if (!this.#wasReset[0] || this.#isDone[0]) this.#checkAction(0, 0); // NOT_RESET
    const actN = this.spaces.actN;
    const actions = (this.#seatActions ??= new Int32Array(count)); // reused: valid during the call
    actions.set(this.#actions.subarray(0, count));
    for (let seat = 0; seat < count; seat++) {
      const action = actions[seat] as number;
      if (!(action >= 0 && action < actN)) {
        throw new RequestError(
          ErrorCode.INVALID_ACTION,
          `env 0: action ${action} of seat ${seat} is outside 0..${actN - 1}`,
        );
      }
    }
    try {
      const outputs = stepBatch(actions);
      if (outputs.length !== count) {
        throw new Error(`stepBatch returned ${outputs.length} results for ${count} actions`);
      }
      for (let seat = 0; seat < count; seat++) this.#write(seat, outputs[seat]);
    } catch (error) {
      throw this.#recover([[0, error]], null);
    }
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
    this.#readActions(buf, offset + this.#actionAt, size, this.numEnvs, this.#action);
    this.#stepEnvs(this.numEnvs);
    this.bodyLength = this.#resultsLength(this.numEnvs);
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
  const sessionOptions: SessionOptions = { ...options, factory: create };
  if (options.pool !== undefined) {
    // the envs live in the pool's worker threads: stand-ins answer spaces() only
    const spaces = create().spaces();
    const stub: AnyEnv = {
      spaces: () => spaces,
      reset: () => {
        throw new TransportError("this env lives in a worker thread: reset through the pool");
      },
      step: () => {
        throw new TransportError("this env lives in a worker thread: step through the pool");
      },
    };
    return () => new Session(new Array<AnyEnv>(numEnvs).fill(stub), sessionOptions);
  }
  return () => {
    const envs: AnyEnv[] = [];
    for (let i = 0; i < numEnvs; i++) envs.push(create());
    return new Session(envs, sessionOptions);
  };
}
