/**
 * Experience rings: the Node twin of transport/channels/ring.py (the same bytes, the same
 * protocol as tp_native.c's tp_ring_*; layout diagram in schema/channels.toml and
 * docs/channels.md):
 *
 *     0    SegmentHeader            128  head u64 (next record to reserve)
 *     64   RingHeader (geometry,    192  cursor u64 (tail low 32 | held << 32)
 *          consumer lease)          256  data u32 futex (consumer sleeps)   320 space u32 futex
 *     384  overwritten u64, lost    512  ProducerEntry[max_producers]
 *     S    seqs u64[capacity]: record k committed when seqs[k % capacity] == k + 1
 *     R    records[capacity] of the record struct
 *
 * Waits spin for the policy's budget (Atomics.load, sched_yield every 256), then sleep in
 * synchronous FUTEX_WAIT slices, checking the peers between slices, like the C loop.
 */

import { createHash } from "node:crypto";
import type { AnyStructCodec, SchemaModule } from "../codec";
import {
  ChannelClosedError,
  ChannelError,
  ChannelInUseError,
  ChannelMismatchError,
  ChannelTimeoutError,
  PeerDiedError,
  PeerState,
  SEQ_MASK,
  SLEEP_BIT,
  Segment,
  SegmentState,
  align,
  offsets,
  structSize,
} from "./segment";
import { CLAIMING, holder, holderAlive, takeLease } from "./lease";
import { native } from "./native";

const RING_OFFSET = 64;
const PRODUCERS_OFFSET = 512;
const ENTRY_SIZE = structSize("ProducerEntry");
const R = offsets("RingHeader", RING_OFFSET);
const E = offsets("ProducerEntry");
const M32 = 0xffffffffn;
const YIELD_EVERY = 256;
const SPIN_NS = 25;
/** What an aborting producer sleeps on between looks at the consumer's tail (0.5 ms waits). */
const PAUSE = new Int32Array(new SharedArrayBuffer(4));

export type RingPolicy = "block" | "overwrite";

export interface WaitPolicy {
  /** Spin budget in C PAUSE iterations (~25 ns each). */
  readonly spin: number;
  /** One FUTEX_WAIT's length (ms): the liveness re-check period. */
  readonly sliceMs: number;
}

export const BALANCED: WaitPolicy = { spin: 20_000, sliceMs: 50 };
/** The default (transport/channels/ring.py DEFAULT_WAIT): sleep at once, no spin. */
export const FUTEX: WaitPolicy = { spin: 0, sliceMs: 50 };

export interface RingOptions {
  readonly policy?: RingPolicy;
  readonly multiProducer?: boolean;
  readonly maxProducers?: number;
  readonly wait?: WaitPolicy;
}

/** The u64 a ring stores for its record type (transport/channels/ring.py `record_fingerprint`). */
export function recordFingerprint(schema: SchemaModule, struct: string): bigint {
  const digest = createHash("sha256").update(`${schema.fingerprintHex}:${struct}`).digest();
  return digest.readBigUInt64LE(0);
}

const WAIT_TIMEOUT = -1;
const WAIT_CLOSED = -2;
const WAIT_DEAD = -3;

/** A mapped ring; take a role with `producer()` or `consumer()`. */
export class Ring {
  readonly segment: Segment;
  readonly recordSize: number;
  readonly capacity: number;
  readonly policy: RingPolicy;
  readonly multiProducer: boolean;
  readonly maxProducers: number;
  readonly seqsOffset: number;
  readonly recordsOffset: number;
  readonly wait: WaitPolicy;
  readonly mask: bigint;
  /** The record struct's codec (what `Producer.push` encodes record values with). */
  readonly record: AnyStructCodec;
  /** The record struct's field names, in declaration order. */
  readonly recordFields: readonly string[];

