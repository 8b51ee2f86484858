/**
 * env_trace: play a reference env and print every encoded StepResult as hex, one per line.
 *
 *   node dist/tools/env_trace.js '{"env": "pac", "seed": 7, "actions": [0, 3, "reset", 1]}'
 *   echo '{"env": "echo", "seed": null, "actions": [5, 6]}' | node dist/tools/env_trace.js
 *
 * Input (argv[2], or stdin when absent): JSON `{env, seed, actions}`. `seed` is a number, a
 * decimal string (for u64 seeds beyond 2^53) or null (reset without a seed). The first line is
 * the reset result, then one line per entry of `actions`: an integer action steps the env;
 * "reset" resets it without a seed and {"reset": seed} with one. Used by tests/test_envs.py to
 * compare the Node envs with the Python envs byte for byte.
 */

import { readFileSync } from "node:fs";

import { StepResultCodec, type StepResultInput } from "../generated/pac_env";
import { ENVS } from "../envs";

type Seed = number | string | null | undefined;

interface Trace {
  env: string;
  seed?: Seed;
  actions?: Array<number | "reset" | { reset: Seed }>;
}

function toSeed(seed: Seed): bigint | undefined {
  return seed === null || seed === undefined ? undefined : BigInt(seed);
}

function hex(result: StepResultInput): string {
  return Buffer.from(StepResultCodec.encode(result)).toString("hex");
}

function main(): number {
  const text = process.argv[2] ?? readFileSync(0, "utf8");
  const trace = JSON.parse(text) as Trace;
  const factory = ENVS[trace.env] as (() => { reset(seed?: bigint): StepResultInput; step(action: number): StepResultInput }) | undefined; // pac_env envs
  if (factory === undefined) {
    const known = Object.keys(ENVS).join(", ");
    process.stderr.write(`env_trace: unknown env ${JSON.stringify(trace.env)} (known: ${known})\n`);
    return 2;
  }
  const env = factory();
  const lines: string[] = [hex(env.reset(toSeed(trace.seed)))];
  for (const entry of trace.actions ?? []) {
    if (entry === "reset") lines.push(hex(env.reset()));
    else if (typeof entry === "object") lines.push(hex(env.reset(toSeed(entry.reset))));
    else lines.push(hex(env.step(entry)));
  }
  process.stdout.write(lines.join("\n") + "\n");
  return 0;
}

process.exitCode = main();
