/**
 * OBSERVE (Appendix A 0x07 / 0x08) served by the env runtime: the N current results (an env's
 * `observe()`, else its last result unchanged) then a msgpack array of the N `info()` maps; no
 * auto-reset, no done checks; NOT_RESET before the first reset. The same answers from envs in
 * this thread and in a worker pool.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import { decode as msgpackDecode } from "@msgpack/msgpack";

import * as pac_env from "../generated/pac_env";
import { connect, serve } from "../index";
import { ErrorCode, MESSAGE_IDS as IDS, encodeHello, parseError } from "../protocol";
import type { Env, Spaces } from "../runtime/env";
import { blankPacResult } from "../testing/fixtures";
import { type Session, sessionFactory } from "../runtime/session";

const RESULT = pac_env.StepResultCodec.size;
const OBSERVE_REQ = pac_env.SCHEMA.messages["OBSERVE_REQ"]!.id;
const OBSERVE_RESP = pac_env.SCHEMA.messages["OBSERVE_RESP"]!.id;

/** Counts steps in observation[1]; `observe()` reports observation[2] = 99; `info()` its count. */
class ObservedEnv implements Env<pac_env.StepResultInput> {
  steps = 0;
  readonly #out = blankPacResult();

  spaces(): Spaces {
    return { obsN: 612, actN: 92 };
  }

  reset(): pac_env.StepResultInput {
    this.steps = 0;
    return this.#result(0);
  }

  step(): pac_env.StepResultInput {
    this.steps++;
    return this.#result(0);
  }

  observe(): pac_env.StepResultInput {
    return this.#result(99);
  }

  info(): Record<string, unknown> {
    return { steps: this.steps };
  }

  #result(mark: number): pac_env.StepResultInput {
    this.#out.observation[1] = this.steps;
    this.#out.observation[2] = mark;
    return this.#out;
  }
}

/** The plain env of a module the pool's threads can load. */
export function makeObserved(): Env<pac_env.StepResultInput> {
  return new ObservedEnv();
}

function hello(session: Session): Session {
  const body = encodeHello(pac_env.SCHEMA.fingerprint);
  assert.equal(session.handle(IDS.HELLO_REQ, body, 0, body.byteLength), IDS.HELLO_RESP);
  return session;
}

function observe(session: Session): { type: number; marks: number[]; counts: number[]; infos: unknown } {
  const type = session.handle(OBSERVE_REQ, new Uint8Array(0), 0, 0);
  const body = session.body();
  const marks: number[] = [];
  const counts: number[] = [];
  for (let i = 0; type === OBSERVE_RESP && i < session.numEnvs; i++) {
    counts.push(body.readFloatLE(i * RESULT + 4));
    marks.push(body.readFloatLE(i * RESULT + 8));
  }
  const infos = type === OBSERVE_RESP ? msgpackDecode(body.subarray(session.numEnvs * RESULT)) : null;
  return { type, marks, counts, infos };
}

function stepAll(session: Session): void {
  const body = Buffer.alloc(4 * session.numEnvs);
  assert.equal(session.handle(IDS.STEP_BATCH_REQ, body, 0, body.byteLength), IDS.STEP_BATCH_RESP);
}

const SESSIONS: Record<string, () => Session> = {
  "in this thread": () => sessionFactory(makeObserved, { numEnvs: 3 })(),
  "in a worker pool": () =>
    sessionFactory(makeObserved, { numEnvs: 3, workers: 2, workerEnv: { module: __filename, exportName: "makeObserved" } })(),
};

for (const [where, make] of Object.entries(SESSIONS)) {
  describe(`OBSERVE, envs ${where}`, () => {
    test("NOT_RESET before the first reset", () => {
      const session = hello(make());
      const { type } = observe(session);
      assert.equal(type, IDS.ERROR);
      assert.equal(parseError(session.body())?.code, ErrorCode.NOT_RESET);
      session.runtime.close();
    });

    test("observe() results and info() maps, without stepping", () => {
      const session = hello(make());
      session.handle(IDS.RESET_REQ, new Uint8Array(0), 0, 0);
      stepAll(session);
      stepAll(session);
      const first = observe(session);
      assert.equal(first.type, OBSERVE_RESP);
      assert.deepEqual(first.marks, [99, 99, 99]);
      assert.deepEqual(first.counts, [2, 2, 2]);
      assert.deepEqual(first.infos, [{ steps: 2 }, { steps: 2 }, { steps: 2 }]);
      assert.deepEqual(observe(session).counts, [2, 2, 2]); // observing does not step
      session.runtime.close();
    });
  });
}

describe("OBSERVE of an env without observe()", () => {
  test("its last result unchanged, and {} as info", () => {
    const session = hello(sessionFactory(() => new (class extends ObservedEnv {
      override observe = undefined as unknown as () => pac_env.StepResultInput;
      override info = undefined as unknown as () => Record<string, unknown>;
    })(), { numEnvs: 2 })());
    session.handle(IDS.RESET_REQ, new Uint8Array(0), 0, 0);
    stepAll(session);
    const last = Buffer.from(session.body().subarray(0, 2 * RESULT));
    const seen = observe(session);
    assert.equal(seen.type, OBSERVE_RESP);
    assert.deepEqual(Buffer.from(session.body().subarray(0, 2 * RESULT)), last);
    assert.deepEqual(seen.infos, [{}, {}]);
  });
});

describe("Client.observe over unix://", () => {
  test("the results and the info maps from a Node server", async () => {
    const url = `unix://${join(tmpdir(), `transport-observe-${randomBytes(5).toString("hex")}.sock`)}`;
    const server = await serve(makeObserved, url, { numEnvs: 2 });
    const client = await connect(server.url);
    try {
      await client.reset();
      await client.step([0, 0]);
      const { results, infos } = await client.observe({ copy: true });
      assert.deepEqual((results as pac_env.StepResult[]).map((r) => [r.observation[1], r.observation[2]]), [
        [1, 99],
        [1, 99],
      ]);
      assert.deepEqual(infos, [{ steps: 1 }, { steps: 1 }]);
    } finally {
      await client.close();
      await server.close();
    }
  });
});
