/**
 * The policy board: the Node twin of transport/channels/board.py (layout in schema/channels.toml):
 *
 *     0   SegmentHeader (fingerprint = hash of the array table)   64 BoardHeader
 *     128 version u64 | active u32       192 notify u32 (futex, bumped per publish)
 *     256 slot 0 seq u64 | version u64   320 slot 1 seq u64 | version u64 (DOUBLE_BUFFER)
 *     384 BoardEntry[n]: name, NumPy dtype string, shape, offset, nbytes
 *     D   slot 0 payload, D + stride slot 1 payload
 *
 * A reader copies the active slot and keeps the copy only if the slot's seq was even and
 * unchanged across it (never a torn or mixed version) and its version is announced (the
 * versions a reader sees never go back).
 *
 * A publish checks every array before it touches a slot (a failed publish changes nothing). A
 * publish that died half way leaves its slot odd: the next publisher of the lease first repairs
 * the board (board.py `_repair`: the odd slot zeroed and marked empty, version 0, seq even and
 * higher; the announced version the highest whole one; `active` at the newest whole slot).
 * Readers raise ChannelCorruptError on a word the protocol never writes (`active` out of range,
 * a version that went back or beyond 2**63).
 */

import { createHash } from "node:crypto";
import {
  ChannelError,
  ChannelInUseError,
  ChannelMismatchError,
  ChannelTimeoutError,
  PeerDiedError,
  SEQ_MASK,
  Segment,
  TornReadError,
  align,
  offsets,
  structSize,
} from "./segment";
import { holder, holderAlive, takeLease } from "./lease";
import { native } from "./native";
import * as layout from "../generated/channels";
import type { FieldJson } from "../ir";

const B = offsets("BoardHeader", 64);
const W = offsets("BoardWords", 128);
const ENTRY = offsets("BoardEntry");
const ENTRY_SIZE = structSize("BoardEntry");
const TABLE_OFFSET = 384;
const ENTRY_FIELDS = layout.IR.structs["BoardEntry"]!.fields as readonly FieldJson[];
const NAME_MAX = ENTRY_FIELDS.find((f) => f.name === "name")!.count;
const MAX_DIMS = ENTRY_FIELDS.find((f) => f.name === "shape")!.count;
const MASK64 = (1n << 64n) - 1n;
/** A version word beyond it was never published: a scribble (board.py MAX_VERSION). */
export const MAX_VERSION = (1n << 63n) - 1n;

/** A word of the board holds a value its protocol never writes (`active` out of range, a
 * version that went back): transport/channels/errors.py ChannelCorruptError. */
export class ChannelCorruptError extends ChannelError {}

type Typed = Float32Array | Float64Array | Int8Array | Int16Array | Int32Array | Uint8Array | Uint16Array | Uint32Array | BigInt64Array | BigUint64Array;

const TYPED: Readonly<Record<string, new (buffer: ArrayBuffer, byteOffset: number, length: number) => Typed>> = {
  "<f4": Float32Array,
  "<f8": Float64Array,
  "|i1": Int8Array,
  "<i2": Int16Array,
  "<i4": Int32Array,
  "|u1": Uint8Array,
  "|b1": Uint8Array,
  "<u2": Uint16Array,
  "<u4": Uint32Array,
  "<i8": BigInt64Array,
  "<u8": BigUint64Array,
};

/** The NumPy type string of each typed array (the board's dtype column). */
const DTYPE_OF = new Map<Function, string>([
  [Float32Array, "<f4"],
  [Float64Array, "<f8"],
  [Int8Array, "|i1"],
  [Int16Array, "<i2"],
  [Int32Array, "<i4"],
  [Uint8Array, "|u1"],
  [Uint16Array, "<u2"],
  [Uint32Array, "<u4"],
  [BigInt64Array, "<i8"],
  [BigUint64Array, "<u8"],
]);

/** One array of a board template: a typed array (1-D, its length), or a dtype and a shape. */
export type ArrayTemplate = Typed | { readonly dtype: string; readonly shape: readonly number[] };

