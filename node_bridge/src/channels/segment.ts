/**
 * One lifecycle for every channel segment (ring, board, run control): the Node twin of
 * transport/channels/segment.py, byte for byte. Every segment is /dev/shm/transport-<kind>-<name>
 * (mode 0600, posix_fallocate'd) and starts with the 64-byte SegmentHeader of
 * schema/channels.toml:
 *
 *     0 magic u32 "TPCH" | 4 kind u32 | 8 version u32 | 12 state u32 (CREATING 0, READY 1,
 *     CLOSED 2; written last) | 16 fingerprint u64 | 24 owner_pid u32 | 28 header_size u32
 *     32 owner_start_time u64 | 40 size u64 | 48 created_ns u64 | 56 zero
 *
 * The creator writes the magic, owner pid and start time first, READY last; an opener waits
 * (bounded) for READY and checks magic, kind, version, size and fingerprint; a dead owner's
 * segment is stale (replaced on create); the owner marks CLOSED and unlinks on close (only its
 * own inode). Only a header with the channel magic is ever stale: anything else named like a
 * segment (a foreign or empty file, a FIFO, a directory, another user's unreadable segment) is
 * refused at once in one line (segment.py's words) and never removed; what is not a file:
 * ../shm_segment.ts.
 */

import { fstatSync, lstatSync, readSync, statSync } from "node:fs";
import { ConnectError } from "../errors";
import * as layout from "../generated/channels";
import type { FieldJson } from "../ir";
import { ownedMappingBuffer, releaseMapping, unmapUnviewed } from "../mapping_lifetime";
import { checkSegmentFd, checkSegmentPath, peekSegment, unreadableNote } from "../shm_segment";
import { EACCES, EEXIST, ENOENT, O_CLOEXEC, O_CREAT, O_EXCL, O_RDWR, native, peerAlive, procStartTime } from "./native";

export const MAGIC = 0x48435054; // "TPCH"
export const LAYOUT_VERSION: number = layout.IR.version;
export const HEADER_SIZE = 64;
export const PREFIX = "transport-";
export const SHM_DIR = "/dev/shm";
export const SEQ_MASK = 0x7fffffff;
export const SLEEP_BIT = 0x80000000;
export const ChannelKind = layout.ChannelKind;
export const SegmentState = layout.SegmentState;
export const PeerState = layout.PeerState;
export type KindName = "ring" | "board" | "control";
const KIND_OF: Readonly<Record<KindName, number>> = {
  ring: layout.ChannelKind.RING,
  board: layout.ChannelKind.BOARD,
  control: layout.ChannelKind.CONTROL,
};

/** Field offsets of a struct of schema/channels.toml, by name. */
export function offsets(struct: string, base = 0): Readonly<Record<string, number>> {
  const ir = layout.IR.structs[struct];
  if (ir === undefined) throw new Error(`channels.toml has no struct ${struct}`);
  const out: Record<string, number> = {};
  for (const f of ir.fields as readonly FieldJson[]) out[f.name] = base + f.offset;
  return out;
}

export function structSize(struct: string): number {
  const ir = layout.IR.structs[struct];
  if (ir === undefined) throw new Error(`channels.toml has no struct ${struct}`);
  return ir.size;
}

const HDR = offsets("SegmentHeader");
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,180}$/;

export class ChannelError extends ConnectError {}
export class ChannelInUseError extends ChannelError {}
export class ChannelNotFoundError extends ChannelError {}
export class ChannelMismatchError extends ChannelError {}
export class ChannelClosedError extends ChannelError {}
export class PeerDiedError extends ChannelError {}
export class ChannelTimeoutError extends ChannelError {}
export class TornReadError extends ChannelError {}

export function align(value: number, to = 64): number {
  return Math.ceil(value / to) * to;
}

export function segmentName(kind: KindName, name: string): string {
  if (!NAME.test(name)) throw new RangeError(`channel name ${JSON.stringify(name)}: 1-181 characters of A-Z a-z 0-9 . _ -`);
  return `/${PREFIX}${kind}-${name}`;
}