  private constructor(segment: Segment, schema: SchemaModule, struct: string, wait: WaitPolicy) {
    this.segment = segment;
    this.record = schema.structs[struct]!;
    this.recordFields = (schema.ir.structs[struct]?.fields ?? []).map((f) => f.name);
    const recordSize = this.record.size;
    const dv = segment.dv;
    this.capacity = dv.getUint32(R["capacity"]!, true);
    this.recordSize = dv.getUint32(R["record_size"]!, true);
    this.policy = dv.getUint32(R["policy"]!, true) === 1 ? "overwrite" : "block";
    this.multiProducer = dv.getUint32(R["multi_producer"]!, true) !== 0;
    this.maxProducers = dv.getUint32(R["max_producers"]!, true);
    this.seqsOffset = Number(dv.getBigUint64(R["seqs_offset"]!, true));
    this.recordsOffset = Number(dv.getBigUint64(R["records_offset"]!, true));
    this.wait = wait;
    this.mask = BigInt(this.capacity - 1);
    if (this.recordSize !== recordSize) {
      throw new ChannelMismatchError(`${segment.path}: record_size is ${this.recordSize}, expected ${recordSize}`);
    }
    if (this.capacity & (this.capacity - 1) || this.recordsOffset + this.capacity * recordSize > segment.size) {
      throw new ChannelMismatchError(`${segment.path}: bad geometry (capacity ${this.capacity})`);
    }
  }

  static create(name: string, schema: SchemaModule, struct: string, capacity: number, options: RingOptions = {}): Ring {
    const codec = schema.structs[struct];
    if (codec === undefined) throw new RangeError(`schema ${schema.name} has no struct ${struct}`);
    if (capacity < 2 || capacity & (capacity - 1) || capacity >= 2 ** 31) {
      throw new RangeError(`capacity must be a power of two in [2, 2**31), got ${capacity}`);
    }
    const multi = options.multiProducer ?? false;
    const producers = multi ? (options.maxProducers ?? 16) : 1;
    const seqs = align(PRODUCERS_OFFSET + ENTRY_SIZE * producers);
    const records = align(seqs + 8 * capacity);
    const size = align(records + capacity * codec.size, 4096);
    const seg = Segment.create("ring", name, size, recordFingerprint(schema, struct), (s) => {
      const dv = s.dv;
      dv.setUint32(R["capacity"]!, capacity, true);
      dv.setUint32(R["record_size"]!, codec.size, true);
      dv.setUint32(R["policy"]!, options.policy === "overwrite" ? 1 : 0, true);
      dv.setUint32(R["multi_producer"]!, multi ? 1 : 0, true);
      dv.setUint32(R["max_producers"]!, producers, true);
      dv.setBigUint64(R["producers_offset"]!, BigInt(PRODUCERS_OFFSET), true);
      dv.setBigUint64(R["seqs_offset"]!, BigInt(seqs), true);
      dv.setBigUint64(R["records_offset"]!, BigInt(records), true);
    });
    return new Ring(seg, schema, struct, options.wait ?? FUTEX);
  }

  static open(name: string, schema: SchemaModule, struct: string, timeoutMs = 10_000, wait: WaitPolicy = FUTEX): Ring {
    const codec = schema.structs[struct];
    if (codec === undefined) throw new RangeError(`schema ${schema.name} has no struct ${struct}`);
    const seg = Segment.open("ring", name, recordFingerprint(schema, struct), timeoutMs);
    try {
      return new Ring(seg, schema, struct, wait);
    } catch (error) {
      seg.close();
      throw error;
    }
  }

  producer(): Producer {
    return new Producer(this);
  }

  consumer(): Consumer {
    return new Consumer(this);
  }

  /** Byte offset of record `index`'s slot. */
  recordOffset(index: bigint | number): number {
    return this.recordsOffset + Number(BigInt(index) & this.mask) * this.recordSize;
  }

  seqIndex(k: bigint): number {
    return (this.seqsOffset >> 3) + Number(k & this.mask);
  }

  load64(offset: number): bigint {
    return Atomics.load(this.segment.u64, offset >> 3);
  }

  cas64(offset: number, expected: bigint, desired: bigint): boolean {
    return Atomics.compareExchange(this.segment.u64, offset >> 3, expected, desired) === expected;
  }

  /** The full tail from head and the cursor word (head - tail <= capacity < 2^31). */
  tailOf(head: bigint, cursor: bigint): bigint {
    return head - (((head & M32) - (cursor & M32)) & M32);
  }

  get head(): bigint {
    return this.load64(R["head"]!);
  }

  get overwritten(): bigint {
    return this.load64(R["overwritten"]!);
  }

  get lost(): bigint {
    return this.load64(R["lost"]!);
  }

  stats(): { head: bigint; tail: bigint; held: bigint; overwritten: bigint; lost: bigint } {
    const head = this.head;
    const cursor = this.load64(R["cursor"]!);
    return { head, tail: this.tailOf(head, cursor), held: cursor >> 32n, overwritten: this.overwritten, lost: this.lost };
  }

  entryOffset(index: number): number {
    return PRODUCERS_OFFSET + index * ENTRY_SIZE;
  }

