/**
 * The env runtime: every env semantic of a Node server, once (transport/runtime in Python).
 *
 * Backends move bytes; the stream session (session.ts) decodes request bodies and the shm server
 * (backends/shm) reads slots, and both call one `EnvRuntime` with *records*: the bytes where env
 * i's result is encoded (the session's send buffer, a slot). The runtime owns, for N envs:
 *
 * - the checks, their order, codes and texts (Python's): "reset first" (NOT_RESET), "episode is
 *   done; reset first", the action range (INVALID_ACTION) and the action mask (MASKED_ACTION),
 *   all before any env steps (a refused batch steps nothing);
 * - seeds: env i gets seed + i; the server's first seed (`--seed S`) for the first unseeded reset;
 * - auto-reset (docs/protocol.md): DISABLED, NEXT_STEP (a done env's action is ignored and the env
 *   is reset), SAME_STEP (an ending step's result is kept as a final (`Records.keepFinal`), then
 *   the env is reset);
 * - env-error recovery (transport/server.py `_recover`): an env that throws is answered ENV_ERROR
 *   `env {i}: <Name>: <message> (<fate>)` (several joined by "; "), and is reset, else recreated
 *   from the factory, else left needing a reset; the other envs of the request did their work;
 * - `stepBatch` (one env, one action per seat: STEP_MULTI) and OBSERVE.
 *
 * The envs themselves run in a *runner*: in this thread (local.ts, results encoded in place into
 * the records) or in worker threads (pool.ts). A runner only executes per-env operations.
 */

import { type AnyStructCodec, INTEGER_RANGES, type SchemaModule } from "../codec";
import type { IntegerType } from "../ir";
import { ProtocolError, REMOTE_TRACEBACK_MARKER, TransportError } from "../errors";
import { type FieldJson, episodeEndFields, fieldDims } from "../ir";
import { AutoReset, ErrorCode, RequestError } from "../protocol";
import { type Action, type Column, type RunnerColumns, type Spaces, checkDeclaredAction, checkedSpaces } from "./env";

/**
 * The NOT_RESET of a step of env `index` before its first reset (the runtime's check, and the shm
 * client's at SEND: `checkResetSent`). Python: `transport.runtime.core.step_before_reset`.
 */
export function stepBeforeReset(index: number): RequestError {
  return new RequestError(ErrorCode.NOT_RESET, `env ${index}: step before the first reset`);
}

export const FATE_RESET = "the env was reset";
export const FATE_RECREATED = "the env was recreated";
export const FATE_FAILED = "the env could not be reset: send a reset";

/**
 * Bytes of an ENV_ERROR text, message and trimmed stack: the size of an shm slot's error_text
 * area (the compiler's ERROR_TEXT_SIZE), the smallest carrier, so every backend delivers the
 * same text. Python: `ENV_ERROR_TEXT_MAX`.
 */
export const ENV_ERROR_TEXT_MAX = 1024;
/** Frames of an env's stack carried to the client: the innermost ones (the env's own code). */
export const TRACEBACK_FRAMES = 4;
const RUNTIME_DIR = __dirname + "/";
const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** The first line and the innermost `TRACEBACK_FRAMES` frames of an error's stack ("" if none). */
export function remoteTraceback(error: unknown): string {
  if (!(error instanceof Error) || typeof error.stack !== "string") return "";
  const lines = error.stack.split("\n");
  // the runtime's own frames (this folder) say nothing about the env
  const frames = lines.filter((line) => line.trimStart().startsWith("at ") && !line.includes(RUNTIME_DIR));
  if (frames.length === 0) return "";
  return [describeError(error), ...frames.slice(0, TRACEBACK_FRAMES)].join("\n");
}

/**
 * `message`, then the marker and `trace` cut from the end (whole lines: the innermost frames are
 * kept) so the whole text is at most `limit` bytes of UTF-8; the message alone when there is no
 * room for a useful part of the trace. Python: `with_traceback` (which keeps the last lines).
 */
export function withTraceback(message: string, trace: string, limit = ENV_ERROR_TEXT_MAX): string {
  if (trace === "") return message;
  const room = limit - Buffer.byteLength(message) - Buffer.byteLength(REMOTE_TRACEBACK_MARKER);
  const lines = trace.split("\n");
  while (lines.length > 1 && Buffer.byteLength(lines.join("\n")) > room) lines.pop();
  const kept = lines.join("\n");
  if (Buffer.byteLength(kept) > room) return message;
  return message + REMOTE_TRACEBACK_MARKER + kept;
}

/** Seats of a STEP_MULTI (seed 000's self-play game). */
export const SEATS = 8;

/** What a runner does to one env. */
export const Op = {
  NONE: 0,
  STEP: 1,
  RESET: 2,
  /** A fresh env from the factory, then reset (recovery). */
  RECREATE: 3,
  /** Write the env's current result (`observe()`, else its last result). */
  OBSERVE: 4,
} as const;
export type Op = (typeof Op)[keyof typeof Op];

/**
 * ENV_ERROR after recovery, naming the envs that failed (the others did their op): the shm
 * server answers only their slots (Python: `RequestError.env_ids`).
 */
export class EnvFailureError extends RequestError {
  constructor(
    text: string,
    readonly envIds: readonly number[],
  ) {
    super(ErrorCode.ENV_ERROR, text);
  }
}

/** A failure of one env during a request: its index and what it threw. */
export type Failure = readonly [index: number, error: unknown];

/** Python's `format_exception_only`: "Name: message". */
export function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

/** What env `index` did wrong, without the `env {i}: ` a RequestError's text may start with. */
export function failureText(index: number, error: unknown): string {
  if (!(error instanceof RequestError)) return describeError(error);
  const prefix = `env ${index}: `;
  return error.text.startsWith(prefix) ? error.text.slice(prefix.length) : error.text;
}

export { checkAutoreset } from "../protocol";

/**
 * Where results go: env i's result record (the result struct's packed layout) is at
 * `bytes[at(i), at(i) + size)`. A backend hands the runtime its own bytes (zero copy) or a
 * scratch area it copies from in `written`.
 */
export interface Records {
  readonly bytes: Uint8Array;
  at(index: number): number;
  /**
   * True when the records are one block: env i's at `at(0) + i * size` (a response body, a
   * scratch area), so a runner may copy every result in one call. Absent: strided (shm slots).
   */
  readonly packed?: boolean;
  /** Env `index`'s record is complete (after a step, reset or observe). */
  written(index: number): void;
  /** SAME_STEP: env `index`'s record is a final result; keep it before the reset overwrites it. */
  keepFinal(index: number): void;
  /**
   * Set when the results live in these columns, not in the records (an shm column region whose
   * vector env writes the region's columns: `ResultColumns.adopt`; shm slots that `written`
   * fills from the columns): the runner copies nothing into the records, and the runtime writes
   * a "noop" result's reward into its column.
   */
  readonly resultColumns?: RunnerColumns | null;
}

