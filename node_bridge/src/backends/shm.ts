/**
 * shm://name?num_envs=N: the Node server of the shared-memory + futex backend (docs/shm.md; the
 * Python twin is transport/backends/shm.py, whose client this server answers byte for byte).
 *
 * The region is created through koffi (shm_open O_EXCL 0600, posix_fallocate, mmap MAP_SHARED)
 * and read and written through typed arrays over `koffi.view(address, size)`: an ArrayBuffer
 * whose backing store *is* the mapping, so the client's writes are visible with no copy and
 * the words are published with `Atomics` (exchange / compareExchange / load / store) on an
 * Int32Array over it. Waiting follows the C loop of tp_native.c: spin on Atomics.load (with a
 * sched_yield every 256 loads), then FUTEX_WAIT slices through `syscall(SYS_futex)`.
 *
 * Event loop: the server waits synchronously (a futex slice of at most `slice_ms`, 50 ms by
 * default, or a spin of at most the spin budget), and returns to the event loop after every idle
 * slice and every ~20 ms of busy serving, so signals (SIGINT / SIGTERM close and unlink), timers
 * and `close()` run within about one slice. A process that hosts an shm:// server should do
 * little else on its main thread (see docs/shm.md "Node server").
 *
 * Results: the env's result object is encoded with the STEP_RESP codec (validation and canonical
 * bytes, as for the stream backends) into a per-env scratch record, then each field's bytes are
 * copied to its Slot offset (the pac_shm Slot keeps Appendix B's offsets, which differ from the
 * packed StepResult's: one 2.5 KB copy per env step, no allocation). The client reads the slot in
 * place.
 *
 * Auto-reset (docs/shm.md "Auto-reset"): the HELLO slot command (3) carries the lease's mode in
 * `action` (0 disabled, 1 next_step, 2 same_step), as session.ts takes it from HELLO_REQ flags.
 * NEXT_STEP ignores a done env's action and resets it; SAME_STEP copies an ending step's result
 * from the slot into the env's final area (after the N slots), stamps `final_seq` with the
 * request's sequence and resets the env: the slot holds the reset result.
 *
 * Env errors (session.ts `#recover`, transport/server.py): an env that throws is answered with
 * ENV_ERROR `env {i}: <Name>: <message> (the env was reset | the env was recreated | the env
 * could not be reset: send a reset)`, several joined by "; "; the other envs did their step.
 * Anything else that throws is a server bug: INTERNAL.
 *
 * Worker threads (`--workers K`, workers.ts): each lease gets its own `WorkerPool` (made with
 * the lease's spare envs, before the client asks); a batch is one fan-out to the K threads, whose
 * records are then copied into the slots (and SAME_STEP finals into the final areas) with the
 * same copy plan. As in transport/backends/shm.py, a subset request is BAD_BATCH with a pool.
 */

import { encode as msgpackEncode } from "@msgpack/msgpack";
import type { AnyStructCodec, SchemaModule } from "../codec";
import type { Env, Spaces } from "../env";
import { CodecError, ConnectError, ProtocolError } from "../errors";
import type { FieldJson } from "../ir";
import { AutoReset, ErrorCode, RequestError } from "../protocol";
import type { EnvPool, Session } from "../session";
import { newStats, type Channel, type ConnectionStats } from "../stream";
import {
  CB,
  CONTROL_SIZE,
  ERROR_TEXT_MAX,
  FINAL_SEQ_OFFSET,
  FINAL_SIZE,
  INFO_MAX,
  LAYOUT_VERSION,
  MAGIC,
  RESULT_OFFSET,
  Region,
  RegionState,
  SEQ_MASK,
  SLOT,
  SLOT_SIZE,
  type ShmUrl,
  SlotCommand,
  WAIT_CLOSED,
  WAIT_TIMEOUT,
  finalsOffset,
  futexWake,
  off,
  parseShmUrl,
  peerAlive,
  procStartTime,
  publishWord,
  waitWord,
} from "../shm/region";
import type { Listener, ListenOptions, OpenOptions } from "./index";

type AnyEnv = Env<unknown>;

/** What an env's failed recovery answers (transport/server.py FATE_*, session.ts). */
const FATE_RESET = "the env was reset";
const FATE_RECREATED = "the env was recreated";
const FATE_FAILED = "the env could not be reset: send a reset";

