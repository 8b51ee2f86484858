/**
 * The staggered echo env of tests/test_shm_async_wakes.py and shm_async_wakes.test.ts (the Node
 * twin of the Python test's StaggeredEnv): echo's bytes, with a step that sleeps `action` x
 * STEP_UNIT_MS (off the CPU: Atomics.wait, which a worker thread may call), so envs sent
 * together finish one after the other and a RECV of them sees one publish per env.
 */

import type { Action, ResultRow } from "../runtime/env";
import { EchoEnv, type EchoResult } from "../envs/echo";

export const STEP_UNIT_MS = 12;
const nap = new Int32Array(new SharedArrayBuffer(4));

function sleepMs(ms: number): void {
  if (ms > 0) Atomics.wait(nap, 0, 0, ms);
}

export class StaggeredEnv extends EchoEnv {
  override step(action: number): EchoResult {
    sleepMs(action * STEP_UNIT_MS);
    return super.step(action);
  }

  override stepInto(action: Action, out: ResultRow): void {
    sleepMs((action as number) * STEP_UNIT_MS);
    super.stepInto(action, out);
  }
}

/** The factory `transport-serve --env path/shm_async_wakes_env.js:makeStaggeredEnv` calls. */
export function makeStaggeredEnv(): StaggeredEnv {
  return new StaggeredEnv();
}
