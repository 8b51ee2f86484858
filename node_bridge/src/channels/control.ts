/**
 * Run control: the Node twin of transport/channels/control.py (schema/channels.toml):
 *
 *     0  SegmentHeader   64 ControlHeader: epoch u64 | stop u32 (futex) | slots | stuck_after_ms
 *     128 ProcEntry[slots], 64 bytes: pid (CAS) | state | start time | heartbeat_ns (MONOTONIC)
 *        | beats | error_code | role | name
 */

import { ChannelInUseError, PeerState, SEQ_MASK, Segment, offsets, structSize } from "./segment";
import { holder, holderAlive, takeLease } from "./lease";
import { monotonicNs } from "./native";

const C = offsets("ControlHeader", 64);
const P = offsets("ProcEntry");
const ENTRIES = 128;
const ENTRY_SIZE = structSize("ProcEntry");
const STATE_NAMES: Readonly<Record<number, MemberState>> = {
  [PeerState.ACTIVE]: "ACTIVE",
  [PeerState.CLOSED]: "CLOSED",
  [PeerState.ERROR]: "ERROR",
};

export type MemberState = "ACTIVE" | "CLOSED" | "ERROR" | "DEAD";

/** One member of the run as another process sees it (transport/channels/control.py
 * `MemberStatus`): DEAD when its process is gone, `stuck` when ACTIVE and silent too long. */
export interface MemberStatus {
  readonly slot: number;
  readonly pid: number;
  readonly name: string;
  readonly role: number;
  readonly state: MemberState;
  readonly heartbeatAgeMs: number;
  readonly beats: bigint;
  readonly errorCode: number;
  readonly stuck: boolean;
  readonly healthy: boolean;
}

export interface RunControlOptions {
  /** Process entries, 1..4096 (default 64). */
  readonly slots?: number;
  /** Heartbeat age after which an ACTIVE member counts as stuck (default 5000 ms). */
  readonly stuckAfterMs?: number;
}

export class RunControl {
  readonly segment: Segment;
  readonly slots: number;

  private constructor(segment: Segment) {
    this.segment = segment;
    this.slots = segment.dv.getUint32(C["slots"]!, true);
  }

  /** Create the run's block (the learner's side; Python's `RunControl.create`). */
  static create(name: string, options: RunControlOptions = {}): RunControl {
    const slots = options.slots ?? 64;
    const stuckAfterMs = options.stuckAfterMs ?? 5000;
    if (!Number.isInteger(slots) || slots < 1 || slots > 4096) throw new RangeError(`slots must be in [1, 4096], got ${slots}`);
    if (!Number.isInteger(stuckAfterMs) || stuckAfterMs < 1 || stuckAfterMs > 0xffffffff) {
      throw new RangeError(`stuckAfterMs must be a positive integer of milliseconds, got ${stuckAfterMs}`);
    }
    const seg = Segment.create("control", name, ENTRIES + slots * ENTRY_SIZE, 0n, (s) => {
      s.dv.setUint32(C["slots"]!, slots, true);
      s.dv.setUint32(C["stuck_after_ms"]!, stuckAfterMs, true);
    });
    return new RunControl(seg);
  }

  static open(name: string, timeoutMs = 10_000): RunControl {
    return new RunControl(Segment.open("control", name, null, timeoutMs));
  }

  get stuckAfterMs(): number {
    return this.segment.dv.getUint32(C["stuck_after_ms"]!, true);
  }

  /** 0: a clean stop (or none yet); else the entry slot + 1 whose failure stopped the run. */
  get stopReason(): number {
    return this.segment.dv.getUint32(C["stop_reason"]!, true);
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

  /** Raise the stop flag (naming `reason`, an entry slot + 1, if it is the first) and wake
   * every process waiting for it. */
  stop(reason = 0): void {
    if (reason !== 0 && !this.stopped) this.segment.dv.setUint32(C["stop_reason"]!, reason, true);
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
        if (pid !== 0 && (!reclaim || holderAlive(pid, seg.dv.getBigUint64(base + P["start_time"]!, true)))) continue;
        const start = (base + P["start_time"]!) >> 3;
        if (takeLease(seg.i32, (base + P["pid"]!) >> 2, pid, (t) => Atomics.store(seg.u64, start, t))) {
          return new Member(this, slot, name, role);
        }
      }
    }
    throw new ChannelInUseError(`${seg.path}: all ${this.slots} entries are in use`);
  }

  /** Every taken entry's status (Python's `RunControl.members`). */
  members(): MemberStatus[] {
    const seg = this.segment;
    const now = monotonicNs();
    const stuckAfter = this.stuckAfterMs;
    const out: MemberStatus[] = [];
    for (let slot = 0; slot < this.slots; slot++) {
      const base = ENTRIES + slot * ENTRY_SIZE;
      const word = Atomics.load(seg.i32, (base + P["pid"]!) >> 2) >>> 0;
      const pid = holder(word);
      if (pid === 0) continue;
      let state = STATE_NAMES[Atomics.load(seg.i32, (base + P["state"]!) >> 2)] ?? "ERROR";
      if (state === "ACTIVE" && !holderAlive(word, seg.dv.getBigUint64(base + P["start_time"]!, true))) state = "DEAD";
      const beat = Atomics.load(seg.u64, (base + P["heartbeat_ns"]!) >> 3);
      const heartbeatAgeMs = now > beat ? Number(now - beat) / 1e6 : 0;
      const raw = seg.bytes.subarray(base + P["name"]!, base + P["name"]! + 24);
      const end = raw.indexOf(0);
      const stuck = state === "ACTIVE" && heartbeatAgeMs > stuckAfter;
      out.push({
        slot,
        pid,
        name: Buffer.from(raw.subarray(0, end < 0 ? raw.length : end)).toString("utf8"),
        role: seg.dv.getUint32(base + P["role"]!, true),
        state,
        heartbeatAgeMs,
        beats: seg.dv.getBigUint64(base + P["beats"]!, true),
        errorCode: seg.dv.getUint32(base + P["error_code"]!, true),
        stuck,
        healthy: (state === "ACTIVE" || state === "CLOSED") && !stuck,
      });
    }
    return out;
  }

  /** Members that died, got stuck, or flagged an error. */
  problems(): MemberStatus[] {
    return this.members().filter((m) => !m.healthy);
  }

  /** Unmap; the creator also marks the block CLOSED (waking `waitStop`) and unlinks. Every other
   * method (and its members') then throws ChannelClosedError. */
  close(): void {
    if (this.segment.owner && !this.segment.closed) this.segment.futexWake(C["stop"]!);
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
      this.control.stop(this.slot + 1);
    }
  }

  /** Leave cleanly (CLOSED unless an error was flagged); a no-op once the run control was
   * closed (like `close()`). */
  leave(): void {
    const seg = this.control.segment;
    if (seg.closed) return;
    Atomics.compareExchange(seg.i32, (this.base + P["state"]!) >> 2, PeerState.ACTIVE, PeerState.CLOSED);
  }
}
