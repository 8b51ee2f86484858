/**
 * A server's watch over its own region (docs/shm.md "A region changed under its server"; the
 * Python twin is transport/backends/shm/watch.py, same rules and texts).
 *
 * Another same-uid process can truncate, resize, remove or scribble on a live segment. The
 * server's wait loop only reads the doorbell and the state word, so before this watch an idle
 * server kept running while every new client was refused. Every `WATCH_PERIOD_MS` (idle or
 * busy: one `performance.now()` per loop turn, one `stat` per period) the server asks:
 *
 * - `lost()`: is /dev/shm/transport-NAME still this server's inode, at the size it created?
 *   Checked before anything past the first page is read: a Node process that touches a page a
 *   truncation removed dies of SIGBUS, so a shrunk region is never touched again.
 * - `repair()`: do the control block fields the server wrote once (magic, version, num_envs,
 *   obs/act/slot sizes, fingerprint, owner pid and start time) and the schema area still hold
 *   what it wrote? If not, it rewrites them and says which changed (one line).
 * - `foreignHolder()`: is the live process in `client_pid` a client? A client maps the region
 *   before it takes the lease and stores `client_start_time` right after; a live process that
 *   does not map it (at two looks in a row), or whose lease stays incomplete for
 *   `UNFINISHED_LEASE_MS`, is not one.
 */

import { readFileSync, statSync } from "node:fs";
import { CB, type Region, SHM_DIR } from "./region";

/** How often a server checks its region (idle or busy). */
export const WATCH_PERIOD_MS = 250;
/** How long a live `client_pid` may keep `client_start_time` 0 (a lease being taken). */
export const UNFINISHED_LEASE_MS = 1000;

/** The control block fields a server writes once, before READY. */
export const CONTROL_FIELDS: readonly string[] = [
  "magic",
  "version",
  "num_envs",
  "obs_size",
  "act_size",
  "slot_size",
  "fingerprint",
  "owner_pid",
  "owner_start_time",
];

const HEX_FIELDS: Readonly<Record<string, number>> = { magic: 8, fingerprint: 16 };

function show(field: string, value: bigint): string {
  const width = HEX_FIELDS[field];
  return width === undefined ? value.toString() : `0x${value.toString(16).toUpperCase().padStart(width, "0")}`;
}

/** A control block field (u32 or u64) as a bigint. */
export function readField(region: Region, field: string): bigint {
  const f = CB[field];
  if (f === undefined) throw new RangeError(`the control block has no field ${field}`);
  return f.size === 8 ? region.dv.getBigUint64(f.offset, true) : BigInt(region.dv.getUint32(f.offset, true));
}

function writeField(region: Region, field: string, value: bigint): void {
  const f = CB[field];
  if (f === undefined) throw new RangeError(`the control block has no field ${field}`);
  if (f.size === 8) region.dv.setBigUint64(f.offset, value, true);
  else region.dv.setUint32(f.offset, Number(value), true);
}