  /** The C loop's spin-then-sleep step. Returns true when the caller should look again. */
  sleepStep(state: WaitState, wordOffset: number, v: number, deadline: number): void {
    if (!state.announced) {
      if (!(v & SLEEP_BIT)) Atomics.compareExchange(this.segment.i32, wordOffset >> 2, v, v | SLEEP_BIT);
      state.announced = true; // re-check the condition before sleeping: no lost wake-up
      return;
    }
    const ms = Math.min(this.wait.sliceMs, deadline - performance.now());
    if (ms > 0) this.segment.futexWait(wordOffset, v | SLEEP_BIT, ms * 1e6);
    state.announced = false;
  }

  /** Spin (budget in C iterations, measured as time) while the budget lasts. */
  spinStep(state: WaitState): boolean {
    if (state.spinUntil === 0) state.spinUntil = performance.now() + (this.wait.spin * SPIN_NS) / 1e6;
    if (this.wait.spin <= 0) return false;
    state.spins++;
    if ((state.spins & (YIELD_EVERY - 1)) === 0) {
      native().schedYield();
      if (performance.now() >= state.spinUntil) state.spinDone = true;
    }
    return !state.spinDone;
  }

  /** Unmap; the creator also marks the ring CLOSED (waking every waiter) and unlinks it. Views of
   * records kept by the caller keep their values at close (segment.ts); every method of the
   * ring, its producers and its consumer then throws ChannelClosedError. */
  close(): void {
    if (this.segment.closed) return;
    if (this.segment.owner) {
      Atomics.store(this.segment.i32, this.segment.stateOffset >> 2, SegmentState.CLOSED);
      for (const f of ["data_word", "space_word"]) this.segment.publishWord(R[f]!, 0);
      for (const f of ["data_word", "space_word"]) this.segment.futexWake(R[f]!);
    }
    this.segment.close();
  }
}

interface WaitState {
  announced: boolean;
  checked: boolean;
  spins: number;
  spinUntil: number;
  spinDone: boolean;
}

function newWait(): WaitState {
  return { announced: false, checked: false, spins: 0, spinUntil: 0, spinDone: false };
}

function raiseFor(rc: number, ring: Ring, what: string, peer: string, timeoutMs: number): never {
  if (rc === WAIT_TIMEOUT) throw new ChannelTimeoutError(`${ring.segment.path}: ${what} timed out after ${timeoutMs} ms`);
  if (rc === WAIT_DEAD) throw new PeerDiedError(`${ring.segment.path}: ${what}: the ${peer} died`);
  if (rc === WAIT_CLOSED) throw new ChannelClosedError(`${ring.segment.path}: ${what}: the ${peer} closed the ring`);
  throw new ChannelError(`${ring.segment.path}: ${what} failed (${rc})`);
}

/** A short description of a value's type for an error message (Python: ring.py `_describe`). */
function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return `an array of ${value.length} items`;
  if (value instanceof Uint8Array) return `a Uint8Array of ${value.byteLength} bytes`;
  if (ArrayBuffer.isView(value)) {
    const n = (value as { length?: number }).length;
    return `a ${value.constructor.name} of ${n ?? value.byteLength} ${n === undefined ? "bytes" : "elements"}`;
  }
  if (typeof value === "object") return `an object (${value.constructor?.name ?? "no prototype"})`;
  return typeof value;
}

/** The record struct as an error message names it: "a 48-byte struct (obs, action, ...)". */
function describeRecord(ring: Ring): string {
  const names = ring.recordFields;
  return `a ${ring.recordSize}-byte struct (${names.slice(0, 4).join(", ")}${names.length > 4 ? ", ..." : ""})`;
}

/** Why `records` is not a push's input (null: it is): an array of record objects, or a
 * Uint8Array of whole records. Checks the input's type only, never a record's values. */
function pushMismatch(records: unknown, size: number): string | null {
  if (records instanceof Uint8Array) {
    return records.byteLength % size === 0 ? null : `${describe(records)}, not a multiple of ${size}`;
  }
  if (!Array.isArray(records)) return describe(records);
  for (let i = 0; i < records.length; i++) {
    const item: unknown = records[i];
    if (typeof item !== "object" || item === null || Array.isArray(item) || ArrayBuffer.isView(item)) {
      return `${describe(records)}, item ${i} of which is ${describe(item)}`;
    }
  }
  return null;
}

