/**
 * Run control: the Node twin of transport/channels/control.py (schema/channels.toml):
 *
 *     0  SegmentHeader   64 ControlHeader: epoch u64 | stop u32 (futex) | slots | stuck_after_ms
 *     128 ProcEntry[slots], 64 bytes: pid (CAS) | state | start time | heartbeat_ns (MONOTONIC)
 *        | beats | error_code | role | name
 */

import { ChannelInUseError, PeerState, SEQ_MASK, Segment, offsets, structSize } from "./segment";
import { monotonicNs, peerAlive, procStartTime } from "./native";

const C = offsets("ControlHeader", 64);
const P = offsets("ProcEntry");
const ENTRIES = 128;
const ENTRY_SIZE = structSize("ProcEntry");

export class RunControl {
  readonly segment: Segment;
  readonly slots: number;

  private constructor(segment: Segment) {
    this.segment = segment;
    this.slots = segment.dv.getUint32(C["slots"]!, true);
  }

  static open(name: string, timeoutMs = 10_000): RunControl {
    return new RunControl(Segment.open("control", name, null, timeoutMs));
  }

  get epoch(): bigint {
    return Atomics.load(this.segment.u64, C["epoch"]! >> 3);
  }

  /** Add `n` to the global epoch; returns the new value. */
  advance(n = 1n): bigint {
    return Atomics.add(this.segment.u64, C["epoch"]! >> 3, n) + n;
  }

  get stopped(): boolean {
    return (Atomics.load(this.segment.i32, C["stop"]! >> 2) & SEQ_MASK) !== 0;
  }

  stop(): void {
    this.segment.publishWord(C["stop"]!, 1);
  }

  /** Sleep synchronously (no CPU) until the stop flag rises; true if it rose (or the block
   * closed). */
  waitStop(timeoutMs: number): boolean {
    if (this.stopped) return true;
    return this.segment.waitChange(C["stop"]!, 0, timeoutMs) !== -1;
  }

  /** Take a free entry (else one whose process is gone). */
  join(name: string, role = 0): Member {
    const seg = this.segment;
    for (const reclaim of [false, true]) {
      for (let slot = 0; slot < this.slots; slot++) {
        const base = ENTRIES + slot * ENTRY_SIZE;
        const pid = Atomics.load(seg.i32, (base + P["pid"]!) >> 2) >>> 0;
        if (pid !== 0 && (!reclaim || peerAlive(pid, seg.dv.getBigUint64(base + P["start_time"]!, true)))) continue;
        if (Atomics.compareExchange(seg.i32, (base + P["pid"]!) >> 2, pid | 0, process.pid) === (pid | 0)) {
          return new Member(this, slot, name, role);
        }
      }
    }
    throw new ChannelInUseError(`${seg.path}: all ${this.slots} entries are in use`);
  }

  close(): void {
    this.segment.close();
  }
}

export class Member {
  readonly control: RunControl;
  readonly slot: number;
  readonly base: number;

  constructor(control: RunControl, slot: number, name: string, role: number) {
    this.control = control;
    this.slot = slot;
    this.base = ENTRIES + slot * ENTRY_SIZE;
    const seg = control.segment;
    const encoded = Buffer.from(name, "utf8").subarray(0, 24);
    seg.bytes.fill(0, this.base + P["name"]!, this.base + P["name"]! + 24);
    seg.bytes.set(encoded, this.base + P["name"]!);
    seg.dv.setUint32(this.base + P["role"]!, role, true);
    seg.dv.setUint32(this.base + P["error_code"]!, 0, true);
    seg.dv.setBigUint64(this.base + P["beats"]!, 0n, true);
    seg.dv.setBigUint64(this.base + P["start_time"]!, procStartTime(process.pid), true);
    this.beat();
    Atomics.store(seg.i32, (this.base + P["state"]!) >> 2, PeerState.ACTIVE);
  }

  beat(): void {
    const seg = this.control.segment;
    const at = this.base + P["beats"]!;
    seg.dv.setBigUint64(at, seg.dv.getBigUint64(at, true) + 1n, true);
    Atomics.store(seg.u64, (this.base + P["heartbeat_ns"]!) >> 3, monotonicNs());
  }

  fail(code = 1, stopRun = true): void {
    const seg = this.control.segment;
    seg.dv.setUint32(this.base + P["error_code"]!, code, true);
    Atomics.store(seg.i32, (this.base + P["state"]!) >> 2, PeerState.ERROR);
    if (stopRun) {
      if (!this.control.stopped) seg.dv.setUint32(C["stop_reason"]!, this.slot + 1, true);
      this.control.stop();
    }
  }

  leave(): void {
    const seg = this.control.segment;
    Atomics.compareExchange(seg.i32, (this.base + P["state"]!) >> 2, PeerState.ACTIVE, PeerState.CLOSED);
  }
}
