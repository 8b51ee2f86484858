/**
 * shm://name?num_envs=N: the Node server of the shared-memory + futex backend (docs/shm.md; the
 * Python twin answers the same clients byte for byte). It moves slots: the env semantics
 * (checks, seeds, auto-reset, finals, recovery, OBSERVE) are the env runtime's (runtime/core.ts),
 * which this server hands the slots of its region as records.
 *
 * The region is created through koffi (shm_open O_EXCL 0600, posix_fallocate, mmap MAP_SHARED)
 * and read and written through typed arrays over `koffi.view(address, size)`: an ArrayBuffer
 * whose backing store *is* the mapping, so the client's writes are visible with no copy and
 * the words are published with `Atomics` on an Int32Array over it. Waiting follows the C loop of
 * tp_native.c: spin on Atomics.load (with a sched_yield every 256 loads), then FUTEX_WAIT slices.
 *
 * Event loop: the server waits synchronously (a futex slice of at most `slice_ms`, 50 ms by
 * default, or a spin of at most the spin budget), and returns to the event loop after every idle
 * slice and every ~20 ms of busy serving, so signals (SIGINT / SIGTERM close and unlink), timers
 * and `close()` run within about one slice.
 *
 * Results: the layout is the schema's (region.ts `ShmLayout`). Where the slot holds the result
 * struct whole (every derived layout) the runtime encodes each env's result straight into its
 * slot (zero copy); the pac_shm profile spreads the fields at Appendix B's offsets, so there the
 * runtime encodes into a scratch record that `written` copies field runs from (one copy per env
 * step, no allocation). The column layout (`[env] shm = "columns"`: each field of all envs
 * contiguous after the final areas) is served the same way: the runtime encodes into scratch
 * records and `written` copies each result field into env i's place in its column (one copy per
 * env step: the runtime stays row-oriented), and the actions are read from the request column;
 * a vector env that declares `writesColumns` (VectorEchoEnv) is instead handed the region's
 * result columns themselves (`SlotRecords.useRuntime`: its runner's columns adopted), so it
 * writes what the client reads and nothing is copied (Python: `writes_columns`).
 * A region whose env has `stepBatch` has max(num_envs, seats) slots:
 * STEP_MULTI carries one seat action in each of slots 0..seats-1.
 *
 * Slot commands: STEP, RESET, SHUTDOWN, HELLO (the lease's auto-reset mode in `action`),
 * OBSERVE (the results rewritten in place, each env's `info()` map in its slot's `info` area
 * when it fits, else `info_len` 0), STEP_MULTI (slots 0..seats-1). A request on every env slot
 * with one command is one runtime call; anything else is answered slot by slot.
 *
 * Asynchronous batches (docs/shm.md): an shm client's SEND is a STEP on a subset of the slots.
 * In this thread each of those envs steps at once; when the lease's envs run in worker threads
 * (`--workers K`) the server checks each slot's action, submits the envs to the pool and
 * publishes each slot as its env finishes (status, SAME_STEP final, then the response word),
 * while it keeps reading new doorbell rings: a slot in flight (its request word != its response
 * word until published) is not submitted again. While envs are in flight the loop waits on the
 * pool's doorbell in 0.2 ms slices and looks at the region's doorbell between them.
 *
 * Every 250 ms, idle or busy, the server looks at its region (watch.ts `RegionWatch`, the rules
 * of the Python server): a region removed, replaced, resized or no longer READY stops it (one
 * line on stderr, CLOSED, wake, unlink; `failure`, `onShmServerStopped`; `transport-serve` exits
 * 1), fields it owns that another process changed are rewritten, and a lease held by a live
 * process that is not a client is reclaimed.
 */

import { encode as msgpackEncode } from "@msgpack/msgpack";
import type { AnyStructCodec, SchemaModule } from "../../codec";
import type { FieldJson, ShmColumn } from "../../ir";
import { ProtocolError } from "../../errors";
import { type AutoReset, ErrorCode, RequestError } from "../../protocol";
import {
  type ActionType,
  type AsyncDone,
  EnvFailureError,
  type EnvRuntime,
  Op,
  type Records,
  bodyCodec,
  checkAutoreset,
  describeError,
  readActions,
  stepAction,
} from "../../runtime/core";
import type { EnvHost } from "../../runtime/host";
import type { RunnerColumns } from "../../runtime/env";
import { type ConnectionStats, newStats } from "../../stream";
import type { Listener, ListenOptions } from "../backend";
import {
  CB,
  LAYOUT_VERSION,
  MAGIC,
  Region,
  RegionState,
  SEQ_MASK,
  SLEEP_BIT,
  type ShmLayout,
  ShmLayout as Layouts,
  type ShmUrl,
  SlotCommand,
  WAIT_CLOSED,
  WAIT_TIMEOUT,
  futexWake,
  off,
  parseShmUrl,
  SlotChecksums,
  peerAlive,
  procStartTime,
  publishWord,
  schemaArea,
  waitWord,
  namesWaitPolicy,
} from "./region";
import { INFO_SIDE, SideWriter } from "./side";
import { RegionWatch, WATCH_PERIOD_MS } from "./watch";

/** One run of bytes copied from the encoded result record to the slot. */
interface Copy {
  readonly from: number;
  readonly to: number;
  readonly size: number;
}

/** How the STEP_RESP struct lands in a slot and in a final area. */
export interface ResultLayout {
  readonly codec: AnyStructCodec;
  /** Runs from the packed result record to the slot's result fields (none: the column layout). */
  readonly copies: readonly Copy[];
  /** Runs from the slot's result fields to the final area's (the column layout: from the
   * packed result record, the slot holding no result field). */
  readonly finalCopies: readonly Copy[];
  /** Slot offset of the whole packed result when the slot holds it as is (zero copy), else -1. */
  readonly inPlace: number;
  /** The column layout: the result fields live in the region's columns (Region.resultColumns). */
  readonly columns: boolean;
}

/** Add a run, merged with the previous one when both sides continue it. */
function addRun(runs: Copy[], from: number, to: number, size: number): void {
  const last = runs[runs.length - 1];
  if (last !== undefined && last.from + last.size === from && last.to + last.size === to) {
    runs[runs.length - 1] = { from: last.from, to: last.to, size: last.size + size };
  } else {
    runs.push({ from, to, size });
  }
}

/**
 * The slot offset where the packed result lies whole (every field displaced by the same amount,
 * no other slot field inside it: the derived layouts), or -1 (the pac_shm profile).
 */
