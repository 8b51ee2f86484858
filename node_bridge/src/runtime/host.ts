/**
 * What a server serves: one env (shared by every client) or a factory, N envs per client, run in
 * this thread or in a worker pool. `EnvHost` makes each client's `EnvRuntime` (the shm server
 * asks for one per lease) and each stream connection's `Session` (session.ts).
 */

import type { SchemaModule } from "../codec";
import { ConnectError, SchemaError, TransportError } from "../errors";
import * as pac_env from "../generated/pac_env";
import { ActionRule, EnvRuntime, type MaskedActions, bodyCodec, checkMaskedActions, penaltyOf } from "./core";
import { type Env, type EnvOrFactory, type Spaces, type VectorEnv, closeEnv, isEnv, isVectorEnv, makerOf, vectorClassOf } from "./env";
import { LocalRunner } from "./local";
import { PoolRunner, WorkerPool, type WorkerEnvSpec } from "./pool";
import { VectorRunner } from "./vector";

type AnyEnv = Env<unknown>;

/** Options of a host (serve()'s, minus the backend's). */
export interface HostOptions {
  /** The schema the server speaks (default: the reference pac_env). */
  readonly schema?: SchemaModule;
  /**
   * Envs per client (N); needs a factory when above 1. Default 1; a vector env instance's own
   * numEnvs (which a given value must equal).
   */
  readonly numEnvs?: number;
  /** The env name the HELLO info carries. */
  readonly envName?: string;
  /** The seed of each client's first unseeded reset (env i gets seed + i). */
  readonly seed?: bigint | number | null;
  /** "node" (the HELLO info's `server`). */
  readonly serverLang?: string;
  /**
   * Check every env result against the schema before writing it (default true): a bad value
   * is ENV_ERROR "returned bad values". false writes results unchecked (the codec's `writeInto`).
   */
  readonly validate?: boolean;
  /** Step each client's envs in this many worker threads (default 0: in this thread). */
  readonly workers?: number;
  /** Where the worker threads get their envs (default: `envName` in `ENVS`). */
  readonly workerEnv?: WorkerEnvSpec;
  /** What an action the env's mask forbids does (default "reject"; runtime/core.ts). */
  readonly maskedActions?: MaskedActions;
}

/** The schema an env, its class or its factory declares as `SCHEMA` (an instance: its own, else
 * its class's static one), or null. */
export function declaredSchema(owner: unknown): SchemaModule | null {
  if ((typeof owner !== "object" && typeof owner !== "function") || owner === null) return null;
  const ctor = typeof owner === "object" ? (owner as { constructor?: unknown }).constructor : undefined;
  for (const candidate of [(owner as { SCHEMA?: unknown }).SCHEMA, (ctor as { SCHEMA?: unknown } | undefined)?.SCHEMA]) {
    const schema = candidate as Partial<SchemaModule> | null | undefined;
    if (typeof schema === "object" && schema !== null && typeof schema.fingerprint === "bigint" && typeof schema.name === "string") {
      return schema as SchemaModule;
    }
  }
  return null;
}

/**
 * Refuse, at start, an env (its class, its factory, or the env a factory made) that declares as
 * `SCHEMA` a schema other than the one served: its results follow its own layout, and every
 * reset would fail with "returned bad values". Python: `refuse_other_schema` (runtime/host.py).
 */
export function refuseOtherSchema(schema: SchemaModule, served: unknown): void {
  const declared = declaredSchema(served);
  if (declared === null || declared.fingerprint === schema.fingerprint) return;
  const name =
    (typeof served === "function" ? served.name : (served as { constructor?: { name?: string } }).constructor?.name) || "the env";
  const hex = (fp: bigint): string => fp.toString(16).padStart(16, "0");
  throw new SchemaError(
    `cannot serve ${name}: it declares schema ${declared.name} (fp ${hex(declared.fingerprint)}) in ${name}.SCHEMA, ` +
      `but the server was given schema ${schema.name} (fp ${hex(schema.fingerprint)}): its results follow its own ` +
      `schema and every reset would fail; serve it with the schema it declares, or make ${name}.SCHEMA the schema it now follows`,
  );
}

/** Makes the runtime of each client. */
export class EnvHost {
  readonly schema: SchemaModule;
  readonly numEnvs: number;
  /** The HELLO info's `env` and `server`. */
  readonly envName: string;
  readonly serverLang: string;
  readonly firstSeed: bigint | null;
  /** What a masked action does (the HELLO info's `masked_actions`). */
  readonly maskedActions: MaskedActions;
  /** A fresh env (null: one env instance shared by every client). */
  readonly factory: (() => AnyEnv) | null;
  readonly #shared: AnyEnv | null;
  /** One vector env shared by every client (it serves its own numEnvs). */
  readonly #sharedVector: VectorEnv | null;
  /** A class of vector envs: `new C(numEnvs)` per client. */
  readonly #vectorClass: ((numEnvs: number) => VectorEnv) | null;
  readonly #validate: boolean;
  readonly #workers: number;
  readonly #workerEnv: WorkerEnvSpec;
  /** What one action is (how each env receives it: `actionOf`). */
  readonly #actionRule: ActionRule;
  /** The spaces of the pool's envs (asked once of an env made here). */
  #poolSpaces: Spaces | null = null;
  /** The pool's envs' `maskedActionPenalty` (asked of the same env). */
  #poolPenalty: number | null = null;
  /** The runtime `check()` made, kept for the first client (its envs are not made twice). */
  #kept: EnvRuntime | null = null;
  /** The envs the factory returned (one returned again is refused: `#make`). */
  readonly #made = new WeakSet<object>();
  /** Run on the first env the host makes (or its shared env), then dropped: `inspectFirstEnv`. */
  #inspect: ((env: AnyEnv) => void) | null = null;
  /** A schema was given (not the default): the envs made are checked against it (`#make`). */
  readonly #schemaGiven: boolean;

