/** The mahjong env (Node twin of transport/envs/mahjong.py): deals, wins, zero-sum scores. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { A_PASS, A_WIN, MahjongEnv, N_KINDS, isWinning } from "../envs/mahjong";
import { AgentStepCodec } from "../generated/mahjong_env";

const WINNING = [0, 1, 2, 3, 4, 5, 6, 7, 8, 27, 27, 27, 33, 33];

function counts(kinds: number[]): Int32Array {
  const out = new Int32Array(N_KINDS);
  for (const kind of kinds) out[kind]! += 1;
  return out;
}

function legal(mask: ArrayLike<boolean>): number[] {
  const out: number[] = [];
  for (let i = 0; i < mask.length; i++) if (mask[i]) out.push(i);
  return out;
}

describe("mahjong env", () => {
  test("four sets and a pair win; a broken hand does not", () => {
    assert.ok(isWinning(counts(WINNING)));
    assert.ok(!isWinning(counts([...WINNING.slice(0, 13), 32])));
  });

  test("the same seed deals the same game; every result encodes", () => {
    const a = new MahjongEnv();
    const b = new MahjongEnv();
    assert.deepEqual(AgentStepCodec.encode(a.reset(7n)), AgentStepCodec.encode(b.reset(7n)));
    assert.notDeepEqual(AgentStepCodec.encode(a.reset(8n)), AgentStepCodec.encode(b.reset(7n)));
  });

  test("a whole game of random legal play ends; scores stay zero-sum", () => {
    const env = new MahjongEnv();
    let wins = 0;
    for (let game = 0; game < 60; game++) {
      let result = env.reset(BigInt(game));
      let steps = 0;
      while (!result.terminated) {
        const actions = legal(result.action_mask);
        assert.ok(actions.length > 0);
        const action = result.action_mask[A_WIN] ? A_WIN : actions[(game * 7 + steps) % actions.length]!;
        result = env.step(action);
        steps += 1;
        assert.ok(steps < 84 * 4);
      }
      if (result.reward > 0) {
        wins += 1;
        assert.equal(result.reward, 3);
        assert.ok(legal(result.action_mask).length === 0);
      }
      assert.equal(env.scores.reduce((x, y) => x + y, 0), 0);
    }
    assert.ok(wins > 0);
    assert.throws(() => env.step(A_PASS), /reset first/);
  });
});
