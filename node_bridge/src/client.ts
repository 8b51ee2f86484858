/**
 * The client API: `connect(url) -> Client` over any registered backend (transport/client.py).
 *
 *   const client = await connect("unix:///tmp/pac.sock");
 *   const first = await client.reset(7n);          // StepResultView (N = 1)
 *   const next = await client.step(3);             // next.observation: Float32Array view
 *   await client.close();
 *
 * Results are zero-copy views into the channel's receive buffer (bodies are placed at
 * BODY_OFFSET, so the f32 observation is an aligned Float32Array over it): valid until the
 * next call on the same client, built once per buffer (a steady-state step allocates no view).
 * `{ copy: true }` returns decoded, owned values instead. With N > 1 envs, `reset` and `step`
 * (one action per env) return one view per env.
 */

import { type Backend, backendFor } from "./backends";
import type { AnyStructCodec, SchemaModule } from "./codec";
import type { Spaces } from "./runtime/env";
import {
  ActionError,
  ConnectError,
  FingerprintMismatchError,
  PeerGoneError,
  ProtocolError,
  RegionInUseError,
  RegionMismatchError,
  RemoteError,
  REPLY_TOO_LARGE_HINT,
  ReplyTooLargeError,
  TransportError,
  TransportTimeoutError,
  VersionMismatchError,
} from "./errors";
import * as pac_env from "./generated/pac_env";
import {
  AUTORESET_MASK,
  AutoReset,
  type AutoResetName,
  BODY_OFFSET,
  DEFAULT_MAX_BODY,
  ErrorCode,
  type MessageIds,
  MESSAGE_IDS,
  SCHEMA_IR_KEY,
  SCHEMA_NAME_KEY,
  autoresetName,
  checkHello,
  decodeError,
  decodeHello,
  encodeGoodbye,
  encodeHelloRequest,
  messageIds,
  mismatchText,
  readFinalTail,
  schemaFromIrText,
  splitRecvTail,
  toAutoReset,
} from "./protocol";
import { decode as msgpackDecode, encode as msgpackEncode } from "@msgpack/msgpack";
import { type ActionType, actionTypeOf, elementType, writeAction } from "./runtime/core";
import { gymDescription } from "./gym_description";
import { fieldDims } from "./ir";
import { type Channel, type ChannelRecords, type Final, timeoutOption } from "./stream";

export const DEFAULT_TIMEOUT_MS = 10_000;

export interface ConnectOptions {
  /** Milliseconds any one wait may take (connecting, each request), a number > 0 (default
   * 10000); null, Infinity or more than 2**31-1 (Node's longest timer): no deadline. */
  readonly timeoutMs?: number | null;
  /** Largest response body accepted (bytes). */
  readonly maxBody?: number;
  /** Schema: pins the session to it (another server schema is refused, both named): a schema
   * module (a generated module's `SCHEMA`, or the generated module itself), or the path of a
   * schema file (`.json` IR, `.toml`, a generated module); omitted, the server's schema is
   * discovered in the handshake (`client.schema`). */
  readonly schema?: SchemaModule | string | { readonly SCHEMA: SchemaModule };
  /**
   * Who resets an env whose episode ended (docs/protocol.md, "Auto-reset"): "disabled" (the
   * client sends a reset; default), "next_step" (the next step of a done env resets it) or
   * "same_step" (the step that ends an episode resets at once; `client.finals` carries the
   * final results).
   */
  readonly autoreset?: AutoReset | AutoResetName;
}

export interface ResultOptions {
  /** Decode owned values instead of returning views into the receive buffer. */
  readonly copy?: boolean;
}

export type { Final } from "./stream";

function bodyCodec(schema: SchemaModule, message: string): AnyStructCodec {
  const body = schema.messages[message]?.body;
  const codec = body ? schema.structs[body] : undefined;
  if (codec === undefined) {
    throw new ProtocolError(`message ${message} of schema ${schema.name} has no body struct`);
  }
  return codec;
}

/** What to do about each client-side transport error, said after its message (Python: `HINTS`). */
const HINTS: ReadonlyArray<readonly [abstract new (...args: never[]) => TransportError, string]> = [
  [RegionInUseError, "close that client first (or end its process), or serve another shm:// name for a second client"],
  [
    ConnectError,
    "is a server serving this URL? start one with `transport-serve URL` or serve(env, URL), or check the URL",
  ],
  [PeerGoneError, "the server closed the connection or died: see the server's log, then connect again"],
  [
    TransportTimeoutError,
    "the connection is kept and the late reply is dropped when it comes: retry, or connect with a " +
      "larger timeoutMs if the server's envs are slow",
  ],
  [ReplyTooLargeError, REPLY_TOO_LARGE_HINT],
  [
    ProtocolError,
    "client and server disagree: check that both use the same transport version and schema, then connect again",
  ],
];

/**
 * `error` with the URL before its message and what to do after it (once; the same object, its
 * class and fields unchanged): every transport error a client throws names both. Other errors
 * pass unchanged. Python: `transport.client.explain`.
 */
export function explain(error: unknown, url: string): unknown {
  if (!(error instanceof TransportError)) return error;
  const hint = hintFor(error);
  if (hint !== null && !error.message.includes(hint)) {
    // a channel's text may name the URL without its query (shm://name, not ?num_envs=4)
    const named = error.message.includes(url.split("?", 1)[0] as string) ? error.message : `${url}: ${error.message}`;
    error.message = `${named} (${hint})`;
  }
  return error;
}

/** Said after a RECV's timeout over the socket backends (shm keeps results for the next recv). */
export const RECV_LATE_HINT =
  "over this backend the envs a timed-out recv was waiting for are taken off the server when they finish, " +
  "and their late results are dropped: they stepped, but their results are lost, so another recv will not " +
  "return them; asyncReset (or reset) to go on from a known state";

/**
 * What to do about `error` (`HINTS`); a num_envs that differs from the server's gets its own: the
 * numbers and the two ways out, not "same version and schema" (not the cause). Python: `hint_for`.
 */
export function hintFor(error: TransportError): string | null {
  if (error instanceof RegionMismatchError && error.field === "num_envs") {
    return (
      `the client asked for ${error.expected} envs (?num_envs=${error.expected} in its URL) and the server serves ` +
      `${error.found}: connect without ?num_envs= to take the server's count, or start the server with num_envs=${error.expected}`
    );
  }
  // this process's own setup (a CURVE key file): no server to start or blame
  if ((error as { localConfig?: unknown }).localConfig === true) return null;
  for (const [kind, hint] of HINTS) if (error instanceof kind) return hint;
  return null;
}

/**
 * The server's ERROR answering a request of an open session. HELLO_REQUIRED there means the
 * server no longer knows the session (a new server on the same URL, or an idle zmq session it
 * dropped): a PeerGoneError, as a closed connection is, not a request to send a HELLO the caller
 * never sends. Python: `session_error`.
 */