/** Does process `pid` map the /dev/shm file of `inode`? null: its maps cannot be read. */
export function mapsSegment(pid: number, inode: number): boolean | null {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/maps`, "latin1");
  } catch {
    return null;
  }
  const ino = String(inode);
  if (!text.includes(ino)) return false; // the common answer for a process that does not map it
  const prefix = `${SHM_DIR}/`;
  for (const line of text.split("\n")) {
    const parts = line.trim().split(/\s+/); // address perms offset dev inode path
    if (parts.length >= 6 && parts[4] === ino && (parts[5] as string).startsWith(prefix)) return true;
  }
  return false;
}

/** Why the server must stop, and how much of its mapping may still be touched. */
export interface RegionLoss {
  readonly reason: string;
  /** Bytes from the start of the mapping still backed by the segment (the region's size unless
   * it was truncated): touching a page past them is a SIGBUS. */
  readonly backed: number;
}

/** What a server checks about its own region; see the module comment. */
export class RegionWatch {
  readonly #url: string;
  readonly #path: string;
  readonly #region: Region;
  readonly #fields: ReadonlyArray<readonly [string, bigint]>;
  readonly #area: Uint8Array;
  readonly #areaAt: number;
  #nextAt: number;
  #verified: string | null = null;
  #seenPid = 0;
  /** Since when (performance.now()) the holder has been attaching (start time 0). */
  #zeroSince: number | null = null;
  /** The last look found the holder not mapping the segment. */
  #unmapped = false;

  /** Call once the server has written every field of `CONTROL_FIELDS` and the schema area. */
  constructor(url: string, region: Region, area: Uint8Array) {
    this.#url = url;
    this.#path = region.shm.path;
    this.#region = region;
    this.#fields = CONTROL_FIELDS.map((field) => [field, readField(region, field)] as const);
    this.#area = area;
    this.#areaAt = region.size - area.byteLength;
    this.#nextAt = performance.now() + WATCH_PERIOD_MS;
  }

  /** True once per period. */
  due(now: number): boolean {
    if (now < this.#nextAt) return false;
    this.#nextAt = now + WATCH_PERIOD_MS;
    return true;
  }

  /** Why the server cannot keep serving this region (gone, replaced, resized), or null. */
  lost(): RegionLoss | null {
    const url = this.#url;
    const path = this.#path;
    const where = `while this server (pid ${process.pid}) was serving`;
    let size: number;
    let ino: number;
    try {
      ({ size, ino } = statSync(path));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") return null; // cannot tell now
      return { reason: `${url}: another process removed ${path} ${where}; the server stops (new clients cannot find the region)`, backed: this.#region.size };
    }
    if (ino !== this.#region.inode) {
      return {
        reason: `${url}: another process replaced ${path} with another segment ${where}; the server stops and leaves that segment alone`,
        backed: this.#region.size,
      };
    }
    const was = this.#region.size;
    if (size !== was) {
      const what = size < was ? "truncated" : "resized";
      return {
        reason: `${url}: another process ${what} ${path} (now ${size} bytes, was ${was}) ${where}; the server stops and removes it`,
        backed: Math.min(size, was),
      };
    }
    return null;
  }

  /** Rewrite the control block fields and the schema area another process changed, and say
   * which (one line). Only after `lost()` found the size intact. */
  repair(): void {
    const region = this.#region;
    const changed: string[] = [];
    for (const [field, wrote] of this.#fields) {
      const found = readField(region, field);
      if (found !== wrote) {
        writeField(region, field, wrote);
        changed.push(`control block field ${field} was changed to ${show(field, found)} (this server wrote ${show(field, wrote)})`);
      }
    }
    const area = this.#area;
    if (area.byteLength > 0 && Buffer.compare(region.bytes.subarray(this.#areaAt, region.size), area) !== 0) {
      region.bytes.set(area, this.#areaAt);
      changed.push("the schema area was changed");
    }
    if (changed.length > 0) {
      process.stderr.write(`transport: ${this.#url}: ${changed.join("; ")} by another process; the server rewrote it\n`);
    }
  }

  /** Why the live process `pid` in `client_pid` (with `client_start_time`) holds no real
   * lease, or null (a client, or it cannot be told yet). "Does not map" must hold at two looks
   * in a row (the words a look read may be stale). "Still 0 for a second" means seen
   * attaching at every look for a second: any look that finds a completed lease (even one
   * verified before: the same process takes the lease again with the same pid and start time)
   * ends that attach, so the next attach is timed from its own first look, not an earlier
   * client's. */
  foreignHolder(pid: number, startTime: bigint): string | null {
    if (startTime !== 0n) this.#zeroSince = null; // a completed lease: any attach seen before is over
    const key = `${pid}/${startTime}`;
    if (this.#verified === key) return null;
    const now = performance.now();
    if (pid !== this.#seenPid) {
      this.#seenPid = pid;
      this.#zeroSince = null;
      // told at the next look if it still holds no mapping
      this.#unmapped = mapsSegment(pid, this.#region.inode) === false;
      if (this.#unmapped) return null;
    } else if (this.#unmapped) {
      // at two looks in a row: one look's words may be stale (read before this server stalled),
      // and the same process, unmapped between a release and its next attach, then holds the
      // lease again with the same pid and start time
      if (mapsSegment(pid, this.#region.inode) === false) {
        return (
          `${this.#url}: client pid ${pid} is alive but does not map ${this.#path}: it is not a client ` +
          "(another process wrote client_pid); reclaiming the lease"
        );
      }
      this.#unmapped = false;
    }
    if (startTime === 0n) {
      // measured from the first check that saw this holder attaching, not from when the pid was
      // first seen: the same process may release and take the lease again
      this.#zeroSince ??= now;
      if (now - this.#zeroSince < UNFINISHED_LEASE_MS) return null;
      return (
        `${this.#url}: client pid ${pid} never completed taking the lease ` +
        `(client_start_time still 0 after ${UNFINISHED_LEASE_MS / 1000} s); reclaiming the lease`
      );
    }
    this.#verified = key;
    return null;
  }

  /** The lease was reclaimed or released: the next holder is looked at afresh. */
  forget(): void {
    this.#verified = null;
    this.#seenPid = 0;
    this.#zeroSince = null;
    this.#unmapped = false;
  }
}
