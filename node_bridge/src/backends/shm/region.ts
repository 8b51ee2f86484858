/**
 * The shm:// region (docs/shm.md; the Python twin is transport/backends/shm/region.py). Every
 * offset comes from the schema's IR `shm` section (the compiler's output): `ShmLayout.of(schema)`
 * reads the control block (`ShmControl`, the same 64 bytes in every layout), the slot
 * (`ShmSlot`: named control words, the request and result fields at `request_offsets` /
 * `result_offsets`), and the final area (`ShmFinal`: `final_seq`, the result at
 * `final_result_offsets`). pac_env's profile is seed 000 Appendix B byte for byte; other schemas
 * get the derived cache-line layout. The generated module carries the diagram (`SHM_LAYOUT`).
 *
 *     region = ShmControl, then k x ShmSlot, then k x ShmFinal     (k >= num_envs)
 *              [then the columns: the column layout only]
 *              then the schema area (the IR the region's schema compiles to: discovery)
 *
 * The column layout (`[env] shm = "columns"`, IR `shm.layout`): the slot holds only control
 * words and text areas; each request / result field of all k envs is one contiguous column after
 * the final areas (ir.ts `shmColumns`: 64-byte aligned, env i at `start + i * field.size`).
 *
 * Futex words carry a 31-bit sequence; bit 31 (SLEEP) means "a waiter may sleep on this word".
 */

import { fstatSync, readFileSync, readSync, statSync, statfsSync } from "node:fs";
import * as zlib from "node:zlib";
import type { SchemaModule } from "../../codec";
import { schemaIrText } from "../../protocol";
import { ConnectError, ProtocolError } from "../../errors";
import { singleParams } from "../url_params";
import * as pac_shm from "../../generated/pac_shm";
import * as protocol from "../../generated/protocol";
import { COLUMNS, type FieldJson, type ShmColumn, type ShmJson, controlSizes, shmColumns } from "../../ir";
import { ownedMappingBuffer, releaseMapping } from "../../mapping_lifetime";
// the one rule for what is not a segment, shared with the channels (channel.ts imports it here)
import { checkSegmentFd, checkSegmentPath, peekSegment } from "../../shm_segment";
export { checkSegmentFd, checkSegmentPath, fileKind, notASegment, openSegmentForReading } from "../../shm_segment";
import { EEXIST, ENOENT, O_CLOEXEC, O_CREAT, O_EXCL, O_RDWR, native } from "./native";

export const MAGIC = 0x50414354; // "PACT"
/** A region's side segment (side.ts): its owner at the control block's offsets. */
export const SIDE_MAGIC = 0x4f464e49; // "INFO"
/** The region protocol's version (control block `version`); layouts differ by fingerprint. */
export const LAYOUT_VERSION: number = pac_shm.IR.version;
export const PREFIX = "transport-";
export const SHM_DIR = "/dev/shm";
export const SEQ_MASK = 0x7fffffff;
export const SLEEP_BIT = 0x80000000;
/** Seconds a header-less segment may take to be initialised before it counts as stale. */
export const STALE_CREATING_AFTER_S = 10;
/** Names of the channels' segments (/dev/shm/transport-ring-*, ...): no region is called so. */
export const CHANNEL_PREFIXES: readonly string[] = ["ring-", "board-", "control-"];
export const RegionState = protocol.RegionState;
export const SlotCommand = protocol.SlotCommand;

function fieldsOf(schema: { readonly ir: { readonly structs: Readonly<Record<string, { readonly fields: readonly FieldJson[] }>> } }, struct: string): Readonly<Record<string, FieldJson>> {
  const ir = schema.ir.structs[struct];
  if (ir === undefined) throw new ProtocolError(`the schema has no struct ${struct}`);
  const out: Record<string, FieldJson> = {};
  for (const f of ir.fields) out[f.name] = f;
  return out;
}

/** ShmControl fields by name: the same offsets in every layout (the protocol's envelope). */
export const CB = fieldsOf(protocol.SCHEMA, "ShmControl");
export const CONTROL_SIZE: number = protocol.SCHEMA.ir.structs["ShmControl"]!.size; // 64

export function off(fields: Readonly<Record<string, FieldJson>>, name: string): number {
  const f = fields[name];
  if (f === undefined) throw new ProtocolError(`the shm layout has no field ${name}`);
  return f.offset;
}

/**
 * Byte of final area 0 that holds the RECV wake hint (docs/shm.md "One wake per RECV"): u32,
 * written by the client before a RECV sleeps, `in flight - want + 1` (0: no hint, wake me on
 * every publish); a server wakes the client only once fewer than that many of its envs are
 * unanswered.
 */
export const RECV_HINT_AT = 4;

/** A schema's region layout, from its IR `shm` section. */
export class ShmLayout {
  readonly schema: SchemaModule;
  readonly ir: ShmJson;
  readonly slotSize: number;
  readonly finalSize: number;
  /** ShmSlot fields by name (control words, request and result fields, error_text, info). */
  readonly slot: Readonly<Record<string, FieldJson>>;
  readonly finalSeqAt: number;
  readonly errorTextMax: number;
  readonly infoMax: number;
  /** The control block's obs_size / act_size (`controlSizes` of the result struct). */
  readonly obsSize: number;
  readonly actSize: number;
  /** The slot's `checksum` word and its result bytes [start, end): what ?checksum=crc32 covers. */
  readonly checksumAt: number;
  readonly resultSpan: readonly [number, number];
  /** The column layout: request and result fields in columns after the final areas. */
  readonly columns: boolean;
  readonly #columnsOf = new Map<number, { readonly columns: readonly ShmColumn[]; readonly size: number }>();

