/**
 * The worker pool's own work per command (issue 24 item 2): `ping` is a command its workers
 * answer doing nothing (the pool's synchronisation alone, the floor of a step); the main thread
 * waits once per command on a FINISHED counter bumped by each worker (it waited on each worker's
 * done word in turn), including for a command sent to one worker, around a worker that died,
 * and with per-env ops and flags in contiguous areas (no per-env 1024-byte record touched by a
 * step); records in a SharedArrayBuffer are written in place by the workers (no copy). This
 * file is also the module the pool's threads load `makeCounter` from.
 */

import assert from "node:assert/strict";
import { isMainThread } from "node:worker_threads";
import { describe, test } from "node:test";

import type { Env, Spaces } from "../runtime/env";
import type { Records } from "../runtime/core";
import { Op } from "../runtime/core";
import * as pac_env from "../generated/pac_env";
import { WorkerPool } from "../runtime/pool";

const OBS_N = 612;
const ACT_N = 92;
const POISON = 7; // the env throws
const EXIT = 8; // the env's thread exits
const N = 6;
const SIZE = pac_env.StepResultCodec.size;

/** Writes its action and its step count into observation[0..1]; POISON throws, EXIT ends its thread. */
class CounterEnv implements Env<pac_env.StepResultInput> {
  steps = 0;
  readonly #out = {
    observation: new Float32Array(OBS_N),
    action_mask: new Uint8Array(ACT_N).fill(1),
    reward: 0,
    done: 0,
    rank: 0,
    life: 0,
    money: 0,
    stage: 0,
    board_size: 0,
    level: 0,
    synergy_count: 0,
    items_held: 0,
    actions_this_turn: 0,
  };

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  #result(action: number): pac_env.StepResultInput {
    this.#out.observation[0] = action;
    this.#out.observation[1] = this.steps;
    return this.#out;
  }

  reset(): pac_env.StepResultInput {
    this.steps = 0;
    return this.#result(0);
  }

  step(action: number): pac_env.StepResultInput {
    if (action === POISON) throw new TypeError("poisoned action");
    if (action === EXIT) process.exit(3);
    this.steps++;
    return this.#result(action);
  }

  info(): Record<string, unknown> {
    return { steps: this.steps };
  }
}

export function makeCounter(): Env<pac_env.StepResultInput> {
  return new CounterEnv();
}

function records(): Records & { bytes: Uint8Array } {
  return { bytes: new Uint8Array(N * SIZE), at: (i) => i * SIZE, packed: true, written: () => undefined, keepFinal: () => undefined };
}

/** observation[0..1] of each env's record. */
function observed(out: Records): Array<[number, number]> {
  const view = new DataView(out.bytes.buffer, out.bytes.byteOffset, out.bytes.byteLength);
  return Array.from({ length: N }, (_, i) => [view.getFloat32(out.at(i), true), view.getFloat32(out.at(i) + 4, true)]);
}

function ops(op: number): Uint8Array {
  return new Uint8Array(N).fill(op);
}

const NO_SEEDS: Array<bigint | null> = new Array<bigint | null>(N).fill(null);

function actions(...values: number[]): Float64Array {
  return Float64Array.from({ length: N }, (_, i) => values[i] ?? values[values.length - 1] ?? 0);
}

