/**
 * The Node end of the torn-read and takeover tests of the policy board (issue 22 item 1:
 * tests/test_board_torn.py, tests/test_channels_fuzz.py, board_torn.test.ts). Versions are
 * shaped like tests/channels_util.py `board_arrays`: every element derives from the version, so
 * a torn read (a read whose arrays are not all of its version) is visible. One JSON line out.
 *
 *   node dist/testing/board_torn_cli.js read NAME SECONDS TIMEOUT_MS
 *   node dist/testing/board_torn_cli.js publish NAME COUNT FAIL_EVERY
 *   node dist/testing/board_torn_cli.js publish-forever NAME FAIL_EVERY     (until killed)
 *   node dist/testing/board_torn_cli.js die-mid-publish NAME COUNT          (SIGKILLs itself)
 *   node dist/testing/board_torn_cli.js ring-produce-forever NAME PRODUCER  (Probe64 records)
 *
 * Without arguments (node --test runs every file under dist/test/) it does nothing.
 */

import { ChannelError, PolicyBoard, Ring } from "../channels";
import { fillProbe } from "../channels/probe_cli";
import { offsets } from "../channels/segment";
import { experience } from "../generated";

type Arrays = Record<string, Float32Array | BigInt64Array>;

/** `board_arrays(version)` for the board's own table (any sizes). */
export function versionArrays(board: PolicyBoard, version: bigint): Arrays {
  const out: Arrays = {};
  for (const spec of board.specs) {
    if (spec.name === "tag") out[spec.name] = BigInt64Array.of(version, version ^ 0x5a5an);
    else out[spec.name] = new Float32Array(spec.nbytes / 4).fill(Number(version) * 3 + Number(spec.name.slice(1)));
  }
  return out;
}

/** `board_consistent`: every array holds `version` (no torn or mixed read). */
export function consistent(version: bigint, arrays: Record<string, ArrayLike<number> | ArrayLike<bigint>>): boolean {
  const tag = arrays["tag"] as BigInt64Array;
  if (tag[0] !== version || tag[1] !== (version ^ 0x5a5an)) return false;
  for (const [name, values] of Object.entries(arrays)) {
    if (name === "tag") continue;
    const expect = Number(version) * 3 + Number(name.slice(1));
    const w = values as Float32Array;
    for (let j = 0; j < w.length; j++) if (w[j] !== expect) return false;
  }
  return true;
}

/** Invalid publishes, each one of the ways a caller gets it wrong (kind `i % 3`): the last array
 * missing, too short, or of the wrong element kind. The valid arrays come first, so a publish
 * that copied before it checked leaves a half-written slot. */
export function invalidArrays(board: PolicyBoard, version: bigint, i: number): Record<string, unknown> {
  const good: Record<string, unknown> = { ...versionArrays(board, version) };
  if (i % 3 === 0) delete good["tag"];
  else if (i % 3 === 1) good["tag"] = BigInt64Array.of(version);
  else good["tag"] = new Float64Array(2).fill(Number(version));
  return good;
}

function nextVersion(board: PolicyBoard): bigint {
  return board.nextVersion();
}

function read(name: string, seconds: number, timeoutMs: number): void {
  const board = PolicyBoard.open(name);
  let out = null;
  let reads = 0;
  let torn = 0;
  let backwards = 0;
  let last = 0n;
  const errors: Record<string, number> = {};
  const untyped: string[] = [];
  const deadline = performance.now() + seconds * 1000;
  while (performance.now() < deadline) {
    let r;
    try {
      r = board.read(out, timeoutMs);
    } catch (error) {
      if (error instanceof ChannelError) errors[error.constructor.name] = (errors[error.constructor.name] ?? 0) + 1;
      else untyped.push(`${(error as Error).name}: ${(error as Error).message}`);
      if (untyped.length > 20) break;
      continue;
    }
    out = r.arrays;
    if (r.version === 0n) continue;
    reads++;
    if (!consistent(r.version, r.arrays)) torn++;
    if (r.version < last) backwards++;
    last = r.version;
  }
  board.close();
  process.stdout.write(`${JSON.stringify({ reads, torn, backwards, last: Number(last), errors, untyped })}\n`);
}

