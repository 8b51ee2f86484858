/**
 * The channels' pid leases while one is being taken (src/channels/lease.ts): a word with the
 * CLAIMING bit names a live taker whose start time is not written yet, and must be seen as held
 * even beside a previous holder's stale start time. (A real taker paused in that gap, Python's,
 * is tests/test_channels_lease.py, with a Node process as the second taker.)
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { describe, test } from "node:test";

import { ChannelInUseError, PolicyBoard, Ring, RunControl } from "../channels";
import { CLAIMING, holder, holderAlive } from "../channels/lease";
import { offsets } from "../channels/segment";
import { experience } from "../generated";

let counter = 0;
const unique = (tag: string): string => `tnlease${tag}-${process.pid}-${counter++}`;
const STALE_START = 12345n; // a start time no live process has

/** A live process that is not this one (the taker in the gap). */
async function withLivePid(body: (pid: number) => void): Promise<void> {
  const child = spawn(process.execPath, ["-e", "setTimeout(() => {}, 30000)"], { stdio: "ignore" });
  try {
    await new Promise((resolve) => child.once("spawn", resolve));
    body(child.pid!);
  } finally {
    child.kill("SIGKILL");
  }
}

describe("a lease being taken", () => {
  test("reads as held by its pid alone, and free once that pid is gone", async () => {
    await withLivePid((pid) => {
      assert.equal(holder((pid | CLAIMING) >>> 0), pid);
      assert.equal(holderAlive((pid | CLAIMING) >>> 0, STALE_START), true);
      assert.equal(holderAlive(pid, STALE_START), false); // a taken lease: pid and start time
    });
    assert.equal(holderAlive((0x3fffff | CLAIMING) >>> 0, 0n), false);
    assert.equal(holderAlive(0, 0n), false);
  });

  test("a board publisher does not take it", async () => {
    const B = offsets("BoardHeader", 64);
    const board = PolicyBoard.create(unique("board"), { w: new Float32Array(4) });
    try {
      await withLivePid((pid) => {
        Atomics.store(board.segment.u64, B["writer_start_time"]! >> 3, STALE_START);
        Atomics.store(board.segment.i32, B["writer_pid"]! >> 2, (pid | CLAIMING) | 0);
        assert.throws(() => board.publish({ w: new Float32Array(4) }), (e: unknown) => e instanceof ChannelInUseError && e.message.includes(`live pid ${pid}`));
        Atomics.store(board.segment.i32, B["writer_pid"]! >> 2, 0);
      });
    } finally {
      board.close();
    }
  });

  test("a ring consumer does not take it, and members show the taker's pid", async () => {
    const R = offsets("RingHeader", 64);
    const ring = Ring.create(unique("ring"), experience.SCHEMA, "Probe64", 4);
    const control = RunControl.create(unique("ctl"), { slots: 2 });
    try {
      await withLivePid((pid) => {
        Atomics.store(ring.segment.u64, R["consumer_start_time"]! >> 3, STALE_START);
        Atomics.store(ring.segment.i32, R["consumer_pid"]! >> 2, (pid | CLAIMING) | 0);
        assert.throws(() => ring.consumer(), ChannelInUseError);
        Atomics.store(ring.segment.i32, R["consumer_pid"]! >> 2, 0);
        const member = control.join("me");
        assert.deepEqual(control.members().map((m) => m.pid), [process.pid]);
        member.leave();
      });
    } finally {
      ring.close();
      control.close();
    }
  });
});
