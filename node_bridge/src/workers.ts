/**
 * A session's N envs in K worker_threads (`serve.js URL --env NAME --num-envs N --workers K`),
 * the Node counterpart of transport/workers.py `WorkerPool`.
 *
 * Worker k owns envs [lo, hi) (an even split, the first workers get one more), built by name
 * from `ENVS` (or from `module`'s `exportName` factory), so each env keeps its own RNG stream
 * for the pool's lifetime and the results are byte for byte those of the in-process Session.
 * One SharedArrayBuffer carries everything; a request fans out and gathers synchronously
 * (Session.handle is synchronous):
 *
 * ```
 * 0        state i32 (READY 1, CLOSED 2)
 * 64       worker k's block (64 bytes): cmd i32 (main -> worker sequence), done i32 (worker ->
 *          main sequence), op, arg, mode, ok, dead
 * ctl      N x 1024-byte env records: action f64 | flags u8 (1 ended, 2 failed) | has_seed u8
 *          | fate u8 | error_len u16 | seed u64 (| seed_neg u8 at 7) | error_text u8[1000]
 * results  N x StepResult (the codec's packed layout)
 * finals   N x StepResult (SAME_STEP final results)
 * ```
 *
 * The main thread writes actions, bumps each worker's `cmd` (Atomics.notify), then Atomics.wait
 * on each `done` in 50 ms slices. A worker thread records env errors with their texts (the
 * Session turns them into `env {i}: ...` ENV_ERRORs and asks the pool to restore the env). A
 * worker that dies (process.exit in env code, an uncaught error) sets its `dead` word on its
 * way out: its envs fail with `env i: worker thread k (envs a..b) died (...)`, the worker is
 * replaced by a fresh one, and the restore resets the fresh envs ("the env was recreated in a
 * new worker thread").
 */

import * as path from "node:path";
import { Worker } from "node:worker_threads";
import type { AnyStructCodec, SchemaModule } from "./codec";
import type { Env, Spaces } from "./env";
import { CodecError, TransportError } from "./errors";
import * as pac_env from "./generated/pac_env";
import { AutoReset, ErrorCode, RequestError } from "./protocol";
import { episodeEndFields } from "./ir";

export const FATE_RESET = "the env was reset";
export const FATE_RECREATED = "the env was recreated";
export const FATE_FAILED = "the env could not be reset: send a reset";
const FATES: Record<number, string> = {
  1: FATE_RESET,
  2: FATE_RECREATED,
  3: `${FATE_RECREATED} in a new worker thread`,
};

const READY = 1;
const CLOSED = 2;
const OP_STEP = 1;
const OP_RESET = 2;
const OP_RESTORE = 3;
const ENDED = 1;
const FAILED = 2;
const BLOCK = 64;
const CTL = 1024;
const TEXT_AT = 24;
const TEXT_MAX = CTL - TEXT_AT;
// i32 words of a worker block
const W_CMD = 0;
const W_DONE = 1;
const W_OP = 2;
const W_ARG = 3;
const W_MODE = 4;
const W_OK = 5;
const W_DEAD = 6;

/** Where a worker thread gets its envs (and the schema). */
export interface WorkerEnvSpec {
  /** A name in `ENVS` (envs/index.ts); ignored when `module` is given. */
  readonly envName?: string;
  /** A module path whose `exportName` export is an env factory (tests). */
  readonly module?: string;
  readonly exportName?: string;
  /** A module path whose `SCHEMA` export is the schema (default: the generated pac_env). */
  readonly schemaModule?: string;
  /** Validate env results (Session `validate`, default true). */
  readonly validate?: boolean;
}

/** A failure of one env: its index and what it raised (a RequestError naming the env). */
export type PoolFailure = readonly [index: number, error: unknown];

interface WorkerData {
  readonly sab: SharedArrayBuffer;
  readonly numEnvs: number;
  readonly workers: number;
  readonly k: number;
  readonly spec: WorkerEnvSpec;
}

function align(n: number, to = 64): number {
  return Math.ceil(n / to) * to;
}

/** Env ranges [lo, hi) per worker, as even as possible (the first ones get one more). */
export function split(numEnvs: number, workers: number): Array<readonly [number, number]> {
  const per = Math.floor(numEnvs / workers);
  const extra = numEnvs % workers;
  const ranges: Array<readonly [number, number]> = [];
  let lo = 0;
  for (let k = 0; k < workers; k++) {
    const hi = lo + per + (k < extra ? 1 : 0);
    ranges.push([lo, hi]);
    lo = hi;
  }
  return ranges;
}

