/**
 * A Node actor of examples/actor_learner (seed 002 in small): runs the Tetris example env, acts
 * with the latest policy on the board (a 214 -> H -> 40 MLP published by the PyTorch learner),
 * pushes one `experience.Transition` per placement into its ring, beats in the run control, and
 * stops cleanly when the stop flag rises.
 *
 *   node dist/channels/tetris_actor.js RUN ACTOR SEED
 *
 * Channels of run RUN: control `RUN`, board `RUN-policy`, ring `RUN-actor<ACTOR>`.
 */

import { TetrisEnv, type TetrisResult } from "../examples/tetris";
import { experience } from "../generated";
import { PolicyBoard } from "./board";
import { RunControl } from "./control";
import { Ring } from "./ring";
import { ChannelClosedError, ChannelTimeoutError, PeerDiedError } from "./segment";

/** A small seeded RNG (mulberry32): the actor's action sampling. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The policy: torch `nn.Sequential(Linear(214, H), ReLU, Linear(H, 40))` weights ("0.weight",
 * "0.bias", "2.weight", "2.bias"; row-major (out, in)). Samples a legal action. */
class Policy {
  weights: Record<string, Float32Array> | null = null;
  hidden = new Float32Array(0);
  logits = new Float32Array(40);

  act(obs: Float32Array, mask: Uint8Array, random: () => number): number {
    const w = this.weights;
    if (w === null) return this.uniform(mask, random);
    const w1 = w["0.weight"]!;
    const b1 = w["0.bias"]!;
    const w2 = w["2.weight"]!;
    const b2 = w["2.bias"]!;
    const hSize = b1.length;
    const inSize = obs.length;
    if (this.hidden.length !== hSize) this.hidden = new Float32Array(hSize);
    for (let j = 0; j < hSize; j++) {
      let s = b1[j]!;
      const row = j * inSize;
      for (let i = 0; i < inSize; i++) s += w1[row + i]! * obs[i]!;
      this.hidden[j] = s > 0 ? s : 0;
    }
    let max = -Infinity;
    for (let k = 0; k < 40; k++) {
      if (!mask[k]) continue;
      let s = b2[k]!;
      const row = k * hSize;
      for (let j = 0; j < hSize; j++) s += w2[row + j]! * this.hidden[j]!;
      this.logits[k] = s;
      if (s > max) max = s;
    }
    let total = 0;
    for (let k = 0; k < 40; k++) {
      this.logits[k] = mask[k] ? Math.exp(this.logits[k]! - max) : 0;
      total += this.logits[k]!;
    }
    let u = random() * total;
    for (let k = 0; k < 40; k++) {
      u -= this.logits[k]!;
      if (mask[k] && u <= 0) return k;
    }
    return this.uniform(mask, random);
  }

  uniform(mask: Uint8Array, random: () => number): number {
    const legal: number[] = [];
    for (let k = 0; k < mask.length; k++) if (mask[k]) legal.push(k);
    return legal[Math.floor(random() * legal.length)] ?? 0;
  }
}

function main(argv: readonly string[]): number {
  const [run, actorText, seedText] = argv;
  if (run === undefined) throw new Error("usage: tetris_actor RUN ACTOR SEED");
  const actor = Number(actorText ?? 0);
  const random = rng(Number(seedText ?? 0) * 7919 + actor);
  const control = RunControl.open(run);
  const me = control.join(`node-actor-${actor}`, 1);
  const board = PolicyBoard.open(`${run}-policy`);
  const ring = Ring.open(`${run}-actor${actor}`, experience.SCHEMA, "Transition");
  const producer = ring.producer();
  const env = new TetrisEnv({ maxSteps: 500 });
  const policy = new Policy();
  let seen = 0n;
  let weights: Record<string, Float32Array> | null = null;
  const obs = new Float32Array(214);
  const mask = new Uint8Array(40);
  const record = {
    obs,
    next_obs: new Float32Array(214),
    mask,
    next_mask: new Uint8Array(40),
    action: 0,
    reward: 0,
    done: 0,
    truncated: 0,
    actor,
    policy_version: 0,
    step: 0n,
  };
  let result: TetrisResult = env.reset(BigInt(Number(seedText ?? 0) * 1000 + actor));
  let steps = 0n;
  try {
    while (!control.stopped) {
      if (board.version > seen) {
        const r = board.read(weights as never);
        weights = r.arrays as Record<string, Float32Array>;
        policy.weights = weights;
        seen = r.version;
      }
      obs.set(result.observation);
      mask.set(result.action_mask);
      const action = policy.act(obs, mask, random);
      result = env.step(action);
      record.next_obs.set(result.observation);
      record.next_mask.set(result.action_mask);
      record.action = action;
      record.reward = result.reward;
      record.done = result.done;
      record.truncated = result.truncated;
      record.policy_version = Number(seen);
      record.step = steps++;
      let reservation = null;
      while (reservation === null && !control.stopped) {
        try {
          reservation = producer.reserve(1, 200);
        } catch (error) {
          if (!(error instanceof ChannelTimeoutError)) throw error;
        }
      }
      if (reservation === null) break;
      experience.TransitionCodec.writeInto(record, ring.segment.bytes, reservation.offset);
      producer.commit();
      control.advance();
      if ((steps & 63n) === 0n) me.beat();
      if (result.done) result = env.reset();
    }
  } catch (error) {
    if (error instanceof ChannelClosedError || error instanceof PeerDiedError) {
      process.stderr.write(`actor ${actor}: ${String(error)}\n`);
    } else {
      me.fail(2);
      throw error;
    }
  }
  producer.close();
  me.leave();
  ring.close();
  board.close();
  control.close();
  return 0;
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
