/**
 * A client's N envs in K worker_threads (`serve.js URL --env NAME --num-envs N --workers K`): the
 * second runner of the env runtime (core.ts), the Node counterpart of Python's process pool.
 *
 * Worker k owns envs [lo, hi) (an even split, the first workers get one more), built by name
 * from `ENVS` (or from `module`'s `exportName` factory), so each env keeps its own RNG stream
 * for the pool's lifetime and the results are byte for byte those of the in-thread runner. A
 * worker runs an `EnvTable` (local.ts) over its envs: the same per-env operations. One
 * SharedArrayBuffer carries everything; a lock-step request fans out and gathers synchronously:
 *
 * ```
 * 0        state i32 (READY 1, CLOSED 2) | doorbell i32 at 8 (bumped per finished asynchronous
 *          env) | wake_at i32 at 12 (the doorbell value the main thread waits for) | mode i32 at 16
 *          | finished i32 at 20 (bumped by each worker that finished a command) | finish_at i32
 *          at 24 (finished's value once every worker of the command did: the one notify)
 * 64       worker k's block (64 bytes): cmd i32 (main -> worker sequence), done i32 (worker ->
 *          main sequence), task, arg, bell (bumped with every command and submit), ok, dead
 * ctl      N x 1024-byte env records: seed_neg u8 at 7 | has_seed u8 at 9
 *          | error_len u16 at 12 | seed u64 at 16 | text u8[1000] at 24
 * actions  N x E f64: env i's action (E elements: 1 for Discrete, the array's for Box and
 *          MultiDiscrete), as the runtime holds it; a worker hands it to its env through the
 *          runtime's one rule (`actionOf`): the env gets what it gets in this thread
 * async    N x i32 state (IDLE 0, PENDING 1, DONE 2) | N x i32 finish ticket | N x u8 op | N x u8 flags
 * lock     N x u8 op | N x u8 flags (FAILED 2) of the lock-step command: contiguous, so that a
 *          step's per-env marks are a few cache lines, not one 1024-byte record each (issue 24
 *          item 2: the records' lines moving between threads cost more than the envs' steps)
 * results  N x the result struct (the codec's packed layout), copied into the runtime's records
 * finals   N x the result struct (SAME_STEP final results of asynchronous steps)
 * ```
 *
 * The main thread writes every env's op and action (one copy each), bumps the `cmd` of each
 * worker that has work (and its `bell`, Atomics.notify), then Atomics.wait on `finished` in 50
 * ms slices: each worker bumps it after its `done` word and only the last one notifies (one
 * sleep and one wake per command whatever K). Results land in the pool's results area and are
 * copied into the runtime's records, or, when those records lie in a SharedArrayBuffer (a
 * session that holds its response buffer in one: `PoolRunner.wantsSharedRecords`), the workers
 * write them there themselves: no copy. Where they write is told once per change (a session
 * whose buffer was detached: a zmq reply handed to libzmq), by a message on each worker's
 * MessagePort and its `rows` word, which the worker reads with the next command it gets: no
 * command of its own (no extra round trip), nothing at all while the records stay where they
 * are. `ping` is a command that does nothing: the pool's synchronisation alone.
 *
 * Asynchronous batches (`submit` / `take` / `poll`, Python's `submit` / `poll`): the main thread
 * marks each env PENDING with its op and rings its worker's bell; a worker steps its PENDING envs
 * one by one (a lock-step command waiting is served between two), and marks each DONE as soon as
 * it finishes (SAME_STEP: the final result kept, the env reset, in the worker), then bumps the
 * doorbell (Atomics.notify once it reaches `wake_at`). The main thread never blocks its event
 * loop for them: `poll` awaits `Atomics.waitAsync` on the doorbell in 50 ms slices, checking the
 * workers' `dead` words. A worker records env
 * errors with their texts (the runtime recovers them). A worker that dies (process.exit in env
 * code, an uncaught error) sets its `dead` word on its way out: its envs fail with
 * `env i: worker thread k (thread id T, envs a..b) died`, the worker is replaced by a fresh one,
 * and the runtime's recovery resets the fresh envs ("the env was recreated in a new worker thread").
 * A lock-step command has a deadline (`stepTimeoutMs`, default 60 s): a worker that has not
 * answered by then (an env stuck in its step) is given up on (its done word swapped to ABANDONED),
 * terminated and replaced the same way, its envs failing with `... did not answer within the
 * step timeout`: the main thread's event loop is blocked for at most that long. An `info()` map
 * too large for its env record (a rendered frame) is posted on the worker's port (INFO_PORTED).
 */

import { decode as msgpackDecode, encode as msgpackEncode } from "@msgpack/msgpack";
import * as path from "node:path";
import { MessageChannel, type MessagePort, Worker, receiveMessageOnPort } from "node:worker_threads";
import { readFileSync } from "node:fs";
import { type SchemaModule, loadSchema as loadSchemaIr } from "../codec";
import type { SchemaJson } from "../ir";
import { TransportError } from "../errors";
import * as pac_env from "../generated/pac_env";
import { AutoReset, ErrorCode, RequestError } from "../protocol";
import {
  ActionRule,
  type AsyncDone,
  type ConcurrentRunner,
  type Failure,
  FATE_RECREATED,
  Op,
  type Records,
  type Runner,
  actionOf,
  bodyCodec,
  describeError,
  episodeEndReader,
  failureText,
  remoteTraceback,
  withTraceback,
} from "./core";
import { type Env, type EnvOrFactory, type Spaces, makerOf } from "./env";
import { EnvTable } from "./local";

const FATE_NEW_THREAD = `${FATE_RECREATED} in a new worker thread`;

const READY = 1;
const CLOSED = 2;
const TASK_RUN = 1;
const TASK_INFO = 2;
/** A command that does nothing (`WorkerPool.ping`: the pool's synchronisation alone). */
const TASK_NOP = 3;
const FAILED = 2;
/** An asynchronous step's flags: its episode ended (SAME_STEP, final kept); it threw. */
const ASYNC_ENDED = 1;
const ASYNC_FAILED = 2;
// an env's asynchronous state: the main thread sets PENDING, its worker DONE
const IDLE = 0;
const PENDING = 1;
const DONE = 2;
// i32 words of the header
const DOORBELL = 2;
const WAKE_AT = 3;
const MODE = 4;
/** Bumped by each worker that finished a command; FINISH_AT: its value once all of them did. */
const FINISHED = 5;
const FINISH_AT = 6;
/** Milliseconds of one asynchronous wait before the workers' liveness is checked again. */
const POLL_SLICE_MS = 50;
const BLOCK = 64;
const CTL = 1024;
const TEXT_AT = 24;
const TEXT_MAX = CTL - TEXT_AT;
/**
 * The text length of an env record whose `info()` map did not fit its text area (a rendered
 * frame): the worker posted the msgpack bytes on its port before its done word, and the main
 * thread takes them with `receiveMessageOnPort` (no size limit; a step never pays for it).
 */
