/**
 * Issue 22 item 2 for the actor-learner channels (Node): typed arrays over a board's or ring's
 * mapping that a caller keeps past `close()` never read unmapped memory, and a closed board,
 * ring, producer, consumer or run control throws ChannelClosedError from every method.
 *
 * Before the fix `close()` unmapped the segment under `koffi.view`'s ArrayBuffer, and reading a
 * kept view killed the process (SIGSEGV). Each misuse runs in a child `node` process, which
 * must exit 0 printing the right values (docs/shm.md, "Lifetimes").
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdirSync, unlinkSync } from "node:fs";
import { resolve } from "node:path";
import { describe, test } from "node:test";

const DIST = resolve(__dirname, "..");
const PRELUDE = `
const ch = require(${JSON.stringify(resolve(DIST, "channels", "index.js"))});
const { experience } = require(${JSON.stringify(resolve(DIST, "generated", "index.js"))});
const { readFileSync } = require("node:fs");
const { ChannelClosedError, PolicyBoard, Ring, RunControl } = ch;
const maps = () => readFileSync("/proc/self/maps", "utf8").split("\\n").filter(Boolean);
const mapsWith = (name) => maps().filter((l) => l.includes(name)).length;
const holds = (address) => maps().some((l) => {
  const [lo, hi] = l.split(" ")[0].split("-").map((x) => BigInt("0x" + x));
  return lo <= address && address < hi;
});
const tick = () => new Promise((r) => setTimeout(r, 10));
const closedError = (call) => {
  try { call(); } catch (e) { return e instanceof ChannelClosedError ? "ChannelClosedError" : e.constructor.name + ": " + e.message; }
  return "no error";
};
const json = (v) => JSON.stringify(v, (_, x) => (typeof x === "bigint" ? Number(x) : x));
`;

/** `script` in a child `node --expose-gc` (NAME: a unique channel name); its last line is JSON. */
function runChild(script: string): Record<string, unknown> {
  const name = `tlife-node-${process.pid}-${randomBytes(4).toString("hex")}`;
  const code = `${PRELUDE}\nconst NAME = ${JSON.stringify(name)};\n(async () => {\n${script}\n})().catch((e) => { console.error(e); process.exit(3); });`;
  const child = spawnSync(process.execPath, ["--expose-gc", "-e", code], { encoding: "utf8", timeout: 60_000 });
  const leftovers = readdirSync("/dev/shm").filter((e) => e.includes(name));
  for (const entry of leftovers) unlinkSync(`/dev/shm/${entry}`);
  assert.equal(child.status, 0, `the child died: status ${child.status} signal ${child.signal} (SIGSEGV before the fix)\n${child.stdout}\n${child.stderr}`);
  assert.deepEqual(leftovers, [], "segments left in /dev/shm");
  const lines = child.stdout.trim().split("\n");
  return JSON.parse(lines[lines.length - 1] as string) as Record<string, unknown>;
}

function allClosed(errors: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.keys(errors).map((k) => [k, "ChannelClosedError"]));
}

