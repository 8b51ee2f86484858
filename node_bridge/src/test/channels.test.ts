/**
 * Experience rings in Node: wrap-around at every offset, overwrite accounting, timeouts, and
 * real processes (probe_cli.js producers forked from here; SIGKILL of one). The Python x Node
 * tests are tests/test_channels_node.py.
 */

import assert from "node:assert/strict";
import { type ChildProcess, fork } from "node:child_process";
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import {
  ChannelClosedError,
  ChannelInUseError,
  ChannelMismatchError,
  ChannelTimeoutError,
  PeerDiedError,
  PolicyBoard,
  Ring,
  RunControl,
} from "../channels";
import { checkProbe, fillProbe } from "../channels/probe_cli";
import { offsets } from "../channels/segment";
import { experience } from "../generated";

const CLI = join(__dirname, "..", "channels", "probe_cli.js");
let counter = 0;
const unique = (tag: string): string => `tn${tag}-${process.pid}-${counter++}`;

function pushProbes(ring: Ring, first: number, n: number): void {
  const prod = ring.producer();
  let sent = 0;
  while (sent < n) {
    const r = prod.reserve(n - sent, 1000);
    for (let i = 0; i < r.count; i++) fillProbe(ring.segment.bytes, ring.segment.dv, r.offset + i * 64, 64, 0, first + sent + i);
    prod.commit();
    sent += r.count;
  }
  prod.close();
}

function indices(ring: Ring, batch: { count: number; offsetOf(i: number): number }): number[] {
  const out: number[] = [];
  for (let i = 0; i < batch.count; i++) {
    const at = batch.offsetOf(i);
    assert.ok(checkProbe(ring.segment.bytes, ring.segment.dv, at, 64));
    out.push(Number(ring.segment.dv.getBigUint64(at + 8, true)));
  }
  return out;
}

function exited(child: ChildProcess): Promise<number | null> {
  return new Promise((resolve) => child.on("exit", (code) => resolve(code)));
}