/** The array table of a template, 64-aligned offsets in insertion order (board.py `table_of`). */
export function tableOf(template: Readonly<Record<string, ArrayTemplate>>): ArraySpec[] {
  const specs: ArraySpec[] = [];
  let offset = 0;
  for (const [name, value] of Object.entries(template)) {
    const isTyped = ArrayBuffer.isView(value);
    const dtype = isTyped ? DTYPE_OF.get((value as Typed).constructor) : (value as { dtype: string }).dtype;
    const shape = isTyped ? [(value as Typed).length] : [...(value as { shape: readonly number[] }).shape];
    const Ctor = dtype === undefined ? undefined : TYPED[dtype];
    if (dtype === undefined || Ctor === undefined) {
      throw new RangeError(`${name}: dtype ${String(dtype)} is not one of ${Object.keys(TYPED).join(", ")}`);
    }
    if (Buffer.byteLength(name, "utf8") > NAME_MAX || shape.length > MAX_DIMS || shape.some((d) => !Number.isInteger(d) || d < 0)) {
      throw new RangeError(`${JSON.stringify(name)}: names up to ${NAME_MAX} bytes, up to ${MAX_DIMS} dims of whole sizes`);
    }
    const itemsize = (Ctor as unknown as { BYTES_PER_ELEMENT: number }).BYTES_PER_ELEMENT;
    const nbytes = shape.reduce((a, b) => a * b, 1) * itemsize;
    specs.push({ name, dtype, shape, offset, nbytes });
    offset = align(offset + nbytes);
  }
  return specs;
}

export interface ArraySpec {
  readonly name: string;
  readonly dtype: string;
  readonly shape: readonly number[];
  readonly offset: number;
  readonly nbytes: number;
}

/** transport/channels/board.py `table_fingerprint`. */
export function tableFingerprint(specs: readonly ArraySpec[]): bigint {
  const text = specs.map((s) => `${s.name}:${s.dtype}:${s.shape.join("x")};`).join("");
  return createHash("sha256").update(text).digest().readBigUInt64LE(0);
}

export class PolicyBoard {
  readonly segment: Segment;
  readonly mode: "double_buffer" | "seqlock";
  readonly specs: readonly ArraySpec[];
  readonly dataOffset: number;
  readonly stride: number;
  #writer = false;
  #dirty = true; // the publisher repairs before its next publish
  #published: bigint | null = null; // the last version this publisher announced
  #activeSlot = 0; // the slot this publisher made active
  #last = 0n; // the last version this reader returned

  private constructor(segment: Segment) {
    this.segment = segment;
    const dv = segment.dv;
    this.mode = dv.getUint32(B["mode"]!, true) === layout.BoardMode.DOUBLE_BUFFER ? "double_buffer" : "seqlock";
    this.dataOffset = Number(dv.getBigUint64(B["data_offset"]!, true));
    this.stride = Number(dv.getBigUint64(B["slot_stride"]!, true));
    const table = Number(dv.getBigUint64(B["table_offset"]!, true));
    const specs: ArraySpec[] = [];
    const text = (at: number, n: number): string => {
      const raw = segment.bytes.subarray(at, at + n);
      const end = raw.indexOf(0);
      return Buffer.from(raw.subarray(0, end < 0 ? n : end)).toString("utf8");
    };
    for (let i = 0; i < dv.getUint32(B["entries"]!, true); i++) {
      const at = table + i * ENTRY_SIZE;
      const ndim = dv.getUint32(at + ENTRY["ndim"]!, true);
      const shape: number[] = [];
      for (let d = 0; d < ndim; d++) shape.push(Number(dv.getBigUint64(at + ENTRY["shape"]! + 8 * d, true)));
      specs.push({
        name: text(at + ENTRY["name"]!, 64),
        dtype: text(at + ENTRY["dtype"]!, 8),
        shape,
        offset: Number(dv.getBigUint64(at + ENTRY["offset"]!, true)),
        nbytes: Number(dv.getBigUint64(at + ENTRY["nbytes"]!, true)),
      });
    }
    this.specs = specs;
  }

