/**
 * A session's envs in worker_threads (workers.ts `WorkerPool`, `serve.js --workers K`): the
 * responses are byte for byte those of the in-process Session; an env that throws is a typed
 * ENV_ERROR naming it (reset, the others step); a worker thread that dies fails its envs by name
 * and is replaced. This file is also the module the pool's threads load `makeFaulty` from.
 */

import assert from "node:assert/strict";
import { isMainThread } from "node:worker_threads";
import { describe, test } from "node:test";

import type { Env, Spaces } from "../runtime/env";
import { ENVS } from "../envs";
import * as pac_env from "../generated/pac_env";
import { AutoReset, BODY_OFFSET, ErrorCode, MESSAGE_IDS as IDS, encodeError, parseError } from "../protocol";
import { REMOTE_TRACEBACK_MARKER } from "../errors";
import { hello, reset, step } from "../testing/pac_session";
import { Session, sessionFactory } from "../runtime/session";
import { WorkerPool, split } from "../runtime/pool";

const OBS_N = 612;
const ACT_N = 92;
const POISON = 7; // the env throws
const EXIT = 8; // the env's thread exits
const RESULT = pac_env.StepResultCodec.size;

/** Counts its steps in observation[1]; POISON throws, EXIT ends the worker thread. */
class FaultyEnv implements Env<pac_env.StepResultInput> {
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

  reset(seed?: bigint): pac_env.StepResultInput {
    if (seed === 666n) throw new RangeError("cursed seed");
    this.steps = Number(seed ?? 0n);
    return this.#result(0);
  }

  step(action: number): pac_env.StepResultInput {
    if (action === POISON) throw new TypeError("poisoned action");
    if (action === EXIT) process.exit(3);
    this.steps++;
    return this.#result(action);
  }
}

export function makeFaulty(): Env<pac_env.StepResultInput> {
  return new FaultyEnv();
}


/** A seeded xorshift policy: a legal action of each env in the current response. */
function legal(session: Session, state: { s: number }): number[] {
  const out: number[] = [];
  for (let i = 0; i < session.numEnvs; i++) {
    const result = pac_env.StepResultCodec.decode(session.buffer, BODY_OFFSET + i * RESULT, false);
    const moves: number[] = [];
    result.action_mask.forEach((m: number, a: number) => {
      if (m) moves.push(a);
    });
    state.s ^= state.s << 13;
    state.s ^= state.s >>> 17;
    state.s ^= state.s << 5;
    out.push(moves[(state.s >>> 0) % moves.length] as number);
  }
  return out;
}

function pacSessions(numEnvs: number, workers: number): [Session, Session] {
  const inProcess = sessionFactory(ENVS["pac"]!, { numEnvs, envName: "pac" })();
  const pooled = sessionFactory(ENVS["pac"]!, {
    numEnvs,
    envName: "pac",
    workers,
  })();
  return [inProcess, pooled];
}

function faultySessions(numEnvs: number, workers: number, mode: AutoReset): [Session, Session] {
  const inProcess = sessionFactory(makeFaulty, { numEnvs })();
  const pooled = sessionFactory(makeFaulty, {
    numEnvs,
    workers,
    workerEnv: { module: __filename, exportName: "makeFaulty" },
  })();
  hello(inProcess, mode);
  hello(pooled, mode);
  return [inProcess, pooled];
}

function same(a: Session, b: Session, typeA: number, typeB: number): void {
  assert.equal(typeB, typeA);
  assert.deepEqual(messageOnly(b.body()), messageOnly(a.body()));
}

/** An ERROR body without the env's last frames (where they ran differs); other bodies as they are. */
function messageOnly(body: Buffer): Buffer {
  const parsed = parseError(body);
  if (parsed === null || !parsed.text.includes(REMOTE_TRACEBACK_MARKER)) return body;
  return encodeError(parsed.code, parsed.text.split(REMOTE_TRACEBACK_MARKER)[0] as string);
}

