/**
 * The in-thread runner: the envs are called here and their results encoded in place into the
 * record bytes the runtime was given (the session's send buffer, a slot: no copy). An env with
 * `stepInto` / `resetInto` / `observeInto` (env.ts) writes its record there itself: no result
 * object, no codec (issue 24: the codec's validate + encode was ~1 us of ~1.2 us per env at
 * N = 256). `EnvTable` is also what each worker thread of a pool (pool.ts) runs over its share
 * of the envs.
 */

import type { AnyStructCodec } from "../codec";
import { CodecError } from "../errors";
import { ErrorCode, RequestError } from "../protocol";
import { type ActionRule, type Failure, Op, type Records, type Runner, actionOf } from "./core";
import { type Action, type Env, type ResultRow, type Spaces, asyncMethodText, closeEnv, isThenable } from "./env";

type AnyEnv = Env<unknown>;

/** `#last`'s mark for an env whose last result was written in place and kept in `#saved`. */
const SAVED: unique symbol = Symbol("saved");

/** How deep in `env`'s prototype chain `name` is defined (0: the object itself), -1 if nowhere. */
function depthOf(env: object, name: string): number {
  let depth = 0;
  for (let o: object | null = env; o !== null && o !== Object.prototype; o = Object.getPrototypeOf(o) as object | null, depth++) {
    if (Object.prototype.hasOwnProperty.call(o, name)) return depth;
  }
  return -1;
}

/** Which of an env's in-place methods the runtime calls (the `*Into` it may use, or none). */
interface InPlace {
  readonly step: boolean;
  readonly reset: boolean;
  readonly observe: boolean;
}

/**
 * An env's `stepInto` / `resetInto` / `observeInto` are used only where no plain `step`,
 * `reset` or `observe` is defined below them in its prototype chain: a subclass that overrides
 * `step` of a class with `stepInto` (a test's faulty env over EchoEnv) is stepped through its
 * `step`, and its inherited in-place methods, which may rely on the base class's state, are
 * not used at all.
 */
function inPlaceOf(env: AnyEnv): InPlace {
  if (env.stepInto === undefined && env.resetInto === undefined && env.observeInto === undefined) return NO_IN_PLACE;
  let plain = Number.POSITIVE_INFINITY; // the most derived plain method
  for (const name of ["step", "reset", "observe"]) {
    const depth = depthOf(env, name);
    if (depth >= 0) plain = Math.min(plain, depth);
  }
  const usable = (name: string): boolean => {
    const depth = depthOf(env, name);
    return depth >= 0 && depth <= plain && typeof (env as unknown as Record<string, unknown>)[name] === "function";
  };
  return { step: usable("stepInto"), reset: usable("resetInto"), observe: usable("observeInto") };
}
const NO_IN_PLACE: InPlace = { step: false, reset: false, observe: false };

/** The one `ResultRow` an env's `*Into` methods get, moved from record to record. */
class MovingRow implements ResultRow {
  bytes: Uint8Array = new Uint8Array(0);
  view: DataView = new DataView(this.bytes.buffer);
  at = 0;
  readonly size: number;

  constructor(size: number) {
    this.size = size;
  }

  /** This row at `bytes[at]` (a DataView made only when `bytes` changes). */
  point(bytes: Uint8Array, at: number): MovingRow {
    if (bytes !== this.bytes) {
      this.bytes = bytes;
      this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    }
    this.at = at;
    return this;
  }
}

/**
 * ENV_ERROR for an env method that returned a Promise (an `async step`): the runtime encodes
 * each result as the method returns, so it never awaits one (`asyncMethodText`).
 */
function asyncResultError(index: number, method: string, promise: PromiseLike<unknown>): RequestError {
  return new RequestError(ErrorCode.ENV_ERROR, `env ${index}: ${asyncMethodText(method, promise)}`);
}

/** Envs `base .. base + envs.length - 1` and what each op does to one of them. */
export class EnvTable {
  readonly envs: AnyEnv[];
  readonly base: number;
  readonly factory: (() => AnyEnv) | null;
  readonly #codec: AnyStructCodec;
  readonly #validate: boolean;
  /** Each env's last result (OBSERVE of an env without `observe()`), or SAVED. */
  readonly #last: unknown[];
  /** The last record an env without `observe` / `observeInto` wrote in place (OBSERVE). */
  readonly #saved: Array<Uint8Array | null>;
  /** Each env's in-place methods the runtime uses (`inPlaceOf`). */
  readonly #inPlace: InPlace[];
  readonly #row: MovingRow;

