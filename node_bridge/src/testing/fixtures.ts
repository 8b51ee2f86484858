/** Shared fixtures for the node:test suites. */

import { pac_env } from "../generated";

/** A valid StepResult with distinct values in every field. */
export function stepResult(): pac_env.StepResultInput {
  return {
    observation: Array.from({ length: 612 }, (_, i) => i / 8),
    action_mask: Array.from({ length: 92 }, (_, i) => i % 2),
    reward: 1.5,
    done: 1,
    rank: 2,
    life: 300,
    money: 65535,
    stage: 7,
    board_size: 9,
    level: 3,
    synergy_count: 4,
    items_held: 5,
    actions_this_turn: 6,
  };
}

/** An all-zero pac StepResult (mask all legal) that test envs mutate in place. */
// eslint-disable-next-line @typescript-eslint/explicit-function-return-type
export function blankPacResult() {
  return {
    observation: new Float32Array(612),
    action_mask: new Uint8Array(92).fill(1),
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

/** Run `work` and return the CodecError it throws as { code, field }. */
export function codecErrorOf(work: () => unknown): { code: string; field: string } {
  try {
    work();
  } catch (error) {
    const { code, field } = error as { code: string; field: string };
    return { code, field };
  }
  throw new Error("expected a CodecError, nothing was thrown");
}

export function hex(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString("hex");
}