/** A reservation: records [first, first + count), at byte `offset` of `ring.segment.bytes`. */
export interface Reservation {
  readonly first: bigint;
  readonly count: number;
  readonly offset: number;
}

export class Producer {
  readonly ring: Ring;
  readonly index: number;
  #pending: Reservation | null = null;
  #closed = false;

  constructor(ring: Ring) {
    this.ring = ring;
    this.index = this.attach();
  }

  private attach(): number {
    const ring = this.ring;
    const seg = ring.segment;
    // A free entry first; else one of a producer that is gone (and left no reservation).
    for (const reclaim of [false, true]) {
      for (let i = 0; i < ring.maxProducers; i++) {
        const base = ring.entryOffset(i);
        const pid = Atomics.load(seg.i32, (base + E["pid"]!) >> 2) >>> 0;
        const state = Atomics.load(seg.i32, (base + E["state"]!) >> 2);
        const start = seg.dv.getBigUint64(base + E["start_time"]!, true);
        const intent = ring.load64(base + E["intent"]!);
        // being taken (CLAIMING): its state is still the last holder's
        const gone = (pid & CLAIMING) !== 0 ? !holderAlive(pid, 0n) : state !== PeerState.ACTIVE || !holderAlive(pid, start);
        const free = pid === 0 || (reclaim && gone && intent === 0n);
        const fill = (t: bigint): void => {
          seg.dv.setBigUint64(base + E["start_time"]!, t, true);
          seg.dv.setUint32(base + E["intent_count"]!, 0, true);
          seg.dv.setBigUint64(base + E["committed"]!, 0n, true);
          Atomics.store(seg.i32, (base + E["state"]!) >> 2, PeerState.ACTIVE);
        };
        if (free && takeLease(seg.i32, (base + E["pid"]!) >> 2, pid, fill)) return i;
      }
    }
    throw new ChannelInUseError(
      ring.multiProducer
        ? `${seg.path}: all ${ring.maxProducers} producer entries are in use`
        : `${seg.path} is a single-producer ring and its producer is alive`,
    );
  }