export function sessionError(body: Uint8Array): TransportError {
  const error = decodeError(body);
  if (error instanceof RemoteError && error.code === ErrorCode.HELLO_REQUIRED) {
    return new PeerGoneError(
      `the server no longer knows this client's session (a server restarted on this URL, or one that dropped the session): ${error.message}`,
    );
  }
  return error;
}

/**
 * HELLO_REQ / HELLO_RESP on a new channel: the session's schema and the server's info map.
 * `schema` null discovers it (the server answers with its compiled IR, which must hash to the
 * fingerprint it announced). A mismatch names both schemas and the server's URL.
 */
export async function handshake(
  channel: Channel,
  schema: SchemaModule | null,
  autoreset: AutoReset = AutoReset.DISABLED,
  url = "",
): Promise<{ schema: SchemaModule; info: Record<string, unknown> }> {
  const where = `the server at ${url || "?"}`;
  const ids = schema === null ? MESSAGE_IDS : messageIds(schema);
  const type = await channel.request(ids.HELLO_REQ, encodeHelloRequest(schema, autoreset));
  const body = channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength);
  if (type === ids.ERROR) {
    const error = decodeError(body);
    if (error instanceof FingerprintMismatchError) {
      const text = error.message.replace(/^server refused the session: /, "");
      throw new FingerprintMismatchError(`${where} refused the session: ${text}`, schema?.fingerprint ?? 0n, 0n);
    }
    throw error;
  }
  if (type !== ids.HELLO_RESP) {
    throw new ProtocolError(`expected HELLO_RESP, got msg_type 0x${type.toString(16).toUpperCase().padStart(2, "0")}`);
  }
  const hello = decodeHello(body);
  let found: SchemaModule;
  if (schema === null) {
    checkHello(hello, hello.fingerprint, "server"); // the version
    found = schemaFromIrText(hello.info[SCHEMA_IR_KEY], hello.fingerprint, where);
  } else if (hello.fingerprint !== BigInt.asUintN(64, schema.fingerprint)) {
    const serverName = hello.info[SCHEMA_NAME_KEY];
    throw new FingerprintMismatchError(
      `${where}: ${mismatchText(typeof serverName === "string" ? serverName : "", hello.fingerprint, schema.name, schema.fingerprint)}`,
      schema.fingerprint,
      hello.fingerprint,
    );
  } else {
    checkHello(hello, schema.fingerprint, "server");
    found = schema;
  }
  if ((hello.flags & AUTORESET_MASK) !== autoreset) {
    throw new ProtocolError(
      `server answered auto-reset mode ${hello.flags & AUTORESET_MASK}, asked ${autoreset}`,
    );
  }
  // the schema's keys are the handshake's own (client.schema holds the schema)
  const info: Record<string, unknown> = { ...hello.info };
  delete info[SCHEMA_IR_KEY];
  delete info[SCHEMA_NAME_KEY];
  return { schema: found, info: { ...info, autoreset: autoresetName(autoreset) } };
}

/** What `reset` takes: one seed (env i gets seed + i), one seed or null per env, or nothing. */
export type Seeds = bigint | number | null | ReadonlyArray<bigint | number | null>;

/** A step's actions: one integer (1-env server) or one per env; for array actions (Box,
 * MultiDiscrete) one array (1-env server), one per env, or all envs' elements flat. */
export type Actions = number | ArrayLike<number> | ReadonlyArray<ArrayLike<number>>;

/** A RESET_SEEDS_REQ body: one (seed, has_seed) entry per env; null resets that env unseeded. */
/**
 * One seed as the wire carries it (u64): a bigint, or a number that is a safe integer, in
 * 0..2**64-1. Anything else (a string, a fraction, a negative number that would wrap to a huge
 * seed) is refused before any bytes move (Python: `protocol.reset_seed`).
 */
export function seedValue(seed: unknown, method = "reset", where = ""): bigint {
  let value: bigint;
  if (typeof seed === "bigint") value = seed;
  else if (typeof seed === "number" && Number.isSafeInteger(seed)) value = BigInt(seed);
  else {
    const shown = typeof seed === "string" ? JSON.stringify(seed) : String(seed);
    throw new TypeError(`${method}(seed${where}): a seed is an integer (a bigint or a safe integer number), not ${typeof seed} ${shown}`);
  }
  if (value < 0n || value >= 1n << 64n) {
    throw new RangeError(`${method}(seed${where}): a seed must be an integer in 0..2**64-1, not ${value}`);
  }
  return value;
}

export function seedsBody(schema: SchemaModule, seeds: ReadonlyArray<bigint | number | null>, numEnvs: number): Buffer {
  if (!Array.isArray(seeds)) {
    throw new TypeError(`reset(seed): a seed is an integer, or an array of one integer or null per env, not ${typeof seeds}`);
  }
  if (seeds.length !== numEnvs) {
    throw new TransportError(`expected ${numEnvs} seeds (one per env, or null), got ${seeds.length}`);
  }
  const codec = bodyCodec(schema, "RESET_SEEDS_REQ");
  const fields = schema.ir.structs[codec.name]?.fields ?? [];
  const seedAt = fields.find((f) => f.name === "seed")?.offset ?? 0;
  const hasAt = fields.find((f) => f.name === "has_seed")?.offset ?? 8;
  const body = Buffer.alloc(codec.size * numEnvs);
  seeds.forEach((seed, i) => {
    if (seed === null) return;
    const value = seedValue(seed, "reset", `[${i}]`);
    body.writeBigUInt64LE(value, i * codec.size + seedAt);
    body[i * codec.size + hasAt] = 1;
  });
  return body;
}

export { ActionError };

// -- actions: the one rule for what step's argument means (Python: transport.actions.ActionShapes)

const NUMPY_NAMES: Readonly<Record<string, string>> = {
  i8: "int8",
  u8: "uint8",
  i16: "int16",
  u16: "uint16",
  i32: "int32",
  u32: "uint32",
  i64: "int64",
  u64: "uint64",
  f32: "float32",
  f64: "float64",
};