function wholeAt(layout: ShmLayout, fields: readonly FieldJson[], copies: readonly Copy[], size: number): number {
  const first = copies[0];
  if (first === undefined) return -1;
  const shift = first.to - first.from;
  if (shift < 0 || copies.some((c) => c.to - c.from !== shift)) return -1;
  const names = new Set(fields.map((f) => f.name));
  for (const [name, f] of Object.entries(layout.slot)) {
    const inside = f.offset < shift + size && f.offset + f.size > shift;
    const isResult = (f.offset === shift && f.size === size) || (names.has(name) && layout.ir.result_offsets[name] === f.offset);
    if (inside && !isResult) return -1;
  }
  return shift;
}

/** The copy plans of the schema's result struct over its shm layout (IR `shm` offset maps). */
export function resultLayout(schema: SchemaModule): ResultLayout {
  const layout = Layouts.of(schema);
  const codec = bodyCodec(schema, "STEP_RESP");
  const fields = [...(schema.ir.structs[codec.name]?.fields ?? [])].sort((a, b) => a.offset - b.offset);
  const copies: Copy[] = [];
  const finalCopies: Copy[] = [];
  if (layout.columns) {
    for (const f of fields) {
      const finalAt = layout.ir.final_result_offsets[f.name];
      if (finalAt === undefined) {
        throw new ProtocolError(`shm:// cannot carry ${codec.name}.${f.name}: the ${layout.ir.profile} layout has no final offset for it`);
      }
      addRun(finalCopies, f.offset, finalAt, f.size);
    }
    return { codec, copies, finalCopies, inPlace: -1, columns: true };
  }
  for (const f of fields) {
    const at = layout.ir.result_offsets[f.name];
    const finalAt = layout.ir.final_result_offsets[f.name];
    if (at === undefined || finalAt === undefined) {
      throw new ProtocolError(`shm:// cannot carry ${codec.name}.${f.name}: the ${layout.ir.profile} layout has no offset for it`);
    }
    addRun(copies, f.offset, at, f.size);
    addRun(finalCopies, at, finalAt, f.size);
  }
  return { codec, copies, finalCopies, inPlace: wholeAt(layout, fields, copies, codec.size), columns: false };
}

/** UTF-8 `text` cut at a character boundary to at most `max` bytes. */
export function utf8Cut(text: string, max: number): Buffer {
  const data = Buffer.from(text, "utf8");
  if (data.length <= max) return data;
  let cut = max;
  while (cut > 0 && ((data[cut] as number) & 0xc0) === 0x80) cut--;
  return data.subarray(0, cut);
}

/**
 * One result field of a vector runner's columns and its offset in a slot (`SlotRecords`): a
 * field of 1, 2, 4 or 8 bytes is copied as unsigned words (the same bytes: a little-endian
 * host, as the columns need), a larger one with `set` from a row view.
 */
interface ColumnToSlot {
  readonly to: number;
  readonly size: number;
  readonly u8: Uint8Array;
  readonly u16: Uint16Array | null;
  readonly u32: Uint32Array | null;
  /** Env i's bytes of any other size (views made once: `written` allocates nothing). */
  readonly rows: readonly Uint8Array[] | null;
}

/** Where each result field of `columns` goes in a slot of `layout` (the IR's result offsets). */
function columnsToSlots(columns: RunnerColumns, layout: ShmLayout, numSlots: number): ColumnToSlot[] {
  const plans: ColumnToSlot[] = [];
  for (const [name, column] of Object.entries(columns.columns)) {
    const to = layout.ir.result_offsets[name];
    if (to === undefined) throw new ProtocolError(`shm:// cannot carry result field ${name}: the layout has no offset for it`);
    const { buffer, byteOffset, byteLength } = column;
    const size = byteLength / columns.numEnvs;
    const u8 = new Uint8Array(buffer, byteOffset, byteLength);
    const u16 = size === 2 ? new Uint16Array(buffer, byteOffset, byteLength / 2) : null;
    const u32 = size === 4 || size === 8 ? new Uint32Array(buffer, byteOffset, byteLength / 4) : null;
    let rows: Uint8Array[] | null = null;
    if (size !== 1 && size !== 2 && size !== 4 && size !== 8) {
      rows = [];
      for (let i = 0; i < Math.min(numSlots, columns.numEnvs); i++) rows.push(u8.subarray(i * size, (i + 1) * size));
    }
    plans.push({ to, size, u8, u16, u32, rows });
  }
  return plans;
}

/**
 * The runtime's records over the region: env i's result goes straight into slot i when the
 * slot holds the result whole, else into scratch record i whose fields `written` copies to the
 * slot (pac_shm) or to env i's place in each result column (the column layout: the runtime
 * stays row-oriented, so a column region costs one copy of each result); SAME_STEP finals go to
 * final area i, stamped with the request's sequence before the response word is published.
 */
class SlotRecords implements Records {
  readonly bytes: Uint8Array;
  readonly #region: Region;
  readonly #layout: ShmLayout;
  readonly #plan: ResultLayout;
  readonly #size: number;
  readonly #finalsAt: number;
  readonly #seqs: Int32Array;
  /** Per record, the scratch views of its copy runs (made once: `written` allocates nothing). */
  readonly #runs: ReadonlyArray<readonly Uint8Array[]>;
  /** Per record, where each of its runs goes in the region. */
  readonly #targets: ReadonlyArray<Int32Array>;
  /**
   * The column layout with a vector env that writes the region's columns itself (`adopt`): the
   * lease's runner's columns, over the region. Then `written` copies nothing and a final result
   * is taken from the columns. Null: the runtime writes the scratch records (copied over).
   */
  resultColumns: RunnerColumns | null = null;
  /** The column layout: each result field's column start, size and final-area offset. */
  readonly #columnRuns: ReadonlyArray<{ readonly start: number; readonly size: number; readonly final: number }>;
  /**
   * The slot layout with a vector env (`useRuntime`): each result field of the runner's
   * columns and where it goes in a slot; `written(i)` copies env i's straight into slot i (no
   * scratch record between: one copy of a step's results, not two). Null: scratch records.
   */
  #fromColumns: readonly ColumnToSlot[] | null = null;