describe("channels: what views of a segment see after close()", () => {
  test("board slot views kept past close() keep their values, then are unmapped once collected", () => {
    const out = runChild(`
      const pub = PolicyBoard.create(NAME, { w: new Float32Array(1000) }, "seqlock");
      pub.publish({ w: Float32Array.from({ length: 1000 }, (_, i) => i) });
      const reader = PolicyBoard.open(NAME);
      const address = reader.segment.address;
      let kept = reader.slotViews(0).w;
      reader.close();
      pub.publish({ w: new Float32Array(1000).fill(7) }); // reaches no view of a closed reader
      const readerClosed = mapsWith(NAME);
      pub.close();
      globalThis.gc();
      const total = kept.reduce((a, b) => a + b, 0);
      kept[3] = 1; // the private copy is writable and reaches nobody
      const first = kept[3];
      const held = holds(address);
      kept = null;
      for (let i = 0; i < 50 && holds(address); i++) { globalThis.gc(); await tick(); }
      console.log(json({ total, first, readerClosed, afterClose: mapsWith(NAME), held, unmapped: !holds(address) }));
    `);
    assert.equal(out["total"], (999 * 1000) / 2); // the values at close, not the later publish's
    assert.equal(out["first"], 1);
    assert.equal(out["readerClosed"], 1); // only the publisher's mapping names the segment
    assert.equal(out["afterClose"], 0);
    assert.equal(out["held"], true);
    assert.equal(out["unmapped"], true);
  });

  test("a closed board throws ChannelClosedError from every method", () => {
    const out = runChild(`
      const pub = PolicyBoard.create(NAME, { w: new Float32Array(16) });
      pub.publish({ w: new Float32Array(16).fill(1) });
      const reader = PolicyBoard.open(NAME);
      reader.close();
      pub.close();
      pub.close(); // idempotent
      console.log(json({
        version: closedError(() => reader.version),
        waitNewer: closedError(() => reader.waitNewer(5n, 100)),
        read: closedError(() => reader.read()),
        slotViews: closedError(() => reader.slotViews(0)),
        publish: closedError(() => pub.publish({ w: new Float32Array(16) })),
        nextVersion: closedError(() => pub.nextVersion()),
        pubRead: closedError(() => pub.read()),
      }));
    `) as Record<string, string>;
    assert.deepEqual(out, allClosed(out));
  });

  test("ring records kept past close() keep their values; the ring and its roles throw ChannelClosedError", () => {
    const out = runChild(`
      const ring = Ring.create(NAME, experience.SCHEMA, "Probe64", 16);
      const consumer = ring.consumer();
      const producer = ring.producer();
      const r = producer.reserve(5, 5000);
      for (let i = 0; i < r.count; i++) ring.segment.dv.setBigUint64(r.offset + i * 64 + 8, BigInt(100 + i), true);
      producer.commit();
      const batch = consumer.take(16, 5000);
      const view = new DataView(ring.segment.bytes.buffer); // what a codec view of a record holds
      ring.close();
      globalThis.gc();
      const got = [];
      for (let i = 0; i < batch.count; i++) got.push(Number(view.getBigUint64(batch.offsetOf(i) + 8, true)));
      batch.release(); // after close: nothing to give back
      const errors = {
        take: closedError(() => consumer.take(4, 0)),
        reserve: closedError(() => producer.reserve(1, 0)),
        commit: closedError(() => producer.commit()),
        stats: closedError(() => ring.stats()),
        head: closedError(() => ring.head),
        producer: closedError(() => ring.producer()),
        consumer: closedError(() => ring.consumer()),
        bytes: closedError(() => ring.segment.bytes),
      };
      consumer.close();
      producer.close();
      console.log(json({ got, errors, maps: mapsWith(NAME) }));
    `);
    assert.deepEqual(out["got"], [100, 101, 102, 103, 104]);
    const errors = out["errors"] as Record<string, string>;
    assert.deepEqual(errors, allClosed(errors));
    assert.equal(out["maps"], 0);
  });

  test("a closed consumer or producer throws ChannelClosedError", () => {
    const out = runChild(`
      const ring = Ring.create(NAME, experience.SCHEMA, "Probe64", 16);
      const opened = Ring.open(NAME, experience.SCHEMA, "Probe64");
      const consumer = opened.consumer();
      const producer = ring.producer();
      producer.reserve(3, 5000);
      producer.commit();
      const batch = consumer.take(16, 5000);
      consumer.close();
      producer.close();
      const errors = {
        take: closedError(() => consumer.take(1, 0)),
        reserve: closedError(() => producer.reserve(1, 0)),
        commit: closedError(() => producer.commit()),
        release: batch.release() === undefined ? "ChannelClosedError" : "?",
      };
      opened.close();
      ring.close();
      console.log(json({ errors, count: batch.count }));
    `);
    const errors = out["errors"] as Record<string, string>;
    assert.deepEqual(errors, allClosed(errors));
    assert.equal(out["count"], 3);
  });

  test("a closed run control and its members throw ChannelClosedError; leave() is a no-op", () => {
    const out = runChild(`
      const control = RunControl.create(NAME);
      const member = control.join("actor");
      control.close();
      const errors = {
        epoch: closedError(() => control.epoch),
        advance: closedError(() => control.advance()),
        stopped: closedError(() => control.stopped),
        stop: closedError(() => control.stop()),
        waitStop: closedError(() => control.waitStop(100)),
        join: closedError(() => control.join("x")),
        members: closedError(() => control.members()),
        beat: closedError(() => member.beat()),
        fail: closedError(() => member.fail(2)),
      };
      console.log(json({ errors, leave: closedError(() => member.leave()), maps: mapsWith(NAME) }));
    `);
    const errors = out["errors"] as Record<string, string>;
    assert.deepEqual(errors, allClosed(errors));
    assert.equal(out["leave"], "no error");
    assert.equal(out["maps"], 0);
  });
});