  constructor(envs: readonly AnyEnv[], codec: AnyStructCodec, factory: (() => AnyEnv) | null, validate = true, base = 0) {
    this.envs = [...envs];
    this.base = base;
    this.factory = factory;
    this.#codec = codec;
    this.#validate = validate;
    this.#last = new Array<unknown>(envs.length).fill(undefined);
    this.#saved = new Array<Uint8Array | null>(envs.length).fill(null);
    this.#inPlace = this.envs.map(inPlaceOf);
    this.#row = new MovingRow(codec.size);
  }

  /**
   * Do `op` to env `index` (a global index), encoding its result at `bytes[at]`. Throws what the
   * env threw, or a RequestError ENV_ERROR "returned bad values" for a result the codec refuses.
   */
  apply(index: number, op: number, action: Action, seed: bigint | null, bytes: Uint8Array, at: number): void {
    const k = index - this.base;
    switch (op) {
      case Op.STEP: {
        const env = this.envs[k] as AnyEnv;
        const inPlace = this.#inPlace[k] as InPlace;
        if (inPlace.step) {
          (env.stepInto as NonNullable<AnyEnv["stepInto"]>)(action, this.#row.point(bytes, at)); // the env writes the record itself
          this.#wroteInPlace(k, inPlace, bytes, at);
          return;
        }
        this.#write(index, k, env.step(action), bytes, at, "step");
        return;
      }
      case Op.RESET:
        this.#reset(index, k, this.envs[k] as AnyEnv, this.#inPlace[k] as InPlace, seed, bytes, at);
        return;
      case Op.RECREATE: {
        if (this.factory === null) throw new Error("no env factory to recreate the env from");
        const fresh = this.factory();
        const inPlace = inPlaceOf(fresh);
        try {
          this.#reset(index, k, fresh, inPlace, seed, bytes, at);
        } catch (error) {
          closeEnv(fresh); // the broken env stays (closed with the others); this one is let go
          throw error;
        }
        const old = this.envs[k];
        this.envs[k] = fresh;
        this.#inPlace[k] = inPlace;
        if (old !== fresh) closeEnv(old); // the broken env is let go of: closed, not left to the GC
        return;
      }
      case Op.OBSERVE: {
        const env = this.envs[k] as AnyEnv;
        if ((this.#inPlace[k] as InPlace).observe) {
          (env.observeInto as NonNullable<AnyEnv["observeInto"]>)(this.#row.point(bytes, at));
          return;
        }
        if (env.observe !== undefined) {
          this.#write(index, k, env.observe(), bytes, at, "observe");
          return;
        }
        const saved = this.#saved[k];
        if (this.#last[k] === SAVED && saved !== null) {
          bytes.set(saved, at);
          return;
        }
        this.#write(index, k, this.#last[k], bytes, at, "observe");
        return;
      }
      default:
        return;
    }
  }

  /** Reset `env` (env `index`, table slot `k`): `resetInto` in place, else `reset` encoded. */
  #reset(index: number, k: number, env: AnyEnv, inPlace: InPlace, seed: bigint | null, bytes: Uint8Array, at: number): void {
    if (inPlace.reset) {
      (env.resetInto as NonNullable<AnyEnv["resetInto"]>)(seed, this.#row.point(bytes, at));
      this.#wroteInPlace(k, inPlace, bytes, at);
      return;
    }
    this.#write(index, k, seed === null ? env.reset() : env.reset(seed), bytes, at, "reset");
  }

  /**
   * An env wrote its record in place: an env that cannot answer OBSERVE itself (no `observe`,
   * no `observeInto`) has the record kept for it (one copy; the others cost nothing here).
   */
  #wroteInPlace(k: number, inPlace: InPlace, bytes: Uint8Array, at: number): void {
    if (inPlace.observe || (this.envs[k] as AnyEnv).observe !== undefined) return;
    const size = this.#row.size;
    let saved = this.#saved[k] ?? null;
    if (saved === null) {
      saved = new Uint8Array(size);
      this.#saved[k] = saved;
    }
    saved.set(bytes.subarray(at, at + size));
    this.#last[k] = SAVED;
  }

  /** Env `index`'s `stepBatch` (null without one); seat i's result at `at(i)`. */
  stepSeats(index: number): ((actions: Int32Array, out: Pick<Records, "bytes" | "at">) => void) | null {
    const env = this.envs[index - this.base] as AnyEnv;
    if (env.stepBatch === undefined) return null;
    return (actions, out) => {
      const outputs = (this.envs[index - this.base] as AnyEnv).stepBatch!(actions);
      if (outputs.length !== actions.length) {
        if (isThenable(outputs)) throw asyncResultError(index, "stepBatch", outputs);
        throw new Error(`stepBatch returned ${outputs.length} results for ${actions.length} actions`);
      }
      for (let seat = 0; seat < actions.length; seat++) this.#encode(index, outputs[seat], out.bytes, out.at(seat), "stepBatch");
      this.#last[index - this.base] = outputs[0];
    };
  }

  info(index: number): Record<string, unknown> {
    const env = this.envs[index - this.base] as AnyEnv;
    return env.info !== undefined ? env.info() : {};
  }

  spaces(): Spaces {
    return (this.envs[0] as AnyEnv).spaces();
  }

  close(): void {
    for (const env of this.envs) closeEnv(env);
  }

  #write(index: number, k: number, output: unknown, bytes: Uint8Array, at: number, method: string): void {
    this.#encode(index, output, bytes, at, method);
    this.#last[k] = output;
  }

  /**
   * Encode one result (validated unless told otherwise: a bad value is the env's error). A
   * result the codec refuses is looked at once more, off the hot path: a Promise (an `async`
   * method) gets its own message.
   */
  #encode(index: number, output: unknown, bytes: Uint8Array, at: number, method: string): void {
    if (!this.#validate) {
      this.#codec.writeInto(output, bytes, at);
      return;
    }
    try {
      this.#codec.encodeInto(output, bytes, at);
    } catch (error) {
      if (isThenable(output)) throw asyncResultError(index, method, output);
      if (error instanceof CodecError) {
        throw new RequestError(ErrorCode.ENV_ERROR, `env ${index}: returned bad values: ${error.message}`);
      }
      throw error;
    }
  }
}