class Layout {
  readonly i32: Int32Array;
  readonly bytes: Uint8Array;
  readonly dv: DataView;
  readonly ctlAt: number;
  readonly resultsAt: number;
  readonly finalsAt: number;
  readonly size: number;

  constructor(readonly sab: SharedArrayBuffer | null, numEnvs: number, workers: number, readonly resultSize: number) {
    this.ctlAt = BLOCK * (1 + workers);
    this.resultsAt = align(this.ctlAt + numEnvs * CTL);
    this.finalsAt = align(this.resultsAt + numEnvs * resultSize);
    this.size = align(this.finalsAt + numEnvs * resultSize);
    const buf = sab ?? new SharedArrayBuffer(this.size);
    this.sab = buf;
    this.i32 = new Int32Array(buf);
    this.bytes = new Uint8Array(buf);
    this.dv = new DataView(buf);
  }

  word(k: number, w: number): number {
    return (BLOCK * (1 + k)) / 4 + w;
  }

  ctl(i: number): number {
    return this.ctlAt + i * CTL;
  }

  result(i: number): number {
    return this.resultsAt + i * this.resultSize;
  }

  final(i: number): number {
    return this.finalsAt + i * this.resultSize;
  }

  writeText(i: number, text: string): void {
    const data = Buffer.from(text, "utf-8");
    let n = Math.min(data.length, TEXT_MAX);
    while (n > 0 && n < data.length && ((data[n] as number) & 0xc0) === 0x80) n--; // whole chars
    const at = this.ctl(i);
    this.bytes.set(data.subarray(0, n), at + TEXT_AT);
    this.dv.setUint16(at + 12, n, true);
  }

  readText(i: number): string {
    const at = this.ctl(i);
    const n = this.dv.getUint16(at + 12, true);
    return Buffer.from(this.bytes.slice(at + TEXT_AT, at + TEXT_AT + n)).toString("utf-8");
  }

  setSeed(i: number, seed: bigint | null): void {
    const at = this.ctl(i);
    this.bytes[at + 9] = seed === null ? 0 : 1;
    const s = seed ?? 0n;
    this.bytes[at + 7] = s < 0n ? 1 : 0;
    this.dv.setBigUint64(at + 16, s < 0n ? -s : s, true);
  }

  seed(i: number): bigint | null {
    const at = this.ctl(i);
    if (!this.bytes[at + 9]) return null;
    const s = this.dv.getBigUint64(at + 16, true);
    return this.bytes[at + 7] ? -s : s;
  }
}

function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

function resultCodec(schema: SchemaModule): AnyStructCodec {
  const body = schema.messages["STEP_RESP"]?.body;
  const codec = body ? schema.structs[body] : undefined;
  if (codec === undefined) throw new TransportError(`schema ${schema.name} has no STEP_RESP body`);
  return codec;
}

function loadSchema(spec: WorkerEnvSpec): SchemaModule {
  if (spec.schemaModule === undefined) return pac_env.SCHEMA;
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  return (require(spec.schemaModule) as { SCHEMA: SchemaModule }).SCHEMA;
}

function loadFactory(spec: WorkerEnvSpec): () => Env<unknown> {
  if (spec.module !== undefined) {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const mod = require(spec.module) as Record<string, unknown>;
    const make = mod[spec.exportName ?? "default"];
    if (typeof make !== "function") throw new TransportError(`${spec.module} has no factory ${spec.exportName}`);
    return make as () => Env<unknown>;
  }
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { ENVS } = require("./envs") as typeof import("./envs");
  const make = ENVS[spec.envName ?? ""];
  if (make === undefined) throw new TransportError(`unknown env ${JSON.stringify(spec.envName)}`);
  return make as () => Env<unknown>;
}

/** Whether a result ended its episode: any of its `episodeEndFields` is non-zero. */
function doneReader(schema: SchemaModule, codec: AnyStructCodec): ((dv: DataView, at: number) => boolean) | null {
  const fields = episodeEndFields(schema.ir.structs[codec.name]);
  if (fields.length === 0) return null;
  return (dv, at) => {
    for (const field of fields) {
      const size = field.size / field.count;
      for (let b = 0; b < size; b++) if (dv.getUint8(at + field.offset + b)) return true;
    }
    return false;
  };
}

