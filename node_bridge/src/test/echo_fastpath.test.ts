/**
 * The in-place env path (issue 24 item 2, Node): `stepInto` / `resetInto` / `observeInto` write
 * a result straight into its response row, and a server's responses are byte for byte those of
 * the same env stepped through `step` objects and the codec. Also: a subclass that overrides
 * `step` of an env with `stepInto` is stepped through its own `step`; an env with `stepInto`
 * and no `observe` still answers OBSERVE with its last result.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { EchoEnv, type EchoResult } from "../envs/echo";
import * as pac_env from "../generated/pac_env";
import { AutoReset, MESSAGE_IDS as IDS } from "../protocol";
import type { Action, Env, ResultRow, Spaces } from "../runtime/env";
import { EnvHost } from "../runtime/host";
import { Session } from "../runtime/session";

const CODEC = pac_env.StepResultCodec;
const SIZE = CODEC.size;
const OBSERVE_REQ = pac_env.SCHEMA.messages["OBSERVE_REQ"]?.id ?? -1;

/** The echo env through `step` / `reset` objects only (what the codec encodes). */
class PlainEcho implements Env<EchoResult> {
  readonly #env = new EchoEnv();
  spaces(): Spaces {
    return this.#env.spaces();
  }
  reset(seed?: bigint): EchoResult {
    return this.#env.reset(seed);
  }
  step(action: number): EchoResult {
    return this.#env.step(action);
  }
}

/** EchoEnv whose `step` is overridden: the runtime must call it (its reward is marked). */
class MarkedEcho extends EchoEnv {
  override step(action: number): EchoResult {
    const out = super.step(action);
    out.reward = -1;
    return out;
  }
}

/** Writes in place, with no `observe` / `observeInto`: OBSERVE answers its last record. */
class IntoOnly implements Env<EchoResult> {
  readonly #env = new EchoEnv();
  spaces(): Spaces {
    return this.#env.spaces();
  }
  reset(seed?: bigint): EchoResult {
    return this.#env.reset(seed);
  }
  step(action: number): EchoResult {
    return this.#env.step(action);
  }
  resetInto(seed: bigint | null, out: ResultRow): void {
    this.#env.resetInto(seed, out);
  }
  stepInto(action: Action, out: ResultRow): void {
    this.#env.stepInto(action, out);
  }
}

/** A session of `make` envs past HELLO (NEXT_STEP) and its response bodies for a fixed script. */
function script(make: () => Env<unknown>, numEnvs: number): Buffer[] {
  const host = new EnvHost(make, { numEnvs });
  const session = new Session(host.runtime());
  session.runtime.autoreset = AutoReset.NEXT_STEP;
  session.helloDone = true;
  const bodies: Buffer[] = [];
  const answer = (type: number, body: Uint8Array, want: number): void => {
    const got = session.handle(type, body, 0, body.byteLength);
    assert.equal(got, want, `answered ${got}: ${session.body().toString("utf8", 4)}`);
    bodies.push(Buffer.from(session.body()));
  };
  answer(IDS.RESET_REQ, new Uint8Array(0), IDS.RESET_RESP);
  answer(OBSERVE_REQ, new Uint8Array(0), pac_env.SCHEMA.messages["OBSERVE_RESP"]?.id ?? -1);
  const stride = pac_env.SCHEMA.ir.structs["StepRequest"]?.size ?? 4; // one action per request record
  const actions = new Uint8Array(numEnvs * stride);
  for (let round = 0; round < 5; round++) {
    for (let i = 0; i < numEnvs; i++) actions[i * stride] = (i * 7 + round * 13) % 92;
    answer(IDS.STEP_BATCH_REQ, actions, IDS.STEP_BATCH_RESP);
  }
  answer(OBSERVE_REQ, new Uint8Array(0), pac_env.SCHEMA.messages["OBSERVE_RESP"]?.id ?? -1);
  answer(IDS.RESET_REQ, new Uint8Array(0), IDS.RESET_RESP);
  for (let i = 0; i < numEnvs; i++) actions[i * stride] = (i + 1) % 92;
  answer(IDS.STEP_BATCH_REQ, actions, IDS.STEP_BATCH_RESP);
  session.runtime.close();
  return bodies;
}

describe("envs that write their results in place (stepInto)", () => {
  test("EchoEnv's in-place records are the codec's bytes of its step objects", () => {
    const into = new EchoEnv();
    const plain = new EchoEnv();
    const bytes = new Uint8Array(3 * SIZE + 5).fill(0xee); // stale bytes: every byte is written
    const row: ResultRow = { bytes, view: new DataView(bytes.buffer), at: SIZE + 5, size: SIZE };
    const check = (expected: EchoResult, what: string): void => {
      assert.deepEqual(Buffer.from(bytes.subarray(row.at, row.at + SIZE)), Buffer.from(CODEC.encode(expected)), what);
      bytes.fill(0xee);
    };
    into.resetInto(null, row);
    check(plain.reset(), "reset");
    let last = plain.reset();
    for (const action of [0, 5, 91, 3, 64]) {
      into.stepInto(action, row);
      last = plain.step(action);
      check(last, `step ${action}`);
    }
    into.observeInto(row);
    check(last, "observe: the last step's result");
    assert.throws(() => into.stepInto(1, { ...row, size: SIZE - 1 }), TypeError);
  });

  test("a server's responses are the same bytes with and without the in-place path", () => {
    const expected = script(() => new PlainEcho(), 8);
    assert.deepEqual(script(() => new EchoEnv(), 8), expected);
    assert.deepEqual(script(() => new IntoOnly(), 8), expected); // OBSERVE from the kept record
  });

  test("a detached response buffer (zmq, http pipelining) carries the header and results over", () => {
    const host = new EnvHost(() => new EchoEnv(), { numEnvs: 2 });
    const session = new Session(host.runtime());
    session.helloDone = true;
    assert.equal(session.handle(IDS.RESET_REQ, new Uint8Array(0), 0, 0), IDS.RESET_RESP);
    const old = session.buffer;
    const before = Buffer.from(old);
    session.detachBuffer(old.byteLength + 100);
    assert.notEqual(session.buffer, old);
    // what a reused buffer would hold where it is read (a "noop" env's row keeps its previous
    // result); the rest is scratch every response writes in full
    assert.deepEqual(session.buffer.subarray(0, 16 + 2 * SIZE), before.subarray(0, 16 + 2 * SIZE));
    assert.deepEqual(Buffer.from(session.body()), before.subarray(16, 16 + 2 * SIZE));
    session.runtime.close();
  });

  test("a subclass that overrides step is stepped through its step", () => {
    const bodies = script(() => new MarkedEcho(), 2);
    const step = bodies[2] as Buffer; // the first STEP_BATCH_RESP
    const reward = new DataView(step.buffer, step.byteOffset, step.byteLength).getFloat32(2540, true);
    assert.equal(reward, -1);
  });
});