if (isMainThread) {
  describe("worker pool overhead", () => {
    test("ping wakes every worker and steps nothing", () => {
      const pool = new WorkerPool({ module: __filename, exportName: "makeCounter" }, N, 2);
      try {
        const out = records();
        assert.equal(pool.run(ops(Op.RESET), actions(0), NO_SEEDS, out), null);
        assert.equal(pool.run(ops(Op.STEP), actions(3), NO_SEEDS, out), null);
        for (let k = 0; k < 5; k++) assert.deepEqual(pool.ping(), []);
        assert.equal(pool.run(ops(Op.STEP), actions(4), NO_SEEDS, out), null);
        assert.deepEqual(observed(out), Array.from({ length: N }, () => [4, 2])); // one step per run: ping stepped none
      } finally {
        pool.close();
      }
    });

    test("a command to one worker, then a step of all: each waits for its own workers", () => {
      const pool = new WorkerPool({ module: __filename, exportName: "makeCounter" }, N, 2);
      try {
        const out = records();
        assert.equal(pool.run(ops(Op.RESET), actions(0), NO_SEEDS, out), null);
        for (let round = 1; round <= 4; round++) {
          assert.deepEqual(pool.info(N - 1), { steps: round - 1 });
          assert.equal(pool.run(ops(Op.STEP), actions(round + 10), NO_SEEDS, out), null);
          assert.deepEqual(observed(out), Array.from({ length: N }, () => [round + 10, round]));
        }
      } finally {
        pool.close();
      }
    });

    test("per-env ops and flags: the env that threw is the only failure, an env with no op keeps its record", () => {
      const pool = new WorkerPool({ module: __filename, exportName: "makeCounter" }, N, 2);
      try {
        const out = records();
        assert.equal(pool.run(ops(Op.RESET), actions(0), NO_SEEDS, out), null);
        const some = ops(Op.STEP);
        some[1] = Op.NONE;
        const failures = pool.run(some, actions(5, 5, 5, 5, POISON, 5), NO_SEEDS, out);
        assert.deepEqual(
          failures?.map(([i]) => i),
          [4],
        );
        const got = observed(out);
        assert.deepEqual(got[1], [0, 0]); // no op: its reset record
        assert.deepEqual([got[0], got[2], got[3], got[5]], [[5, 1], [5, 1], [5, 1], [5, 1]]);
        // the next step: no flag left over from the failure
        assert.equal(pool.run(ops(Op.STEP), actions(6), NO_SEEDS, out), null);
      } finally {
        pool.close();
      }
    });

    test("records in a SharedArrayBuffer are written in place by the workers, private ones copied", () => {
      const pool = new WorkerPool({ module: __filename, exportName: "makeCounter" }, N, 2);
      try {
        const sab = new SharedArrayBuffer(64 + N * SIZE);
        const shared: Records & { bytes: Uint8Array } = {
          bytes: new Uint8Array(sab, 64),
          at: (i) => i * SIZE,
          packed: true,
          written: () => undefined,
          keepFinal: () => undefined,
        };
        const own = records();
        assert.equal(pool.run(ops(Op.RESET), actions(0), NO_SEEDS, shared), null);
        assert.equal(pool.run(ops(Op.STEP), actions(2), NO_SEEDS, shared), null);
        assert.deepEqual(observed(shared), Array.from({ length: N }, () => [2, 1]));
        assert.equal(pool.run(ops(Op.STEP), actions(3), NO_SEEDS, own), null); // back to a copy
        assert.deepEqual(observed(own), Array.from({ length: N }, () => [3, 2]));
        assert.deepEqual(observed(shared), Array.from({ length: N }, () => [2, 1])); // untouched
        const some = ops(Op.STEP);
        some[0] = Op.NONE;
        assert.equal(pool.run(some, actions(4), NO_SEEDS, shared), null);
        const got = observed(shared);
        assert.deepEqual(got[0], [2, 1]); // no op: kept
        assert.deepEqual(got.slice(1), Array.from({ length: N - 1 }, () => [4, 3]));
        // a replaced worker writes into the shared records too
        const failures = pool.run(ops(Op.STEP), actions(1, 1, 1, 1, EXIT, 1), NO_SEEDS, shared);
        assert.deepEqual(
          failures?.map(([i]) => i),
          [3, 4, 5],
        );
        assert.equal(pool.run(ops(Op.RESET), actions(0), NO_SEEDS, shared), null);
        assert.equal(pool.run(ops(Op.STEP), actions(9), NO_SEEDS, shared), null);
        assert.deepEqual(observed(shared).map(([a]) => a), new Array<number>(N).fill(9));
      } finally {
        pool.close();
      }
    });

    test("a worker that died fails its envs; the next commands wait for the right count", () => {
      const pool = new WorkerPool({ module: __filename, exportName: "makeCounter" }, N, 2);
      try {
        const out = records();
        assert.equal(pool.run(ops(Op.RESET), actions(0), NO_SEEDS, out), null);
        const failures = pool.run(ops(Op.STEP), actions(1, 1, 1, 1, EXIT, 1), NO_SEEDS, out);
        assert.deepEqual(
          failures?.map(([i]) => i),
          [3, 4, 5],
        );
        assert.match(String(failures?.[0]?.[1]), /worker thread 1/);
        assert.equal(pool.run(ops(Op.RESET), actions(0), NO_SEEDS, out), null);
        for (let round = 1; round <= 3; round++) {
          assert.deepEqual(pool.ping(), []);
          assert.equal(pool.run(ops(Op.STEP), actions(20 + round), NO_SEEDS, out), null);
          const got = observed(out);
          assert.deepEqual(got.map(([a]) => a), new Array<number>(N).fill(20 + round));
        }
      } finally {
        pool.close();
      }
    });
  });
}