/** The body of a worker thread (worker_main.ts): step envs [lo, hi) on command. */
export function runWorker(data: WorkerData): void {
  const { numEnvs, workers, k, spec } = data;
  const schema = loadSchema(spec);
  const codec = resultCodec(schema);
  const lay = new Layout(data.sab, numEnvs, workers, codec.size);
  const i32 = lay.i32;
  const cmdAt = lay.word(k, W_CMD);
  const doneAt = lay.word(k, W_DONE);
  const markDead = (): void => {
    Atomics.store(i32, lay.word(k, W_DEAD), 1);
    Atomics.notify(i32, doneAt);
  };
  process.on("exit", markDead);
  const [lo, hi] = split(numEnvs, workers)[k] as readonly [number, number];
  const validate = spec.validate ?? true;
  const isDone = doneReader(schema, codec);
  const buf = Buffer.from(data.sab);
  let factory: () => Env<unknown>;
  const envs: Array<Env<unknown>> = [];
  try {
    factory = loadFactory(spec);
    for (let i = lo; i < hi; i++) envs.push(factory());
    i32[lay.word(k, W_OK)] = 1;
  } catch (error) {
    lay.writeText(lo, describeError(error));
    i32[lay.word(k, W_OK)] = 0;
    Atomics.store(i32, doneAt, 1);
    Atomics.notify(i32, doneAt);
    process.off("exit", markDead);
    return;
  }
  const write = (i: number, output: unknown): void => {
    const at = lay.result(i);
    if (!validate) {
      codec.writeInto(output, buf, at);
      return;
    }
    try {
      codec.encodeInto(output, buf, at);
    } catch (error) {
      if (error instanceof CodecError) {
        throw new RequestError(ErrorCode.ENV_ERROR, `env ${i}: returned bad values: ${error.message}`);
      }
      throw error;
    }
  };
  const resetOne = (i: number, env: Env<unknown>, seed: bigint | null): void => {
    write(i, seed === null ? env.reset() : env.reset(seed));
  };
  const fail = (i: number, error: unknown): void => {
    const at = lay.ctl(i);
    buf[at + 8] = (buf[at + 8] as number) | FAILED;
    let text: string;
    if (error instanceof RequestError) {
      const prefix = `env ${i}: `;
      text = error.text.startsWith(prefix) ? error.text.slice(prefix.length) : error.text;
    } else {
      text = describeError(error);
    }
    lay.writeText(i, text);
  };
  Atomics.store(i32, doneAt, 1); // ready
  Atomics.notify(i32, doneAt);
  let last = 0;
  for (;;) {
    Atomics.wait(i32, cmdAt, last);
    if (Atomics.load(i32, 0) === CLOSED) break;
    const seq = Atomics.load(i32, cmdAt);
    if (seq === last) continue;
    last = seq;
    const op = i32[lay.word(k, W_OP)];
    for (let i = lo; i < hi; i++) buf[lay.ctl(i) + 8] = 0;
    if (op === OP_STEP) {
      const mode = i32[lay.word(k, W_MODE)] as AutoReset;
      for (let i = lo; i < hi; i++) {
        const env = envs[i - lo]!;
        try {
          if (mode === AutoReset.NEXT_STEP && isDone !== null && isDone(lay.dv, lay.result(i))) {
            resetOne(i, env, null); // the action of a done env is ignored
            continue;
          }
          write(i, env.step(lay.dv.getFloat64(lay.ctl(i), true)));
          if (mode === AutoReset.SAME_STEP && isDone !== null && isDone(lay.dv, lay.result(i))) {
            buf.copy(buf, lay.final(i), lay.result(i), lay.result(i) + codec.size);
            buf[lay.ctl(i) + 8] = ENDED;
            resetOne(i, env, null);
          }
        } catch (error) {
          fail(i, error); // the other envs still step
        }
      }
    } else if (op === OP_RESET) {
      for (let i = lo; i < hi; i++) {
        try {
          resetOne(i, envs[i - lo]!, lay.seed(i));
        } catch (error) {
          fail(i, error);
        }
      }
    } else if (op === OP_RESTORE) {
      const i = i32[lay.word(k, W_ARG)] as number;
      const seed = lay.seed(i);
      const env = envs[i - lo]!;
      let fate = 0;
      const attempts: Array<readonly [number, () => Env<unknown>]> = [
        [1, () => env],
        [2, factory],
      ];
      for (const [code, make] of attempts) {
        try {
          const fresh = make();
          resetOne(i, fresh, seed);
          envs[i - lo] = fresh;
          fate = code;
          break;
        } catch {
          continue;
        }
      }
      buf[lay.ctl(i) + 10] = fate;
    }
    Atomics.store(i32, doneAt, seq);
    Atomics.notify(i32, doneAt);
  }
  process.off("exit", markDead);
  for (const env of envs) {
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

/** The main thread's side: `numEnvs` envs in `workers` threads. */
export class WorkerPool {
  readonly numEnvs: number;
  readonly workers: number;
  readonly spec: WorkerEnvSpec;
  readonly resultSize: number;
  /** The N result records (the SAB view the Session copies from). */
  readonly results: Uint8Array;
  readonly #lay: Layout;
  readonly #ranges: Array<readonly [number, number]>;
  readonly #owner: number[];
  readonly #threads: Array<Worker | null>;
  readonly #seq: number[];
  readonly #recreated = new Set<number>();
  readonly #startTimeout: number;
  #closed = false;
  #spaces: Spaces | null = null;

  constructor(spec: WorkerEnvSpec, numEnvs: number, workers: number, options: { startTimeoutMs?: number } = {}) {
    if (!Number.isInteger(workers) || workers < 1) throw new TransportError("workers must be at least 1");
    if (!Number.isInteger(numEnvs) || numEnvs < 1) throw new TransportError("numEnvs must be at least 1");
    this.spec = spec;
    this.numEnvs = numEnvs;
    this.workers = Math.min(workers, numEnvs);
    const codec = resultCodec(loadSchema(spec));
    this.resultSize = codec.size;
    this.#lay = new Layout(null, numEnvs, this.workers, codec.size);
    this.results = new Uint8Array(this.#lay.sab!, this.#lay.resultsAt, numEnvs * codec.size);
    this.#ranges = split(numEnvs, this.workers);
    this.#owner = [];
    this.#ranges.forEach(([lo, hi], k) => {
      for (let i = lo; i < hi; i++) this.#owner.push(k);
    });
    this.#threads = new Array<Worker | null>(this.workers).fill(null);
    this.#seq = new Array<number>(this.workers).fill(0);
    this.#startTimeout = options.startTimeoutMs ?? 60_000;
    Atomics.store(this.#lay.i32, 0, READY);
    try {
      for (let k = 0; k < this.workers; k++) this.#spawn(k);
      for (let k = 0; k < this.workers; k++) this.#awaitStart(k);
    } catch (error) {
      this.close();
      throw error;
    }
  }

  #spawn(k: number): void {
    const lay = this.#lay;
    for (let w = 0; w < BLOCK / 4; w++) lay.i32[lay.word(k, 0) + w] = 0;
    this.#seq[k] = 0;
    const workerData: WorkerData = {
      sab: lay.sab!,
      numEnvs: this.numEnvs,
      workers: this.workers,
      k,
      spec: this.spec,
    };
    const thread = new Worker(path.join(__dirname, "worker_main.js"), { workerData });
    thread.unref();
    thread.on("error", () => undefined); // reported through the dead word
    this.#threads[k] = thread;
  }

  #awaitStart(k: number): void {
    const lay = this.#lay;
    const doneAt = lay.word(k, W_DONE);
    const deadline = Date.now() + this.#startTimeout;
    while (Atomics.load(lay.i32, doneAt) !== 1) {
      if (Atomics.load(lay.i32, lay.word(k, W_DEAD))) {
        throw new TransportError(`worker thread ${k} (envs ${this.#describe(k)}) died while starting`);
      }
      if (Date.now() > deadline) {
        throw new TransportError(`worker thread ${k} (envs ${this.#describe(k)}) did not start`);
      }
      Atomics.wait(lay.i32, doneAt, 0, 50);
    }
    if (!lay.i32[lay.word(k, W_OK)]) {
      const lo = (this.#ranges[k] as readonly [number, number])[0];
      throw new TransportError(`worker thread ${k}: creating its envs failed: ${lay.readText(lo)}`);
    }
    this.#seq[k] = 1;
  }

  #describe(k: number): string {
    const [lo, hi] = this.#ranges[k] as readonly [number, number];
    return hi - lo > 1 ? `${lo}..${hi - 1}` : String(lo);
  }

  /** The worker threads' ids (index k: worker k). */
  threadIds(): number[] {
    return this.#threads.map((t) => t?.threadId ?? -1);
  }

  envIds(k: number): number[] {
    const [lo, hi] = this.#ranges[k] as readonly [number, number];
    return Array.from({ length: hi - lo }, (_, j) => lo + j);
  }

  /** Send `op` to `workers` and wait for each; returns the workers that died. */
  #run(op: number, workers: readonly number[], arg = 0, mode = 0): number[] {
    if (this.#closed) throw new TransportError("the worker pool is closed");
    const lay = this.#lay;
    const i32 = lay.i32;
    for (const k of workers) {
      i32[lay.word(k, W_OP)] = op;
      i32[lay.word(k, W_ARG)] = arg;
      i32[lay.word(k, W_MODE)] = mode;
      const seq = ((this.#seq[k] as number) + 1) & 0x3fffffff || 2;
      this.#seq[k] = seq;
      Atomics.store(i32, lay.word(k, W_CMD), seq);
      Atomics.notify(i32, lay.word(k, W_CMD));
    }
    const dead: number[] = [];
    for (const k of workers) {
      const doneAt = lay.word(k, W_DONE);
      const seq = this.#seq[k] as number;
      for (;;) {
        const now = Atomics.load(i32, doneAt);
        if (now === seq) break;
        if (Atomics.load(i32, lay.word(k, W_DEAD))) {
          dead.push(k);
          break;
        }
        Atomics.wait(i32, doneAt, now, 50);
      }
    }
    return dead;
  }

  #died(dead: readonly number[], failures: PoolFailure[]): void {
    for (const k of dead) {
      const thread = this.#threads[k];
      const id = thread?.threadId ?? -1;
      void thread?.terminate();
      const envs = this.#describe(k);
      for (const i of this.envIds(k)) {
        const text = `env ${i}: worker thread ${k} (thread id ${id}, envs ${envs}) died`;
        failures.push([i, new RequestError(ErrorCode.ENV_ERROR, text)]);
        this.#recreated.add(i);
      }
      this.#spawn(k);
      this.#awaitStart(k);
    }
    failures.sort((a, b) => a[0] - b[0]);
  }

  #collect(failures: PoolFailure[], skip: ReadonlySet<number>): number[] {
    const lay = this.#lay;
    const ended: number[] = [];
    for (let i = 0; i < this.numEnvs; i++) {
      const flags = lay.bytes[lay.ctl(i) + 8] as number;
      if (!flags || skip.has(this.#owner[i] as number)) continue;
      if (flags & FAILED) {
        failures.push([i, new RequestError(ErrorCode.ENV_ERROR, `env ${i}: ${lay.readText(i)}`)]);
      }
      if (flags & ENDED) ended.push(i);
    }
    return ended;
  }

  spaces(): Spaces {
    if (this.#spaces === null) this.#spaces = loadFactory(this.spec)().spaces();
    return this.#spaces;
  }

  /** Reset every env (env i with `seeds[i]`); results in `results`. */
  reset(seeds: ReadonlyArray<bigint | null>): PoolFailure[] {
    for (let i = 0; i < this.numEnvs; i++) this.#lay.setSeed(i, seeds[i] ?? null);
    const all = this.#ranges.map((_, k) => k);
    const dead = this.#run(OP_RESET, all);
    const failures: PoolFailure[] = [];
    this.#collect(failures, new Set(dead));
    if (dead.length) this.#died(dead, failures);
    return failures;
  }

  /** Step every env; `ended` lists the SAME_STEP envs whose final result is in `finalRecord`. */
  step(actions: ArrayLike<number>, mode: AutoReset): { ended: number[]; failures: PoolFailure[] } {
    const lay = this.#lay;
    for (let i = 0; i < this.numEnvs; i++) lay.dv.setFloat64(lay.ctl(i), actions[i] as number, true);
    const dead = this.#run(OP_STEP, this.#ranges.map((_, k) => k), 0, mode);
    const failures: PoolFailure[] = [];
    const ended = this.#collect(failures, new Set(dead));
    if (dead.length) this.#died(dead, failures);
    return { ended, failures };
  }

  finalRecord(index: number): Uint8Array {
    const at = this.#lay.final(index);
    return this.#lay.bytes.subarray(at, at + this.resultSize);
  }

  /** Reset env `index` after it threw (or recreate it); its result is in `results`. */
  restore(index: number, seed: bigint | null): readonly [fate: string, ok: boolean] {
    const lay = this.#lay;
    lay.setSeed(index, seed);
    lay.bytes[lay.ctl(index) + 10] = 0;
    const k = this.#owner[index] as number;
    if (this.#run(OP_RESTORE, [k], index).length) {
      this.#died([k], []);
      return [FATE_FAILED, false];
    }
    let code = lay.bytes[lay.ctl(index) + 10] as number;
    if (code && this.#recreated.has(index)) code = 3;
    this.#recreated.delete(index);
    return code ? [FATES[code] as string, true] : [FATE_FAILED, false];
  }

  /** Stop every worker thread. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const lay = this.#lay;
    Atomics.store(lay.i32, 0, CLOSED);
    for (let k = 0; k < this.workers; k++) {
      Atomics.add(lay.i32, lay.word(k, W_CMD), 0);
      Atomics.notify(lay.i32, lay.word(k, W_CMD));
    }
    for (const thread of this.#threads) {
      if (thread !== null) void thread.terminate();
    }
  }
}
