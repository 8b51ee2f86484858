/**
 * The pid leases of the channels (Python: transport/channels/lease.py, docs/channels.md
 * "Leases"): a u32 pid word taken by compare-and-swap, beside the holder's start time.
 *
 * Taking one: CAS the word from the value read to `pid | CLAIMING`, write the holder's fields
 * (its start time first), then store the plain pid. While CLAIMING is set the start time is not
 * written yet, so the holder is alive while that pid runs: no third process judges it dead in
 * the gap and takes the lease too.
 */

import { peerAlive, procStartTime } from "./native";

/** Set in a lease word while its new holder writes its start time (pids are below 2^22). */
export const CLAIMING = 0x8000_0000;
const PID_MASK = 0x7fff_ffff;

/** The pid a lease word names (0: free); `word` as an unsigned 32-bit value. */
export function holder(word: number): number {
  return (word & PID_MASK) >>> 0;
}

/** The lease's holder runs: its pid and start time, or only the pid while it is being taken. */
export function holderAlive(word: number, startTime: bigint): boolean {
  if ((word & CLAIMING) !== 0) return peerAlive(holder(word), 0n);
  return word !== 0 && peerAlive(word >>> 0, startTime);
}

/** Take the lease word at `index` of `i32` from the value `seen` (free or a dead holder's):
 * false when another process changed it first. `fill(startTime)` writes the holder's fields
 * before the word shows this process as the holder. */
export function takeLease(i32: Int32Array, index: number, seen: number, fill: (startTime: bigint) => void): boolean {
  const claiming = (process.pid | CLAIMING) | 0;
  if (Atomics.compareExchange(i32, index, seen | 0, claiming) !== (seen | 0)) return false;
  fill(procStartTime(process.pid));
  Atomics.store(i32, index, process.pid);
  return true;
}
