/**
 * A worker pool's session keeps its response buffer in a SharedArrayBuffer (issue 24 item 2):
 * the workers write each env's result where the session sends it from, nothing is copied back
 * from the pool's area, and a detached buffer (a zmq reply handed to libzmq) is shared too, the
 * workers told where to write with the next command. The responses stay byte for byte those of
 * the in-process session, in every auto-reset mode, with envs ending and buffers detached. This
 * file is also the module the pool's threads load `makeEnding` from.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isMainThread } from "node:worker_threads";
import { describe, test } from "node:test";

import type { Env, Spaces } from "../runtime/env";
import type { Records } from "../runtime/core";
import { Op } from "../runtime/core";
import * as pac_env from "../generated/pac_env";
import { AutoReset, BODY_OFFSET, MESSAGE_IDS as IDS } from "../protocol";
import { type Session, sessionFactory } from "../runtime/session";
import { type PoolRunner, WorkerPool } from "../runtime/pool";
import { EnvHost } from "../runtime/host";
import { listen } from "../backends/zmq/server";
import { connect } from "../client";
import { blankPacResult } from "../testing/fixtures";
import { hello, reset, step } from "../testing/pac_session";

const OBS_N = 612;
const ACT_N = 92;
const N = 7;
const SIZE = pac_env.StepResultCodec.size;

/** Ends its episode after 2..5 steps (its seed and its reset count choose): envs end at different steps. */
class EndingEnv implements Env<pac_env.StepResultInput> {
  #steps = 0;
  #limit = 2;
  #resets = 0;
  #base = 0;
  readonly #out = blankPacResult();

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  reset(seed?: bigint): pac_env.StepResultInput {
    if (seed !== undefined) this.#base = Number(seed % 1000n);
    this.#resets++;
    this.#steps = 0;
    this.#limit = 2 + ((this.#base + this.#resets) % 4);
    return this.#result(0);
  }

  step(action: number): pac_env.StepResultInput {
    this.#steps++;
    return this.#result(action);
  }

  #result(action: number): pac_env.StepResultInput {
    const out = this.#out;
    out.observation[0] = action;
    out.observation[1] = this.#steps;
    out.observation[OBS_N - 1] = this.#base * 10 + this.#resets;
    out.reward = action * 0.5 + this.#steps;
    out.done = this.#steps >= this.#limit ? 1 : 0;
    out.stage = this.#resets;
    return out;
  }
}

export function makeEnding(): Env<pac_env.StepResultInput> {
  return new EndingEnv();
}


function sessions(mode: AutoReset): { local: Session; pooled: Session; pool: WorkerPool } {
  const local = sessionFactory(makeEnding, { numEnvs: N })();
  const pooled = sessionFactory(makeEnding, { numEnvs: N, workers: 3, workerEnv: { module: __filename, exportName: "makeEnding" } })();
  hello(local, mode);
  hello(pooled, mode);
  const pool = (pooled.runtime.runner as PoolRunner).start();
  return { local, pooled, pool };
}

/** Same msg_type and the same body bytes (the results region and any SAME_STEP tail). */
function same(local: Session, pooled: Session, typeLocal: number, typePooled: number, where: string): void {
  assert.equal(typePooled, typeLocal, where);
  assert.deepEqual(Buffer.from(pooled.body()), Buffer.from(local.body()), where);
}

function isShared(session: Session): boolean {
  return session.buffer.buffer instanceof SharedArrayBuffer;
}

/**
 * `rounds` seeded resets, each followed by `steps` steps (a DISABLED episode end is an ERROR:
 * reset again); `detach` says before which steps the pooled session's buffer is detached.
 */