  private constructor(schema: SchemaModule, ir: ShmJson) {
    this.schema = schema;
    this.ir = ir;
    const structs = schema.ir.structs;
    this.slotSize = structs[ir.slot]!.size;
    this.finalSize = structs[ir.final]!.size;
    this.slot = fieldsOf(schema, ir.slot);
    this.finalSeqAt = off(fieldsOf(schema, ir.final), "final_seq");
    this.errorTextMax = this.slot["error_text"]!.count;
    this.infoMax = this.slot["info"]!.count;
    const resultName = schema.ir.env?.result ?? schema.messages["STEP_RESP"]?.body ?? "";
    const fields = structs[resultName]?.fields ?? [];
    [this.obsSize, this.actSize] = controlSizes(structs[resultName]);
    this.checksumAt = off(this.slot, "checksum");
    this.columns = ir.layout === COLUMNS;
    const at = fields.map((f) => ir.result_offsets[f.name] ?? 0);
    this.resultSpan = this.columns ? [0, 0] : [Math.min(...at), Math.max(...fields.map((f, i) => (at[i] as number) + f.size))];
  }

  /** The columns of a column-layout region of `k` slots and its size without the schema area
   * (ir.ts `shmColumns`, kept per k). A slot layout has none. */
  columnsOf(k: number): { readonly columns: readonly ShmColumn[]; readonly size: number } {
    let found = this.#columnsOf.get(k);
    if (found === undefined) {
      found = this.columns ? shmColumns(this.schema.ir, k) : { columns: [], size: this.slotsSize(k) + k * this.finalSize };
      this.#columnsOf.set(k, found);
    }
    return found;
  }

  static #cache = new WeakMap<SchemaModule, ShmLayout>();

  /** The layout of `schema`; a schema without an `[env]` table cannot ride shm://. */
  static of(schema: SchemaModule): ShmLayout {
    let layout = ShmLayout.#cache.get(schema);
    if (layout === undefined) {
      const ir = schema.ir.shm;
      if (ir === undefined) {
        throw new ProtocolError(`schema ${schema.name} has no shm layout (declare an [env] table: docs/schema.md)`);
      }
      layout = new ShmLayout(schema, ir);
      ShmLayout.#cache.set(schema, layout);
    }
    return layout;
  }

  /** Byte offset of slot `index`. */
  slotBase(index: number): number {
    return CONTROL_SIZE + index * this.slotSize;
  }

  /** Bytes of the control block and `k` slots (a region without final areas). */
  slotsSize(k: number): number {
    return CONTROL_SIZE + k * this.slotSize;
  }

  /**
   * Where the RECV wake hint word lies in a region of `k` slots (docs/shm.md "One wake per
   * RECV"): the u32 at byte RECV_HINT_AT of final area 0, which every built-in layout leaves
   * free; null when a profile puts a field there (no hint: the client is woken per publish).
   * The same rule as Python's `ShmLayout.recv_hint_offset`.
   */
  recvHintOffset(k: number): number | null {
    const at = RECV_HINT_AT;
    const end = at + 4;
    if (this.finalSize < end) return null;
    for (const f of this.schema.ir.structs[this.ir.final]?.fields ?? []) {
      if (f.offset < end && f.offset + f.size > at) return null;
    }
    return this.finalsOffset(k) + at;
  }

  /** Where final area 0 starts: right after the last of `k` slots. */
  finalsOffset(k: number): number {
    return this.slotsSize(k);
  }

  /** The segment size: control block, k slots, k final areas (the column layout: its columns). */
  regionSize(k: number): number {
    if (this.columns) return this.columnsOf(k).size;
    return this.slotsSize(k) + k * this.finalSize;
  }

  /** The slot count of a segment of `size` bytes (null when no count fits). A column region's
   * is the k whose `regionSize(k)` is `size` exactly (it grows with k: at most one). */
  slotsIn(size: number): number | null {
    if (this.columns) {
      const perSlot = this.slotSize + this.finalSize;
      if (!Number.isSafeInteger(size) || size < CONTROL_SIZE + perSlot) return null;
      const most = Math.floor((size - CONTROL_SIZE) / perSlot);
      let lo = 1;
      let hi = most;
      while (lo <= hi) {
        const k = (lo + hi) >> 1;
        const got = this.regionSize(k);
        if (got === size) return k;
        if (got < size) lo = k + 1;
        else hi = k - 1;
      }
      return null;
    }
    const k = (size - CONTROL_SIZE) / (this.slotSize + this.finalSize);
    if (Number.isInteger(k) && k >= 1) return k;
    const bare = (size - CONTROL_SIZE) / this.slotSize; // a server without final areas
    return Number.isInteger(bare) && bare >= 1 ? bare : null;
  }
}

// -- wait policy and URLs ------------------------------------------------------------------------

/** `spin` busy iterations (counted like the C loop's PAUSEs, ~25 ns each), then futex slices. */
export interface WaitPolicy {
  readonly spin: number;
  readonly futexSliceMs: number;
}

