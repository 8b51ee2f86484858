/**
 * Reference envs for the richer spaces (issue 12 item 7), the same as Python's
 * (transport/envs/rich_spaces.py: same seeds, same bytes):
 *
 * - `ReachEnv` (schema dictbox): a Dict observation (`grid` f32[2,5,5], `vec` f32[4]) and a Box
 *   action `move` f32[2] in -1..1: move by (dx, dy) in a 5 x 5 square towards a goal cell;
 *   reward -0.1 x distance per step, 1.0 and terminated within 0.5 of the goal, truncated after
 *   50 steps.
 * - `LockEnv` (schema multidiscrete): a MultiDiscrete action `dials` u8[3] (3, 4, 5 positions);
 *   reward 1.0 and terminated when all three dials are right, else -0.05; truncated after 20.
 *
 * Array actions arrive as Float64Arrays (an owned copy per step). Both envs draw from MINSTD
 * (state * 48271 mod 2^31 - 1: exact in doubles); a seed s sets the state to s mod (2^31 - 2) + 1.
 */

import type { StepResultInput as ReachResult } from "../generated/dictbox";
import type { StepResultInput as LockResult } from "../generated/multidiscrete";
import type { Env, Spaces } from "../runtime/env";

const MODULUS = 2147483647;
const SIDE = 5;
const REACH_STEPS = 50;
const LOCK_NVEC = [3, 4, 5] as const;
const LOCK_STEPS = 20;

/** The Lehmer generator both languages share. */
class Minstd {
  state = 1;

  seed(seed?: bigint): void {
    if (seed !== undefined) this.state = Number(seed % BigInt(MODULUS - 1)) + 1;
  }

  /** A draw in 0..n-1. */
  next(n: number): number {
    this.state = (this.state * 48271) % MODULUS;
    return this.state % n;
  }
}

/** The grid cell of a coordinate (round half up, as in Python). */
function cell(v: number): number {
  return Math.min(SIDE - 1, Math.max(0, Math.floor(v + 0.5)));
}

/** One action's elements (a Float64Array for an array action; a number would be one element). */
function elements(action: number | ArrayLike<number>): ArrayLike<number> {
  return typeof action === "number" ? [action] : action;
}

/** Reach a goal cell with continuous moves (schema dictbox). */
export class ReachEnv implements Env<ReachResult> {
  readonly #rng = new Minstd();
  #x = 0;
  #y = 0;
  #gx = 0;
  #gy = 0;
  #steps = 0;

  spaces(): Spaces {
    return { obsN: 2 * SIDE * SIDE + 4, actN: 2 }; // actN: the action's element count
  }

  reset(seed?: bigint): ReachResult {
    this.#rng.seed(seed);
    this.#x = this.#rng.next(SIDE);
    this.#y = this.#rng.next(SIDE);
    this.#gx = this.#rng.next(SIDE);
    this.#gy = this.#rng.next(SIDE);
    if (this.#gx === this.#x && this.#gy === this.#y) this.#gx = (this.#gx + 2) % SIDE;
    this.#steps = 0;
    return this.#result(0, false, false);
  }

  step(action: number | Float64Array): ReachResult {
    const move = elements(action);
    this.#x = Math.min(SIDE - 1, Math.max(0, this.#x + (move[0] as number)));
    this.#y = Math.min(SIDE - 1, Math.max(0, this.#y + (move[1] as number)));
    this.#steps += 1;
    const distance = this.#distance();
    const terminated = distance < 0.5;
    const reward = terminated ? 1.0 : -0.1 * distance;
    return this.#result(reward, terminated, !terminated && this.#steps >= REACH_STEPS);
  }

  #distance(): number {
    const dx = this.#x - this.#gx;
    const dy = this.#y - this.#gy;
    return Math.sqrt(dx * dx + dy * dy);
  }

  #result(reward: number, terminated: boolean, truncated: boolean): ReachResult {
    const grid = new Float32Array(2 * SIDE * SIDE);
    grid[cell(this.#y) * SIDE + cell(this.#x)] = 1;
    grid[SIDE * SIDE + this.#gy * SIDE + this.#gx] = 1;
    const scale = SIDE - 1;
    const vec = Float32Array.of(this.#x / scale, this.#y / scale, this.#gx / scale, this.#gy / scale);
    return { grid, vec, reward, terminated, truncated, distance: this.#distance() };
  }
}

/** Set three dials to a hidden combination (schema multidiscrete). */
export class LockEnv implements Env<LockResult> {
  readonly #rng = new Minstd();
  #target: number[] = [0, 0, 0];
  #dials: number[] = [0, 0, 0];
  #steps = 0;

  spaces(): Spaces {
    return { obsN: 2 * LOCK_NVEC.length, actN: LOCK_NVEC.length }; // actN: the action's element count
  }

  reset(seed?: bigint): LockResult {
    this.#rng.seed(seed);
    this.#target = LOCK_NVEC.map((n) => this.#rng.next(n));
    this.#dials = [0, 0, 0];
    this.#steps = 0;
    return this.#result(0, false);
  }

  step(action: number | Float64Array): LockResult {
    this.#dials = Array.from(elements(action));
    this.#steps += 1;
    const solved = this.#dials.every((d, i) => d === this.#target[i]);
    return this.#result(solved ? 1.0 : -0.05, solved);
  }

  #result(reward: number, terminated: boolean): LockResult {
    const right = this.#dials.map((d, i) => (d === this.#target[i] ? 1 : 0));
    const scaled = this.#dials.map((d, i) => d / ((LOCK_NVEC[i] as number) - 1));
    return {
      observation: Float32Array.from([...scaled, ...right]),
      reward,
      terminated,
      truncated: !terminated && this.#steps >= LOCK_STEPS,
      matched: right.reduce<number>((a, b) => a + b, 0),
    };
  }
}
