/**
 * The client API: `connect(url) -> Client` over any registered backend (transport/client.py).
 *
 *   const client = await connect("unix:///tmp/pac.sock");
 *   const first = await client.reset(7n);          // StepResultView (N = 1)
 *   const next = await client.step(3);             // next.observation: Float32Array view
 *   await client.close();
 *
 * Results are zero-copy views into the channel's receive buffer (bodies are placed at
 * BODY_OFFSET, so the f32 observation is an aligned Float32Array over it): valid until the
 * next call on the same client, built once per buffer (a steady-state step allocates no view).
 * `{ copy: true }` returns decoded, owned values instead. With N > 1 envs, `reset` and `step`
 * (one action per env) return one view per env.
 */

import { type Backend, backendFor } from "./backends";
import type { AnyStructCodec, SchemaModule } from "./codec";
import type { Spaces } from "./runtime/env";
import {
  ConnectError,
  FingerprintMismatchError,
  PeerGoneError,
  ProtocolError,
  TransportError,
  TransportTimeoutError,
} from "./errors";
import * as pac_env from "./generated/pac_env";
import {
  AUTORESET_MASK,
  AutoReset,
  type AutoResetName,
  BODY_OFFSET,
  DEFAULT_MAX_BODY,
  FINAL_COUNT_SIZE,
  type MessageIds,
  MESSAGE_IDS,
  SCHEMA_IR_KEY,
  SCHEMA_NAME_KEY,
  autoresetName,
  checkHello,
  decodeError,
  decodeHello,
  encodeHelloRequest,
  messageIds,
  mismatchText,
  schemaFromIrText,
  readU32,
  toAutoReset,
} from "./protocol";
import { decode as msgpackDecode, encode as msgpackEncode } from "@msgpack/msgpack";
import { type ActionType, actionTypeOf, writeAction, writeArrayAction } from "./runtime/core";
import { fieldDims } from "./ir";
import type { Channel, ChannelRecords, Final } from "./stream";

export const DEFAULT_TIMEOUT_MS = 10_000;

export interface ConnectOptions {
  /** Milliseconds any one wait may take (connecting, each request); null waits forever. */
  readonly timeoutMs?: number | null;
  /** Largest response body accepted (bytes). */
  readonly maxBody?: number;
  /** Schema: pins the session to it (another server schema is refused, both named); omitted,
   * the server's schema is discovered in the handshake (`client.schema`). */
  readonly schema?: SchemaModule;
  /**
   * Who resets an env whose episode ended (docs/protocol.md, "Auto-reset"): "disabled" (the
   * client sends a reset; default), "next_step" (the next step of a done env resets it) or
   * "same_step" (the step that ends an episode resets at once; `client.finals` carries the
   * final results).
   */
  readonly autoreset?: AutoReset | AutoResetName;
}

export interface ResultOptions {
  /** Decode owned values instead of returning views into the receive buffer. */
  readonly copy?: boolean;
}

export type { Final } from "./stream";

function bodyCodec(schema: SchemaModule, message: string): AnyStructCodec {
  const body = schema.messages[message]?.body;
  const codec = body ? schema.structs[body] : undefined;
  if (codec === undefined) {
    throw new ProtocolError(`message ${message} of schema ${schema.name} has no body struct`);
  }
  return codec;
}

/** What to do about each client-side transport error, said after its message (Python: `HINTS`). */
const HINTS: ReadonlyArray<readonly [abstract new (...args: never[]) => TransportError, string]> = [
  [
    ConnectError,
    "is a server serving this URL? start one with `transport-serve URL` or serve(env, URL), or check the URL",
  ],
  [PeerGoneError, "the server closed the connection or died: see the server's log, then connect again"],
  [
    TransportTimeoutError,
    "the connection is kept and the late reply is dropped when it comes: retry, or connect with a " +
      "larger timeoutMs if the server's envs are slow",
  ],
  [
    ProtocolError,
    "client and server disagree: check that both use the same transport version and schema, then connect again",
  ],
];

/**
 * `error` with the URL before its message and what to do after it (once; the same object, its
 * class and fields unchanged): every transport error a client throws names both. Other errors
 * pass unchanged. Python: `transport.client.explain`.
 */