export const WAIT_PRESETS: Readonly<Record<string, WaitPolicy>> = {
  spin: { spin: 2_000_000, futexSliceMs: 50 },
  balanced: { spin: 20_000, futexSliceMs: 50 },
  futex: { spin: 0, futexSliceMs: 50 },
};

export interface ShmUrl {
  readonly name: string;
  readonly numEnvs: number | null;
  readonly wait: WaitPolicy;
  /** `crc32`: the server writes, the client checks, a CRC-32 of every slot's result bytes. */
  readonly checksum: string | null;
  /** The shm_open name: `/transport-<name>`. */
  readonly segment: string;
  /** `/dev/shm/transport-<name>`. */
  readonly path: string;
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$/;

/** The optional per-slot checksums (docs/shm.md, "What the zero-copy contract cannot protect"). */
export const CHECKSUMS: readonly string[] = ["crc32"];

/**
 * `?checksum=crc32`: the server stamps each slot's `checksum` word with a CRC-32 of env i's
 * result bytes before it publishes, the client checks it after the response word: the slot's
 * result span, or (column layout) CRC-32 chained over env i's value in each result column in
 * declaration order (crc = crc32(value, crc), from 0: the spec both languages follow).
 */
export class SlotChecksums {
  readonly #region: Region;
  /** Per slot, the byte runs its checksum covers, in order. */
  readonly #spans: Uint8Array[][];
  readonly #crc32: (data: Uint8Array, value?: number) => number;

  constructor(region: Region) {
    const crc32 = (zlib as unknown as { crc32?: (data: Uint8Array, value?: number) => number }).crc32;
    if (typeof crc32 !== "function") {
      throw new ConnectError("?checksum=crc32 needs zlib.crc32 (Node.js 20.15 or later)");
    }
    this.#crc32 = crc32;
    const [lo, hi] = region.layout.resultSpan;
    const columns = region.layout.columnsOf(region.numSlots).columns.filter((c) => c.part === "result"); // declaration order
    this.#region = region;
    this.#spans = Array.from({ length: region.numSlots }, (_, i) => {
      if (region.layout.columns) {
        return columns.map((c) => {
          const at = c.start + i * c.field.size;
          return region.bytes.subarray(at, at + c.field.size);
        });
      }
      const base = region.layout.slotBase(i);
      return [region.bytes.subarray(base + lo, base + hi)];
    });
  }

  /** Slot `index`'s checksum of its result bytes as they are now. */
  sum(index: number): number {
    const spans = this.#spans[index] as Uint8Array[];
    let crc = 0;
    for (let k = 0; k < spans.length; k++) crc = this.#crc32(spans[k] as Uint8Array, crc);
    return crc;
  }

  stamp(index: number): void {
    const at = this.#region.layout.slotBase(index) + this.#region.layout.checksumAt;
    this.#region.dv.setUint32(at, this.sum(index), true);
  }

  /** Slot `index`'s result bytes match the word its server wrote. */
  ok(index: number): boolean {
    const { dv, layout } = this.#region;
    return this.sum(index) === dv.getUint32(layout.slotBase(index) + layout.checksumAt, true);
  }

  /** The first of slots 0..count-1 whose result bytes do not match their word, or -1. */
  firstBad(count: number): number {
    for (let i = 0; i < count; i++) if (!this.ok(i)) return i;
    return -1;
  }
}

/** True when an shm URL's query names a wait policy (`wait` or `spin`): it is then followed as
 * given, never replaced by the default chosen for envs in worker threads. */
export function namesWaitPolicy(url: string): boolean {
  const query = url.includes("?") ? url.slice(url.indexOf("?") + 1) : "";
  return query.split("&").some((item) => ["wait", "spin"].includes(item.split("=")[0] ?? ""));
}