  constructor(region: Region, plan: ResultLayout, seqs: Int32Array) {
    this.#region = region;
    this.#layout = region.layout;
    this.#plan = plan;
    this.#size = plan.codec.size;
    this.bytes = plan.inPlace >= 0 ? region.bytes : new Uint8Array(region.numSlots * this.#size);
    this.#finalsAt = region.layout.finalsOffset(region.numSlots);
    this.#seqs = seqs;
    const runs: Uint8Array[][] = [];
    const targets: Int32Array[] = [];
    const fields = region.layout.schema.ir.structs[plan.codec.name]?.fields ?? [];
    for (let i = 0; plan.inPlace < 0 && i < region.numSlots; i++) {
      const from = i * this.#size;
      if (plan.columns) {
        const columns = fields.map((f) => region.resultColumns[f.name] as ShmColumn);
        runs.push(fields.map((f) => this.bytes.subarray(from + f.offset, from + f.offset + f.size)));
        targets.push(Int32Array.from(columns, (c) => c.start + i * c.field.size));
      } else {
        runs.push(plan.copies.map((c) => this.bytes.subarray(from + c.from, from + c.from + c.size)));
        targets.push(Int32Array.from(plan.copies, (c) => this.#layout.slotBase(i) + c.to));
      }
    }
    this.#runs = runs;
    this.#targets = targets;
    this.#columnRuns = !plan.columns
      ? []
      : fields.map((f) => ({
          start: (region.resultColumns[f.name] as ShmColumn).start,
          size: f.size,
          final: region.layout.ir.final_result_offsets[f.name] as number,
        }));
  }

  /**
   * The column layout: let `runtime`'s vector env write the region's result columns (its
   * runner's columns re-pointed there, what they held copied over) when it declares
   * `writesColumns` and no no-progress watchdog reads the records; else the runtime writes the
   * scratch records and `written` copies each result over. Called for each new lease.
   */
  useRuntime(runtime: EnvRuntime): void {
    const runner = runtime.runner;
    const columns = runner.columns;
    this.#fromColumns = null;
    if (!this.#plan.columns && this.#plan.inPlace < 0 && columns !== undefined && runtime.watchdog === null) {
      // a vector env over slots: its columns are where the results are, copied per env
      this.#fromColumns = columnsToSlots(columns, this.#region.layout, this.#region.numSlots);
      this.resultColumns = columns;
      return;
    }
    if (!this.#plan.columns || columns === undefined || runner.writesColumns !== true || runtime.watchdog !== null) {
      this.resultColumns = null;
      return;
    }
    const starts: Record<string, number> = {};
    for (const [name, column] of Object.entries(this.#region.resultColumns)) starts[name] = column.start;
    columns.adopt(this.#region.bytes, starts);
    this.resultColumns = columns;
  }

  /** A scratch block (results copied into the slots field by field) is one block; slots are not. */
  get packed(): boolean {
    return this.#plan.inPlace < 0;
  }

  at(index: number): number {
    const inPlace = this.#plan.inPlace;
    return inPlace >= 0 ? this.#layout.slotBase(index) + inPlace : index * this.#size;
  }

  written(index: number): void {
    const fromColumns = this.#fromColumns;
    if (fromColumns !== null) {
      const region = this.#region;
      const dv = region.dv;
      const slot = this.#layout.slotBase(index);
      for (let k = 0; k < fromColumns.length; k++) {
        const c = fromColumns[k] as ColumnToSlot;
        const at = slot + c.to;
        switch (c.size) {
          case 1:
            region.bytes[at] = c.u8[index] as number;
            break;
          case 2:
            dv.setUint16(at, (c.u16 as Uint16Array)[index] as number, true);
            break;
          case 4:
            dv.setUint32(at, (c.u32 as Uint32Array)[index] as number, true);
            break;
          case 8:
            dv.setUint32(at, (c.u32 as Uint32Array)[2 * index] as number, true);
            dv.setUint32(at + 4, (c.u32 as Uint32Array)[2 * index + 1] as number, true);
            break;
          default:
            region.bytes.set((c.rows as readonly Uint8Array[])[index] as Uint8Array, at);
        }
      }
      return;
    }
    if (this.#plan.inPlace >= 0 || this.resultColumns !== null) return; // written in the region itself
    const bytes = this.#region.bytes;
    const runs = this.#runs[index] as readonly Uint8Array[];
    const targets = this.#targets[index] as Int32Array;
    for (let k = 0; k < runs.length; k++) bytes.set(runs[k] as Uint8Array, targets[k] as number);
  }

  keepFinal(index: number): void {
    const region = this.#region;
    const final = this.#finalsAt + index * this.#layout.finalSize;
    const copies = this.#plan.finalCopies;
    if (this.#plan.columns && this.resultColumns !== null) {
      // from env index's place in each result column (the env wrote them)
      const runs = this.#columnRuns;
      for (let k = 0; k < runs.length; k++) {
        const c = runs[k] as { start: number; size: number; final: number };
        const from = c.start + index * c.size;
        region.bytes.copyWithin(final + c.final, from, from + c.size);
      }
    } else if (this.#plan.columns) {
      // from the scratch record (the slot holds no result field)
      const row = index * this.#size;
      for (let k = 0; k < copies.length; k++) {
        const c = copies[k] as Copy;
        region.bytes.set(this.bytes.subarray(row + c.from, row + c.from + c.size), final + c.to);
      }
    } else {
      const slot = this.#layout.slotBase(index);
      for (let k = 0; k < copies.length; k++) {
        const c = copies[k] as Copy;
        region.bytes.copyWithin(final + c.to, slot + c.from, slot + c.from + c.size);
      }
    }
    Atomics.store(region.words, (final + this.#layout.finalSeqAt) >> 2, this.#seqs[index] as number);
  }
}

const MODE = new Float64Array(1);
/**
 * Milliseconds of one wait on the worker pool's doorbell while envs are in flight: a new SEND
 * (the region's doorbell) waits at most this long to be submitted (Atomics cannot wait on both).
 */
const IN_FLIGHT_SLICE_MS = 0.2;

type StopHandler = (reason: string, url: string) => void;
const STOP_HANDLERS = new Set<StopHandler>();

/**
 * Call `handler(reason, url)` when an shm:// server of this process stops on its own because
 * another process changed its region (docs/shm.md "A state word the server did not write", "A
 * region changed under its server"): the server has already said why on stderr, marked the
 * region CLOSED, woken its waiters and removed its segment. `transport-serve` exits 1 then.
 * Returns a function that removes the handler.
 */
export function onShmServerStopped(handler: StopHandler): () => void {
  STOP_HANDLERS.add(handler);
  return () => STOP_HANDLERS.delete(handler);
}

/** One lease holder's envs. */
interface Lease {
  clientPid: number;
  readonly runtime: EnvRuntime;
}

/** The shm:// server: one region, one client lease at a time, one loop on the main thread. */
export class ShmListener implements Listener {
  readonly url: string;
  readonly stats: ConnectionStats = newStats();
  readonly shm: ShmUrl;
  readonly numEnvs: number;
  /** Slots in the region: max(num_envs, seats) when the env has stepBatch, else num_envs. */
  readonly numSlots: number;
  readonly region: Region;
  readonly layout: ShmLayout;
  /** FUTEX_WAIT calls the loop made while idle or waiting (how often it slept). */
  sleeps = 0;
  /** Why the server stopped on its own (its region changed under it); null while it serves. */
  failure: string | null = null;
  readonly #host: EnvHost;
  readonly #records: SlotRecords;
  readonly #pending: Uint8Array;
  /** Slots submitted to the lease's worker pool and not published yet (asynchronous batches). */
  readonly #inFlight: Uint8Array;
  #inFlightCount = 0;
  /** #publishFinished's scratch: the byte offsets of the response words a client slept on. */
  readonly #sleepers: number[] = [];
  /** When the loop next looks for a dead client while envs are in flight (performance.now ms). */
  #housekeepAt = 0;
  /** Each slot's op of an asynchronous submit (scratch). */
  readonly #ops: Uint8Array;
  readonly #seqs: Int32Array;
  readonly #doorbellAt: number;
  readonly #clientPidWord: number;
  readonly #clientStartAt: number;
  /** Env 0's action in the region, and the bytes from one env's to the next (its slot's, or
   * its column's: the column layout). */
  readonly #actionAt: number;
  readonly #actionStride: number;
  readonly #actionType: ActionType;
  readonly #seats: number;
  readonly #seedOf = (index: number): bigint | null => this.#slotSeed(index);
  #lease: Lease | null = null;
  #spare: EnvRuntime | null = null;
  /** Making the spare failed: the next client's HELLO tries again and is told why. */
  #spareFailed = false;
  readonly #serverInfo: Record<string, unknown>;
  #checksums: SlotChecksums | null = null;
  /** Info maps a slot cannot hold (rendered frames): the side segment, made on demand. */
  readonly #side: SideWriter;
  #watch: RegionWatch;
  #last = 0;
  #idle = false;
  /** Spins of the wait for the next request: the URL's policy, 0 when a pool runs the envs. */
  readonly #requestSpin: number;
  /** Spins of the wait for the next request (0: sleeps at once; envs in worker threads). */
  get requestSpin(): number {
    return this.#requestSpin;
  }
  #closed = false;
  #stopped: Promise<void>;
  #stop: () => void = () => undefined;

  constructor(url: string, host: EnvHost) {
    this.url = url;
    this.shm = parseShmUrl(url);
    this.#host = host;
    this.#serverInfo = { env: host.envName, server: host.serverLang, masked_actions: host.maskedActions };
    this.#side = new SideWriter(this.shm);
    const schema = host.schema;
    const layout = Layouts.of(schema);
    this.layout = layout;
    const plan = resultLayout(schema);
    const action = stepAction(schema, true);
    if (!layout.columns && layout.ir.request_offsets[action.field.name] === undefined) {
      throw new ProtocolError(`the shm layout has no offset for the action field ${action.field.name}`);
    }
    this.#actionType = action.type;
    const numEnvs = this.shm.numEnvs ?? host.numEnvs;
    this.numEnvs = numEnvs;
    const spare = host.runtime(numEnvs, url); // the first client's envs, made before READY
    this.#seats = spare.hasSeats ? spare.seats : 0;
    // the env's spaces (SPACES_RESP): the control block's act_size is the mask's length
    // (Appendix B), 0 for an env without one (a plain Discrete(n))
    this.#serverInfo["spaces"] = [spare.spaces.obsN, spare.spaces.actN];
    // envs in worker threads (or a vector env on threads of its own): a step takes their time,
    // and a waiter spinning meanwhile takes a core from them; this server then sleeps at once
    // between requests and advises the client to (`client_wait`, popped by the client), unless
    // the URL names a wait policy
    const elsewhere = host.pooled || spare.runner.stepsOnOwnThreads === true;
    const poolSleeps = elsewhere && !namesWaitPolicy(url); // see the Python server's start()
    this.#requestSpin = poolSleeps ? 0 : this.shm.wait.spin;
    if (poolSleeps) this.#serverInfo["client_wait"] = "futex";
    this.numSlots = Math.max(numEnvs, this.#seats);
    this.#pending = new Uint8Array(this.numSlots);
    this.#inFlight = new Uint8Array(this.numSlots);
    this.#ops = new Uint8Array(this.numSlots);
    this.#seqs = new Int32Array(this.numSlots);
    this.#doorbellAt = off(CB, "doorbell");
    this.#clientPidWord = off(CB, "client_pid") >> 2;
    this.#clientStartAt = off(CB, "client_start_time");
    this.#stopped = new Promise((resolve) => {
      this.#stop = resolve;
    });

    let region: Region;
    const area = schemaArea(schema);
    try {
      region = Region.create(this.shm, layout, this.numSlots, area); // it carries its schema
    } catch (error) {
      spare.close();
      throw error;
    }
    this.region = region;
    ({ at: this.#actionAt, stride: this.#actionStride } = region.requestAt(0, action.field.name));
    this.#records = new SlotRecords(region, plan, this.#seqs);
    try {
      const dv = region.dv;
      dv.setUint32(off(CB, "owner_pid"), process.pid, true);
      dv.setBigUint64(off(CB, "owner_start_time"), procStartTime(process.pid), true);
      // the magic with the owner, before the workers start (which may take long): the segment
      // is this server's (live, or stale once it is gone), never a foreign file
      dv.setUint32(off(CB, "version"), LAYOUT_VERSION, true);
      dv.setUint32(off(CB, "magic"), MAGIC, true);
      spare.runner.start?.(); // worker threads too, before a client asks
      this.#spare = spare;
      dv.setUint32(off(CB, "num_envs"), numEnvs, true);
      dv.setUint32(off(CB, "obs_size"), layout.obsSize, true);
      dv.setUint32(off(CB, "act_size"), layout.actSize, true);
      dv.setUint32(off(CB, "slot_size"), layout.slotSize, true);
      dv.setBigUint64(off(CB, "fingerprint"), schema.fingerprint, true);
      if (this.shm.checksum !== null) {
        this.#serverInfo["checksum"] = this.shm.checksum;
        this.#checksums = new SlotChecksums(region);
      }
      this.#writeInfo(0, this.#serverInfo);
      this.#last = Atomics.load(region.words, this.#doorbellAt >> 2) & SEQ_MASK; // before READY
      this.#watch = new RegionWatch(url, region, area); // what it wrote, as it wrote it
      Atomics.store(region.words, region.cbWord("state"), RegionState.READY); // last: ready
    } catch (error) {
      spare.close();
      region.unlinkIfOurs();
      region.unmap();
      throw error;
    }
    setImmediate(this.#tick);
  }

  /** Drop the lease's envs (and stop its worker threads). */
  /** The client said SHUTDOWN or died: its envs go; slot 0's info area says the server's info
   * again (OBSERVE wrote env info there), as a new client reads it at attach. */
  #dropLease(): void {
    this.#inFlight.fill(0); // their client is gone (or said SHUTDOWN): nobody waits for them
    this.#inFlightCount = 0;
    this.#lease?.runtime.close();
    this.#lease = null;
    if (!this.#closed) {
      this.#writeInfo(0, this.#serverInfo); // closed: the region is unmapped
      // the next client starts without a RECV wake hint (an older one never writes it)
      const hintAt = this.region.recvHintAt;
      if (hintAt !== null) Atomics.store(this.region.words, hintAt >> 2, 0);
    }
  }

  // -- the loop ------------------------------------------------------------------------------------

  /** Serve until idle for one slice or busy for ~20 ms, then give the event loop a turn. */
  readonly #tick = (): void => {
    if (this.#closed) return;
    const region = this.region;
    const policy = this.shm.wait;
    // an idle slice never outlasts the watch's period: the region is looked at while idle
    const sliceNs = Math.min(Math.max(1, policy.futexSliceMs), WATCH_PERIOD_MS) * 1e6;
    const burstEnd = performance.now() + 20;
    try {
      if (this.#watch.due(performance.now()) && this.#lookAtRegion()) return;
      for (;;) {
        if (this.#inFlightCount > 0) {
          // envs in worker threads: publish those that finished, serve new rings, wait a slice on the pool
          this.#publishFinished();
          const ring = Atomics.load(region.words, this.#doorbellAt >> 2) & SEQ_MASK;
          if (ring !== this.#last) {
            this.#last = ring;
            this.#serveBatch();
          } else if (this.#inFlightCount > 0) {
            this.#lease?.runtime.runner.concurrent?.waitSync(IN_FLIGHT_SLICE_MS);
          }
          if (this.#closed) return;
          if (Atomics.load(region.words, region.cbWord("state")) !== RegionState.READY) {
            this.#lost(this.#strayState(), this.region.size); // as a wait that found the region not READY
            return;
          }
          const now = performance.now();
          if (now >= this.#housekeepAt) {
            this.#housekeepAt = now + policy.futexSliceMs; // a dead client is found while envs run too
            this.#housekeeping();
          }
          if (now >= burstEnd) break;
          continue;
        }
        const rc = waitWord(region, this.#doorbellAt, this.#last, false, sliceNs, {
          spin: this.#idle ? 0 : this.#requestSpin, // an idle server sleeps at once
          sliceMs: policy.futexSliceMs,
        });
        if (rc >= 0) {
          this.#last = rc;
          this.#idle = false;
          this.#serveBatch();
          if (performance.now() >= burstEnd) break;
        } else if (rc === WAIT_TIMEOUT) {
          this.sleeps++;
          this.#idle = true;
          this.#housekeeping();
          break;
        } else if (rc === WAIT_CLOSED) {
          this.#lost(this.#strayState(), this.region.size); // close() is not running: another process wrote it
          return;
        }
      }
    } catch (error) {
      process.stderr.write(`transport: shm://${this.shm.name} server loop error: ${describeError(error)}\n`);
    }
    if (!this.#closed) setImmediate(this.#tick);
  };

  #serveBatch(): void {
    const region = this.region;
    const words = region.words;
    const layout = this.layout;
    const k = this.numSlots;
    const n = this.numEnvs;
    const pending = this.#pending;
    const seqs = this.#seqs;
    const reqOff = off(layout.slot, "sem_action_ready");
    const respOff = off(layout.slot, "sem_result_ready");
    const cmdOff = off(layout.slot, "command");
    if (this.#inFlightCount > 0 && this.#shutdownInFlight()) return;
    let count = 0;
    let below = 0; // pending slots among 0..n-1
    let cmd = -2;
    for (let i = 0; i < k; i++) {
      const base = layout.slotBase(i);
      const req = Atomics.load(words, (base + reqOff) >> 2) & SEQ_MASK;
      const resp = Atomics.load(words, (base + respOff) >> 2) & SEQ_MASK;
      if (req !== resp && !this.#inFlight[i]) {
        pending[i] = 1;
        seqs[i] = req; // answer exactly this request, even if a newer one follows
        count++;
        if (i < n) below++;
        const c = words[(base + cmdOff) >> 2] as number;
        cmd = cmd === -2 ? c : cmd === c ? cmd : -1;
      } else {
        pending[i] = 0;
      }
    }
    if (count === 0) return;
    const pid = Atomics.load(words, this.#clientPidWord) >>> 0;
    let lease = this.#lease;
    const newClient = lease === null || lease.clientPid !== pid;
    if (newClient && cmd === SlotCommand.SHUTDOWN) {
      // a SHUTDOWN with no session of this client (a close that raced its own SEND, a server
      // that already ended it): answered without making one (a worker pool) to drop it again
      this.#dropLease(); // a previous holder's, if any
      lease = null;
    }
    const all = count === n && below === n;
    let status = 0;
    try {
      // making the client's envs can fail (the env factory): its HELLO says why
      if (newClient && cmd !== SlotCommand.SHUTDOWN) lease = pid ? this.#newLease(pid) : null;
      if (lease === null && cmd !== SlotCommand.SHUTDOWN) {
        throw new RequestError(ErrorCode.HELLO_REQUIRED, "take the region's lease first");
      }
      const runtime = lease?.runtime;
      if (runtime === undefined) {
        // a SHUTDOWN with no session: answered below (status 0)
      } else if (cmd === SlotCommand.STEP_MULTI) {
        this.#stepMulti(runtime, count);
      } else if (all && cmd === SlotCommand.STEP) {
        this.#readActions(runtime, 0, n);
        runtime.step(this.#records);
      } else if (all && cmd === SlotCommand.RESET) {
        runtime.reset(this.#records, this.#seedOf);
      } else if (all && cmd === SlotCommand.HELLO) {
        runtime.autoreset = this.#mode(0);
      } else if (all && cmd === SlotCommand.OBSERVE) {
        this.#observe(runtime);
      } else if (cmd === SlotCommand.OBSERVE) {
        throw new RequestError(ErrorCode.BAD_BATCH, `OBSERVE needs slots 0..${n - 1} and no others (${count} slots asked)`);
      } else if (cmd === SlotCommand.SHUTDOWN) {
        this.#dropLease();
      } else {
        this.#mixed(runtime);
        status = -1; // statuses written per slot
      }
    } catch (error) {
      if (error instanceof EnvFailureError && all) {
        // the failed envs' slots carry the error; the others did their step (a lock-step client
        // reads the first failed slot; an asynchronous one each env's own), as the Python server
        status = -1;
        for (let i = 0; i < k; i++) if (pending[i]) region.dv.setUint16(region.slotAt(i, "status"), 0, true);
        for (const i of error.envIds) {
          if (!pending[i]) continue;
          region.dv.setUint16(region.slotAt(i, "status"), error.code, true);
          this.#writeText(i, error.text);
        }
      } else if (error instanceof RequestError) {
        status = error.code;
        this.#errorAll(error.text);
      } else {
        status = ErrorCode.INTERNAL; // a bug must not take the server down (env errors: the runtime)
        this.#errorAll(describeError(error));
      }
    }
    this.#answerPending(status);
  }

  /**
   * Publish every pending slot with `status` (-1: each slot's own, already written): first the
   * statuses, each only where it changes (its line is one the client reads every step: an
   * unchanged store would take it from the client's core), then the checksums and words in slot
   * order (the client waits on the last slot first), as the Python server does.
   */
  #answerPending(status: number): void {
    const region = this.region;
    const layout = this.layout;
    const pending = this.#pending;
    const seqs = this.#seqs;
    const k = this.numSlots;
    const respOff = off(layout.slot, "sem_result_ready");
    if (status >= 0) {
      const statusOff = off(layout.slot, "status");
      const dv = region.dv;
      for (let i = 0; i < k; i++) {
        if (!pending[i]) continue;
        const at = layout.slotBase(i) + statusOff;
        if (dv.getUint16(at, true) !== status) dv.setUint16(at, status, true);
      }
    }
    for (let i = 0; i < k; i++) {
      if (!pending[i]) continue;
      this.#checksums?.stamp(i);
      publishWord(region, layout.slotBase(i) + respOff, seqs[i] as number); // results, status, checksum, word
    }
  }

  /**
   * A SHUTDOWN in a slot whose env is still in the pool (a client closed with envs in flight:
   * its close writes SHUTDOWN into every slot; its request word moved past the STEP's sequence
   * the server answers when the env ends). Answered at once, every slot with a request (status
   * 0), after the lease's envs are dropped (worker threads terminated, in-flight results never
   * published): the client's close, bounded to 1 s, must not wait for the envs, and the lease is
   * free for the next client once it is answered. False (nothing done) when no in-flight slot
   * carries a SHUTDOWN. As the Python server's `_shutdown_in_flight`.
   */
  #shutdownInFlight(): boolean {
    const region = this.region;
    const words = region.words;
    const layout = this.layout;
    const k = this.numSlots;
    const reqOff = off(layout.slot, "sem_action_ready");
    const respOff = off(layout.slot, "sem_result_ready");
    const cmdOff = off(layout.slot, "command");
    let found = false;
    for (let i = 0; i < k && !found; i++) {
      if (!this.#inFlight[i]) continue;
      const base = layout.slotBase(i);
      const req = Atomics.load(words, (base + reqOff) >> 2) & SEQ_MASK;
      // seqs[i]: the STEP's sequence, answered when its env ends; a newer request is the client's
      if (req !== (this.#seqs[i] as number) && words[(base + cmdOff) >> 2] === SlotCommand.SHUTDOWN) found = true;
    }
    if (!found) return false;
    const pending = this.#pending;
    for (let i = 0; i < k; i++) {
      const base = layout.slotBase(i);
      const req = Atomics.load(words, (base + reqOff) >> 2) & SEQ_MASK;
      const resp = Atomics.load(words, (base + respOff) >> 2) & SEQ_MASK;
      pending[i] = req !== resp ? 1 : 0;
      if (pending[i]) this.#seqs[i] = req;
    }
    this.#dropLease(); // in-flight flags cleared: nothing of the old session is published later
    this.#answerPending(0);
    return true;
  }

  /** STEP_MULTI on slots 0..seats-1 (one seat action each) and no others: the runtime's. */
  #stepMulti(runtime: EnvRuntime, count: number): void {
    const seats = runtime.seats;
    const pending = this.#pending;
    let exact = count === seats;
    for (let i = 0; i < seats && exact; i++) if (!pending[i]) exact = false;
    if (!exact) {
      throw new RequestError(ErrorCode.BAD_BATCH, `STEP_MULTI needs slots 0..${seats - 1} and no others (${count} slots asked)`);
    }
    runtime.checkMulti();
    this.#readActions(runtime, 0, seats);
    runtime.stepMulti(this.#records);
  }

  #newLease(pid: number): Lease {
    this.#dropLease();
    const runtime = this.#spare ?? this.#host.runtime(this.numEnvs, this.url);
    this.#spare = null;
    this.#spareFailed = false;
    this.#records.useRuntime(runtime);
    this.#lease = { clientPid: pid, runtime };
    this.stats.connections++;
    return this.#lease;
  }

  /** Slot actions [from, to) into the runtime's action array. */
  #readActions(runtime: EnvRuntime, from: number, to: number): void {
    const stride = this.#actionStride;
    readActions(runtime.actions, this.region.bytes, this.#actionAt + from * stride, stride, to - from, this.#actionType, from);
  }

  #slotSeed(index: number): bigint | null {
    const region = this.region;
    if (!region.bytes[region.slotAt(index, "has_seed")]) return null;
    return region.dv.getBigUint64(region.slotAt(index, "seed"), true);
  }

  /** HELLO: the auto-reset mode in slot `index`'s `action` (docs/shm.md "Auto-reset"). */
  #mode(index: number): AutoReset {
    const into = MODE;
    readActions(into, this.region.bytes, this.#actionAt + index * this.#actionStride, 0, 1, this.#actionType);
    const mode = into[0] as number;
    return checkAutoreset(mode, () => `unknown auto-reset mode ${mode}`);
  }

  /** OBSERVE: the results rewritten in place, each env's info map in its slot's info area. */
  #observe(runtime: EnvRuntime): void {
    const infos = runtime.observe(this.#records);
    const region = this.region;
    const maps = infos.map((info) => msgpackEncode(info ?? {}));
    const large = new Map<number, Uint8Array>();
    for (let i = 0; i < this.numEnvs; i++) {
      const data = maps[i] as Uint8Array;
      if (data.byteLength > this.layout.infoMax) large.set(i, data);
    }
    // too large for the slot (a rendered frame): in the side segment, a SIDE_REF in the slot
    const refs = large.size > 0 ? this.#side.write(large) : null;
    for (let i = 0; i < this.numEnvs; i++) {
      const ref = refs?.get(i);
      if (ref === undefined) {
        this.#writeBytes(i, maps[i] ?? msgpackEncode({}));
        continue;
      }
      region.bytes.set(ref, region.slotAt(i, "info"));
      region.dv.setUint16(region.slotAt(i, "info_len"), INFO_SIDE, true);
    }
  }

  /** A msgpack map in slot `index`'s info area (info_len 0 when it does not fit). */
  #writeInfo(index: number, info: Record<string, unknown>): void {
    this.#writeBytes(index, msgpackEncode(info));
  }

  /** Packed msgpack bytes in slot `index`'s info area (info_len 0 when they do not fit). */
  #writeBytes(index: number, data: Uint8Array): void {
    const region = this.region;
    const fits = data.byteLength <= this.layout.infoMax;
    if (fits) region.bytes.set(data, region.slotAt(index, "info"));
    region.dv.setUint16(region.slotAt(index, "info_len"), fits ? data.byteLength : 0, true);
  }

  /** Slots with different commands, or a subset: each answered on its own (a pool's STEPs: submitted). */
  #mixed(runtime: EnvRuntime): void {
    const region = this.region;
    const dv = region.dv;
    if (runtime.runner.concurrent !== undefined) this.#submit(runtime);
    for (let i = 0; i < this.numSlots; i++) {
      if (!this.#pending[i]) continue;
      let code = 0;
      try {
        const cmd = dv.getUint32(region.slotAt(i, "command"), true);
        if (cmd === SlotCommand.SHUTDOWN) {
          this.#dropLease();
        } else if (cmd === SlotCommand.HELLO) {
          runtime.autoreset = this.#mode(i);
        } else if (i >= this.numEnvs) {
          throw new RequestError(ErrorCode.BAD_BATCH, `slot ${i} is a seat slot (STEP_MULTI only); this server has ${this.numEnvs} envs`);
        } else if (cmd === SlotCommand.STEP) {
          this.#readActions(runtime, i, i + 1);
          runtime.step(this.#records, i, i + 1);
        } else if (cmd === SlotCommand.RESET) {
          runtime.reset(this.#records, this.#seedOf, i, i + 1);
        } else if (cmd === SlotCommand.OBSERVE || cmd === SlotCommand.STEP_MULTI) {
          const name = cmd === SlotCommand.OBSERVE ? "OBSERVE" : "STEP_MULTI";
          throw new RequestError(ErrorCode.BAD_BATCH, `slot ${i}: ${name} is asked of its slots alone, not mixed with other commands`);
        } else {
          throw new RequestError(ErrorCode.UNKNOWN_MESSAGE, `slot ${i}: command ${cmd}`);
        }
      } catch (error) {
        if (error instanceof RequestError) {
          code = error.code;
          this.#writeText(i, error.text);
        } else {
          code = ErrorCode.INTERNAL;
          this.#writeText(i, describeError(error));
        }
      }
      dv.setUint16(region.slotAt(i, "status"), code, true);
    }
  }

  /**
   * The pending STEP slots of env slots go to the worker pool together (every action checked
   * first, as a SEND: a refusal answers them all with it); they leave `#pending` and are
   * published as their envs finish. A masked "noop" action is answered now (no step).
   */
  #submit(runtime: EnvRuntime): void {
    const pool = runtime.runner.concurrent;
    if (pool === undefined) return;
    const region = this.region;
    const pending = this.#pending;
    const ids: number[] = [];
    for (let i = 0; i < this.numEnvs; i++) {
      if (pending[i] && region.dv.getUint32(region.slotAt(i, "command"), true) === SlotCommand.STEP) ids.push(i);
    }
    if (ids.length === 0) return;
    for (const i of ids) this.#readActions(runtime, i, i + 1);
    const ops = this.#ops;
    try {
      runtime.planAsync(ids, ops, this.#records);
    } catch (error) {
      if (!(error instanceof RequestError)) throw error;
      for (const i of ids) {
        this.#writeText(i, error.text);
        region.dv.setUint16(region.slotAt(i, "status"), error.code, true);
        pending[i] = 0;
        this.#publishSlot(i);
      }
      return;
    }
    const submit: number[] = [];
    for (const i of ids) {
      pending[i] = 0;
      if (ops[i] === Op.NONE) {
        region.dv.setUint16(region.slotAt(i, "status"), 0, true);
        this.#publishSlot(i);
      } else {
        submit.push(i);
        this.#inFlight[i] = 1;
      }
    }
    this.#inFlightCount += submit.length;
    if (submit.length) pool.submit(submit, ops, runtime.actions, runtime.autoreset);
  }

  /** Publish slot i's response (its status and results are written): checksum, then the word. */
  #publishSlot(i: number): void {
    this.#checksums?.stamp(i);
    publishWord(this.region, this.layout.slotBase(i) + off(this.layout.slot, "sem_result_ready"), this.#seqs[i] as number);
  }

  /**
   * Publish each slot whose env finished in the pool: its result (or its env's error after
   * recovery), status, word; then wake the client only if its RECV can end (docs/shm.md "One
   * wake per RECV", tp_server_publish_async): the words are exchanged first, the client's RECV
   * wake hint is loaded after them, and one sleeping word is woken once fewer than `hint` envs
   * are still in flight (hint 0, an older client: every sleeping word, as before).
   */
  #publishFinished(): void {
    const runtime = this.#lease?.runtime;
    const pool = runtime?.runner.concurrent;
    if (runtime === undefined || pool === undefined) return;
    const done: AsyncDone[] = pool.take(this.numSlots, this.#records);
    if (done.length === 0) return;
    const region = this.region;
    const words = region.words;
    const respOff = off(this.layout.slot, "sem_result_ready");
    const sleepers = this.#sleepers;
    let asleep = 0;
    let failed = false; // an env's error is answered at once (a Node client's RECV ends on it)
    for (const d of done) {
      const i = d.index;
      let code = 0;
      const stalled = d.error === null ? runtime.finishAsync(d, this.#records, this.#ops[i] === Op.STEP) : null;
      if (d.error !== null || stalled !== null) {
        const error = runtime.recoverAsync([stalled ?? [i, d.error]], this.#records);
        code = error.code;
        this.#writeText(i, error.text);
        failed = true;
      }
      region.dv.setUint16(region.slotAt(i, "status"), code, true);
      if (this.#inFlight[i]) {
        this.#inFlight[i] = 0;
        this.#inFlightCount--;
      }
      this.#checksums?.stamp(i); // results, status, final, checksum, then the word
      const at = this.layout.slotBase(i) + respOff;
      if (Atomics.exchange(words, at >> 2, (this.#seqs[i] as number) & SEQ_MASK) & SLEEP_BIT) sleepers[asleep++] = at;
    }
    if (asleep === 0) return;
    const hintAt = region.recvHintAt;
    const hint = hintAt === null ? 0 : Atomics.load(words, hintAt >> 2) >>> 0;
    if (hint !== 0 && !failed) {
      // a hinting client sleeps on every unanswered word at once: one wake ends its sleep
      if (this.#inFlightCount < hint) futexWake(region, sleepers[0] as number);
      return;
    }
    for (let j = 0; j < asleep; j++) futexWake(region, sleepers[j] as number);
  }

  #writeText(index: number, text: string): void {
    const region = this.region;
    const data = utf8Cut(text, this.layout.errorTextMax);
    region.bytes.set(data, region.slotAt(index, "error_text"));
    region.dv.setUint16(region.slotAt(index, "error_len"), data.length, true);
  }

  #errorAll(text: string): void {
    const pending = this.#pending;
    for (let i = 0; i < this.numSlots; i++) if (pending[i]) this.#writeText(i, text);
  }

  /** Idle: reclaim the lease of a dead client (its envs are dropped); keep spare envs ready. */
  #housekeeping(): void {
    const region = this.region;
    const pid = Atomics.load(region.words, this.#clientPidWord) >>> 0;
    const start = region.dv.getBigUint64(this.#clientStartAt, true);
    if (pid && !peerAlive(pid, start)) {
      process.stderr.write(`transport: shm://${this.shm.name}: client pid ${pid} is gone; reclaiming its lease\n`);
      this.#reclaim(pid, start);
    }
    if (this.#spare === null && this.#lease === null && !this.#spareFailed) {
      try {
        this.#spare = this.#host.runtime(this.numEnvs, this.url);
        this.#spare.runner.start?.();
      } catch (error) {
        // the next client's HELLO is told (it tries again); not retried while idle
        this.#spareFailed = true;
        process.stderr.write(`transport: shm://${this.shm.name}: cannot make the next client's envs: ${describeError(error)}\n`);
      }
    }
  }

  /** Free the lease of `pid` (dead, or not a client) unless it changed meanwhile; its envs
   * are dropped. client_start_time first (0: "attaching"), then the CAS, as a client releases. */
  #reclaim(pid: number, start: bigint): void {
    const region = this.region;
    if (Atomics.load(region.words, this.#clientPidWord) >>> 0 !== pid || region.dv.getBigUint64(this.#clientStartAt, true) !== start) {
      return; // released or taken meanwhile: not ours to touch
    }
    region.dv.setBigUint64(this.#clientStartAt, 0n, true);
    Atomics.compareExchange(region.words, this.#clientPidWord, pid | 0, 0);
    if (this.#lease !== null && this.#lease.clientPid === pid) this.#dropLease();
    this.#watch.forget();
  }

  // -- the region under the server (docs/shm.md "A region changed under its server") ---------------

  /** The watch's periodic look: true when the server stopped (the region is gone, resized or no
   * longer READY); scribbled fields it owns are rewritten and a lease held by a live process
   * that is not a client is reclaimed. */
  #lookAtRegion(): boolean {
    const watch = this.#watch;
    const loss = watch.lost(); // before anything past the first page is read (SIGBUS)
    if (loss !== null) {
      this.#lost(loss.reason, loss.backed);
      return true;
    }
    const region = this.region;
    if (Atomics.load(region.words, region.cbWord("state")) !== RegionState.READY) {
      this.#lost(this.#strayState(), this.region.size);
      return true;
    }
    watch.repair();
    const pid = Atomics.load(region.words, this.#clientPidWord) >>> 0;
    if (pid) {
      const start = region.dv.getBigUint64(this.#clientStartAt, true);
      if (peerAlive(pid, start)) {
        const why = watch.foreignHolder(pid, start); // a dead one: #housekeeping reclaims it
        if (why !== null) {
          process.stderr.write(`transport: ${why}\n`);
          this.#reclaim(pid, start);
        }
      }
    } else {
      watch.forget(); // released: the next holder, even the same process, is looked at anew
    }
    return false;
  }

  /** The line for a state word this server did not write (the Python server's text). */
  #strayState(): string {
    const value = Atomics.load(this.region.words, this.region.cbWord("state")) >>> 0;
    const name = Object.entries(RegionState).find(([, v]) => v === value)?.[0] ?? "an unknown value";
    return (
      `${this.url}: the region's state word was set to ${value} (${name}) by another process while this server ` +
      `(pid ${process.pid}) was serving; the server stops (clients of a region that is not READY give up)`
    );
  }

  /** Stop on our own: say why, close as `close()` does (touching only the `backed` bytes the
   * segment still has: no SIGBUS), then tell `onShmServerStopped` handlers. */
  #lost(reason: string, backed: number): void {
    if (this.#closed) return;
    this.failure = reason;
    process.stderr.write(`transport: ${reason}\n`);
    this.#shutdown(backed);
    for (const handler of STOP_HANDLERS) handler(reason, this.url);
  }

  // -- shutdown ------------------------------------------------------------------------------------

  /** Mark the region CLOSED, wake every waiter, stop serving, unlink the segment, unmap. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#shutdown(this.region.size);
    await this.#stopped;
  }

  /** CLOSED, wake every waiter, unlink our segment, unmap, drop the envs, end the loop; only
   * the first `backed` bytes of the mapping are touched (a truncated segment's lost pages would
   * be a SIGBUS: its mapping is left to be unmapped when its views are collected). */
  #shutdown(backed: number): void {
    this.#closed = true; // the loop is not running now (one thread): it stops at its next turn
    const region = this.region;
    const stateAt = off(CB, "state");
    if (stateAt + 4 <= backed) Atomics.store(region.words, stateAt >> 2, RegionState.CLOSED);
    if (this.#doorbellAt + 4 <= backed) futexWake(region, this.#doorbellAt);
    const respOff = off(this.layout.slot, "sem_result_ready");
    for (let i = 0; i < this.numSlots; i++) {
      const at = this.layout.slotBase(i) + respOff;
      if (at + 4 <= backed) futexWake(region, at);
    }
    region.unlinkIfOurs();
    this.#side.close();
    if (backed >= region.size) region.unmap();
    this.#dropLease();
    this.#spare?.close();
    this.#spare = null;
    this.#stop();
  }
}

export async function listen(url: string, host: EnvHost, _options: ListenOptions = {}): Promise<ShmListener> {
  return new ShmListener(url, host);
}