/** Runs the envs: executes per-env operations and encodes results into records. */
export interface Runner {
  readonly numEnvs: number;
  /** A failed env can be recreated (the server has a factory). */
  readonly canRecreate: boolean;
  /** Only whole batches (every env at once) can run (a worker pool). */
  readonly wholeBatchOnly: boolean;
  spaces(): Spaces;
  /**
   * Run `ops[i]` on every env i (STEP with `actions[i]`, RESET / RECREATE with `seeds[i]`,
   * OBSERVE), each result encoded into `out`'s record i. Returns null, or the envs that threw
   * (in index order): the others did their operation.
   */
  run(
    ops: Uint8Array,
    actions: Float64Array,
    seeds: ReadonlyArray<bigint | null>,
    out: Records,
  ): Failure[] | null;
  /** The fate of env `index` if the runner replaced it since the last request (a dead worker). */
  takeReplaced(index: number): string | null;
  /** Env 0's `stepBatch` writing seat i's result into record i; null when it has none. */
  readonly stepSeats: ((actions: Int32Array, out: Records) => void) | null;
  /** Start what the runner needs now (worker threads) rather than at the first request. */
  start?(): unknown;
  /**
   * Set when the envs run concurrently (a worker pool): asynchronous batches submit envs to it
   * and take each as it finishes. Absent: the envs step at SEND, in this thread.
   */
  readonly concurrent?: ConcurrentRunner;
  /**
   * Set when the runner writes results in place into records that lie in a SharedArrayBuffer
   * (a worker pool): the session then keeps its response buffer in one (no copy back).
   */
  readonly wantsSharedRecords?: boolean;
  /** Env i's `info()` map (`{}` without it). */
  info(index: number): Record<string, unknown>;
  /**
   * A vector env's result columns (vector.ts): the runtime reads each env's mask and episode end
   * from them, for every env at once, instead of from its record. Absent for one-env objects.
   */
  readonly columns?: RunnerColumns;
  /** The env writes `columns` afresh in every call (`VectorEnv.writesColumns`): a backend may adopt them. */
  readonly writesColumns?: boolean;
  /** The envs step on threads of their own (`VectorEnv.stepsOnOwnThreads`): waiters sleep. */
  readonly stepsOnOwnThreads?: boolean;
  /**
   * The envs reset themselves under NEXT_STEP (a vector env's `autoresetNextStep`): a done env
   * is stepped (its action ignored), not reset by the runtime.
   */
  readonly autoresetNextStep?: boolean;
  close(): void;
}

/** An env an asynchronous op finished: its result is in the caller's records (error null), or what it threw. */
export interface AsyncDone {
  readonly index: number;
  /** SAME_STEP: its step ended an episode; the final result was kept (`Records.keepFinal`). */
  readonly ended: boolean;
  readonly error: unknown;
}

/**
 * A runner whose envs run concurrently (worker threads): each submitted env steps on its own
 * and is reported as soon as it finishes (Python: `WorkerPool.submit` / `poll`).
 */
export interface ConcurrentRunner {
  /** Start env `ids[k]`'s op `ops[i]` (STEP with `actions[i]`, or RESET unseeded) under `mode`. */
  submit(ids: readonly number[], ops: Uint8Array, actions: Float64Array, mode: AutoReset): void;
  /** Up to `want` finished envs, without waiting; their results are copied into `out`. */
  take(want: number, out: Records): AsyncDone[];
  /** `want` finished envs (fewer only when fewer are submitted), waiting without blocking the event loop. */
  poll(want: number, out: Records): Promise<AsyncDone[]>;
  /**
   * Block this thread up to `timeoutMs` until another submitted env finishes (the shm server's
   * loop, which waits synchronously in short slices anyway); returns at once if one is ready.
   */
  waitSync(timeoutMs: number): void;
  /** Envs submitted and not taken yet. */
  readonly submitted: number;
}

/** Reads whether a result record ends an episode (the schema's done, else terminated / truncated). */
export function episodeEndReader(schema: SchemaModule): (dv: DataView, at: number) => boolean {
  const result = bodyCodec(schema, "STEP_RESP");
  const ends = episodeEndFields(schema.ir.structs[result.name]).map((f) => ({ at: f.offset, read: readerOf(schema, f).read }));
  return (dv, at) => ends.some((end) => end.read(dv, at + end.at) !== 0);
}

/**
 * An action's type: one integer (Discrete: `elements` 1) or an array of `elements` integers
 * (MultiDiscrete) or floats (Box). `size` is one action's bytes (the stride of contiguous
 * actions), `elemSize` one element's; integers are read byte by byte, floats little-endian.
 */
export interface ActionType {
  readonly size: number;
  readonly elemSize: 1 | 2 | 4 | 8;
  readonly signed: boolean;
  readonly float: boolean;
  readonly elements: number;
}

const ACTION_TYPES: Readonly<Record<string, ActionType>> = {
  i8: { size: 1, elemSize: 1, signed: true, float: false, elements: 1 },
  u8: { size: 1, elemSize: 1, signed: false, float: false, elements: 1 },
  i16: { size: 2, elemSize: 2, signed: true, float: false, elements: 1 },
  u16: { size: 2, elemSize: 2, signed: false, float: false, elements: 1 },
  i32: { size: 4, elemSize: 4, signed: true, float: false, elements: 1 },
  u32: { size: 4, elemSize: 4, signed: false, float: false, elements: 1 },
};
/** Element types of a Box action (an f32/f64 array). */
const FLOAT_ACTION_TYPES: Readonly<Record<string, ActionType>> = {
  f32: { size: 4, elemSize: 4, signed: true, float: true, elements: 1 },
  f64: { size: 8, elemSize: 8, signed: true, float: true, elements: 1 },
};

/** A field's element type, enums resolved to their integer type ("i32" for "i32[8]"). */
export function elementType(schema: SchemaModule, field: FieldJson): string {
  const bracket = field.type.indexOf("[");
  const type = bracket < 0 ? field.type : field.type.slice(0, bracket);
  return schema.ir.enums[type]?.type ?? type;
}

/**
 * The action type of `field`, which holds `seats` actions (a STEP_MULTI field) or one. `arrays`:
 * the caller carries array actions (Box, MultiDiscrete: the env runtime); else an array action
 * is refused with a ProtocolError (the Node clients send one integer per env).
 */
export function actionTypeOf(schema: SchemaModule, field: FieldJson, what: string, seats = 1, arrays = false): ActionType {
  const type = elementType(schema, field);
  const elements = field.count / seats;
  const isArray = fieldDims(field).length > (seats > 1 ? 1 : 0);
  if (isArray && !arrays) {
    throw new ProtocolError(
      `the ${what} field ${field.name} has type ${field.type}: this side carries one 8-32 bit integer action per env`,
    );
  }
  const base = ACTION_TYPES[type] ?? (isArray ? FLOAT_ACTION_TYPES[type] : undefined);
  if (base === undefined) {
    throw new ProtocolError(
      `the ${what} field ${field.name} has type ${type}: actions must be 8-32 bit integers, or arrays of them or of f32/f64`,
    );
  }
  return elements === 1 ? base : { ...base, size: base.elemSize * elements, elements };
}

/**
 * Read `count` actions at `buf[at + i * stride]` into `into[first + i]` (no allocation); an
 * array action's elements go to `into[(first + i) * elements + j]`.
 */