  /** Reserve up to `want` contiguous records (at least one); write them at `offset` of
   * `ring.segment.bytes` (e.g. through a generated codec's `view` or `writeInto`), then commit. */
  reserve(want = 1, timeoutMs = Infinity): Reservation {
    this.requireOpen("reserve");
    if (!Number.isInteger(want) || want < 1) throw new RangeError(`reserve: want must be an integer >= 1, got ${want}`);
    if (this.#pending !== null) throw new ChannelError("commit the previous reservation first (or abort it)");
    const rc = this.tryReserve(Math.min(want, this.ring.capacity), timeoutMs);
    if (typeof rc === "number") raiseFor(rc, this.ring, "reserve", "consumer", timeoutMs);
    this.#pending = rc;
    return rc;
  }

  private tryReserve(want: number, timeoutMs: number): Reservation | number {
    const ring = this.ring;
    const seg = ring.segment;
    const cap = BigInt(ring.capacity);
    const me = ring.entryOffset(this.index);
    const deadline = performance.now() + timeoutMs;
    const w = newWait();
    for (;;) {
      const v = Atomics.load(seg.i32, R["space_word"]! >> 2);
      const h = ring.load64(R["head"]!);
      const c = ring.load64(R["cursor"]!);
      const tail = ring.tailOf(h, c);
      const held = c >> 32n;
      const used = h - (tail - held);
      if (used < cap) {
        let n = cap - used;
        if (n > BigInt(want)) n = BigInt(want);
        const toWrap = cap - (h & ring.mask);
        if (n > toWrap) n = toWrap;
        Atomics.store(seg.i32, (me + E["intent_count"]!) >> 2, Number(n));
        Atomics.store(seg.u64, (me + E["intent"]!) >> 3, h + 1n);
        if (ring.multiProducer) {
          if (!ring.cas64(R["head"]!, h, h + n)) continue;
        } else {
          Atomics.store(seg.u64, R["head"]! >> 3, h + n);
        }
        return { first: h, count: Number(n), offset: ring.recordOffset(h) };
      }
      if (ring.policy === "overwrite" && held === 0n && Atomics.load(seg.u64, ring.seqIndex(tail)) === tail + 1n) {
        if (ring.cas64(R["cursor"]!, c, tail + 1n & M32)) Atomics.add(seg.u64, R["overwritten"]! >> 3, 1n);
        continue;
      }
      if (seg.state !== SegmentState.READY) return WAIT_CLOSED;
      if (ring.spinStep(w)) continue;
      if (performance.now() >= deadline) return WAIT_TIMEOUT;
      if (w.announced) {
        const gone = w.checked ? this.consumerGone() : 0;
        w.checked = true;
        if (gone === 2) return WAIT_CLOSED;
        if (gone === 1) {
          if (ring.policy !== "overwrite") return WAIT_DEAD;
          if (held !== 0n) ring.cas64(R["cursor"]!, c, tail & M32);
          continue;
        }
      }
      ring.sleepStep(w, R["space_word"]!, v, deadline);
    }
  }

  private consumerGone(): number {
    const seg = this.ring.segment;
    const st = Atomics.load(seg.i32, R["consumer_state"]! >> 2);
    if (st === PeerState.CLOSED) return 2;
    const pid = Atomics.load(seg.i32, R["consumer_pid"]! >> 2) >>> 0;
    if (pid === 0) return st === PeerState.DEAD ? 1 : 0;
    return holderAlive(pid, this.ring.load64(R["consumer_start_time"]!)) ? 0 : 1;
  }

  /** Publish the reserved records; returns the first one's index. */
  commit(): bigint {
    this.requireOpen("commit");
    const r = this.#pending;
    if (r === null) throw new ChannelError("nothing reserved");
    const ring = this.ring;
    const seg = ring.segment;
    for (let i = 0n; i < BigInt(r.count); i++) Atomics.store(seg.u64, ring.seqIndex(r.first + i), r.first + i + 1n);
    const me = ring.entryOffset(this.index);
    Atomics.store(seg.u64, (me + E["intent"]!) >> 3, 0n);
    Atomics.add(seg.u64, (me + E["committed"]!) >> 3, BigInt(r.count));
    seg.wakeIfSleeping(R["data_word"]!);
    this.#pending = null;
    return r.first;
  }

  /** Give the current reservation back without publishing it (nothing reserved: does nothing).
   * The consumer never sees the records. When no producer reserved after it (always on a
   * single-producer ring) the reservation is undone (`head` moves back); otherwise the records
   * cannot be un-reserved, so this waits up to `timeoutMs` (Infinity: forever) for the consumer
   * to reach them and skips them, counted in `Ring.lost` as a dead producer's are.
   * ChannelTimeoutError if that wait ran out: the reservation is still this producer's (call
   * `abort` again; `close` gives it up). (transport/channels/ring.py `Producer.abort`.) */
  abort(timeoutMs = Infinity): void {
    this.requireOpen("abort");
    const r = this.#pending;
    if (r === null) return;
    if (!this.giveBack(timeoutMs)) {
      throw new ChannelTimeoutError(
        `${this.ring.segment.path}: abort: the consumer did not reach records ` +
          `${r.first}..${r.first + BigInt(r.count) - 1n} within ${timeoutMs} ms`,
      );
    }
  }

  /** Undo or skip the current reservation (see `abort`); false if the consumer did not reach it
   * within `timeoutMs` (the reservation is kept). */
  private giveBack(timeoutMs: number): boolean {
    const ring = this.ring;
    const seg = ring.segment;
    const r = this.#pending!;
    const first = r.first;
    const end = r.first + BigInt(r.count);
    const intent = (ring.entryOffset(this.index) + E["intent"]!) >> 3;
    // Undo: only this producer's CAS (or store) moved head past `end`, so while head is still
    // there nobody reserved after it; another producer that read the old head fails its CAS and
    // reads again. The consumer never claims uncommitted records.
    if (ring.cas64(R["head"]!, end, first)) {
      Atomics.store(seg.u64, intent, 0n);
      this.#pending = null;
      seg.wakeIfSleeping(R["space_word"]!);
      return true;
    }
    // Skip: once the consumer's tail reaches `first` (every older record taken) only this
    // producer may move it past its own uncommitted records, as the consumer does for a dead
    // producer's (checkProducers).
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      if (seg.state !== SegmentState.READY) {
        this.#pending = null; // the ring is gone: nothing left to give back
        return true;
      }
      const c = ring.load64(R["cursor"]!);
      const h = ring.load64(R["head"]!);
      const tail = ring.tailOf(h, c);
      let skipped = tail >= end; // (the consumer only skips a dead producer's records)
      if (!skipped && tail >= first) {
        skipped = ring.cas64(R["cursor"]!, c, ((c >> 32n) << 32n) | (end & M32));
        if (skipped) Atomics.add(seg.u64, R["lost"]! >> 3, end - tail);
      }
      if (skipped) {
        Atomics.store(seg.u64, intent, 0n);
        this.#pending = null;
        seg.wakeIfSleeping(R["data_word"]!);
        seg.wakeIfSleeping(R["space_word"]!);
        return true;
      }
      if (performance.now() >= deadline) return false;
      Atomics.wait(PAUSE, 0, 0, 0.5);
    }
  }