describe("channels: ring", { timeout: 60_000 }, () => {
  test("wrap-around at every offset: one part, or two where the ring wraps", () => {
    const capacity = 8;
    for (let offset = 0; offset < capacity; offset++) {
      for (let size = 1; size <= capacity; size++) {
        const ring = Ring.create(unique("wrap"), experience.SCHEMA, "Probe64", capacity, { multiProducer: true });
        const cons = ring.consumer();
        if (offset) {
          pushProbes(ring, 0, offset);
          cons.take(offset, 0).release();
        }
        pushProbes(ring, offset, size);
        const batch = cons.take(capacity, 0);
        assert.equal(batch.parts.length, offset + size > capacity ? 2 : 1);
        assert.equal(batch.first, BigInt(offset));
        assert.deepEqual(indices(ring, batch), Array.from({ length: size }, (_, i) => offset + i));
        batch.release();
        cons.close();
        ring.close();
      }
    }
  });

  test("segment is 0600, a live owner's name is never replaced, close unlinks", () => {
    const name = unique("life");
    const ring = Ring.create(name, experience.SCHEMA, "Probe64", 4);
    assert.equal(statSync(ring.segment.path).mode & 0o777, 0o600);
    assert.throws(() => Ring.create(name, experience.SCHEMA, "Probe64", 4), ChannelInUseError);
    const path = ring.segment.path;
    ring.close();
    assert.equal(existsSync(path), false);
  });

  test("block: a full ring times out; overwrite: the oldest unheld record goes, counted", () => {
    const block = Ring.create(unique("blk"), experience.SCHEMA, "Probe64", 4);
    pushProbes(block, 0, 4);
    const prod = block.producer();
    assert.throws(() => prod.reserve(1, 50), ChannelTimeoutError);
    block.close();

    const ring = Ring.create(unique("ow"), experience.SCHEMA, "Probe64", 4, { policy: "overwrite" });
    const cons = ring.consumer();
    pushProbes(ring, 0, 10);
    assert.equal(ring.overwritten, 6n);
    const batch = cons.take(10, 0);
    assert.deepEqual(indices(ring, batch), [6, 7, 8, 9]);
    batch.release();
    assert.throws(() => cons.take(1, 0), ChannelTimeoutError);
    ring.close();
  });

  test("counts: take(0) is an empty batch at once; negative counts and reserve(0) are RangeErrors", () => {
    const ring = Ring.create(unique("cnt"), experience.SCHEMA, "Probe64", 4);
    const cons = ring.consumer();
    const prod = ring.producer();
    const empty = cons.take(0); // no wait, although the ring is empty
    assert.equal(empty.count, 0);
    empty.release();
    assert.throws(() => cons.take(-1, 0), RangeError);
    assert.throws(() => cons.take(1.5, 0), RangeError);
    assert.throws(() => prod.reserve(0, 0), RangeError);
    assert.throws(() => prod.reserve(-2, 0), RangeError);
    prod.close();
    pushProbes(ring, 0, 3);
    assert.equal(cons.take(0).count, 0); // claims nothing
    const batch = cons.take(2 ** 40, 0); // more than the ring holds: up to what is there
    assert.deepEqual(indices(ring, batch), [0, 1, 2]);
    batch.release();
    ring.close();
  });

  test("two producer processes: every record, each producer in order, none corrupted", async () => {
    const name = unique("mp");
    const ring = Ring.create(name, experience.SCHEMA, "Probe64", 16, { multiProducer: true });
    const cons = ring.consumer();
    const children = [0, 1].map((p) => fork(CLI, ["produce", name, "64", String(p), "3000", "5"], { stdio: "ignore" }));
    const exits = children.map(exited); // listen now: an exit seen while we wait is not lost
    const next = [0, 0];
    let total = 0;
    while (total < 6000) {
      let batch;
      try {
        batch = cons.take(64, 20_000);
      } catch (error) {
        if (error instanceof ChannelClosedError) {
          await new Promise((r) => setTimeout(r, 20)); // a producer that starts late
          continue;
        }
        throw error;
      }
      for (let i = 0; i < batch.count; i++) {
        const at = batch.offsetOf(i);
        assert.ok(checkProbe(ring.segment.bytes, ring.segment.dv, at, 64));
        const p = ring.segment.dv.getUint32(at, true);
        assert.equal(Number(ring.segment.dv.getBigUint64(at + 8, true)), next[p]);
        next[p] = next[p]! + 1;
      }
      total += batch.count;
      batch.release();
    }
    assert.deepEqual(await Promise.all(exits), [0, 0]);
    assert.deepEqual(next, [3000, 3000]);
    ring.close();
  });

  test("SIGKILL of a producer process: the consumer gets PeerDiedError", async () => {
    const name = unique("kill");
    const ring = Ring.create(name, experience.SCHEMA, "Probe64", 64);
    const cons = ring.consumer();
    const child = fork(CLI, ["produce-forever", name, "64", "5"], { stdio: "ignore" });
    const done = exited(child);
    let taken = 0;
    let killed = false;
    let error: unknown = null;
    while (error === null) {
      try {
        const batch = cons.take(16, 20_000);
        taken += batch.count;
        batch.release();
      } catch (e) {
        error = e;
        break;
      }
      if (taken > 300 && !killed) {
        child.kill("SIGKILL");
        killed = true;
        await done;
      }
    }
    assert.ok(error instanceof PeerDiedError, String(error));
    ring.close();
  });
});