export function explain(error: unknown, url: string): unknown {
  if (!(error instanceof TransportError)) return error;
  for (const [kind, hint] of HINTS) {
    if (error instanceof kind) {
      if (error.message.includes(hint)) return error;
      const named = error.message.includes(url) ? error.message : `${url}: ${error.message}`;
      error.message = `${named} (${hint})`;
      break;
    }
  }
  return error;
}

/**
 * HELLO_REQ / HELLO_RESP on a new channel: the session's schema and the server's info map.
 * `schema` null discovers it (the server answers with its compiled IR, which must hash to the
 * fingerprint it announced). A mismatch names both schemas and the server's URL.
 */
export async function handshake(
  channel: Channel,
  schema: SchemaModule | null,
  autoreset: AutoReset = AutoReset.DISABLED,
  url = "",
): Promise<{ schema: SchemaModule; info: Record<string, unknown> }> {
  const where = `the server at ${url || "?"}`;
  const ids = schema === null ? MESSAGE_IDS : messageIds(schema);
  const type = await channel.request(ids.HELLO_REQ, encodeHelloRequest(schema, autoreset));
  const body = channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength);
  if (type === ids.ERROR) {
    const error = decodeError(body);
    if (error instanceof FingerprintMismatchError) {
      const text = error.message.replace(/^server refused the session: /, "");
      throw new FingerprintMismatchError(`${where} refused the session: ${text}`, schema?.fingerprint ?? 0n, 0n);
    }
    throw error;
  }
  if (type !== ids.HELLO_RESP) {
    throw new ProtocolError(`expected HELLO_RESP, got msg_type 0x${type.toString(16).toUpperCase().padStart(2, "0")}`);
  }
  const hello = decodeHello(body);
  let found: SchemaModule;
  if (schema === null) {
    checkHello(hello, hello.fingerprint, "server"); // the version
    found = schemaFromIrText(hello.info[SCHEMA_IR_KEY], hello.fingerprint, where);
  } else if (hello.fingerprint !== BigInt.asUintN(64, schema.fingerprint)) {
    const serverName = hello.info[SCHEMA_NAME_KEY];
    throw new FingerprintMismatchError(
      `${where}: ${mismatchText(typeof serverName === "string" ? serverName : "", hello.fingerprint, schema.name, schema.fingerprint)}`,
      schema.fingerprint,
      hello.fingerprint,
    );
  } else {
    checkHello(hello, schema.fingerprint, "server");
    found = schema;
  }
  if ((hello.flags & AUTORESET_MASK) !== autoreset) {
    throw new ProtocolError(
      `server answered auto-reset mode ${hello.flags & AUTORESET_MASK}, asked ${autoreset}`,
    );
  }
  // the schema's keys are the handshake's own (client.schema holds the schema)
  const info: Record<string, unknown> = { ...hello.info };
  delete info[SCHEMA_IR_KEY];
  delete info[SCHEMA_NAME_KEY];
  return { schema: found, info: { ...info, autoreset: autoresetName(autoreset) } };
}

/** What `reset` takes: one seed (env i gets seed + i), one seed or null per env, or nothing. */
export type Seeds = bigint | number | null | ReadonlyArray<bigint | number | null>;

/** A step's actions: one integer (1-env server) or one per env; for array actions (Box,
 * MultiDiscrete) one array (1-env server), one per env, or all envs' elements flat. */
export type Actions = number | ArrayLike<number> | ReadonlyArray<ArrayLike<number>>;

/** A RESET_SEEDS_REQ body: one (seed, has_seed) entry per env; null resets that env unseeded. */
export function seedsBody(schema: SchemaModule, seeds: ReadonlyArray<bigint | number | null>, numEnvs: number): Buffer {
  if (seeds.length !== numEnvs) {
    throw new TransportError(`expected ${numEnvs} seeds (one per env, or null), got ${seeds.length}`);
  }
  const codec = bodyCodec(schema, "RESET_SEEDS_REQ");
  const fields = schema.ir.structs[codec.name]?.fields ?? [];
  const seedAt = fields.find((f) => f.name === "seed")?.offset ?? 0;
  const hasAt = fields.find((f) => f.name === "has_seed")?.offset ?? 8;
  const body = Buffer.alloc(codec.size * numEnvs);
  seeds.forEach((seed, i) => {
    if (seed === null) return;
    const value = BigInt(seed);
    if (value < 0n || value >= 1n << 64n) throw new TransportError(`a seed must be in 0..2**64-1 or null, not ${seed}`);
    body.writeBigUInt64LE(value, i * codec.size + seedAt);
    body[i * codec.size + hasAt] = 1;
  });
  return body;
}

