/**
 * A vector env over the image_columns schema for shm_columns_fastpath.test.ts (the Node twin of
 * tests/shm_columns_vector_env.py): four Atari-sized envs in typed arrays, each frame a function
 * of its env's last action and step count, episodes of 3 to 5 steps, action 17 masked out.
 * `VectorImages` declares `writesColumns` (over a column region it writes the region's columns);
 * `VectorImagesRows` is the same env without it (the server copies rows). Each env's info map
 * says where the observation column it was last handed lies (`observation_offset`: its byte
 * offset in its buffer; the region's column start when adopted, 0 for a private column).
 */

import type { Spaces, VectorEnv, VectorResults } from "../runtime/env";

const OBS = 3 * 84 * 84;
const ACT_N = 18;
const MASKED = 17;

export class VectorImagesRows implements VectorEnv {
  readonly numEnvs: number;
  readonly steps: Int32Array;
  readonly length: Int32Array;
  /** Byte offset of the observation column of the last call. */
  observationOffset = -1;
  /** The "noop" reward of a masked action. */
  readonly maskedActionPenalty = -2;

  constructor(numEnvs: number) {
    this.numEnvs = numEnvs;
    this.steps = new Int32Array(numEnvs);
    this.length = Int32Array.from({ length: numEnvs }, (_, i) => 3 + (i % 3));
  }

  spaces(): Spaces {
    return { obsN: OBS, actN: ACT_N };
  }

  #columns(out: VectorResults): { obs: Uint8Array; mask: Uint8Array; reward: Float32Array; terminated: Uint8Array; truncated: Uint8Array } {
    const c = out.columns;
    const obs = c["observation"] as Uint8Array;
    this.observationOffset = obs.byteOffset;
    return {
      obs,
      mask: c["action_mask"] as Uint8Array,
      reward: c["reward"] as Float32Array,
      terminated: c["terminated"] as Uint8Array,
      truncated: c["truncated"] as Uint8Array,
    };
  }

  resetEnvs(ids: Int32Array, _seeds: ReadonlyArray<bigint | null>, out: VectorResults): void {
    const { obs, mask, reward, terminated, truncated } = this.#columns(out);
    for (const i of ids) {
      this.steps[i] = 0;
      obs.fill(0, i * OBS, (i + 1) * OBS);
      mask.fill(1, i * ACT_N, (i + 1) * ACT_N);
      mask[i * ACT_N + MASKED] = 0;
      reward[i] = 0;
      terminated[i] = 0;
      truncated[i] = 0;
    }
  }

  stepEnvs(actions: Float64Array, ids: Int32Array | null, out: VectorResults): void {
    const { obs, reward, terminated } = this.#columns(out);
    const count = ids === null ? this.numEnvs : ids.length;
    for (let k = 0; k < count; k++) {
      const i = ids === null ? k : (ids[k] as number);
      const a = actions[i] as number;
      const step = (this.steps[i] as number) + 1;
      this.steps[i] = step;
      obs.fill((a * 7 + step) % 251, i * OBS, (i + 1) * OBS);
      reward[i] = a * 0.5;
      terminated[i] = step >= (this.length[i] as number) ? 1 : 0;
    }
  }

  infos(): Array<Record<string, unknown>> {
    return Array.from(this.steps, (steps) => ({ steps, observation_offset: this.observationOffset }));
  }
}

export class VectorImages extends VectorImagesRows {
  readonly writesColumns = true;
}