/** A shape as Python prints a tuple: `()`, `(2,)`, `(1, 2)`. */
export function shapeText(shape: readonly number[]): string {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

/** A float as Python's repr prints it (`-1.0`, `0.5`, `inf`). */
function floatText(value: number): string {
  if (value === Infinity) return "inf";
  if (value === -Infinity) return "-inf";
  if (Number.isNaN(value)) return "nan";
  return Number.isInteger(value) ? value.toFixed(1) : String(value);
}

function boundValues(raw: string | readonly string[] | undefined, count: number): number[] | null {
  if (raw === undefined) return null;
  return typeof raw === "string" ? new Array<number>(count).fill(Number(raw)) : raw.map(Number);
}

function boundText(values: number[] | null, fallback: number): string {
  if (values === null) return floatText(fallback);
  if (values.every((v) => v === values[0])) return floatText(values[0] as number);
  return `[${values.map(floatText).join(", ")}]`;
}

function multiDiscreteText(nvec: readonly number[], start: readonly number[]): string {
  const starts = start.some((v) => v !== 0) ? `, start=[${start.map((v) => String(Math.trunc(v))).join(", ")}]` : "";
  return `MultiDiscrete([${nvec.map((n) => String(Math.trunc(n))).join(", ")}]${starts})`;
}

/** A bound of a description ("inf" / "-inf" for the infinite ones; one value, or the flat list). */
function describedBound(value: unknown, integer: boolean): string {
  const values = Array.isArray(value) ? (value as unknown[]) : [value];
  const texts = values.map((v) => {
    const number = v === "inf" ? Infinity : v === "-inf" ? -Infinity : Number(v);
    return integer ? String(Math.trunc(number)) : floatText(number);
  });
  return texts.every((t) => t === texts[0]) ? (texts[0] as string) : `[${texts.join(", ")}]`;
}

/** The space a gymnasium description node says, in gymnasium's spelling (null: unknown). */
function describedSpace(desc: Record<string, unknown>): string | null {
  const numbers = (key: string): number[] => (Array.isArray(desc[key]) ? (desc[key] as unknown[]).map(Number) : []);
  switch (desc["type"]) {
    case "discrete": {
      const start = Number(desc["start"] ?? 0);
      return `Discrete(${Number(desc["n"])}${start !== 0 ? `, start=${start}` : ""})`;
    }
    case "box": {
      const dtype = String(desc["dtype"]);
      const integer = /^u?int/.test(dtype) || dtype === "bool";
      const low = describedBound(desc["low"], integer);
      const high = describedBound(desc["high"], integer);
      return `Box(${low}, ${high}, ${shapeText(numbers("shape"))}, ${dtype})`;
    }
    case "multi_discrete":
      return multiDiscreteText(numbers("nvec"), numbers("start"));
    case "multi_binary": {
      const sizes = numbers("shape");
      if (desc["n_sequence"] === true) return `MultiBinary(${shapeText(sizes)})`;
      return `MultiBinary(${sizes.length === 1 ? String(sizes[0]) : `[${sizes.join(", ")}]`})`;
    }
    default:
      return null;
  }
}

/**
 * The action space of `schema` as a message names it (gymnasium's spelling): `Discrete(92)`,
 * `MultiDiscrete([3, 4, 5])` or `Box(-1.0, 1.0, (2,), float32)`; `actN` null: `Discrete(?)`. A
 * schema derived from gymnasium spaces that carries their description (`GymSpaces`) is named by
 * it: an integer Box stays a Box (`Box(-5, 5, (2,), int16)`), not the MultiDiscrete its i32 field
 * alone would say. Python: `transport.actions.describe_action_space`.
 */
export function describeActionSpace(schema: SchemaModule, actN: number | null): string {
  const body = schema.messages["STEP_REQ"]?.body;
  const field = body ? schema.ir.structs[body]?.fields.find((f) => f.role === "action") : undefined;
  if (field === undefined) return "no action space (the STEP_REQ body has no action field)";
  const action = gymDescription(schema)?.["action"];
  const described = typeof action === "object" && action !== null ? describedSpace(action as Record<string, unknown>) : null;
  if (described !== null) return described;
  const dims = fieldDims(field);
  if (dims.length === 0) return `Discrete(${actN === null ? "?" : actN})`;
  const elem = elementType(schema, field);
  if (!elem.startsWith("f")) {
    const high = boundValues(field.high, field.count) ?? new Array<number>(field.count).fill(0);
    const low = boundValues(field.low, field.count) ?? new Array<number>(field.count).fill(0);
    return multiDiscreteText(
      high.map((h, i) => h - (low[i] as number) + 1),
      low,
    );
  }
  const low = boundText(boundValues(field.low, field.count), -Infinity);
  const high = boundText(boundValues(field.high, field.count), Infinity);
  return `Box(${low}, ${high}, ${shapeText(dims)}, ${NUMPY_NAMES[elem] ?? elem})`;
}

type NumberArray =
  | Int8Array
  | Uint8Array
  | Uint8ClampedArray
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | Float32Array
  | Float64Array;

function isNumberArray(value: unknown): value is NumberArray {
  return (
    ArrayBuffer.isView(value) &&
    !(value instanceof DataView) &&
    !(value instanceof BigInt64Array) &&
    !(value instanceof BigUint64Array)
  );
}

/** "float": float values (a Float32Array / Float64Array); "int": an integer typed array; "number": plain numbers. */
type ValueKind = "int" | "float" | "number";

/** The shape and value kind of an action argument; null: not numbers of one shape. */
function shapeOf(value: unknown): { shape: number[]; kind: ValueKind } | null {
  if (typeof value === "number") return { shape: [], kind: "number" };
  if (isNumberArray(value)) {
    const float = value instanceof Float32Array || value instanceof Float64Array;
    return { shape: [value.length], kind: float ? "float" : "int" };
  }
  if (!Array.isArray(value)) return null;
  if (value.length === 0) return { shape: [0], kind: "number" };
  if (typeof value[0] === "number") {
    for (const v of value) if (typeof v !== "number") return null;
    return { shape: [value.length], kind: "number" };
  }
  let inner: { shape: number[]; kind: ValueKind } | null = null;
  let kind: ValueKind = "int";
  for (const row of value) {
    const found = shapeOf(row);
    if (found === null || found.shape.length === 0) return null;
    if (inner !== null && (found.shape.length !== inner.shape.length || found.shape.some((d, i) => d !== inner?.shape[i]))) {
      return null;
    }
    inner = found;
    if (found.kind === "float" || (found.kind === "number" && kind === "int")) kind = found.kind;
  }
  return inner === null ? null : { shape: [value.length, ...inner.shape], kind };
}

/** Every number of a (nested) action argument in row-major order. */
function forEachNumber(value: unknown, visit: (v: number) => void): void {
  if (typeof value === "number") {
    visit(value);
  } else if (isNumberArray(value)) {
    for (let i = 0; i < value.length; i++) visit(value[i] as number);
  } else {
    for (const row of value as unknown[]) forEachNumber(row, visit);
  }
}

/** What a caller passed, for an ActionError: `number 0.5`, `Float32Array of shape (3,)`, `Array of shape (2, 2)`. */
export function describeGiven(value: unknown): string {
  if (typeof value === "number") return `number ${String(value)}`;
  const name = value === null ? "null" : typeof value === "object" ? (value.constructor?.name ?? "object") : typeof value;
  if (typeof value !== "object" || value === null) return typeof value === "bigint" ? `bigint ${String(value)}` : name;
  const found = shapeOf(value);
  return found === null ? `${name} (not numbers of one shape)` : `${name} of shape ${shapeText(found.shape)}`;
}

const SAME = (a: readonly number[], b: readonly number[]): boolean => a.length === b.length && a.every((d, i) => d === b[i]);

/**
 * Why `ActionShapes.write` refused an argument: a text, or `{ outside }` for an integer the
 * action field's type cannot hold (`outside`: the value, or "a value"), which `error` words with
 * the action space (a Discrete space whose size is known is named by its actions, 0..n-1).
 */
export type Refusal = string | { readonly outside: string };

/** The largest finite f32 (numpy: `float(np.finfo(np.float32).max)`). */
const F32_MAX = 3.4028234663852886e38;

/**
 * The first finite number of an action argument that an f32 field cannot hold finitely (it would
 * arrive as -Infinity/Infinity, a value never sent), or null. One that rounds to the largest f32
 * is held; an infinite or NaN one goes as given (the server's INVALID_ACTION names it).
 */
function pastF32(value: unknown): number | null {
  if (typeof value === "number") return Math.abs(Math.fround(value)) === Infinity && Number.isFinite(value) ? value : null;
  if (isNumberArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const v = value[i] as number;
      if (Math.abs(Math.fround(v)) === Infinity && Number.isFinite(v)) return v;
    }
    return null;
  }
  for (const row of value as unknown[]) {
    const past = pastF32(row);
    if (past !== null) return past;
  }
  return null;
}