/**
 * A connection to an env server. Call `close()` when done. `View` and `Value` are the result
 * struct's view and value types of the schema (pac_env's by default).
 */
export class Client<View = pac_env.StepResultView, Value = pac_env.StepResult> {
  readonly channel: Channel;
  readonly schema: SchemaModule;
  readonly url: string;
  readonly ids: MessageIds;
  readonly numEnvs: number;
  readonly serverInfo: Readonly<Record<string, unknown>>;
  /** The auto-reset mode of this session (from the handshake). */
  readonly autoreset: AutoReset;
  /** The server's masked-action policy ("reject", "pass", "noop"; an older server: "reject"). */
  readonly maskedActions: string;
  /**
   * SAME_STEP auto-reset: the env index and owned final result of each episode that ended in
   * the last step; the step's own result holds the reset result for those envs. Empty otherwise.
   */
  finals: Final<Value>[] = [];
  readonly #result: AnyStructCodec;
  readonly #resultSize: number;
  readonly #request: Buffer;
  readonly #actionAt: number;
  readonly #actionType: ActionType;
  /** The action field is an array (Box, MultiDiscrete): one array of numbers per env. */
  readonly #arrayAction: boolean;
  readonly #stepSize: number;
  readonly #seed: Buffer;
  readonly #seedAt: number;
  readonly #spaces: AnyStructCodec;
  readonly #expected: ReadonlyMap<number, number>;
  readonly #multi: { readonly codec: AnyStructCodec; readonly field: string; readonly seats: number; readonly body: Buffer };
  #views: View[] = [];
  #viewsGeneration = -1;
  #closed = false;

