/**
 * The heavy-tailed env: echo's bytes, with a step time that is heavy-tailed (the benchmark and
 * the tests of asynchronous batches over worker threads; Python: transport/envs/heavy_tail.py).
 *
 * Most steps spend FAST_MS of CPU (a busy wait: a real env computes); one in SLOW_ONE_IN, drawn
 * from the env's own seeded generator (mulberry32, seeded at each seeded reset), spends
 * SLOW_FACTOR times as long. Served by name: `transport-serve URL --env heavy_tail --lang node`.
 */

import { EchoEnv, type EchoResult } from "./echo";
import { mulberry32, seedState } from "./pac";

export const FAST_MS = 0.2;
export const SLOW_FACTOR = 20;
export const SLOW_ONE_IN = 20;

/** Spend `ms` milliseconds of CPU (not a sleep: the cost is CPU, as an env's step is). */
export function busy(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // computing
  }
}

/** EchoEnv whose steps cost FAST_MS, or SLOW_FACTOR x FAST_MS one time in SLOW_ONE_IN. */
export class HeavyTailEnv extends EchoEnv {
  /** The generator's state (mulberry32). */
  rng = 0;

  constructor(readonly fastMs = FAST_MS) {
    super();
  }

  override reset(seed?: bigint): EchoResult {
    if (seed !== undefined) this.rng = seedState(seed);
    return super.reset(seed);
  }

  override step(action: number): EchoResult {
    const slow = mulberry32(this) % SLOW_ONE_IN === 0;
    busy(this.fastMs * (slow ? SLOW_FACTOR : 1));
    return super.step(action);
  }
}