/** A Discrete space whose size is known, as `describeActionSpace` names it. */
const DISCRETE = /^Discrete\((\d+)\)$/;

/**
 * The one rule for what an action argument means (docs/client.md, "Actions"), applied before any
 * bytes move so every backend answers alike. With S one env's action shape (`()` Discrete, the
 * field's dims for Box and MultiDiscrete) and N the server's envs, an argument of shape S is one
 * env's action (a 1-env server: one view; N > 1: refused), of shape (N, ...S) one action per env
 * (N views, N = 1 included); for array actions with N > 1 a flat array of N x elements numbers is
 * one per env too (row-major). Anything else is refused, a number for a Box included. Values:
 * integers that fit the field's type go into an integer field, floats (a non-integer number or a
 * Float32Array/Float64Array) are refused there (truncated); any number goes into a float field
 * but a finite one an f32 field cannot hold finitely (past +-3.4028234663852886e+38: it would
 * arrive as +-Infinity).
 * `write(actions, request)` applies it to `step`; `write(actions, body, k)` to a call for K env
 * ids (`send`): the same rule with K in place of N, its batch forms only, the same texts.
 */
export class ActionShapes {
  readonly one: readonly number[];
  readonly batch: readonly number[];
  readonly elements: number;
  readonly integer: boolean;
  readonly lo: number;
  readonly hi: number;
  readonly elem: string;
  readonly #type: ActionType;
  /** An f32 field: a finite number past its range is refused (`pastF32`). */
  readonly #f32: boolean;
  readonly #at: number;
  readonly #stride: number;

  constructor(
    schema: SchemaModule,
    readonly numEnvs: number,
    private readonly space: () => Promise<string>,
  ) {
    const body = schema.messages["STEP_REQ"]?.body;
    const field = body ? schema.ir.structs[body]?.fields.find((f) => f.role === "action") : undefined;
    if (field === undefined || !body) throw new ProtocolError("the STEP_REQ body struct has no field with role 'action'");
    this.one = fieldDims(field);
    this.batch = [numEnvs, ...this.one];
    this.#type = actionTypeOf(schema, field, "STEP_REQ action", 1, true);
    this.elements = this.#type.elements;
    this.#f32 = this.#type.float && this.#type.elemSize === 4;
    this.integer = !this.#type.float;
    const bits = 8 * this.#type.elemSize;
    this.lo = this.integer && this.#type.signed ? -(2 ** (bits - 1)) : 0;
    this.hi = this.integer ? (this.#type.signed ? 2 ** (bits - 1) - 1 : 2 ** bits - 1) : 0;
    this.elem = elementType(schema, field);
    this.#at = field.offset;
    this.#stride = schema.structs[body]?.size ?? 0;
  }

  /**
   * Write `actions` into `request` (one STEP_REQ record per env) and return 0 (one env's action)
   * or N (one action per env); a `Refusal` says why it is refused (`error` makes the ActionError).
   * `k`: a call for K env ids (`send`), one action per env id: K, or a refusal.
   */
  write(actions: unknown, request: Buffer, k?: number): number | Refusal {
    const n = k ?? this.numEnvs;
    const single = k === undefined && n === 1;
    if (typeof actions === "number" && this.one.length === 0 && single) {
      // the hot path of a Discrete 1-env server
      if (Number.isInteger(actions) && actions >= this.lo && actions <= this.hi) {
        writeAction(request, this.#at, actions, this.#type);
        return 0;
      }
    }
    const found = shapeOf(actions);
    if (found === null) return "not numbers of one shape";
    const shape = found.shape;
    let count: number;
    if (single && SAME(shape, this.one)) count = 0;
    else if (this.#isBatch(shape, n)) count = n;
    else if (this.one.length > 0 && n > 1 && shape.length === 1 && shape[0] === n * this.elements) count = n;
    else return this.#wanted(shape, k);
    if (this.integer && found.kind === "float") {
      const type = actions instanceof Float32Array ? "float32" : "float64";
      return `its ${type} values would be truncated to the ${this.elem} action field; pass integers`;
    }
    let bad: Refusal | null = null;
    if (this.integer) {
      forEachNumber(actions, (v) => {
        if (bad !== null) return;
        if (!Number.isInteger(v)) bad = `its value ${String(v)} would be truncated to the ${this.elem} action field; pass integers`;
        else if (v < this.lo || v > this.hi) bad = { outside: typeof actions === "number" ? String(v) : "a value" };
      });
    }
    if (bad !== null) return bad;
    if (this.#f32 && !(actions instanceof Float32Array)) {
      // a Float32Array's values all fit (not read: the hot path of a Box step)
      const past = pastF32(actions);
      if (past !== null) {
        const sign = past < 0 ? "-" : "";
        return `${String(past)} is outside ${-F32_MAX}..${F32_MAX}: the ${this.elem} action field cannot hold it (it would become ${sign}inf)`;
      }
    }
    this.#put(actions, request);
    return count;
  }

  /** Whether `shape` is (n, ...S): one action per env (or env id). */
  #isBatch(shape: readonly number[], n: number): boolean {
    const one = this.one;
    if (shape.length !== one.length + 1 || shape[0] !== n) return false;
    for (let i = 0; i < one.length; i++) if (shape[i + 1] !== one[i]) return false;
    return true;
  }

  /** The values, row-major, into env i's action field at `i * stride + at` (element j after). */
  #put(actions: unknown, request: Buffer): void {
    const type = this.#type;
    const k = this.elements;
    const dv = type.float ? new DataView(request.buffer, request.byteOffset, request.byteLength) : null;
    let index = 0;
    forEachNumber(actions, (v) => {
      const p = Math.floor(index / k) * this.#stride + this.#at + (index % k) * type.elemSize;
      index++;
      if (dv === null) {
        for (let b = 0; b < type.elemSize; b++) request[p + b] = (v >>> (8 * b)) & 0xff;
      } else if (type.elemSize === 4) {
        dv.setFloat32(p, v, true);
      } else {
        dv.setFloat64(p, v, true);
      }
    });
  }

  /**
   * What to pass instead of an argument of `shape`; a batch of the wrong length first says the
   * two counts. `k`: a call for K env ids.
   */
  #wanted(shape: readonly number[], k?: number): string {
    const n = k ?? this.numEnvs;
    const batch = k === undefined ? this.batch : [k, ...this.one];
    if (shape.length === batch.length && SAME(shape.slice(1), this.one)) {
      return `expected ${n} action${n === 1 ? "" : "s"}, got ${shape[0]}; ${this.#wanted([], k)}`;
    }
    if (k !== undefined) return `pass one action per env id: an array of shape ${shapeText(batch)}`;
    if (this.numEnvs === 1) {
      if (this.one.length === 0) return "pass one integer (one action) or an array of shape (1,) (a batch of one)";
      return `pass an array of shape ${shapeText(this.one)} (one action) or ${shapeText(this.batch)} (a batch of one)`;
    }
    return `pass one action per env: an array of shape ${shapeText(this.batch)}`;
  }

