/**
 * The stream-protocol session every stream backend (unix, http, zmq) drives: one per client.
 *
 * A backend accepts connections and moves frames; for each connection it makes a `Session` and
 * calls `handle(msgType, buf, offset, length)`, which decodes the request body, calls the env
 * runtime (core.ts) with records of its one preallocated send buffer, and frames the response:
 * the header at HEADER_OFFSET (7..15) and the body at BODY_OFFSET (16), so a stream backend
 * writes `frame()` in one call. Step results are encoded straight into that buffer at
 * `BODY_OFFSET + i * size`: a steady-state step allocates nothing. The protocol checks are
 * Python's: HELLO first, then per message the body size and the batch size; the env checks
 * (reset first, action range and mask, ...) are the runtime's.
 *
 * A RECV whose envs are still stepping in worker threads is answered later: `handle` returns
 * `LATER` and `later` resolves to the response msg_type once the body is in the buffer; the
 * backend sends it then (the event loop serves other connections meanwhile). A request that
 * arrives on the same session before that is answered after it, in order.
 *
 * Responses: SAME_STEP appends the final results as a tail (`u32 k`, k x (`u32 env index`,
 * result)); OBSERVE_RESP is the N results followed by a msgpack array of the N `info()` maps.
 */

import { encode as msgpackEncode } from "@msgpack/msgpack";
import type { AnyStructCodec, SchemaModule } from "../codec";
import { ProtocolError } from "../errors";
import {
  AutoReset,
  BODY_OFFSET,
  CLOSING_ERRORS,
  ErrorCode,
  FINAL_COUNT_SIZE,
  HEADER_OFFSET,
  HEADER_SIZE,
  type MessageIds,
  RequestError,
  acceptHello,
  helloResponseInfo,
  type Hello,
  autoresetName,
  encodeError,
  encodeHello,
  messageIds,
  packHeader,
  writeU32,
} from "../protocol";
import {
  type ActionType,
  type EnvRuntime,
  type Records,
  actionTypeOf,
  bodyCodec,
  describeError,
  readActions,
  stepAction,
} from "./core";
import { AsyncBatches, sendEnvIds } from "./async_batches";
import type { EnvOrFactory, Spaces } from "./env";
import { EnvHost, type HostOptions } from "./host";

/** `Session.handle`'s answer when the response is not ready yet: await `Session.later`. */
export const LATER = -1;

/** The HELLO info a session announces (key order is Python's). */
export interface SessionInfo {
  readonly envName?: string;
  readonly serverLang?: string;
}

/**
 * Strict decoding of EnvSeed entries (RESET_SEEDS_REQ, ASYNC_RESET_REQ): a `has_seed` byte other
 * than 0 or 1 is refused, BAD_BODY_SIZE (docs/schema.md "Canonical bytes"; Python:
 * `check_seed_flags`, the same words). Padding is not checked.
 */
function checkSeedFlags(buf: Uint8Array, offset: number, length: number, size: number, flagAt: number, what: string): void {
  for (let index = 0, at = offset + flagAt; at < offset + length; index++, at += size) {
    const flag = buf[at] as number;
    if (flag > 1) {
      throw new RequestError(ErrorCode.BAD_BODY_SIZE, `${what} entry ${index}: has_seed byte is ${flag}, expected 0 or 1`);
    }
  }
}

/** One client's conversation with a server: HELLO, then requests answered in place. */
export class Session implements Records {
  readonly schema: SchemaModule;
  readonly ids: MessageIds;
  readonly runtime: EnvRuntime;
  readonly numEnvs: number;
  readonly spaces: Spaces;
  /** The HELLO_RESP info map before the auto-reset mode is added (key order is Python's). */
  readonly info: Record<string, unknown>;
  helloDone = false;
  /** Set when the connection must be closed after sending the current response. */
  closing = false;
  /** The response buffer: header at 7..15, body at 16. Replaced by `detachBuffer()`. */
  buffer: Buffer;
  #bodyLength = 0;
  /**
   * Where the current body starts: BODY_OFFSET for results, `#asideAt` for an ERROR, HELLO,
   * HEALTH or SPACES body, which never overwrites the results region (a "noop" env's row is its
   * last result, sent again).
   */
  #bodyAt = BODY_OFFSET;
  /**
   * Right after `handle` returned LATER: that response's promise, which resolves to its msg_type
   * once its body is in the buffer (an ERROR body for a refusal: it never rejects); null when no
   * response is pending.
   */
  later: Promise<number> | null = null;

