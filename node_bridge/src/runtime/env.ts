/**
 * The env interface a Node server hosts: the same small shape as the Python side
 * (transport/runtime `Env`). Results are plain objects of the schema's result struct (the
 * generated `<Struct>Input` type); the runtime encodes them with the generated codec.
 */

import type { SchemaModule } from "../codec";
import { gymDescription } from "../gym_description";

/** Observation length and number of discrete actions. */
export interface Spaces {
  readonly obsN: number;
  readonly actN: number;
}

/**
 * One action as the runtime passes it to `step`: a number for a scalar (Discrete) action field,
 * a Float64Array (an owned copy, one element per array element, in row-major order) for an
 * array action field (Box `f32[2]`, MultiDiscrete `u8[3]`). An env declares the one its schema
 * has: `step(action: number)` and `step(action: Float64Array)` both implement `Env`.
 */
export type Action = number | Float64Array;

/**
 * One environment. `reset` and `step` return the step result; an env may return the same
 * object every time (mutated in place): the runtime encodes it before calling the env again.
 * Seeds are bigints (the wire's u64): `reset(seed)` gets env i's seed (the client's seed + i),
 * `reset()` an unseeded reset.
 */
export interface Env<R = unknown> {
  spaces(): Spaces;
  reset(seed?: bigint): R;
  step(action: Action): R;
  /**
   * Optional: one action per seat of a multi-player game (seed 000's self-play), one result per
   * seat. A 1-env server whose env has it answers STEP_MULTI (8 seats) with one call; the
   * runtime checks each action's range and that the game was reset and is not over.
   */
  stepBatch?(actions: Int32Array): ArrayLike<R>;
  /** Optional: the current result without stepping (OBSERVE); without it the last result is sent. */
  observe?(): R;
  /** Optional: a free-form msgpack-able map (OBSERVE's info tail); `{}` without it. */
  info?(): Record<string, unknown>;
  /**
   * Optional fast path (Python's `step_into`): step and write the result straight into `out`,
   * no object and no codec. The env writes EVERY byte of the record (the bytes there are what an
   * earlier response left, not cleared; padding included), values as they are: nothing is
   * checked and a NaN is not made canonical. Preferred over `step` when present.
   */
  stepInto?(action: Action, out: ResultRow): void;
  /** Optional: `reset` writing into `out` as `stepInto` does (`seed` null: unseeded). */
  resetInto?(seed: bigint | null, out: ResultRow): void;
  /**
   * Optional: OBSERVE written into `out` as `stepInto` does. An env with `stepInto` or
   * `resetInto` and neither this nor `observe` costs one copy of each result it writes (the
   * runtime keeps it for OBSERVE).
   */
  observeInto?(out: ResultRow): void;
}

/**
 * Where an env's `stepInto` / `resetInto` / `observeInto` writes one result: the schema's
 * result record (its packed layout, little-endian; `size` bytes) at `bytes[at, at + size)` of
 * the response buffer (or a worker's result area, or an shm scratch record); `view` is a
 * DataView of `bytes`. Valid during the call only: the runtime reuses the object and moves `at`.
 */
export interface ResultRow {
  readonly bytes: Uint8Array;
  readonly view: DataView;
  readonly at: number;
  /** The result record's size in bytes (an env that writes a fixed struct checks it). */
  readonly size: number;
}

/** Makes a fresh env (a server calls it once per env per client). */
export type EnvFactory<R = unknown> = () => Env<R>;

// -- vector envs: one object that steps all of its N envs in one call --------------------------

/** A result field's column: the typed array of its element type (bool and enums: their integer's). */
export type Column =
  | Float32Array
  | Float64Array
  | Int8Array
  | Uint8Array
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | BigInt64Array
  | BigUint64Array;

/**
 * Where a vector env writes its N results: one typed array per field of the schema's result
 * struct, by field name, env i's elements at `[i * count, (i + 1) * count)` (`count` the field's
 * elements, 1 for a scalar); a struct-typed field's column is its encoded bytes (Uint8Array,
 * `size` bytes per env). The runtime owns the columns and keeps them between calls, so an env
 * writes only what changed; it copies the rows it asked for into the response (or the shm
 * slots) at once. Values are written as they are: the typed arrays fix each field's type and
 * range; a flag should be 0 or 1 and a NaN is not made canonical (Python's `step_into` rule).
 */
export interface VectorResults {
  readonly numEnvs: number;
  readonly columns: Readonly<Record<string, Column>>;
  /**
   * Env `index` failed in this call with `error` (the others did theirs): its row is not
   * written, the client gets ENV_ERROR naming it, and the runtime resets it (resetEnvs with it
   * alone). A throw from `stepEnvs` / `resetEnvs` fails every env of the call instead.
   */
  fail(index: number, error: unknown): void;
}