  /**
   * The ActionError for a refusal `why` of `write`: names the space, what was given, what to pass
   * (`k`: a call for K env ids, as `write` was given).
   */
  async error(what: string, actions: unknown, why: Refusal, k?: number): Promise<ActionError> {
    const envs = k === undefined ? `${this.numEnvs} env${this.numEnvs === 1 ? "" : "s"}` : `${k} env id${k === 1 ? "" : "s"}`;
    const space = await this.space();
    const text = typeof why === "string" ? why : this.#outside(why.outside, space);
    return new ActionError(`${what}: ${describeGiven(actions)} is not an action for ${space} (${envs}): ${text}`);
  }

  /**
   * Why an integer the field's type cannot hold is refused: a Discrete space whose size is known
   * is named by its actions, 0..n-1 (the server's INVALID_ACTION stays the check of the values the
   * field holds); any other space by the field's type.
   */
  #outside(value: string, space: string): string {
    const found = this.one.length === 0 ? DISCRETE.exec(space) : null;
    const size = found === null ? 0 : Number(found[1]);
    if (size > 0) return `${value} is outside 0..${size - 1} (and does not fit the ${this.elem} action field)`;
    return `${value} is outside ${this.lo}..${this.hi}: it does not fit the ${this.elem} action field`;
  }
}

/**
 * A client dropped without `close()`: once it is garbage-collected its channel says goodbye (zmq)
 * and closes, as `close()` would, so the server frees the session and this process the socket
 * now (Python: the channel's `weakref.finalize`). The held value never references the client.
 */
const DROPPED = new FinalizationRegistry<{ channel: Channel; helloType: number }>(({ channel, helloType }) => {
  try {
    channel.sayGoodbye?.(helloType, encodeGoodbye());
    void Promise.resolve(channel.close()).catch(() => undefined);
  } catch {
    // a finalizer never throws: the channel was already unusable
  }
});

/**
 * A connection to an env server. Call `close()` when done. `View` and `Value` are the result
 * struct's view and value types of the schema (pac_env's by default).
 */
export class Client<View = pac_env.StepResultView, Value = pac_env.StepResult> {
  readonly channel: Channel;
  readonly schema: SchemaModule;
  readonly url: string;
  readonly ids: MessageIds;
  readonly numEnvs: number;
  readonly serverInfo: Readonly<Record<string, unknown>>;
  /** The auto-reset mode of this session (from the handshake). */
  readonly autoreset: AutoReset;
  /** The server's masked-action policy ("reject", "pass", "noop"; an older server: "reject"). */
  readonly maskedActions: string;
  /**
   * SAME_STEP auto-reset: the env index and owned final result of each episode that ended in
   * the last step; the step's own result holds the reset result for those envs. Empty otherwise.
   */
  finals: Final<Value>[] = [];
  readonly #result: AnyStructCodec;
  readonly #resultSize: number;
  readonly #request: Buffer;
  readonly #stepSize: number;
  /** The one rule for step's and send's argument (shape, values) and its errors. */
  readonly #shapes: ActionShapes;
  #spaceText: string | null = null;
  readonly #seed: Buffer;
  readonly #seedAt: number;
  readonly #spaces: AnyStructCodec;
  readonly #expected: ReadonlyMap<number, number>;
  readonly #multi: { readonly codec: AnyStructCodec; readonly field: string; readonly seats: number; readonly body: Buffer };
  #views: View[] = [];
  #viewsGeneration = -1;
  #closed = false;