/** `shm://name?num_envs=N&wait=balanced|spin|futex&spin=K&slice_ms=M&checksum=crc32`. */
export function parseShmUrl(url: string): ShmUrl {
  const sep = url.indexOf("://");
  if (sep < 0 || url.slice(0, sep).toLowerCase() !== "shm") {
    throw new ConnectError(`${JSON.stringify(url)} is not an shm:// URL`);
  }
  const rest = url.slice(sep + 3);
  const q = rest.indexOf("?");
  const name = (q < 0 ? rest : rest.slice(0, q)).replace(/^\/+|\/+$/g, "");
  const query = q < 0 ? "" : rest.slice(q + 1);
  if (!NAME.test(name)) {
    throw new ConnectError(
      `${JSON.stringify(url)}: the region name must be 1-201 characters of A-Z a-z 0-9 . _ -, the ` +
        "first a letter or a digit (it becomes /dev/shm/transport-<name>)",
    );
  }
  if (CHANNEL_PREFIXES.some((p) => name.startsWith(p))) {
    throw new ConnectError(
      `${JSON.stringify(url)}: region names beginning ${CHANNEL_PREFIXES.slice(0, -1).join(", ")} or ` +
        `${CHANNEL_PREFIXES[CHANNEL_PREFIXES.length - 1]} are reserved for channels (/dev/shm/${PREFIX}${name} is a ` +
        "channel's segment: python -m transport.channels --list)",
    );
  }
  // URLSearchParams drops one leading "?" ("shm://x??num_envs=2"): Python's parse_qsl keeps it
  // in the key ("?num_envs", an unknown parameter), and so does this
  const params = singleParams(url, query.startsWith("?") ? `&${query}` : query); // none twice
  const unknown = [...new Set(params.keys())].filter((k) => !["num_envs", "wait", "spin", "slice_ms", "checksum"].includes(k));
  if (unknown.length > 0) {
    throw new ConnectError(`${JSON.stringify(url)}: unknown parameter(s) ${unknown.sort().join(", ")}`);
  }
  const bad = (why: string): never => {
    throw new ConnectError(`${JSON.stringify(url)}: bad parameter value (${why})`);
  };
  let numEnvs: number | null = null;
  const n = params.get("num_envs") ?? null;
  if (n !== null) {
    if (!/^[+-]?[0-9]+$/.test(n.trim())) bad(`num_envs ${JSON.stringify(n)} is not an integer`);
    if (Number(n) < 1) bad("num_envs must be >= 1");
    numEnvs = Number(n);
  }
  const preset = params.get("wait") ?? "balanced";
  let wait = WAIT_PRESETS[preset];
  if (wait === undefined || !Object.prototype.hasOwnProperty.call(WAIT_PRESETS, preset)) {
    return bad(`unknown wait policy ${JSON.stringify(preset)} (known: ${Object.keys(WAIT_PRESETS).sort().join(", ")})`);
  }
  const spin = params.get("spin") ?? null;
  const slice = params.get("slice_ms") ?? null;
  if (spin !== null || slice !== null) {
    const s = spin === null ? wait.spin : Number(spin);
    const m = slice === null ? wait.futexSliceMs : Number(slice);
    if (!Number.isInteger(s) || s < 0) bad(`spin must be a non-negative integer, got ${JSON.stringify(spin)}`);
    if (!Number.isFinite(m) || m <= 0) bad(`slice_ms must be a positive number, got ${JSON.stringify(slice)}`);
    wait = { spin: s, futexSliceMs: m };
  }
  const checksum = params.get("checksum") ?? null;
  if (checksum !== null && !CHECKSUMS.includes(checksum)) {
    throw new ConnectError(
      `${JSON.stringify(url)}: unknown checksum ${JSON.stringify(checksum)} (known: ${CHECKSUMS.join(", ")})`,
    );
  }
  return { name, numEnvs, wait, checksum, segment: `/${PREFIX}${name}`, path: `${SHM_DIR}/${PREFIX}${name}` };
}

// -- liveness ----------------------------------------------------------------------------------

/** Field 22 (starttime) of /proc/<pid>/stat; 0 if the process is gone or a zombie (Z, X). */
export function procStartTime(pid: number): bigint {
  if (!Number.isInteger(pid) || pid <= 0) return 0n;
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "latin1");
  } catch {
    return 0n;
  }
  const close = text.lastIndexOf(")"); // the command name may hold spaces and parentheses
  if (close < 0 || text[close + 1] !== " ") return 0n;
  const fields = text.slice(close + 2).split(" "); // fields[0] is field 3 (state)
  const state = fields[0];
  if (state === "Z" || state === "X" || state === "x") return 0n;
  const start = fields[22 - 3];
  if (start === undefined || !/^[0-9]+$/.test(start)) return 0n;
  return BigInt(start);
}

/** pid runs (not a zombie) and, when `startTime` is not 0, is the process that started then. */
export function peerAlive(pid: number, startTime: bigint = 0n): boolean {
  if (pid === 0) return false;
  const found = procStartTime(pid);
  if (found === 0n) return false;
  return startTime === 0n || found === startTime;
}

/** Bytes free for an unprivileged writer in /dev/shm; -1 if unknown. */
export function freeShmBytes(): number {
  try {
    const st = statfsSync(SHM_DIR);
    return st.bavail * st.bsize;
  } catch {
    return -1;
  }
}

export function noRoomMessage(path: string, size: number, numEnvs: number, free: number, why: string): string {
  return (
    `cannot create ${path} (${size} bytes for ${numEnvs} envs): ${why}; /dev/shm has ${free} ` +
    "bytes free. Enlarge /dev/shm (docker run --shm-size=1g, or mount -o remount,size=2G " +
    "/dev/shm), remove stale regions (transport-serve --cleanup-shm) or serve fewer envs"
  );
}

// -- the schema area: the region carries its schema (discovery; Python: region.py) ---------------
//
//   ... k final areas | IR JSON (utf-8) | zero padding | trailer (the segment's last 16 bytes):
//                     ^ regionSize(k)                   u32 magic "SCIR", u32 ir_len, 8 zero bytes
//
// A multiple of 64 bytes that ends the segment: a client with no schema finds it from the segment
// size alone, loads the IR and checks it against the control block's fingerprint first.

export const SCHEMA_MAGIC = 0x52494353; // "SCIR"
export const SCHEMA_TRAILER_SIZE = 16;
const SCHEMA_AREA_ALIGN = 64;

function schemaAreaSize(irLength: number): number {
  return Math.ceil((irLength + SCHEMA_TRAILER_SIZE) / SCHEMA_AREA_ALIGN) * SCHEMA_AREA_ALIGN;
}

/** The schema area of a region of `schema`: its IR JSON, padding, the trailer. */
export function schemaArea(schema: SchemaModule): Buffer {
  const text = Buffer.from(schemaIrText(schema), "utf8");
  const area = Buffer.alloc(schemaAreaSize(text.byteLength));
  text.copy(area, 0);
  area.writeUInt32LE(SCHEMA_MAGIC, area.byteLength - SCHEMA_TRAILER_SIZE);
  area.writeUInt32LE(text.byteLength, area.byteLength - SCHEMA_TRAILER_SIZE + 4);
  return area;
}

