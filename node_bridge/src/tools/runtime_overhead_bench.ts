/**
 * The Node env runtime's own cost per env (issue 24 item 2): N envs whose `step` does nothing
 * (each returns its one preallocated pac_env result), stepped through a stream `Session`
 * (STEP_BATCH_REQ decoded, every env checked, stepped, its result encoded into the response
 * buffer, its mask and episode end remembered), in this thread and in a worker pool; the
 * codec's encode of the same results alone (the part of that work the codec does); the in-place
 * path (`stepInto`: an env whose `stepInto` writes nothing, then `EchoEnv`, which copies its
 * record), in this thread and in the pool; and a vector env (`VectorEchoEnv`, issue 24 item 1)
 * through the same session; the pool's in-place path with the session's buffer detached before
 * every step (a zmq reply at large N); and the pool's synchronisation alone (`WorkerPool.ping`: a command
 * its workers answer doing nothing, the floor of any pool step), and the pool alone (`WorkerPool.run`)
 * with private records (one copy out of the pool) and with records in a SharedArrayBuffer (the
 * workers write them in place). Prints, per mode, the median
 * wall and CPU time (every thread of this process) per env of one batch, and the CPU time less
 * the envs' own `step` calls: the runtime's overhead per env.
 *
 *   node dist/tools/runtime_overhead_bench.js [--num-envs 256] [--batches 400] [--repeats 7]
 *       [--workers 2] [--only local|pool|vector] [--json]
 *
 * One run, medians of `repeats` timed blocks of `batches` batches each (after a warm-up). On a
 * loaded machine wall times mean little and CPU times are inflated too: compare rows of one run.
 */

import type { StepResultInput } from "../generated/pac_env";
import * as pac_env from "../generated/pac_env";
import { AutoReset } from "../protocol";
import type { Action, Env, ResultRow, Spaces } from "../runtime/env";
import { EnvHost } from "../runtime/host";
import { Op, type Records } from "../runtime/core";
import { WorkerPool } from "../runtime/pool";
import { Session } from "../runtime/session";
import { EchoEnv, echoResult } from "../envs/echo";
import { VectorEchoEnv } from "../envs/vector_echo";

/** An env whose step does nothing: it returns its one preallocated result. */
export class NoopEnv implements Env<StepResultInput> {
  readonly #result: StepResultInput = echoResult();

  spaces(): Spaces {
    return { obsN: 612, actN: 92 };
  }

  reset(): StepResultInput {
    return this.#result;
  }

  step(): StepResultInput {
    return this.#result;
  }
}

/** The worker pool's factory (`WorkerEnvSpec.exportName`). */
export function noopEnv(): NoopEnv {
  return new NoopEnv();
}

/**
 * An env whose step does nothing on the in-place path (`stepInto` writes nothing, `resetInto`
 * one encoded record): what is left of a batched step is the runtime's own work.
 */
export class NoopIntoEnv implements Env<StepResultInput> {
  readonly #result: StepResultInput = echoResult();

  spaces(): Spaces {
    return { obsN: 612, actN: 92 };
  }

  reset(): StepResultInput {
    return this.#result;
  }

  step(): StepResultInput {
    return this.#result;
  }