  constructor(channel: Channel, schema: SchemaModule, url: string) {
    this.channel = channel;
    this.schema = schema;
    this.url = url;
    this.ids = messageIds(schema);
    const n = Number(channel.info.num_envs ?? 1);
    this.numEnvs = Number.isInteger(n) && n >= 1 ? n : 1;
    this.serverInfo = { ...channel.info };
    this.autoreset = toAutoReset(String(channel.info.autoreset ?? "disabled"));
    this.maskedActions = String(channel.info.masked_actions ?? "reject");
    this.#result = bodyCodec(schema, "STEP_RESP");
    this.#resultSize = this.#result.size;
    const step = bodyCodec(schema, "STEP_REQ");
    const action = schema.ir.structs[step.name]?.fields.find((f) => f.role === "action");
    if (action === undefined) throw new ProtocolError("the STEP_REQ body struct has no field with role 'action'");
    this.#actionAt = action.offset;
    this.#actionType = actionTypeOf(schema, action, "STEP_REQ action", 1, true);
    this.#arrayAction = fieldDims(action).length > 0;
    this.#stepSize = step.size;
    this.#request = Buffer.alloc(step.size * this.numEnvs);
    const seed = bodyCodec(schema, "RESET_SEED_REQ");
    this.#seed = Buffer.alloc(seed.size);
    this.#seedAt = schema.ir.structs[seed.name]?.fields[0]?.offset ?? 0;
    this.#spaces = bodyCodec(schema, "SPACES_RESP");
    const multi = bodyCodec(schema, "STEP_MULTI_REQ");
    const multiField = schema.ir.structs[multi.name]?.fields[0];
    if (multiField === undefined) throw new ProtocolError("the STEP_MULTI_REQ body struct has no field");
    this.#multi = { codec: multi, field: multiField.name, seats: multiField.count, body: Buffer.alloc(multi.size) };
    this.#expected = new Map([
      [this.ids.STEP_MULTI_RESP, this.#resultSize * multiField.count],
      [this.ids.RESET_RESP, this.#resultSize * this.numEnvs],
      [this.ids.STEP_RESP, this.#resultSize],
      [this.ids.STEP_BATCH_RESP, this.#resultSize * this.numEnvs],
    ]);
  }

  /** Reset every env (env i gets seed + i); one view per env when N > 1. */
  reset(seed?: Seeds, options?: ResultOptions & { copy?: false }): Promise<View | View[]>;
  reset(seed: Seeds | undefined, options: ResultOptions & { copy: true }): Promise<Value | Value[]>;
  async reset(seed?: Seeds, options: ResultOptions = {}): Promise<View | View[] | Value | Value[]> {
    if (seed === undefined || seed === null) {
      await this.#exchange(this.ids.RESET_REQ, EMPTY, this.ids.RESET_RESP);
    } else if (typeof seed === "object") {
      await this.#exchange(this.ids.RESET_SEEDS_REQ, seedsBody(this.schema, seed, this.numEnvs), this.ids.RESET_RESP);
    } else {
      this.#seed.writeBigUInt64LE(BigInt.asUintN(64, BigInt(seed)), this.#seedAt);
      await this.#exchange(this.ids.RESET_SEED_REQ, this.#seed, this.ids.RESET_RESP);
    }
    return this.#results(this.numEnvs === 1 ? 0 : this.numEnvs, options.copy === true);
  }

  /** Step with one action (1-env server) or one per env (one view per env). An array action
   * (Box, MultiDiscrete) is an array of numbers: one for a 1-env server, else one per env (nested,
   * or flat: env i's elements at i * elements). */
  step(actions: Actions, options?: ResultOptions & { copy?: false }): Promise<View | View[]>;
  step(actions: Actions, options: ResultOptions & { copy: true }): Promise<Value | Value[]>;
  async step(actions: Actions, options: ResultOptions = {}): Promise<View | View[] | Value | Value[]> {
    const request = this.#request;
    if (this.#arrayAction) return this.#stepArrays(actions, options);
    if (typeof actions !== "number" && typeof actions[0] === "object") {
      throw new TransportError(`schema ${this.schema.name} has one integer action per env, not arrays`);
    }
    if (typeof actions === "number") {
      if (this.numEnvs !== 1) {
        throw new TransportError(`this server has ${this.numEnvs} envs: pass one action per env`);
      }
      writeAction(request, this.#actionAt, actions | 0, this.#actionType);
      await this.#exchange(this.ids.STEP_REQ, request, this.ids.STEP_RESP);
      return this.#results(0, options.copy === true);
    }
    if (actions.length !== this.numEnvs) {
      throw new TransportError(`expected ${this.numEnvs} actions, got ${actions.length}`);
    }
    for (let i = 0; i < actions.length; i++) {
      writeAction(request, i * this.#stepSize + this.#actionAt, (actions[i] as number) | 0, this.#actionType);
    }
    await this.#exchange(this.ids.STEP_BATCH_REQ, request, this.ids.STEP_BATCH_RESP);
    return this.#results(this.numEnvs, options.copy === true);
  }

  async #stepArrays(actions: Actions, options: ResultOptions): Promise<View | View[] | Value | Value[]> {
    const request = this.#request;
    const elements = this.#actionType.elements;
    if (typeof actions === "number") {
      throw new TransportError(`schema ${this.schema.name} has array actions of ${elements} elements: pass an array`);
    }
    const nested = typeof actions[0] === "object";
    const count = nested ? actions.length : actions.length / elements;
    if (count !== this.numEnvs || !Number.isInteger(count)) {
      throw new TransportError(
        `expected ${this.numEnvs} action(s) of ${elements} elements, got ${nested ? `${actions.length} arrays` : `${actions.length} numbers`}`,
      );
    }
    for (let i = 0; i < count; i++) {
      const values = nested
        ? (actions[i] as ArrayLike<number>)
        : Array.prototype.slice.call(actions as ArrayLike<number>, i * elements, (i + 1) * elements);
      writeArrayAction(request, i * this.#stepSize + this.#actionAt, values, this.#actionType);
    }
    if (this.numEnvs === 1) {
      await this.#exchange(this.ids.STEP_REQ, request, this.ids.STEP_RESP);
      return this.#results(0, options.copy === true);
    }
    await this.#exchange(this.ids.STEP_BATCH_REQ, request, this.ids.STEP_BATCH_RESP);
    return this.#results(this.numEnvs, options.copy === true);
  }

  /**
   * STEP_MULTI: one action per seat of a multi-player game (seed 000's self-play: 8 seats), one
   * result view per seat. The server steps a 1-env game's `stepBatch` once (or, with as many envs
   * as seats, each env once).
   */
  async stepMulti(actions: ArrayLike<number>, options: ResultOptions = {}): Promise<View[] | Value[]> {
    const multi = this.#multi;
    if (actions.length !== multi.seats) throw new TransportError(`expected ${multi.seats} seat actions, got ${actions.length}`);
    multi.codec.encodeInto({ [multi.field]: Array.from(actions) }, multi.body, 0);
    await this.#exchange(this.ids.STEP_MULTI_REQ, multi.body, this.ids.STEP_MULTI_RESP);
    return this.#results(multi.seats, options.copy === true) as View[] | Value[];
  }

  /** Observation length and number of actions. */
  async spaces(): Promise<Spaces> {
    const body = await this.#exchange(this.ids.SPACES_REQ, EMPTY, this.ids.SPACES_RESP);
    const values = this.#spaces.decode(body, 0, false) as Record<string, number>;
    const [first, second] = Object.values(values);
    return { obsN: Number(first), actN: Number(second) };
  }

  async health(): Promise<boolean> {
    const body = await this.#exchange(this.ids.HEALTH_REQ, EMPTY, this.ids.HEALTH_RESP);
    return body.byteLength >= 1 && body[0] === 1;
  }

  async close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      await this.channel.close();
    }
  }

  /**
   * OBSERVE: every env's current result without stepping (one view per env when N > 1) and each
   * env's info map. Needs a schema that declares OBSERVE_REQ / OBSERVE_RESP.
   */
  async observe(options: ResultOptions = {}): Promise<{ results: View | View[] | Value | Value[]; infos: Array<Record<string, unknown>> }> {
    const request = this.schema.messages["OBSERVE_REQ"]?.id;
    const response = this.schema.messages["OBSERVE_RESP"]?.id;
    if (request === undefined || response === undefined) {
      throw new ProtocolError(`schema ${this.schema.name} declares no OBSERVE_REQ / OBSERVE_RESP`);
    }
    const body = await this.#exchange(request, EMPTY, response);
    const records = this.channel.records;
    let infos: Array<Record<string, unknown>>;
    if (records !== undefined) {
      infos = records.infos();
    } else {
      const decoded = msgpackDecode(body.subarray(this.numEnvs * this.#resultSize));
      if (!Array.isArray(decoded)) throw new ProtocolError("OBSERVE_RESP's tail is not a msgpack array");
      infos = decoded as Array<Record<string, unknown>>;
    }
    return { results: this.#results(this.numEnvs === 1 ? 0 : this.numEnvs, options.copy === true), infos };
  }

  // -- asynchronous batches (docs/client.md; the rules are the server runtime's) -----------------

  /**
   * Start stepping envs `envIds` (action `actions[k]` for env `envIds[k]`): `recv` returns their
   * results as they finish. An env already in flight is refused (ASYNC_STATE).
   */
  async send(actions: ArrayLike<number>, envIds: ArrayLike<number>): Promise<void> {
    const k = envIds.length;
    if (k < 1 || k > this.numEnvs) throw new TransportError(`send takes 1..${this.numEnvs} env ids, got ${k}`);
    if (actions.length !== k) throw new TransportError(`send got ${actions.length} actions for ${k} env ids`);
    if (this.#arrayAction) throw new TransportError(`schema ${this.schema.name}: send takes one integer action per env`);
    const size = this.#stepSize;
    const body = Buffer.alloc(k * size);
    for (let j = 0; j < k; j++) writeAction(body, j * size + this.#actionAt, (actions[j] as number) | 0, this.#actionType);
    const ids = Array.from(envIds, (i) => Number(i));
    await this.#exchange(this.ids.SEND_REQ, Buffer.concat([body, msgpackEncode(ids)]), this.ids.SEND_RESP);
  }

  /**
   * The first `batchSize` (default N) in-flight envs to finish, or all in flight if fewer: owned
   * results, the env id of each, and (SAME_STEP) the final results of the episodes that ended.
   */
  async recv(batchSize: number = this.numEnvs): Promise<{ results: Value[]; envIds: number[]; finals: Final<Value>[] }> {
    const request = Buffer.alloc(4);
    request.writeUInt32LE(batchSize, 0);
    const resp = await this.#exchange(this.ids.RECV_REQ, request, this.ids.RECV_RESP);
    const size = this.#resultSize;
    for (let b = 1; b <= batchSize && b * size < resp.byteLength; b++) {
      if (resp[b * size] !== 0x93) continue;
      let tail: unknown;
      try {
        tail = msgpackDecode(resp.subarray(b * size));
      } catch {
        continue;
      }
      if (!Array.isArray(tail) || tail.length !== 3 || !Array.isArray(tail[0]) || tail[0].length !== b) continue;
      const [ids, ended, finalBytes] = tail as [number[], number[], Uint8Array];
      const results: Value[] = [];
      for (let k = 0; k < b; k++) results.push(this.#result.decode(resp, k * size, false) as Value);
      const finals: Final<Value>[] = ended.map((index, k) => ({
        index,
        result: this.#result.decode(Buffer.from(finalBytes.subarray(k * size, (k + 1) * size)), 0, false) as Value,
      }));
      return { results, envIds: ids, finals };
    }
    throw new ProtocolError(`RECV_RESP of ${resp.byteLength} bytes: no tail of env ids`);
  }

  /** Reset every env (env i: seed + i) for `recv` to return (nothing may be in flight). */
  async asyncReset(seed: number | bigint | null = null): Promise<void> {
    const body = Buffer.alloc(16);
    if (seed !== null) {
      body.writeBigUInt64LE(BigInt(seed), 0);
      body[8] = 1;
    }
    await this.#exchange(this.ids.ASYNC_RESET_REQ, body, this.ids.SEND_RESP);
  }

  async #exchange(msgType: number, body: Uint8Array, expect: number): Promise<Buffer> {
    if (this.#closed) throw new TransportError(`${this.url}: the client is closed`);
    const channel = this.channel;
    let type: number;
    try {
      type = await channel.request(msgType, body);
    } catch (error) {
      throw explain(error, this.url);
    }
    const resp = channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength);
    if (type === this.ids.ERROR) throw decodeError(resp);
    if (type !== expect) {
      throw explain(new ProtocolError(`expected msg_type 0x${hex(expect)}, got 0x${hex(type)}`), this.url);
    }
    const records = channel.records;
    if (records !== undefined) {
      // results in the channel's records (shm slots): finals from its final areas
      const stepped = expect === this.ids.STEP_RESP || expect === this.ids.STEP_BATCH_RESP;
      this.finals = stepped && this.autoreset === AutoReset.SAME_STEP ? (records.finals() as Final<Value>[]) : NO_FINALS;
      return resp;
    }
    const expected = this.#expected.get(expect);
    if (expected !== undefined && channel.bodyLength !== expected) {
      if (this.autoreset !== AutoReset.SAME_STEP || expect === this.ids.RESET_RESP) {
        throw new ProtocolError(`response 0x${hex(type)} has ${channel.bodyLength} bytes, expected ${expected}`);
      }
      this.#readFinals(resp, expected);
    } else if (this.finals.length) {
      this.finals = [];
    }
    return resp;
  }

  /** Parse the SAME_STEP tail: u32 count, then (u32 env index, final result) each. */
  #readFinals(resp: Buffer, resultsLength: number): void {
    const size = this.#resultSize;
    if (resp.byteLength < resultsLength + FINAL_COUNT_SIZE) {
      throw new ProtocolError(`step response of ${resp.byteLength} bytes lacks its final tail`);
    }
    const count = readU32(resp, resultsLength);
    if (
      count > this.numEnvs ||
      resp.byteLength !== resultsLength + FINAL_COUNT_SIZE + count * (FINAL_COUNT_SIZE + size)
    ) {
      throw new ProtocolError(`final tail says ${count} results; body is ${resp.byteLength} bytes`);
    }
    const finals: Final<Value>[] = [];
    for (let k = 0; k < count; k++) {
      const start = resultsLength + FINAL_COUNT_SIZE + k * (FINAL_COUNT_SIZE + size);
      const index = readU32(resp, start);
      finals.push({ index, result: this.#result.decode(resp, start + FINAL_COUNT_SIZE, false) as Value });
    }
    this.finals = finals;
  }

  #results(count: number, copy: boolean): View | View[] | Value | Value[] {
    const records = this.channel.records;
    if (records !== undefined) return this.#recordResults(records, count, copy);
    const buffer = this.channel.buffer;
    const size = this.#resultSize;
    if (copy) {
      if (count === 0) return this.#result.decode(buffer, BODY_OFFSET, false) as Value;
      const out: Value[] = [];
      for (let i = 0; i < count; i++) out.push(this.#result.decode(buffer, BODY_OFFSET + i * size, false) as Value);
      return out;
    }
    if (this.#viewsGeneration !== this.channel.generation || this.#views.length < Math.max(count, 1)) {
      const views: View[] = [];
      for (let i = 0; i < Math.max(count, 1, this.numEnvs); i++) {
        views.push(this.#result.view(buffer, BODY_OFFSET + i * size) as View);
      }
      this.#views = views;
      this.#viewsGeneration = this.channel.generation;
      this.#batch = null;
    }
    if (count === 0) return this.#views[0] as View;
    if (this.#batch === null || this.#batch.length !== count) this.#batch = this.#views.slice(0, count);
    return this.#batch;
  }

  #batch: View[] | null = null;

  /** Results a channel keeps outside its buffer (shm:// slots): views built once, reused. */
  #recordResults(records: ChannelRecords, count: number, copy: boolean): View | View[] | Value | Value[] {
    if (copy) {
      if (count === 0) return records.decode(0) as Value;
      const out: Value[] = [];
      for (let i = 0; i < count; i++) out.push(records.decode(i) as Value);
      return out;
    }
    if (this.#views.length < Math.max(count, 1)) {
      this.#views = [];
      for (let i = 0; i < records.count; i++) this.#views.push(records.view(i) as View);
    }
    if (count === 0) return this.#views[0] as View;
    if (this.#batch === null || this.#batch.length !== count) this.#batch = this.#views.slice(0, count);
    return this.#batch;
  }
}

const NO_FINALS: Final<never>[] = [];

const EMPTY = Buffer.alloc(0);

function hex(value: number): string {
  return value.toString(16).toUpperCase().padStart(2, "0");
}

/**
 * Connect to an env server and complete the HELLO handshake. `timeoutMs` bounds every wait
 * (connecting, each request): a dead server is `PeerGoneError`, a silent one
 * `TransportTimeoutError`, nothing listening `ConnectError`.
 */
export async function connect<View = pac_env.StepResultView, Value = pac_env.StepResult>(
  url: string,
  options: ConnectOptions = {},
): Promise<Client<View, Value>> {
  const pinned = options.schema ?? null; // none: discover the server's in the handshake
  const autoreset = toAutoReset(options.autoreset ?? AutoReset.DISABLED);
  const backend: Backend = await backendFor(url);
  const maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
  // a discovering HELLO_RESP carries the IR (KBs): its channel takes at least the default
  // maxBody; a smaller limit asked for applies to the pinned channel opened after it
  const firstMax = pinned === null ? Math.max(maxBody, DEFAULT_MAX_BODY) : maxBody;
  const open = (schema: SchemaModule | undefined, limit: number): Promise<Channel> =>
    backend.openChannel(url, {
      timeoutMs: options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs,
      maxBody: limit,
      ...(schema === undefined ? {} : { schema }),
    });
  let channel: Channel;
  try {
    channel = await open(pinned ?? undefined, firstMax);
  } catch (error) {
    throw explain(error, url);
  }
  let session: { schema: SchemaModule; info: Record<string, unknown> };
  try {
    session = await handshake(channel, pinned, autoreset, url);
    const own = (channel as { schema?: SchemaModule }).schema;
    if (pinned === null && (firstMax !== maxBody || own?.fingerprint !== session.schema.fingerprint)) {
      // opened before the schema was known, and it carries one (HTTP's fingerprint header) or
      // a larger maxBody: a fresh channel pinned to the discovered schema
      await channel.close();
      channel = await open(session.schema, maxBody);
      session = await handshake(channel, session.schema, autoreset, url);
    }
    channel.info = session.info;
  } catch (error) {
    await channel.close();
    throw explain(error, url);
  }
  return new Client<View, Value>(channel, session.schema, url);
}
