/** The reference envs (echo, pac): determinism, masks, episode ends, codec-valid results. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { ENVS, EchoEnv, PacEnv } from "../envs";
import { StepResultCodec, type StepResultInput } from "../generated/pac_env";

/** A tiny seeded policy RNG for the tests (mulberry32). */
function policyRng(seed: number): (n: number) => number {
  let a = seed >>> 0;
  return (n: number) => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) % n;
  };
}

function legalActions(result: StepResultInput): number[] {
  const legal: number[] = [];
  const mask = result.action_mask;
  for (let i = 0; i < mask.length; i++) if (mask[i] === 1) legal.push(i);
  return legal;
}

/** Play one episode with a seeded random legal policy: the encoded results and the actions. */
function playPac(
  seed: bigint,
  policySeed: number,
  limit = 1000,
): { bytes: Uint8Array[]; actions: number[] } {
  const env = new PacEnv();
  const pick = policyRng(policySeed);
  let result: StepResultInput = env.reset(seed);
  const bytes = [StepResultCodec.encode(result)];
  const actions: number[] = [];
  while (result.done === 0 && actions.length < limit) {
    const legal = legalActions(result);
    const action = legal[pick(legal.length)]!;
    actions.push(action);
    result = env.step(action);
    bytes.push(StepResultCodec.encode(result));
  }
  return { bytes, actions };
}

describe("ENVS registry", () => {
  test("has echo and pac, each with 612 observations and 92 actions (and the rich-spaces envs)", () => {
    assert.deepEqual(Object.keys(ENVS).sort(), ["echo", "frames", "heavy_tail", "lock", "mahjong", "pac", "reach"]);
    for (const name of ["echo", "pac"]) {
      assert.deepEqual((ENVS[name] as () => { spaces(): unknown })().spaces(), { obsN: 612, actN: 92 });
    }
  });
});

describe("echo env", () => {
  test("reset: zeros with a full mask; step: action, step count, reward a / 4, life", () => {
    const env = new EchoEnv();
    const reset = StepResultCodec.decode(StepResultCodec.encode(env.reset(5n)));
    assert.equal(reset.observation.every((x) => x === 0), true);
    assert.equal(reset.action_mask.every((x) => x === 1), true);
    assert.equal(reset.reward, 0);
    for (const [i, action] of [3, 91, 0].entries()) {
      const step = StepResultCodec.decode(StepResultCodec.encode(env.step(action)));
      assert.equal(step.observation[0], action);
      assert.equal(step.observation[1], i + 1);
      assert.equal(step.observation.subarray(2).every((x) => x === 0), true);
      assert.equal(step.reward, action / 4);
      assert.equal(step.life, i + 1);
      assert.equal(step.done, 0);
      assert.equal(step.action_mask.every((x) => x === 1), true);
    }
    const again = StepResultCodec.encode(env.reset());
    assert.deepEqual(again, StepResultCodec.encode(new EchoEnv().reset()));
  });

  test("is deterministic", () => {
    const run = (): string[] => {
      const env = new EchoEnv();
      const out = [Buffer.from(StepResultCodec.encode(env.reset(1n))).toString("hex")];
      for (const a of [1, 2, 3, 50, 91]) {
        out.push(Buffer.from(StepResultCodec.encode(env.step(a))).toString("hex"));
      }
      return out;
    };
    assert.deepEqual(run(), run());
  });
});

describe("pac env", () => {
  test("same seed and actions give the same bytes", () => {
    for (const seed of [0n, 1n, 42n, 2n ** 64n - 1n]) {
      const first = playPac(seed, Number(seed % 1000n));
      const env = new PacEnv();
      const replay = [StepResultCodec.encode(env.reset(seed))];
      for (const action of first.actions) replay.push(StepResultCodec.encode(env.step(action)));
      assert.deepEqual(replay, first.bytes);
    }
  });

  test("different seeds give different games", () => {
    const a = StepResultCodec.encode(new PacEnv().reset(1n));
    const b = StepResultCodec.encode(new PacEnv().reset(2n));
    assert.notDeepEqual(a, b);
  });

  test("a fresh env uses seed 0; reset() without a seed keeps the RNG running", () => {
    const fresh = new PacEnv();
    const zero = StepResultCodec.encode(new PacEnv().reset(0n));
    assert.deepEqual(StepResultCodec.encode(fresh.reset()), zero);
    const env = new PacEnv();
    const first = StepResultCodec.encode(env.reset(9n));
    const second = StepResultCodec.encode(env.reset());
    assert.notDeepEqual(second, first);
    const other = new PacEnv();
    other.reset(9n);
    assert.deepEqual(StepResultCodec.encode(other.reset()), second);
    assert.deepEqual(StepResultCodec.encode(env.reset(9n)), first);
  });

  test("random legal play: masks never empty, results valid, episodes end, values vary", () => {
    const lengths: number[] = [];
    const rewards = new Set<number>();
    const ranks = new Set<number>();
    const masks = new Set<string>();
    for (let seed = 0; seed < 60; seed++) {
      const env = new PacEnv();
      const pick = policyRng(seed * 7 + 1);
      let result = env.reset(BigInt(seed));
      let steps = 0;
      for (;;) {
        StepResultCodec.validate(result);
        StepResultCodec.decode(StepResultCodec.encode(result)); // strict: canonical floats
        const legal = legalActions(result);
        assert.ok(legal.length >= 1, "at least one legal action");
        assert.equal(result.action_mask[0], 1, "end turn is always legal");
        for (let a = 51; a < 92; a++) assert.equal(result.action_mask[a], 0, "reserved actions");
        assert.equal(Number.isInteger(result.reward * 8), true, "reward is a multiple of 1/8");
        assert.ok(result.rank >= 1 && result.rank <= 8);
        assert.ok(result.board_size <= result.level && result.level <= 9);
        assert.ok(result.actions_this_turn <= 8);
        rewards.add(result.reward);
        ranks.add(result.rank);
        masks.add(Buffer.from(result.action_mask).toString("hex"));
        if (result.done === 1) break;
        assert.ok(steps < 200, `episode of seed ${seed} did not end within 200 steps`);
        result = env.step(legal[pick(legal.length)]!);
        steps += 1;
      }
      lengths.push(steps);
      assert.throws(() => env.step(0), /reset first/);
    }
    const shortest = Math.min(...lengths);
    assert.ok(shortest >= 10, `episodes are not trivially short: ${shortest}`);
    assert.ok(rewards.size > 5, "rewards vary");
    assert.ok(ranks.size > 2, "ranks vary");
    assert.ok(masks.size > 20, "masks change with the state");
  });

  test("observations depend on the state and are exact multiples of 1/256", () => {
    const env = new PacEnv();
    const first = Float32Array.from(env.reset(3n).observation);
    const next = env.step(0).observation;
    assert.notDeepEqual(Float32Array.from(next), first);
    for (const x of next) assert.equal(Number.isInteger(x * 256), true);
  });

  test("a masked action is refused", () => {
    const env = new PacEnv();
    env.reset(0n);
    assert.throws(() => env.step(60), RangeError);
    assert.throws(() => env.step(92), RangeError);
    assert.throws(() => new PacEnv().step(0), RangeError, "step before reset");
  });
});