  readonly #observeReq: number;
  readonly #observeResp: number;
  readonly #resultSize: number;
  readonly #action: ActionType;
  readonly #actionAt: number;
  readonly #stepRequestSize: number;
  readonly #multi: ActionType;
  readonly #multiSize: number;
  readonly #multiAt: number;
  readonly #seedAt: number;
  readonly #seedSize: number;
  /** A RESET_SEEDS_REQ entry (one per env): its size and where its seed and has_seed are. */
  readonly #envSeed: { readonly size: number; readonly seedAt: number; readonly hasAt: number };
  readonly #envSeeds: Array<bigint | null>;
  readonly #spacesCodec: AnyStructCodec;
  readonly #spacesNames: readonly [string, string];
  /** How many final results the current SAME_STEP response carries. */
  #finals = 0;
  /** The last pending response (requests arriving meanwhile are answered after it). */
  #tail: Promise<number> | null = null;
  /** The promise a handler leaves when it returns LATER (taken by `handle`). */
  #waiting: Promise<number> | null = null;
  /** Asynchronous batches (SEND / RECV / ASYNC_RESET): created on first use. */
  #async: AsyncBatches | null = null;
  #frames = new Map<number, Buffer>();
  #bodies = new Map<number, Buffer>();
  /** End of the results region (header + one record per env or seat): what a new buffer keeps. */
  readonly #resultsEnd: number;
  /**
   * The runner writes records in a SharedArrayBuffer in place (a worker pool:
   * `wantsSharedRecords`): every buffer of this session, the first and each detached one, is
   * then allocated in one, so the workers write the results where they are sent from and
   * nothing is copied back (issue 24 item 2).
   */
  readonly #shared: boolean;
  /** Requests handled, and that count at the last `detachBuffer` (a detach every step or two: see there). */
  #requests = 0;
  #lastDetach = -Infinity;

  constructor(runtime: EnvRuntime, info: SessionInfo = {}) {
    const schema = runtime.schema;
    this.schema = schema;
    this.runtime = runtime;
    this.ids = messageIds(schema);
    this.#observeReq = schema.messages["OBSERVE_REQ"]?.id ?? -1;
    this.#observeResp = schema.messages["OBSERVE_RESP"]?.id ?? -1;
    this.numEnvs = runtime.numEnvs;
    this.spaces = runtime.spaces;
    this.info = {
      num_envs: this.numEnvs,
      env: info.envName ?? "",
      server: info.serverLang ?? "node",
      masked_actions: runtime.maskedActions,
    };
    this.#resultSize = runtime.result.size;
    const step = stepAction(schema, true);
    this.#action = step.type;
    this.#actionAt = step.field.offset;
    this.#stepRequestSize = step.size;
    const multi = bodyCodec(schema, "STEP_MULTI_REQ");
    const multiField = firstField(schema, multi.name);
    this.#multi = actionTypeOf(schema, multiField, "STEP_MULTI_REQ", runtime.seats, true);
    this.#multiSize = multi.size;
    this.#multiAt = multiField.offset;
    const reset = bodyCodec(schema, "RESET_SEED_REQ");
    this.#seedAt = firstField(schema, reset.name).offset;
    this.#seedSize = reset.size;
    const seeds = bodyCodec(schema, "RESET_SEEDS_REQ");
    this.#envSeed = {
      size: seeds.size,
      seedAt: firstField(schema, seeds.name, 0).offset,
      hasAt: firstField(schema, seeds.name, 1).offset,
    };
    this.#envSeeds = new Array<bigint | null>(this.numEnvs).fill(null);
    this.#spacesCodec = bodyCodec(schema, "SPACES_RESP");
    this.#spacesNames = [firstField(schema, this.#spacesCodec.name, 0).name, firstField(schema, this.#spacesCodec.name, 1).name];