if (isMainThread) {
  test("split is even, the first workers get one more", () => {
    assert.deepEqual(split(8, 3), [
      [0, 3],
      [3, 6],
      [6, 8],
    ]);
    assert.deepEqual(split(2, 2), [
      [0, 1],
      [1, 2],
    ]);
  });

  describe("pac in worker threads: byte-identical responses", () => {
    for (const mode of [AutoReset.DISABLED, AutoReset.NEXT_STEP, AutoReset.SAME_STEP]) {
      test(`auto-reset mode ${mode}`, () => {
        const [a, b] = pacSessions(8, 3);
        hello(a, mode);
        hello(b, mode);
        const policy = { s: 12345 };
        for (let round = 0; round < 3; round++) {
          same(a, b, reset(a, BigInt(round * 8)), reset(b, BigInt(round * 8)));
          for (let t = 0; t < 300; t++) {
            const actions = legal(a, policy);
            const typeA = step(a, actions);
            same(a, b, typeA, step(b, actions));
            if (typeA === IDS.ERROR) break; // disabled: an env is done
          }
        }
      });
    }
  });

  describe("env errors in worker threads", () => {
    test("an env that throws: the same typed error as in process; the env is reset", () => {
      const [a, b] = faultySessions(8, 2, AutoReset.DISABLED);
      same(a, b, reset(a, 10n), reset(b, 10n));
      const actions = [1, 1, 1, POISON, 1, 1, POISON, 1];
      same(a, b, step(a, actions), step(b, actions));
      // the worker's last frames ride along after the message
      assert.match(parseError(b.body())?.text ?? "", /\n--- server traceback \(last frames\) ---\nTypeError: poisoned action\n {4}at /);
      assert.deepEqual(parseError(messageOnly(b.body())), {
        code: ErrorCode.ENV_ERROR,
        text:
          "env 3: TypeError: poisoned action (the env was reset); " +
          "env 6: TypeError: poisoned action (the env was reset)",
      });
      same(a, b, step(a, [2, 2, 2, 2, 2, 2, 2, 2]), step(b, [2, 2, 2, 2, 2, 2, 2, 2]));
    });

    test("a reset that throws: the env is recreated, then needs a reset", () => {
      const [a, b] = faultySessions(4, 2, AutoReset.NEXT_STEP);
      // env i gets seed + i: env 2 gets 666
      same(a, b, reset(a, 664n), reset(b, 664n));
      assert.equal(parseError(b.body())?.code, ErrorCode.ENV_ERROR);
      assert.match(parseError(b.body())?.text ?? "", /^env 2: RangeError: cursed seed \(/);
      same(a, b, step(a, [1, 1, 1, 1]), step(b, [1, 1, 1, 1]));
    });

    test("a worker thread that dies: its envs fail by name, a new thread takes over", () => {
      const [, b] = faultySessions(8, 2, AutoReset.DISABLED);
      assert.equal(reset(b, 0n), IDS.RESET_RESP);
      assert.equal(step(b, [1, 1, 1, 1, 1, EXIT, 1, 1]), IDS.ERROR);
      const error = parseError(b.body());
      assert.equal(error?.code, ErrorCode.ENV_ERROR);
      const parts = (error?.text ?? "").split("; ");
      assert.equal(parts.length, 4);
      parts.forEach((part, j) => {
        assert.match(
          part,
          new RegExp(
            `^env ${4 + j}: worker thread 1 \\(thread id \\d+, envs 4\\.\\.7\\) died ` +
              `\\(the env was recreated in a new worker thread\\)$`,
          ),
        );
      });
      // the other worker's envs stepped; the next request works everywhere
      assert.equal(step(b, [2, 2, 2, 2, 2, 2, 2, 2]), IDS.STEP_BATCH_RESP);
      const counts = Array.from({ length: 8 }, (_, i) => b.buffer.readFloatLE(BODY_OFFSET + i * RESULT + 4));
      assert.deepEqual(counts, [2, 3, 4, 5, 1, 1, 1, 1]); // envs 4..7: fresh, reset unseeded
      assert.equal(reset(b, 100n), IDS.RESET_RESP);
    });

    test("a pool whose envs cannot be built is refused when the session starts", () => {
      assert.throws(
        () => new WorkerPool({ envName: "no-such-env" }, 2, 1),
        /worker thread 0: creating its envs failed: .*unknown env "no-such-env"/,
      );
    });
  });
}
