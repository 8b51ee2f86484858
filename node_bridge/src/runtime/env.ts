/**
 * The env interface a Node server hosts: the same small shape as the Python side
 * (transport/runtime `Env`). Results are plain objects of the schema's result struct (the
 * generated `<Struct>Input` type); the runtime encodes them with the generated codec.
 */

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
}

/** Makes a fresh env (a server calls it once per env per client). */
export type EnvFactory<R = unknown> = () => Env<R>;

/** What `serve` accepts: one env (shared by every client) or a factory (or class) of fresh envs. */
export type EnvOrFactory = Env<unknown> | EnvFactory<unknown> | (new () => Env<unknown>);

/** An env instance, as opposed to a factory or a class. */
export function isEnv(value: unknown): value is Env<unknown> {
  return (
    typeof value === "object" &&
    value !== null &&
    typeof (value as Env<unknown>).reset === "function" &&
    typeof (value as Env<unknown>).step === "function"
  );
}

/** A zero-argument maker for a factory function or an env class. */
export function makerOf(factory: EnvFactory<unknown> | (new () => Env<unknown>)): () => Env<unknown> {
  const make = factory as (() => Env<unknown>) & (new () => Env<unknown>);
  const isClass = /^class[\s{]/.test(Function.prototype.toString.call(make));
  return isClass ? () => new make() : () => make();
}