  /** Create `/dev/shm/transport-board-<name>` for arrays shaped like `template` (the
   * learner's side; Python's `PolicyBoard.create`). Nothing is published yet. */
  static create(
    name: string,
    template: Readonly<Record<string, ArrayTemplate>>,
    mode: "double_buffer" | "seqlock" = "double_buffer",
  ): PolicyBoard {
    if (mode !== "double_buffer" && mode !== "seqlock") throw new RangeError(`mode must be "double_buffer" or "seqlock", got ${String(mode)}`);
    const specs = tableOf(template);
    const last = specs[specs.length - 1];
    const payload = last === undefined ? 0 : last.offset + last.nbytes;
    const stride = align(Math.max(payload, 1), 4096);
    const dataOffset = align(TABLE_OFFSET + ENTRY_SIZE * specs.length, 4096);
    const slots = mode === "double_buffer" ? 2 : 1;
    const seg = Segment.create("board", name, dataOffset + slots * stride, tableFingerprint(specs), (s) => {
      const dv = s.dv;
      dv.setUint32(B["mode"]!, mode === "double_buffer" ? layout.BoardMode.DOUBLE_BUFFER : layout.BoardMode.SEQLOCK, true);
      dv.setUint32(B["entries"]!, specs.length, true);
      dv.setBigUint64(B["payload_size"]!, BigInt(payload), true);
      dv.setBigUint64(B["table_offset"]!, BigInt(TABLE_OFFSET), true);
      dv.setBigUint64(B["data_offset"]!, BigInt(dataOffset), true);
      dv.setBigUint64(B["slot_stride"]!, BigInt(stride), true);
      specs.forEach((spec, i) => {
        const at = TABLE_OFFSET + i * ENTRY_SIZE;
        s.bytes.set(Buffer.from(spec.name, "utf8"), at + ENTRY["name"]!);
        s.bytes.set(Buffer.from(spec.dtype, "ascii"), at + ENTRY["dtype"]!);
        dv.setUint32(at + ENTRY["ndim"]!, spec.shape.length, true);
        spec.shape.forEach((d, k) => dv.setBigUint64(at + ENTRY["shape"]! + 8 * k, BigInt(d), true));
        dv.setBigUint64(at + ENTRY["offset"]!, BigInt(spec.offset), true);
        dv.setBigUint64(at + ENTRY["nbytes"]!, BigInt(spec.nbytes), true);
      });
    });
    return new PolicyBoard(seg);
  }

  /** Open a board; with `expected` (the array table) its fingerprint must match. */
  static open(name: string, timeoutMs = 10_000, expected: readonly ArraySpec[] | null = null): PolicyBoard {
    const fp = expected === null ? null : tableFingerprint(expected);
    return new PolicyBoard(Segment.open("board", name, fp, timeoutMs));
  }

  get slotCount(): number {
    return this.mode === "double_buffer" ? 2 : 1;
  }

  /** Typed-array views of one slot's arrays (over the mapping: no copy). */
  slotViews(slot: number): Record<string, Typed> {
    const out: Record<string, Typed> = {};
    const buffer = this.segment.bytes.buffer as ArrayBuffer;
    for (const s of this.specs) {
      const Ctor = TYPED[s.dtype];
      if (Ctor === undefined) throw new RangeError(`${s.name}: dtype ${s.dtype} has no typed array`);
      const at = this.dataOffset + slot * this.stride + s.offset;
      out[s.name] = new Ctor(buffer, at, s.nbytes / (Ctor as unknown as { BYTES_PER_ELEMENT: number }).BYTES_PER_ELEMENT);
    }
    return out;
  }

  /** Latest published version (0: none). No copy. */
  get version(): bigint {
    return Atomics.load(this.segment.u64, W["version"]! >> 3);
  }

