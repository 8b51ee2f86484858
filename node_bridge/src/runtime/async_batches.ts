/**
 * Asynchronous batches in the env runtime (Python: transport/runtime/async_batches.py): SEND
 * steps some envs, RECV returns the first results that are ready with their env ids. Every
 * rule lives here: env ids in range and once per SEND, none already in flight, RECV needs
 * something in flight, lock-step requests refused while envs are in flight; action checks and
 * auto-reset are the runtime's (`step`, `planAsync`). In this thread (LocalRunner) the envs
 * step at SEND, in order, and RECV returns them in that order; on a concurrent runner (worker
 * threads) SEND submits them and RECV returns the first that finished, in finishing order,
 * awaiting the pool without blocking the event loop.
 */

import { decode as msgpackDecode } from "@msgpack/msgpack";

import { ErrorCode, MESSAGE_IDS, RequestError } from "../protocol";
import { type AsyncDone, type EnvRuntime, type Failure, Op, type Records, stepBeforeReset } from "./core";

/** The rows asynchronous steps write into: env i's result, and its SAME_STEP final result. */
class AsyncRecords implements Records {
  readonly bytes: Uint8Array;
  readonly finals: Uint8Array;
  readonly ended: Uint8Array;
  /** Env i's row at i * size: one block. */
  readonly packed = true;

  constructor(
    numEnvs: number,
    readonly size: number,
  ) {
    this.bytes = new Uint8Array(numEnvs * size);
    this.finals = new Uint8Array(numEnvs * size);
    this.ended = new Uint8Array(numEnvs);
  }

  at(index: number): number {
    return index * this.size;
  }

  written(): void {
    // in place
  }

  keepFinal(index: number): void {
    const at = index * this.size;
    this.finals.set(this.bytes.subarray(at, at + this.size), at);
    this.ended[index] = 1;
  }
}

function asyncState(text: string): RequestError {
  return new RequestError(ErrorCode.ASYNC_STATE, text);
}

/** msg_type -> the protocol's name for it (the envelope's ids: the same in every schema). */
const MESSAGE_NAMES: ReadonlyMap<number, string> = new Map(Object.entries(MESSAGE_IDS).map(([name, id]) => [id, name]));

/**
 * A request as an ASYNC_STATE text names it (Python: `request_name`): its message name
 * (`STEP_BATCH_REQ`) for a msg_type; a text (a message name) as is.
 */
export function requestName(request: number | string): string {
  if (typeof request === "string") return request;
  return MESSAGE_NAMES.get(request) ?? `msg_type 0x${request.toString(16).toUpperCase().padStart(2, "0")}`;
}

/** The BAD_BATCH of an env id outside 0..N-1 (exact at any size: a u64 id is a bigint). */
function outside(id: number | bigint, numEnvs: number): RequestError {
  return new RequestError(ErrorCode.BAD_BATCH, `env id ${id} is outside 0..${numEnvs - 1}`);
}

// -- the rules, as pure functions: AsyncBatches and the shm channel (whose slots carry each
// env's request on their own, docs/shm.md "Asynchronous batches") both call them

/**
 * A lock-step request (a msg_type, or a message name) while envs are in flight is refused
 * (their results would mix); the text names the request and what to call instead.
 */
export function checkIdle(count: number, request: number | string): void {
  if (count) throw asyncState(`${requestName(request)} while ${count} env(s) are in flight: call recv() for their results first`);
}

/**
 * A SEND of env `ids`: at least one, each in range, each once, none in flight. `seen` (N bytes,
 * scratch) ends with a 1 at each id sent.
 */
export function checkSend(ids: readonly number[], numEnvs: number, inFlight: Uint8Array, seen: Uint8Array): void {
  const n = numEnvs;
  if (ids.length === 0) throw new RequestError(ErrorCode.BAD_BATCH, "SEND_REQ carries no env");
  for (const i of ids) {
    if (!Number.isInteger(i) || i < 0 || i >= n) throw outside(i, n);
  }
  seen.fill(0);
  for (const i of ids) {
    if (seen[i]) throw asyncState(`env ${i} appears twice in one SEND_REQ`);
    seen[i] = 1;
  }
  for (const i of ids) {
    if (inFlight[i]) throw asyncState(`env ${i} is already in flight: call recv() for its result before sending it again`);
  }
}