/** Seconds a header-less segment may take to be written by its creator. */
export const STALE_CREATING_AFTER_S = 10;

/** "ours" (the channel magic), "empty" (under a header or an all-zero one: a creator between
 * shm_open and its first write) or "foreign" (anything else): segment.py `_what`. */
function whatOf(head: Buffer): "ours" | "empty" | "foreign" {
  if (head.length < HEADER_SIZE || head.every((b) => b === 0)) return "empty";
  return head.readUInt32LE(HDR["magic"]!) === MAGIC ? "ours" : "foreign";
}

function notOurs(path: string): string {
  return `${path} exists and is not a channel segment: remove it if nothing uses it`;
}

function ageOf(mtimeMs: number): number {
  return Math.max(0, (Date.now() - mtimeMs) / 1000);
}

/**
 * Why a creator cannot replace the entry at `path` (segment.py SegmentInfo.refusal); null when
 * it is gone or stale (a header with the channel magic whose owner is dead, or that got no owner
 * in 10 s): only then is it removed.
 */
function refusalOf(path: string): ChannelError | null {
  let peek;
  try {
    peek = peekSegment(path, HEADER_SIZE);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
  if (peek.what === "unreadable") return new ChannelInUseError(`${path} cannot be read (${peek.note}); it is not replaced`);
  if (peek.what === "not-a-file") {
    return new ChannelMismatchError(`${path} is ${peek.note}, not a shared-memory segment: remove it if nothing uses it`);
  }
  const ageS = ageOf(peek.st.mtimeMs);
  const what = whatOf(peek.head);
  if (what === "foreign" || (what === "empty" && ageS > STALE_CREATING_AFTER_S)) return new ChannelMismatchError(notOurs(path));
  const pid = what === "ours" ? peek.head.readUInt32LE(HDR["owner_pid"]!) : 0;
  if (pid !== 0) {
    if (!peerAlive(pid, peek.head.readBigUInt64LE(HDR["owner_start_time"]!))) return null;
  } else if (what === "ours" && ageS > STALE_CREATING_AFTER_S) {
    return null;
  }
  const who = pid !== 0 ? `pid ${pid}` : "a process starting up";
  return new ChannelInUseError(`${path} is in use by a live owner (${who}); it is not replaced`);
}

/**
 * A mapped channel segment: typed arrays over the mapping itself (no copy). Their ArrayBuffer
 * owns the mapping (mapping_lifetime.ts): typed arrays made of it (board slot views, views of
 * ring records) that a caller keeps past `close()` keep reading a private copy of the pages,
 * with their values at close, until they are collected; never unmapped memory. After `close()`
 * `bytes`, `dv`, `i32`, `u64` and the futex calls throw ChannelClosedError, so every method of
 * a closed board, ring, producer, consumer or run control does.
 */
export class Segment {
  readonly kind: KindName;
  readonly name: string;
  readonly shmName: string;
  readonly path: string;
  readonly size: number;
  readonly owner: boolean;
  readonly inode: number;
  readonly address: bigint;
  readonly base: number;
  #bytes: Uint8Array | null;
  #dv: DataView | null;
  #i32: Int32Array | null;
  #u64: BigUint64Array | null;
  #mapped = true;
  readonly #token = {}; // unregisters the mapping's finalizer (#discard)

  private constructor(kind: KindName, name: string, fd: number, size: number, owner: boolean) {
    const nat = native();
    this.kind = kind;
    this.name = name;
    this.shmName = segmentName(kind, name);
    this.path = SHM_DIR + this.shmName;
    this.size = size;
    this.owner = owner;
    this.inode = fstatSync(fd).ino;
    const address = nat.mmap(fd, size);
    if (address < 0n) throw new ChannelError(`cannot map ${this.path}: ${nat.strerror(nat.errno())}`);
    this.address = address;
    this.base = Number(address);
    const buffer = ownedMappingBuffer(address, size, this.#token);
    this.#bytes = new Uint8Array(buffer);
    this.#dv = new DataView(buffer);
    this.#i32 = new Int32Array(buffer, 0, size >> 2);
    this.#u64 = new BigUint64Array(buffer, 0, size >> 3);
  }

  /** ChannelClosedError once this process closed the segment. */
  requireOpen(): void {
    if (!this.#mapped) throw new ChannelClosedError(`${this.path}: this ${this.kind} was closed by this process`);
  }

  /** The mapping's bytes (no copy); ChannelClosedError after close(). */
  get bytes(): Uint8Array {
    if (this.#bytes === null) this.requireOpen();
    return this.#bytes as Uint8Array;
  }

  get dv(): DataView {
    if (this.#dv === null) this.requireOpen();
    return this.#dv as DataView;
  }

  get i32(): Int32Array {
    if (this.#i32 === null) this.requireOpen();
    return this.#i32 as Int32Array;
  }

  get u64(): BigUint64Array {
    if (this.#u64 === null) this.requireOpen();
    return this.#u64 as BigUint64Array;
  }

  /** Create exclusively (a stale segment is replaced, a live one never); `init` writes the
   * kind's body; READY is written last. */
  static create(kind: KindName, name: string, size: number, fingerprint: bigint, init: (seg: Segment) => void): Segment {
    const nat = native();
    const shmName = segmentName(kind, name);
    const path = SHM_DIR + shmName;
    for (let attempt = 0; attempt < 5; attempt++) {
      const fd = nat.shmOpen(shmName, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600);
      if (fd < 0) {
        const errno = nat.errno();
        if (errno !== EEXIST) throw new ChannelError(`cannot create ${path}: ${nat.strerror(errno)}`);
        const refusal = refusalOf(path); // live, starting up, unreadable or not ours: never replaced
        if (refusal !== null) throw refusal;
        if (nat.shmUnlink(shmName) !== 0 && nat.errno() !== ENOENT) {
          throw new ChannelError(`cannot remove the stale segment ${path}: ${nat.strerror(nat.errno())}`);
        }
        continue;
      }
      let seg: Segment;
      try {
        if (nat.fchmod(fd, 0o600) !== 0) throw new ChannelError(`fchmod ${path}: ${nat.strerror(nat.errno())}`);
        const err = nat.posixFallocate(fd, 0, size);
        if (err !== 0) {
          throw new ChannelError(
            `cannot create ${path} (${size} bytes): ${nat.strerror(err)}; enlarge /dev/shm or remove stale segments`,
          );
        }
        seg = new Segment(kind, name, fd, size, true);
      } catch (error) {
        nat.shmUnlink(shmName);
        throw error;
      } finally {
        nat.close(fd);
      }
      const dv = seg.dv;
      dv.setUint32(HDR["magic"]!, MAGIC, true); // first: a header without it is never a creator's
      dv.setUint32(HDR["owner_pid"]!, process.pid, true);
      dv.setBigUint64(HDR["owner_start_time"]!, procStartTime(process.pid), true);
      dv.setUint32(HDR["kind"]!, KIND_OF[kind], true);
      dv.setUint32(HDR["version"]!, LAYOUT_VERSION, true);
      dv.setBigUint64(HDR["fingerprint"]!, fingerprint, true);
      dv.setUint32(HDR["header_size"]!, HEADER_SIZE, true);
      dv.setBigUint64(HDR["size"]!, BigInt(size), true);
      dv.setBigUint64(HDR["created_ns"]!, BigInt(Date.now()) * 1_000_000n, true);
      try {
        init(seg);
      } catch (error) {
        seg.close();
        throw error;
      }
      Atomics.store(seg.i32, HDR["state"]! >> 2, SegmentState.READY);
      return seg;
    }
    throw new ChannelError(`could not replace the stale segment ${path}`);
  }

  /** Map an existing READY segment (waiting up to `timeoutMs`) and validate it. A path that is
   * not a channel segment (a FIFO, a directory, a file without the channel magic, an empty file
   * older than 10 s) is a ChannelMismatchError at once, another user's that this one may not
   * read a ChannelInUseError; neither is waited for (segment.py's words). */
  static open(kind: KindName, name: string, fingerprint: bigint | null, timeoutMs = 10_000): Segment {
    const nat = native();
    const shmName = segmentName(kind, name);
    const path = SHM_DIR + shmName;
    const deadline = performance.now() + timeoutMs;
    let why = "it does not exist";
    for (;;) {
      const fd = nat.shmOpen(shmName, O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        const errno = nat.errno();
        if (errno === EACCES) {
          let uid = -1;
          try {
            uid = lstatSync(path).uid;
          } catch {
            // gone meanwhile: wait for it like a missing one
          }
          if (uid >= 0) throw new ChannelInUseError(`${path} cannot be read (${unreadableNote(nat.strerror(errno), uid)})`);
        } else if (errno !== ENOENT) {
          checkSegmentPath(path, ChannelMismatchError); // EISDIR: a directory; ELOOP: a link
          throw new ChannelError(`cannot open ${path}: ${nat.strerror(errno)}`);
        }
      } else {
        let seg: Segment | null = null;
        try {
          const st = checkSegmentFd(fd, path, ChannelMismatchError); // a FIFO opens O_RDWR at once
          const head = Buffer.alloc(HEADER_SIZE);
          const what = whatOf(head.subarray(0, readSync(fd, head, 0, HEADER_SIZE, 0)));
          if (what === "foreign" || (what === "empty" && ageOf(st.mtimeMs) > STALE_CREATING_AFTER_S)) {
            throw new ChannelMismatchError(notOurs(path));
          }
          if (what === "ours") seg = new Segment(kind, name, fd, st.size, false);
          else why = "it has no header yet";
        } finally {
          nat.close(fd);
        }
        if (seg !== null) {
          const state = Atomics.load(seg.i32, HDR["state"]! >> 2);
          if (state === SegmentState.READY) {
            try {
              seg.validate(fingerprint);
            } catch (error) {
              seg.#discard();
              throw error;
            }
            return seg;
          }
          why = state === SegmentState.CREATING ? "it is being created" : "it was closed";
          seg.#discard();
        }
      }
      if (performance.now() >= deadline) throw new ChannelNotFoundError(`${path}: no ready ${kind} (${why})`);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
    }
  }

  private validate(fingerprint: bigint | null): void {
    const dv = this.dv;
    const checks: [string, bigint, bigint][] = [
      ["magic", BigInt(MAGIC), BigInt(dv.getUint32(HDR["magic"]!, true))],
      ["kind", BigInt(KIND_OF[this.kind]), BigInt(dv.getUint32(HDR["kind"]!, true))],
      ["version", BigInt(LAYOUT_VERSION), BigInt(dv.getUint32(HDR["version"]!, true))],
      ["size", dv.getBigUint64(HDR["size"]!, true), BigInt(this.size)],
    ];
    if (fingerprint !== null) checks.push(["fingerprint", fingerprint, dv.getBigUint64(HDR["fingerprint"]!, true)]);
    for (const [field, expected, found] of checks) {
      if (expected !== found) {
        const hex = field === "magic" || field === "fingerprint";
        const show = (v: bigint): string => (hex ? `0x${v.toString(16)}` : v.toString());
        throw new ChannelMismatchError(`${this.path}: ${field} is ${show(found)}, expected ${show(expected)}`);
      }
    }
    if (!this.ownerAlive) throw new ChannelNotFoundError(`${this.path} is stale: its owner pid ${this.ownerPid} is dead`);
  }

  get ownerPid(): number {
    return this.dv.getUint32(HDR["owner_pid"]!, true);
  }

  get ownerAlive(): boolean {
    return peerAlive(this.ownerPid, this.dv.getBigUint64(HDR["owner_start_time"]!, true));
  }

  /** The state word (CLOSED once this process closed the segment: nothing is read). */
  get state(): number {
    if (!this.#mapped) return SegmentState.CLOSED;
    return Atomics.load(this.i32, HDR["state"]! >> 2);
  }

  get stateOffset(): number {
    return HDR["state"]!;
  }

  get closed(): boolean {
    return !this.#mapped;
  }

  /** FUTEX_WAIT on the u32 at byte `offset` while it holds `expected`, at most `ns`. */
  futexWait(offset: number, expected: number, ns: number): void {
    this.requireOpen();
    const t = { tv_sec: Math.floor(ns / 1e9), tv_nsec: Math.floor(ns % 1e9) };
    native().futex(this.base + offset, 0, expected >>> 0, t);
  }

  futexWake(offset: number): void {
    this.requireOpen();
    native().futex(this.base + offset, 1, 0x7fffffff, null);
  }

  /** Store a new sequence (exchange) and wake the word's sleepers if one announced itself. */
  publishWord(offset: number, value: number): void {
    const old = Atomics.exchange(this.i32, offset >> 2, value & SEQ_MASK);
    if (old & SLEEP_BIT) this.futexWake(offset);
  }

  /** tp_wake_if_sleeping: after a change a waiter waits for, bump the word and wake if bit 31
   * says one sleeps (Atomics are sequentially consistent: no lost wake-up). */
  wakeIfSleeping(offset: number): boolean {
    const v = Atomics.load(this.i32, offset >> 2);
    if (!(v & SLEEP_BIT)) return false;
    Atomics.exchange(this.i32, offset >> 2, ((v & SEQ_MASK) + 1) & SEQ_MASK);
    this.futexWake(offset);
    return true;
  }

  /** Wait until the u32 at `offset` has a sequence other than `last` (futex slices of
   * `sliceMs`); returns the new sequence, -1 on timeout, -2 when the segment closed. */
  waitChange(offset: number, last: number, timeoutMs: number, sliceMs = 50): number {
    const deadline = performance.now() + timeoutMs;
    const index = offset >> 2;
    for (;;) {
      let v = Atomics.load(this.i32, index);
      if ((v & SEQ_MASK) !== (last & SEQ_MASK)) return v & SEQ_MASK;
      if (this.state !== SegmentState.READY) return -2;
      const now = performance.now();
      if (now >= deadline) return -1;
      if (!(v & SLEEP_BIT)) {
        const sleeping = v | SLEEP_BIT;
        if (Atomics.compareExchange(this.i32, index, v, sleeping) !== v) continue;
        v = sleeping;
      }
      this.futexWait(offset, v, Math.min(sliceMs, deadline - now) * 1e6);
    }
  }

  unlinkIfOurs(): boolean {
    try {
      if (statSync(this.path).ino !== this.inode) return false;
    } catch {
      return false;
    }
    return native().shmUnlink(this.shmName) === 0;
  }

  /** End this process's use of the segment; the owner (or `unlink`) first marks it CLOSED
   * (waking the state word) and unlinks it. Typed arrays over the mapping that are still held
   * keep a private copy of it, taken now, unmapped once they are collected (mapping_lifetime.ts);
   * this segment's own accessors throw ChannelClosedError from now on. */
  close(unlink: boolean = this.owner): void {
    if (!this.#mapped) return;
    if (unlink) {
      Atomics.store(this.i32, HDR["state"]! >> 2, SegmentState.CLOSED);
      this.futexWake(HDR["state"]!);
      this.unlinkIfOurs();
    }
    releaseMapping(this.address, this.size, this.path, this.inode);
    this.#mapped = false;
    this.#bytes = this.#dv = this.#i32 = this.#u64 = null;
  }

  /** Unmap a segment that never left `open()` (no view of it exists): no copy, at once. */
  #discard(): void {
    if (!this.#mapped) return;
    this.#mapped = false;
    this.#bytes = this.#dv = this.#i32 = this.#u64 = null;
    unmapUnviewed(this.#token, this.address, this.size);
  }
}
