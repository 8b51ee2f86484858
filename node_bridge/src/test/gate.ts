/**
 * The file gate of the gated test envs (async_pool.test.ts, shm_close_in_flight_env.ts): a
 * step that must stay in flight waits until the file named by `$TRANSPORT_TEST_GATE` exists,
 * so a test holds envs in a pool for as long as it needs, without guessing at timing.
 */

import { existsSync } from "node:fs";

export const GATE_ENV = "TRANSPORT_TEST_GATE";
const SLEEPER = new Int32Array(new SharedArrayBuffer(4));

/** The gate's path (from the environment). */
export function gatePath(): string {
  return process.env[GATE_ENV] ?? "";
}

/** Block this thread until the gate file exists (2 ms naps); an error after `limitMs`. */
export function waitForGate(limitMs = 20_000): void {
  const gate = gatePath();
  const deadline = Date.now() + limitMs;
  while (!existsSync(gate)) {
    if (Date.now() > deadline) throw new Error(`the gate ${gate} never opened`);
    Atomics.wait(SLEEPER, 0, 0, 2);
  }
}
