/**
 * A pac-shaped env that throws on one action, for tests that need an env error in a server
 * process (`require("dist/testing/faulty.js").makeFaulty`).
 */

import type * as pac_env from "../generated/pac_env";
import type { Env, Spaces } from "../runtime/env";
import { blankPacResult } from "./fixtures";

/** The action that makes the env throw. */
export const POISON = 7;

/** Throws on POISON (the shm server answers ENV_ERROR and resets it). */
class FaultyEnv implements Env<pac_env.StepResultInput> {
  readonly #out = blankPacResult();

  spaces(): Spaces {
    return { obsN: 612, actN: 92 };
  }

  reset(): pac_env.StepResultInput {
    return this.#out;
  }

  step(action: number): pac_env.StepResultInput {
    if (action === POISON) throw new TypeError("poisoned action");
    this.#out.observation[0] = action;
    return this.#out;
  }
}

export function makeFaulty(): Env<pac_env.StepResultInput> {
  return new FaultyEnv();
}