/** (area size, IR JSON text) of a segment of `size` bytes read through `read(offset, length)`;
 * `{ size: 0, ir: null }` for a segment without a schema area. */
export function schemaAreaOf(read: (offset: number, length: number) => Uint8Array, size: number): { size: number; ir: string | null } {
  if (size < CONTROL_SIZE + SCHEMA_TRAILER_SIZE) return { size: 0, ir: null };
  const trailer = Buffer.from(read(size - SCHEMA_TRAILER_SIZE, SCHEMA_TRAILER_SIZE));
  const length = trailer.readUInt32LE(4);
  const area = schemaAreaSize(length);
  if (trailer.readUInt32LE(0) !== SCHEMA_MAGIC || area > size - CONTROL_SIZE) return { size: 0, ir: null };
  return { size: area, ir: Buffer.from(read(size - area, length)).toString("utf8") };
}

/** `schemaAreaOf` of an open segment file descriptor (pread: nothing but the area is read). */
export function schemaAreaOfFd(fd: number, size: number): { size: number; ir: string | null } {
  return schemaAreaOf((offset, length) => {
    const out = Buffer.alloc(length);
    readSync(fd, out, 0, length, offset);
    return out;
  }, size);
}

/** Refuse before anything is created when /dev/shm cannot hold `numSlots` slots of `layout`. */
export function checkRoom(shm: ShmUrl, layout: ShmLayout, numSlots: number): void {
  const size = layout.regionSize(numSlots) + schemaArea(layout.schema).byteLength;
  const free = freeShmBytes();
  if (free >= 0 && free < size) throw new ConnectError(noRoomMessage(shm.path, size, numSlots, free, "no space"));
}

// -- inspection of an existing segment -----------------------------------------------------------

/**
 * One /dev/shm/transport-* entry as a server on its name sees it (Python: region.py RegionInfo).
 * kind: "region" / "side" (their header says so), "empty" (shorter than a control block or an
 * all-zero one: a server between shm_open and its first header write, for up to 10 s),
 * "foreign" (anything else), "unreadable", "not-a-file" (`note`: "a directory", ...). Only a
 * region or side segment whose owner is dead (or that got no owner in 10 s) is stale.
 */
export interface SegmentInfo {
  readonly path: string;
  readonly kind: "region" | "side" | "empty" | "foreign" | "unreadable" | "not-a-file";
  readonly note: string;
  readonly size: number;
  readonly magicOk: boolean;
  readonly ownerPid: number;
  readonly ownerAlive: boolean;
  readonly state: number;
  readonly ageS: number;
  /** Replaceable: a header of ours whose owner is dead (never a segment without the magic). */
  readonly stale: boolean;
}

/** Read a segment's control block with plain file I/O, without blocking on a FIFO or following
 * a link (region.py `inspect_segment`). */
export function inspectSegment(path: string): SegmentInfo {
  const peek = peekSegment(path, CONTROL_SIZE);
  const st = peek.st;
  const ageS = Math.max(0, (Date.now() - st.mtimeMs) / 1000);
  const other = (kind: SegmentInfo["kind"], note = ""): SegmentInfo => ({
    path, kind, note, size: st.size, magicOk: false, ownerPid: 0, ownerAlive: false, state: -1, ageS, stale: false,
  });
  if (peek.what === "not-a-file") return other("not-a-file", peek.note);
  if (peek.what === "unreadable") return other("unreadable", peek.note);
  const header = peek.head;
  const got = header.byteLength;
  if (got < CONTROL_SIZE || header.every((b) => b === 0)) return other("empty");
  const magic = header.readUInt32LE(off(CB, "magic"));
  const magicOk = magic === MAGIC;
  if (!magicOk && magic !== SIDE_MAGIC) return other("foreign");
  const ownerPid = header.readUInt32LE(off(CB, "owner_pid"));
  const start = header.readBigUInt64LE(off(CB, "owner_start_time"));
  const ownerAlive = ownerPid !== 0 && peerAlive(ownerPid, start);
  const stale = ownerPid !== 0 ? !ownerAlive : ageS > STALE_CREATING_AFTER_S;
  return {
    path, kind: magicOk ? "region" : "side", note: "", size: st.size, magicOk, ownerPid, ownerAlive,
    state: header.readUInt32LE(off(CB, "state")), ageS, stale,
  };
}

/** Why a server on `url` cannot replace this segment (it is not stale): region.py's words. */
export function segmentRefusal(info: SegmentInfo, url: string): string {
  switch (info.kind) {
    case "unreadable":
      return `${url}: ${info.path} cannot be read (${info.note}); it is not replaced`;
    case "not-a-file":
      return `${url}: ${info.path} is ${info.note}, not a shared-memory segment: remove it if nothing uses it`;
    case "foreign":
      return `${url}: ${info.path} exists and is not a transport region: remove it if nothing uses it`;
    case "empty":
      if (info.ageS > STALE_CREATING_AFTER_S) {
        return `${url}: ${info.path} exists and is not a transport region: remove it if nothing uses it`;
      }
      break;
    default:
      if (info.ownerAlive) return `${url} is in use by a live server (pid ${info.ownerPid}); ${info.path} is not replaced`;
  }
  return `${url} is in use by a live server (a server starting up); ${info.path} is not replaced`;
}

