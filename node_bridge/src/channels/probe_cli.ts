/**
 * The Node end of the cross-language channel tests (tests/test_channels_node.py) and of the
 * benchmarks: checksummed probe records (schema/experience.toml Probe64 / Probe2557) through a
 * ring, board reads and publishes, a run-control member. One JSON line of results on stdout.
 *
 *   node dist/channels/probe_cli.js produce NAME SIZE PRODUCER COUNT BATCH
 *   node dist/channels/probe_cli.js produce-forever NAME SIZE PRODUCER
 *   node dist/channels/probe_cli.js consume NAME SIZE [EXPECTED]
 *   node dist/channels/probe_cli.js board-read NAME SECONDS
 *   node dist/channels/probe_cli.js board-publish NAME COUNT
 *   node dist/channels/probe_cli.js member NAME BEAT_MS leave|fail|wait_stop
 *   node dist/channels/probe_cli.js board-own NAME MODE COUNT      (creates; closes at stdin's end)
 *   node dist/channels/probe_cli.js control-own NAME SLOTS STUCK_MS (creates; waits for stop)
 */

import { readFileSync } from "node:fs";
import { experience } from "../generated";
import { PolicyBoard } from "./board";
import { RunControl } from "./control";
import { Ring } from "./ring";
import { ChannelClosedError, PeerDiedError } from "./segment";
import { monotonicNs } from "./native";

const PAYLOAD_AT = 24;

function struct(size: number): string {
  return size === 64 ? "Probe64" : "Probe2557";
}

/** tests/channels_util.py `fill_probe`, for one record at byte `at`. */
export function fillProbe(bytes: Uint8Array, dv: DataView, at: number, size: number, producer: number, index: number): void {
  const width = size - PAYLOAD_AT;
  let sum = 0;
  const base = index * 7 + producer * 13;
  for (let j = 0; j < width; j++) {
    const b = (base + j) & 0xff;
    bytes[at + PAYLOAD_AT + j] = b;
    sum += b;
  }
  dv.setUint32(at, producer, true);
  dv.setUint32(at + 4, (sum + index) >>> 0, true);
  dv.setBigUint64(at + 8, BigInt(index), true);
  dv.setBigUint64(at + 16, monotonicNs(), true);
}

/** True when the record at `at` matches its (producer, index). */
export function checkProbe(bytes: Uint8Array, dv: DataView, at: number, size: number): boolean {
  const producer = dv.getUint32(at, true);
  const index = Number(dv.getBigUint64(at + 8, true));
  const base = index * 7 + producer * 13;
  let sum = 0;
  for (let j = 0; j < size - PAYLOAD_AT; j++) {
    const b = (base + j) & 0xff;
    if (bytes[at + PAYLOAD_AT + j] !== b) return false;
    sum += b;
  }
  return dv.getUint32(at + 4, true) === (sum + index) >>> 0;
}

function produce(name: string, size: number, producer: number, count: number, batch: number, forever: boolean): void {
  const ring = Ring.open(name, experience.SCHEMA, struct(size));
  const prod = ring.producer();
  const { bytes, dv } = ring.segment;
  let sent = 0;
  while (forever || sent < count) {
    const want = forever ? batch : Math.min(batch, count - sent);
    const r = prod.reserve(want, 30_000);
    for (let i = 0; i < r.count; i++) fillProbe(bytes, dv, r.offset + i * size, size, producer, sent + i);
    prod.commit();
    sent += r.count;
  }
  prod.close();
  ring.close();
  process.stdout.write(`${JSON.stringify({ sent })}\n`);
}

/** Take records until the producers are gone (and, with `expected`, until records + overwritten
 * reach it: producers that start late find an end of stream the consumer looks past). */
function consume(name: string, size: number, expected: number): void {
  const ring = Ring.open(name, experience.SCHEMA, struct(size));
  const cons = ring.consumer();
  const { bytes, dv } = ring.segment;
  const next = new Map<number, number>();
  let records = 0;
  let bad = 0;
  let outOfOrder = 0;
  let gaps = 0;
  let end = "";
  const deadline = performance.now() + 60_000;
  for (;;) {
    let batch;
    try {
      batch = cons.take(64, 30_000);
    } catch (error) {
      if (error instanceof ChannelClosedError) end = "closed";
      else if (error instanceof PeerDiedError) end = "dead";
      else throw error;
      if (records + Number(ring.overwritten) < expected && performance.now() < deadline) {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
        continue;
      }
      break;
    }
    for (let i = 0; i < batch.count; i++) {
      const at = batch.offsetOf(i);
      if (!checkProbe(bytes, dv, at, size)) bad++;
      const producer = dv.getUint32(at, true);
      const index = Number(dv.getBigUint64(at + 8, true));
      const expect = next.get(producer) ?? 0;
      if (index < expect) outOfOrder++; // backwards or twice (OVERWRITE may skip ahead)
      else if (index > expect) gaps += index - expect;
      next.set(producer, index + 1);
      records++;
    }
    batch.release();
  }
  cons.close();
  const perProducer = Object.fromEntries([...next.entries()].map(([p, n]) => [String(p), n]));
  process.stdout.write(`${JSON.stringify({ records, bad, outOfOrder, gaps, perProducer, end, lost: Number(ring.lost) })}\n`);
  ring.close();
}