export function readActions(
  into: Float64Array,
  buf: Uint8Array,
  at: number,
  stride: number,
  count: number,
  type: ActionType,
  first = 0,
): void {
  if (type.elements !== 1 || type.float) {
    readArrayActions(into, buf, at, stride, count, type, first);
    return;
  }
  for (let i = 0; i < count; i++) into[first + i] = readInteger(buf, at + i * stride, type.elemSize, type.signed);
}

/** One little-endian integer of `size` bytes at `buf[p]`, read byte by byte (no DataView). */
function readInteger(buf: Uint8Array, p: number, size: number, signed: boolean): number {
  let value: number;
  if (size === 4) {
    value =
      (buf[p] as number) |
      ((buf[p + 1] as number) << 8) |
      ((buf[p + 2] as number) << 16) |
      ((buf[p + 3] as number) << 24);
    if (!signed) value >>>= 0;
  } else if (size === 2) {
    value = (buf[p] as number) | ((buf[p + 1] as number) << 8);
    if (signed) value = (value << 16) >> 16;
  } else {
    value = buf[p] as number;
    if (signed) value = (value << 24) >> 24;
  }
  return value;
}

/** `readActions` for array (and float) actions: element j of action i at `at + i * stride + j * elemSize`. */
function readArrayActions(
  into: Float64Array,
  buf: Uint8Array,
  at: number,
  stride: number,
  count: number,
  type: ActionType,
  first: number,
): void {
  const dv = type.float ? new DataView(buf.buffer, buf.byteOffset, buf.byteLength) : null;
  const k = type.elements;
  const size = type.elemSize;
  for (let i = 0; i < count; i++) {
    for (let j = 0; j < k; j++) {
      const p = at + i * stride + j * size;
      into[(first + i) * k + j] =
        dv === null ? readInteger(buf, p, size, type.signed) : size === 4 ? dv.getFloat32(p, true) : dv.getFloat64(p, true);
    }
  }
}

/** Write one integer action at `buf[at]` (the shm client's request field). */
export function writeAction(buf: Uint8Array, at: number, value: number, type: ActionType): void {
  for (let b = 0; b < type.size; b++) buf[at + b] = (value >>> (8 * b)) & 0xff;
}

/** Write one array action (Box: floats; MultiDiscrete: integers), `type.elements` values, at
 * `buf[at]`, little-endian; the server checks bounds and finiteness (ActionRule). */
export function writeArrayAction(
  buf: Uint8Array,
  at: number,
  values: ArrayLike<number>,
  type: ActionType,
  view: DataView | null = null,
): void {
  if (values.length !== type.elements) {
    throw new RangeError(`an action of this schema has ${type.elements} elements, got ${values.length}`);
  }
  const dv = type.float ? (view ?? new DataView(buf.buffer, buf.byteOffset, buf.byteLength)) : null;
  for (let j = 0; j < type.elements; j++) {
    const p = at + j * type.elemSize;
    const v = values[j] as number;
    if (dv === null) {
      for (let b = 0; b < type.elemSize; b++) buf[p + b] = ((v | 0) >>> (8 * b)) & 0xff;
    } else if (type.elemSize === 4) {
      dv.setFloat32(p, v, true);
    } else {
      dv.setFloat64(p, v, true);
    }
  }
}

/** The struct of a message's body; a clear error when the schema lacks it. */
export function bodyCodec(schema: SchemaModule, message: string): AnyStructCodec {
  const body = schema.messages[message]?.body;
  if (body === undefined || body === null) {
    throw new ProtocolError(`message ${message} of schema ${schema.name} has no body struct`);
  }
  const codec = schema.structs[body];
  if (codec === undefined) throw new ProtocolError(`schema ${schema.name} has no struct ${body}`);
  return codec;
}

/** The field of `struct` with the first of `roles` it has, or null. */
export function fieldWithRole(schema: SchemaModule, struct: string, ...roles: string[]): FieldJson | null {
  const fields = schema.ir.structs[struct]?.fields ?? [];
  for (const role of roles) {
    const field = fields.find((f) => f.role === role);
    if (field) return field;
  }
  return null;
}

/**
 * The STEP_REQ body's action field and type (every backend reads actions this way). `arrays`:
 * the caller carries Box / MultiDiscrete actions (the runtime's servers do; the clients do not).
 */
export function stepAction(
  schema: SchemaModule,
  arrays = false,
): { field: FieldJson; type: ActionType; size: number } {
  const request = bodyCodec(schema, "STEP_REQ");
  const field = fieldWithRole(schema, request.name, "action");
  if (field === null) throw new ProtocolError("the STEP_REQ body struct has no field with role 'action'");
  return { field, type: actionTypeOf(schema, field, "STEP_REQ action", 1, arrays), size: request.size };
}

/**
 * What one action may be, from the schema's action field (docs/schema.md, "Actions"; Python's
 * `ActionRule`): `discrete` (one integer in 0..actN-1), `multi_discrete` (integers, each in its
 * declared low..high; low defaults to 0) or `box` (floats, finite unless `allow_nonfinite`,
 * inside the declared low..high).
 */
export class ActionRule {
  readonly kind: "discrete" | "multi_discrete" | "box";
  /** Elements of one action (1: Discrete). */
  readonly elements: number;
  readonly low: Float64Array | null;
  readonly high: Float64Array | null;
  readonly finite: boolean;

  constructor(schema: SchemaModule) {
    const { field, type } = stepAction(schema, true);
    this.elements = type.elements;
    const isArray = fieldDims(field).length > 0;
    this.kind = !isArray ? "discrete" : type.float ? "box" : "multi_discrete";
    this.low = boundOf(field.low, this.elements) ?? (this.kind === "multi_discrete" ? new Float64Array(this.elements) : null);
    this.high = boundOf(field.high, this.elements);
    this.finite = field.allow_nonfinite !== true;
  }
}

/**
 * Env `index`'s action as its env's `step` receives it, from the runtime's actions (`elements`
 * entries per env): a number (Discrete), else an owned Float64Array of the action's elements in
 * row-major order (Box, MultiDiscrete, any shape; the env may keep it). The one rule of every
 * runner: in this thread (local.ts) and in a pool's worker threads (pool.ts).
 */
export function actionOf(
  rule: Pick<ActionRule, "kind" | "elements">,
  actions: Float64Array,
  index: number,
): Action {
  if (rule.kind === "discrete") return actions[index] as number;
  const k = rule.elements;
  return actions.slice(index * k, (index + 1) * k);
}

function boundOf(bound: string | readonly string[] | undefined, elements: number): Float64Array | null {
  if (bound === undefined) return null;
  if (typeof bound === "string") return new Float64Array(elements).fill(Number(bound));
  return Float64Array.from(bound, Number);
}

/**
 * Env `index`'s action (`actions[index * elements ..]`) against its type's rule: INVALID_ACTION
 * naming the env when refused (the same texts as Python's `check_action_value`).
 */
