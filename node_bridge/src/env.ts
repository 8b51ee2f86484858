/**
 * The env interface a Node server hosts: the same small shape as the Python side
 * (transport/server.py `Env`). Results use the generated `pac_env` StepResult types, so the
 * server encodes them with the generated codec.
 */

import type { StepResultInput } from "./generated/pac_env";

/** Observation length and number of discrete actions. */
export interface Spaces {
  readonly obsN: number;
  readonly actN: number;
}

/**
 * One environment. `reset` and `step` return the step result; an env may return the same
 * object every time (mutated in place): the server encodes it before calling the env again.
 */
export interface Env<R = StepResultInput> {
  spaces(): Spaces;
  reset(seed?: bigint): R;
  step(action: number): R;
  /**
   * Optional: one action per seat of a multi-player game (seed 000's self-play), one result per
   * seat. A 1-env server whose env has it answers STEP_MULTI_REQ (8 seats) with one call; the
   * server checks each action's range and that the game was reset and is not over.
   */
  stepBatch?(actions: Int32Array): ArrayLike<R>;
}

/** Makes a fresh env (a server calls it once per env per connection). */
export type EnvFactory<R = StepResultInput> = () => Env<R>;