function drive(mode: AutoReset, detach: (t: number) => boolean): { local: Session; pooled: Session; pool: WorkerPool; ended: number } {
  const { local, pooled, pool } = sessions(mode);
  let ended = 0;
  try {
    for (let round = 0; round < 3; round++) {
      same(local, pooled, reset(local, BigInt(round * 11)), reset(pooled, BigInt(round * 11)), `reset ${round}`);
      for (let t = 0; t < 12; t++) {
        if (detach(t)) {
          const before = pooled.buffer;
          pooled.detachBuffer();
          assert.notEqual(pooled.buffer, before);
          before.fill(0xee); // the old buffer is libzmq's now: nothing may read or write it
        }
        const actions = Array.from({ length: N }, (_, i) => (t * 7 + i * 3 + round) % ACT_N);
        const typeLocal = step(local, actions);
        same(local, pooled, typeLocal, step(pooled, actions), `mode ${mode} round ${round} step ${t}`);
        if (typeLocal === IDS.STEP_BATCH_RESP && mode === AutoReset.SAME_STEP) ended += local.buffer.readUInt32LE(BODY_OFFSET + N * SIZE);
        for (let i = 0; i < N; i++) {
          if (typeLocal === IDS.STEP_BATCH_RESP && pac_env.StepResultCodec.decode(local.buffer, BODY_OFFSET + i * SIZE, false).done) ended++;
        }
        if (typeLocal === IDS.ERROR) {
          // DISABLED: an env is done and must be reset first
          same(local, pooled, reset(local, BigInt(t)), reset(pooled, BigInt(t)), `reset after ${t}`);
        }
      }
    }
    return { local, pooled, pool, ended };
  } catch (error) {
    local.runtime.close();
    pooled.runtime.close();
    throw error;
  }
}