export function checkActionValue(rule: ActionRule, actions: Float64Array, index: number, actN: number, seat = -1): void {
  const k = rule.elements;
  const where = seat < 0 ? "" : ` of seat ${seat}`;
  if (rule.kind === "discrete") {
    const action = actions[index] as number;
    if (!(action >= 0 && action < actN)) {
      throw new RequestError(ErrorCode.INVALID_ACTION, `env ${seat < 0 ? index : 0}: action ${action}${where} is outside 0..${actN - 1}`);
    }
    return;
  }
  const low = rule.low;
  const high = rule.high;
  let bad = false;
  for (let j = 0; j < k; j++) {
    const v = actions[index * k + j] as number;
    if (Number.isNaN(v)) bad = bad || rule.finite;
    else if (rule.finite && !Number.isFinite(v)) bad = true;
    else if ((low !== null && v < (low[j] as number)) || (high !== null && v > (high[j] as number))) bad = true;
  }
  if (!bad) return;
  const shown = Array.from(actions.subarray(index * k, (index + 1) * k)).join(", ");
  const range = `${low === null ? "-inf" : `[${Array.from(low).join(", ")}]`}..${high === null ? "inf" : `[${Array.from(high).join(", ")}]`}`;
  const finite = rule.kind === "box" && rule.finite ? " and finite" : "";
  const env = seat < 0 ? index : 0;
  const seatText = seat < 0 ? "" : `seat ${seat}: `;
  // NaN or +-inf that the bounds alone let through (none declared, or -inf under a high only):
  // "not finite", not "not inside -inf..inf" (Python's ActionRule.describe says the same)
  let inside = true;
  let nonFinite = false;
  for (let j = 0; j < k; j++) {
    const v = actions[index * k + j] as number;
    if (!Number.isFinite(v)) nonFinite = true;
    if ((low !== null && !(v >= (low[j] as number))) || (high !== null && !(v <= (high[j] as number)))) inside = false;
  }
  const why = finite !== "" && inside && nonFinite ? "is not finite" : `is not inside ${range}${finite}`;
  throw new RequestError(ErrorCode.INVALID_ACTION, `env ${env}: ${seatText}action [${shown}] ${why}`);
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

/**
 * What a server does with an action its env's mask forbids (Python's `MASKED_ACTION_POLICIES`):
 * "reject" answers MASKED_ACTION; "pass" steps the env with it; "noop" does not step that env and
 * returns its previous result with the env's `maskedActionPenalty` (default 0) as reward.
 */
export type MaskedActions = "reject" | "pass" | "noop";
export const MASKED_ACTION_POLICIES: readonly MaskedActions[] = ["reject", "pass", "noop"];

/** `policy` as a MaskedActions; a TransportError naming the choices otherwise. */
export function checkMaskedActions(policy: string): MaskedActions {
  const found = MASKED_ACTION_POLICIES.find((p) => p === policy);
  if (found === undefined) {
    throw new TransportError(`maskedActions ${JSON.stringify(policy)}: expected one of ${MASKED_ACTION_POLICIES.join(", ")}`);
  }
  return found;
}

/** An env's `maskedActionPenalty` (the reward of a "noop" masked action), else 0. */
export function penaltyOf(env: unknown): number {
  const value = (env as { maskedActionPenalty?: unknown } | null)?.maskedActionPenalty ?? 0;
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new TransportError(`maskedActionPenalty must be a finite number, not ${String(value)}`);
  }
  return value;
}

/** Options of a runtime. */
export interface RuntimeOptions {
  /** The seed of the first unseeded reset (env i gets seed + i). */
  readonly firstSeed?: bigint | number | null;
  /** What a masked action does (default "reject"). */
  readonly maskedActions?: MaskedActions;
  /** "noop": the reward of a masked action, per env (default 0). */
  readonly penalties?: readonly number[];
}

type Writer = (dv: DataView, at: number, value: number) => void;

const WRITERS: Readonly<Record<string, Writer>> = {
  f32: (dv, at, v) => dv.setFloat32(at, v, true),
  f64: (dv, at, v) => dv.setFloat64(at, v, true),
  i8: (dv, at, v) => dv.setInt8(at, v),
  u8: (dv, at, v) => dv.setUint8(at, v),
  i16: (dv, at, v) => dv.setInt16(at, v, true),
  u16: (dv, at, v) => dv.setUint16(at, v, true),
  i32: (dv, at, v) => dv.setInt32(at, v, true),
  u32: (dv, at, v) => dv.setUint32(at, v, true),
  i64: (dv, at, v) => dv.setBigInt64(at, BigInt(v), true),
  u64: (dv, at, v) => dv.setBigUint64(at, BigInt(v), true),
};

/** Refuse a noop penalty the reward field cannot hold exactly (an i16 reward turned -0.5 into 0). Python: `penalty_of`. */
function checkPenalties(penalties: readonly number[], name: string, type: string): void {
  const bounds = Object.prototype.hasOwnProperty.call(INTEGER_RANGES, type) ? INTEGER_RANGES[type as IntegerType] : undefined;
  if (bounds === undefined) return;
  for (const penalty of penalties) {
    if (!Number.isInteger(penalty) || BigInt(penalty) < bounds[0] || BigInt(penalty) > bounds[1]) {
      throw new TransportError(
        `maskedActionPenalty = ${penalty} does not fit the reward field "${name}" (${type}: whole numbers ${bounds[0]}..${bounds[1]})`,
      );
    }
  }
}

/** N envs of one client: the checks, seeds, auto-reset, finals, recovery, seats, OBSERVE. */
export class EnvRuntime {
  readonly schema: SchemaModule;
  readonly runner: Runner;
  readonly numEnvs: number;
  readonly spaces: Spaces;
  /** The result struct (STEP_RESP body): records are `result.size` bytes. */
  readonly result: AnyStructCodec;
  readonly firstSeed: bigint | null;
  /** The auto-reset mode (HELLO; disabled until then). */
  autoreset: AutoReset = AutoReset.DISABLED;
  /** Seats of a STEP_MULTI (the schema's `[env] seats`, seed 000: 8). */
  readonly seats: number;
  /**
   * The request's actions (length max(N, seats) x elements): a backend reads them here, then
   * calls step. An array action (Box, MultiDiscrete) takes `actionRule.elements` entries.
   */
  readonly actions: Float64Array;
  /** What one action may be (the per-type check). */
  readonly actionRule: ActionRule;
  /** What a masked action does (the HELLO info's `masked_actions`). */
  readonly maskedActions: MaskedActions;

  readonly #penalties: readonly number[];
  /** The result's reward field (written by a "noop" masked action); null without one. */
  readonly #reward: { name: string; at: number; write: Writer } | null;
  /** Per env: this request's action is a masked "noop" (the env does not step). */
  readonly #noop: Uint8Array;
  readonly #mask: { name: string; at: number; read: Reader; size: number; count: number } | null;
  /** The result fields whose truth ends an episode (`episodeEndFields`). */
  readonly #ends: ReadonlyArray<{ name: string; at: number; read: Reader; count: number }>;
  /** Every episode-end field is one byte (u8 / bool): read straight from the record's bytes. */
  readonly #endsAreBytes: boolean;
  /** The mask is needed (checked) only under "reject" and "noop"; "pass" never reads it. */
  readonly #keepMasks: boolean;
  readonly #masks: Uint8Array;
  /** `#masks` as u32 words when each env's mask is whole words of u8 entries (LE host), else null. */
  readonly #maskWords: Uint32Array | null;
  readonly #isDone: Uint8Array;
  readonly #wasReset: Uint8Array;
  readonly #ops: Uint8Array;
  readonly #failed: Uint8Array;
  readonly #oneEnv: Uint8Array; // finishAsync: the env the watchdog counts
  readonly #seeds: Array<bigint | null>;
  /** Decision-boundary runs: the no-progress watchdog the schema declares (else null). */
  readonly watchdog: ProgressWatchdog | null;
  #seatActions: Int32Array | null = null;
  #dv: DataView | null = null;
  #dvBytes: Uint8Array | null = null;