/**
 * A SEND (after `checkSend`) from a client that sent no reset yet in its session: the NOT_RESET
 * of its first env, as the runtime's action check gives it at SEND. The shm client asks this
 * itself (its SEND publishes the slots without waiting for the server); a reset it sent that
 * failed for some env stays the server's to refuse (at RECV). Python: `check_reset_sent`.
 */
export function checkResetSent(ids: readonly number[], resetSent: boolean): void {
  if (!resetSent && ids.length > 0) throw stepBeforeReset(ids[0] as number);
}

/**
 * SEND_REQ's env ids: the msgpack array of K integers after K requests of `size` bytes (K from
 * the array header: fixarray below 16, else array 16); BAD_BATCH for any other body, and for an
 * array of K whose items are not all msgpack integers (a bool, a float such as 1.0, a string:
 * decoded, 1.0 is the number 1, so the items' type bytes are read). As Python's
 * `send_env_ids`; an integer outside the safe range (a u64 >= 2**53, exact in the text) is
 * outside 0..N-1 at once, the others are `checkSend`'s to check.
 */
export function sendEnvIds(body: Uint8Array, size: number, numEnvs: number): number[] {
  for (let k = 1; k <= numEnvs && k * size < body.byteLength; k++) {
    const at = k * size;
    if (body[at] !== (k < 16 ? 0x90 + k : 0xdc)) continue;
    let tail: unknown;
    try {
      tail = msgpackDecode(body.subarray(at)); // one whole msgpack value, nothing after it
    } catch {
      continue;
    }
    if (Array.isArray(tail) && tail.length === k) return integerItems(body, at + (k < 16 ? 1 : 3), k, numEnvs);
  }
  throw new RequestError(
    ErrorCode.BAD_BATCH,
    `SEND_REQ of ${body.byteLength} bytes is not K requests of ${size} bytes and a msgpack array of K env ids (1 <= K <= num_envs)`,
  );
}

/** The `k` msgpack integers from `at` of a decoded array (its items are whole values). */
function integerItems(body: Uint8Array, at: number, k: number, numEnvs: number): number[] {
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const items: Array<number | bigint> = [];
  for (let j = 0; j < k; j++) {
    const type = body[at] as number;
    let id: number | bigint;
    if (type <= 0x7f) (id = type), (at += 1);
    else if (type >= 0xe0) (id = type - 0x100), (at += 1);
    else if (type === 0xcc) (id = dv.getUint8(at + 1)), (at += 2);
    else if (type === 0xcd) (id = dv.getUint16(at + 1)), (at += 3);
    else if (type === 0xce) (id = dv.getUint32(at + 1)), (at += 5);
    else if (type === 0xcf) (id = dv.getBigUint64(at + 1)), (at += 9);
    else if (type === 0xd0) (id = dv.getInt8(at + 1)), (at += 2);
    else if (type === 0xd1) (id = dv.getInt16(at + 1)), (at += 3);
    else if (type === 0xd2) (id = dv.getInt32(at + 1)), (at += 5);
    else if (type === 0xd3) (id = dv.getBigInt64(at + 1)), (at += 9);
    else throw new RequestError(ErrorCode.BAD_BATCH, "SEND_REQ env ids must be integers");
    items.push(id);
  }
  if (items.some((id) => typeof id === "bigint" && (id > BigInt(Number.MAX_SAFE_INTEGER) || id < BigInt(Number.MIN_SAFE_INTEGER)))) {
    // no number holds it: refuse the first id outside 0..N-1 here, exact, as checkSend would
    throw outside(items.find((id) => id < 0 || id >= numEnvs) as number | bigint, numEnvs);
  }
  return items.map(Number);
}

/** How many results a RECV returns: min(batchSize, in flight); refused with none in flight. */
export function checkRecv(count: number, batchSize: number): number {
  if (count === 0) throw asyncState("RECV_REQ with no env in flight: call send() (or async_reset()) first");
  if (batchSize < 1) throw new RequestError(ErrorCode.BAD_BATCH, "RECV_REQ batch_size must be at least 1");
  return Math.min(batchSize, count);
}

/** One client's envs in flight (sent, their result not received yet). */
export class AsyncBatches {
  readonly numEnvs: number;
  readonly inFlight: Uint8Array;
  count = 0;
  readonly records: AsyncRecords;
  readonly #ready: number[] = [];
  readonly #only: Uint8Array;
  /** Each env's op of the current SEND (concurrent runners). */
  readonly #ops: Uint8Array;
  #error: RequestError | null = null;

