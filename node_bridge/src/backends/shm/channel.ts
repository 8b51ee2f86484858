/**
 * The shm:// client channel: the one `Client` (client.ts) over a region's slots, against a Python
 * or a Node server (docs/shm.md "Attach", "Lease", "One request").
 *
 * `request(msgType, body)` turns a protocol request into a slot command on every slot (RESET with
 * seed + i, STEP with each env's action, HELLO with the auto-reset mode, OBSERVE), publishes it
 * (request words, then the doorbell) and waits for each slot's response word. Results are never
 * copied: `records` hands the Client zero-copy views into the slots (the result struct's view
 * where the slot holds it whole, else the slot struct's, whose fields carry the result's names),
 * the layout being the schema's (IR `shm`; the column layout: per-env views over the result
 * columns, `records.columns()` each field of all envs as one typed array over the mapping, the
 * actions written into the request column); STEP_MULTI writes one seat action in each of slots
 * 0..seats-1 (a region with seat slots). SAME_STEP finals come from the final areas whose `final_seq` equals this
 * request's sequence, and a slot status != 0 becomes an ERROR body decoded by the protocol's one
 * error mapping. HELLO_RESP, SPACES_RESP and HEALTH_RESP are answered from the control block.
 *
 * Waiting: a short synchronous spin (the URL's wait policy), then FUTEX_WAIT slices on a libuv
 * thread (the event loop keeps running); between slices the region's state and the server's
 * liveness are checked, so a dead server is PeerGoneError within about one slice and a silent one
 * TransportTimeoutError after `timeoutMs`.
 *
 * Asynchronous batches (docs/shm.md "Asynchronous batches"): SEND_REQ publishes STEP on the slots
 * of the env ids it names and returns at once (those envs are *in flight*); RECV_REQ waits for any
 * `min(B, in flight)` of them (FUTEX_WAITV on their response words) and answers the stream
 * RECV_RESP body; ASYNC_RESET_REQ is a RESET round trip after which every env is in flight. The
 * rules are the env runtime's (`checkSend`, `checkRecv`, `checkIdle`).
 */

import { closeSync, fstatSync, readSync } from "node:fs";
import { decode as msgpackDecode, encode as msgpackEncode } from "@msgpack/msgpack";
import type { AnyStructCodec, SchemaModule } from "../../codec";
import {
  ConnectError,
  FingerprintMismatchError,
  PeerGoneError,
  ProtocolError,
  RegionInUseError,
  RegionMismatchError,
  TransportError,
  TransportTimeoutError,
  VersionMismatchError,
  requestInFlight,
} from "../../errors";
import {
  AutoReset,
  BODY_OFFSET,
  ErrorCode,
  type MessageIds,
  RequestError,
  type Hello,
  acceptHello,
  autoresetName,
  carriesFinals,
  encodeError,
  encodeHello,
  helloResponseInfo,
  messageIds,
  mismatchText,
  schemaFromIrText,
} from "../../protocol";
import {
  type ActionType,
  actionTypeOf,
  bodyCodec,
  readActions,
  stepAction,
  writeAction,
  writeArrayAction,
} from "../../runtime/core";
import { checkIdle, checkRecv, checkResetSent, checkSend, sendEnvIds } from "../../runtime/async_batches";
import { type Channel, type ChannelRecords, type Final, timeoutOption } from "../../stream";
import { MAX_NUM_ENVS, type OpenOptions } from "../backend";
import {
  CB,
  CONTROL_SIZE,
  LAYOUT_VERSION,
  MAGIC,
  Region,
  RegionState,
  SEQ_MASK,
  SLEEP_BIT,
  SegmentMissingError,
  ShmLayout,
  type ShmUrl,
  SlotChecksums,
  SlotCommand,
  type WaitOptions,
  WAIT_CLOSED,
  WAIT_PEER_DEAD,
  WAIT_TIMEOUT,
  off,
  openSegmentForReading,
  parseShmUrl,
  peerAlive,
  procStartTime,
  publishWord,
  schemaAreaOfFd,
  waitWordAsync,
  namesWaitPolicy,
} from "./region";
import { INFO_SIDE, SIDE_REF_SIZE, SideReader } from "./side";
import { columnArrays, columnEnvView, gatherRow } from "./columns";
import type { ShmColumn } from "../../ir";
import { FUTEX2_SIZE_U32, FUTEX_WAITV_MAX, FUTEX_WAITV_WORDS, native } from "./native";
import { resultLayout } from "./server";

/** One result field's place in the packed result, in a slot and in a final area. */
interface ResultRun {
  readonly packed: number;
  readonly slot: number;
  readonly final: number;
  readonly size: number;
}

/** One spin iteration's cost (a C PAUSE: the unit of WaitPolicy.spin), as region.ts counts it. */
const SPIN_NS = 25;
/** RECV's spin budget is the wait policy's divided by this (docs/decisions.md, "any B of N"). */
const WAIT_ANY_SPIN_SHARE = 8;
/** Without futex_waitv, a RECV sleeps on one of its words in slices this short (ms). */
const ONE_WORD_SLICE_MS = 0.2;

/** A class whose instances show `names` of the slot view they wrap (read-only getters). */
function projection(name: string, names: readonly string[]): new (slot: Record<string, unknown>) => object {
  class ResultView {
    readonly #slot: Record<string, unknown>;
    constructor(slot: Record<string, unknown>) {
      this.#slot = slot;
    }
    static get(view: ResultView, field: string): unknown {
      return view.#slot[field];
    }
  }
  for (const field of names) {
    Object.defineProperty(ResultView.prototype, field, {
      get(this: ResultView) {
        return ResultView.get(this, field);
      },
      enumerable: true,
      configurable: false,
    });
  }
  Object.defineProperty(ResultView, "name", { value: `${name}View` });
  return ResultView;
}

/** Zero-copy views of the results in the slots, and the finals of the last step. */
class SlotResults implements ChannelRecords {
  readonly count: number;
  readonly #region: Region;
  readonly #layout: ShmLayout;
  readonly #result: AnyStructCodec;
  readonly #slot: AnyStructCodec;
  readonly #final: AnyStructCodec;
  readonly #inPlace: number;
  /** Final-area offset of the whole packed result (derived layouts), or -1 (decode by names). */
  readonly #finalAt: number;
  readonly #names: readonly string[];
  readonly #views: unknown[];
  readonly #seqs: Int32Array;
  readonly #numEnvs: number;
  readonly #hasFinals: boolean;
  readonly #schema: SchemaModule;
  /** The column layout's result columns in declaration order (empty: a slot layout). */
  readonly #columns: readonly ShmColumn[];
  /** `decode`'s scratch record (the column layout gathers env i's fields into it). */
  readonly #row: Uint8Array;

