/**
 * The in-thread runner: the envs are called here and their results encoded in place into the
 * record bytes the runtime was given (the session's send buffer, a slot: no copy). `EnvTable`
 * is also what each worker thread of a pool (pool.ts) runs over its share of the envs.
 */

import type { AnyStructCodec } from "../codec";
import { CodecError } from "../errors";
import { ErrorCode, RequestError } from "../protocol";
import { type ActionRule, type Failure, Op, type Records, type Runner, actionOf } from "./core";
import type { Action, Env, Spaces } from "./env";

type AnyEnv = Env<unknown>;

/** Envs `base .. base + envs.length - 1` and what each op does to one of them. */
export class EnvTable {
  readonly envs: AnyEnv[];
  readonly base: number;
  readonly factory: (() => AnyEnv) | null;
  readonly #codec: AnyStructCodec;
  readonly #validate: boolean;
  /** Each env's last result (OBSERVE of an env without `observe()`). */
  readonly #last: unknown[];

  constructor(envs: readonly AnyEnv[], codec: AnyStructCodec, factory: (() => AnyEnv) | null, validate = true, base = 0) {
    this.envs = [...envs];
    this.base = base;
    this.factory = factory;
    this.#codec = codec;
    this.#validate = validate;
    this.#last = new Array<unknown>(envs.length).fill(undefined);
  }

  /**
   * Do `op` to env `index` (a global index), encoding its result at `bytes[at]`. Throws what the
   * env threw, or a RequestError ENV_ERROR "returned bad values" for a result the codec refuses.
   */
  apply(index: number, op: number, action: Action, seed: bigint | null, bytes: Uint8Array, at: number): void {
    const k = index - this.base;
    switch (op) {
      case Op.STEP:
        this.#write(index, k, (this.envs[k] as AnyEnv).step(action), bytes, at);
        return;
      case Op.RESET: {
        const env = this.envs[k] as AnyEnv;
        this.#write(index, k, seed === null ? env.reset() : env.reset(seed), bytes, at);
        return;
      }
      case Op.RECREATE: {
        if (this.factory === null) throw new Error("no env factory to recreate the env from");
        const fresh = this.factory();
        this.#write(index, k, seed === null ? fresh.reset() : fresh.reset(seed), bytes, at);
        this.envs[k] = fresh;
        return;
      }
      case Op.OBSERVE: {
        const env = this.envs[k] as AnyEnv;
        this.#write(index, k, env.observe !== undefined ? env.observe() : this.#last[k], bytes, at);
        return;
      }
      default:
        return;
    }
  }

  /** Env `index`'s `stepBatch` (null without one); seat i's result at `at(i)`. */
  stepSeats(index: number): ((actions: Int32Array, out: Pick<Records, "bytes" | "at">) => void) | null {
    const env = this.envs[index - this.base] as AnyEnv;
    if (env.stepBatch === undefined) return null;
    return (actions, out) => {
      const outputs = (this.envs[index - this.base] as AnyEnv).stepBatch!(actions);
      if (outputs.length !== actions.length) {
        throw new Error(`stepBatch returned ${outputs.length} results for ${actions.length} actions`);
      }
      for (let seat = 0; seat < actions.length; seat++) this.#encode(index, outputs[seat], out.bytes, out.at(seat));
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
    for (const env of this.envs) {
      const close = (env as { close?: () => void }).close;
      if (typeof close === "function") {
        try {
          close.call(env);
        } catch {
          // closing is best effort
        }
      }
    }
  }

  #write(index: number, k: number, output: unknown, bytes: Uint8Array, at: number): void {
    this.#encode(index, output, bytes, at);
    this.#last[k] = output;
  }

  /** Encode one result (validated unless told otherwise: a bad value is the env's error). */
  #encode(index: number, output: unknown, bytes: Uint8Array, at: number): void {
    if (!this.#validate) {
      this.#codec.writeInto(output, bytes, at);
      return;
    }
    try {
      this.#codec.encodeInto(output, bytes, at);
    } catch (error) {
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

  close(): void {
    // the envs belong to the server's factory (or are shared): nothing to stop
  }
}