const INFO_PORTED = 0xffff;
/**
 * A worker's done word once the main thread gave up on its command (the step timeout): the
 * worker, should its env code ever return, finds its compare-and-swap of the word failed and
 * stops without a word more (the main thread has terminated and replaced it).
 */
const ABANDONED = -1;
/**
 * The default of `stepTimeoutMs` (WorkerEnvSpec): how long one command (a lock-step step or
 * reset of a worker's envs, an info()) may run before its worker counts as stuck. Generous: a
 * worker's share of a batch of slow envs (256 envs of 100 ms each: 26 s) is not cut off; the
 * bound is that of a hang (an env that never returns), not of a slow step.
 */
export const DEFAULT_STEP_TIMEOUT_MS = 60_000;
// i32 words of a worker block
const W_CMD = 0;
const W_DONE = 1;
const W_TASK = 2;
const W_ARG = 3;
const W_BELL = 4;
const W_OK = 5;
const W_DEAD = 6;
/**
 * Set (by the main thread, before a command) when a message on the worker's port says where its
 * lock-step results go from now on: the runtime's own records when they lie in a
 * SharedArrayBuffer (written in place, no copy), else this pool's results area. The worker
 * takes the message with the next command it gets (whatever the task) and clears the word.
 */
const W_ROWS = 7;
// bytes of an env record
const C_SEED_NEG = 7;
const C_HAS_SEED = 9;
const C_TEXT_LEN = 12;
const C_SEED = 16;

/** Where a worker thread gets its envs (and the schema). */
export interface WorkerEnvSpec {
  /** A name in `ENVS` (envs/index.ts); ignored when `module` is given. */
  readonly envName?: string;
  /** A module path whose `exportName` export is an env factory (tests, user modules). */
  readonly module?: string;
  readonly exportName?: string;
  /** A module path whose `SCHEMA` export is the schema (default: the generated pac_env). */
  readonly schemaModule?: string;
  /** Validate env results (default true). */
  readonly validate?: boolean;
  /**
   * How long one lock-step command (a step or reset of a worker's envs, an `info()`) may take
   * in a worker thread before the worker counts as stuck (an env whose step never returns):
   * the thread is terminated and replaced, its envs fail with a typed ENV_ERROR that says so
   * (as for a worker that died) and are recreated; the server serves again. Default
   * `DEFAULT_STEP_TIMEOUT_MS` (60 s). The main thread blocks for a lock-step command: other
   * clients wait at most this long.
   */
  readonly stepTimeoutMs?: number;
}

interface WorkerData {
  readonly sab: SharedArrayBuffer;
  readonly numEnvs: number;
  readonly workers: number;
  readonly k: number;
  readonly spec: WorkerEnvSpec;
  /**
   * Rows messages (W_ROWS; the main thread posts before the command: read synchronously); the
   * other way, an `info()` map too large for its env record (INFO_PORTED).
   */
  readonly port: MessagePort;
}

/** An `info()` map a worker posts on its port (INFO_PORTED): its command's seq and env. */
interface InfoMessage {
  readonly seq: number;
  readonly index: number;
  readonly bytes: Uint8Array;
}

/** A rows message (W_ROWS): env i's lock-step result at `bytes[at + i * size]`; null: the pool's area. */
type RowsMessage = { readonly sab: SharedArrayBuffer; readonly at: number } | null;

/** `Atomics.waitAsync` (Node 16+; the project's TypeScript lib predates its declaration). */
const waitAsync = (Atomics as unknown as {
  waitAsync(array: Int32Array, index: number, value: number, timeoutMs: number): { async: boolean; value: Promise<string> | string };
}).waitAsync;