describe("channels: a Node learner creates the board and run control", { timeout: 60_000 }, () => {
  test("board: create, publish, read whole versions in both modes; a wrong table is refused; close unlinks", () => {
    for (const mode of ["double_buffer", "seqlock"] as const) {
      const name = unique(`board-${mode}`);
      const template = { w: new Float32Array(100), ids: { dtype: "<i8", shape: [2, 3] } };
      const board = PolicyBoard.create(name, template, mode);
      assert.equal(statSync(board.segment.path).mode & 0o777, 0o600);
      assert.deepEqual(board.specs.map((s) => [s.name, s.dtype, s.shape, s.offset]), [
        ["w", "<f4", [100], 0],
        ["ids", "<i8", [2, 3], 448],
      ]);
      assert.throws(() => PolicyBoard.open(name, 1000, [{ ...board.specs[0]!, shape: [99] }]), ChannelMismatchError);
      const reader = PolicyBoard.open(name, 1000, board.specs);
      for (let v = 1; v <= 3; v++) {
        board.publish({ w: new Float32Array(100).fill(v), ids: BigInt64Array.from({ length: 6 }, () => BigInt(v)) });
        const got = reader.read();
        assert.equal(got.version, BigInt(v));
        assert.ok((got.arrays["w"] as Float32Array).every((x) => x === v));
        assert.ok((got.arrays["ids"] as BigInt64Array).every((x) => x === BigInt(v)));
      }
      reader.close();
      board.close();
      assert.ok(!existsSync(board.segment.path));
    }
    assert.throws(() => PolicyBoard.create(unique("bad"), { x: { dtype: "<c8", shape: [1] } }), RangeError);
  });

  test("run control: create, members join, beat and fail; stop wakes the owner; close unlinks", () => {
    const control = RunControl.create(unique("ctl"), { slots: 4, stuckAfterMs: 50 });
    assert.equal(control.slots, 4);
    assert.equal(control.stuckAfterMs, 50);
    const other = RunControl.open(control.segment.name);
    const ok = other.join("ok", 1);
    const bad = other.join("bad", 2);
    assert.deepEqual(control.members().map((m) => [m.name, m.state, m.healthy]), [
      ["ok", "ACTIVE", true],
      ["bad", "ACTIVE", true],
    ]);
    bad.fail(5);
    assert.ok(control.waitStop(1000));
    assert.equal(control.stopReason, bad.slot + 1);
    const t = performance.now() + 80;
    while (performance.now() < t) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
    const problems = control.problems().map((m) => [m.name, m.state, m.errorCode, m.stuck]);
    assert.deepEqual(problems, [
      ["ok", "ACTIVE", 0, true],
      ["bad", "ERROR", 5, false],
    ]);
    ok.leave();
    other.close();
    control.close();
    assert.ok(!existsSync(control.segment.path));
    assert.throws(() => RunControl.create(unique("ctl"), { slots: 0 }), RangeError);
  });
});

describe("channels: board reads never go back a version", { timeout: 30_000 }, () => {
  test("a reader that took `active` just before two publishes does not return the unannounced one", () => {
    // Regression (a 60 s Python-publisher / Node-reader stress read 2792578, then 2792577): the
    // interleaving is forced by publishing between the reader's load of `active` and its read.
    const template = { w: new Float32Array(8), tag: new BigInt64Array(1) };
    const arrays = (v: number): { w: Float32Array; tag: BigInt64Array } => ({
      w: new Float32Array(8).fill(v),
      tag: BigInt64Array.of(BigInt(v)),
    });
    const board = PolicyBoard.create(unique("order"), template);
    for (const v of [1, 2, 3]) board.publish(arrays(v));
    const reader = PolicyBoard.open(board.segment.name);
    const seg = board.segment;
    const words = offsets("BoardWords", 128);
    const W = (field: string): number => words[field]! >> 3;
    const internals = reader as unknown as { activeSlot(): number };
    const activeSlot = internals.activeSlot.bind(reader);
    let raced = false;
    internals.activeSlot = (): number => {
      const slot = activeSlot();
      if (!raced) {
        raced = true;
        board.publish(arrays(4)); // into the other slot, announced
        // version 5 completed in the slot the reader chose, not yet announced
        const seq = Atomics.load(seg.u64, W(`slot${slot}_seq`));
        Atomics.store(seg.u64, W(`slot${slot}_seq`), seq + 1n);
        for (const [name, view] of Object.entries(board.slotViews(slot))) view.set(arrays(5)[name as "w"] as never);
        Atomics.store(seg.u64, W(`slot${slot}_version`), 5n);
        Atomics.store(seg.u64, W(`slot${slot}_seq`), seq + 2n);
      }
      return slot;
    };
    const first = reader.read(null, 2000).version;
    const second = reader.read(null, 2000).version;
    assert.ok(raced);
    assert.ok(second >= first, `read ${first}, then ${second}`);
    reader.close();
    board.close();
  });
});