/** No segment of that name (yet): a client waits for it, up to its timeout. */
export class SegmentMissingError extends ConnectError {
  constructor(shm: ShmUrl) {
    super(`no region ${shm.path}: is a server running on shm://${shm.name}?`);
  }
}

// -- the mapped region ---------------------------------------------------------------------------


/**
 * A mapped segment. `bytes`, `dv` and `words` view the mapping itself (koffi.view: no copy), and
 * every typed array made of them (the client's zero-copy results) shares their one ArrayBuffer.
 * That buffer owns the mapping: it is unmapped once the buffer is collected, never before, so no
 * view ever points at unmapped memory (docs/shm.md, "Lifetimes").
 */
export class Region {
  readonly shm: ShmUrl;
  readonly layout: ShmLayout;
  readonly size: number;
  /** Slots (and final areas) in the region: k >= num_envs. */
  readonly numSlots: number;
  readonly inode: number;
  readonly address: bigint;
  /** The mapping's address as a Number (user-space addresses fit in 53 bits). */
  readonly base: number;
  readonly bytes: Uint8Array;
  readonly dv: DataView;
  /** 32-bit words of the whole mapping, for Atomics (offset / 4). */
  readonly words: Int32Array;
  /** The IR JSON of the region's schema area (an attaching client; null: none or not read). */
  schemaIr: string | null = null;
  /** The column layout's request / result columns by field name (empty for a slot layout). */
  readonly requestColumns: Readonly<Record<string, ShmColumn>>;
  readonly resultColumns: Readonly<Record<string, ShmColumn>>;
  #mapped = true;

  private constructor(shm: ShmUrl, layout: ShmLayout, fd: number, size: number, numSlots: number) {
    const nat = native();
    this.shm = shm;
    this.layout = layout;
    this.size = size;
    this.numSlots = numSlots;
    const request: Record<string, ShmColumn> = {};
    const result: Record<string, ShmColumn> = {};
    for (const c of layout.columnsOf(numSlots).columns) (c.part === "request" ? request : result)[c.field.name] = c;
    this.requestColumns = request;
    this.resultColumns = result;
    this.inode = fstatSync(fd).ino;
    const address = nat.mmap(fd, size);
    if (address < 0n) {
      throw new ConnectError(`cannot map ${shm.path} (${size} bytes): ${nat.strerror(nat.errno())}`);
    }
    this.address = address;
    this.base = Number(address);
    const buffer = ownedMappingBuffer(address, size);
    this.bytes = new Uint8Array(buffer);
    this.dv = new DataView(buffer);
    this.words = new Int32Array(buffer);
  }

  /**
   * Create `/dev/shm/transport-<name>` exclusively (mode 0600), reserve its pages with
   * posix_fallocate (a full /dev/shm is an error here naming what is needed and what is free,
   * never a SIGBUS later) and map it. A stale segment (dead owner) is replaced; a live one never.
   */
  static create(shm: ShmUrl, layout: ShmLayout, numSlots: number, area: Uint8Array | null = null): Region {
    const nat = native();
    const size = layout.regionSize(numSlots) + (area === null ? 0 : area.byteLength);
    const numEnvs = numSlots;
    const url = `shm://${shm.name}`;
    checkRoom(shm, layout, numSlots);
    for (let attempt = 0; attempt < 3; attempt++) {
      const fd = nat.shmOpen(shm.segment, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600);
      if (fd < 0) {
        const errno = nat.errno();
        if (errno !== EEXIST) {
          throw new ConnectError(noRoomMessage(shm.path, size, numEnvs, freeShmBytes(), nat.strerror(errno)));
        }
        let info: SegmentInfo;
        try {
          info = inspectSegment(shm.path);
        } catch {
          continue; // gone meanwhile: try again
        }
        // live, starting up, unreadable or not ours: never replaced
        if (!info.stale) throw new ConnectError(segmentRefusal(info, url));
        process.stderr.write(`transport: replacing stale region ${shm.path} (owner pid ${info.ownerPid})\n`);
        if (nat.shmUnlink(shm.segment) !== 0 && nat.errno() !== ENOENT) {
          throw new ConnectError(`${url}: cannot remove the stale region ${shm.path}: ${nat.strerror(nat.errno())}`);
        }
        continue;
      }
      try {
        if (nat.fchmod(fd, 0o600) !== 0) throw new ConnectError(`fchmod ${shm.path}: ${nat.strerror(nat.errno())}`);
        const err = nat.posixFallocate(fd, 0, size);
        if (err !== 0) throw new ConnectError(noRoomMessage(shm.path, size, numEnvs, freeShmBytes(), nat.strerror(err)));
        const region = new Region(shm, layout, fd, size, numSlots);
        if (area !== null) region.bytes.set(area, size - area.byteLength); // the schema it carries
        return region;
      } catch (error) {
        nat.shmUnlink(shm.segment);
        throw error;
      } finally {
        nat.close(fd);
      }
    }
    throw new ConnectError(`${url}: could not replace the stale region ${shm.path}`);
  }