  constructor(schema: SchemaModule, runner: Runner, options: RuntimeOptions = {}) {
    if (runner.numEnvs < 1) throw new TransportError("a runtime needs at least one env");
    this.schema = schema;
    this.runner = runner;
    this.numEnvs = runner.numEnvs;
    const seed = options.firstSeed;
    this.firstSeed = seed === undefined || seed === null ? null : BigInt(seed);
    this.result = bodyCodec(schema, "STEP_RESP");
    this.spaces = checkedSpaces(runner.spaces());
    checkDeclaredAction(this.spaces, schema);
    const n = this.numEnvs;
    // as in Python, the mask is checked for actions below its length (normally act_n)
    this.actionRule = new ActionRule(schema);
    // the mask is over Discrete actions; an array action has none
    const maskField = this.actionRule.kind === "discrete" ? fieldWithRole(schema, this.result.name, "action_mask") : null;
    this.#mask = maskField
      ? { name: maskField.name, at: maskField.offset, ...readerOf(schema, maskField), count: maskField.count }
      : null;
    const endFields = episodeEndFields(schema.ir.structs[this.result.name]);
    this.#ends = endFields.map((f) => ({ name: f.name, at: f.offset, read: readerOf(schema, f).read, count: f.count }));
    this.#endsAreBytes = endFields.every((f) => readerOf(schema, f).size === 1);
    this.#masks = new Uint8Array(n * (this.#mask?.count ?? 0));
    const wordMask = this.#mask !== null && this.#mask.size === 1 && this.#mask.count % 4 === 0 && LITTLE_ENDIAN_HOST;
    this.#maskWords = wordMask ? new Uint32Array(this.#masks.buffer, 0, this.#masks.byteLength / 4) : null;
    this.#isDone = new Uint8Array(n);
    this.#wasReset = new Uint8Array(n);
    this.#ops = new Uint8Array(n);
    this.#failed = new Uint8Array(n);
    this.#oneEnv = new Uint8Array(n);
    this.#seeds = new Array<bigint | null>(n).fill(null);
    this.seats = schema.ir.env?.seats ?? SEATS;
    this.actions = new Float64Array(Math.max(n, this.seats) * this.actionRule.elements);
    this.maskedActions = checkMaskedActions(options.maskedActions ?? "reject");
    this.#keepMasks = this.#mask !== null && this.maskedActions !== "pass";
    this.#penalties = options.penalties ?? [];
    const rewardField = fieldWithRole(schema, this.result.name, "reward");
    const write = rewardField && rewardField.count === 1 ? WRITERS[elementType(schema, rewardField)] : undefined;
    if (rewardField && this.maskedActions === "noop") checkPenalties(this.#penalties, rewardField.name, elementType(schema, rewardField));
    this.#reward = rewardField && write ? { name: rewardField.name, at: rewardField.offset, write } : null;
    this.#noop = new Uint8Array(n);
    this.watchdog = ProgressWatchdog.of(schema, n);
  }

  /** Has env 0 a `stepBatch` this runtime can drive (a 1-env runtime in this thread)? */
  get hasSeats(): boolean {
    return this.numEnvs === 1 && this.runner.stepSeats !== null;
  }

  /** Whether env `index` failed in the last request (asynchronous batches: report it at RECV). */
  failedLast(index: number): boolean {
    return this.#failed[index] === 1;
  }

  /**
   * A fresh session on the same envs (a second HELLO on a connection, docs/protocol.md "Session"):
   * every env is NOT_RESET until the client resets it (Python: `forget_resets`).
   */
  forgetResets(): void {
    this.#wasReset.fill(0);
  }

  /** Whether env `index` has been reset (and not lost since). */
  wasReset(index: number): boolean {
    return this.#wasReset[index] === 1;
  }

  close(): void {
    this.runner.close();
  }

  // -- requests ------------------------------------------------------------------------------------

  /**
   * Reset envs [from, to): env i with `seeds(i)`, or with the first seed + i on the runtime's
   * first unseeded reset. Throws a RequestError (ENV_ERROR after recovery) when an env failed.
   */
  reset(out: Records, seedOf: (index: number) => bigint | null, from = 0, to = this.numEnvs): void {
    this.#whole(from, to);
    const first = this.firstSeed !== null && !this.#wasReset.includes(1) ? this.firstSeed : null;
    const seeds = this.#seeds;
    const ops = this.#ops;
    ops.fill(Op.NONE);
    for (let i = from; i < to; i++) {
      const seed = seedOf(i);
      seeds[i] = seed !== null ? seed : first === null ? null : first + BigInt(i);
      ops[i] = Op.RESET;
    }
    const failures = this.#run(out);
    for (let i = from; i < to; i++) if (!this.#failed[i]) this.#wasReset[i] = 1;
    for (let i = from; i < to; i++) this.watchdog?.reset(i);
    if (failures !== null) throw this.#recover(failures, out, true);
  }

  /** Reset every env, env i with `seed + i` (null: unseeded, or the first seed + i). */
  resetAll(out: Records, seed: bigint | null): void {
    this.reset(out, seed === null ? noSeed : (i) => seed + BigInt(i));
  }

  /**
   * Step envs [from, to) with `actions[i]`, honouring the auto-reset mode: every action is
   * checked first (NEXT_STEP: a done env's action is ignored, not checked), then every env
   * steps; SAME_STEP keeps an ending step's result as a final and resets the env.
   */
  step(out: Records, from = 0, to = this.numEnvs, only: Uint8Array | null = null): void {
    if (only === null) this.#whole(from, to);
    const actions = this.actions;
    const ops = this.#ops;
    const nextStep = this.autoreset === AutoReset.NEXT_STEP;
    const isDone = this.#isDone;
    const wasReset = this.#wasReset;
    const noop = this.#noop;
    let noops = false;
    for (let i = from; i < to; i++) {
      noop[i] = 0;
      if (only !== null && !only[i]) continue; // asynchronous batches: the envs sent
      if (nextStep && isDone[i] && wasReset[i]) continue;
      if (this.#checkAction(i, actions[i] as number)) {
        noop[i] = 1;
        noops = true;
      }
    }
    ops.fill(Op.NONE);
    const seeds = this.#seeds;
    for (let i = from; i < to; i++) {
      if (only !== null && !only[i]) continue;
      if (nextStep && isDone[i] && wasReset[i]) {
        ops[i] = this.runner.autoresetNextStep === true ? Op.STEP : Op.RESET; // the action of a done env is ignored
        seeds[i] = null;
      } else if (!noop[i]) {
        ops[i] = Op.STEP;
      }
    }
    let failures = this.#run(out);
    // the watchdog counts the envs that stepped (not reset, not a noop, not failed)
    const stepped = this.watchdog === null ? null : ops.map((op, i) => (op === Op.STEP && !this.#failed[i] ? 1 : 0));
    if (noops) for (let i = from; i < to; i++) if (noop[i]) this.#noopResult(i, out);
    if (this.autoreset === AutoReset.SAME_STEP) {
      let ended = false;
      for (let i = from; i < to; i++) {
        if (ops[i] === Op.STEP && !this.#failed[i] && isDone[i]) {
          out.keepFinal(i);
          ended = true;
        }
      }
      if (ended) {
        for (let i = from; i < to; i++) {
          const reset = ops[i] === Op.STEP && !this.#failed[i] && isDone[i];
          ops[i] = reset ? Op.RESET : Op.NONE;
          seeds[i] = null;
          if (reset && stepped !== null) stepped[i] = 0; // its result is the reset's
        }
        const more = this.#run(out);
        if (more !== null) failures = failures === null ? more : [...failures, ...more].sort((a, b) => a[0] - b[0]);
      }
    }
    if (failures === null && stepped !== null && this.watchdog !== null) {
      failures = this.watchdog.check(out, stepped, from, to);
      if (failures !== null) for (const [i] of failures) ops[i] = Op.STEP; // named as the STEP it was
    }
    if (failures !== null) {
      const error = this.#recover(failures, out, false);
      // the recovery ran ops of its own: `failedLast` says again which envs failed this step
      // (an asynchronous SEND takes them out of flight and reports them at RECV)
      for (const [i] of failures) this.#failed[i] = 1;
      throw error;
    }
  }

  /**
   * Asynchronous batches on a concurrent runner: check the actions of env `ids` (every one
   * first, as `step`: a refused SEND starts nothing) and choose each env's op into `ops[i]`:
   * STEP; RESET for a done env under NEXT_STEP (its action is ignored); NONE for a masked
   * "noop" action, whose result is written into `out` now.
   */
  planAsync(ids: readonly number[], ops: Uint8Array, out: Records): void {
    const nextStep = this.autoreset === AutoReset.NEXT_STEP;
    const isDone = this.#isDone;
    const wasReset = this.#wasReset;
    const noop = this.#noop;
    const actions = this.actions;
    for (const i of ids) {
      noop[i] = 0;
      if (nextStep && isDone[i] && wasReset[i]) continue;
      if (this.#checkAction(i, actions[i] as number)) noop[i] = 1;
    }
    for (const i of ids) {
      if (nextStep && isDone[i] && wasReset[i]) ops[i] = this.runner.autoresetNextStep === true ? Op.STEP : Op.RESET;
      else if (noop[i]) {
        ops[i] = Op.NONE;
        this.#noopResult(i, out);
      } else ops[i] = Op.STEP;
    }
  }

  /**
   * Env `index` finished an asynchronous op (`done`) and its result is in `out`: remember its
   * mask and episode end, and count it in the no-progress watchdog as a lock-step step is
   * (`stepped`: its op was a STEP; a reset, or a SAME_STEP end whose result is the reset's,
   * restarts the count). The env's NoProgressError when it made no progress, else null.
   */
  finishAsync(done: AsyncDone, out: Records, stepped: boolean): Failure | null {
    const index = done.index;
    this.#remember(index, out);
    out.written(index);
    const watchdog = this.watchdog;
    if (watchdog === null) return null;
    if (!stepped || done.ended) {
      watchdog.reset(index);
      return null;
    }
    const one = this.#oneEnv;
    one.fill(0);
    one[index] = 1;
    return watchdog.check(out, one, index, index + 1)?.[0] ?? null;
  }

  /** Recover the envs that failed asynchronous ops (reset, else recreate); the ERROR to answer. */
  recoverAsync(failures: readonly Failure[], out: Records): RequestError {
    return this.#recover(failures, out, false, () => "SEND (asynchronous step)");
  }

  /** Refuse a STEP_MULTI this runtime cannot take: it needs `seats` envs or one env with stepBatch. */
  checkMulti(): void {
    if (this.numEnvs !== this.seats && !this.hasSeats) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        `STEP_MULTI_REQ needs an ${this.seats}-env server or one vector env with a batch step; this one has ${this.numEnvs} envs`,
      );
    }
  }

  /**
   * STEP_MULTI with `actions[0..seats)`: one `stepBatch` call (true: the seat results are in
   * records 0..seats-1, no auto-reset) or a step of each of `seats` envs (false: as `step`).
   */
  stepMulti(out: Records): boolean {
    this.checkMulti();
    if (this.hasSeats) {
      this.stepSeats(out, this.seats);
      return true;
    }
    this.step(out);
    return false;
  }

  /**
   * STEP_MULTI to a 1-env runtime whose env has `stepBatch`: one action per seat
   * (`actions[0..seats)`), the seat results in records 0..seats-1. The seats do not auto-reset.
   */
  stepSeats(out: Records, seats = this.seats): void {
    const stepSeats = this.numEnvs === 1 ? this.runner.stepSeats : null;
    if (stepSeats === null) throw new TransportError("this runtime's env has no stepBatch");
    if (this.autoreset !== AutoReset.DISABLED) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        "STEP_MULTI_REQ to an env with stepBatch: the env's seats do not auto-reset " +
          "(connect with autoreset disabled)",
      );
    }
    if (!this.#wasReset[0] || this.#isDone[0]) this.#checkAction(0, 0); // NOT_RESET
    if (this.actionRule.kind !== "discrete") {
      throw new RequestError(ErrorCode.BAD_BATCH, "STEP_MULTI_REQ to an env with stepBatch takes Discrete actions");
    }
    const actN = this.spaces.actN;
    if (this.#seatActions === null || this.#seatActions.length !== seats) this.#seatActions = new Int32Array(seats);
    const actions = this.#seatActions; // reused: valid during the call
    for (let seat = 0; seat < seats; seat++) {
      const action = this.actions[seat] as number;
      if (!(action >= 0 && action < actN)) {
        throw new RequestError(
          ErrorCode.INVALID_ACTION,
          `env 0: action ${action} of seat ${seat} is outside 0..${actN - 1}`,
        );
      }
      actions[seat] = action;
    }
    try {
      stepSeats(actions, out);
    } catch (error) {
      throw this.#recover([[0, error]], out, false, () => `STEP_MULTI seat actions [${Array.from(actions).map(String).join(", ")}]`);
    }
    this.#remember(0, out);
    for (let seat = 0; seat < seats; seat++) out.written(seat);
  }

  /**
   * OBSERVE: every env's current result (its `observe()`, else its last result) into its record,
   * no auto-reset and no checks of done; NOT_RESET for an env never reset. Returns the envs'
   * `info()` maps.
   */
  observe(out: Records): Array<Record<string, unknown>> {
    for (let i = 0; i < this.numEnvs; i++) {
      if (!this.#wasReset[i]) {
        throw new RequestError(ErrorCode.NOT_RESET, `env ${i}: observe before the first reset`);
      }
    }
    this.#ops.fill(Op.OBSERVE);
    const failures = this.#run(out);
    if (failures !== null) throw this.#recover(failures, out, false);
    const infos: Array<Record<string, unknown>> = [];
    for (let i = 0; i < this.numEnvs; i++) infos.push(this.runner.info(i));
    return infos;
  }

  // -- internals -----------------------------------------------------------------------------------

  /** A pool runs whole batches only: a request for a subset of the envs is BAD_BATCH. */
  #whole(from: number, to: number): void {
    if (this.runner.wholeBatchOnly && (from !== 0 || to !== this.numEnvs)) {
      throw new RequestError(ErrorCode.BAD_BATCH, `env ${from}: a worker pool steps and resets every env together`);
    }
  }

  /** Run `#ops`; mark failures; remember mask and done of every env that did its op. */
  #run(out: Records): Failure[] | null {
    const ops = this.#ops;
    const failed = this.#failed;
    failed.fill(0);
    const failures = this.runner.run(ops, this.actions, this.#seeds, out);
    if (failures !== null) for (const [i] of failures) failed[i] = 1;
    const columns = this.runner.columns;
    if (columns !== undefined) this.#rememberColumns(columns, ops, failed);
    const n = this.numEnvs;
    for (let i = 0; i < n; i++) {
      if (ops[i] === Op.NONE || failed[i]) continue;
      if (columns === undefined) this.#remember(i, out);
      out.written(i);
    }
    return failures;
  }

  /** Read env `index`'s mask and episode end from its record. */
  #remember(index: number, out: Records): void {
    const bytes = out.bytes;
    const at = out.at(index);
    const mask = this.#mask;
    if (this.#keepMasks && mask !== null) {
      const count = mask.count;
      const base = index * count;
      const masks = this.#masks;
      const start = at + mask.at;
      const words = this.#maskWords;
      if (words !== null) {
        // 4 mask bytes per load and store (a u8 mask of 4k entries, a little-endian host)
        const dv = this.#viewOf(bytes);
        const first = base >> 2;
        for (let w = 0, end = count >> 2; w < end; w++) words[first + w] = dv.getUint32(start + 4 * w, true);
      } else if (mask.size === 1) {
        for (let a = 0; a < count; a++) masks[base + a] = bytes[start + a] as number;
      } else {
        const dv = this.#viewOf(bytes);
        for (let a = 0; a < count; a++) masks[base + a] = mask.read(dv, start + a * mask.size) ? 1 : 0;
      }
    }
    const ends = this.#ends;
    let ended = 0;
    if (this.#endsAreBytes) {
      for (let e = 0; e < ends.length; e++) if (bytes[at + (ends[e] as { at: number }).at]) ended = 1;
    } else {
      const dv = this.#viewOf(bytes);
      for (let e = 0; e < ends.length; e++) {
        const end = ends[e] as { at: number; read: Reader };
        if (end.read(dv, at + end.at)) ended = 1;
      }
    }
    this.#isDone[index] = ended;
  }

  /** A DataView of `bytes` (the last one is kept: the same records every request). */
  #viewOf(bytes: Uint8Array): DataView {
    if (bytes !== this.#dvBytes) {
      this.#dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      this.#dvBytes = bytes;
    }
    return this.#dv as DataView;
  }