  resetInto(_seed: bigint | null, out: ResultRow): void {
    pac_env.StepResultCodec.writeInto(this.#result, out.bytes, out.at);
  }

  stepInto(_action: Action, _out: ResultRow): void {
    // nothing: the record keeps what the reset wrote
  }

  observeInto(_out: ResultRow): void {
    // nothing
  }
}

/** The worker pool's factory of in-place envs. */
export function noopIntoEnv(): NoopIntoEnv {
  return new NoopIntoEnv();
}

/** The worker pool's factory of echo envs. */
export function echoEnv(): EchoEnv {
  return new EchoEnv();
}

interface Args {
  numEnvs: number;
  batches: number;
  repeats: number;
  workers: number;
  only: string | null;
  json: boolean;
}

function parseArgs(argv: readonly string[]): Args {
  const args: Args = { numEnvs: 256, batches: 400, repeats: 7, workers: 2, only: null, json: false };
  for (let k = 0; k < argv.length; k++) {
    const flag = argv[k];
    const value = (): number => {
      const v = Number(argv[++k]);
      if (!Number.isInteger(v) || v < 1) throw new Error(`${flag} takes a positive integer`);
      return v;
    };
    if (flag === "--num-envs") args.numEnvs = value();
    else if (flag === "--batches") args.batches = value();
    else if (flag === "--repeats") args.repeats = value();
    else if (flag === "--workers") args.workers = value();
    else if (flag === "--only") args.only = argv[++k] ?? null;
    else if (flag === "--json") args.json = true;
    else throw new Error(`unknown argument ${String(flag)} (see the file's header)`);
  }
  return args;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

/** Median microseconds per env of `block()` (`batches` batches of `numEnvs`): wall and CPU time. */
interface Timing {
  /** Wall-clock time (what a client waits; inflated on a loaded machine). */
  readonly wall: number;
  /** CPU time of this process, every thread (the work done; less sensitive to load). */
  readonly cpu: number;
}

function timePerEnv(block: () => void, args: Args): Timing {
  for (let w = 0; w < 3; w++) block(); // warm-up: optimised code, grown buffers
  const walls: number[] = [];
  const cpus: number[] = [];
  const envs = args.batches * args.numEnvs;
  for (let r = 0; r < args.repeats; r++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    block();
    const ns = Number(process.hrtime.bigint() - t0);
    const c = process.cpuUsage(c0);
    walls.push(ns / 1000 / envs);
    cpus.push((c.user + c.system) / envs);
  }
  return { wall: median(walls), cpu: median(cpus) };
}

/** A session of `host` past HELLO (mode `mode`) and a reset; its STEP_BATCH_REQ body. */
function readySession(host: EnvHost, mode: AutoReset): { session: Session; body: Uint8Array } {
  const session = new Session(host.runtime());
  session.runtime.autoreset = mode;
  session.helloDone = true;
  const ids = session.ids;
  const type = session.handle(ids.RESET_REQ, new Uint8Array(0), 0, 0);
  if (type !== ids.RESET_RESP) throw new Error(`reset answered ${type}: ${session.body().toString("utf8", 4)}`);
  const size = pac_env.SCHEMA.structs["StepRequest"]?.size ?? 4;
  const body = new Uint8Array(host.numEnvs * size);
  for (let i = 0; i < host.numEnvs; i++) body[i * size] = i % 92;
  return { session, body };
}

function stepBlock(session: Session, body: Uint8Array, batches: number, detach = false): () => void {
  const ids = session.ids;
  return () => {
    for (let b = 0; b < batches; b++) {
      if (detach) session.detachBuffer(); // as a zmq server does after handing a large reply over
      const type = session.handle(ids.STEP_BATCH_REQ, body, 0, body.byteLength);
      if (type !== ids.STEP_BATCH_RESP) throw new Error(`step answered ${type}: ${session.body().toString("utf8", 4)}`);
    }
  };
}

interface Row {
  mode: string;
  wall_us_per_env: number;
  cpu_us_per_env: number;
  env_own_cpu_us_per_env: number;
  /** CPU time per env less the envs' own: the runtime's overhead. */
  overhead_cpu_us_per_env: number;
}

function run(args: Args): Row[] {
  const rows: Row[] = [];
  const n = args.numEnvs;
  const want = (mode: string): boolean => args.only === null || args.only === mode;
  // the envs' own cost: their step called N times per batch, nothing else
  const envs = Array.from({ length: n }, () => new NoopEnv());
  let sink = 0;
  const own = timePerEnv(() => {
    for (let b = 0; b < args.batches; b++) for (let i = 0; i < n; i++) sink += (envs[i] as NoopEnv).step().reward;
  }, args);
  if (sink !== 0) throw new Error("unreachable");
  const add = (mode: string, timing: Timing, ownTiming: Timing): void => {
    rows.push({
      mode,
      wall_us_per_env: timing.wall,
      cpu_us_per_env: timing.cpu,
      env_own_cpu_us_per_env: ownTiming.cpu,
      overhead_cpu_us_per_env: timing.cpu - ownTiming.cpu,
    });
  };
  if (want("local")) {
    // the codec's part of the runtime's work: encoding each env's result into its record
    const codec = pac_env.StepResultCodec;
    const result = new NoopEnv().step();
    const buffer = new Uint8Array(n * codec.size);
    for (const validate of [true, false]) {
      const encode = timePerEnv(() => {
        for (let b = 0; b < args.batches; b++) {
          for (let i = 0; i < n; i++) {
            if (validate) codec.encodeInto(result, buffer, i * codec.size);
            else codec.writeInto(result, buffer, i * codec.size);
          }
        }
      }, args);
      add(`codec ${validate ? "encodeInto" : "writeInto"} alone`, encode, own);
    }
    for (const validate of [true, false]) {
      const host = new EnvHost(noopEnv, { numEnvs: n, validate });
      const { session, body } = readySession(host, AutoReset.NEXT_STEP);
      add(`local validate=${validate}`, timePerEnv(stepBlock(session, body, args.batches), args), own);
      session.runtime.close();
    }
    // the in-place path (stepInto): the runtime's own work, then the echo env's record copy
    for (const [mode, make] of [["local stepInto (noop)", noopIntoEnv], ["local EchoEnv stepInto", echoEnv]] as const) {
      const host = new EnvHost(make, { numEnvs: n });
      const { session, body } = readySession(host, AutoReset.NEXT_STEP);
      add(mode, timePerEnv(stepBlock(session, body, args.batches), args), own);
      session.runtime.close();
    }
  }
  if (want("vector")) {
    const host = new EnvHost(VectorEchoEnv, { numEnvs: n });
    const { session, body } = readySession(host, AutoReset.NEXT_STEP);
    const env = new VectorEchoEnv(n);
    const columns = session.runtime.runner.columns;
    if (columns === undefined) throw new Error("the vector env did not get a vector runner");
    const actions = new Float64Array(n);
    const vectorOwn = timePerEnv(() => {
      for (let b = 0; b < args.batches; b++) env.stepEnvs(actions, null, columns);
    }, args);
    add("vector (VectorEchoEnv)", timePerEnv(stepBlock(session, body, args.batches), args), vectorOwn);
    session.runtime.close();
  }
  if (want("pool")) {
    for (const [label, make, exportName] of [
      ["", noopEnv, "noopEnv"],
      [" stepInto (noop)", noopIntoEnv, "noopIntoEnv"],
      [" EchoEnv stepInto", echoEnv, "echoEnv"],
    ] as const) {
      const host = new EnvHost(make, {
        numEnvs: n,
        workers: args.workers,
        workerEnv: { module: __filename, exportName },
      });
      const { session, body } = readySession(host, AutoReset.NEXT_STEP);
      const pooled = { ...args, batches: Math.max(1, Math.floor(args.batches / 4)) };
      add(`pool workers=${args.workers}${label}`, timePerEnv(stepBlock(session, body, pooled.batches), pooled), own);
      if (exportName === "echoEnv") {
        // a zmq reply at large N: the session's buffer handed away after every step (a fresh
        // private one from the second: the pool copies back). EchoEnv writes its whole record, as
        // the contract says; the noop one leaves the record as it was, which a moved one is not
        add(`pool workers=${args.workers}${label} detached per step`, timePerEnv(stepBlock(session, body, pooled.batches, true), pooled), own);
      }
      const runner = session.runtime.runner as unknown as { start?: () => { ping?: () => number[] } };
      const pool = runner.start?.();
      if (label === "" && pool?.ping !== undefined) {
        // the pool's synchronisation alone: a command its workers answer doing nothing
        const ping = (): void => {
          for (let b = 0; b < pooled.batches; b++) pool.ping!();
        };
        add(`pool workers=${args.workers} sync only`, timePerEnv(ping, pooled), own);
      }
      session.runtime.close();
    }
    // the pool alone (WorkerPool.run, no session): results copied out of the pool's area into
    // private records, then written in place by the workers into records in a SharedArrayBuffer
    const pool = new WorkerPool({ module: __filename, exportName: "noopIntoEnv" }, n, args.workers);
    try {
      const size = pool.resultSize;
      const ops = new Uint8Array(n).fill(Op.STEP);
      const actions = new Float64Array(n);
      const seeds = new Array<bigint | null>(n).fill(null);
      const pooled = { ...args, batches: Math.max(1, Math.floor(args.batches / 4)) };
      for (const [label, memory] of [
        ["", new ArrayBuffer(n * size)],
        [" in place (shared records)", new SharedArrayBuffer(n * size)],
      ] as const) {
        const out: Records = { bytes: new Uint8Array(memory), at: (i) => i * size, packed: true, written: () => undefined, keepFinal: () => undefined };
        pool.run(new Uint8Array(n).fill(Op.RESET), actions, seeds, out);
        const block = (): void => {
          for (let b = 0; b < pooled.batches; b++) pool.run(ops, actions, seeds, out);
        };
        add(`pool.run workers=${args.workers} stepInto${label}`, timePerEnv(block, pooled), own);
      }
    } finally {
      pool.close();
    }
  }
  return rows;
}

function main(): void {
  const args = parseArgs(process.argv.slice(2));
  const rows = run(args);
  if (args.json) {
    process.stdout.write(JSON.stringify({ num_envs: args.numEnvs, batches: args.batches, repeats: args.repeats, rows }) + "\n");
    return;
  }
  process.stdout.write(`N = ${args.numEnvs}, ${args.batches} batches x ${args.repeats} repeats (medians; one run)\n`);
  for (const row of rows) {
    process.stdout.write(
      `${row.mode.padEnd(32)} wall ${row.wall_us_per_env.toFixed(3)} us/env, cpu ${row.cpu_us_per_env.toFixed(3)} us/env ` +
        `(env own ${row.env_own_cpu_us_per_env.toFixed(3)}; runtime overhead ${row.overhead_cpu_us_per_env.toFixed(3)} us/env)\n`,
    );
  }
}

if (require.main === module) main();