if (isMainThread) {
  describe("a pool session's results are written in place, no copy back", () => {
    for (const mode of [AutoReset.DISABLED, AutoReset.NEXT_STEP, AutoReset.SAME_STEP]) {
      test(`auto-reset mode ${mode}: byte-identical to in-process, envs ending`, () => {
        const { local, pooled, pool, ended } = drive(mode, () => false);
        try {
          assert.ok(ended > 0, "some episodes ended");
          assert.equal(isShared(pooled), true, "a pool session's buffer is a SharedArrayBuffer");
          assert.equal(isShared(local), false, "an in-process session's is not");
          assert.equal(pool.copiedBack, 0, "no result copied back from the pool's area");
        } finally {
          local.runtime.close();
          pooled.runtime.close();
        }
      });

      test(`auto-reset mode ${mode}: buffers detached now and then are shared too, the workers told where to write`, () => {
        const { local, pooled, pool, ended } = drive(mode, (t) => t % 4 === 1);
        try {
          assert.ok(ended > 0, "some episodes ended");
          assert.equal(isShared(pooled), true, "a detached buffer is a SharedArrayBuffer too");
          assert.equal(pooled.sharedBuffer, true);
          assert.equal(pool.copiedBack, 0, "no result copied back from the pool's area");
        } finally {
          local.runtime.close();
          pooled.runtime.close();
        }
      });

      test(`auto-reset mode ${mode}: buffers detached at every step (zmq at large N) are private, results copied back, then shared again`, () => {
        const { local, pooled, pool, ended } = drive(mode, (t) => t < 8);
        try {
          assert.ok(ended > 0, "some episodes ended");
          assert.ok(pool.copiedBack > 0, "results copied back into the private buffers");
          const copied = pool.copiedBack;
          // no detach for a while, then one: shared again, written in place
          for (let t = 0; t < 3; t++) {
            const actions = Array.from({ length: N }, (_, i) => (t + i) % ACT_N);
            if (t === 2) pooled.detachBuffer();
            const typeLocal = step(local, actions);
            same(local, pooled, typeLocal, step(pooled, actions), `after detaches, step ${t}`);
            if (typeLocal === IDS.ERROR) same(local, pooled, reset(local, 9n), reset(pooled, 9n), "reset");
          }
          assert.equal(isShared(pooled), true);
          const last = pool.copiedBack;
          const actions = Array.from({ length: N }, () => 0);
          const typeLocal = step(local, actions);
          same(local, pooled, typeLocal, step(pooled, actions), "in place again");
          assert.equal(pool.copiedBack, last, "written in place again");
          assert.ok(last >= copied);
        } finally {
          local.runtime.close();
          pooled.runtime.close();
        }
      });
    }
  });

  test("a detached buffer keeps the results region: a detach right after a response sends the same bytes", () => {
    const { local, pooled } = sessions(AutoReset.NEXT_STEP);
    try {
      same(local, pooled, reset(local, 5n), reset(pooled, 5n), "reset");
      const body = Buffer.from(pooled.body());
      pooled.detachBuffer();
      assert.deepEqual(Buffer.from(pooled.body()), body);
    } finally {
      local.runtime.close();
      pooled.runtime.close();
    }
  });

  test("private records are still copied back (the counter counts), and shared ones switch back to in place", () => {
    const pool = new WorkerPool({ module: __filename, exportName: "makeEnding" }, N, 2);
    try {
      const records = (memory: ArrayBufferLike): Records & { bytes: Uint8Array } => ({
        bytes: new Uint8Array(memory),
        at: (i) => i * SIZE,
        packed: true,
        written: () => undefined,
        keepFinal: () => undefined,
      });
      const seeds = new Array<bigint | null>(N).fill(null).map((_, i) => BigInt(i));
      const resets = new Uint8Array(N).fill(Op.RESET);
      const steps = new Uint8Array(N).fill(Op.STEP);
      const actions = new Float64Array(N).fill(3);
      const privateOut = records(new ArrayBuffer(N * SIZE));
      assert.equal(pool.run(resets, actions, seeds, privateOut), null);
      assert.equal(pool.copiedBack, 1);
      const sharedOut = records(new SharedArrayBuffer(N * SIZE));
      assert.equal(pool.run(resets, actions, seeds, sharedOut), null);
      assert.equal(pool.copiedBack, 1, "written in place");
      // each env's second reset (stage: its reset count) went to the shared records alone
      for (let i = 0; i < N; i++) {
        assert.equal(pac_env.StepResultCodec.decode(privateOut.bytes, i * SIZE, false).stage, 1);
        assert.equal(pac_env.StepResultCodec.decode(sharedOut.bytes, i * SIZE, false).stage, 2);
      }
      // alternate: each switch is taken by the workers with the command itself
      for (let t = 0; t < 4; t++) {
        assert.equal(pool.run(steps, actions, seeds, privateOut), null);
        assert.equal(pool.run(steps, actions, seeds, sharedOut), null);
      }
      assert.equal(pool.copiedBack, 5);
      // both stepped the same envs, each after the other: the shared one is one step ahead
      const a = pac_env.StepResultCodec.decode(privateOut.bytes, 0, false);
      const b = pac_env.StepResultCodec.decode(sharedOut.bytes, 0, false);
      assert.equal(b.observation[1], (a.observation[1] as number) + 1);
    } finally {
      pool.close();
    }
  });

  test("a zmq server with workers at N = 32 (replies handed to libzmq, buffers detached): the same results as one without", async () => {
    const n = 32; // 32 results are over the 64 KiB from which a reply is handed over, not copied
    const make = (workers: number): EnvHost =>
      new EnvHost(makeEnding, { numEnvs: n, workers, workerEnv: { module: __filename, exportName: "makeEnding" } });
    const url = (tag: string): string => `zmq+ipc://${join(tmpdir(), `pool-rows-${tag}-${process.pid}-${randomBytes(4).toString("hex")}`)}`;
    const pooled = await listen(url("pool"), make(2));
    const inThread = await listen(url("local"), make(0));
    try {
      const a = await connect(pooled.url, { timeoutMs: 10_000, autoreset: AutoReset.SAME_STEP });
      const b = await connect(inThread.url, { timeoutMs: 10_000, autoreset: AutoReset.SAME_STEP });
      try {
        assert.deepEqual(await a.reset(3n, { copy: true }), await b.reset(3n, { copy: true }));
        for (let t = 0; t < 12; t++) {
          const actions = Array.from({ length: n }, (_, i) => (t * 5 + i) % ACT_N);
          assert.deepEqual(await a.step(actions, { copy: true }), await b.step(actions, { copy: true }), `step ${t}`);
        }
      } finally {
        await a.close();
        await b.close();
      }
      assert.ok(pooled.stats.detached > 0, "replies were handed to libzmq");
    } finally {
      await pooled.close();
      await inThread.close();
    }
  });
}