  /**
   * A vector env's masks and episode ends, for every env that did its op, from the columns it
   * wrote (one pass each; a whole u8 mask block in one copy).
   */
  #rememberColumns(columns: RunnerColumns, ops: Uint8Array, failed: Uint8Array): void {
    const n = this.numEnvs;
    const mask = this.#mask;
    if (this.#keepMasks && mask !== null) {
      const column = columns.columns[mask.name] as Column;
      const count = mask.count;
      const masks = this.#masks;
      let all = true;
      for (let i = 0; i < n && all; i++) if (ops[i] === Op.NONE || failed[i]) all = false;
      if (all && column instanceof Uint8Array) {
        masks.set(column);
      } else {
        for (let i = 0; i < n; i++) {
          if (ops[i] === Op.NONE || failed[i]) continue;
          for (let k = i * count, end = k + count; k < end; k++) masks[k] = column[k] ? 1 : 0;
        }
      }
    }
    const isDone = this.#isDone;
    const ends = this.#ends;
    for (let i = 0; i < n; i++) if (ops[i] !== Op.NONE && !failed[i]) isDone[i] = 0;
    for (let e = 0; e < ends.length; e++) {
      const end = ends[e] as { name: string; count: number };
      const column = columns.columns[end.name] as Column;
      const count = end.count;
      for (let i = 0; i < n; i++) {
        if (ops[i] !== Op.NONE && !failed[i] && column[i * count]) isDone[i] = 1;
      }
    }
  }

  /**
   * A masked action under "noop": env `index` keeps its previous result (not done: a done env is
   * refused or reset before this) with its penalty as reward.
   */
  #noopResult(index: number, out: Records): void {
    const reward = this.#reward;
    const columns = out.resultColumns;
    if (reward !== null && columns !== undefined && columns !== null && columns === this.runner.columns) {
      // the results are the env's columns (an adopted shm column region)
      const column = columns.columns[reward.name];
      const penalty = this.#penalties[index] ?? 0;
      if (column instanceof BigInt64Array || column instanceof BigUint64Array) column[index] = BigInt(penalty);
      else (column as Float64Array)[index] = penalty;
    } else if (reward !== null) {
      const bytes = out.bytes;
      const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      reward.write(dv, out.at(index) + reward.at, this.#penalties[index] ?? 0);
    }
    out.written(index);
  }

  /** Refuse a bad action (RequestError); true when it is masked out under "noop" (no step). */
  #checkAction(index: number, action: number): boolean {
    if (!this.#wasReset[index]) {
      throw stepBeforeReset(index);
    }
    if (this.#isDone[index]) {
      throw new RequestError(ErrorCode.NOT_RESET, `env ${index}: episode is done; reset first`);
    }
    const rule = this.actionRule;
    if (rule.kind !== "discrete") {
      checkActionValue(rule, this.actions, index, this.spaces.actN);
      return false;
    }
    const actN = this.spaces.actN;
    if (!(action >= 0 && action < actN)) {
      throw new RequestError(ErrorCode.INVALID_ACTION, `env ${index}: action ${action} is outside 0..${actN - 1}`);
    }
    const mask = this.#mask;
    if (mask !== null && action < mask.count && !this.#masks[index * mask.count + action]) {
      if (this.maskedActions === "reject") {
        throw new RequestError(ErrorCode.MASKED_ACTION, `env ${index}: action ${action} is masked out`);
      }
      return this.maskedActions === "noop";
    }
    return false;
  }

  /**
   * Reset (or recreate from the factory) each env that threw; the ERROR to answer. The text
   * starts with `env {i}:` (the first env that failed), so clients can name the env, and ends
   * with the first failure's innermost stack frames (`withTraceback`). Each failure is written
   * once to the server's stderr with its whole stack, the env and the request (`request(i)`, by
   * default the op's message name and action or seed). A reset that failed is retried with the
   * same seed; a step's recovery resets unseeded.
   */
  #recover(
    failures: readonly Failure[],
    out: Records,
    keepSeeds: boolean,
    request: (index: number) => string = (i) => this.#requestName(i),
  ): RequestError {
    const texts: string[] = [];
    const seeds = this.#seeds.slice();
    const named = failures.map(([index]) => request(index)); // before #restore changes the ops
    let trace = "";
    failures.forEach(([index, error], k) => {
      // a worker thread's RequestError carries the last frames after the marker
      const [detail, workerTrace = ""] = failureText(index, error).split(REMOTE_TRACEBACK_MARKER, 2) as [string, string?];
      const fate = this.#restore(index, keepSeeds ? (seeds[index] ?? null) : null, out);
      texts.push(`env ${index}: ${detail} (${fate})`);
      let stack = error instanceof Error && !(error instanceof RequestError) ? error.stack : undefined;
      if (trace === "" && stack !== undefined) trace = remoteTraceback(error);
      if (workerTrace !== "") {
        if (trace === "") trace = workerTrace;
        stack = `${detail}\nlast frames, in a worker:\n${workerTrace}`;
      }
      process.stderr.write(
        `transport: env ${index} raised during ${named[k]} (${fate})` +
          (stack !== undefined ? `\n${stack}\n` : `: ${detail}\n`),
      );
    });
    return new EnvFailureError(withTraceback(texts.join("; "), trace), failures.map(([index]) => index));
  }

  /** The request env `index` was doing, for a log line: its op's message name, action or seed. */
  #requestName(index: number): string {
    const op = this.#ops[index];
    const seed = this.#seeds[index];
    if (op === Op.STEP) {
      const k = this.actionRule.elements;
      const action = Array.from(this.actions.subarray(index * k, index * k + k)).map(String);
      return `STEP action ${k === 1 ? action[0] : `[${action.join(", ")}]`}`;
    }
    if (op === Op.RESET) return seed === null || seed === undefined ? "RESET" : `RESET seed ${seed}`;
    if (op === Op.OBSERVE) return "OBSERVE";
    return "a request";
  }

  /** Reset env `index` after it threw; if that throws too, recreate it from the factory. */
  #restore(index: number, seed: bigint | null, out: Records): string {
    const replaced = this.runner.takeReplaced(index);
    const attempts: Array<readonly [Op, string]> = [[Op.RESET, replaced ?? FATE_RESET]];
    if (this.runner.canRecreate && replaced === null) attempts.push([Op.RECREATE, FATE_RECREATED]);
    const ops = this.#ops;
    for (const [op, fate] of attempts) {
      ops.fill(Op.NONE);
      ops[index] = op;
      this.#seeds[index] = seed;
      if (this.#run(out) === null) {
        this.#wasReset[index] = 1;
        this.watchdog?.reset(index);
        return fate;
      }
    }
    this.#wasReset[index] = 0; // every step is NOT_RESET until a reset succeeds
    return FATE_FAILED;
  }
}

