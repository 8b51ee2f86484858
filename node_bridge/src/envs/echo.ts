/**
 * The echo env: a deterministic StepResult derived from the action, at (almost) no cost.
 *
 * Step with action a: observation[0] = a, observation[1] = the step count, reward = a / 4,
 * action_mask all ones, done = 0, life = the step count mod 65536; every other field stays 0.
 * Reset: every field 0 except the action mask (all ones). It produces the same bytes as the
 * Python echo env (transport/envs/echo.py) and returns one preallocated result object.
 */

import type { Action, Env, ResultRow, Spaces } from "../runtime/env";
import { SCHEMA, StepResultCodec, type StepResultInput } from "../generated/pac_env";

const OBS_N = 612;
const ACT_N = 92;

/** Byte offsets of the StepResult fields the echo env changes (the generated IR's). */
function offsetOf(name: string): number {
  const field = SCHEMA.ir.structs["StepResult"]?.fields.find((f) => f.name === name);
  if (field === undefined) throw new Error(`pac_env's StepResult has no field ${name}`);
  return field.offset;
}
const OBSERVATION_AT = offsetOf("observation");
const REWARD_AT = offsetOf("reward");
const LIFE_AT = offsetOf("life");
/** The encoded reset result (zeros, every action legal): the bytes every echo record starts from. */
const RESET_RECORD: Uint8Array = StepResultCodec.encode(echoResultFields());

function echoResultFields(): StepResultInput {
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

/** The echo record of step `steps` with action `action` at `out` (every byte: the reset record, then the four fields). */
function writeEchoRecord(out: ResultRow, action: number, steps: number): void {
  if (out.size !== RESET_RECORD.byteLength) {
    throw new TypeError(`the echo env writes pac_env's StepResult (${RESET_RECORD.byteLength} bytes), not a ${out.size}-byte record`);
  }
  const at = out.at;
  out.bytes.set(RESET_RECORD, at);
  if (steps === 0) return;
  const view = out.view;
  view.setFloat32(at + OBSERVATION_AT, action, true);
  view.setFloat32(at + OBSERVATION_AT + 4, steps, true);
  view.setFloat32(at + REWARD_AT, action / 4, true);
  view.setUint16(at + LIFE_AT, steps & 0xffff, true);
}

/** The result object an EchoEnv returns: the same object, overwritten by every call. */
export interface EchoResult extends StepResultInput {
  observation: Float32Array;
  action_mask: Uint8Array;
}

/** A fresh echo result: zeros, every action legal (pac_env's StepResult). */
export function echoResult(): EchoResult {
  return echoResultFields() as EchoResult;
}

/**
 * `step` / `reset` return the one result object; `stepInto` / `resetInto` / `observeInto`
 * (what a server calls) write the record in place instead: the reset record copied, then the
 * four fields a step changes (the same bytes, no object, no codec).
 */
export class EchoEnv implements Env<EchoResult> {
  steps = 0;
  /** The last step's action (observeInto). */
  #action = 0;
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
    this.#action = action;
    const out = this.#result;
    out.observation[0] = action;
    out.observation[1] = this.steps;
    out.reward = action / 4;
    out.life = this.steps & 0xffff;
    return out;
  }

  resetInto(_seed: bigint | null, out: ResultRow): void {
    this.steps = 0;
    writeEchoRecord(out, 0, 0);
  }

  stepInto(action: Action, out: ResultRow): void {
    this.steps += 1;
    this.#action = action as number;
    writeEchoRecord(out, this.#action, this.steps);
  }

  observeInto(out: ResultRow): void {
    writeEchoRecord(out, this.#action, this.steps);
  }
}