  constructor(envOrFactory: EnvOrFactory, options: HostOptions = {}) {
    const sharedVector = isVectorEnv(envOrFactory) ? envOrFactory : null;
    if (sharedVector !== null && options.numEnvs !== undefined && options.numEnvs !== sharedVector.numEnvs) {
      throw new TransportError(`numEnvs=${options.numEnvs}, but the vector env given has numEnvs=${String(sharedVector.numEnvs)}`);
    }
    const numEnvs = options.numEnvs ?? sharedVector?.numEnvs ?? 1;
    if (!Number.isInteger(numEnvs) || numEnvs < 1) throw new TransportError("numEnvs must be an integer of at least 1");
    this.schema = options.schema ?? pac_env.SCHEMA;
    // a schema given that the env declares otherwise (none given: serve()'s default check)
    this.#schemaGiven = options.schema !== undefined;
    if (this.#schemaGiven) refuseOtherSchema(this.schema, envOrFactory);
    bodyCodec(this.schema, "STEP_RESP"); // a schema the runtime cannot serve fails here
    this.#actionRule = new ActionRule(this.schema); // so does an action type it cannot carry
    this.numEnvs = numEnvs;
    this.envName = options.envName ?? "";
    this.serverLang = options.serverLang ?? "node";
    const seed = options.seed;
    this.firstSeed = seed === undefined || seed === null ? null : BigInt(seed);
    this.#validate = options.validate ?? true;
    this.maskedActions = checkMaskedActions(options.maskedActions ?? "reject");
    this.#workers = options.workers ?? 0;
    this.#workerEnv = {
      envName: this.envName,
      ...(options.validate !== undefined ? { validate: options.validate } : {}),
      ...options.workerEnv,
    };
    this.#sharedVector = sharedVector;
    this.#vectorClass = vectorClassOf(envOrFactory);
    if ((sharedVector !== null || this.#vectorClass !== null) && this.#workers > 0) {
      throw new TransportError("a vector env steps its envs itself: serve it without workers");
    }
    if (sharedVector !== null) {
      this.#shared = null;
      this.factory = null;
    } else if (isEnv(envOrFactory)) {
      if (numEnvs !== 1) throw new TransportError("pass an env factory to serve more than one env");
      this.#shared = envOrFactory;
      this.factory = null;
    } else {
      if (typeof envOrFactory !== "function") {
        throw new TransportError("serve() takes an env (reset, step, spaces) or an env factory");
      }
      this.#shared = null;
      this.factory = makerOf(envOrFactory);
    }
  }

  /** The envs run in worker threads. */
  get pooled(): boolean {
    return this.#workers > 0;
  }

  /**
   * A fresh runtime for one client with `numEnvs` envs (default the host's; another count needs
   * a factory). Node runs one request at a time: a shared env needs no lock.
   */
  runtime(numEnvs = this.numEnvs, url = ""): EnvRuntime {
    const kept = this.#kept;
    if (kept !== null && numEnvs === this.numEnvs) {
      this.#kept = null;
      return kept;
    }
    const factory = this.factory;
    const resizable = factory !== null || this.#vectorClass !== null;
    if (numEnvs !== this.numEnvs && (!resizable || !Number.isInteger(numEnvs) || numEnvs < 1)) {
      throw new ConnectError(
        `${url || "the server"} asks for ${numEnvs} envs but the server was given numEnvs=${this.numEnvs}` +
          (!resizable ? " and one shared env (pass an env factory)" : ""),
      );
    }
    const noop = this.maskedActions === "noop";
    const options = (penalties: readonly number[]) => ({
      firstSeed: this.firstSeed,
      maskedActions: this.maskedActions,
      ...(noop ? { penalties } : {}),
    });
    if (this.#sharedVector !== null || this.#vectorClass !== null) this.#inspect = null; // its columns are checked
    if (this.#sharedVector !== null) return this.#vectorRuntime(this.#sharedVector, false, options);
    if (this.#vectorClass !== null) return this.#vectorRuntime(this.#vectorClass(numEnvs), true, options);
    if (factory === null) {
      const codec = bodyCodec(this.schema, "STEP_RESP");
      const shared = this.#shared as AnyEnv;
      this.#inspectOnce(shared, false);
      const runner = new LocalRunner([shared], codec, null, this.#validate, this.#actionRule);
      return new EnvRuntime(this.schema, runner, options(noop ? [penaltyOf(shared)] : []));
    }
    if (this.#workers > 0) {
      if (this.#poolSpaces === null || (noop && this.#poolPenalty === null)) {
        const env = factory(); // the envs live in the pool's threads: ask one made here
        try {
          if (this.#schemaGiven) refuseOtherSchema(this.schema, env);
          if (isVectorEnv(env)) throw new TransportError("a vector env steps its envs itself: serve it without workers");
          this.#poolSpaces = env.spaces();
          this.#poolPenalty = penaltyOf(env);
          this.#inspectOnce(env, false);
        } finally {
          closeEnv(env);
        }
      }
      const spaces = this.#poolSpaces;
      const spec = this.#workerEnv;
      const workers = this.#workers;
      const penalties = noop ? new Array<number>(numEnvs).fill(this.#poolPenalty ?? 0) : [];
      return new EnvRuntime(this.schema, new PoolRunner(numEnvs, spaces, () => new WorkerPool(spec, numEnvs, workers)), options(penalties));
    }
    const make = (): AnyEnv => this.#make(factory);
    const first = make();
    // a zero-argument factory may make a vector env: it then holds all of the client's envs
    if (isVectorEnv(first)) {
      this.#inspect = null; // its columns are checked
      return this.#vectorRuntime(first, true, options, numEnvs, url);
    }
    this.#inspectOnce(first, true);
    const envs: AnyEnv[] = [first];
    for (let i = 1; i < numEnvs; i++) envs.push(make());
    const codec = bodyCodec(this.schema, "STEP_RESP");
    const penalties = noop ? envs.map(penaltyOf) : [];
    return new EnvRuntime(this.schema, new LocalRunner(envs, codec, make, this.#validate, this.#actionRule), options(penalties));
  }

  /** Run `inspect` (serve()'s default-schema check) on the first env this host makes, or its
   * shared env: the env tried is the first client's, not one made for the try alone. */
  inspectFirstEnv(inspect: (env: AnyEnv) => void): void {
    this.#inspect = inspect;
  }

  /** The pending `inspectFirstEnv` check on `env`, once; an env made for the client (`owned`)
   * is closed when it fails. */
  #inspectOnce(env: AnyEnv, owned: boolean): void {
    const inspect = this.#inspect;
    if (inspect === null) return;
    this.#inspect = null;
    try {
      inspect(env);
    } catch (error) {
      if (owned) closeEnv(env);
      throw error;
    }
  }

  /** Make one client's runtime now (a factory that cannot make its envs fails at start, with
   * the reason) and keep it for the first client. */
  check(): void {
    this.#kept = this.runtime();
  }

  /** Close the runtime `check()` kept if no client took it (the server is closing). */
  close(): void {
    const kept = this.#kept;
    this.#kept = null;
    kept?.close();
  }

  /** One env from the factory, refused when it is an object the factory returned before: the
   * server closes a client's envs when it leaves, so a factory returning one object made
   * beforehand would hand the next client a closed env (Python: `EnvHost._make_env`). */
  #make(factory: () => AnyEnv): AnyEnv {
    const env = factory();
    if (typeof env !== "object" || env === null) return env;
    if (this.#schemaGiven) {
      try {
        refuseOtherSchema(this.schema, env);
      } catch (error) {
        closeEnv(env);
        throw error;
      }
    }
    if (this.#made.has(env)) {
      throw new TransportError(
        `the env factory returned an env object it had returned before (${env.constructor.name}): a factory ` +
          "must make a new env on every call (the server closes the envs it made when their client leaves); to " +
          "serve one env object made beforehand, pass the object itself, not a function returning it",
      );
    }
    this.#made.add(env);
    return env;
  }

  /**
   * A runtime over one vector env (`owned`: made for this client, closed with it). A factory's
   * vector env must hold the `numEnvs` asked for. "noop" masked actions: the env's
   * `maskedActionPenalty` for every env.
   */
  #vectorRuntime(
    env: VectorEnv,
    owned: boolean,
    options: (penalties: readonly number[]) => ConstructorParameters<typeof EnvRuntime>[2],
    numEnvs = env.numEnvs,
    url = "",
  ): EnvRuntime {
    if (env.numEnvs !== numEnvs) {
      if (owned) closeEnv(env);
      throw new ConnectError(
        `${url || "the server"} asks for ${numEnvs} envs but the env factory made a vector env of ${String(env.numEnvs)} ` +
          "(pass a vector env class, which the server makes with new C(numEnvs))",
      );
    }
    if (this.maskedActions === "noop" && env.stepsSubsets === false) {
      if (owned) closeEnv(env);
      throw new TransportError("maskedActions \"noop\" steps a subset of the envs, which this vector env cannot (stepsSubsets false): use \"reject\" or \"pass\"");
    }
    const penalties = this.maskedActions === "noop" ? new Array<number>(env.numEnvs).fill(penaltyOf(env)) : [];
    return new EnvRuntime(this.schema, new VectorRunner(env, this.schema, owned), options(penalties));
  }
}