/**
 * A vector runner's result columns as the runtime and the backends use them (`ResultColumns`
 * in vector.ts): the columns the env writes, re-pointable at a backend's memory (`adopt`).
 */
export interface RunnerColumns extends VectorResults {
  /** The columns were re-pointed at a backend's memory. */
  readonly adopted: boolean;
  /** Re-point every column at `bytes` from `starts[name]` (what they hold copied there first). */
  adopt(bytes: Uint8Array, starts: Readonly<Record<string, number>>): void;
}

/**
 * N envs in one object (a batch simulator, typed-array physics): the runtime hands it every
 * action at once and it writes every result at once, into `VectorResults` columns. `ids` are
 * the envs of the call: sorted env indices, each once (an Int32Array valid during the call);
 * the others must not change. The runtime keeps the per-env bookkeeping: action checks,
 * auto-reset (it asks for partial resets), finals, masks, seeds (env i: seed + i) and errors.
 * Python: `VectorEnv` in transport/runtime/env.py (`reset_envs`, `step_envs`, `num_envs`).
 */
export interface VectorEnv {
  readonly numEnvs: number;
  spaces(): Spaces;
  /** Reset envs `ids`; `seeds[k]` is env `ids[k]`'s seed (null: unseeded). */
  resetEnvs(ids: Int32Array, seeds: ReadonlyArray<bigint | null>, out: VectorResults): void;
  /**
   * Step envs `ids` (null: every env) once, env i with the runtime's action block: `actions[i]`
   * (Discrete) or `actions[i * k .. (i + 1) * k)` (an array action of k elements). Valid during
   * the call only. The runtime never steps an env whose episode ended (unless
   * `autoresetNextStep`).
   */
  stepEnvs(actions: Float64Array, ids: Int32Array | null, out: VectorResults): void;
  /**
   * Optional, default true. False: `stepEnvs` is only ever called with `ids` null (a request
   * that steps a subset is BAD_BATCH); needs `autoresetNextStep`, and refuses "noop" masked actions.
   */
  readonly stepsSubsets?: boolean;
  /**
   * Optional, default false. True: stepping an env whose episode ended resets it instead (its
   * action ignored) and writes its reset result, as gymnasium's NEXT_STEP mode does; the runtime
   * then leaves NEXT_STEP resets to the env.
   */
  readonly autoresetNextStep?: boolean;
  /**
   * Optional, default false. True: the env reads `out.columns` afresh in every call and never
   * keeps a column between calls (Python's `writes_columns`), so a backend may re-point the
   * columns at its own memory: over an shm column region (`[env] shm = "columns"`) the env then
   * writes the region's result columns and the server copies nothing.
   */
  readonly writesColumns?: boolean;
  /**
   * Optional, default false. True: a step runs on threads or processes of the env's own (worker
   * threads, a native batch simulator), so an shm server and its client sleep while it steps
   * instead of spinning, as for a worker pool (Python's `steps_on_own_threads`).
   */
  readonly stepsOnOwnThreads?: boolean;
  /** Optional: the N envs' free-form info maps (OBSERVE's tail); `{}` each without it. */
  infos?(): ReadonlyArray<Record<string, unknown>>;
  /** Optional: called when the runtime that made it closes. */
  close?(): void;
}

/** A class of vector envs: the server makes one per client with `new C(numEnvs)`. */
export type VectorEnvClass = new (numEnvs: number) => VectorEnv;

/**
 * What `serve` accepts: one env (shared by every client) or a factory (or class) of fresh envs;
 * one vector env (shared; it serves its own numEnvs), a class of vector envs (`new C(numEnvs)`
 * per client) or a zero-argument factory that returns a vector env of the server's numEnvs.
 */
export type EnvOrFactory =
  | Env<unknown>
  | EnvFactory<unknown>
  | (new () => Env<unknown>)
  | VectorEnv
  | VectorEnvClass
  | (() => VectorEnv);

/** A vector env instance (`stepEnvs` and `resetEnvs`), as opposed to a one-env object or a factory. */
export function isVectorEnv(value: unknown): value is VectorEnv {
  return (
    typeof value === "object" &&
    value !== null &&
    typeof (value as VectorEnv).stepEnvs === "function" &&
    typeof (value as VectorEnv).resetEnvs === "function"
  );
}

