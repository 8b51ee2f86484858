/**
 * The echo env: a deterministic StepResult derived from the action, at (almost) no cost.
 *
 * Step with action a: observation[0] = a, observation[1] = the step count, reward = a / 4,
 * action_mask all ones, done = 0, life = the step count mod 65536; every other field stays 0.
 * Reset: every field 0 except the action mask (all ones). It produces the same bytes as the
 * Python echo env (transport/envs/echo.py) and returns one preallocated result object.
 */

import type { Env, Spaces } from "../runtime/env";
import type { StepResultInput } from "../generated/pac_env";

const OBS_N = 612;
const ACT_N = 92;

/** The result object an EchoEnv returns: the same object, overwritten by every call. */
export interface EchoResult extends StepResultInput {
  observation: Float32Array;
  action_mask: Uint8Array;
}

/** A fresh echo result: zeros, every action legal (pac_env's StepResult). */
export function echoResult(): EchoResult {
  return {
    observation: new Float32Array(OBS_N),
    action_mask: new Uint8Array(ACT_N).fill(1),
    reward: 0,
    done: 0,
    rank: 0,
    life: 0,
    money: 0,
    stage: 0,
    board_size: 0,
    level: 0,
    synergy_count: 0,
    items_held: 0,
    actions_this_turn: 0,
  };
}

export class EchoEnv implements Env<EchoResult> {
  steps = 0;
  readonly #result: EchoResult = echoResult();

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  reset(_seed?: bigint): EchoResult {
    this.steps = 0;
    const out = this.#result;
    out.observation.fill(0);
    out.action_mask.fill(1);
    out.reward = 0;
    out.life = 0;
    return out;
  }

  step(action: number): EchoResult {
    this.steps += 1;
    const out = this.#result;
    out.observation[0] = action;
    out.observation[1] = this.steps;
    out.reward = action / 4;
    out.life = this.steps & 0xffff;
    return out;
  }
}