/** A failure of one env during a request: its index and what it threw. */
type Failure = readonly [index: number, error: unknown];

/** One run of bytes copied from the encoded StepResult to the slot. */
interface Copy {
  readonly from: number;
  readonly to: number;
  readonly size: number;
}

/** How the STEP_RESP struct lands in a slot: its codec, the copy plan, the mask and done bytes. */
export interface ResultLayout {
  readonly codec: AnyStructCodec;
  readonly copies: readonly Copy[];
  /** Slot offset of the action mask (u8 / bool per action), -1 if the result has none. */
  readonly maskAt: number;
  readonly maskCount: number;
  /** Slot offset of the done / terminated byte, -1 if none. */
  readonly doneAt: number;
}

function bodyCodec(schema: SchemaModule, message: string): AnyStructCodec {
  const body = schema.messages[message]?.body;
  const codec = body ? schema.structs[body] : undefined;
  if (codec === undefined) throw new ProtocolError(`schema ${schema.name} has no ${message} body struct`);
  return codec;
}

/**
 * Map every field of the schema's STEP_RESP struct to the Slot field of the same name (as
 * transport/backends/shm.py `result_dtype` does); a field the Slot lacks, or one of another
 * size, is an error naming it.
 */
export function resultLayout(schema: SchemaModule): ResultLayout {
  const codec = bodyCodec(schema, "STEP_RESP");
  const fields: readonly FieldJson[] = schema.ir.structs[codec.name]?.fields ?? [];
  const runs: Copy[] = [];
  let maskAt = -1;
  let maskCount = 0;
  let doneAt = -1;
  for (const f of [...fields].sort((a, b) => a.offset - b.offset)) {
    const slot = SLOT[f.name];
    if (slot === undefined || slot.offset < RESULT_OFFSET) {
      throw new ProtocolError(`shm:// cannot carry ${codec.name}.${f.name}: the pac_shm Slot has no such field`);
    }
    if (slot.size !== f.size || slot.count !== f.count) {
      throw new ProtocolError(
        `shm:// cannot carry ${codec.name}.${f.name}: ${f.type} in the schema, ${slot.type} in the pac_shm Slot`,
      );
    }
    const last = runs[runs.length - 1];
    if (last !== undefined && last.from + last.size === f.offset && last.to + last.size === slot.offset) {
      runs[runs.length - 1] = { from: last.from, to: last.to, size: last.size + f.size };
    } else {
      runs.push({ from: f.offset, to: slot.offset, size: f.size });
    }
    if (f.role === "action_mask" && f.size === f.count) {
      maskAt = slot.offset;
      maskCount = f.count;
    }
    if ((f.role === "done" || (f.role === "terminated" && doneAt < 0)) && f.size === 1) doneAt = slot.offset;
  }
  return { codec, copies: runs, maskAt, maskCount, doneAt };
}

/** UTF-8 `text` cut at a character boundary to at most `max` bytes. */
export function utf8Cut(text: string, max: number): Buffer {
  const data = Buffer.from(text, "utf8");
  if (data.length <= max) return data;
  let cut = max;
  while (cut > 0 && ((data[cut] as number) & 0xc0) === 0x80) cut--;
  return data.subarray(0, cut);
}

function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

/**
 * One lease holder's envs and the bookkeeping of the checks (the same checks, order, codes and
 * texts as session.ts / transport/server.py `EnvGroup.check_action`; Session keeps its own
 * private, so this is a small local copy working on the slots).
 */
class ShmSession {
  clientPid = 0;
  /** The envs; one that threw and could not be reset may be replaced by a factory-made one. */
  readonly envs: AnyEnv[];
  readonly spaces: Spaces;
  readonly firstSeed: bigint | null;
  readonly factory: (() => AnyEnv) | null;
  readonly masks: Uint8Array;
  readonly done: Uint8Array;
  readonly wasReset: Uint8Array;
  allReset = false;
  /** The lease's auto-reset mode (HELLO slot command; disabled until then). */
  autoreset: AutoReset = AutoReset.DISABLED;
  /** The worker threads stepping `envs` (`--workers K`); null: they step on this thread. */
  readonly pool: EnvPool | null;