/** The envs of one client, stepped in this thread. */
export class LocalRunner implements Runner {
  readonly numEnvs: number;
  readonly canRecreate: boolean;
  readonly wholeBatchOnly = false;
  readonly table: EnvTable;
  readonly stepSeats: ((actions: Int32Array, out: Records) => void) | null;

  /** Elements of one action: 1 (Discrete, a number) or more (Box, MultiDiscrete: a Float64Array). */
  readonly actionElements: number;
  /** How each env gets its action (`actionOf`, the runtime's one rule). */
  readonly #action: Pick<ActionRule, "kind" | "elements">;
  #closed = false;

  /**
   * `action`: the schema's `ActionRule` (an array action of any element count, even 1, is a
   * Float64Array); a number `k` is the older form: k > 1 an array of k, else Discrete.
   */
  constructor(
    envs: readonly AnyEnv[],
    codec: AnyStructCodec,
    factory: (() => AnyEnv) | null,
    validate = true,
    action: number | Pick<ActionRule, "kind" | "elements"> = 1,
  ) {
    this.numEnvs = envs.length;
    this.#action = typeof action === "number" ? { kind: action > 1 ? "box" : "discrete", elements: action } : action;
    this.actionElements = this.#action.elements;
    this.canRecreate = factory !== null;
    this.table = new EnvTable(envs, codec, factory, validate);
    this.stepSeats = envs.length === 1 ? this.table.stepSeats(0) : null;
  }

  spaces(): Spaces {
    return this.table.spaces();
  }

  run(ops: Uint8Array, actions: Float64Array, seeds: ReadonlyArray<bigint | null>, out: Records): Failure[] | null {
    const table = this.table;
    const bytes = out.bytes;
    let failures: Failure[] | null = null;
    for (let i = 0; i < this.numEnvs; i++) {
      const op = ops[i] as number;
      if (op === Op.NONE) continue;
      try {
        const action = op === Op.STEP ? actionOf(this.#action, actions, i) : 0;
        table.apply(i, op, action, seeds[i] ?? null, bytes, out.at(i));
      } catch (error) {
        (failures ??= []).push([i, error]); // the other envs still do theirs
      }
    }
    return failures;
  }

  takeReplaced(): string | null {
    return null;
  }

  info(index: number): Record<string, unknown> {
    return this.table.info(index);
  }

  /** The client left: the envs the factory made for it are closed (`close()`, if they have
   * one), as a vector env the server made is; a shared env is not (the next client steps it). */
  close(): void {
    if (this.canRecreate && !this.#closed) this.table.close();
    this.#closed = true;
  }
}
