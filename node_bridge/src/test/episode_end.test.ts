/**
 * Which result fields end an episode (issue 15, item 1): `done` when the result has one, else
 * `terminated` or `truncated`. A schema with terminated + truncated roles (mahjong_env) must
 * auto-reset an env whose episode was truncated, as Python's server does.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import type { Env, Spaces } from "../runtime/env";
import * as mahjong_env from "../generated/mahjong_env";
import { AutoReset, BODY_OFFSET, MESSAGE_IDS as IDS, encodeHello, parseError } from "../protocol";
import { sessionFactory } from "../runtime/session";

const LIMIT = 2; // steps before the time limit truncates the episode
const RESULT = mahjong_env.AgentStepCodec.size;
const TURN_AT = mahjong_env.SCHEMA.ir.structs.AgentStep!.fields.find((f) => f.name === "turn")!.offset;

/** Counts its steps in `turn`; truncated (not terminated) after LIMIT steps. */
class TimeLimitTable implements Env<mahjong_env.AgentStepInput> {
  turn = 0;

  spaces(): Spaces {
    return { obsN: 290, actN: 104 };
  }

  #result(): mahjong_env.AgentStepInput {
    const none = { kind: mahjong_env.MeldKind.NONE, from_seat: -1, tiles: [255, 255, 255, 255] };
    return {
      agent: mahjong_env.Agent.PLAYER_0,
      terminated: false,
      truncated: this.turn >= LIMIT,
      seat_wind: mahjong_env.Wind.EAST,
      reward: 0,
      observation: new Float32Array(290),
      action_mask: new Array<boolean>(104).fill(true),
      prevailing_wind: mahjong_env.Wind.EAST,
      tiles_remaining: 0,
      turn: this.turn,
      melds: [none, none, none, none],
      score: 0n,
      episode_id: 0n,
      hand_value: 0,
      last_discard: 0,
      dealer_streak: 0,
    };
  }

  reset(): mahjong_env.AgentStepInput {
    this.turn = 0;
    return this.#result();
  }

  step(): mahjong_env.AgentStepInput {
    this.turn++;
    return this.#result();
  }
}

function session(mode: AutoReset) {
  const s = sessionFactory(TimeLimitTable, { numEnvs: 1, schema: mahjong_env.SCHEMA })();
  const hello = encodeHello(mahjong_env.SCHEMA.fingerprint, undefined, mode);
  assert.equal(s.handle(IDS.HELLO_REQ, hello, 0, hello.byteLength), IDS.HELLO_RESP);
  assert.equal(s.handle(IDS.RESET_REQ, new Uint8Array(0), 0, 0), IDS.RESET_RESP);
  return s;
}

function step(s: ReturnType<typeof session>): number {
  const body = mahjong_env.ActionRequestCodec.encode({ agent: 0, action: 1 });
  return s.handle(IDS.STEP_REQ, body, 0, body.byteLength);
}

describe("episode ends with terminated + truncated roles", () => {
  test("next_step: the step after a truncation resets the env", () => {
    const s = session(AutoReset.NEXT_STEP);
    const turns: number[] = [];
    for (let k = 0; k < 4; k++) {
      assert.equal(step(s), IDS.STEP_RESP);
      turns.push(s.buffer.readUInt32LE(BODY_OFFSET + TURN_AT));
    }
    assert.deepEqual(turns, [1, 2, 0, 1]); // turn 2 truncated: the next step is the reset
  });

  test("disabled: a step after a truncation is NOT_RESET", () => {
    const s = session(AutoReset.DISABLED);
    step(s);
    step(s);
    assert.equal(step(s), IDS.ERROR);
    assert.match(parseError(s.body())?.text ?? "", /episode is done; reset first/);
  });

  test("same_step: a truncation resets at once and keeps the final result", () => {
    const s = session(AutoReset.SAME_STEP);
    step(s);
    assert.equal(step(s), IDS.STEP_RESP);
    assert.equal(s.bodyLength, RESULT + 4 + 4 + RESULT); // the reset, then one final result
    assert.equal(s.buffer.readUInt32LE(BODY_OFFSET + TURN_AT), 0);
    assert.equal(s.buffer.readUInt32LE(BODY_OFFSET + RESULT + 8 + TURN_AT), LIMIT);
  });
});