  constructor(channel: Channel, schema: SchemaModule, url: string) {
    this.channel = channel;
    this.schema = schema;
    this.url = url;
    this.ids = messageIds(schema);
    const n = Number(channel.info.num_envs ?? 1);
    this.numEnvs = Number.isInteger(n) && n >= 1 ? n : 1;
    this.serverInfo = { ...channel.info };
    this.autoreset = toAutoReset(String(channel.info.autoreset ?? "disabled"));
    this.maskedActions = String(channel.info.masked_actions ?? "reject");
    this.#result = bodyCodec(schema, "STEP_RESP");
    this.#resultSize = this.#result.size;
    const step = bodyCodec(schema, "STEP_REQ");
    const action = schema.ir.structs[step.name]?.fields.find((f) => f.role === "action");
    if (action === undefined) throw new ProtocolError("the STEP_REQ body struct has no field with role 'action'");
    this.#shapes = new ActionShapes(schema, this.numEnvs, () => this.#actionSpace());
    this.#stepSize = step.size;
    this.#request = Buffer.alloc(step.size * this.numEnvs);
    const seed = bodyCodec(schema, "RESET_SEED_REQ");
    this.#seed = Buffer.alloc(seed.size);
    this.#seedAt = schema.ir.structs[seed.name]?.fields[0]?.offset ?? 0;
    this.#spaces = bodyCodec(schema, "SPACES_RESP");
    const multi = bodyCodec(schema, "STEP_MULTI_REQ");
    const multiField = schema.ir.structs[multi.name]?.fields[0];
    if (multiField === undefined) throw new ProtocolError("the STEP_MULTI_REQ body struct has no field");
    this.#multi = { codec: multi, field: multiField.name, seats: multiField.count, body: Buffer.alloc(multi.size) };
    this.#expected = new Map([
      [this.ids.STEP_MULTI_RESP, this.#resultSize * multiField.count],
      [this.ids.RESET_RESP, this.#resultSize * this.numEnvs],
      [this.ids.STEP_RESP, this.#resultSize],
      [this.ids.STEP_BATCH_RESP, this.#resultSize * this.numEnvs],
    ]);
    DROPPED.register(this, { channel, helloType: this.ids.HELLO_REQ }, this);
  }

  /**
   * shm:// column layout (`[env] shm = "columns"`): each result field of the last response's
   * envs as ONE zero-copy typed array over the region (N x field count elements; bool and struct
   * fields: raw bytes), valid until the next request; null for any other layout or backend.
   */
  columns(): Record<string, ArrayBufferView> | null {
    const records = this.channel.records as { columns?: () => Record<string, ArrayBufferView> | null } | undefined;
    return records?.columns?.() ?? null;
  }

  /** Reset every env (env i gets seed + i); one view per env when N > 1. */
  reset(seed?: Seeds, options?: ResultOptions & { copy?: false }): Promise<View | View[]>;
  reset(seed: Seeds | undefined, options: ResultOptions & { copy: true }): Promise<Value | Value[]>;
  async reset(seed?: Seeds, options: ResultOptions = {}): Promise<View | View[] | Value | Value[]> {
    if (seed === undefined || seed === null) {
      await this.#exchange(this.ids.RESET_REQ, EMPTY, this.ids.RESET_RESP);
    } else if (typeof seed === "object") {
      await this.#exchange(this.ids.RESET_SEEDS_REQ, seedsBody(this.schema, seed, this.numEnvs), this.ids.RESET_RESP);
    } else {
      this.#seed.writeBigUInt64LE(seedValue(seed), this.#seedAt);
      await this.#exchange(this.ids.RESET_SEED_REQ, this.#seed, this.ids.RESET_RESP);
    }
    return this.#results(this.numEnvs === 1 ? 0 : this.numEnvs, options.copy === true);
  }

  /**
   * Step with one env's action (a 1-env server: one view) or one action per env, shape
   * (N, ...action shape) (N views, N = 1 included; array actions with N > 1 may also come flat,
   * N x elements numbers). Anything else is an ActionError before any bytes move (`ActionShapes`).
   */
  step(actions: Actions, options?: ResultOptions & { copy?: false }): Promise<View | View[]>;
  step(actions: Actions, options: ResultOptions & { copy: true }): Promise<Value | Value[]>;
  async step(actions: Actions, options: ResultOptions = {}): Promise<View | View[] | Value | Value[]> {
    const count = this.#shapes.write(actions, this.#request);
    if (typeof count !== "number") throw await this.#shapes.error("step()", actions, count);
    if (this.numEnvs === 1) {
      // a batch of one goes as a STEP_REQ too (every backend answers it alike): the call's
      // shape, not the backend, decides the result's
      await this.#exchange(this.ids.STEP_REQ, this.#request, this.ids.STEP_RESP);
    } else {
      await this.#exchange(this.ids.STEP_BATCH_REQ, this.#request, this.ids.STEP_BATCH_RESP);
    }
    return this.#results(count, options.copy === true);
  }

  /** The action space as an ActionError names it; a Discrete space's size is asked once. */
  async #actionSpace(): Promise<string> {
    if (this.#spaceText !== null) return this.#spaceText;
    let actN: number | null = null;
    if (this.#shapes.one.length === 0 && !this.#closed) {
      try {
        actN = (await this.spaces()).actN;
      } catch {
        actN = null; // named without its size: "Discrete(?)"
      }
    }
    const text = describeActionSpace(this.schema, actN);
    if (actN !== null || this.#shapes.one.length > 0) this.#spaceText = text;
    return text;
  }

  /**
   * STEP_MULTI: one action per seat of a multi-player game (seed 000's self-play: 8 seats), one
   * result view per seat. The server steps a 1-env game's `stepBatch` once (or, with as many envs
   * as seats, each env once).
   */
  async stepMulti(actions: ArrayLike<number>, options: ResultOptions = {}): Promise<View[] | Value[]> {
    const multi = this.#multi;
    if (actions.length !== multi.seats) {
      throw new ActionError(
        `${this.url}: stepMulti() takes one action per seat: ${multi.seats} (the seats of schema ` +
          `${this.schema.name}'s STEP_MULTI_REQ, whatever num_envs the server has), got ${actions.length}`,
      );
    }
    multi.codec.encodeInto({ [multi.field]: Array.from(actions) }, multi.body, 0);
    await this.#exchange(this.ids.STEP_MULTI_REQ, multi.body, this.ids.STEP_MULTI_RESP);
    return this.#results(multi.seats, options.copy === true) as View[] | Value[];
  }

  /** Observation length and number of actions. */
  async spaces(): Promise<Spaces> {
    const body = await this.#exchange(this.ids.SPACES_REQ, EMPTY, this.ids.SPACES_RESP);
    const values = this.#spaces.decode(body, 0, false) as Record<string, number>;
    const [first, second] = Object.values(values);
    return { obsN: Number(first), actN: Number(second) };
  }

  async health(): Promise<boolean> {
    const body = await this.#exchange(this.ids.HEALTH_REQ, EMPTY, this.ids.HEALTH_RESP);
    return body.byteLength >= 1 && body[0] === 1;
  }

  async close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      DROPPED.unregister(this);
      this.channel.sayGoodbye?.(this.ids.HELLO_REQ, encodeGoodbye());
      await this.channel.close();
    }
  }

  /**
   * OBSERVE: every env's current result without stepping (one view per env when N > 1) and each
   * env's info map. Needs a schema that declares OBSERVE_REQ / OBSERVE_RESP.
   */
  async observe(options: ResultOptions = {}): Promise<{ results: View | View[] | Value | Value[]; infos: Array<Record<string, unknown>> }> {
    const request = this.schema.messages["OBSERVE_REQ"]?.id;
    const response = this.schema.messages["OBSERVE_RESP"]?.id;
    if (request === undefined || response === undefined) {
      throw new ProtocolError(`schema ${this.schema.name} declares no OBSERVE_REQ / OBSERVE_RESP`);
    }
    const body = await this.#exchange(request, EMPTY, response);
    const records = this.channel.records;
    let infos: Array<Record<string, unknown>>;
    if (records !== undefined) {
      infos = records.infos();
    } else {
      const decoded = msgpackDecode(body.subarray(this.numEnvs * this.#resultSize));
      if (!Array.isArray(decoded)) throw new ProtocolError("OBSERVE_RESP's tail is not a msgpack array");
      infos = decoded as Array<Record<string, unknown>>;
    }
    return { results: this.#results(this.numEnvs === 1 ? 0 : this.numEnvs, options.copy === true), infos };
  }

  // -- asynchronous batches (docs/client.md; the rules are the server runtime's) -----------------

  /**
   * Start stepping envs `envIds` (action `actions[k]` for env `envIds[k]`): `recv` returns their
   * results as they finish. An env already in flight is refused (ASYNC_STATE). `actions`: one
   * action per env id, shape (K, ...action shape) (array actions: a flat array of K x elements
   * numbers too, K > 1), by step's rule with K in place of N (`ActionShapes`): anything else is an
   * ActionError naming send() before any bytes move.
   */
  async send(actions: Actions, envIds: ArrayLike<number>): Promise<void> {
    const k = envIds.length;
    if (k < 1 || k > this.numEnvs) throw new TransportError(`send takes 1..${this.numEnvs} env ids, got ${k}`);
    const body = Buffer.alloc(k * this.#stepSize);
    const count = this.#shapes.write(actions, body, k);
    if (typeof count !== "number") throw await this.#shapes.error("send()", actions, count, k);
    const ids = Array.from(envIds, (i: unknown) => {
      if (typeof i !== "number" || !Number.isInteger(i)) {
        throw new TypeError(`send(): env ids are integers, not ${typeof i} ${String(i)} (protocol: SEND_REQ env ids are msgpack integers)`);
      }
      return i;
    });
    await this.#exchange(this.ids.SEND_REQ, Buffer.concat([body, msgpackEncode(ids)]), this.ids.SEND_RESP);
  }

  /**
   * The first `batchSize` (default N) in-flight envs to finish, or all in flight if fewer: owned
   * results, the env id of each, and (SAME_STEP) the final results of the episodes that ended.
   */
  async recv(batchSize: number = this.numEnvs): Promise<{ results: Value[]; envIds: number[]; finals: Final<Value>[] }> {
    if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize >= 2 ** 32) {
      throw new RangeError(`recv(${String(batchSize)}): a batch size is an integer >= 1 (default: numEnvs, ${this.numEnvs})`);
    }
    const request = Buffer.alloc(4);
    request.writeUInt32LE(batchSize, 0);
    let resp: Buffer;
    try {
      resp = await this.#exchange(this.ids.RECV_REQ, request, this.ids.RECV_RESP);
    } catch (error) {
      // a socket backend drops the late RECV_RESP (shm, whose records live in its slots, keeps it)
      if (error instanceof TransportTimeoutError && this.channel.records === undefined) {
        const retry = hintFor(error) ?? "";
        error.message = retry && error.message.includes(retry) ? error.message.replace(retry, RECV_LATE_HINT) : `${error.message} (${RECV_LATE_HINT})`;
      }
      throw error;
    }
    const size = this.#resultSize;
    const tail = splitRecvTail(resp, size, batchSize);
    const results: Value[] = [];
    for (let k = 0; k < tail.count; k++) results.push(this.#result.decode(resp, k * size, false) as Value);
    const finals: Final<Value>[] = tail.ended.map((index, k) => ({
      index,
      result: this.#result.decode(Buffer.from(tail.finals.buffer, tail.finals.byteOffset + k * size, size), 0, false) as Value,
    }));
    return { results, envIds: tail.envIds, finals };
  }

  /** Reset every env (env i: seed + i) for `recv` to return (nothing may be in flight). */
  async asyncReset(seed: number | bigint | null = null): Promise<void> {
    const body = Buffer.alloc(16);
    if (seed !== null) {
      body.writeBigUInt64LE(seedValue(seed, "asyncReset"), 0);
      body[8] = 1;
    }
    await this.#exchange(this.ids.ASYNC_RESET_REQ, body, this.ids.SEND_RESP);
  }

  async #exchange(msgType: number, body: Uint8Array, expect: number): Promise<Buffer> {
    if (this.#closed) throw new TransportError(`${this.url}: the client is closed`);
    const channel = this.channel;
    let type: number;
    try {
      type = await channel.request(msgType, body);
    } catch (error) {
      throw explain(error, this.url);
    }
    const resp = channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength);
    if (type === this.ids.ERROR) throw explain(sessionError(resp), this.url);
    if (type !== expect) {
      throw explain(new ProtocolError(`expected msg_type 0x${hex(expect)}, got 0x${hex(type)}`), this.url);
    }
    const records = channel.records;
    if (records !== undefined) {
      // results in the channel's records (shm slots): finals from its final areas
      const stepped = expect === this.ids.STEP_RESP || expect === this.ids.STEP_BATCH_RESP;
      this.finals = stepped && this.autoreset === AutoReset.SAME_STEP ? (records.finals() as Final<Value>[]) : NO_FINALS;
      return resp;
    }
    const expected = this.#expected.get(expect);
    if (expected !== undefined && channel.bodyLength !== expected) {
      if (this.autoreset !== AutoReset.SAME_STEP || expect === this.ids.RESET_RESP) {
        throw new ProtocolError(`response 0x${hex(type)} has ${channel.bodyLength} bytes, expected ${expected}`);
      }
      this.#readFinals(resp, expected);
    } else if (this.finals.length) {
      this.finals = [];
    }
    return resp;
  }

  /** Parse the SAME_STEP tail: u32 count, then (u32 env index, final result) each. */
  #readFinals(resp: Buffer, resultsLength: number): void {
    this.finals = readFinalTail(resp, resultsLength, this.#resultSize, this.numEnvs).map(({ index, at }) => ({
      index,
      result: this.#result.decode(resp, at, false) as Value,
    }));
  }

  #results(count: number, copy: boolean): View | View[] | Value | Value[] {
    const records = this.channel.records;
    if (records !== undefined) return this.#recordResults(records, count, copy);
    const buffer = this.channel.buffer;
    const size = this.#resultSize;
    if (copy) {
      if (count === 0) return this.#result.decode(buffer, BODY_OFFSET, false) as Value;
      const out: Value[] = [];
      for (let i = 0; i < count; i++) out.push(this.#result.decode(buffer, BODY_OFFSET + i * size, false) as Value);
      return out;
    }
    if (this.#viewsGeneration !== this.channel.generation || this.#views.length < Math.max(count, 1)) {
      const views: View[] = [];
      for (let i = 0; i < Math.max(count, 1, this.numEnvs); i++) {
        views.push(this.#result.view(buffer, BODY_OFFSET + i * size) as View);
      }
      this.#views = views;
      this.#viewsGeneration = this.channel.generation;
      this.#batch = null;
    }
    if (count === 0) return this.#views[0] as View;
    if (this.#batch === null || this.#batch.length !== count) this.#batch = this.#views.slice(0, count);
    return this.#batch;
  }

  #batch: View[] | null = null;

  /** Results a channel keeps outside its buffer (shm:// slots): views built once, reused. */
  #recordResults(records: ChannelRecords, count: number, copy: boolean): View | View[] | Value | Value[] {
    if (copy) {
      if (count === 0) return records.decode(0) as Value;
      const out: Value[] = [];
      for (let i = 0; i < count; i++) out.push(records.decode(i) as Value);
      return out;
    }
    if (this.#views.length < Math.max(count, 1)) {
      this.#views = [];
      for (let i = 0; i < records.count; i++) this.#views.push(records.view(i) as View);
    }
    if (count === 0) return this.#views[0] as View;
    if (this.#batch === null || this.#batch.length !== count) this.#batch = this.#views.slice(0, count);
    return this.#batch;
  }
}

const NO_FINALS: Final<never>[] = [];

const EMPTY = Buffer.alloc(0);

function hex(value: number): string {
  return value.toString(16).toUpperCase().padStart(2, "0");
}

/**
 * Connect to an env server and complete the HELLO handshake. `timeoutMs` bounds every wait
 * (connecting, each request): a dead server is `PeerGoneError`, a silent one
 * `TransportTimeoutError`, nothing listening `ConnectError`.
 */
export async function connect<View = pac_env.StepResultView, Value = pac_env.StepResult>(
  url: string,
  options: ConnectOptions = {},
): Promise<Client<View, Value>> {
  if (typeof url !== "string") {
    throw new TypeError(`connect(url): the url is a string such as "unix:///tmp/pac.sock", not ${shown(url)}`);
  }
  options = options ?? {};
  const timeoutMs = timeoutOption(options.timeoutMs, DEFAULT_TIMEOUT_MS);
  // none: discover the server's in the handshake
  const pinned = options.schema === undefined || options.schema === null ? null : await schemaOption(options.schema);
  const autoreset = toAutoReset(options.autoreset ?? AutoReset.DISABLED);
  let backend: Backend;
  try {
    backend = await backendFor(url);
  } catch (error) {
    throw explain(error, url); // the URL first, as every connect error
  }
  const maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
  // a discovering HELLO_RESP carries the IR (KBs): its channel takes at least the default
  // maxBody; a smaller limit asked for applies to the pinned channel opened after it
  const firstMax = pinned === null ? Math.max(maxBody, DEFAULT_MAX_BODY) : maxBody;
  const open = (schema: SchemaModule | undefined, limit: number): Promise<Channel> =>
    backend.openChannel(url, {
      timeoutMs,
      maxBody: limit,
      ...(schema === undefined ? {} : { schema }),
    });
  let channel: Channel;
  try {
    channel = await open(pinned ?? undefined, firstMax);
  } catch (error) {
    throw explain(error, url);
  }
  let session: { schema: SchemaModule; info: Record<string, unknown> };
  try {
    session = await handshake(channel, pinned, autoreset, url);
    const builtFor = channel.speaksAnySchema === true || channel.schema?.fingerprint === session.schema.fingerprint;
    if (pinned === null && firstMax === maxBody && channel.adopt !== undefined) {
      channel.adopt(session.schema); // HTTP: the same connection (and server session)
    } else if (pinned === null && (firstMax !== maxBody || !builtFor)) {
      // opened before the schema was known, and it carries one of its own or a larger
      // maxBody: a fresh channel pinned to the discovered schema (unix and zmq frames carry
      // none: their channel is kept, or the server would build a session and its envs twice)
      await channel.close();
      channel = await open(session.schema, maxBody);
      session = await handshake(channel, session.schema, autoreset, url);
    }
    channel.info = session.info;
  } catch (error) {
    await channel.close();
    throw explain(notAServer(error), url);
  }
  return new Client<View, Value>(channel, session.schema, url);
}

/** A value as an argument error names it: its type and a short text. */
function shown(value: unknown): string {
  if (value === null || value === undefined) return String(value);
  if (typeof value === "string") return `string ${JSON.stringify(value)}`;
  if (typeof value === "object") {
    const keys = Object.keys(value as object).slice(0, 4);
    return keys.length ? `an object with keys ${keys.join(", ")}` : "an object with no keys";
  }
  return `${typeof value} ${String(value)}`;
}

function isSchemaModule(value: unknown): value is SchemaModule {
  if (value === null || typeof value !== "object") return false;
  const s = value as Record<string, unknown>;
  return (
    typeof s["name"] === "string" &&
    typeof s["fingerprint"] === "bigint" &&
    typeof s["messages"] === "object" &&
    s["messages"] !== null &&
    typeof s["structs"] === "object" &&
    s["structs"] !== null &&
    typeof s["ir"] === "object" &&
    s["ir"] !== null
  );
}

/**
 * connect's `schema`: a schema module; a generated module (its `SCHEMA`); or a schema file's
 * path, loaded as the Python client loads one (`loadSchemaFile`). Anything else is a TypeError
 * before anything connects.
 */
async function schemaOption(value: unknown): Promise<SchemaModule> {
  if (isSchemaModule(value)) return value;
  if (typeof value === "string") {
    // loaded on first use: schema_file brings the worker pool's module, which a client needs not
    const { loadSchemaFile } = require("./schema_file") as typeof import("./schema_file");
    return loadSchemaFile(value);
  }
  if (value !== null && typeof value === "object" && isSchemaModule((value as Record<string, unknown>)["SCHEMA"])) {
    return (value as { SCHEMA: SchemaModule }).SCHEMA;
  }
  throw new TypeError(
    "connect(url, {schema}): schema is a schema module (a generated module's SCHEMA, e.g. pac_env.SCHEMA) " +
      `or the path of a schema file, not ${shown(value)}`,
  );
}

/**
 * A peer that closes the connection or sends what is not a frame during the HELLO handshake is
 * no transport server on this backend (a zmq socket file on unix://, a web server on http://):
 * a ConnectError saying so. A refusal it explains (an ERROR, a version or schema mismatch) is
 * left as it is.
 */
function notAServer(error: unknown): unknown {
  const weird =
    error instanceof PeerGoneError ||
    (error instanceof ProtocolError &&
      !(error instanceof FingerprintMismatchError) &&
      !(error instanceof ReplyTooLargeError) &&
      !(error instanceof VersionMismatchError) &&
      !(error instanceof RegionMismatchError));
  if (!weird) return error;
  return new ConnectError(`${error.message}, during the HELLO handshake (not a transport server on this backend?)`);
}