  constructor(
    envs: readonly AnyEnv[],
    firstSeed: bigint | null,
    factory: (() => AnyEnv) | null,
    pool: EnvPool | null = null,
  ) {
    this.pool = pool;
    this.envs = [...envs];
    this.factory = factory;
    this.spaces = envs[0]!.spaces();
    this.firstSeed = firstSeed;
    this.masks = new Uint8Array(envs.length * this.spaces.actN).fill(1);
    this.done = new Uint8Array(envs.length);
    this.wasReset = new Uint8Array(envs.length);
  }

  checkAction(index: number, action: number): void {
    if (!this.allReset && !this.wasReset[index]) {
      throw new RequestError(ErrorCode.NOT_RESET, `env ${index}: step before the first reset`);
    }
    if (this.done[index]) {
      throw new RequestError(ErrorCode.NOT_RESET, `env ${index}: episode is done; reset first`);
    }
    const actN = this.spaces.actN;
    if (!(action >= 0 && action < actN)) {
      throw new RequestError(ErrorCode.INVALID_ACTION, `env ${index}: action ${action} is outside 0..${actN - 1}`);
    }
    if (!this.masks[index * actN + action]) {
      throw new RequestError(ErrorCode.MASKED_ACTION, `env ${index}: action ${action} is masked out`);
    }
  }

  markReset(index: number): void {
    this.wasReset[index] = 1;
    if (!this.allReset) this.allReset = !this.wasReset.includes(0);
  }

  /** Every step of env `index` is NOT_RESET until a reset succeeds. */
  markNotReset(index: number): void {
    this.wasReset[index] = 0;
    this.allReset = false;
  }
}

/** The shm:// server: one region, one client lease at a time, one loop on the main thread. */
export class ShmListener implements Listener {
  readonly url: string;
  readonly stats: ConnectionStats = newStats();
  readonly shm: ShmUrl;
  readonly numEnvs: number;
  readonly region: Region;
  /** FUTEX_WAIT calls the loop made while idle or waiting (how often it slept). */
  sleeps = 0;
  readonly #makeEnvs: () => readonly AnyEnv[];
  readonly #makePool: (() => EnvPool) | null;
  /** The actions of a pooled batch (one array, reused). */
  readonly #actions: Int32Array;
  readonly #factory: (() => AnyEnv) | null;
  readonly #firstSeed: bigint | null;
  readonly #layout: ResultLayout;
  readonly #scratch: Uint8Array;
  readonly #pending: Uint8Array;
  readonly #seqs: Int32Array;
  /** Byte offset of env 0's final area (env i: + i * FINAL_SIZE). */
  readonly #finalsAt: number;
  readonly #doorbellAt: number;
  readonly #clientPidWord: number;
  readonly #clientStartAt: number;
  #session: ShmSession | null = null;
  #spare: ShmSession | null = null;
  #last = 0;
  #idle = false;
  #closed = false;
  #stopped: Promise<void>;
  #stop: () => void = () => undefined;