  /** Map an existing segment of `layout` (the client; tests). */
  static open(shm: ShmUrl, layout: ShmLayout): Region {
    const nat = native();
    const fd = nat.shmOpen(shm.segment, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
      const errno = nat.errno();
      if (errno === ENOENT) throw new SegmentMissingError(shm);
      checkSegmentPath(shm.path); // EINVAL: a directory; ELOOP: a link
      throw new ConnectError(`cannot open ${shm.path}: ${nat.strerror(errno)}`);
    }
    try {
      const size = checkSegmentFd(fd, shm.path).size;
      if (size < CONTROL_SIZE) throw new ConnectError(`${shm.path} has no control block yet (${size} bytes)`);
      const header = Buffer.alloc(CONTROL_SIZE);
      readSync(fd, header, 0, CONTROL_SIZE, 0);
      const area = schemaAreaOfFd(fd, size);
      const region = new Region(shm, layout, fd, size, layout.slotsIn(size - area.size) ?? 0);
      region.schemaIr = area.ir;
      return region;
    } finally {
      nat.close(fd);
    }
  }

  get mapped(): boolean {
    return this.#mapped;
  }

  /** Word index (for `words`) of a control-block field. */
  cbWord(field: string): number {
    return off(CB, field) >> 2;
  }

  /** Byte offset of a slot field. */
  slotAt(index: number, field: string): number {
    return this.layout.slotBase(index) + off(this.layout.slot, field);
  }

  /**
   * Where env `index`'s request field `name` is, and the bytes from one env's to the next: in
   * its column (column layout), else in its slot. A ProtocolError when the layout has no place.
   */
  requestAt(index: number, name: string): { readonly at: number; readonly stride: number } {
    const column = this.requestColumns[name];
    if (column !== undefined) return { at: column.start + index * column.field.size, stride: column.field.size };
    const at = this.layout.ir.request_offsets[name];
    if (at === undefined) throw new ProtocolError(`the shm layout has no place for the request field ${name}`);
    return { at: this.layout.slotBase(index) + at, stride: this.layout.slotSize };
  }

  /** Has the N final-result areas after the slots (a region of `regionSize(numEnvs)` bytes). */
  get hasFinals(): boolean {
    return this.size >= this.layout.regionSize(this.numSlots);
  }

  /** Byte offset of the RECV wake hint word, or null (no final areas, or no room: no hint). */
  get recvHintAt(): number | null {
    if (this.#recvHintAt === undefined) {
      this.#recvHintAt = !this.hasFinals || this.numSlots === 0 ? null : this.layout.recvHintOffset(this.numSlots);
    }
    return this.#recvHintAt;
  }

  #recvHintAt: number | null | undefined = undefined;

  /** Byte offset of env `index`'s final-result area (its `final_seq` word). */
  finalAt(index: number): number {
    return this.layout.finalsOffset(this.numSlots) + index * this.layout.finalSize;
  }

  /** The futex address of the 32-bit word at byte `offset`. */
  addressOf(offset: number): number {
    return this.base + offset;
  }

  /** shm_unlink, only if the name still points at this mapping's inode (never another's). */
  unlinkIfOurs(): boolean {
    try {
      if (statSync(this.shm.path).ino !== this.inode) return false;
    } catch {
      return false;
    }
    return native().shmUnlink(this.shm.segment) === 0;
  }