function noSeed(): null {
  return null;
}

// -- decision-boundary runs: the no-progress watchdog ---------------------------------------------

/**
 * An env stopped advancing (the server side; clients raise their own `NoProgressError` from the
 * ENV_ERROR text this one's message makes). Python: `transport.runtime.core.NoProgressError`.
 */
export class NoProgressError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NoProgressError";
  }
}

/**
 * The no-progress watchdog of decision-boundary runs (seed 004), for schemas that declare
 * `[env] max_frames` / `stall_requests` and a result field with role `frames`. After each step it
 * reads every stepped env's `frames`: 0 for `stall_requests` requests in a row, or `>= max_frames`
 * (no decision within the budget), is a NoProgressError whose text carries the env's request
 * numbers since its reset and its last state (JSON), and the runtime recovers from it as from any
 * env exception (the env is reset; the client gets ENV_ERROR). Python: `ProgressWatchdog`.
 */
export class ProgressWatchdog {
  readonly #frames: { at: number; read: Reader };
  readonly #state: ReadonlyArray<{ name: string; at: number; read: Reader; size: number; count: number; array: boolean; bool: boolean }>;
  readonly #maxFrames: number | null;
  readonly #stall: number | null;
  readonly #requests: Float64Array;
  readonly #zeros: Float64Array;