  /** Copy records in, in as few reservations as possible (each reserved, filled, committed);
   * returns the first one's index (-1n for no records). `records` is either an array of record
   * values, each encoded with the ring's struct codec (`ring.record.encodeInto`: validated,
   * canonical bytes), or a Uint8Array of whole records (`count * ring.recordSize` bytes, copied
   * as they are, like Python's push of a NumPy array of the record dtype). Anything else (another
   * typed array, a single record object, an array with an item that is not an object, a byte
   * length that is not a multiple of the record size) is a ChannelMismatchError before a record
   * is reserved. `timeoutMs` bounds each wait for room. An error while copying (a record the
   * codec refuses: CodecError) gives that reservation back (`abort`) before it propagates, so
   * nothing half-written is published; records of earlier reservations of the same push stay
   * published. (transport/channels/ring.py `Producer.push`.) */
  push(records: Uint8Array | readonly unknown[], timeoutMs = Infinity): bigint {
    const ring = this.ring;
    const size = ring.recordSize;
    const why = pushMismatch(records, size);
    if (why !== null) {
      throw new ChannelMismatchError(
        `${ring.segment.path}: push takes an array of ${ring.record.name} records or a Uint8Array ` +
          `of whole ones (${describeRecord(ring)}), got ${why}`,
      );
    }
    const bytes = records instanceof Uint8Array ? records : null;
    const total = bytes !== null ? bytes.byteLength / size : records.length;
    let first = -1n;
    let done = 0;
    while (done < total) {
      const r = this.reserve(total - done, timeoutMs);
      try {
        const out = ring.segment.bytes;
        if (bytes !== null) {
          out.set(bytes.subarray(done * size, (done + r.count) * size), r.offset);
        } else {
          const values = records as readonly unknown[];
          for (let i = 0; i < r.count; i++) ring.record.encodeInto(values[done + i], out, r.offset + i * size);
        }
      } catch (error) {
        try {
          this.giveBack(timeoutMs);
        } catch {
          // the copy's error is the one to report
        }
        throw error;
      }
      const index = this.commit();
      if (first < 0n) first = index;
      done += r.count;
    }
    return first;
  }

  /** How many records this producer's entry has committed since it attached (the entry's
   * `committed` counter). (transport/channels/ring.py `Producer.committed`.) */
  get committed(): bigint {
    this.requireOpen("committed");
    return this.ring.load64(this.ring.entryOffset(this.index) + E["committed"]!);
  }