  constructor(region: Region, schema: SchemaModule, numEnvs: number, seqs: Int32Array) {
    const layout = region.layout;
    this.#region = region;
    this.#layout = layout;
    const plan = resultLayout(schema); // every result field has its slot and final offsets
    this.#result = plan.codec;
    this.#inPlace = plan.inPlace;
    this.#slot = schema.structs[layout.ir.slot] as AnyStructCodec;
    this.#final = schema.structs[layout.ir.final] as AnyStructCodec;
    const fields = schema.ir.structs[this.#result.name]?.fields ?? [];
    this.#names = fields.map((f) => f.name);
    const shifts = new Set(fields.map((f) => (layout.ir.final_result_offsets[f.name] ?? -1) - f.offset));
    this.#finalAt = (plan.inPlace >= 0 || plan.columns) && shifts.size === 1 ? ([...shifts][0] as number) : -1;
    this.#schema = schema;
    this.#columns = plan.columns ? fields.map((f) => region.resultColumns[f.name] as ShmColumn) : [];
    this.#row = new Uint8Array(plan.columns ? this.#result.size : 0);
    this.#numEnvs = numEnvs;
    this.#seqs = seqs;
    this.count = region.numSlots;
    this.#hasFinals = region.hasFinals;
    this.#views = [];
    // a result whose fields are not one packed record in the slot: a view of the slot that
    // shows only the result's fields (as every other backend's view), not the slot's own
    const Projected = this.#inPlace < 0 && !plan.columns ? projection(this.#result.name, this.#names) : null;
    for (let i = 0; i < this.count; i++) {
      const base = layout.slotBase(i);
      if (plan.columns) this.#views.push(columnEnvView(schema, region.dv, region.resultColumns, this.#result.name, i));
      else if (Projected === null) this.#views.push(this.#result.view(region.bytes, base + this.#inPlace));
      else this.#views.push(new Projected(this.#slot.view(region.bytes, base) as Record<string, unknown>));
    }
  }

  view(index: number): unknown {
    return this.#views[index];
  }

  /**
   * The column layout: each result field of envs 0..count-1 as one zero-copy array over the
   * mapping (a typed array of count x field.count elements; bool and struct fields: their raw
   * bytes), valid until the next request writes the region; null for a slot layout.
   */
  columns(count = this.#numEnvs): Record<string, ArrayBufferView> | null {
    if (this.#columns.length === 0) return null;
    let arrays = this.#arrays.get(count);
    if (arrays === undefined) {
      arrays = Object.freeze(columnArrays(this.#schema, this.#region.bytes, this.#region.resultColumns, count));
      this.#arrays.set(count, arrays);
    }
    return arrays;
  }

  /** `columns(count)`'s arrays, made once per count (they view the mapping: always current). */
  readonly #arrays = new Map<number, Record<string, ArrayBufferView>>();

  decode(index: number): unknown {
    if (this.#columns.length > 0) {
      gatherRow(this.#region.bytes, this.#columns, index, this.#row, 0, this.#row.byteLength);
      return this.#result.decode(this.#row, 0, false);
    }
    const base = this.#layout.slotBase(index);
    if (this.#inPlace >= 0) return this.#result.decode(this.#region.bytes, base + this.#inPlace, false);
    return this.#pick(this.#slot.decode(this.#region.bytes, base, false));
  }

  finals(): Final<unknown>[] {
    if (!this.#hasFinals) return NO_FINALS;
    const region = this.#region;
    const layout = this.#layout;
    const at = layout.finalsOffset(region.numSlots);
    let out: Final<unknown>[] | null = null;
    for (let i = 0; i < this.#numEnvs; i++) {
      const final = at + i * layout.finalSize;
      if ((Atomics.load(region.words, (final + layout.finalSeqAt) >> 2) & SEQ_MASK) !== this.#seqs[i]) continue;
      const result =
        this.#finalAt >= 0
          ? this.#result.decode(region.bytes, final + this.#finalAt, false)
          : this.#pick(this.#final.decode(region.bytes, final, false));
      (out ??= []).push({ index: i, result });
    }
    return out ?? NO_FINALS;
  }

  infos(): Array<Record<string, unknown>> {
    const out: Array<Record<string, unknown>> = [];
    for (let i = 0; i < this.#numEnvs; i++) out.push(readInfo(this.#region, i));
    return out;
  }

  /** The result struct's fields of a decoded slot or final area. */
  #pick(decoded: unknown): unknown {
    const all = decoded as Record<string, unknown>;
    const out: Record<string, unknown> = {};
    for (const name of this.#names) out[name] = all[name];
    return out;
  }
}

const NO_FINALS: Final<unknown>[] = [];

/** Each region's side segment reader (info maps too large for a slot: frames), made on demand. */
const sideReaders = new WeakMap<Region, SideReader>();

/** Slot `index`'s msgpack info map ({} when absent or unreadable); one in the side segment
 * (info_len INFO_SIDE: a rendered frame) is read there (a ProtocolError when it cannot be). */
function readInfo(region: Region, index: number): Record<string, unknown> {
  const length = region.dv.getUint16(region.slotAt(index, "info_len"), true);
  let data: Uint8Array;
  if (length === INFO_SIDE) {
    let side = sideReaders.get(region);
    if (side === undefined) sideReaders.set(region, (side = new SideReader(region.shm.name)));
    const at = region.slotAt(index, "info");
    data = side.read(region.bytes.slice(at, at + SIDE_REF_SIZE));
  } else {
    if (length === 0 || length > region.layout.infoMax) return {};
    const at = region.slotAt(index, "info");
    data = region.bytes.subarray(at, at + length);
  }
  try {
    const decoded = msgpackDecode(data);
    return decoded !== null && typeof decoded === "object" && !Array.isArray(decoded) ? { ...(decoded as object) } : {};
  } catch {
    return {};
  }
}

/** The channel of this thread that holds each region's lease (by the segment's inode): a channel
 * whose lease the server took back must not release it once another channel of this process
 * took it again (the same pid in `client_pid`). */
const LEASES = new Map<number, WeakRef<ShmChannel>>();

/** Regions (by the segment's inode) whose SHUTDOWN from a channel of this thread went unanswered
 * (its close gave up: a stalled server): the next channel here waits until the server answered
 * it, else the server (same pid) would take it for the old session. */
const UNANSWERED = new Set<number>();

/** A Node client's attachment to one region: the lease, the sequences, the requests. */
export class ShmChannel implements Channel {
  info: Record<string, unknown> = {};
  #checksums: SlotChecksums | null = null;
  /** The env's [obs_n, act_n] from the server's info map (null: an older server's region). */
  #envSpaces: [number, number] | null = null;
  /** Response bodies the slots do not hold (HELLO, ERROR, spaces); grown for a discovery HELLO. */
  buffer: Buffer = Buffer.alloc(BODY_OFFSET + 4096);
  bodyLength = 0;
  readonly generation = 0;
  readonly records: SlotResults;
  readonly url: string;
  readonly shm: ShmUrl;
  readonly region: Region;
  readonly layout: ShmLayout;
  readonly numEnvs: number;
  readonly timeoutMs: number | null;
  readonly ownerPid: number;
  readonly ownerStart: bigint;

  readonly #schema: SchemaModule;
  readonly #ids: MessageIds;
  readonly #seqs: Int32Array;
  readonly #actions: Float64Array;
  readonly #stepAction: ReturnType<typeof stepAction>;
  /** Env 0's action in the region, and the bytes from one env's to the next (its slot's, or its
   * column's: the column layout). */
  readonly #actionAt: number;
  readonly #actionStride: number;
  readonly #multi: { readonly at: number; readonly type: ActionType; readonly seats: number };
  readonly #spaces: AnyStructCodec;
  readonly #reqOff: number;
  readonly #respOff: number;
  readonly #cmdOff: number;
  readonly #statusOff: number;
  #wait: WaitOptions;
  #doorbell: number;
  #leased = false;
  #closed = false;
  #busy = false;
  /** A request timed out: its late response is waited for before the next request (`#settle`). */
  #late = false;
  /** Asynchronous batches: 1 for each env sent (or async-reset) that no RECV returned yet. */
  readonly #inFlight: Uint8Array;
  /** How many envs are in flight (0: lock-step requests are allowed). */
  #flying = 0;
  /**
   * A reset was sent in this lease's session (its envs are fresh): before one, a SEND is the
   * runtime's NOT_RESET at once, as over the streams (`checkResetSent`).
   */
  #resetSent = false;
  /** checkSend's scratch (one byte per env). */
  readonly #seen: Uint8Array;
  /** Where the next RECV starts its scan (after the last env the previous one returned). */
  #scanFrom = 0;
  /** The env ids a RECV found answered, in the order found. */
  readonly #found: number[] = [];
  /** The result struct's fields: packed result <- slot (RECV results), <- final area (finals). */
  readonly #runs: readonly ResultRun[];
  readonly #resultSize: number;
  /** The packed result lies whole at this slot offset, or -1 (copied field by field). */
  readonly #inPlace: number;
  /** The column layout's result columns in declaration order (empty: a slot layout). */
  readonly #columns: readonly ShmColumn[];
  /** FUTEX_WAIT / FUTEX_WAITV calls a RECV made (how often this client slept waiting for envs). */
  sleeps = 0;
  /** Turns of RECV's sleeping loop: a look at the words before each sleep (a RECV that spins
   * instead of sleeping shows here). */
  looks = 0;
  /** RECV's `struct futex_waitv` array (FUTEX_WAITV_WORDS u32 per waited word). */
  readonly #waiters = new Uint32Array(FUTEX_WAITV_MAX * FUTEX_WAITV_WORDS);

  private constructor(url: string, shm: ShmUrl, region: Region, schema: SchemaModule, timeoutMs: number | null) {
    this.url = url;
    this.shm = shm;
    this.region = region;
    const layout = region.layout;
    this.layout = layout;
    this.#schema = schema;
    this.#ids = messageIds(schema);
    this.timeoutMs = timeoutMs;
    const dv = region.dv;
    this.numEnvs = dv.getUint32(off(CB, "num_envs"), true);
    this.ownerPid = dv.getUint32(off(CB, "owner_pid"), true);
    this.ownerStart = dv.getBigUint64(off(CB, "owner_start_time"), true);
    this.#seqs = new Int32Array(region.numSlots);
    this.#stepAction = stepAction(schema, true);
    if (!layout.columns && layout.ir.request_offsets[this.#stepAction.field.name] === undefined) {
      throw new ConnectError(`${url}: the shm layout has no offset for ${this.#stepAction.field.name}`);
    }
    ({ at: this.#actionAt, stride: this.#actionStride } = region.requestAt(0, this.#stepAction.field.name));
    const multi = bodyCodec(schema, "STEP_MULTI_REQ");
    const multiField = schema.ir.structs[multi.name]?.fields[0];
    if (multiField === undefined) throw new ConnectError(`${url}: STEP_MULTI_REQ's body has no field`);
    this.#multi = {
      at: multiField.offset,
      type: actionTypeOf(schema, multiField, "STEP_MULTI_REQ", multiField.count, true),
      seats: multiField.count,
    };
    this.#actions = new Float64Array(Math.max(region.numSlots, this.#multi.seats) * this.#stepAction.type.elements);
    this.#spaces = bodyCodec(schema, "SPACES_RESP");
    this.#reqOff = off(layout.slot, "sem_action_ready");
    this.#respOff = off(layout.slot, "sem_result_ready");
    this.#cmdOff = off(layout.slot, "command");
    this.#statusOff = off(layout.slot, "status");
    this.records = new SlotResults(region, schema, this.numEnvs, this.#seqs);
    this.#inFlight = new Uint8Array(this.numEnvs);
    this.#seen = new Uint8Array(this.numEnvs);
    const plan = resultLayout(schema);
    this.#resultSize = plan.codec.size;
    this.#inPlace = plan.inPlace;
    const fields = schema.ir.structs[plan.codec.name]?.fields ?? [];
    this.#runs = fields.map((f) => ({
      packed: f.offset,
      slot: layout.ir.result_offsets[f.name] ?? -1, // resultLayout checked that both exist (columns: no slot offset)
      final: layout.ir.final_result_offsets[f.name] as number,
      size: f.size,
    }));
    this.#columns = plan.columns ? fields.map((f) => region.resultColumns[f.name] as ShmColumn) : [];
    this.#doorbell = Atomics.load(region.words, off(CB, "doorbell") >> 2) & SEQ_MASK;
    const policy = shm.wait;
    this.#wait = { spin: policy.spin, sliceMs: policy.futexSliceMs, peerPid: this.ownerPid, peerStart: this.ownerStart };
  }

  /** The schema this channel was opened for (the region's, when it was discovered). */
  get schema(): SchemaModule {
    return this.#schema;
  }

  /** Open, validate and lease `url`'s region (retried while it is missing or not READY). */
  static async open(url: string, options: OpenOptions = {}): Promise<ShmChannel> {
    const shm = parseShmUrl(url);
    const timeoutMs = timeoutOption(options.timeoutMs);
    // no schema: the one the region carries in its schema area (discovery)
    const schema = options.schema ?? (await readRegionSchema(url, shm, timeoutMs ?? 10_000));
    const layout = ShmLayout.of(schema);
    const region = await attach(shm, layout, timeoutMs ?? 10_000);
    let channel: ShmChannel | null = null;
    try {
      validate(shm, region, schema);
      channel = new ShmChannel(url, shm, region, schema, timeoutMs);
      await channel.#takeLease(timeoutMs ?? 10_000);
      for (let i = 0; i < region.numSlots; i++) {
        channel.#seqs[i] = Atomics.load(region.words, region.slotAt(i, "sem_action_ready") >> 2) & SEQ_MASK;
      }
      await channel.#awaitLastHolder(timeoutMs ?? 10_000);
      channel.info = { ...readInfo(region, 0), num_envs: channel.numEnvs };
      // the env's spaces, which the control block cannot say (its act_size is the mask's length)
      const spaces = channel.info["spaces"];
      delete channel.info["spaces"];
      // a server whose envs run in a pool advises sleeping while they step (a spinning client
      // takes a core from its workers); a URL that names wait= or spin= keeps its policy
      const hint = channel.info["client_wait"];
      delete channel.info["client_wait"];
      if (hint === "futex" && !namesWaitPolicy(url)) channel.#wait = { ...channel.#wait, spin: 0 };
      if (Array.isArray(spaces) && spaces.length === 2 && spaces.every((v) => typeof v === "number")) {
        channel.#envSpaces = [spaces[0] as number, spaces[1] as number];
      }
      if (channel.info["checksum"] === "crc32") channel.#checksums = new SlotChecksums(region);
      else if (shm.checksum !== null) {
        throw new ConnectError(
          `shm://${shm.name}: the client asks for ?checksum=${shm.checksum} but the server does not ` +
            `write checksums: start it with shm://${shm.name}?checksum=${shm.checksum}`,
        );
      }
      return channel;
    } catch (error) {
      if (channel !== null) channel.#release();
      else region.unmap();
      throw error;
    }
  }

  async #takeLease(timeoutMs: number): Promise<void> {
    const region = this.region;
    const word = region.cbWord("client_pid");
    const me = process.pid;
    const startAt = off(CB, "client_start_time");
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (Atomics.compareExchange(region.words, word, 0, me) === 0) {
        const start = procStartTime(me);
        region.dv.setBigUint64(startAt, start, true);
        const holder = Atomics.load(region.words, word) >>> 0;
        if (holder === me) {
          this.#leased = true;
          LEASES.set(region.inode, new WeakRef(this));
          return;
        }
        // the server reclaimed the lease between the two stores (this process stalled for over
        // a second: "never completed"): not ours; give a new holder its own start time back and
        // take the lease again
        if (holder !== 0 && region.dv.getBigUint64(startAt, true) === start) {
          region.dv.setBigUint64(startAt, procStartTime(holder), true);
        }
        continue;
      }
      const holder = Atomics.load(region.words, word) >>> 0;
      const holderStart = region.dv.getBigUint64(off(CB, "client_start_time"), true);
      if (holder && peerAlive(holder, holderStart)) {
        const who = holder === me ? "this process" : `client pid ${holder}`;
        throw new RegionInUseError(`shm://${this.shm.name} is in use by ${who}: a region serves one client at a time`, holder);
      }
      if (Date.now() >= deadline) {
        let busy = ""; // a slot's request not answered yet: the server is in a step
        for (let i = 0; i < region.numSlots && busy === ""; i++) {
          const asked = Atomics.load(region.words, region.slotAt(i, "sem_action_ready") >> 2) & SEQ_MASK;
          const answered = Atomics.load(region.words, region.slotAt(i, "sem_result_ready") >> 2) & SEQ_MASK;
          if (asked !== answered) busy = " (the server is busy with a request of that client: it reclaims leases between requests)";
        }
        throw new ConnectError(`shm://${this.shm.name}: the lease of dead client pid ${holder} was not reclaimed by the server in time${busy}`);
      }
      await sleep(10);
    }
  }

  /** Answer a protocol request through the slots (see the top of this file). */
  async request(msgType: number, body: Uint8Array): Promise<number> {
    if (this.#closed) throw new TransportError("the client is closed");
    if (this.#busy) throw requestInFlight();
    this.#busy = true;
    try {
      if (this.#late) await this.#settle();
      const type = await this.#request(msgType, body);
      // close() came while this request waited: its results are in a region about to be unmapped
      if (this.#closed) throw new TransportError(`shm://${this.shm.name}: the client was closed during this request`);
      return type;
    } finally {
      this.#busy = false;
      if (this.#closed) this.#release(); // close() left the unmapping to this request's end
    }
  }

  async #request(msgType: number, body: Uint8Array): Promise<number> {
    const ids = this.#ids;
    const n = this.numEnvs;
    if (this.#flying !== 0 && this.#refusedInFlight(msgType)) return this.#ids.ERROR;
    switch (msgType) {
      case ids.HELLO_REQ:
        return this.#hello(body);
      case ids.RESET_REQ:
      case ids.RESET_SEED_REQ: {
        this.#resetSent = true;
        this.#writeSeeds(msgType === ids.RESET_REQ ? null : Buffer.from(body.buffer, body.byteOffset, body.byteLength).readBigUInt64LE(0));
        return (await this.#roundTrip(SlotCommand.RESET, n)) ?? ids.RESET_RESP;
      }
      case ids.RESET_SEEDS_REQ: {
        // one 16-byte EnvSeed per env (client.ts seedsBody): u64 seed at 0, has_seed at 8
        const entries = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
        const size = entries.byteLength / n;
        this.#resetSent = true;
        const region = this.region;
        for (let i = 0; i < n; i++) {
          const has = entries[i * size + 8] === 1;
          region.bytes[region.slotAt(i, "has_seed")] = has ? 1 : 0;
          if (has) region.dv.setBigUint64(region.slotAt(i, "seed"), entries.readBigUInt64LE(i * size), true);
        }
        return (await this.#roundTrip(SlotCommand.RESET, n)) ?? ids.RESET_RESP;
      }
      case ids.STEP_REQ:
      case ids.STEP_BATCH_REQ: {
        const count = msgType === ids.STEP_REQ ? 1 : Math.floor(body.byteLength / this.#stepAction.size);
        const { field, type, size } = this.#stepAction;
        readActions(this.#actions, body, field.offset, size, Math.min(count, n), type);
        this.#writeActions(n, type);
        return (await this.#roundTrip(SlotCommand.STEP, n)) ?? (msgType === ids.STEP_REQ ? ids.STEP_RESP : ids.STEP_BATCH_RESP);
      }
      case ids.STEP_MULTI_REQ: {
        const { at, type, seats } = this.#multi;
        if (this.region.numSlots < seats) {
          return this.#error(ErrorCode.BAD_BATCH, `STEP_MULTI needs ${seats} slots; this region has ${this.region.numSlots}`);
        }
        readActions(this.#actions, body, at, type.size, seats, type);
        this.#writeActions(seats, this.#stepAction.type);
        return (await this.#roundTrip(SlotCommand.STEP_MULTI, seats)) ?? ids.STEP_MULTI_RESP;
      }
      case this.#schema.messages["OBSERVE_REQ"]?.id:
        return (await this.#roundTrip(SlotCommand.OBSERVE, n)) ?? (this.#schema.messages["OBSERVE_RESP"]?.id as number);
      case ids.HEALTH_REQ:
        this.buffer[BODY_OFFSET] = this.#alive() ? 1 : 0;
        this.bodyLength = 1;
        return ids.HEALTH_RESP;
      case ids.SEND_REQ:
        return this.#send(body);
      case ids.RECV_REQ:
        return this.#recv(body);
      case ids.ASYNC_RESET_REQ:
        return this.#asyncReset(body);
      case ids.SPACES_REQ: {
        const dv = this.region.dv;
        const names = (this.#schema.ir.structs[this.#spaces.name]?.fields ?? []).map((f) => f.name);
        const [obsN, actN] = this.#envSpaces ?? [dv.getUint32(off(CB, "obs_size"), true), dv.getUint32(off(CB, "act_size"), true)];
        const values = { [names[0] ?? "obs_n"]: obsN, [names[1] ?? "act_n"]: actN };
        this.#spaces.encodeInto(values, this.buffer, BODY_OFFSET);
        this.bodyLength = this.#spaces.size;
        return ids.SPACES_RESP;
      }
      default:
        return this.#error(ErrorCode.UNKNOWN_MESSAGE, `shm:// cannot carry msg_type 0x${msgType.toString(16).padStart(2, "0")}`);
    }
  }

  /** RESET seeds in every env's slot: env i gets `seed + i` (null: unseeded). */
  #writeSeeds(seed: bigint | null): void {
    const region = this.region;
    for (let i = 0; i < this.numEnvs; i++) {
      region.bytes[region.slotAt(i, "has_seed")] = seed === null ? 0 : 1;
      if (seed !== null) region.dv.setBigUint64(region.slotAt(i, "seed"), BigInt.asUintN(64, seed + BigInt(i)), true);
    }
  }

  // -- asynchronous batches (docs/shm.md "Asynchronous batches"; the rules: runtime/async_batches.ts)

  /**
   * While envs are in flight only SEND, RECV, ASYNC_RESET (which check on their own), HEALTH and
   * SPACES go on; any other request is refused with checkIdle's ASYNC_STATE (an ERROR body in
   * `buffer`: true), without touching a slot.
   */
  #refusedInFlight(msgType: number): boolean {
    const ids = this.#ids;
    if (
      msgType === ids.SEND_REQ ||
      msgType === ids.RECV_REQ ||
      msgType === ids.ASYNC_RESET_REQ ||
      msgType === ids.HEALTH_REQ ||
      msgType === ids.SPACES_REQ
    ) {
      return false;
    }
    return this.#refused(() => checkIdle(this.#flying, msgType));
  }

  /** Run a runtime rule: true (an ERROR body in `buffer`) when it refuses with a RequestError. */
  #refused(rule: () => void): boolean {
    try {
      rule();
      return false;
    } catch (error) {
      if (!(error instanceof RequestError)) throw error;
      this.#error(error.code, error.text);
      return true;
    }
  }

  /**
   * SEND_REQ (K step requests, then a msgpack array of their K env ids): each action into its
   * env's slot, STEP, the slot's request word, one doorbell ring; no wait (the envs are in flight).
   */
  #send(body: Uint8Array): number {
    const n = this.numEnvs;
    const { field, type, size } = this.#stepAction;
    let sent: number[] = [];
    const check = (): void => {
      sent = sendEnvIds(body, size, n);
      checkSend(sent, n, this.#inFlight, this.#seen);
      checkResetSent(sent, this.#resetSent);
    };
    if (this.#refused(check)) return this.#ids.ERROR;
    const k = sent.length;
    const actions = this.#actions;
    readActions(actions, body, field.offset, size, k, type);
    const region = this.region;
    const words = region.words;
    const layout = this.layout;
    const elements = type.elements;
    for (let j = 0; j < k; j++) {
      const i = sent[j] as number;
      const at = this.#actionAt + i * this.#actionStride;
      if (elements === 1 && !type.float) writeAction(region.bytes, at, actions[j] as number, type);
      else writeArrayAction(region.bytes, at, actions.subarray(j * elements, (j + 1) * elements), type, region.dv);
      words[(layout.slotBase(i) + this.#cmdOff) >> 2] = SlotCommand.STEP;
    }
    const seqs = this.#seqs;
    for (let j = 0; j < k; j++) {
      const i = sent[j] as number;
      const seq = ((seqs[i] as number) + 1) & SEQ_MASK;
      seqs[i] = seq;
      Atomics.store(words, (layout.slotBase(i) + this.#reqOff) >> 2, seq); // publishes the slot's request
      this.#inFlight[i] = 1;
    }
    this.#flying += k;
    this.#doorbell = (this.#doorbell + 1) & SEQ_MASK;
    publishWord(region, off(CB, "doorbell"), this.#doorbell);
    this.bodyLength = 0;
    return this.#ids.SEND_RESP;
  }

  /**
   * ASYNC_RESET_REQ (EnvSeed: u64 seed, u8 has_seed): refused while envs are in flight; else a
   * RESET round trip of every env (env i: seed + i) whose results RECV then hands out.
   */
  async #asyncReset(body: Uint8Array): Promise<number> {
    const n = this.numEnvs;
    if (this.#refused(() => checkIdle(this.#flying, "ASYNC_RESET_REQ"))) return this.#ids.ERROR;
    if (body.byteLength !== 16) return this.#error(ErrorCode.BAD_BODY_SIZE, `ASYNC_RESET_REQ body is ${body.byteLength} bytes, expected 16`);
    const entry = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
    this.#resetSent = true;
    this.#writeSeeds(entry[8] === 1 ? entry.readBigUInt64LE(0) : null);
    let type: number | null;
    try {
      type = await this.#roundTrip(SlotCommand.RESET, n, this.timeoutMs, false);
    } catch (error) {
      if (!(error instanceof TransportTimeoutError)) throw error;
      // the resets were sent: a later RECV waits for (and returns) them, as after a SEND
      this.#inFlight.fill(1);
      this.#flying = n;
      throw new TransportTimeoutError(`${error.message} (ASYNC_RESET: the ${n} envs are in flight; RECV returns them)`);
    }
    if (type !== null) return type; // refused: nothing in flight
    this.#inFlight.fill(1);
    this.#flying = n;
    this.bodyLength = 0;
    return this.#ids.SEND_RESP;
  }

  /**
   * RECV_REQ (u32 batch size B): wait for any `min(B, in flight)` in-flight envs to be answered,
   * then the stream RECV_RESP body: their results in the order found (scanning from where the
   * last RECV stopped), then msgpack [env ids, ended env ids, their final results' bytes]. A slot
   * answered with a status leaves flight and is this RECV's ERROR (the others stay in flight).
   * A timeout leaves every env in flight (a later RECV returns them).
   */
  async #recv(body: Uint8Array): Promise<number> {
    if (body.byteLength !== 4) return this.#error(ErrorCode.BAD_BODY_SIZE, `RECV_REQ body is ${body.byteLength} bytes, expected 4`);
    const batchSize = Buffer.from(body.buffer, body.byteOffset, 4).readUInt32LE(0);
    let want = 0;
    if (this.#refused(() => (want = checkRecv(this.#flying, batchSize)))) return this.#ids.ERROR;
    const rc = await this.#waitAny(want);
    if (rc < 0) {
      const url = `shm://${this.shm.name}`;
      if (rc === WAIT_TIMEOUT) {
        throw new TransportTimeoutError(
          `${url}: RECV got ${this.#answered(want)} of ${want} results within ${this.timeoutMs} ms ` +
            `(the ${this.#flying} env(s) stay in flight: a later RECV returns them)`,
        );
      }
      if (rc === WAIT_PEER_DEAD) throw new PeerGoneError(`${url}: the server (pid ${this.ownerPid}) died`);
      if (rc === WAIT_CLOSED) throw new PeerGoneError(`${url}: the server closed the region`);
      throw new TransportError(`${url}: wait failed (${rc})`);
    }
    return this.#gather(want);
  }

  /**
   * How many in-flight envs are answered (scanning stops at `want`); `want` when one of them was
   * answered with a status (the RECV returns that error at once).
   */
  #answered(want: number): number {
    const words = this.region.words;
    const dv = this.region.dv;
    const layout = this.layout;
    const inFlight = this.#inFlight;
    const seqs = this.#seqs;
    let count = 0;
    for (let i = 0; i < this.numEnvs; i++) {
      if (!inFlight[i]) continue;
      const base = layout.slotBase(i);
      if ((Atomics.load(words, (base + this.#respOff) >> 2) & SEQ_MASK) !== seqs[i]) continue;
      if (dv.getUint16(base + this.#statusOff, true) !== 0) return want;
      if (++count >= want) return count;
    }
    return count;
  }

  /**
   * Wait until `#answered(want) >= want`: spin (an eighth of the wait policy's budget), then sleep on every
   * unanswered in-flight response word at once (FUTEX_WAITV, SLEEP set on each first, as the
   * one-word wait does), checking the region's state, the deadline and the server's liveness
   * between slices. 0, or WAIT_TIMEOUT / WAIT_CLOSED / WAIT_PEER_DEAD.
   */
  async #waitAny(want: number): Promise<number> {
    if (this.#answered(want) >= want) return 0;
    const nat = native();
    const wait = this.#wait;
    const start = performance.now();
    const deadline = this.timeoutMs === null ? Number.POSITIVE_INFINITY : start + this.timeoutMs;
    if (wait.spin > 0) {
      // an eighth of a round trip's budget, as the Python client's tp_client_wait_any: results
      // that come "whenever an env is done" rarely come within a spin, and a spinning client
      // takes a core from the envs (each scan of the in-flight words costs its share of time)
      const spinUntil = start + (wait.spin * SPIN_NS) / WAIT_ANY_SPIN_SHARE / 1e6;
      for (let spins = 1; ; spins++) {
        if (this.#answered(want) >= want) return 0;
        if ((spins & 255) === 0) {
          nat.schedYield(); // a server sharing this core runs now
          const now = performance.now();
          if (now >= spinUntil || now >= deadline) break;
        }
      }
    }
    const words = this.region.words;
    let hinted = false;
    try {
      return await this.#sleepAny(want, deadline, (h) => (hinted = h));
    } finally {
      // the hint is this wait's only (no other wait of this client meets a server that holds
      // back its wake-ups): cleared, seq_cst, before any later look at a response word
      const at = this.region.recvHintAt;
      if (hinted && at !== null && this.region.mapped) Atomics.store(words, at >> 2, 0);
    }
  }

  /** #waitAny's sleeping loop (after the spin): `setHinted(true)` once it wrote a hint. */
  async #sleepAny(want: number, deadline: number, setHinted: (hinted: boolean) => void): Promise<number> {
    const nat = native();
    const wait = this.#wait;
    const words = this.region.words;
    const stateIndex = this.region.cbWord("state");
    const waitv = nat.futexWaitvAsync;
    const timespec = { tv_sec: 0, tv_nsec: 0 };
    let checked = false;
    let hinted = false;
    for (;;) {
      if (this.#answered(want) >= want) return 0;
      if (Atomics.load(words, stateIndex) !== RegionState.READY) return WAIT_CLOSED;
      const now = performance.now();
      if (now >= deadline) return WAIT_TIMEOUT;
      if (checked && !peerAlive(this.ownerPid, this.ownerStart)) return WAIT_PEER_DEAD;
      checked = true;
      if (!hinted) {
        hinted = this.#writeRecvHint(waitv !== null ? want : 0);
        setHinted(hinted);
      }
      this.looks++;
      const sleeping = this.#armWaiters(want);
      if (sleeping < 0) continue; // enough answered (or an error) while SLEEP was being set: look again
      let ms = Math.max(0, Math.min(Math.max(1, wait.sliceMs), deadline - now));
      if (waitv !== null) {
        // more unanswered words than one futex_waitv takes: the others are seen within 1 ms
        if (sleeping > FUTEX_WAITV_MAX) ms = Math.min(ms, 1);
        const until = process.hrtime.bigint() + BigInt(Math.ceil(ms * 1e6)); // CLOCK_MONOTONIC
        timespec.tv_sec = Number(until / 1_000_000_000n);
        timespec.tv_nsec = Number(until % 1_000_000_000n);
        this.sleeps++;
        await waitv(this.#waiters, Math.min(sleeping, FUTEX_WAITV_MAX), timespec);
      } else {
        // no futex_waitv (Linux < 5.16, or a seccomp filter): the first word, in short slices
        ms = Math.min(ms, ONE_WORD_SLICE_MS);
        const ns = Math.ceil(ms * 1e6);
        timespec.tv_sec = Math.floor(ns / 1e9);
        timespec.tv_nsec = ns % 1e9;
        const w = this.#waiters;
        const address = (w[2] as number) + (w[3] as number) * 0x1_0000_0000;
        this.sleeps++;
        await nat.futexWaitAsync(address, w[0] as number, timespec);
      }
      // close() came while this RECV slept: end it now (the region is unmapped when it returns)
      if (this.#closed) throw new TransportError(`shm://${this.shm.name}: the client was closed while a RECV waited`);
    }
  }

  /**
   * The RECV wake hint (docs/shm.md "One wake per RECV"; tp_client_wait_any): before this
   * RECV's first sleep, `in flight - want + 1` ("wake me once fewer than that many of my envs
   * are unanswered"), or 0 (`want` 0: wake me on every publish) when the sleep cannot watch
   * every unanswered word (more than one futex_waitv takes, or no futex_waitv). Atomics.store
   * is seq_cst: a server that publishes after it and then loads the hint sees it, and one that
   * published before it is seen by the SLEEP CAS or by futex_waitv's value check.
   */
  #writeRecvHint(want: number): boolean {
    const at = this.region.recvHintAt;
    if (at === null) return false;
    const flying = this.#flying;
    const hint = want > 0 && want <= flying && flying <= FUTEX_WAITV_MAX ? flying - want + 1 : 0;
    if (hint === 0) return false;
    Atomics.store(this.region.words, at >> 2, hint);
    return true;
  }

  /**
   * Set SLEEP (CAS, no lost wake-up: the server's publish is an exchange of the same word) on
   * every unanswered in-flight response word and list the first FUTEX_WAITV_MAX of them in
   * `#waiters`, scanning from `#scanFrom`. Their count, or -1 when `want` are answered by now
   * or an answered one carries an error (the RECV looks again and ends).
   */
  #armWaiters(want: number): number {
    const region = this.region;
    const words = region.words;
    const dv = region.dv;
    const layout = this.layout;
    const inFlight = this.#inFlight;
    const seqs = this.#seqs;
    const waiters = this.#waiters;
    const n = this.numEnvs;
    let count = 0;
    let answered = 0;
    for (let s = 0, i = this.#scanFrom; s < n; s++, i = i + 1 === n ? 0 : i + 1) {
      if (!inFlight[i]) continue;
      const at = layout.slotBase(i) + this.#respOff;
      const target = seqs[i] as number;
      let v = Atomics.load(words, at >> 2);
      let done = false;
      for (;;) {
        if ((v & SEQ_MASK) === target) {
          // answered: not waited on. Enough of them now, or an error (the RECV ends on it):
          // look again. (Returning at any answered word, as before, made a RECV that still
          // needed more envs spin here until they came: no sleep once one env was answered.)
          if (++answered >= want || dv.getUint16(layout.slotBase(i) + this.#statusOff, true) !== 0) return -1;
          done = true;
          break;
        }
        if (v & SLEEP_BIT) break;
        const old = Atomics.compareExchange(words, at >> 2, v, v | SLEEP_BIT);
        if (old === v) {
          v |= SLEEP_BIT;
          break;
        }
        v = old;
      }
      if (done) continue;
      if (count < FUTEX_WAITV_MAX) {
        const address = region.addressOf(at);
        const e = count * FUTEX_WAITV_WORDS;
        waiters[e] = v >>> 0; // val (u64)
        waiters[e + 1] = 0;
        waiters[e + 2] = address % 0x1_0000_0000; // uaddr (u64)
        waiters[e + 3] = Math.floor(address / 0x1_0000_0000);
        waiters[e + 4] = FUTEX2_SIZE_U32; // flags: a shared 32-bit futex
        waiters[e + 5] = 0;
      }
      count++;
    }
    return count;
  }

  /**
   * The RECV_RESP body of `want` answered in-flight envs (found from `#scanFrom` on; an answered
   * error instead leaves flight and becomes the ERROR body), which leave flight.
   */
  #gather(want: number): number {
    const region = this.region;
    const words = region.words;
    const dv = region.dv;
    const layout = this.layout;
    const inFlight = this.#inFlight;
    const seqs = this.#seqs;
    const n = this.numEnvs;
    const found = this.#found;
    found.length = 0;
    for (let s = 0, i = this.#scanFrom; s < n && found.length < want; s++, i = i + 1 === n ? 0 : i + 1) {
      if (!inFlight[i]) continue;
      const base = layout.slotBase(i);
      if ((Atomics.load(words, (base + this.#respOff) >> 2) & SEQ_MASK) !== seqs[i]) continue;
      const status = dv.getUint16(base + this.#statusOff, true);
      if (status !== 0) {
        // this env's step failed: it leaves flight; the answered ones found before it stay
        inFlight[i] = 0;
        this.#flying--;
        const length = Math.min(dv.getUint16(region.slotAt(i, "error_len"), true), layout.errorTextMax);
        const at = region.slotAt(i, "error_text");
        return this.#error(status, Buffer.from(region.bytes.subarray(at, at + length)).toString("utf8"));
      }
      found.push(i);
    }
    for (const i of found) inFlight[i] = 0;
    this.#flying -= found.length;
    this.#scanFrom = found.length ? ((found[found.length - 1] as number) + 1) % n : this.#scanFrom;
    if (this.#checksums !== null) {
      for (const i of found) {
        if (this.#checksums.ok(i)) continue;
        throw new ProtocolError(
          `shm://${this.shm.name}: slot ${i}'s result does not match the checksum its server wrote: ` +
            "another process wrote into the region after the server published it (or a forged " +
            "response); do not trust this result",
        );
      }
    }
    const size = this.#resultSize;
    const ended: number[] = [];
    if (region.hasFinals) {
      for (const i of found) {
        if ((Atomics.load(words, (region.finalAt(i) + layout.finalSeqAt) >> 2) & SEQ_MASK) === seqs[i]) ended.push(i);
      }
    }
    const finals = new Uint8Array(ended.length * size);
    ended.forEach((i, k) => this.#copyResult(finals, k * size, region.finalAt(i), true));
    const tail = msgpackEncode([found, ended, finals]);
    const total = found.length * size + tail.byteLength;
    if (BODY_OFFSET + total > this.buffer.byteLength) this.buffer = Buffer.alloc(BODY_OFFSET + total);
    const out = this.buffer;
    found.forEach((i, k) => {
      if (this.#columns.length > 0) gatherRow(region.bytes, this.#columns, i, out, BODY_OFFSET + k * size, size);
      else this.#copyResult(out, BODY_OFFSET + k * size, layout.slotBase(i), false);
    });
    out.set(tail, BODY_OFFSET + found.length * size);
    this.bodyLength = total;
    return this.#ids.RECV_RESP;
  }

  /** The packed result at `out[at]` from a slot (at byte `base`) or a final area (`final`). */
  #copyResult(out: Uint8Array, at: number, base: number, final: boolean): void {
    const bytes = this.region.bytes;
    const size = this.#resultSize;
    if (!final && this.#inPlace >= 0) {
      out.set(bytes.subarray(base + this.#inPlace, base + this.#inPlace + size), at);
      return;
    }
    out.fill(0, at, at + size); // canonical: zeroed padding between the fields
    for (const run of this.#runs) {
      const from = base + (final ? run.final : run.slot);
      out.set(bytes.subarray(from, from + run.size), at + run.packed);
    }
  }

  /** `#actions[0..count)` into the request field of slots 0..count-1 (an array action: its
   * `elements` values each, from `#actions[i * elements]`). */
  #writeActions(count: number, type: ActionType): void {
    const bytes = this.region.bytes;
    const at = this.#actionAt;
    const stride = this.#actionStride;
    if (type.elements === 1 && !type.float) {
      for (let i = 0; i < count; i++) writeAction(bytes, at + i * stride, this.#actions[i] as number, type);
      return;
    }
    const k = type.elements;
    for (let i = 0; i < count; i++) {
      writeArrayAction(bytes, at + i * stride, this.#actions.subarray(i * k, (i + 1) * k), type, this.region.dv);
    }
  }

  /** HELLO: the mode in every slot's action word (docs/shm.md "Auto-reset"); no round trip for disabled. */
  async #hello(body: Uint8Array): Promise<number> {
    let mode: AutoReset;
    let hello: Hello;
    try {
      // answered as the region's server would (it speaks this side's protocol version); the
      // region was validated against this schema at attach
      ({ hello, mode } = acceptHello(body, this.#schema));
    } catch (error) {
      if (error instanceof RequestError) return this.#error(error.code, error.text);
      throw error;
    }
    const url = `shm://${this.shm.name}`;
    if (mode !== AutoReset.DISABLED) {
      if (carriesFinals(mode) && !this.region.hasFinals) {
        throw new ConnectError(`${url}: the region has no final-result areas (a server without auto-reset support): ${autoresetName(mode)} needs them`);
      }
      this.#actions.fill(mode, 0, this.numEnvs * this.#stepAction.type.elements); // every element, as Python
      this.#writeActions(this.numEnvs, this.#stepAction.type);
      const type = await this.#roundTrip(SlotCommand.HELLO, this.numEnvs);
      if (type !== null) {
        const text = Buffer.from(this.buffer.subarray(BODY_OFFSET + 4, BODY_OFFSET + this.bodyLength)).toString("utf8");
        throw new ConnectError(`${url}: the server refused auto-reset mode ${autoresetName(mode)}: ${text}`);
      }
    }
    const info = { ...this.info };
    delete info["autoreset"];
    const out = encodeHello(this.#schema.fingerprint, helloResponseInfo(this.#schema, hello, info), mode);
    if (BODY_OFFSET + out.byteLength > this.buffer.byteLength) this.buffer = Buffer.alloc(BODY_OFFSET + out.byteLength);
    this.buffer.set(out, BODY_OFFSET);
    this.bodyLength = out.byteLength;
    return this.#ids.HELLO_RESP;
  }

  /** The server is alive and the region READY (no round trip). */
  #alive(): boolean {
    return Atomics.load(this.region.words, this.region.cbWord("state")) === RegionState.READY && peerAlive(this.ownerPid, this.ownerStart);
  }

  /**
   * The previous lease holder's last request, if the server has not answered it yet (its close
   * gave up on SHUTDOWN after 1 s: a stalled server), is answered before this client writes a
   * slot. Else this client's first request overwrote that command and, the same process having
   * the same pid, the server took it for the old holder's: this client went on in the old
   * session (its envs, its auto-reset mode). Nothing to wait for on an ordinary attach.
   */
  async #awaitLastHolder(timeoutMs: number): Promise<void> {
    const region = this.region;
    // only after such a close here: slots another process left unanswered (a client killed with
    // an env in flight) belong to a session the server ends by the new pid
    if (!UNANSWERED.has(region.inode)) return;
    const seqs = this.#seqs;
    const deadline = Date.now() + timeoutMs;
    const url = `shm://${this.shm.name}`;
    for (let i = 0; i < seqs.length; i++) {
      const at = this.layout.slotBase(i) + this.#respOff;
      if ((Atomics.load(region.words, at >> 2) & SEQ_MASK) === seqs[i]) continue;
      const rc = await waitWordAsync(region, at, seqs[i] as number, Math.max(0, deadline - Date.now()) * 1e6, this.#wait);
      if (rc >= 0) continue;
      if (rc === WAIT_TIMEOUT) {
        throw new ConnectError(`${url}: the server did not answer the previous client's last request within ${timeoutMs} ms`);
      }
      if (rc === WAIT_PEER_DEAD) throw new PeerGoneError(`${url}: the server (pid ${this.ownerPid}) died`);
      if (rc === WAIT_CLOSED) throw new PeerGoneError(`${url}: the server closed the region`);
      throw new TransportError(`${url}: wait failed (${rc})`);
    }
    UNANSWERED.delete(region.inode);
  }

  /**
   * After a timeout: wait, up to the timeout, until the server answered the request that timed
   * out, so the next request is not written into slots the server may still be reading. The late
   * response (results or error) is dropped; the server still did what it asked. Python:
   * `ShmChannel.settle`.
   */
  async #settle(): Promise<void> {
    const region = this.region;
    const layout = this.layout;
    const seqs = this.#seqs;
    const deadline = this.timeoutMs === null ? null : Date.now() + this.timeoutMs; // one for all slots
    for (let i = 0; i < seqs.length; i++) {
      // an env in flight is not late: its result is awaited (and returned) by a RECV
      if (i < this.numEnvs && this.#inFlight[i]) continue;
      const timeoutNs = deadline === null ? Number.MAX_SAFE_INTEGER : Math.max(0, deadline - Date.now()) * 1e6;
      const rc = await waitWordAsync(region, layout.slotBase(i) + this.#respOff, seqs[i] as number, timeoutNs, this.#wait);
      if (rc >= 0) continue;
      const url = `shm://${this.shm.name}`;
      if (rc === WAIT_TIMEOUT) {
        throw new TransportTimeoutError(`${url}: the late response to an earlier request did not come within ${this.timeoutMs} ms`);
      }
      if (rc === WAIT_PEER_DEAD) throw new PeerGoneError(`${url}: the server (pid ${this.ownerPid}) died`);
      if (rc === WAIT_CLOSED) throw new PeerGoneError(`${url}: the server closed the region`);
      throw new TransportError(`${url}: wait failed (${rc})`);
    }
    this.#late = false;
  }

  /**
   * One request on slots 0..count-1: command, request words, the doorbell, then each slot's
   * response. null when every slot answered status 0; else the ERROR msg_type (body in `buffer`).
   */
  async #roundTrip(command: number, count: number, timeoutMs = this.timeoutMs, lateOnTimeout = true): Promise<number | null> {
    const region = this.region;
    const words = region.words;
    const layout = this.layout;
    for (let i = 0; i < count; i++) words[(layout.slotBase(i) + this.#cmdOff) >> 2] = command;
    const seqs = this.#seqs;
    for (let i = 0; i < count; i++) {
      const seq = ((seqs[i] as number) + 1) & SEQ_MASK;
      seqs[i] = seq;
      Atomics.store(words, (layout.slotBase(i) + this.#reqOff) >> 2, seq);
    }
    this.#doorbell = (this.#doorbell + 1) & SEQ_MASK;
    publishWord(region, off(CB, "doorbell"), this.#doorbell);
    const timeoutNs = timeoutMs === null ? Number.MAX_SAFE_INTEGER : timeoutMs * 1e6;
    const wait = this.#wait;
    // the last slot first, then the others in order (normally answered by then): servers
    // publish in slot order, so the client waits on one line instead of reading each slot's
    // just as the server's next publish needs it back
    for (let j = 0; j < count; j++) {
      const i = j === 0 ? count - 1 : j - 1;
      const rc = await waitWordAsync(region, layout.slotBase(i) + this.#respOff, seqs[i] as number, timeoutNs, wait);
      if (rc >= 0) continue;
      const url = `shm://${this.shm.name}`;
      if (rc === WAIT_TIMEOUT) {
        if (lateOnTimeout) this.#late = true;
        throw new TransportTimeoutError(`${url}: no response within ${timeoutMs} ms`);
      }
      if (rc === WAIT_PEER_DEAD) throw new PeerGoneError(`${url}: the server (pid ${this.ownerPid}) died`);
      if (rc === WAIT_CLOSED) throw new PeerGoneError(`${url}: the server closed the region`);
      throw new TransportError(`${url}: wait failed (${rc})`);
    }
    const bad = this.#checksums === null ? -1 : this.#checksums.firstBad(count);
    if (bad >= 0) {
      throw new ProtocolError(
        `shm://${this.shm.name}: slot ${bad}'s result does not match the checksum its server wrote: ` +
          "another process wrote into the region after the server published it (or a forged " +
          "response); do not trust this result",
      );
    }
    const dv = region.dv;
    for (let i = 0; i < count; i++) {
      const status = dv.getUint16(layout.slotBase(i) + this.#statusOff, true);
      if (status === 0) continue;
      const length = Math.min(dv.getUint16(region.slotAt(i, "error_len"), true), layout.errorTextMax);
      const at = region.slotAt(i, "error_text");
      return this.#error(status, Buffer.from(region.bytes.subarray(at, at + length)).toString("utf8"));
    }
    this.bodyLength = 0;
    return null;
  }

  /** An ERROR body in `buffer` (the Client maps it to a typed error, as for every backend). */
  #error(code: number, text: string): number {
    const body = encodeError(code, text);
    const length = Math.min(body.byteLength, this.buffer.byteLength - BODY_OFFSET);
    this.buffer.set(body.subarray(0, length), BODY_OFFSET);
    this.bodyLength = length;
    return this.#ids.ERROR;
  }

  /**
   * SHUTDOWN (the server drops this lease's envs; at most 1 s), release the lease, unmap. During
   * a request the release is that request's, when it ends (a RECV within one wait slice; a
   * lock-step request when answered, timed out or its server dead): unmapping under a wait
   * would crash the process (SIGSEGV) when the wait reads its words again.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#busy) return;
    if (this.#holdsLease() && this.#alive()) {
      try {
        await this.#roundTrip(SlotCommand.SHUTDOWN, this.numEnvs, 1000);
      } catch (error) {
        // best effort: the lease is released either way; an unanswered SHUTDOWN is waited for
        // by the next channel of this thread on the region
        if (error instanceof TransportTimeoutError) UNANSWERED.add(this.region.inode);
      }
    }
    this.#release();
  }

  /** Is the region's lease still this channel's? Not after the server took it back (a stalled
   * attach, a holder it took for a foreign process): then another client may hold it, and this
   * channel's SHUTDOWN would end that client's session (same pid) and reuse its request
   * sequences, and its release would free or alter that client's lease. */
  #holdsLease(): boolean {
    const region = this.region;
    return (
      this.#leased &&
      LEASES.get(region.inode)?.deref() === this &&
      Atomics.load(region.words, region.cbWord("client_pid")) >>> 0 === process.pid
    );
  }

  #release(): void {
    const region = this.region;
    if (this.#leased) {
      if (this.#holdsLease()) {
        region.dv.setBigUint64(off(CB, "client_start_time"), 0n, true);
        Atomics.compareExchange(region.words, region.cbWord("client_pid"), process.pid, 0);
      } // else: another client's now (see #holdsLease)
      if (LEASES.get(region.inode)?.deref() === this) LEASES.delete(region.inode);
      this.#leased = false;
    }
    sideReaders.get(region)?.close();
    sideReaders.delete(region);
    region.unmap();
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** shm_open + mmap, retried until the timeout while the region is missing, header-less or not READY. */
async function attach(shm: ShmUrl, layout: ShmLayout, timeoutMs: number): Promise<Region> {
  const deadline = Date.now() + timeoutMs;
  let delay = 2;
  for (;;) {
    let why: string;
    try {
      const region = Region.open(shm, layout);
      const state = Atomics.load(region.words, region.cbWord("state"));
      if (state === RegionState.READY) return region;
      why = `${shm.path} is not ready (state ${state})`;
      region.unmap();
    } catch (error) {
      // missing or not initialised yet: wait; anything else (permission, not a segment): at once
      const message = (error as Error).message;
      if (!(error instanceof SegmentMissingError) && !message.includes("has no control block yet")) throw error;
      why = message;
    }
    if (Date.now() + delay > deadline) throw new ConnectError(why);
    await sleep(delay);
    delay = Math.min(delay * 2, 100);
  }
}

/** The schema name in a region's schema area ("" when it has none or it does not parse). */
function irName(ir: string | null): string {
  if (ir === null) return "";
  try {
    const name = (JSON.parse(ir) as { name?: unknown }).name;
    return typeof name === "string" ? name : "";
  } catch {
    return "";
  }
}

/** A READY region's control block and schema area, or why it cannot be read yet. */
function readReady(shm: ShmUrl): { control: Buffer; size: number; ir: string | null } | string {
  let fd: number;
  try {
    fd = openSegmentForReading(shm.path); // never blocks on a FIFO; refuses what is not a file
  } catch (error) {
    if (error instanceof ConnectError) throw error;
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return `no region ${shm.path}: is a server running on shm://${shm.name}?`;
    throw new ConnectError(`cannot open ${shm.path}: ${(error as Error).message}`);
  }
  try {
    const size = fstatSync(fd).size;
    if (size < CONTROL_SIZE) return `${shm.path} has no control block yet (${size} bytes)`;
    const control = Buffer.alloc(CONTROL_SIZE);
    readSync(fd, control, 0, CONTROL_SIZE, 0);
    const state = control.readUInt32LE(off(CB, "state"));
    if (state !== RegionState.READY) return `${shm.path} is not ready (state ${state})`;
    return { control, size, ir: schemaAreaOfFd(fd, size).ir };
  } finally {
    closeSync(fd);
  }
}

/** The schema a region carries in its schema area, checked against its control block's
 * fingerprint (waits up to `timeoutMs` for the region to be READY). Python: read_region_schema. */
export async function readRegionSchema(url: string, shm: ShmUrl, timeoutMs: number): Promise<SchemaModule> {
  const deadline = Date.now() + timeoutMs;
  let delay = 2;
  let found = readReady(shm);
  while (typeof found === "string") {
    if (Date.now() + delay > deadline) throw new ConnectError(found);
    await sleep(delay);
    delay = Math.min(delay * 2, 100);
    found = readReady(shm);
  }
  const magic = found.control.readUInt32LE(off(CB, "magic"));
  if (magic !== MAGIC) {
    const hex = (v: number): string => `0x${v.toString(16).toUpperCase().padStart(8, "0")}`;
    throw new RegionMismatchError(`shm://${shm.name}`, "magic", hex(MAGIC), hex(magic));
  }
  const version = found.control.readUInt32LE(off(CB, "version"));
  if (version !== LAYOUT_VERSION) {
    throw new VersionMismatchError(
      `shm://${shm.name}: control block field version: expected layout version ${LAYOUT_VERSION}, found ${version} ` +
        "(server and client were built from different shm layouts)",
    );
  }
  checkOwner(`shm://${shm.name}`, found.control.readUInt32LE(off(CB, "owner_pid")), found.control.readBigUInt64LE(off(CB, "owner_start_time")));
  const least = CONTROL_SIZE + found.control.readUInt32LE(off(CB, "num_envs")) * found.control.readUInt32LE(off(CB, "slot_size"));
  if (found.size < least) {
    // cut short: its trailer is gone, but it is no server without discovery
    throw new RegionMismatchError(
      `shm://${shm.name}`,
      "region size",
      `at least ${least} (the region is shorter than its header says: 64 + num_envs x slot_size)`,
      String(found.size),
    );
  }
  if (found.ir === null) {
    throw new ConnectError(`shm://${shm.name}: the region carries no schema (a server without discovery): pass a schema`);
  }
  const announced = found.control.readBigUInt64LE(off(CB, "fingerprint"));
  return schemaFromIrText(found.ir, announced, `the server at ${url}`);
}

/** A region whose server is gone is stale, whatever else is wrong with it (a cut segment). */
function checkOwner(name: string, owner: number, start: bigint): void {
  if (!peerAlive(owner, start)) {
    throw new ConnectError(`${name} is stale: its server (pid ${owner}) is gone; start a new server or run \`transport-serve --cleanup-shm\``);
  }
}

/** Each control-block field against what this client expects (the Python client's checks). */
function validate(shm: ShmUrl, region: Region, schema: SchemaModule): void {
  const layout = region.layout;
  const dv = region.dv;
  const u32 = (field: string): number => dv.getUint32(off(CB, field), true);
  const name = `shm://${shm.name}`;
  const expect = (field: string, expected: number, found: number, hex = false): void => {
    if (expected === found) return;
    const fmt = (v: number): string => (hex ? `0x${v.toString(16).toUpperCase().padStart(8, "0")}` : String(v));
    throw new RegionMismatchError(name, field, fmt(expected), fmt(found));
  };
  expect("magic", MAGIC, u32("magic"), true);
  if (u32("version") !== LAYOUT_VERSION) {
    throw new VersionMismatchError(
      `${name}: control block field version: expected layout version ${LAYOUT_VERSION}, found ${u32("version")} ` +
        "(server and client were built from different shm layouts)",
    );
  }
  checkOwner(name, u32("owner_pid"), dv.getBigUint64(off(CB, "owner_start_time"), true)); // before its sizes
  const fingerprint = dv.getBigUint64(off(CB, "fingerprint"), true);
  if (fingerprint !== BigInt.asUintN(64, schema.fingerprint)) {
    const hex = (v: bigint): string => BigInt.asUintN(64, v).toString(16).padStart(16, "0");
    throw new FingerprintMismatchError(
      `the server at ${name}: ${mismatchText(irName(region.schemaIr), fingerprint, schema.name, schema.fingerprint)} ` +
        `(control block field fingerprint: expected ${hex(schema.fingerprint)}, found ${hex(fingerprint)})`,
      schema.fingerprint,
      fingerprint,
    );
  }
  expect("slot_size", layout.slotSize, u32("slot_size"));
  const numEnvs = u32("num_envs");
  // read at attach time (the server module imports the backends): what every server serves
  if (numEnvs < 1 || numEnvs > MAX_NUM_ENVS) {
    throw new RegionMismatchError(name, "num_envs", `1..${MAX_NUM_ENVS}`, String(numEnvs));
  }
  if (shm.numEnvs !== null) expect("num_envs", shm.numEnvs, numEnvs);
  if (region.numSlots < numEnvs) {
    const formula = layout.columns ? "64 + k x (slot + final) + the columns" : "64 + k x (slot + final)";
    throw new RegionMismatchError(name, "region size", `${layout.regionSize(numEnvs)} (${formula}, k >= ${numEnvs})`, String(region.size));
  }
  expect("obs_size", layout.obsSize, u32("obs_size"));
  expect("act_size", layout.actSize, u32("act_size"));
}

export async function openChannel(url: string, options: OpenOptions = {}): Promise<ShmChannel> {
  return ShmChannel.open(url, options);
}
