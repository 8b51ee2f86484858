/**
 * The frames env (schema `frames`): a small engine with decision-boundary runs (seed 004).
 *
 * Each request runs the engine until its next decision: a run of 1 + rand(40) frames (always
 * fewer than the schema's max_frames = 64), counting events on the way: drops (one per 4 frames),
 * clears (one when rand(4) == 0), spawns (one per run), bonuses (rand(2)). The reward is the
 * clears; 24 decisions end the episode. Fault modes for the no-progress watchdog: action 2 jams
 * the engine (every later request runs 0 frames, until a reset), action 3 spins it (the run uses
 * all max_frames frames without a decision). The same bytes as Python (transport/envs/frames.py).
 */

import type { Env, Spaces } from "../runtime/env";
import type { StepResultInput } from "../generated/frames";

const MODULUS = 2147483647;
/** The schema's [env] max_frames: a run that reaches it found no decision. */
const MAX_FRAMES = 64;
const DECISIONS = 24;
const JAM = 2;
const SPIN = 3;

/** MINSTD, as rich_spaces.ts and Python's `Minstd` (seed s: state s mod (2^31 - 2) + 1). */
class Minstd {
  state = 1;

  seed(seed?: bigint | null): void {
    if (seed !== undefined && seed !== null) this.state = Number(seed % BigInt(MODULUS - 1)) + 1;
  }

  next(n: number): number {
    this.state = (this.state * 48271) % MODULUS;
    return this.state % n;
  }
}

export class FramesEnv implements Env<StepResultInput> {
  readonly #rng = new Minstd();
  #decisions = 0;
  #total = 0;
  #jammed = false;

  spaces(): Spaces {
    return { obsN: 8, actN: 4 };
  }

  reset(seed?: bigint | null): StepResultInput {
    this.#rng.seed(seed);
    this.#decisions = 0;
    this.#total = 0;
    this.#jammed = false;
    return this.#result(0, [0, 0, 0, 0], 0);
  }

  step(action: number): StepResultInput {
    if (action === JAM) this.#jammed = true;
    if (this.#jammed) return this.#result(0, [0, 0, 0, 0], 0);
    let frames: number;
    let events: number[];
    if (action === SPIN) {
      frames = MAX_FRAMES;
      events = [frames >> 2, 0, 0, 0];
    } else {
      frames = 1 + this.#rng.next(40);
      const clears = this.#rng.next(4) === 0 ? 1 : 0;
      events = [frames >> 2, clears, 1, this.#rng.next(2)];
      this.#decisions += 1;
    }
    this.#total += frames;
    return this.#result(frames, events, events[1] as number);
  }

  #result(frames: number, events: number[], reward: number): StepResultInput {
    const obs = new Float32Array(8);
    obs[0] = this.#decisions / 32;
    obs[1] = this.#total / 1024;
    obs[2] = frames / 64;
    for (let k = 0; k < 4; k++) obs[3 + k] = (events[k] as number) / 16;
    obs[7] = this.#jammed ? 1 : 0;
    return {
      observation: obs,
      reward,
      terminated: this.#decisions >= DECISIONS,
      truncated: false,
      frames,
      events,
      decisions: this.#decisions,
      action_mask: [1, 1, 1, 1], // every action is legal
    };
  }
}