  /** Sleep (synchronously, no CPU) until a version newer than `version` is published. */
  waitNewer(version: bigint, timeoutMs: number): bigint {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const seen = Atomics.load(this.segment.i32, W["notify"]! >> 2) & SEQ_MASK;
      const current = this.version;
      if (current > version) return current;
      const left = deadline - performance.now();
      if (left <= 0) throw new ChannelTimeoutError(`${this.segment.path}: no version newer than ${version}`);
      if (this.segment.waitChange(W["notify"]!, seen, left) === -2) throw new PeerDiedError(`${this.segment.path}: closed`);
    }
  }

  private activeSlot(): number {
    if (this.mode !== "double_buffer") return 0;
    const slot = Atomics.load(this.segment.i32, W["active"]! >> 2);
    if (slot !== 0 && slot !== 1) throw new ChannelCorruptError(`${this.segment.path}: active slot ${slot >>> 0} (0 or 1)`);
    return slot;
  }

  /** Whether a stable read of `version` may be returned (else retry): it is announced, and not
   * the empty slot a repair left; a version out of range or going back is corrupt. */
  private accept(version: bigint): boolean {
    const announced = this.version;
    if (announced > MAX_VERSION || version > MAX_VERSION) {
      throw new ChannelCorruptError(`${this.segment.path}: version ${announced > version ? announced : version} is out of range`);
    }
    if (announced < this.#last) throw new ChannelCorruptError(`${this.segment.path}: the version went back from ${this.#last} to ${announced}`);
    if (version > announced || (version === 0n && announced !== 0n)) return false;
    if (version < this.#last) throw new ChannelCorruptError(`${this.segment.path}: read version ${version} went back from ${this.#last}`);
    return true;
  }

  /** Copy the latest consistent version into `out` (allocated on first use); returns the
   * version. Retries while a publish overlaps (SEQLOCK), TornReadError after `timeoutMs`. */
  read(out: Record<string, Typed> | null = null, timeoutMs = 10_000): { version: bigint; arrays: Record<string, Typed> } {
    const target = out ?? Object.fromEntries(Object.entries(this.slotViews(0)).map(([k, v]) => [k, v.slice()]));
    const u64 = this.segment.u64;
    const deadline = performance.now() + timeoutMs;
    for (let attempt = 1; ; attempt++) {
      const slot = this.activeSlot();
      const seqIndex = W[`slot${slot}_seq`]! >> 3;
      const before = Atomics.load(u64, seqIndex);
      if (before % 2n === 0n) {
        const version = Atomics.load(u64, W[`slot${slot}_version`]! >> 3);
        const views = this.slotViews(slot);
        for (const [name, view] of Object.entries(views)) (target[name] as Typed).set(view as never);
        // a stable slot may hold a completed version not yet announced (a reader that took
        // `active` just before two publishes): keep only announced ones, so reads never go back
        if (Atomics.load(u64, seqIndex) === before && this.accept(version)) {
          this.#last = version;
          return { version, arrays: target };
        }
      }
      if (performance.now() > deadline) {
        const pid = this.segment.dv.getUint32(B["writer_pid"]!, true);
        if (pid && !holderAlive(pid, this.segment.dv.getBigUint64(B["writer_start_time"]!, true))) {
          throw new PeerDiedError(`${this.segment.path}: the publisher (pid ${holder(pid)}) died mid-publish`);
        }
        throw new TornReadError(`${this.segment.path}: no stable read in ${timeoutMs} ms (${attempt} attempts)`);
      }
      native().schedYield();
    }
  }

  private takeLease(): void {
    const seg = this.segment;
    const pidIndex = B["writer_pid"]! >> 2;
    const pid = Atomics.load(seg.i32, pidIndex) >>> 0;
    if (pid === process.pid) {
      this.#writer = true;
      return;
    }
    if (holderAlive(pid, seg.dv.getBigUint64(B["writer_start_time"]!, true))) {
      throw new ChannelInUseError(`${seg.path}: the publisher lease is held by live pid ${holder(pid)}`);
    }
    const start = B["writer_start_time"]! >> 3;
    if (!takeLease(seg.i32, pidIndex, pid, (t) => Atomics.store(seg.u64, start, t))) {
      throw new ChannelInUseError(`${seg.path}: another publisher took the lease meanwhile`);
    }
    this.#writer = true;
    this.#dirty = true;
    this.#published = null;
  }

  /** Every array checked (present, array-like, its length, numbers or bigints as the slot
   * wants) before the slot is touched: a publish that throws changes nothing. */
  private sources(arrays: unknown, views: Record<string, Typed>): [string, ArrayLike<number> | ArrayLike<bigint>][] {
    if (typeof arrays !== "object" || arrays === null) throw new ChannelMismatchError(`publish: an object of arrays, got ${String(arrays)}`);
    const named = arrays as Record<string, unknown>;
    const missing = this.specs.filter((s) => named[s.name] === undefined).map((s) => s.name);
    if (missing.length > 0) throw new ChannelMismatchError(`publish: missing arrays ${missing.join(", ")}`);
    const out: [string, ArrayLike<number> | ArrayLike<bigint>][] = [];
    for (const spec of this.specs) {
      const view = views[spec.name]!;
      const src = named[spec.name] as { length?: unknown } | null;
      const length = typeof src === "object" && src !== null ? src.length : undefined;
      if (typeof length !== "number") throw new ChannelMismatchError(`${spec.name}: not an array`);
      if (length !== view.length) throw new ChannelMismatchError(`${spec.name}: ${length} elements, expected ${view.length}`);
      const wantsBigint = view instanceof BigInt64Array || view instanceof BigUint64Array;
      const kind = wantsBigint ? "bigint" : "number";
      let ok: boolean;
      if (ArrayBuffer.isView(src)) ok = (src instanceof BigInt64Array || src instanceof BigUint64Array) === wantsBigint;
      else {
        ok = true;
        const list = src as unknown as ArrayLike<unknown>;
        for (let i = 0; i < length && ok; i++) ok = typeof list[i] === kind;
      }
      if (!ok) throw new ChannelMismatchError(`${spec.name}: ${spec.dtype} takes ${kind}s`);
      out.push([spec.name, src as unknown as ArrayLike<number> | ArrayLike<bigint>]);
    }
    return out;
  }

  private target(): number {
    return this.mode === "double_buffer" ? 1 - this.#activeSlot : 0;
  }

  /** Anything this publisher did not leave as it is (board.py `_needs_repair`). */
  private needsRepair(): boolean {
    const seg = this.segment;
    if (this.#dirty || this.version !== this.#published) return true;
    if (this.mode === "double_buffer" && Atomics.load(seg.i32, W["active"]! >> 2) !== this.#activeSlot) return true;
    return (Atomics.load(seg.u64, W[`slot${this.target()}_seq`]! >> 3) & 1n) === 1n;
  }

  /** board.py `_repair`: odd slots zeroed and marked empty (seq even and higher), the announced
   * version the highest whole one (or this publisher's own), `active` at the newest whole slot. */
  private repair(): void {
    const seg = this.segment;
    const u64 = seg.u64;
    let bestVersion = 0n;
    let bestSlot = 0;
    for (let slot = 0; slot < this.slotCount; slot++) {
      const seqIndex = W[`slot${slot}_seq`]! >> 3;
      const versionIndex = W[`slot${slot}_version`]! >> 3;
      const seq = Atomics.load(u64, seqIndex);
      let version = Atomics.load(u64, versionIndex);
      if ((seq & 1n) === 1n || version > MAX_VERSION) {
        const begin = ((seq + 1n) | 1n) & MASK64;
        Atomics.store(u64, seqIndex, begin);
        const at = this.dataOffset + slot * this.stride;
        seg.bytes.fill(0, at, at + this.stride);
        Atomics.store(u64, versionIndex, 0n);
        Atomics.store(u64, seqIndex, (begin + 1n) & MASK64);
        version = 0n;
      }
      if (version > bestVersion) {
        bestVersion = version;
        bestSlot = slot;
      }
    }
    let announced: bigint;
    if (this.#published === null) {
      const word = this.version;
      announced = word <= MAX_VERSION && word > bestVersion ? word : bestVersion;
    } else announced = this.#published > bestVersion ? this.#published : bestVersion;
    if (this.mode === "double_buffer") Atomics.store(seg.i32, W["active"]! >> 2, bestSlot);
    this.#activeSlot = this.mode === "double_buffer" ? bestSlot : 0;
    Atomics.store(u64, W["version"]! >> 3, announced);
    this.#published = announced;
    this.#dirty = false;
    seg.publishWord(W["notify"]!, (Atomics.load(seg.i32, W["notify"]! >> 2) + 1) & SEQ_MASK);
  }

  /** The version the next `publish` gets (to make arrays that carry it); takes the lease on
   * first use (a new publisher first repairs what a dead one left). */
  nextVersion(): bigint {
    if (!this.#writer) this.takeLease();
    if (this.needsRepair()) this.repair();
    return this.#published! + 1n;
  }

  /** Publish the next version from typed arrays named like the table (takes the lease). Arrays
   * that do not match the table throw ChannelMismatchError before anything is written. */
  publish(arrays: Readonly<Record<string, ArrayLike<number> | ArrayLike<bigint>>>): bigint {
    const seg = this.segment;
    const u64 = seg.u64;
    const sources = this.sources(arrays, this.slotViews(0));
    const version = this.nextVersion();
    if (version > MAX_VERSION) throw new ChannelCorruptError(`${seg.path}: version ${version} is out of range`);
    const slot = this.target();
    const seqIndex = W[`slot${slot}_seq`]! >> 3;
    const begin = ((Atomics.load(u64, seqIndex) + 1n) | 1n) & MASK64; // odd: being written
    this.#dirty = true; // until the slot is whole again: an exception leaves it odd
    Atomics.store(u64, seqIndex, begin);
    const views = this.slotViews(slot);
    for (const [name, src] of sources) views[name]!.set(src as never);
    Atomics.store(u64, W[`slot${slot}_version`]! >> 3, version);
    Atomics.store(u64, seqIndex, (begin + 1n) & MASK64);
    Atomics.store(seg.i32, W["active"]! >> 2, slot);
    Atomics.store(u64, W["version"]! >> 3, version);
    this.#activeSlot = slot;
    this.#published = version;
    this.#dirty = false;
    seg.publishWord(W["notify"]!, (Atomics.load(seg.i32, W["notify"]! >> 2) + 1) & SEQ_MASK);
    return version;
  }

  /** Give up the publisher lease; unmap (slot views kept by the caller keep their values at
   * close: segment.ts); the creator also unlinks. Every other method then throws
   * ChannelClosedError. */
  close(): void {
    if (this.#writer && !this.segment.closed) Atomics.compareExchange(this.segment.i32, B["writer_pid"]! >> 2, process.pid, 0);
    this.segment.close();
  }
}