/** tests/channels_util.py `board_consistent`. */
function consistent(version: bigint, arrays: Record<string, ArrayLike<number> | ArrayLike<bigint>>): boolean {
  const tag = arrays["tag"] as BigInt64Array;
  if (tag[0] !== version || tag[1] !== (version ^ 0x5a5an)) return false;
  for (let i = 0; ; i++) {
    const w = arrays[`w${i}`] as Float32Array | undefined;
    if (w === undefined) return true;
    const expect = Number(version) * 3 + i;
    for (let j = 0; j < w.length; j++) if (w[j] !== expect) return false;
  }
}

function boardRead(name: string, seconds: number): void {
  const board = PolicyBoard.open(name);
  let out = null;
  let reads = 0;
  let torn = 0;
  let last = 0n;
  const deadline = performance.now() + seconds * 1000;
  while (performance.now() < deadline) {
    const r = board.read(out);
    out = r.arrays;
    if (r.version === 0n) continue;
    reads++;
    if (!consistent(r.version, r.arrays)) {
      torn++;
      const tag = r.arrays["tag"] as BigInt64Array;
      const w = (i: number): number => (r.arrays[`w${i}`] as Float32Array)[0]!;
      process.stderr.write(`torn: version ${r.version} tag ${tag[0]},${tag[1]} w ${w(0)},${w(1)},${w(2)}\n`);
    }
    if (r.version < last) {
      torn++;
      process.stderr.write(`backwards: ${r.version} after ${last}\n`);
    }
    last = r.version;
  }
  board.close();
  process.stdout.write(`${JSON.stringify({ reads, torn, last: Number(last) })}\n`);
}

function boardPublish(name: string, count: number): void {
  const board = PolicyBoard.open(name);
  for (let v = 1; v <= count; v++) {
    const arrays: Record<string, Float32Array | BigInt64Array> = {};
    for (const spec of board.specs) {
      if (spec.name === "tag") arrays[spec.name] = BigInt64Array.from([BigInt(v), BigInt(v) ^ 0x5a5an]);
      else arrays[spec.name] = new Float32Array(spec.nbytes / 4).fill(v * 3 + Number(spec.name.slice(1)));
    }
    board.publish(arrays);
  }
  board.close();
  process.stdout.write(`${JSON.stringify({ published: count })}\n`);
}

/** tests/channels_util.py `board_arrays(version)`: every element derives from the version. */
function boardArrays(version: number): Record<string, Float32Array | BigInt64Array> {
  const out: Record<string, Float32Array | BigInt64Array> = {};
  [1000, 37, 4096].forEach((n, i) => (out[`w${i}`] = new Float32Array(n).fill(version * 3 + i)));
  out["tag"] = BigInt64Array.from([BigInt(version), BigInt(version) ^ 0x5a5an]);
  return out;
}

/** Create a board shaped like `board_arrays`, say so, publish `count` versions, keep the
 * segment until stdin ends, then close (unlinking it). */
function boardOwn(name: string, mode: string, count: number): void {
  const board = PolicyBoard.create(name, boardArrays(0), mode as "double_buffer" | "seqlock");
  process.stdout.write(`${JSON.stringify({ ready: board.segment.path })}\n`);
  for (let v = 1; v <= count; v++) board.publish(boardArrays(v));
  readFileSync(0);
  board.close();
  process.stdout.write(`${JSON.stringify({ published: count })}\n`);
}

/** Create a run-control block, say so, wait for the stop flag and report every member. */
function controlOwn(name: string, slots: number, stuckAfterMs: number): void {
  const control = RunControl.create(name, { slots, stuckAfterMs });
  process.stdout.write(`${JSON.stringify({ ready: control.segment.path })}\n`);
  const stopped = control.waitStop(30_000);
  const members = control.members().map((m) => ({ name: m.name, state: m.state, error_code: m.errorCode, slot: m.slot }));
  const summary = { stopped, stop_reason: control.stopReason, epoch: Number(control.epoch), members };
  control.close();
  process.stdout.write(`${JSON.stringify(summary)}\n`);
}

function member(name: string, beatMs: number, then: string): void {
  const control = RunControl.open(name);
  const me = control.join(`node-${then}`, 2);
  const deadline = performance.now() + beatMs;
  while (performance.now() < deadline) {
    me.beat();
    control.advance();
    const t = performance.now() + 10;
    while (performance.now() < t) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
  }
  if (then === "leave") me.leave();
  else if (then === "fail") me.fail(9);
  else if (then === "wait_stop") {
    if (!control.waitStop(30_000)) process.exit(3);
    me.leave();
  }
  const epoch = Number(control.epoch);
  control.close();
  process.stdout.write(`${JSON.stringify({ then, epoch })}\n`);
}

function main(argv: readonly string[]): void {
  const [cmd, name, a, b, c, d] = argv;
  if (name === undefined) throw new Error("usage: probe_cli COMMAND NAME ...");
  if (cmd === "produce") produce(name, Number(a), Number(b), Number(c), Number(d), false);
  else if (cmd === "produce-forever") produce(name, Number(a), Number(b), 0, 4, true);
  else if (cmd === "consume") consume(name, Number(a), Number(b ?? 0));
  else if (cmd === "board-read") boardRead(name, Number(a));
  else if (cmd === "board-publish") boardPublish(name, Number(a));
  else if (cmd === "member") member(name, Number(a), String(b));
  else if (cmd === "board-own") boardOwn(name, String(a), Number(b));
  else if (cmd === "control-own") controlOwn(name, Number(a), Number(b));
  else throw new Error(`unknown command ${cmd}`);
}

if (require.main === module) main(process.argv.slice(2));