/** `new C(numEnvs)` for a class whose instances are vector envs; null for anything else. */
export function vectorClassOf(factory: unknown): ((numEnvs: number) => VectorEnv) | null {
  if (typeof factory !== "function" || !/^class[\s{]/.test(Function.prototype.toString.call(factory))) return null;
  const proto = (factory as { prototype?: Partial<VectorEnv> }).prototype;
  if (typeof proto?.stepEnvs !== "function" || typeof proto.resetEnvs !== "function") return null;
  const make = factory as VectorEnvClass;
  return (numEnvs) => new make(numEnvs);
}

/** An env instance, as opposed to a factory or a class. */
export function isEnv(value: unknown): value is Env<unknown> {
  return (
    typeof value === "object" &&
    value !== null &&
    typeof (value as Env<unknown>).reset === "function" &&
    typeof (value as Env<unknown>).step === "function"
  );
}

/**
 * A zero-argument maker for a factory function or an env class (what it makes may be a vector
 * env: the host looks). Anything else makes a maker that throws a TypeError when called.
 */
export function makerOf(factory: EnvOrFactory): () => Env<unknown> {
  const make = factory as (() => Env<unknown>) & (new () => Env<unknown>);
  const isClass = /^class[\s{]/.test(Function.prototype.toString.call(make));
  return isClass ? () => new make() : () => make();
}

/** Close an env the runtime made, if it has `close` (best effort: a failing close is ignored). */
export function closeEnv(env: unknown): void {
  const close = (env as { close?: () => void } | null)?.close;
  if (typeof close !== "function") return;
  try {
    close.call(env);
  } catch {
    // closing is best effort
  }
}

/**
 * `spaces` as an env's `spaces()` returned them, refused with a TypeError that says what to
 * return when they are not `{ obsN, actN }` of non-negative integers (`{ obs_n, act_n }`, as in
 * Python, reached every client as INTERNAL "SpacesResult.obs_n: no value given").
 */
export function checkedSpaces(spaces: unknown): Spaces {
  const given = spaces as Partial<Spaces> | null | undefined;
  const count = (value: unknown): boolean => typeof value === "number" && Number.isInteger(value) && value >= 0;
  if (typeof spaces === "object" && spaces !== null && count(given?.obsN) && count(given?.actN)) return spaces as Spaces;
  if (isThenable(spaces)) throw new TypeError(asyncMethodText("spaces", spaces));
  let shown: string;
  try {
    shown = JSON.stringify(spaces) ?? String(spaces);
  } catch {
    shown = String(spaces);
  }
  if (shown.length > 60) shown = `${shown.slice(0, 57)}...`;
  throw new TypeError(
    `the env's spaces() returned ${shown}, not { obsN, actN }: return { obsN: <the observation ` +
      "length>, actN: <the number of discrete actions, or the action's element count> } (integers >= 0)",
  );
}

/**
 * An env's `actN` against the Discrete action a schema derived from gymnasium spaces declares
 * (`GymSpaces`): the runtime checks actions against 0..actN - 1 while clients describe the
 * schema's space, so an env saying 9 for a Discrete(2) schema took action 5. Python:
 * `check_declared_action`, the same rule and words.
 */
export function checkDeclaredAction(spaces: Spaces, schema: SchemaModule): void {
  const action = gymDescription(schema)?.["action"];
  if (typeof action !== "object" || action === null) return;
  const described = action as Record<string, unknown>;
  if (described["type"] !== "discrete") return;
  const n = Number(described["n"] ?? -1);
  if (n !== spaces.actN) {
    throw new TypeError(
      `the env's spaces() say actN=${spaces.actN}, but schema ${schema.ir.name} declares the action Discrete(${n}): ` +
        `return actN=${n} (actions are checked against 0..actN - 1)`,
    );
  }
}

/** A Promise or another thenable: what an `async` env method returns instead of its result. */
export function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    (typeof value === "object" || typeof value === "function") &&
    value !== null &&
    typeof (value as { then?: unknown }).then === "function"
  );
}

/**
 * Why a Promise from env method `method` is refused (the runtime calls env methods
 * synchronously and never awaits them). Its outcome is dropped here: a rejection would
 * otherwise end the process as an unhandled rejection.
 */
export function asyncMethodText(method: string, promise: PromiseLike<unknown>): string {
  try {
    promise.then(undefined, () => undefined);
  } catch {
    // a thenable whose then throws: nothing to wait for
  }
  return (
    `${method}() returned a Promise (is it async?), not a result: the server calls ` +
    `${method} synchronously and never awaits it; make ${method} a plain method that returns ` +
    "the result, and do asynchronous work elsewhere (before serving: in the factory or at " +
    "module load; or on a thread of its own)"
  );
}
