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
}

/** Makes a fresh env (a server calls it once per env per connection). */
export type EnvFactory<R = StepResultInput> = () => Env<R>;