  /**
   * End this process's use of the segment. Typed arrays over the mapping may still be held (a
   * client's kept results): the shared pages are replaced in place by a private copy of their
   * contents, which those views keep reading (their values at this moment; writes reach no
   * other process) until the last of them is collected, when the mapping is unmapped. Should
   * the copy fail (no memory), the shared mapping itself stays until then.
   */
  unmap(): void {
    if (!this.#mapped) return;
    this.#mapped = false;
    releaseMapping(this.address, this.size, this.shm.path, this.inode);
  }
}

// -- futex words ----------------------------------------------------------------------------------

const FOREVER = { tv_sec: 0, tv_nsec: 0 };

/** FUTEX_WAIT on the word at byte `offset` while it holds `expected`, at most `ns`. */
export function futexWait(region: Region, offset: number, expected: number, ns: number): number {
  const nat = native();
  const t = FOREVER;
  t.tv_sec = Math.floor(ns / 1e9);
  t.tv_nsec = Math.floor(ns % 1e9);
  return nat.futex(region.addressOf(offset), 0, expected >>> 0, t);
}

export function futexWake(region: Region, offset: number): number {
  return native().futex(region.addressOf(offset), 1, 0x7fffffff, null);
}

/**
 * Publish a sequence (tp_publish_word): exchange (seq_cst, so also a release), then FUTEX_WAKE
 * only if the old value says a waiter may sleep. A spinning peer costs no system call.
 */
export function publishWord(region: Region, offset: number, value: number): boolean {
  const old = Atomics.exchange(region.words, offset >> 2, value & SEQ_MASK);
  if (old & SLEEP_BIT) {
    futexWake(region, offset);
    return true;
  }
  return false;
}

/** The sequence bits of the word at byte `offset` (acquire: Atomics.load is seq_cst). */
export function loadSeq(region: Region, offset: number): number {
  return Atomics.load(region.words, offset >> 2) & SEQ_MASK;
}

export const WAIT_TIMEOUT = -1;
export const WAIT_CLOSED = -2;
export const WAIT_PEER_DEAD = -3;
const SPIN_NS = 25; // one C PAUSE iteration: the unit of WaitPolicy.spin
const YIELD_EVERY = 256;

export interface WaitOptions {
  /** Spin budget in C iterations (converted to time: ~25 ns each). */
  readonly spin: number;
  /** One FUTEX_WAIT's length (ms). */
  readonly sliceMs: number;
  /** Peer whose death ends the wait (0: none). */
  readonly peerPid?: number;
  readonly peerStart?: bigint;
}

/** `sleepTurn`: the caller sleeps on the word (FUTEX_WAIT on `turn.value` for `turn.ms`). */
const TURN_SLEEP = -100;

/** The state of one wait's sleeping phase. */
interface Turn {
  /** The word value to FUTEX_WAIT on (the SLEEP bit set). */
  value: number;
  ms: number;
  /** The peer's liveness is checked from the second slice on. */
  checked: boolean;
}

/** The spin phase: the word's sequence once it is (or is not) `target`, -1 when the budget is spent. */
function spinPhase(region: Region, index: number, target: number, wantEqual: boolean, spin: number, start: number, deadline: number): number {
  const words = region.words;
  const v = Atomics.load(words, index);
  if (((v & SEQ_MASK) === target) === wantEqual) return v & SEQ_MASK;
  if (spin <= 0) return -1;
  const spinUntil = start + (spin * SPIN_NS) / 1e6;
  const nat = native();
  for (let spins = 1; ; spins++) {
    const w = Atomics.load(words, index);
    if (((w & SEQ_MASK) === target) === wantEqual) return w & SEQ_MASK;
    if ((spins & (YIELD_EVERY - 1)) === 0) {
      nat.schedYield(); // a peer sharing this core runs now, not after the whole budget
      const now = performance.now();
      if (now >= spinUntil || now >= deadline) return -1;
    }
  }
}

/**
 * One turn of the sleeping phase: the sequence (done), WAIT_CLOSED / WAIT_TIMEOUT /
 * WAIT_PEER_DEAD, or TURN_SLEEP after setting the SLEEP bit (CAS: no lost wake-up).
 */
function sleepTurn(region: Region, index: number, target: number, wantEqual: boolean, deadline: number, options: WaitOptions, turn: Turn): number {
  const words = region.words;
  const stateIndex = region.cbWord("state");
  for (;;) {
    let v = Atomics.load(words, index);
    if (((v & SEQ_MASK) === target) === wantEqual) return v & SEQ_MASK;
    if (Atomics.load(words, stateIndex) !== RegionState.READY) return WAIT_CLOSED;
    const now = performance.now();
    if (now >= deadline) return WAIT_TIMEOUT;
    if (turn.checked && options.peerPid && !peerAlive(options.peerPid, options.peerStart ?? 0n)) return WAIT_PEER_DEAD;
    turn.checked = true;
    if (!(v & SLEEP_BIT)) {
      const sleeping = v | SLEEP_BIT;
      if (Atomics.compareExchange(words, index, v, sleeping) !== v) continue; // moved: look again
      v = sleeping;
    }
    turn.value = v;
    turn.ms = Math.max(0, Math.min(Math.max(1, options.sliceMs), deadline - now));
    return TURN_SLEEP;
  }
}

const SYNC_TURN: Turn = { value: 0, ms: 0, checked: false };

/**
 * The wait loop of docs/shm.md (tp_native.c `wait_loop`), in JS: spin on Atomics.load
 * (sched_yield every 256 loads), then FUTEX_WAIT slices with the state and liveness checks.
 * Returns the word's sequence once `(seq === target) === wantEqual`, or WAIT_TIMEOUT after
 * `timeoutNs`, WAIT_CLOSED when the region is no longer READY, WAIT_PEER_DEAD.
 * Synchronous: it blocks the calling thread for at most `timeoutNs`.
 */
export function waitWord(
  region: Region,
  offset: number,
  target: number,
  wantEqual: boolean,
  timeoutNs: number,
  options: WaitOptions,
): number {
  const index = offset >> 2;
  const start = performance.now();
  const deadline = start + timeoutNs / 1e6;
  const spun = spinPhase(region, index, target, wantEqual, options.spin, start, deadline);
  if (spun >= 0) return spun;
  const turn = SYNC_TURN;
  turn.checked = false;
  for (;;) {
    const rc = sleepTurn(region, index, target, wantEqual, deadline, options, turn);
    if (rc !== TURN_SLEEP) return rc;
    futexWait(region, offset, turn.value, turn.ms * 1e6);
  }
}

/**
 * The client's wait for a response word to reach `target`: the same loop as `waitWord`, but its
 * FUTEX_WAIT slices run on a libuv thread (koffi async), so the event loop keeps running (a
 * server on this thread can answer). The spin phase stays synchronous and short (the spin budget).
 */
export async function waitWordAsync(region: Region, offset: number, target: number, timeoutNs: number, options: WaitOptions): Promise<number> {
  const index = offset >> 2;
  const start = performance.now();
  const deadline = start + timeoutNs / 1e6;
  const spun = spinPhase(region, index, target, true, options.spin, start, deadline);
  if (spun >= 0) return spun;
  const turn: Turn = { value: 0, ms: 0, checked: false };
  const timespec = { tv_sec: 0, tv_nsec: 0 };
  const nat = native();
  for (;;) {
    const rc = sleepTurn(region, index, target, true, deadline, options, turn);
    if (rc !== TURN_SLEEP) return rc;
    const ns = turn.ms * 1e6;
    timespec.tv_sec = Math.floor(ns / 1e9);
    timespec.tv_nsec = Math.floor(ns % 1e9);
    await nat.futexWaitAsync(region.addressOf(offset), turn.value, timespec);
  }
}