  constructor(url: string, sessions: () => Session) {
    this.url = url;
    this.shm = parseShmUrl(url);
    const probe = sessions();
    const schema = probe.schema;
    this.#layout = resultLayout(schema);
    const [numEnvs, makeEnvs] = envSource(url, this.shm.numEnvs, probe, sessions);
    this.numEnvs = numEnvs;
    this.#makeEnvs = makeEnvs;
    this.#makePool = probe.makePool;
    if (this.#makePool !== null && numEnvs !== probe.numEnvs) {
      throw new ConnectError(
        `${url} asks for ${numEnvs} envs but the worker pool was made for ${probe.numEnvs} (numEnvs)`,
      );
    }
    this.#actions = new Int32Array(numEnvs);
    this.#factory = probe.factory;
    this.#firstSeed = probe.firstSeed;
    const obsN = SLOT["observation"]!.count;
    const actN = SLOT["action_mask"]!.count;
    if (probe.spaces.obsN !== obsN || probe.spaces.actN !== actN) {
      throw new ConnectError(
        `shm:// needs envs with ${obsN} observations and ${actN} actions (the pac_shm slot); ` +
          `this env has ${probe.spaces.obsN} and ${probe.spaces.actN}`,
      );
    }
    this.#scratch = new Uint8Array(this.#layout.codec.size);
    this.#pending = new Uint8Array(numEnvs);
    this.#seqs = new Int32Array(numEnvs);
    this.#finalsAt = finalsOffset(numEnvs);
    this.#doorbellAt = off(CB, "doorbell");
    this.#clientPidWord = off(CB, "client_pid") >> 2;
    this.#clientStartAt = off(CB, "client_start_time");
    this.#stopped = new Promise((resolve) => {
      this.#stop = resolve;
    });

    const region = Region.create(this.shm, numEnvs);
    this.region = region;
    try {
      const dv = region.dv;
      dv.setUint32(off(CB, "owner_pid"), process.pid, true);
      dv.setBigUint64(off(CB, "owner_start_time"), procStartTime(process.pid), true);
      // the first client's envs, made before READY
      this.#spare =
        numEnvs === probe.numEnvs && this.#makePool === null
          ? new ShmSession(probe.envs, this.#firstSeed, this.#factory)
          : this.#newEnvs();
      dv.setUint32(off(CB, "magic"), MAGIC, true);
      dv.setUint32(off(CB, "version"), LAYOUT_VERSION, true);
      dv.setUint32(off(CB, "num_envs"), numEnvs, true);
      dv.setUint32(off(CB, "obs_size"), obsN, true);
      dv.setUint32(off(CB, "act_size"), actN, true);
      dv.setUint32(off(CB, "slot_size"), SLOT_SIZE, true);
      dv.setBigUint64(off(CB, "fingerprint"), schema.fingerprint, true);
      const info = msgpackEncode({ env: probe.info["env"] ?? "", server: probe.info["server"] ?? "node" });
      const infoBytes = info.subarray(0, INFO_MAX);
      region.bytes.set(infoBytes, region.slotAt(0, "info"));
      dv.setUint16(region.slotAt(0, "info_len"), infoBytes.length, true);
      this.#last = Atomics.load(region.words, this.#doorbellAt >> 2) & SEQ_MASK; // before READY
      Atomics.store(region.words, region.cbWord("state"), RegionState.READY); // last: ready
    } catch (error) {
      this.#spare?.pool?.close();
      region.unlinkIfOurs();
      region.unmap();
      throw error;
    }
    setImmediate(this.#tick);
  }

  #newEnvs(): ShmSession {
    const pool = this.#makePool === null ? null : this.#makePool();
    return new ShmSession(this.#makeEnvs(), this.#firstSeed, this.#factory, pool);
  }

  /** Drop the lease's envs (and stop its worker threads). */
  #dropSession(): void {
    this.#session?.pool?.close();
    this.#session = null;
  }

  // -- the loop ------------------------------------------------------------------------------------

  /** Serve until idle for one slice or busy for ~20 ms, then give the event loop a turn. */
  readonly #tick = (): void => {
    if (this.#closed) return;
    const region = this.region;
    const policy = this.shm.wait;
    const sliceNs = Math.max(1, policy.futexSliceMs) * 1e6;
    const burstEnd = performance.now() + 20;
    try {
      for (;;) {
        const rc = waitWord(region, this.#doorbellAt, this.#last, false, sliceNs, {
          spin: this.#idle ? 0 : policy.spin, // an idle server sleeps at once
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
          this.#stop();
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
    const n = this.numEnvs;
    const pending = this.#pending;
    const seqs = this.#seqs;
    const reqOff = off(SLOT, "sem_action_ready");
    const respOff = off(SLOT, "sem_result_ready");
    const cmdOff = off(SLOT, "command");
    let count = 0;
    let cmd = -2;
    for (let i = 0; i < n; i++) {
      const base = CONTROL_SIZE + i * SLOT_SIZE;
      const req = Atomics.load(words, (base + reqOff) >> 2) & SEQ_MASK;
      const resp = Atomics.load(words, (base + respOff) >> 2) & SEQ_MASK;
      if (req !== resp) {
        pending[i] = 1;
        seqs[i] = req; // answer exactly this request, even if a newer one follows
        count++;
        const c = words[(base + cmdOff) >> 2] as number;
        cmd = cmd === -2 ? c : cmd === c ? cmd : -1;
      } else {
        pending[i] = 0;
      }
    }
    if (count === 0) return;
    const pid = Atomics.load(words, this.#clientPidWord) >>> 0;
    let session = this.#session;
    if (session === null || session.clientPid !== pid) session = pid ? this.#newSession(pid) : null;
    let status = 0;
    try {
      if (session === null) throw new RequestError(ErrorCode.HELLO_REQUIRED, "take the region's lease first");
      if (count === n && cmd === SlotCommand.STEP) this.#stepAll(session);
      else if (count === n && cmd === SlotCommand.RESET) this.#resetAll(session);
      else if (count === n && cmd === SlotCommand.HELLO) session.autoreset = this.#mode(0);
      else if (cmd === SlotCommand.SHUTDOWN) this.#dropSession();
      else {
        this.#mixed(session);
        status = -1; // statuses written per slot
      }
    } catch (error) {
      if (error instanceof RequestError) {
        status = error.code;
        this.#errorAll(error.text);
      } else {
        status = ErrorCode.INTERNAL; // a bug must not take the server down (env errors: #recover)
        this.#errorAll(describeError(error));
      }
    }
    const statusOff = off(SLOT, "status");
    const dv = region.dv;
    for (let i = 0; i < n; i++) {
      if (!pending[i]) continue;
      const base = CONTROL_SIZE + i * SLOT_SIZE;
      if (status >= 0) dv.setUint16(base + statusOff, status, true);
      publishWord(region, base + respOff, seqs[i] as number); // results, status, then the word
    }
  }

  #newSession(pid: number): ShmSession {
    this.#dropSession();
    const session = this.#spare ?? this.#newEnvs();
    this.#spare = null;
    session.clientPid = pid;
    this.#session = session;
    this.stats.connections++;
    return session;
  }

  #writeText(index: number, text: string): void {
    const region = this.region;
    const data = utf8Cut(text, ERROR_TEXT_MAX);
    region.bytes.set(data, region.slotAt(index, "error_text"));
    region.dv.setUint16(region.slotAt(index, "error_len"), data.length, true);
  }

  #errorAll(text: string): void {
    const pending = this.#pending;
    for (let i = 0; i < this.numEnvs; i++) if (pending[i]) this.#writeText(i, text);
  }

  /** Encode the env's result (validated, canonical) and copy its fields to the slot offsets. */
  #write(session: ShmSession, index: number, output: unknown): void {
    const layout = this.#layout;
    const scratch = this.#scratch;
    try {
      layout.codec.encodeInto(output, scratch, 0);
    } catch (error) {
      if (error instanceof CodecError) {
        throw new RequestError(ErrorCode.ENV_ERROR, `env ${index}: returned bad values: ${error.message}`);
      }
      throw error;
    }
    this.#writeRecord(session, index, scratch);
  }

  /** Copy an encoded result's fields to env `index`'s slot; remember its mask and done. */
  #writeRecord(session: ShmSession, index: number, record: Uint8Array): void {
    const layout = this.#layout;
    const bytes = this.region.bytes;
    const base = CONTROL_SIZE + index * SLOT_SIZE;
    for (const c of layout.copies) bytes.set(record.subarray(c.from, c.from + c.size), base + c.to);
    if (layout.maskAt >= 0) {
      const actN = session.spaces.actN;
      const count = Math.min(actN, layout.maskCount);
      const at = base + layout.maskAt;
      session.masks.set(bytes.subarray(at, at + count), index * actN);
    }
    if (layout.doneAt >= 0) session.done[index] = bytes[base + layout.doneAt] ? 1 : 0;
  }

  /**
   * STEP on every slot: every action checked first (a refused batch steps nothing; NEXT_STEP: a
   * done env's action is ignored, not checked), then every env steps; an env that throws is
   * recovered after the others stepped.
   */
  #stepAll(session: ShmSession): void {
    const words = this.region.words;
    const n = this.numEnvs;
    const actionWord = (CONTROL_SIZE + off(SLOT, "action")) >> 2;
    const stride = SLOT_SIZE >> 2;
    const skipDone = session.autoreset === AutoReset.NEXT_STEP;
    const done = session.done;
    for (let i = 0; i < n; i++) {
      if (skipDone && done[i] && (session.allReset || session.wasReset[i])) continue;
      session.checkAction(i, words[actionWord + i * stride] as number);
    }
    if (session.pool !== null) {
      const actions = this.#actions;
      for (let i = 0; i < n; i++) actions[i] = words[actionWord + i * stride] as number;
      this.#poolStep(session, session.pool, actions);
      return;
    }
    let failures: Failure[] | null = null;
    for (let i = 0; i < n; i++) {
      try {
        if (this.#stepOne(session, i, words[actionWord + i * stride] as number)) this.#stampFinal(i);
      } catch (error) {
        (failures ??= []).push([i, error]); // the other envs still step
      }
    }
    if (failures !== null) throw this.#recover(session, failures, null);
  }

  /** A batch stepped by the worker threads (they auto-reset as the lease's mode says). */
  #poolStep(session: ShmSession, pool: EnvPool, actions: Int32Array): void {
    const n = this.numEnvs;
    const nextStep = session.autoreset === AutoReset.NEXT_STEP;
    const wasDone = nextStep ? session.done.slice() : null; // these envs are reset, not stepped
    const { ended, failures } = pool.step(actions, session.autoreset);
    this.#copyPoolResults(session, pool);
    const failed = new Set(failures.map(([i]) => i));
    if (wasDone !== null) for (let i = 0; i < n; i++) if (wasDone[i] && !failed.has(i)) session.markReset(i);
    const bytes = this.region.bytes;
    for (const i of ended) {
      const final = this.#finalsAt + i * FINAL_SIZE;
      const record = pool.finalRecord(i);
      for (const c of this.#layout.copies) bytes.set(record.subarray(c.from, c.from + c.size), final + c.to);
      this.#stampFinal(i);
    }
    if (failures.length) throw this.#recover(session, failures, null);
  }

  #copyPoolResults(session: ShmSession, pool: EnvPool): void {
    const size = this.#layout.codec.size;
    for (let i = 0; i < this.numEnvs; i++) {
      this.#writeRecord(session, i, pool.results.subarray(i * size, (i + 1) * size));
    }
  }

  /** Step env `index` (or auto-reset it); true when SAME_STEP kept a final result. */
  #stepOne(session: ShmSession, index: number, action: number): boolean {
    const mode = session.autoreset;
    if (mode === AutoReset.NEXT_STEP && session.done[index]) {
      this.#resetOne(session, index, null); // the action of a done env is ignored
      return false;
    }
    this.#write(session, index, session.envs[index]!.step(action));
    if (mode === AutoReset.SAME_STEP && session.done[index]) {
      this.#keepFinal(index);
      this.#resetOne(session, index, null);
      return true;
    }
    return false;
  }

  /** Copy env `index`'s result bytes from its slot to its final area (same offsets). */
  #keepFinal(index: number): void {
    const bytes = this.region.bytes;
    const slot = CONTROL_SIZE + index * SLOT_SIZE;
    const final = this.#finalsAt + index * FINAL_SIZE;
    const copies = this.#layout.copies;
    for (let k = 0; k < copies.length; k++) {
      const c = copies[k]!;
      bytes.copyWithin(final + c.to, slot + c.to, slot + c.to + c.size);
    }
  }

  /** `final_seq = this request's sequence`: written before the response word is published. */
  #stampFinal(index: number): void {
    Atomics.store(this.region.words, (this.#finalsAt + index * FINAL_SIZE + FINAL_SEQ_OFFSET) >> 2, this.#seqs[index]!);
  }

  #resetOne(session: ShmSession, index: number, seed: bigint | null): void {
    const env = session.envs[index]!;
    this.#write(session, index, seed === null ? env.reset() : env.reset(seed));
    session.markReset(index);
  }

  #slotSeed(index: number): bigint | null {
    const region = this.region;
    if (!region.bytes[region.slotAt(index, "has_seed")]) return null;
    return region.dv.getBigUint64(region.slotAt(index, "seed"), true);
  }

  /** RESET on every slot: env i gets its slot's seed, or `--seed S` + i on the first reset. */
  #resetAll(session: ShmSession): void {
    const first = session.firstSeed !== null && !session.wasReset.includes(1) ? session.firstSeed : null;
    if (session.pool !== null) {
      const seeds: Array<bigint | null> = [];
      for (let i = 0; i < this.numEnvs; i++) {
        const slotSeed = this.#slotSeed(i);
        seeds.push(slotSeed !== null ? slotSeed : first === null ? null : first + BigInt(i));
      }
      const failures = session.pool.reset(seeds);
      this.#copyPoolResults(session, session.pool);
      const failed = new Set(failures.map(([i]) => i));
      for (let i = 0; i < this.numEnvs; i++) if (!failed.has(i)) session.markReset(i);
      if (failures.length) throw this.#recover(session, failures, seeds);
      return;
    }
    let failures: Failure[] | null = null;
    for (let i = 0; i < this.numEnvs; i++) {
      const slotSeed = this.#slotSeed(i);
      const seed = slotSeed !== null ? slotSeed : first === null ? null : first + BigInt(i);
      try {
        this.#resetOne(session, i, seed);
      } catch (error) {
        (failures ??= []).push([i, error]); // the other envs still reset
      }
    }
    if (failures !== null) {
      const seeds: Array<bigint | null> = [];
      for (let i = 0; i < this.numEnvs; i++) {
        const slotSeed = this.#slotSeed(i);
        seeds.push(slotSeed !== null ? slotSeed : first === null ? null : first + BigInt(i));
      }
      throw this.#recover(session, failures, seeds);
    }
  }

  /**
   * Reset (or recreate from the factory) each env that threw; the ENV_ERROR to answer. The
   * text starts with `env {i}: ` (the first env that failed), so clients name the env.
   */
  #recover(session: ShmSession, failures: readonly Failure[], seeds: ReadonlyArray<bigint | null> | null): RequestError {
    const texts: string[] = [];
    for (const [index, error] of failures) {
      let detail: string;
      if (error instanceof RequestError) {
        const prefix = `env ${index}: `;
        detail = error.text.startsWith(prefix) ? error.text.slice(prefix.length) : error.text;
      } else {
        detail = describeError(error);
      }
      const fate = this.#restore(session, index, seeds === null ? null : (seeds[index] ?? null));
      texts.push(`env ${index}: ${detail} (${fate})`);
    }
    return new RequestError(ErrorCode.ENV_ERROR, texts.join("; "));
  }

  /** Reset env `index` after it threw; if that throws too, recreate it from the factory. */
  #restore(session: ShmSession, index: number, seed: bigint | null): string {
    if (session.pool !== null) {
      const [fate, ok] = session.pool.restore(index, seed);
      if (ok) {
        const size = this.#layout.codec.size;
        this.#writeRecord(session, index, session.pool.results.subarray(index * size, (index + 1) * size));
        session.markReset(index);
      } else {
        session.markNotReset(index);
      }
      return fate;
    }
    const env = session.envs[index]!;
    const attempts: Array<readonly [string, () => AnyEnv]> = [[FATE_RESET, () => env]];
    const factory = session.factory;
    if (factory !== null) attempts.push([FATE_RECREATED, factory]);
    for (const [fate, make] of attempts) {
      try {
        const fresh = make();
        session.envs[index] = fresh;
        this.#resetOne(session, index, seed);
      } catch {
        continue;
      }
      return fate;
    }
    session.envs[index] = env;
    session.markNotReset(index); // every step is NOT_RESET until a reset succeeds
    return FATE_FAILED;
  }

  /** HELLO: the auto-reset mode in slot `index`'s `action` (docs/shm.md "Auto-reset"). */
  #mode(index: number): AutoReset {
    const mode = this.region.dv.getInt32(this.region.slotAt(index, "action"), true);
    if (mode !== AutoReset.DISABLED && mode !== AutoReset.NEXT_STEP && mode !== AutoReset.SAME_STEP) {
      throw new RequestError(ErrorCode.BAD_FRAME, `unknown auto-reset mode ${mode}`);
    }
    return mode;
  }

  /** Slots with different commands, or a subset: each answered on its own. */
  #mixed(session: ShmSession): void {
    const region = this.region;
    const dv = region.dv;
    for (let i = 0; i < this.numEnvs; i++) {
      if (!this.#pending[i]) continue;
      let code = 0;
      try {
        const cmd = dv.getUint32(region.slotAt(i, "command"), true);
        if (cmd === SlotCommand.SHUTDOWN) {
          this.#dropSession();
        } else if (cmd === SlotCommand.HELLO) {
          session.autoreset = this.#mode(i);
        } else if ((cmd === SlotCommand.STEP || cmd === SlotCommand.RESET) && session.pool !== null) {
          throw new RequestError(ErrorCode.BAD_BATCH, `env ${i}: a worker pool steps and resets every env together`);
        } else if (cmd === SlotCommand.STEP || cmd === SlotCommand.RESET) {
          this.#one(session, i, cmd);
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

  /** One slot's STEP or RESET (a subset request), with the same checks and recovery. */
  #one(session: ShmSession, i: number, cmd: number): void {
    const seed = this.#slotSeed(i);
    if (cmd === SlotCommand.STEP) {
      const action = this.region.dv.getInt32(this.region.slotAt(i, "action"), true);
      if (!(session.autoreset === AutoReset.NEXT_STEP && session.done[i])) session.checkAction(i, action);
    }
    try {
      if (cmd === SlotCommand.RESET) {
        this.#resetOne(session, i, seed);
      } else if (this.#stepOne(session, i, this.region.dv.getInt32(this.region.slotAt(i, "action"), true))) {
        this.#stampFinal(i);
      }
    } catch (error) {
      const seeds: Array<bigint | null> = new Array<bigint | null>(this.numEnvs).fill(null);
      seeds[i] = cmd === SlotCommand.RESET ? seed : null;
      throw this.#recover(session, [[i, error]], seeds);
    }
  }

  /** Idle: reclaim the lease of a dead client (its envs are dropped); keep spare envs ready. */
  #housekeeping(): void {
    const region = this.region;
    const pid = Atomics.load(region.words, this.#clientPidWord) >>> 0;
    if (pid && !peerAlive(pid, region.dv.getBigUint64(this.#clientStartAt, true))) {
      process.stderr.write(`transport: shm://${this.shm.name}: client pid ${pid} is gone; reclaiming its lease\n`);
      region.dv.setBigUint64(this.#clientStartAt, 0n, true);
      Atomics.compareExchange(region.words, this.#clientPidWord, pid | 0, 0);
      if (this.#session !== null && this.#session.clientPid === pid) this.#dropSession();
    }
    if (this.#spare === null && this.#session === null) this.#spare = this.#newEnvs();
  }

  // -- shutdown ------------------------------------------------------------------------------------

  /** Mark the region CLOSED, wake every waiter, stop serving, unlink the segment, unmap. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true; // the loop is not running now (one thread): it stops at its next turn
    const region = this.region;
    Atomics.store(region.words, region.cbWord("state"), RegionState.CLOSED);
    futexWake(region, this.#doorbellAt);
    const respOff = off(SLOT, "sem_result_ready");
    for (let i = 0; i < this.numEnvs; i++) futexWake(region, CONTROL_SIZE + i * SLOT_SIZE + respOff);
    region.unlinkIfOurs();
    region.unmap();
    this.#dropSession();
    this.#spare?.pool?.close();
    this.#spare = null;
    this.#stop();
    await this.#stopped;
  }
}

/**
 * How many envs a lease gets and where they come from: the sessions' own N, or the URL's
 * num_envs when the server was given the default of 1 and a factory (N fresh envs, one per
 * session made); anything else is a clear error.
 */
function envSource(
  url: string,
  wanted: number | null,
  probe: Session,
  sessions: () => Session,
): [number, () => readonly AnyEnv[]] {
  const given = probe.numEnvs;
  if (wanted === null || wanted === given) return [given, () => sessions().envs];
  if (given === 1) {
    const other = sessions();
    if (other.envs[0] !== probe.envs[0]) {
      return [
        wanted,
        () => {
          const envs: AnyEnv[] = [];
          for (let i = 0; i < wanted; i++) envs.push(sessions().envs[0]!);
          return envs;
        },
      ];
    }
  }
  throw new ConnectError(
    `${url} asks for ${wanted} envs but the server was given numEnvs=${given}` +
      (given === 1 ? " and one shared env (pass an env factory)" : ""),
  );
}

export async function listen(url: string, sessions: () => Session, _options: ListenOptions = {}): Promise<ShmListener> {
  return new ShmListener(url, sessions);
}

/** The Node side serves shm:// regions; the client is Python's (transport.connect). */
export async function openChannel(url: string, _options: OpenOptions = {}): Promise<Channel> {
  parseShmUrl(url);
  throw new ConnectError(
    `${url}: the Node library serves shm:// regions but has no shm:// client; connect from Python ` +
      "(transport.connect) or use unix:// / http:// from Node",
  );
}