  /** ChannelClosedError once this producer or its ring was closed by this process. */
  private requireOpen(what: string): void {
    if (this.#closed) throw new ChannelClosedError(`${this.ring.segment.path}: ${what}: this producer was closed`);
    this.ring.segment.requireOpen();
  }

  /** Mark this producer CLOSED (the consumer sees the end once every producer closed). A
   * reservation left open is given back (`abort` without waiting); one that cannot be at once
   * (others reserved after it) is left as a dead producer's: the consumer skips it (lost). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const seg = this.ring.segment;
    if (seg.closed) return;
    let state: number = PeerState.CLOSED;
    if (this.#pending !== null && !this.giveBack(0)) state = PeerState.DEAD;
    Atomics.store(seg.i32, (this.ring.entryOffset(this.index) + E["state"]!) >> 2, state);
    seg.wakeIfSleeping(R["data_word"]!);
  }
}

/** Records claimed by the consumer: `parts` are one run of records, or two where the ring
 * wraps, at byte offsets of `ring.segment.bytes` (no copy). Valid until `release()`. */
export interface Batch {
  readonly first: bigint;
  readonly count: number;
  readonly parts: readonly { readonly offset: number; readonly count: number }[];
  /** Byte offset of the batch's i-th record. */
  offsetOf(i: number): number;
  release(): void;
}

/** What `take(0)` returns: no records. */
const EMPTY_BATCH: Batch = Object.freeze({
  first: -1n,
  count: 0,
  parts: [],
  offsetOf: (i: number): number => {
    throw new RangeError(`an empty batch has no record ${i}`);
  },
  release: (): void => undefined,
});

export class Consumer {
  readonly ring: Ring;
  #closed = false;
  #outstanding: { count: number; released: boolean }[] = [];

  constructor(ring: Ring) {
    this.ring = ring;
    const seg = ring.segment;
    const pidIndex = R["consumer_pid"]! >> 2;
    const pid = Atomics.load(seg.i32, pidIndex) >>> 0;
    if (holderAlive(pid, ring.load64(R["consumer_start_time"]!))) {
      throw new ChannelInUseError(`${seg.path}: the consumer lease is held by live pid ${holder(pid)}`);
    }
    if (!takeLease(seg.i32, pidIndex, pid, (t) => Atomics.store(seg.u64, R["consumer_start_time"]! >> 3, t))) {
      throw new ChannelInUseError(`${seg.path}: another consumer attached meanwhile`);
    }
    if (pid !== 0) {
      for (;;) {
        const c = ring.load64(R["cursor"]!);
        if (ring.cas64(R["cursor"]!, c, c & M32)) break;
      }
    }
    Atomics.store(seg.i32, R["consumer_state"]! >> 2, PeerState.ACTIVE);
  }

  /** Claim up to `max` committed records (waiting up to `timeoutMs` for the first; 0: no wait).
   * ChannelTimeoutError, ChannelClosedError (every producer closed, ring drained),
   * PeerDiedError (every producer gone, one died). `max` 0: an empty batch at once (nothing
   * claimed, no wait); a negative or fractional `max` is a RangeError (Python: ValueError). */
  take(max = 256, timeoutMs = Infinity): Batch {
    if (this.#closed) throw new ChannelClosedError(`${this.ring.segment.path}: take: this consumer was closed`);
    if (!Number.isInteger(max) || max < 0) throw new RangeError(`take: max must be an integer >= 0, got ${max}`);
    if (max === 0) return EMPTY_BATCH;
    const ring = this.ring;
    max = Math.min(max, ring.capacity);
    const first = this.tryTake(max, timeoutMs);
    if (first.count < 0) raiseFor(first.count, ring, "take", "producers", timeoutMs);
    const parts = [{ offset: ring.recordOffset(first.first), count: first.count }];
    let count = first.count;
    if (Number(first.first & ring.mask) + count === ring.capacity && count < max) {
      const more = this.tryTake(max - count, 0);
      if (more.count > 0) {
        parts.push({ offset: ring.recordOffset(more.first), count: more.count });
        count += more.count;
      }
    }
    const size = ring.recordSize;
    const firstPart = parts[0]!;
    const entry = { count, released: false };
    this.#outstanding.push(entry);
    return {
      first: first.first,
      count,
      parts,
      offsetOf: (i: number): number =>
        i < firstPart.count ? firstPart.offset + i * size : parts[1]!.offset + (i - firstPart.count) * size,
      release: (): void => {
        if (!entry.released) {
          entry.released = true;
          this.settle();
        }
      },
    };
  }

  /** Release the oldest released batches (the held count is a FIFO: a younger batch's release
   * must not free an older batch's records). Nothing is left to give back once the consumer or
   * its ring was closed. */
  private settle(): void {
    if (this.#closed || this.ring.segment.closed) {
      this.#outstanding = [];
      return;
    }
    let count = 0;
    while (this.#outstanding.length > 0 && this.#outstanding[0]!.released) count += this.#outstanding.shift()!.count;
    if (count > 0) this.release(count);
  }

  private tryTake(max: number, timeoutMs: number): { first: bigint; count: number } {
    const ring = this.ring;
    const seg = ring.segment;
    const cap = BigInt(ring.capacity);
    const deadline = performance.now() + timeoutMs;
    const w = newWait();
    for (;;) {
      const v = Atomics.load(seg.i32, R["data_word"]! >> 2);
      const c = ring.load64(R["cursor"]!);
      const h = ring.load64(R["head"]!);
      const tail = ring.tailOf(h, c);
      const held = c >> 32n;
      let lim = h - tail;
      if (lim > BigInt(max)) lim = BigInt(max);
      const toWrap = cap - (tail & ring.mask);
      if (lim > toWrap) lim = toWrap;
      let n = 0n;
      while (n < lim && Atomics.load(seg.u64, ring.seqIndex(tail + n)) === tail + n + 1n) n++;
      if (n > 0n) {
        if (!ring.cas64(R["cursor"]!, c, ((held + n) << 32n) | (tail + n & M32))) continue;
        return { first: tail, count: Number(n) };
      }
      if (timeoutMs === 0) return { first: 0n, count: WAIT_TIMEOUT };
      if (ring.spinStep(w)) continue;
      if (seg.state !== SegmentState.READY) return { first: 0n, count: WAIT_CLOSED };
      if (performance.now() >= deadline) return { first: 0n, count: WAIT_TIMEOUT };
      if (w.announced) {
        const rc = w.checked || tail < h ? this.checkProducers(h, c) : 0;
        w.checked = true;
        if (rc === 1) continue;
        if (rc < 0) return { first: 0n, count: rc };
      }
      ring.sleepStep(w, R["data_word"]!, v, deadline);
    }
  }

  private covers(base: number, k: bigint): boolean {
    const intent = this.ring.load64(base + E["intent"]!);
    const count = BigInt(Atomics.load(this.ring.segment.i32, (base + E["intent_count"]!) >> 2) >>> 0);
    return intent !== 0n && intent - 1n <= k && k < intent - 1n + count;
  }

  /** ring_check_producers of tp_native.c. */
  private checkProducers(h: bigint, c: bigint): number {
    const ring = this.ring;
    const seg = ring.segment;
    const tail = ring.tailOf(h, c);
    const stuck = tail < h && Atomics.load(seg.u64, ring.seqIndex(tail)) !== tail + 1n;
    let seen = 0;
    let live = 0;
    let dead = 0;
    let liveCovers = false;
    let deadOwner = -1;
    for (let i = 0; i < ring.maxProducers; i++) {
      const base = ring.entryOffset(i);
      const pid = Atomics.load(seg.i32, (base + E["pid"]!) >> 2) >>> 0;
      let st = Atomics.load(seg.i32, (base + E["state"]!) >> 2);
      if (pid === 0 && st === 0) continue;
      seen++;
      if ((pid & CLAIMING) !== 0) { // being taken: its state is still the last holder's
        if (holderAlive(pid, 0n)) live++;
        else dead++;
        continue;
      }
      if (st === PeerState.ACTIVE) {
        if (holderAlive(pid, ring.load64(base + E["start_time"]!))) {
          live++;
          if (stuck && this.covers(base, tail)) liveCovers = true;
          continue;
        }
        Atomics.compareExchange(seg.i32, (base + E["state"]!) >> 2, st, PeerState.DEAD);
        st = PeerState.DEAD;
      }
      if (st === PeerState.DEAD) {
        dead++;
        if (stuck && this.covers(base, tail)) deadOwner = i;
      }
    }
    if (deadOwner >= 0 && !liveCovers) {
      if (ring.cas64(R["cursor"]!, c, ((c >> 32n) << 32n) | (tail + 1n & M32))) {
        Atomics.add(seg.u64, R["lost"]! >> 3, 1n);
        const base = ring.entryOffset(deadOwner);
        if (!this.covers(base, tail + 1n)) Atomics.store(seg.u64, (base + E["intent"]!) >> 3, 0n);
        seg.wakeIfSleeping(R["space_word"]!);
      }
      return 1;
    }
    if (seen > 0 && live === 0 && tail === h) return dead > 0 ? WAIT_DEAD : WAIT_CLOSED;
    return 0;
  }

  /** Give back the `count` oldest held records; wake producers waiting for room. (Batches call
   * this in order through their own `release()`.) */
  private release(count: number): void {
    const ring = this.ring;
    for (;;) {
      const c = ring.load64(R["cursor"]!);
      const held = c >> 32n;
      const n = BigInt(count) > held ? held : BigInt(count);
      if (ring.cas64(R["cursor"]!, c, ((held - n) << 32n) | (c & M32))) break;
    }
    ring.segment.wakeIfSleeping(R["space_word"]!);
  }

  /** Give up the lease (held records are released). */
  close(): void {
    if (this.#closed || this.ring.segment.closed) return;
    this.#closed = true;
    const ring = this.ring;
    const seg = ring.segment;
    const held = ring.load64(R["cursor"]!) >> 32n;
    this.#outstanding = [];
    if (held > 0n) this.release(Number(held));
    Atomics.store(seg.i32, R["consumer_state"]! >> 2, PeerState.CLOSED);
    Atomics.compareExchange(seg.i32, R["consumer_pid"]! >> 2, process.pid, 0);
    seg.wakeIfSleeping(R["space_word"]!);
  }
}

export { SEQ_MASK };