function publish(name: string, count: number, failEvery: number, forever: boolean): void {
  const board = PolicyBoard.open(name);
  let published = 0;
  let failed = 0;
  const untyped: string[] = [];
  for (let i = 1; forever || published < count; i++) {
    const version = nextVersion(board);
    if (failEvery > 0 && i % failEvery === 0) {
      try {
        board.publish(invalidArrays(board, version, i) as never);
        untyped.push(`invalid publish ${i} was accepted`);
      } catch (error) {
        if (error instanceof ChannelError) failed++;
        else untyped.push(String(error));
      }
    }
    const got = board.publish(versionArrays(board, version));
    if (got !== version) untyped.push(`published ${got}, expected ${version}`);
    published++;
    if (forever && untyped.length > 0) {
      process.stderr.write(`${untyped.join("\n")}\n`);
      process.exit(3);
    }
  }
  const last = Number(board.version);
  board.close();
  process.stdout.write(`${JSON.stringify({ published, failed, last, untyped })}\n`);
}

/** Publish `count` versions, then write half of the next one the way publish does (its slot's
 * seq odd, the first array copied) and die there: a publisher SIGKILLed mid-publish. */
function dieMidPublish(name: string, count: number): void {
  const board = PolicyBoard.open(name);
  for (let i = 0; i < count; i++) board.publish(versionArrays(board, nextVersion(board)));
  const seg = board.segment;
  const W = offsets("BoardWords", 128);
  const slot = board.mode === "double_buffer" ? 1 - Atomics.load(seg.i32, W["active"]! >> 2) : 0;
  const seqIndex = W[`slot${slot}_seq`]! >> 3;
  Atomics.store(seg.u64, seqIndex, Atomics.load(seg.u64, seqIndex) + 1n);
  const next = versionArrays(board, board.version + 1n);
  const first = board.specs[0]!;
  board.slotViews(slot)[first.name]!.set(next[first.name] as never);
  process.stdout.write(`${JSON.stringify({ died: Number(board.version) + 1, slot })}\n`);
  process.kill(process.pid, "SIGKILL");
}

/** Push checksummed Probe64 records (tests/channels_util.py `fill_probe`) until killed; a typed
 * error (no consumer meanwhile, a timeout) is waited out, anything else exits 3. */
function ringProduceForever(name: string, producer: number): void {
  const ring = Ring.open(name, experience.SCHEMA, "Probe64");
  const prod = ring.producer();
  const { bytes, dv } = ring.segment;
  let sent = 0;
  for (;;) {
    try {
      const r = prod.reserve(4, 500);
      for (let i = 0; i < r.count; i++) fillProbe(bytes, dv, r.offset + i * 64, 64, producer, sent + i);
      prod.commit();
      sent += r.count;
    } catch (error) {
      if (!(error instanceof ChannelError)) {
        process.stderr.write(`${String(error)}\n`);
        process.exit(3);
      }
    }
  }
}

function main(argv: readonly string[]): void {
  const [cmd, name, a, b] = argv;
  if (cmd === undefined) return;
  if (name === undefined) throw new Error("usage: board_torn_cli COMMAND NAME ...");
  if (cmd === "read") read(name, Number(a), Number(b ?? 2000));
  else if (cmd === "publish") publish(name, Number(a), Number(b ?? 0), false);
  else if (cmd === "publish-forever") publish(name, 0, Number(a ?? 0), true);
  else if (cmd === "die-mid-publish") dieMidPublish(name, Number(a));
  else if (cmd === "ring-produce-forever") ringProduceForever(name, Number(a));
  else throw new Error(`unknown command ${cmd}`);
}

if (require.main === module) main(process.argv.slice(2));
