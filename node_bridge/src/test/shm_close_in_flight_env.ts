/**
 * The gated echo env of the close-with-envs-in-flight tests (shm_close_in_flight.test.ts and
 * tests/test_shm_close_in_flight.py), loaded by a Node server's worker threads
 * (`--env dist/test/shm_close_in_flight_env.js:makeGated`). Action SLOW first creates a marker
 * file `$TRANSPORT_TEST_GATE.in-*` (the test sees that the server handed the step to its pool),
 * then waits (up to 20 s) until the file `$TRANSPORT_TEST_GATE` exists. As the Python twin,
 * tests/shm_close_in_flight_env.py.
 */

import { writeFileSync } from "node:fs";
import { threadId } from "node:worker_threads";

import { EchoEnv, type EchoResult } from "../envs/echo";
import { gatePath, waitForGate } from "./gate";

export { GATE_ENV } from "./gate";
export const SLOW = 50;
let marks = 0;

class GatedEnv extends EchoEnv {
  override step(action: number): EchoResult {
    if (action === SLOW) {
      writeFileSync(`${gatePath()}.in-${process.pid}-${threadId}-${marks++}`, "");
      waitForGate();
    }
    return super.step(action);
  }
}

export function makeGated(): GatedEnv {
  return new GatedEnv();
}
