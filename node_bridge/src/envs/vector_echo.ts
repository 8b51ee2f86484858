/**
 * The echo env as a vector env: N echo envs in one object that steps all of them in one call,
 * writing the pac_env result columns (runtime/vector.ts). Env i's results are byte for byte
 * those of an `EchoEnv` (envs/echo.ts): step with action a writes observation[0] = a,
 * observation[1] = the step count, reward = a / 4, life = the step count mod 65536, the action
 * mask all ones; reset zeroes every field but the mask.
 *
 * `EpisodicVectorEchoEnv` (tests, examples) adds what the echo env lacks to exercise auto-reset,
 * seeds and masks: env i's episode ends (done = 1) after 2 + (its resets mod 3) steps, its reset
 * writes the seed it got into observation[2] (the seed mod 1000003, -1 when unseeded) and its
 * reset count into observation[3], and action 91 is masked out. `EpisodicEchoEnv` is the same
 * env as an ordinary one-env object: the reference a vector env's trajectories must equal.
 *
 *   transport-serve unix:///tmp/v.sock --lang node --num-envs 256 \
 *       --env node_bridge/dist/envs/vector_echo.js:VectorEchoEnv
 */

import { SCHEMA as PAC_ENV_SCHEMA, type StepResultInput } from "../generated/pac_env";
import type { Env, Spaces, VectorEnv, VectorResults } from "../runtime/env";
import { echoResult } from "./echo";

const OBS_N = 612;
const ACT_N = 92;
/** The action the episodic envs mask out. */
export const MASKED_ACTION = 91;
const SEED_MOD = 1_000_003n;

/** The pac_env columns an echo env writes. */
interface EchoColumns {
  readonly observation: Float32Array;
  readonly action_mask: Uint8Array;
  readonly reward: Float32Array;
  readonly done: Uint8Array;
  readonly life: Uint16Array;
}

function echoColumns(out: VectorResults): EchoColumns {
  const c = out.columns;
  const observation = c["observation"];
  const mask = c["action_mask"];
  const reward = c["reward"];
  const done = c["done"];
  const life = c["life"];
  if (
    !(observation instanceof Float32Array) ||
    observation.length !== out.numEnvs * OBS_N ||
    !(mask instanceof Uint8Array) ||
    mask.length !== out.numEnvs * ACT_N ||
    !(reward instanceof Float32Array) ||
    !(done instanceof Uint8Array) ||
    !(life instanceof Uint16Array)
  ) {
    throw new TypeError("the echo env writes pac_env results (observation f32[612], action_mask u8[92], reward, done, life)");
  }
  return { observation, action_mask: mask, reward, done, life };
}

/** Episode length of an episodic echo env after `resets` resets. */
function episodeLength(resets: number): number {
  return 2 + (resets % 3);
}

/** observation[2] of an episodic reset: the seed mod 1000003, -1 when unseeded. */
function seedMark(seed: bigint | null): number {
  return seed === null ? -1 : Number(seed % SEED_MOD);
}

/** N echo envs in one object. */
/** The schema every env of this module follows (`--env vector_echo.js:...` serves it as it is). */
export const SCHEMA = PAC_ENV_SCHEMA;

export class VectorEchoEnv implements VectorEnv {
  readonly numEnvs: number;
  /** It looks the columns up in every call: over an shm column region it writes the region's. */
  readonly writesColumns = true;
  /** Env i's step count. */
  readonly steps: Uint32Array;
  /** Env i's resets (the episodic variant's episode length and observation[3]). */
  readonly resets: Uint32Array;
  readonly #episodic: boolean;

  constructor(numEnvs: number, options: { episodic?: boolean } = {}) {
    if (!Number.isInteger(numEnvs) || numEnvs < 1) throw new TypeError(`VectorEchoEnv needs numEnvs >= 1, not ${String(numEnvs)}`);
    this.numEnvs = numEnvs;
    this.steps = new Uint32Array(numEnvs);
    this.resets = new Uint32Array(numEnvs);
    this.#episodic = options.episodic ?? false;
  }

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  resetEnvs(ids: Int32Array, seeds: ReadonlyArray<bigint | null>, out: VectorResults): void {
    const c = echoColumns(out);
    const episodic = this.#episodic;
    const all = ids.length === this.numEnvs;
    if (all) {
      c.observation.fill(0);
      c.action_mask.fill(1);
      c.reward.fill(0);
      c.done.fill(0);
      c.life.fill(0);
      this.steps.fill(0);
    }
    for (let k = 0; k < ids.length; k++) {
      const i = ids[k] as number;
      if (!all) {
        c.observation.fill(0, i * OBS_N, (i + 1) * OBS_N);
        c.action_mask.fill(1, i * ACT_N, (i + 1) * ACT_N);
        c.reward[i] = 0;
        c.done[i] = 0;
        c.life[i] = 0;
        this.steps[i] = 0;
      }
      if (episodic) {
        this.resets[i] = (this.resets[i] as number) + 1;
        c.observation[i * OBS_N + 2] = seedMark(seeds[k] ?? null);
        c.observation[i * OBS_N + 3] = this.resets[i] as number;
        c.action_mask[i * ACT_N + MASKED_ACTION] = 0;
      }
    }
  }

  stepEnvs(actions: Float64Array, ids: Int32Array | null, out: VectorResults): void {
    const { observation, reward, life, done } = echoColumns(out);
    const steps = this.steps;
    const episodic = this.#episodic;
    const count = ids === null ? this.numEnvs : ids.length;
    for (let k = 0; k < count; k++) {
      const i = ids === null ? k : (ids[k] as number);
      const step = (steps[i] as number) + 1;
      steps[i] = step;
      const a = actions[i] as number;
      observation[i * OBS_N] = a;
      observation[i * OBS_N + 1] = step;
      reward[i] = a / 4;
      life[i] = step & 0xffff;
      if (episodic) done[i] = step >= episodeLength((this.resets[i] as number) - 1) ? 1 : 0;
    }
  }

  infos(): Array<Record<string, unknown>> {
    return Array.from(this.steps, (steps) => ({ steps }));
  }
}

/** `VectorEchoEnv` with episodes, seeds and a mask (the header says how). */
export class EpisodicVectorEchoEnv extends VectorEchoEnv {
  constructor(numEnvs: number) {
    super(numEnvs, { episodic: true });
  }
}

/** One episodic echo env: env i of an `EpisodicVectorEchoEnv` as an ordinary env object. */
export class EpisodicEchoEnv implements Env<StepResultInput> {
  steps = 0;
  resets = 0;
  readonly #result = echoResult();

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  reset(seed?: bigint): StepResultInput {
    const out = this.#result;
    this.steps = 0;
    this.resets += 1;
    out.observation.fill(0);
    out.observation[2] = seedMark(seed ?? null);
    out.observation[3] = this.resets;
    out.action_mask.fill(1);
    out.action_mask[MASKED_ACTION] = 0;
    out.reward = 0;
    out.done = 0;
    out.life = 0;
    return out;
  }

  step(action: number): StepResultInput {
    const out = this.#result;
    this.steps += 1;
    out.observation[0] = action;
    out.observation[1] = this.steps;
    out.reward = action / 4;
    out.life = this.steps & 0xffff;
    out.done = this.steps >= episodeLength(this.resets - 1) ? 1 : 0;
    return out;
  }

  info(): Record<string, unknown> {
    return { steps: this.steps };
  }
}
