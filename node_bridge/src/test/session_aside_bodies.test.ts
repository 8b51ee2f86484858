/**
 * A session's ERROR, HELLO, HEALTH and SPACES bodies never overwrite the results region: the
 * last result of every env stays what a "noop" masked action sends again (they were written at
 * BODY_OFFSET, over env 0's record, which the next noop step then sent as its result). Python's
 * session keeps them apart the same way.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { PacEnv } from "../envs";
import * as pac_env from "../generated/pac_env";
import { MESSAGE_IDS as IDS, encodeHello } from "../protocol";
import { EnvHost } from "../runtime/host";
import { Session } from "../runtime/session";

const RESULT = pac_env.StepResultCodec.size;
const ENVS = 2;
const MASKED = 60; // pac reserves 51..91: always masked
const REWARD_AT = 2540; // pac_env's StepResult: observation f32[612], action_mask u8[92], reward f32

function actions(...values: number[]): Buffer {
  const body = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => body.writeInt32LE(v, 4 * i));
  return body;
}

test("ERROR, HELLO, HEALTH and SPACES bodies leave every env's last result in place", () => {
  const host = new EnvHost(() => new PacEnv(), { numEnvs: ENVS, maskedActions: "noop" });
  const session = new Session(host.runtime());
  try {
    const hello = encodeHello(pac_env.FINGERPRINT);
    assert.equal(session.handle(IDS.HELLO_REQ, hello, 0, hello.byteLength), IDS.HELLO_RESP);
    assert.equal(session.handle(IDS.RESET_REQ, Buffer.alloc(0), 0, 0), IDS.RESET_RESP);
    const legal = actions(0, 0);
    assert.equal(session.handle(IDS.STEP_BATCH_REQ, legal, 0, legal.byteLength), IDS.STEP_BATCH_RESP);
    const kept = Buffer.from(session.body().subarray(0, RESULT)); // env 0's result
    const bad = Buffer.alloc(3); // a STEP_BATCH body of the wrong size: an ERROR response
    assert.equal(session.handle(IDS.STEP_BATCH_REQ, bad, 0, bad.byteLength), IDS.ERROR);
    assert.ok(session.body().byteLength > 8, "the ERROR body says why");
    assert.equal(session.handle(IDS.HEALTH_REQ, Buffer.alloc(0), 0, 0), IDS.HEALTH_RESP);
    assert.deepEqual([...session.body()], [1]);
    assert.equal(session.handle(IDS.SPACES_REQ, Buffer.alloc(0), 0, 0), IDS.SPACES_RESP);
    const noop = actions(MASKED, 0); // env 0 masked: not stepped, its last result sent again
    assert.equal(session.handle(IDS.STEP_BATCH_REQ, noop, 0, noop.byteLength), IDS.STEP_BATCH_RESP);
    const again = Buffer.from(session.body().subarray(0, RESULT));
    // every byte but the reward (f32 at 2540: the noop's penalty) is the kept result
    assert.deepEqual(again.subarray(0, REWARD_AT), kept.subarray(0, REWARD_AT));
    assert.deepEqual(again.subarray(REWARD_AT + 4), kept.subarray(REWARD_AT + 4));
  } finally {
    session.runtime.close();
  }
});