  private constructor(schema: SchemaModule, struct: string, frames: FieldJson, numEnvs: number) {
    const env = schema.ir.env;
    this.#maxFrames = env?.max_frames ?? null;
    this.#stall = env?.stall_requests ?? null;
    this.#frames = { at: frames.offset, read: readerOf(schema, frames).read };
    const state = [];
    for (const field of schema.ir.structs[struct]?.fields ?? []) {
      const type = elementType(schema, field);
      const array = field.count !== 1 || field.type.includes("[");
      const integer = /^[iu]\d+$/.test(type);
      if (READERS[type] === undefined || (array && (!integer || fieldDims(field).length !== 1))) continue;
      const { read, size } = readerOf(schema, field);
      state.push({ name: field.name, at: field.offset, read, size, count: field.count, array, bool: type === "bool" });
    }
    this.#state = state;
    this.#requests = new Float64Array(numEnvs);
    this.#zeros = new Float64Array(numEnvs);
  }

  /** The watchdog a schema declares (null: no decision-boundary runs declared). */
  static of(schema: SchemaModule, numEnvs: number): ProgressWatchdog | null {
    const env = schema.ir.env;
    if (env === undefined || (env.max_frames === undefined && env.stall_requests === undefined)) return null;
    const frames = fieldWithRole(schema, env.result, "frames");
    return frames === null ? null : new ProgressWatchdog(schema, env.result, frames, numEnvs);
  }

  reset(index: number): void {
    this.#requests[index] = 0;
    this.#zeros[index] = 0;
  }

  /** Count one request of each env i in [from, to) with `stepped[i]`; the envs that made no progress. */
  check(out: Records, stepped: Uint8Array, from: number, to: number): Failure[] | null {
    const bytes = out.bytes;
    const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let failures: Failure[] | null = null;
    for (let i = from; i < to; i++) {
      if (!stepped[i]) {
        this.reset(i);
        continue;
      }
      const seq = ++(this.#requests[i] as number);
      const frames = Number(this.#frames.read(dv, out.at(i) + this.#frames.at));
      let why: string;
      let first = seq;
      if (this.#maxFrames !== null && frames >= this.#maxFrames) {
        why = `no decision within ${this.#maxFrames} frames (ran ${frames})`;
      } else if (frames === 0) {
        const zeros = ++(this.#zeros[i] as number);
        if (this.#stall === null || zeros < this.#stall) continue;
        why = `frames 0 for ${zeros} requests in a row`;
        first = seq - zeros + 1;
      } else {
        this.#zeros[i] = 0;
        continue;
      }
      (failures ??= []).push([i, new NoProgressError(this.#text(dv, out.at(i), why, first, seq))]);
      this.reset(i);
    }
    return failures;
  }

  /** The structured text a client parses (the same shape as Python's). */
  #text(dv: DataView, at: number, why: string, first: number, last: number): string {
    const state: Record<string, unknown> = {};
    for (const f of this.#state) {
      const values = [];
      for (let k = 0; k < f.count; k++) {
        const v = f.read(dv, at + f.at + k * f.size);
        values.push(f.bool ? Boolean(v) : Number(v));
      }
      state[f.name] = f.array ? values : values[0];
    }
    return `no progress: ${why} (requests ${first}..${last} since reset); last state: ${JSON.stringify(state)}`;
  }
}