  constructor(readonly runtime: EnvRuntime) {
    this.numEnvs = runtime.numEnvs;
    this.inFlight = new Uint8Array(this.numEnvs);
    this.#only = new Uint8Array(this.numEnvs);
    this.#ops = new Uint8Array(this.numEnvs);
    this.records = new AsyncRecords(this.numEnvs, runtime.result.size);
  }

  /** A lock-step request while envs are in flight is refused (their results would mix). */
  checkIdle(what: number | string): void {
    checkIdle(this.count, what);
  }

  /**
   * Step env `ids[k]` with the action the caller put at `runtime.actions[ids[k]]`; every check
   * comes first, so a refused SEND starts nothing.
   */
  send(ids: readonly number[]): void {
    const n = this.numEnvs;
    const only = this.#only;
    checkSend(ids, n, this.inFlight, only);
    const records = this.records;
    const pool = this.runtime.runner.concurrent;
    if (pool !== undefined) {
      // worker threads: every check first (a refused SEND starts nothing), then submit
      const ops = this.#ops;
      this.runtime.planAsync(ids, ops, records);
      const submit: number[] = [];
      for (const i of ids) {
        records.ended[i] = 0;
        this.inFlight[i] = 1;
        this.count++;
        if (ops[i] === Op.NONE) this.#ready.push(i); // a masked "noop": its result is written
        else submit.push(i);
      }
      if (submit.length) pool.submit(submit, ops, this.runtime.actions, this.runtime.autoreset);
      return;
    }
    for (const i of ids) records.ended[i] = 0;
    try {
      this.runtime.step(records, 0, n, only);
    } catch (error) {
      // the runtime refused every env (a bad action): nothing is in flight
      if (!(error instanceof RequestError) || error.code !== ErrorCode.ENV_ERROR) throw error;
      // env errors: the others stepped; the failed envs are reported by the next RECV
      this.#error = error;
      for (const i of ids) {
        if (this.runtime.failedLast(i)) only[i] = 0;
      }
    }
    for (const i of ids) {
      if (!only[i]) continue;
      this.inFlight[i] = 1;
      this.count++;
      this.#ready.push(i);
    }
  }

  /** ASYNC_RESET: reset every env (env i: `seed + i`); RECV returns them. */
  reset(seed: bigint | null): void {
    checkIdle(this.count, "ASYNC_RESET_REQ");
    this.runtime.resetAll(this.records, seed);
    this.records.ended.fill(0);
    this.#ready.length = 0;
    for (let i = 0; i < this.numEnvs; i++) this.#ready.push(i);
    this.inFlight.fill(1);
    this.count = this.numEnvs;
  }

  /**
   * The first `min(batchSize, in flight)` envs that finished, in the order they finished: at
   * once when they are ready, else a promise (a concurrent runner still stepping them). An env
   * that failed is the RECV's ENV_ERROR after recovery (the runtime's, as for a lock-step step);
   * the envs that finished with it come with the next RECV.
   */
  recv(batchSize: number): number[] | Promise<number[]> {
    const error = this.#error;
    if (error !== null) {
      this.#error = null;
      throw error;
    }
    const want = checkRecv(this.count, batchSize);
    const ids = this.#ready.splice(0, want);
    const pool = this.runtime.runner.concurrent;
    if (pool === undefined || ids.length === want) return this.#deliver(ids, []);
    const done = pool.take(want - ids.length, this.records);
    const missing = want - ids.length - done.length;
    if (missing <= 0) return this.#deliver(ids, done);
    return pool.poll(missing, this.records).then((more) => this.#deliver(ids, [...done, ...more]));
  }

  /** Take `ids` (ready) and `done` (finished in the pool) out of flight; throw the recovery of failures. */
  #deliver(ids: number[], done: readonly AsyncDone[]): number[] {
    const runtime = this.runtime;
    let failures: Failure[] | null = null;
    for (const d of done) {
      const stalled = d.error === null ? runtime.finishAsync(d, this.records, this.#ops[d.index] === Op.STEP) : null;
      if (d.error === null && stalled === null) {
        ids.push(d.index);
      } else {
        (failures ??= []).push(stalled ?? [d.index, d.error]);
      }
    }
    if (failures !== null) {
      for (const [i] of failures) {
        this.inFlight[i] = 0;
        this.count--;
      }
      this.#ready.unshift(...ids); // the others come with the next RECV
      failures.sort((a, b) => a[0] - b[0]);
      throw runtime.recoverAsync(failures, this.records);
    }
    for (const i of ids) this.inFlight[i] = 0;
    this.count -= ids.length;
    return ids;
  }
}