    // results (8 at least: STEP_MULTI), then the SAME_STEP tail: u32 k, k x (u32 index, result)
    const size = this.#resultSize;
    this.#resultsEnd = BODY_OFFSET + Math.max(this.numEnvs, runtime.seats) * size;
    this.#shared = runtime.runner.wantsSharedRecords === true;
    const length = BODY_OFFSET + Math.max(this.numEnvs, runtime.seats) * size + FINAL_COUNT_SIZE + this.numEnvs * (FINAL_COUNT_SIZE + size) + 1024;
    this.buffer = this.#shared ? Buffer.from(new SharedArrayBuffer(length)) : Buffer.alloc(length);
  }

  /**
   * Whether the response buffer lies in a SharedArrayBuffer: a worker pool's session, unless it
   * detaches its buffer at nearly every request (`detachBuffer`).
   */
  get sharedBuffer(): boolean {
    return this.buffer.buffer instanceof SharedArrayBuffer;
  }

  /** The auto-reset mode the client asked for in HELLO (disabled until then). */
  get autoreset(): AutoReset {
    return this.runtime.autoreset;
  }

  // -- Records: env i's result goes to body slot i ------------------------------------------------

  get bytes(): Uint8Array {
    return this.buffer;
  }

  /** Env i's result at BODY_OFFSET + i * size: one block. */
  get packed(): boolean {
    return true;
  }

  at(index: number): number {
    return BODY_OFFSET + index * this.#resultSize;
  }

  written(): void {
    // in place: nothing to copy
  }

  /** Copy env `index`'s final result into the response tail (SAME_STEP). */
  keepFinal(index: number): void {
    const size = this.#resultSize;
    const tail = BODY_OFFSET + this.numEnvs * size + FINAL_COUNT_SIZE + this.#finals * (FINAL_COUNT_SIZE + size);
    writeU32(this.buffer, tail, index);
    const slot = BODY_OFFSET + index * size;
    this.buffer.copy(this.buffer, tail + FINAL_COUNT_SIZE, slot, slot + size);
    this.#finals++;
  }

  // -- requests ------------------------------------------------------------------------------------

  /**
   * Answer one request whose body is `buf[offset, offset + length)`: returns the response
   * msg_type; the body is `body()` (`bodyLength` bytes at BODY_OFFSET of `buffer`). Never throws
   * for a bad request: refusals become ERROR responses, and `closing` is set when the connection
   * must be closed after sending it.
   */
  handle(msgType: number, buf: Uint8Array, offset: number, length: number): number {
    this.#requests++;
    if (this.#tail !== null) {
      // a response is pending: answer this one after it, in order (its body copied: the
      // backend reuses its buffer), a macrotask later (the backend has sent the previous one)
      const body = Buffer.from(buf.subarray(offset, offset + length));
      const turn = this.#tail.then(() => new Promise<void>((resolve) => setImmediate(resolve)));
      return this.#pend(turn.then(() => this.#handleQueued(msgType, body)));
    }
    const type = this.#handleNow(msgType, buf, offset, length);
    return type === LATER ? this.#pend(this.#takeWaiting()) : type;
  }

  /** A queued request's msg_type, or the promise of it (a RECV that waits in turn). */
  #handleQueued(msgType: number, body: Buffer): number | Promise<number> {
    const type = this.#handleNow(msgType, body, 0, body.byteLength);
    return type === LATER ? this.#takeWaiting() : type;
  }

  /** The promise the handler that returned LATER left (its response's msg_type). */
  #takeWaiting(): Promise<number> {
    const waiting = this.#waiting;
    this.#waiting = null;
    if (waiting === null) throw new Error("a handler returned LATER without a promise");
    return waiting;
  }

  /** Answer with `work`'s msg_type when it settles (a rejection becomes an ERROR body): LATER. */
  #pend(work: Promise<number>): number {
    const settled = work.then(
      (type) => type,
      (error: unknown) =>
        error instanceof RequestError ? this.error(error.code, error.text) : this.error(ErrorCode.INTERNAL, describeError(error)),
    );
    const later: Promise<number> = settled.then((type) => {
      if (this.#tail === later) {
        this.#tail = null; // the last pending response: requests are answered at once again
        this.later = null;
      }
      return type;
    });
    this.#tail = later;
    this.later = later;
    return LATER;
  }

  #handleNow(msgType: number, buf: Uint8Array, offset: number, length: number): number {
    const ids = this.ids;
    try {
      if (msgType === ids.HELLO_REQ) return this.#helloRequest(buf, offset, length);
      if (
        msgType !== ids.RESET_REQ &&
        msgType !== ids.RESET_SEED_REQ &&
        msgType !== ids.RESET_SEEDS_REQ &&
        msgType !== ids.STEP_REQ &&
        msgType !== ids.STEP_MULTI_REQ &&
        msgType !== ids.STEP_BATCH_REQ &&
        msgType !== ids.HEALTH_REQ &&
        msgType !== ids.SPACES_REQ &&
        msgType !== this.#observeReq &&
        msgType !== ids.SEND_REQ &&
        msgType !== ids.RECV_REQ &&
        msgType !== ids.ASYNC_RESET_REQ
      ) {
        throw new RequestError(
          ErrorCode.UNKNOWN_MESSAGE,
          `msg_type 0x${msgType.toString(16).toUpperCase().padStart(2, "0")} is not a request`,
        );
      }
      if (!this.helloDone) throw new RequestError(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first");
      if (msgType === ids.SEND_REQ) return this.#send(buf, offset, length);
      if (msgType === ids.RECV_REQ) return this.#recv(buf, offset, length);
      if (msgType === ids.ASYNC_RESET_REQ) return this.#asyncReset(buf, offset, length);
      if (this.#async !== null && this.#async.count && msgType !== ids.HEALTH_REQ && msgType !== ids.SPACES_REQ) {
        this.#async.checkIdle(msgType);
      }
      switch (msgType) {
        case ids.STEP_REQ:
          return this.#step(buf, offset, length);
        case ids.STEP_BATCH_REQ:
          return this.#stepBatch(buf, offset, length);
        case ids.RESET_REQ:
          this.#expectSize(length, 0, "RESET_REQ");
          return this.#reset(null);
        case ids.RESET_SEED_REQ: {
          this.#expectSize(length, this.#seedSize, "RESET_SEED_REQ");
          const dv = new DataView(buf.buffer, buf.byteOffset + offset, length);
          return this.#reset(dv.getBigUint64(this.#seedAt, true));
        }
        case ids.RESET_SEEDS_REQ:
          return this.#resetSeeds(buf, offset, length);
        case ids.STEP_MULTI_REQ:
          return this.#stepMulti(buf, offset, length);
        case ids.HEALTH_REQ: {
          this.#expectSize(length, 0, "HEALTH_REQ");
          const at = this.#aside(1); // first: it may replace the buffer
          this.buffer[at] = 1;
          return ids.HEALTH_RESP;
        }
        case ids.SPACES_REQ:
          return this.#spacesRequest(length);
        default:
          return this.#observe(length);
      }
    } catch (error) {
      if (error instanceof RequestError) return this.error(error.code, error.text);
      // a bug must not take the server down (env errors are recovered by the runtime)
      return this.error(ErrorCode.INTERNAL, describeError(error));
    }
  }

  /** Put an ERROR body in the response buffer; sets `closing` for the closing codes. */
  error(code: ErrorCode, text: string): number {
    if (CLOSING_ERRORS.has(code)) this.closing = true;
    this.#setBody(encodeError(code, text));
    return this.ids.ERROR;
  }

  /** Length of the current response body (results at BODY_OFFSET; setting it says so). */
  get bodyLength(): number {
    return this.#bodyLength;
  }

  set bodyLength(length: number) {
    this.#bodyLength = length;
    this.#bodyAt = BODY_OFFSET;
  }

  /** Where a body that is not results goes: after the results region, its header before it. */
  get #asideAt(): number {
    return this.#resultsEnd + BODY_OFFSET;
  }

  /** Room for an aside body of `length` bytes; returns where it starts (the current body). */
  #aside(length: number): number {
    const at = this.#asideAt;
    if (at + length > this.buffer.byteLength) this.detachBuffer(at + length);
    this.#bodyAt = at;
    this.#bodyLength = length;
    return at;
  }

  /** The current response body (a view of `buffer`, valid until the next request). */
  body(): Buffer {
    const length = this.bodyLength;
    const at = this.#bodyAt;
    if (at !== BODY_OFFSET) return this.buffer.subarray(at, at + length);
    let view = this.#bodies.get(length);
    if (view === undefined) {
      view = this.buffer.subarray(BODY_OFFSET, BODY_OFFSET + length);
      if (this.#bodies.size > 64) this.#bodies.clear();
      this.#bodies.set(length, view);
    }
    return view;
  }

  /** Header + current body as one contiguous view of `buffer` (no copy). */
  frame(msgType: number, msgId: number): Buffer {
    const length = this.bodyLength;
    const at = this.#bodyAt;
    if (at !== BODY_OFFSET) {
      packHeader(this.buffer, at - HEADER_SIZE, msgType, msgId, length);
      return this.buffer.subarray(at - HEADER_SIZE, at + length);
    }
    packHeader(this.buffer, HEADER_OFFSET, msgType, msgId, length);
    let view = this.#frames.get(length);
    if (view === undefined) {
      view = this.buffer.subarray(HEADER_OFFSET, BODY_OFFSET + length);
      if (this.#frames.size > 64) this.#frames.clear();
      this.#frames.set(length, view);
    }
    return view;
  }

  /**
   * Give the current buffer away (a pending socket write still holds it) and answer the next
   * requests in a fresh one. Called by backends only when a write did not complete at once.
   */
  detachBuffer(minimum = this.buffer.byteLength): void {
    // not zero-filled and not a copy of the whole old buffer (each was ~20% of a zmq Node
    // server's time at N = 256): only the header and the results region are carried over, as a
    // reused buffer would hold them (a "noop" env's row keeps its previous result). The rest is
    // scratch that every response writes in full before sending it (the SAME_STEP tail, an
    // OBSERVE or RECV tail, an ERROR or HELLO body), so nothing stale from elsewhere in the
    // process can reach a response, and its pages are not even touched until written.
    //
    // A pool's session stays in a SharedArrayBuffer (zero-filled: no stale bytes either) when
    // it detaches now and then (http pipelining): the pool sees the new one in the next records
    // it gets and tells its workers with that command. One that detaches at every request or
    // every other (a zmq server at large N hands each reply to libzmq) takes a private buffer,
    // and the pool copies its results back: a fresh 1.3 MB SharedArrayBuffer (N = 256 pac_env)
    // costs ~450 us against ~90 us for an unzeroed private one whose memory malloc reuses (the
    // copy back it saves is ~30-60 us), so a detach per step stays as fast as it was.
    const old = this.buffer;
    const length = Math.max(minimum, old.byteLength);
    const often = this.#requests - this.#lastDetach <= 2;
    this.#lastDetach = this.#requests;
    const fresh = this.#shared && !often ? Buffer.from(new SharedArrayBuffer(length)) : Buffer.allocUnsafeSlow(length);
    const keep = Math.min(this.#resultsEnd, old.byteLength);
    fresh.set(keep === old.byteLength ? old : old.subarray(0, keep));
    this.buffer = fresh;
    this.#frames = new Map();
    this.#bodies = new Map();
  }

  /** The HELLO_RESP body for an auto-reset mode: own Hello (flags = mode) + msgpack info. */
  helloBody(mode: AutoReset = this.autoreset, hello: Hello | null = null): Buffer {
    // the same keys in the same order as Python: num_envs, env, server, autoreset, schema_name
    // (and schema_ir when the client discovers the schema)
    const info = helloResponseInfo(this.schema, hello, { ...this.info, autoreset: autoresetName(mode) });
    return encodeHello(this.schema.fingerprint, info, mode);
  }

  /** An ERROR or HELLO body: aside, never over the results region. */
  #setBody(body: Uint8Array): void {
    const at = this.#aside(body.byteLength); // first: it may replace the buffer
    this.buffer.set(body, at);
  }

  #helloRequest(buf: Uint8Array, offset: number, length: number): number {
    let mode: AutoReset;
    let hello: Hello;
    try {
      ({ hello, mode } = acceptHello(buf.subarray(offset, offset + length), this.schema));
    } catch (error) {
      if (error instanceof RequestError) return this.error(error.code, error.text);
      throw error;
    }
    if (this.helloDone) {
      // a second HELLO: a fresh session on the same envs (Python: the same)
      this.#async?.checkIdle(this.ids.HELLO_REQ);
      this.runtime.forgetResets();
    }
    this.runtime.autoreset = mode;
    this.helloDone = true;
    this.#setBody(this.helloBody(mode, hello));
    return this.ids.HELLO_RESP;
  }

  #expectSize(length: number, size: number, what: string): void {
    if (length !== size) {
      throw new RequestError(ErrorCode.BAD_BODY_SIZE, `${what} body is ${length} bytes, expected ${size}`);
    }
  }

  /** RESET_SEEDS: env i with its own seed (or unseeded): any list of seeds. */
  #resetSeeds(buf: Uint8Array, offset: number, length: number): number {
    const entry = this.#envSeed;
    this.#expectSize(length, this.numEnvs * entry.size, "RESET_SEEDS_REQ");
    checkSeedFlags(buf, offset, length, entry.size, entry.hasAt, "RESET_SEEDS_REQ");
    const dv = new DataView(buf.buffer, buf.byteOffset + offset, length);
    const seeds = this.#envSeeds;
    for (let i = 0; i < this.numEnvs; i++) {
      const at = i * entry.size;
      seeds[i] = dv.getUint8(at + entry.hasAt) ? dv.getBigUint64(at + entry.seedAt, true) : null;
    }
    this.runtime.reset(this, (i) => seeds[i] ?? null);
    this.bodyLength = this.numEnvs * this.#resultSize;
    return this.ids.RESET_RESP;
  }

  #reset(seed: bigint | null): number {
    this.runtime.resetAll(this, seed);
    this.bodyLength = this.numEnvs * this.#resultSize;
    return this.ids.RESET_RESP;
  }

  /** Step every env; the body is `count` results, SAME_STEP adds the tail of finals. */
  #stepAll(count: number): void {
    this.#finals = 0;
    this.runtime.step(this);
    this.#stepLength(count);
  }

  /** The body length of `count` step results; SAME_STEP adds the tail of finals. */
  #stepLength(count: number): void {
    let length = count * this.#resultSize;
    if (this.autoreset === AutoReset.SAME_STEP) {
      writeU32(this.buffer, BODY_OFFSET + length, this.#finals);
      length += FINAL_COUNT_SIZE + this.#finals * (FINAL_COUNT_SIZE + this.#resultSize);
    }
    this.bodyLength = length;
  }

  #step(buf: Uint8Array, offset: number, length: number): number {
    if (this.numEnvs !== 1) {
      throw new RequestError(ErrorCode.BAD_BATCH, `STEP_REQ needs a 1-env server; this one has ${this.numEnvs}`);
    }
    this.#expectSize(length, this.#stepRequestSize, "STEP_REQ");
    readActions(this.runtime.actions, buf, offset + this.#actionAt, this.#stepRequestSize, 1, this.#action);
    this.#stepAll(1);
    return this.ids.STEP_RESP;
  }

  #stepMulti(buf: Uint8Array, offset: number, length: number): number {
    const runtime = this.runtime;
    runtime.checkMulti();
    this.#expectSize(length, this.#multiSize, "STEP_MULTI_REQ");
    readActions(runtime.actions, buf, offset + this.#multiAt, this.#multi.size, runtime.seats, this.#multi);
    this.#finals = 0;
    if (runtime.stepMulti(this)) this.bodyLength = runtime.seats * this.#resultSize;
    else this.#stepLength(runtime.seats);
    return this.ids.STEP_MULTI_RESP;
  }

  #stepBatch(buf: Uint8Array, offset: number, length: number): number {
    const size = this.#stepRequestSize;
    if (size && length % size) {
      throw new RequestError(
        ErrorCode.BAD_BODY_SIZE,
        `STEP_BATCH_REQ body is ${length} bytes, not a whole number of ${size}-byte actions`,
      );
    }
    if (length !== this.numEnvs * size) {
      throw new RequestError(
        ErrorCode.BAD_BATCH,
        `STEP_BATCH_REQ carries ${size ? Math.floor(length / size) : 0} actions ` +
          `(${length} bytes); this server has ${this.numEnvs} envs`,
      );
    }
    readActions(this.runtime.actions, buf, offset + this.#actionAt, size, this.numEnvs, this.#action);
    this.#stepAll(this.numEnvs);
    return this.ids.STEP_BATCH_RESP;
  }

  // -- asynchronous batches (runtime/async_batches.ts holds the rules) ---------------------------

  #asyncBatches(): AsyncBatches {
    if (this.#async === null) this.#async = new AsyncBatches(this.runtime);
    return this.#async;
  }

  /** SEND_REQ: K requests, then a msgpack array of their K env ids. */
  #send(buf: Uint8Array, offset: number, length: number): number {
    const size = this.#stepRequestSize;
    const ids = sendEnvIds(buf.subarray(offset, offset + length), size, this.numEnvs);
    const batches = this.#asyncBatches();
    const k = ids.length;
    const actions = this.runtime.actions;
    const elements = this.runtime.actionRule.elements;
    const scratch = new Float64Array(k * elements);
    readActions(scratch, buf, offset + this.#actionAt, size, k, this.#action);
    for (let j = 0; j < k; j++) {
      const i = ids[j] as number;
      if (Number.isInteger(i) && i >= 0 && i < this.numEnvs) {
        actions.set(scratch.subarray(j * elements, (j + 1) * elements), i * elements);
      }
    }
    batches.send(ids);
    this.bodyLength = 0;
    return this.ids.SEND_RESP;
  }

  /** RECV_RESP: B results, then msgpack [env ids, ended env ids, their final results' bytes]. */
  #recv(buf: Uint8Array, offset: number, length: number): number {
    this.#expectSize(length, 4, "RECV_REQ");
    const batchSize = new DataView(buf.buffer, buf.byteOffset + offset, length).getUint32(0, true);
    const batches = this.#asyncBatches();
    const got = batches.recv(batchSize);
    if (got instanceof Promise) {
      this.#waiting = got.then((ids) => this.#recvBody(ids));
      return LATER;
    }
    return this.#recvBody(got);
  }

  /** The RECV_RESP body of envs `ids` (their results are in the async records). */
  #recvBody(ids: readonly number[]): number {
    const batches = this.#asyncBatches();
    const size = this.#resultSize;
    const records = batches.records;
    const sameStep = this.autoreset === AutoReset.SAME_STEP;
    const ended = sameStep ? ids.filter((i) => records.ended[i]) : [];
    const finals = new Uint8Array(ended.length * size);
    ended.forEach((i, k) => finals.set(records.finals.subarray(i * size, (i + 1) * size), k * size));
    const tail = msgpackEncode([ids, ended, finals]);
    const total = ids.length * size + tail.byteLength;
    if (BODY_OFFSET + total > this.buffer.byteLength) this.detachBuffer(BODY_OFFSET + total);
    ids.forEach((i, k) => this.buffer.set(records.bytes.subarray(i * size, (i + 1) * size), BODY_OFFSET + k * size));
    this.buffer.set(tail, BODY_OFFSET + ids.length * size);
    this.bodyLength = total;
    return this.ids.RECV_RESP;
  }

  /** ASYNC_RESET_REQ: reset every env (env i: seed + i) for RECV to return. */
  #asyncReset(buf: Uint8Array, offset: number, length: number): number {
    const entry = this.#envSeed;
    this.#expectSize(length, entry.size, "ASYNC_RESET_REQ");
    checkSeedFlags(buf, offset, length, entry.size, entry.hasAt, "ASYNC_RESET_REQ");
    const dv = new DataView(buf.buffer, buf.byteOffset + offset, length);
    const seed = dv.getUint8(entry.hasAt) ? dv.getBigUint64(entry.seedAt, true) : null;
    this.#asyncBatches().reset(seed);
    this.bodyLength = 0;
    return this.ids.SEND_RESP;
  }

  #spacesRequest(length: number): number {
    this.#expectSize(length, 0, "SPACES_REQ");
    const [obs, act] = this.#spacesNames;
    const at = this.#aside(this.#spacesCodec.size);
    this.#spacesCodec.encodeInto({ [obs]: this.spaces.obsN, [act]: this.spaces.actN }, this.buffer, at);
    return this.ids.SPACES_RESP;
  }

  /** OBSERVE_RESP: the N current results, then a msgpack array of the N info maps. */
  #observe(length: number): number {
    this.#expectSize(length, 0, "OBSERVE_REQ");
    const infos = this.runtime.observe(this);
    const results = this.numEnvs * this.#resultSize;
    const tail = msgpackEncode(infos);
    if (BODY_OFFSET + results + tail.byteLength > this.buffer.byteLength) {
      this.detachBuffer(BODY_OFFSET + results + tail.byteLength); // carries the results over
    }
    this.buffer.set(tail, BODY_OFFSET + results);
    this.bodyLength = results + tail.byteLength;
    return this.#observeResp;
  }
}

function firstField(schema: SchemaModule, struct: string, index = 0): { name: string; offset: number; type: string; size: number; count: number } {
  const field = schema.ir.structs[struct]?.fields[index];
  if (field === undefined) throw new ProtocolError(`struct ${struct} has no field ${index}`);
  return field;
}

/** Makes one Session per connection from a host: a fresh runtime each (tests, servers). */
export function sessionsOf(host: EnvHost): () => Session {
  return () => new Session(host.runtime(), { envName: host.envName, serverLang: host.serverLang });
}

/** A host's session maker from an env or factory (the tests' shorthand for `new EnvHost`). */
export function sessionFactory(envOrFactory: EnvOrFactory, options: HostOptions = {}): () => Session {
  return sessionsOf(new EnvHost(envOrFactory, options));
}