function noop(): void {
  // a timer that only keeps the event loop alive
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
  /** Every env's action (`elements` f64 each, env i's at i * elements). */
  readonly actions: Float64Array;
  /** i32 index of env 0's asynchronous state word (env i: + i) and finish ticket (+ N + i). */
  readonly stateWord: number;
  readonly ticketWord: number;
  /** Bytes: env i's asynchronous op and flags. */
  readonly asyncOpAt: number;
  readonly asyncFlagsAt: number;
  /** Bytes: env i's lock-step op and flags (contiguous: `lock` in the layout above). */
  readonly opAt: number;
  readonly flagsAt: number;
  readonly resultsAt: number;
  readonly finalsAt: number;
  readonly size: number;

  constructor(
    readonly sab: SharedArrayBuffer | null,
    numEnvs: number,
    workers: number,
    readonly resultSize: number,
    elements: number,
  ) {
    this.ctlAt = BLOCK * (1 + workers);
    const actionsAt = align(this.ctlAt + numEnvs * CTL);
    const statesAt = align(actionsAt + numEnvs * elements * 8);
    this.stateWord = statesAt / 4;
    this.ticketWord = this.stateWord + numEnvs;
    this.asyncOpAt = statesAt + 8 * numEnvs;
    this.asyncFlagsAt = this.asyncOpAt + numEnvs;
    this.opAt = align(this.asyncFlagsAt + numEnvs);
    this.flagsAt = align(this.opAt + numEnvs);
    this.resultsAt = align(this.flagsAt + numEnvs);
    this.finalsAt = align(this.resultsAt + numEnvs * resultSize);
    this.size = align(this.finalsAt + numEnvs * resultSize);
    const buf = sab ?? new SharedArrayBuffer(this.size);
    this.sab = buf;
    this.i32 = new Int32Array(buf);
    this.bytes = new Uint8Array(buf);
    this.dv = new DataView(buf);
    this.actions = new Float64Array(buf, actionsAt, numEnvs * elements);
  }

  /** Env i's action from `actions` (the runtime's, `elements` each) into the shared area. */
  putAction(i: number, actions: Float64Array, elements: number): void {
    if (elements === 1) this.actions[i] = actions[i] as number;
    else this.actions.set(actions.subarray(i * elements, (i + 1) * elements), i * elements);
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

  writeText(i: number, data: Uint8Array): void {
    let n = Math.min(data.length, TEXT_MAX);
    while (n > 0 && n < data.length && ((data[n] as number) & 0xc0) === 0x80) n--; // whole chars
    const at = this.ctl(i);
    this.bytes.set(data.subarray(0, n), at + TEXT_AT);
    this.dv.setUint16(at + C_TEXT_LEN, n, true);
  }

  text(i: number): Uint8Array {
    const at = this.ctl(i);
    const n = this.dv.getUint16(at + C_TEXT_LEN, true);
    return this.bytes.slice(at + TEXT_AT, at + TEXT_AT + n);
  }

  setSeed(i: number, seed: bigint | null): void {
    const at = this.ctl(i);
    this.bytes[at + C_HAS_SEED] = seed === null ? 0 : 1;
    const s = seed ?? 0n;
    this.bytes[at + C_SEED_NEG] = s < 0n ? 1 : 0;
    this.dv.setBigUint64(at + C_SEED, s < 0n ? -s : s, true);
  }

  seed(i: number): bigint | null {
    const at = this.ctl(i);
    if (!this.bytes[at + C_HAS_SEED]) return null;
    const s = this.dv.getBigUint64(at + C_SEED, true);
    return this.bytes[at + C_SEED_NEG] ? -s : s;
  }
}

function loadSchema(spec: WorkerEnvSpec): SchemaModule {
  return spec.schemaModule === undefined ? pac_env.SCHEMA : schemaFromPath(spec.schemaModule);
}

/**
 * A schema from a path: a compiled IR (`.json`, `transport-schema inspect --json`: built at run
 * time, no build step) or a generated module's `SCHEMA`.
 */
export function schemaFromPath(path: string): SchemaModule {
  if (path.endsWith(".json")) return loadSchemaIr(JSON.parse(readFileSync(path, "utf8")) as SchemaJson);
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const schema = (require(path) as { SCHEMA?: SchemaModule }).SCHEMA;
  if (schema === undefined) throw new TransportError(`${path} exports no SCHEMA (a module transport-schema compile generated)`);
  return schema;
}

/**
 * The env maker a spec names: `module`'s `exportName` export, or `envName` in `ENVS`. The
 * export is a zero-argument function or an env class (docs/server.md), called as the main
 * thread's host calls it (`makerOf`: `new C()` for a class).
 */
export function loadFactory(spec: WorkerEnvSpec): () => Env<unknown> {
  if (spec.module !== undefined) {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const mod = require(spec.module) as Record<string, unknown>;
    const make = mod[spec.exportName ?? "default"];
    if (typeof make !== "function") throw new TransportError(`${spec.module} has no factory ${spec.exportName}`);
    return makerOf(make as EnvOrFactory);
  }
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { ENVS } = require("../envs") as typeof import("../envs");
  const make = ENVS[spec.envName ?? ""];
  if (make === undefined) throw new TransportError(`unknown env ${JSON.stringify(spec.envName)}`);
  return make as () => Env<unknown>;
}

/** The body of a worker thread (worker_main.ts): run envs [lo, hi)'s operations on command. */
export function runWorker(data: WorkerData): void {
  const { numEnvs, workers, k, spec } = data;
  const schema = loadSchema(spec);
  const codec = bodyCodec(schema, "STEP_RESP");
  const ended = episodeEndReader(schema);
  const rule = new ActionRule(schema);
  const lay = new Layout(data.sab, numEnvs, workers, codec.size, rule.elements);
  const i32 = lay.i32;
  const cmdAt = lay.word(k, W_CMD);
  const doneAt = lay.word(k, W_DONE);
  const bellAt = lay.word(k, W_BELL);
  const rowsWord = lay.word(k, W_ROWS);
  const markDead = (): void => {
    Atomics.store(i32, lay.word(k, W_DEAD), 1);
    Atomics.notify(i32, doneAt);
    Atomics.notify(i32, FINISHED); // a main thread awaiting a command looks now
    Atomics.add(i32, DOORBELL, 1); // a main thread awaiting asynchronous envs looks now
    Atomics.notify(i32, DOORBELL);
  };
  process.on("exit", markDead);
  const [lo, hi] = split(numEnvs, workers)[k] as readonly [number, number];
  const buf = lay.bytes;
  let table: EnvTable;
  try {
    const factory = loadFactory(spec);
    const envs: Array<Env<unknown>> = [];
    for (let i = lo; i < hi; i++) envs.push(factory());
    table = new EnvTable(envs, codec, factory, spec.validate ?? true, lo);
    i32[lay.word(k, W_OK)] = 1;
  } catch (error) {
    lay.writeText(lo, Buffer.from(describeError(error), "utf-8"));
    i32[lay.word(k, W_OK)] = 0;
    Atomics.store(i32, doneAt, 1);
    Atomics.notify(i32, doneAt);
    process.off("exit", markDead);
    return;
  }
  // where lock-step results go (W_ROWS): the pool's results area, or the runtime's records
  let rows: Uint8Array = buf;
  let rowsAt = lay.resultsAt;
  const errorText = (i: number, error: unknown): Uint8Array =>
    Buffer.from(withTraceback(failureText(i, error), remoteTraceback(error), TEXT_MAX), "utf-8"); // + last frames
  const fail = (i: number, error: unknown): void => {
    buf[lay.flagsAt + i] = FAILED;
    lay.writeText(i, errorText(i, error));
  };
  let cursor = lo; // the next env to look at for PENDING (round robin: none starves)
  /** The next PENDING env of this worker, or -1. */
  const nextPending = (): number => {
    for (let n = 0; n < hi - lo; n++) {
      const i = cursor;
      cursor = cursor + 1 === hi ? lo : cursor + 1;
      if (Atomics.load(i32, lay.stateWord + i) === PENDING) return i;
    }
    return -1;
  };
  /** Step env i (its asynchronous op), mark it DONE and ring the doorbell. */
  const stepAsync = (i: number): void => {
    const op = buf[lay.asyncOpAt + i] as number;
    const at = lay.result(i);
    let flags = 0;
    try {
      table.apply(i, op, op === Op.STEP ? actionOf(rule, lay.actions, i) : 0, null, buf, at);
      if (op === Op.STEP && Atomics.load(i32, MODE) === AutoReset.SAME_STEP && ended(lay.dv, at)) {
        buf.copyWithin(lay.final(i), at, at + codec.size); // the final result, then the reset's
        flags = ASYNC_ENDED;
        table.apply(i, Op.RESET, 0, null, buf, at);
      }
    } catch (error) {
      flags = ASYNC_FAILED;
      lay.writeText(i, errorText(i, error));
    }
    buf[lay.asyncFlagsAt + i] = flags;
    const ticket = Atomics.add(i32, DOORBELL, 1) + 1;
    i32[lay.ticketWord + i] = ticket;
    Atomics.store(i32, lay.stateWord + i, DONE); // publishes the result, flags and ticket
    if (((ticket - Atomics.load(i32, WAKE_AT)) | 0) >= 0) Atomics.notify(i32, DOORBELL);
  };
  Atomics.store(i32, doneAt, 1); // ready
  Atomics.notify(i32, doneAt);
  let last = 0;
  let lastDone = 1; // this worker's done word, unless the main thread gave up on it
  let abandoned = false;
  for (;;) {
    const bell = Atomics.load(i32, bellAt); // read first: any later ring makes the wait return
    if (Atomics.load(i32, 0) === CLOSED) break;
    if (Atomics.load(i32, doneAt) !== lastDone) {
      abandoned = true; // given up on (stuck in an asynchronous step): replaced, stop quietly
      break;
    }
    const seq = Atomics.load(i32, cmdAt);
    if (seq !== last) {
      last = seq;
      if (Atomics.load(i32, rowsWord) !== 0) {
        // where results go now: posted before the command, so already queued (the retries only
        // guard that assumption); the last message wins (the rows moved twice while this worker
        // had no command)
        Atomics.store(i32, rowsWord, 0);
        let received = receiveMessageOnPort(data.port);
        for (let tries = 0; received === undefined && tries < 1000; tries++) {
          Atomics.wait(i32, bellAt, Atomics.load(i32, bellAt), 1);
          received = receiveMessageOnPort(data.port);
        }
        for (let more = received; more !== undefined; more = receiveMessageOnPort(data.port)) received = more;
        const message = received?.message as RowsMessage | undefined;
        if (message === undefined || message === null) {
          rows = buf;
          rowsAt = lay.resultsAt;
        } else {
          rows = new Uint8Array(message.sab);
          rowsAt = message.at;
        }
      }
      const task = i32[lay.word(k, W_TASK)];
      if (task === TASK_NOP) {
        // nothing: answered below
      } else if (task === TASK_INFO) {
        const i = i32[lay.word(k, W_ARG)] as number;
        let encoded: Uint8Array;
        try {
          encoded = msgpackEncode(table.info(i));
        } catch (error) {
          encoded = msgpackEncode({ error: describeError(error) });
        }
        if (encoded.length <= TEXT_MAX) {
          lay.writeText(i, encoded);
        } else {
          // a frame: on the port, queued before the done word below (taken synchronously)
          const message: InfoMessage = { seq, index: i, bytes: encoded };
          data.port.postMessage(message);
          lay.dv.setUint16(lay.ctl(i) + C_TEXT_LEN, INFO_PORTED, true);
        }
      } else {
        buf.fill(0, lay.flagsAt + lo, lay.flagsAt + hi);
        const opAt = lay.opAt;
        const size = codec.size;
        for (let i = lo; i < hi; i++) {
          const op = buf[opAt + i] as number;
          if (op === Op.NONE) continue;
          try {
            if (op === Op.STEP) table.apply(i, op, actionOf(rule, lay.actions, i), null, rows, rowsAt + i * size);
            else table.apply(i, op, 0, lay.seed(i), rows, rowsAt + i * size);
          } catch (error) {
            fail(i, error); // the other envs still do theirs
          }
        }
      }
      // a compare-and-swap: the main thread may have given up on this command (ABANDONED, the
      // step timeout) and replaced this thread; it then stops here, bumping nothing
      if (Atomics.compareExchange(i32, doneAt, lastDone, seq) !== lastDone) {
        abandoned = true;
        break;
      }
      lastDone = seq;
      // the last worker of the command wakes the main thread (one wake, not one per worker)
      if (((Atomics.add(i32, FINISHED, 1) + 1) | 0) === Atomics.load(i32, FINISH_AT)) Atomics.notify(i32, FINISHED);
      continue;
    }
    const i = nextPending();
    if (i >= 0) {
      stepAsync(i); // then look for a command again: a lock-step request waits one env step at most
      continue;
    }
    Atomics.wait(i32, bellAt, bell);
  }
  process.off("exit", markDead);
  if (!abandoned) table.close();
}

/** The main thread's side: `numEnvs` envs in `workers` threads. */
export class WorkerPool {
  readonly numEnvs: number;
  readonly workers: number;
  readonly spec: WorkerEnvSpec;
  readonly resultSize: number;
  /** Elements of one action (1: Discrete; an array action's count). */
  readonly actionElements: number;
  readonly #lay: Layout;
  readonly #ranges: Array<readonly [number, number]>;
  readonly #owner: number[];
  readonly #threads: Array<Worker | null>;
  readonly #threadIds: number[] = [];
  readonly #seq: number[];
  readonly #busy: Uint8Array;
  /** Env i's result bytes in the shared area (views made once: copying one out allocates nothing). */
  readonly #results: readonly Uint8Array[];
  /** Envs of a replaced worker, until the runtime's recovery has reset them. */
  readonly #replaced = new Set<number>();
  readonly #startTimeout: number;
  /** How long one lock-step command may take before its unfinished workers count as stuck. */
  readonly #stepTimeout: number;
  /** Why worker k is to be replaced when it was not its death: it was stuck (the step timeout). */
  readonly #stuck: Array<string | null>;
  /** Envs submitted (asynchronous batches) and not DONE yet. */
  readonly #pending = new Set<number>();
  /** Envs DONE, their results copied out, not taken yet (finishing order). */
  readonly #completed: AsyncDone[] = [];
  /** Each worker's rows port (W_ROWS), and where its lock-step results go now (null: the pool's area). */
  readonly #ports: Array<MessagePort | null>;
  readonly #rowsSab: Array<SharedArrayBuffer | null>;
  readonly #rowsAt: number[];
  /** Lock-step commands whose results were copied back from the pool's area (`copiedBack`). */
  #copiedBack = 0;
  #closed = false;

  constructor(
    spec: WorkerEnvSpec,
    numEnvs: number,
    workers: number,
    options: { startTimeoutMs?: number; stepTimeoutMs?: number } = {},
  ) {
    if (!Number.isInteger(workers) || workers < 1) throw new TransportError("workers must be at least 1");
    if (!Number.isInteger(numEnvs) || numEnvs < 1) throw new TransportError("numEnvs must be at least 1");
    const stepTimeout = options.stepTimeoutMs ?? spec.stepTimeoutMs ?? DEFAULT_STEP_TIMEOUT_MS;
    if (!(stepTimeout > 0) || !Number.isFinite(stepTimeout)) {
      throw new RangeError(`stepTimeoutMs must be a positive number of milliseconds, not ${String(stepTimeout)}`);
    }
    this.#stepTimeout = stepTimeout;
    this.spec = spec;
    this.numEnvs = numEnvs;
    this.workers = Math.min(workers, numEnvs);
    const schema = loadSchema(spec);
    this.resultSize = bodyCodec(schema, "STEP_RESP").size;
    this.actionElements = new ActionRule(schema).elements;
    this.#lay = new Layout(null, numEnvs, this.workers, this.resultSize, this.actionElements);
    this.#ranges = split(numEnvs, this.workers);
    this.#owner = [];
    this.#ranges.forEach(([lo, hi], k) => {
      for (let i = lo; i < hi; i++) this.#owner.push(k);
    });
    this.#threads = new Array<Worker | null>(this.workers).fill(null);
    this.#ports = new Array<MessagePort | null>(this.workers).fill(null);
    this.#rowsSab = new Array<SharedArrayBuffer | null>(this.workers).fill(null);
    this.#rowsAt = new Array<number>(this.workers).fill(0);
    this.#seq = new Array<number>(this.workers).fill(0);
    this.#busy = new Uint8Array(this.workers);
    this.#stuck = new Array<string | null>(this.workers).fill(null);
    const lay = this.#lay;
    this.#results = Array.from({ length: numEnvs }, (_, i) => lay.bytes.subarray(lay.result(i), lay.result(i) + this.resultSize));
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
    this.#stuck[k] = null;
    this.#ports[k]?.close();
    const { port1, port2 } = new MessageChannel();
    this.#ports[k] = port1;
    this.#rowsSab[k] = null; // a fresh worker writes into the pool's area until told otherwise
    const workerData: WorkerData = { sab: lay.sab!, numEnvs: this.numEnvs, workers: this.workers, k, spec: this.spec, port: port2 };
    const thread = new Worker(path.join(__dirname, "worker_main.js"), { workerData, transferList: [port2] });
    thread.unref();
    thread.on("error", () => undefined); // reported through the dead word
    this.#threads[k] = thread;
    this.#threadIds[k] = thread.threadId;
  }

  #awaitStart(k: number): void {
    const lay = this.#lay;
    const doneAt = lay.word(k, W_DONE);
    const deadline = Date.now() + this.#startTimeout;
    while (Atomics.load(lay.i32, doneAt) !== 1) {
      if (Atomics.load(lay.i32, lay.word(k, W_DEAD))) {
        throw new TransportError(`worker thread ${k} (envs ${this.#describe(k)}) died while starting`);
      }
      if (Date.now() > deadline) throw new TransportError(`worker thread ${k} (envs ${this.#describe(k)}) did not start`);
      Atomics.wait(lay.i32, doneAt, 0, 50);
    }
    if (!lay.i32[lay.word(k, W_OK)]) {
      const lo = (this.#ranges[k] as readonly [number, number])[0];
      const text = Buffer.from(lay.text(lo)).toString("utf-8");
      throw new TransportError(`worker thread ${k}: creating its envs failed: ${text}`);
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

  /** Wake worker k: a command or a submitted env is waiting for it. */
  #ring(k: number): void {
    const at = this.#lay.word(k, W_BELL);
    Atomics.add(this.#lay.i32, at, 1);
    Atomics.notify(this.#lay.i32, at);
  }

  // -- asynchronous batches --------------------------------------------------------------------

  /** Envs submitted and not taken yet (stepping, or finished and waiting in #completed). */
  get submitted(): number {
    return this.#pending.size + this.#completed.length;
  }

  /**
   * Mark env `ids[k]` PENDING with its op (`ops[i]`: STEP with `actions[i]`, or RESET unseeded)
   * and ring its worker's bell; the workers step them concurrently and report each as it
   * finishes (`take`, `poll`).
   */
  submit(ids: readonly number[], ops: Uint8Array, actions: Float64Array, mode: AutoReset): void {
    if (this.#closed) throw new TransportError("the worker pool is closed");
    const lay = this.#lay;
    const i32 = lay.i32;
    const wake = this.#busy;
    wake.fill(0);
    Atomics.store(i32, MODE, mode);
    for (const i of ids) {
      if (this.#pending.has(i)) throw new TransportError(`env ${i} is already submitted`);
      lay.bytes[lay.asyncOpAt + i] = ops[i] as number;
      if (ops[i] === Op.STEP) lay.putAction(i, actions, this.actionElements);
      Atomics.store(i32, lay.stateWord + i, PENDING); // after its op and action
      this.#pending.add(i);
      wake[this.#owner[i] as number] = 1;
    }
    for (let k = 0; k < this.workers; k++) if (wake[k]) this.#ring(k);
  }

  /** Up to `want` finished envs, without waiting (results copied into `out`), in finishing order. */
  take(want: number, out: Records): AsyncDone[] {
    this.#collect(out);
    return this.#completed.splice(0, want);
  }

  /**
   * `want` finished envs (fewer only when fewer are submitted): awaits the doorbell with
   * `Atomics.waitAsync` in slices, so the event loop keeps serving; a worker that died fails
   * its submitted envs (and is replaced), never a hang.
   */
  async poll(want: number, out: Records): Promise<AsyncDone[]> {
    const i32 = this.#lay.i32;
    for (;;) {
      const ring = Atomics.load(i32, DOORBELL);
      this.#collect(out);
      const missing = want - this.#completed.length;
      if (missing <= 0 || this.#pending.size === 0) return this.#completed.splice(0, want);
      Atomics.store(i32, WAKE_AT, (ring + missing) | 0); // wake me once enough have finished
      const waited = waitAsync(i32, DOORBELL, ring, POLL_SLICE_MS);
      if (waited.async) {
        const alive = setTimeout(noop, POLL_SLICE_MS * 2); // a pending waitAsync does not keep the event loop alive
        await waited.value;
        clearTimeout(alive);
      }
    }
  }

  /** Block up to `timeoutMs` until a submitted env finishes (returns at once when one has). */
  waitSync(timeoutMs: number): void {
    const lay = this.#lay;
    const i32 = lay.i32;
    const ring = Atomics.load(i32, DOORBELL);
    if (this.#completed.length) return;
    for (const i of this.#pending) if (Atomics.load(i32, lay.stateWord + i) === DONE) return;
    if (this.#pending.size === 0) return;
    Atomics.store(i32, WAKE_AT, (ring + 1) | 0);
    Atomics.wait(i32, DOORBELL, ring, timeoutMs);
  }

  /** Move every DONE env into #completed (finishing order), results into `out`; fail the envs of dead workers. */
  #collect(out: Records): void {
    if (this.#closed) throw new TransportError("the worker pool is closed");
    const lay = this.#lay;
    const i32 = lay.i32;
    let found: number[] | null = null;
    let dead = false;
    for (const i of this.#pending) {
      if (Atomics.load(i32, lay.stateWord + i) === DONE) (found ??= []).push(i);
      else if (Atomics.load(i32, lay.word(this.#owner[i] as number, W_DEAD))) dead = true;
    }
    if (found !== null) {
      found.sort((a, b) => ((i32[lay.ticketWord + a] as number) - (i32[lay.ticketWord + b] as number)) | 0);
      for (const i of found) this.#completed.push(this.#finished(i, out));
    }
    if (dead) this.#asyncDied();
  }

  /** Env i's DONE result (and SAME_STEP final) into `out`; its state back to IDLE. */
  #finished(i: number, out: Records): AsyncDone {
    const lay = this.#lay;
    const bytes = lay.bytes;
    const size = this.resultSize;
    this.#pending.delete(i);
    Atomics.store(lay.i32, lay.stateWord + i, IDLE);
    const flags = bytes[lay.asyncFlagsAt + i] as number;
    if (flags & ASYNC_FAILED) {
      const text = Buffer.from(lay.text(i)).toString("utf-8");
      return { index: i, ended: false, error: new RequestError(ErrorCode.ENV_ERROR, `env ${i}: ${text}`) };
    }
    const at = out.at(i);
    if (flags & ASYNC_ENDED) {
      out.bytes.set(bytes.subarray(lay.final(i), lay.final(i) + size), at);
      out.written(i);
      out.keepFinal(i);
    }
    out.bytes.set(bytes.subarray(lay.result(i), lay.result(i) + size), at);
    return { index: i, ended: (flags & ASYNC_ENDED) !== 0, error: null };
  }

  /**
   * Workers that died while envs were submitted to them: each submitted env of theirs finishes
   * with the failure that names it, the worker is replaced, and its other envs (fresh ones,
   * which nobody would reset) are reset now.
   */
  #asyncDied(): void {
    const lay = this.#lay;
    const busy = this.#busy;
    busy.fill(0);
    for (let k = 0; k < this.workers; k++) if (Atomics.load(lay.i32, lay.word(k, W_DEAD))) busy[k] = 2;
    const failures: Failure[] = [];
    this.#replaceDead(failures);
    const fresh = new Uint8Array(this.numEnvs);
    for (const [i] of failures) {
      fresh[i] = Op.RESET; // not in flight here: a fresh env nobody would reset
      this.#replaced.delete(i);
    }
    if (failures.length) {
      const size = this.resultSize;
      const scratch: Records = { bytes: new Uint8Array(this.numEnvs * size), at: (i) => i * size, written: () => undefined, keepFinal: () => undefined };
      this.run(fresh, new Float64Array(this.numEnvs), new Array<bigint | null>(this.numEnvs).fill(null), scratch);
    }
  }

  /**
   * Send `task` to the workers marked in #busy and wait for each; true when some died or were
   * stuck (their #busy is 2, the others' 0).
   *
   * One wait for all: each worker bumps FINISHED after its done word and only the one that
   * brings it to FINISH_AT (the last of the command) notifies, so the main thread sleeps and
   * wakes once per command whatever the number of workers (it waited on each worker's done word
   * in turn: a wake per worker). A worker that died never bumps: its dead word (which notifies
   * FINISHED too) ends the wait, and the live ones are then awaited by their done words.
   *
   * The wait blocks this thread (a lock-step request is answered synchronously), so it has a
   * deadline: the step timeout. A worker not done by then is stuck (an env that never returns):
   * its done word is swapped to ABANDONED (a compare-and-swap: a worker that finished at that
   * instant keeps its result), its dead word set and its thread terminated; the caller replaces
   * it and fails its envs by name, as for a worker that died. Never a hang.
   */
  #send(task: number, arg: number): boolean {
    if (this.#closed) throw new TransportError("the worker pool is closed");
    const lay = this.#lay;
    const i32 = lay.i32;
    const busy = this.#busy;
    let count = 0;
    for (let k = 0; k < this.workers; k++) count += busy[k] ? 1 : 0;
    const target = (Atomics.load(i32, FINISHED) + count) | 0;
    Atomics.store(i32, FINISH_AT, target);
    for (let k = 0; k < this.workers; k++) {
      if (!busy[k]) continue;
      i32[lay.word(k, W_TASK)] = task;
      i32[lay.word(k, W_ARG)] = arg;
      const seq = ((this.#seq[k] as number) + 1) & 0x3fffffff || 2;
      this.#seq[k] = seq;
      Atomics.store(i32, lay.word(k, W_CMD), seq);
      this.#ring(k);
    }
    const deadline = performance.now() + this.#stepTimeout;
    for (;;) {
      const now = Atomics.load(i32, FINISHED);
      if (now === target) {
        busy.fill(0);
        return false;
      }
      let dead = false;
      for (let k = 0; k < this.workers; k++) if (busy[k] && Atomics.load(i32, lay.word(k, W_DEAD))) dead = true;
      if (dead) break;
      const left = deadline - performance.now();
      if (left <= 0) break;
      Atomics.wait(i32, FINISHED, now, Math.min(POLL_SLICE_MS, Math.ceil(left)));
    }
    // a worker died or the deadline passed: each live one is awaited by its done word (until the
    // deadline: then it is stuck), then its FINISHED bump (a bump left for later would count
    // toward the next command, which then ended early)
    let anyDead = false;
    let missing = 0;
    for (let k = 0; k < this.workers; k++) {
      if (!busy[k]) continue;
      const doneAt = lay.word(k, W_DONE);
      const seq = this.#seq[k] as number;
      busy[k] = 1;
      for (;;) {
        const now = Atomics.load(i32, doneAt);
        if (now === seq) {
          busy[k] = 0;
          break;
        }
        if (Atomics.load(i32, lay.word(k, W_DEAD))) {
          busy[k] = 2; // dead
          anyDead = true;
          missing++;
          break;
        }
        if (performance.now() >= deadline && Atomics.compareExchange(i32, doneAt, now, ABANDONED) === now) {
          this.#abandon(k);
          busy[k] = 2; // stuck: replaced as if dead
          anyDead = true;
          missing++;
          break;
        }
        Atomics.wait(i32, doneAt, now, 1);
      }
    }
    // a worker that died between its done word and its bump never bumps: the wait has a bound
    const bumped = (target - missing) | 0;
    const settle = Math.max(deadline, performance.now() + 1000);
    for (let now = Atomics.load(i32, FINISHED); now !== bumped && ((now - bumped) | 0) < 0; now = Atomics.load(i32, FINISHED)) {
      if (performance.now() >= settle) break;
      Atomics.wait(i32, FINISHED, now, 1);
    }
    return anyDead;
  }

  /**
   * Worker k did not finish its command within the step timeout (its done word is ABANDONED
   * now): it counts as dead from here on (its dead word, which every wait checks) and its
   * thread is terminated at once; #replaceDead replaces it and fails its envs with the reason.
   */
  #abandon(k: number): void {
    const seconds = this.#stepTimeout / 1000;
    this.#stuck[k] =
      `did not answer within the step timeout (${seconds} s: an env's step, reset or info() never returned); ` +
      "the thread was terminated and replaced";
    Atomics.store(this.#lay.i32, this.#lay.word(k, W_DEAD), 1);
    void this.#threads[k]?.terminate();
  }

  /**
   * Replace the dead workers (busy 2); each of their envs fails by name: into `failures`, or,
   * for an env submitted asynchronously, as its finished result (the RECV recovers it).
   */
  #replaceDead(failures: Failure[]): void {
    for (let k = 0; k < this.workers; k++) {
      if (this.#busy[k] !== 2) continue;
      this.#busy[k] = 0;
      const thread = this.#threads[k];
      const id = this.#threadIds[k] ?? -1; // threadId reads -1 once the thread has exited
      void thread?.terminate();
      const envs = this.#describe(k);
      const why = this.#stuck[k] ?? "died";
      for (const i of this.envIds(k)) {
        const error = new RequestError(ErrorCode.ENV_ERROR, `env ${i}: worker thread ${k} (thread id ${id}, envs ${envs}) ${why}`);
        this.#replaced.add(i);
        if (this.#pending.delete(i)) {
          Atomics.store(this.#lay.i32, this.#lay.stateWord + i, IDLE);
          this.#completed.push({ index: i, ended: false, error });
        } else {
          failures.push([i, error]);
        }
      }
      this.#spawn(k);
      this.#awaitStart(k);
    }
  }

  /**
   * Run `ops[i]` on env i in its worker (Runner.run); each result is copied into `out`'s record
   * i. Null, or the envs that failed (the envs of a worker that died among them).
   */
  run(ops: Uint8Array, actions: Float64Array, seeds: ReadonlyArray<bigint | null>, out: Records): Failure[] | null {
    const lay = this.#lay;
    const busy = this.#busy;
    const bytes = lay.bytes;
    const n = this.numEnvs;
    const elements = this.actionElements;
    const inPlace = this.#writeInto(out);
    busy.fill(0);
    bytes.set(ops.subarray(0, n), lay.opAt); // every env's op: one copy
    // every env's action in one copy (an env that does not step ignores its own)
    const bulk = actions.length >= n * elements;
    if (bulk) lay.actions.set(actions.subarray(0, n * elements));
    const owner = this.#owner;
    for (let i = 0; i < n; i++) {
      const op = ops[i] as number;
      if (op === Op.NONE) continue;
      busy[owner[i] as number] = 1;
      if (op !== Op.STEP) lay.setSeed(i, seeds[i] ?? null);
      else if (!bulk) lay.putAction(i, actions, elements);
    }
    const anyDead = this.#send(TASK_RUN, 0);
    let failures: Failure[] | null = null;
    const flagsAt = lay.flagsAt;
    let all = !anyDead;
    for (let i = 0; i < n; i++) {
      if (ops[i] === Op.NONE || busy[owner[i] as number] === 2) {
        all = false;
        continue;
      }
      if ((bytes[flagsAt + i] as number) & FAILED) {
        all = false;
        const text = Buffer.from(lay.text(i)).toString("utf-8");
        (failures ??= []).push([i, new RequestError(ErrorCode.ENV_ERROR, `env ${i}: ${text}`)]);
      }
    }
    if (!inPlace) this.#copiedBack++;
    if (inPlace) {
      // the workers wrote the records themselves
    } else if (all && out.packed === true) {
      // every env did its op and the records are one block: one copy of every result
      out.bytes.set(bytes.subarray(lay.resultsAt, lay.resultsAt + n * this.resultSize), out.at(0));
    } else {
      const results = this.#results;
      for (let i = 0; i < n; i++) {
        if (ops[i] === Op.NONE || busy[owner[i] as number] === 2 || (bytes[flagsAt + i] as number) & FAILED) continue;
        out.bytes.set(results[i] as Uint8Array, out.at(i));
      }
    }
    if (anyDead) {
      failures ??= [];
      this.#replaceDead(failures);
      failures.sort((a, b) => a[0] - b[0]);
    }
    return failures;
  }

  /**
   * How many lock-step commands (`run`) copied their results back from the pool's area into the
   * caller's records; those written in place by the workers (records in a SharedArrayBuffer)
   * do not count. A test's witness that a pool session copies nothing back.
   */
  get copiedBack(): number {
    return this.#copiedBack;
  }

  /**
   * Point the workers' lock-step results at `out`'s records when they lie in a
   * SharedArrayBuffer as one block (a session whose response buffer is shared): the workers
   * write them in place and nothing is copied (~30-60 us per 256 pac_env results on a loaded
   * 2-core machine); else at this pool's area. A worker is told only when that changes (a
   * detached session buffer): a message on its port and its W_ROWS word, taken with the
   * command that follows (no command of its own). True when the results go to `out` itself.
   */
  #writeInto(out: Records): boolean {
    const buffer = out.bytes.buffer;
    const shared = out.packed === true && buffer instanceof SharedArrayBuffer;
    const sab = shared ? buffer : null;
    const at = shared ? out.bytes.byteOffset + out.at(0) : 0;
    const i32 = this.#lay.i32;
    for (let k = 0; k < this.workers; k++) {
      if (this.#rowsSab[k] === sab && (sab === null || this.#rowsAt[k] === at)) continue;
      const message: RowsMessage = sab === null ? null : { sab, at };
      this.#ports[k]?.postMessage(message);
      Atomics.store(i32, this.#lay.word(k, W_ROWS), 1); // before the command's seq: seen with it
      this.#rowsSab[k] = sab;
      this.#rowsAt[k] = at;
    }
    return shared;
  }

  /**
   * A command that does nothing: every worker wakes, answers and counts itself finished. Its
   * time is the pool's synchronisation alone, the floor of any step (issue 24 item 2). The
   * workers that died (replaced by the next command).
   */
  ping(): number[] {
    const busy = this.#busy;
    busy.fill(1);
    const dead: number[] = [];
    if (this.#send(TASK_NOP, 0)) for (let k = 0; k < this.workers; k++) if (busy[k] === 2) dead.push(k);
    return dead;
  }

  /**
   * Env `index`'s `info()` map, from its worker: in its env record when it fits, else (a
   * rendered frame: any size) posted on the worker's port before its done word (INFO_PORTED).
   */
  info(index: number): Record<string, unknown> {
    const k = this.#owner[index] as number;
    this.#busy.fill(0);
    this.#busy[k] = 1;
    if (this.#send(TASK_INFO, index)) {
      this.#replaceDead([]);
      return {};
    }
    const lay = this.#lay;
    const ported = lay.dv.getUint16(lay.ctl(index) + C_TEXT_LEN, true) === INFO_PORTED;
    const decoded = msgpackDecode(ported ? this.#portedInfo(k, index) : lay.text(index));
    return decoded !== null && typeof decoded === "object" ? (decoded as Record<string, unknown>) : {};
  }

  /** The info() bytes worker k posted for env `index` with its last command (INFO_PORTED). */
  #portedInfo(k: number, index: number): Uint8Array {
    const port = this.#ports[k] as MessagePort;
    const seq = this.#seq[k] as number;
    const i32 = this.#lay.i32;
    // posted before the done word, so already queued (the retries only guard that assumption);
    // a message of an earlier command (none is left unread today) is skipped
    for (let tries = 0; tries < 1000; tries++) {
      for (let got = receiveMessageOnPort(port); got !== undefined; got = receiveMessageOnPort(port)) {
        const message = got.message as InfoMessage;
        if (message.seq === seq && message.index === index) return message.bytes;
      }
      Atomics.wait(i32, this.#lay.word(k, W_DONE), seq, 1); // 1 ms: the done word stays seq
    }
    throw new TransportError(`env ${index}: worker thread ${k} answered info() but its map never arrived`);
  }

  takeReplaced(index: number): string | null {
    return this.#replaced.delete(index) ? FATE_NEW_THREAD : null;
  }

  /** Stop every worker thread. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const lay = this.#lay;
    Atomics.store(lay.i32, 0, CLOSED);
    for (let k = 0; k < this.workers; k++) this.#ring(k);
    for (const thread of this.#threads) {
      if (thread !== null) void thread.terminate();
    }
    for (const port of this.#ports) port?.close();
  }
}

const closePools = new FinalizationRegistry<WorkerPool>((pool) => pool.close());

/**
 * A client's envs in a worker pool: the pool is made at the first request (or `start()`), so a
 * client that only says hello costs no threads; it is closed with the runner (or when the runner
 * is garbage).
 */
export class PoolRunner implements Runner, ConcurrentRunner {
  readonly numEnvs: number;
  /** Asynchronous batches step the envs concurrently in the threads (this runner). */
  readonly concurrent: ConcurrentRunner = this;
  readonly canRecreate = true;
  readonly wholeBatchOnly = true;
  /**
   * Records in a SharedArrayBuffer are written in place by the workers (no copy of N results):
   * a session that holds its response buffer in one (`Buffer.from(new SharedArrayBuffer(n))`)
   * for this runner saves ~30-60 us per 256 pac_env results (issue 24 item 2).
   */
  readonly wantsSharedRecords = true;
  readonly stepSeats = null;
  readonly #spaces: Spaces;
  readonly #make: () => WorkerPool;
  #pool: WorkerPool | null = null;

  constructor(numEnvs: number, spaces: Spaces, make: () => WorkerPool) {
    this.numEnvs = numEnvs;
    this.#spaces = spaces;
    this.#make = make;
  }

  /** Start the worker threads now (a server that prepares a client's envs before it asks). */
  start(): WorkerPool {
    if (this.#pool === null) {
      this.#pool = this.#make();
      closePools.register(this, this.#pool, this);
    }
    return this.#pool;
  }

  spaces(): Spaces {
    return this.#spaces;
  }

  run(ops: Uint8Array, actions: Float64Array, seeds: ReadonlyArray<bigint | null>, out: Records): Failure[] | null {
    return this.start().run(ops, actions, seeds, out);
  }

  takeReplaced(index: number): string | null {
    return this.#pool?.takeReplaced(index) ?? null;
  }

  submit(ids: readonly number[], ops: Uint8Array, actions: Float64Array, mode: AutoReset): void {
    this.start().submit(ids, ops, actions, mode);
  }

  take(want: number, out: Records): AsyncDone[] {
    return this.start().take(want, out);
  }

  poll(want: number, out: Records): Promise<AsyncDone[]> {
    return this.start().poll(want, out);
  }

  waitSync(timeoutMs: number): void {
    this.#pool?.waitSync(timeoutMs);
  }

  get submitted(): number {
    return this.#pool?.submitted ?? 0;
  }

  info(index: number): Record<string, unknown> {
    return this.start().info(index);
  }

  close(): void {
    if (this.#pool !== null) {
      closePools.unregister(this);
      this.#pool.close();
      this.#pool = null;
    }
  }
}
