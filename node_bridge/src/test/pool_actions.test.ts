/**
 * Worker threads carry every action kind the in-thread runtime carries (issue 23): a Box action
 * with a Dict observation (reach, schema dictbox) and a MultiDiscrete action (lock, schema
 * multidiscrete) stepped in a pool of 2 threads give the in-thread bytes (observations,
 * rewards, terminated, truncated, SAME_STEP finals), lock-step and asynchronous (SEND / RECV),
 * in every auto-reset mode; a Box-action env that throws is the same ENV_ERROR, recovered the
 * same way. Each env gets its action through the runtime's one rule (`actionOf`): a
 * Float64Array of the action's elements.
 *
 * This file is also the module the pool's threads load `makeExplodingReach` from: its tests run
 * only in the main thread.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { describe, test } from "node:test";
import { isMainThread } from "node:worker_threads";

import { REMOTE_TRACEBACK_MARKER } from "../errors";
import { ENVS } from "../envs";
import { ReachEnv } from "../envs/rich_spaces";
import * as dictbox from "../generated/dictbox";
import * as multidiscrete from "../generated/multidiscrete";
import { AutoReset, RequestError } from "../protocol";
import { AsyncBatches } from "../runtime/async_batches";
import { type EnvRuntime, type Records, actionOf } from "../runtime/core";
import type { Env, Spaces } from "../runtime/env";
import { EnvHost, type HostOptions } from "../runtime/host";
import { schemaFromPath } from "../runtime/pool";

type ReachResult = ReturnType<ReachEnv["step"]>;

const N = 4;
const ROUNDS = 70; // reach truncates after 50 steps, lock after 20: auto-resets in every mode
const BOOM = 0.75;

/** ReachEnv whose step throws for move[0] === 0.75; it checks that its action is a Float64Array of 2. */
class ExplodingReach extends ReachEnv {
  override step(action: number | Float64Array): ReachResult {
    if (!(action instanceof Float64Array) || action.length !== 2) throw new TypeError(`not a Box action: ${String(action)}`);
    if (action[0] === BOOM) throw new RangeError(`boom at [${Array.from(action).join(", ")}]`);
    return super.step(action);
  }
}

export function makeExplodingReach(): ExplodingReach {
  return new ExplodingReach();
}

/** Writes what its action is into its observation: [2 Float64Array / 1 number, length, ...values]. */
class ActionProbe implements Env<{ observation: Float64Array; reward: number; terminated: boolean }> {
  spaces(): Spaces {
    return { obsN: 16, actN: 4 };
  }

  reset(): { observation: Float64Array; reward: number; terminated: boolean } {
    return { observation: new Float64Array(16), reward: 0, terminated: false };
  }

  step(action: number | Float64Array): { observation: Float64Array; reward: number; terminated: boolean } {
    const values = typeof action === "number" ? [action] : Array.from(action);
    const observation = new Float64Array(16);
    observation.set([typeof action === "number" ? 1 : 2, values.length, ...values]);
    return { observation, reward: 0, terminated: false };
  }
}

export function makeProbe(): ActionProbe {
  return new ActionProbe();
}

const ROOT = resolve(__dirname, "..", "..", "..");
const SCHEMA_CLI = join(ROOT, ".venv", "bin", "transport-schema");

/** A schema whose action is `type`, compiled by transport-schema into a JSON IR file (for the threads). */
function probeSchemaFile(dir: string, type: string): string {
  const toml = join(dir, "probe.toml");
  writeFileSync(
    toml,
    [
      "[schema]",
      'name = "probe"',
      "version = 1",
      'layout = "natural"',
      "[env]",
      "[structs.StepResult]",
      "fields = [",
      '  { name = "observation", type = "f64[16]", role = "observation" },',
      '  { name = "reward", type = "f64", role = "reward" },',
      '  { name = "terminated", type = "bool", role = "terminated" },',
      "]",
      "[structs.StepRequest]",
      `fields = [{ name = "action", type = "${type}", role = "action" }]`,
      "",
    ].join("\n"),
  );
  const done = spawnSync(SCHEMA_CLI, ["inspect", toml, "--json"], { encoding: "utf8" });
  assert.equal(done.status, 0, done.stderr);
  const json = join(dir, `probe-${type.replace(/[^a-z0-9]/g, "_")}.json`);
  writeFileSync(json, done.stdout);
  return json;
}

/** The result rows of one request (env i at i * size) and the SAME_STEP finals it kept. */
class Rows implements Records {
  readonly bytes: Uint8Array;
  finals: Array<[number, Buffer]> = [];

  constructor(
    readonly size: number,
    count = N,
  ) {
    this.bytes = new Uint8Array(count * size);
  }

  at(index: number): number {
    return index * this.size;
  }

  written(): void {
    // in place
  }

  keepFinal(index: number): void {
    this.finals.push([index, Buffer.from(this.bytes.subarray(index * this.size, (index + 1) * this.size))]);
  }

  row(i: number): string {
    return Buffer.from(this.bytes.subarray(i * this.size, (i + 1) * this.size)).toString("hex");
  }
}

/** A seeded xorshift32. */
function rng(seed: number): () => number {
  let s = seed | 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return s >>> 0;
  };
}

/** Env i's action into the runtime's actions (reach: quarters in -1..1, exact in f32; lock: dials). */
function putActions(env: string, rt: EnvRuntime, next: () => number): void {
  const k = rt.actionRule.elements;
  for (let i = 0; i < N; i++) {
    for (let j = 0; j < k; j++) {
      rt.actions[i * k + j] = env === "reach" ? ((next() % 9) - 4) / 4 : next() % [3, 4, 5][j]!;
    }
  }
}

function hostOf(env: string, workers: number, module = false): EnvHost {
  const schema = env === "reach" ? dictbox.SCHEMA : multidiscrete.SCHEMA;
  const options: HostOptions = {
    schema,
    numEnvs: N,
    envName: env,
    ...(workers
      ? {
          workers,
          workerEnv: {
            schemaModule: join(__dirname, "..", "generated", env === "reach" ? "dictbox.js" : "multidiscrete.js"),
            ...(module ? { module: __filename, exportName: "makeExplodingReach" } : {}),
          },
        }
      : {}),
  };
  return new EnvHost(module ? makeExplodingReach : ENVS[env]!, options);
}

function lockstep(host: EnvHost, env: string, mode: AutoReset): string[] {
  const rt = host.runtime();
  try {
    rt.autoreset = mode;
    const rows = new Rows(rt.result.size);
    const next = rng(7);
    const out: string[] = [];
    rt.resetAll(rows, 11n);
    for (let i = 0; i < N; i++) out.push(rows.row(i));
    for (let t = 0; t < ROUNDS; t++) {
      putActions(env, rt, next);
      rows.finals = [];
      rt.step(rows);
      for (let i = 0; i < N; i++) out.push(rows.row(i));
      for (const [i, bytes] of rows.finals.sort((a, b) => a[0] - b[0])) out.push(`${i}:${bytes.toString("hex")}`);
    }
    return out;
  } finally {
    rt.close();
  }
}

async function asyncTrace(host: EnvHost, env: string, mode: AutoReset, batch: number): Promise<string[]> {
  const rt = host.runtime();
  try {
    rt.autoreset = mode;
    const batches = new AsyncBatches(rt);
    const records = batches.records;
    const size = rt.result.size;
    const row = (i: number, bytes: Uint8Array): string => Buffer.from(bytes.subarray(i * size, (i + 1) * size)).toString("hex");
    const next = rng(7);
    const out: string[] = [];
    batches.reset(11n);
    for (let round = 0; round <= ROUNDS; round++) {
      const rows = new Map<number, string>();
      const finals: string[] = [];
      while (rows.size < N) {
        const ids = await batches.recv(batch);
        assert.ok(ids.length >= 1 && ids.length <= batch);
        for (const i of ids) {
          assert.ok(!rows.has(i), `env ${i} came back twice`);
          rows.set(i, row(i, records.bytes));
          if (mode === AutoReset.SAME_STEP && records.ended[i]) finals.push(`${i}:${row(i, records.finals)}`);
        }
      }
      for (let i = 0; i < N; i++) out.push(rows.get(i)!);
      out.push(...finals.sort());
      if (round === ROUNDS) break;
      putActions(env, rt, next);
      batches.send([0, 1, 2, 3]);
    }
    return out;
  } finally {
    rt.close();
  }
}

/** An error's text without the env's last frames (where they ran differs). */
function messageOnly(error: unknown): string {
  const text = error instanceof RequestError ? `${error.code} ${error.text}` : String(error);
  return text.split(REMOTE_TRACEBACK_MARKER)[0] as string;
}

/** A Box-action env that throws on env 2's action at round 3, lock-step then async. */
async function explodingTrace(host: EnvHost): Promise<string[]> {
  const rt = host.runtime();
  try {
    rt.autoreset = AutoReset.SAME_STEP;
    const rows = new Rows(rt.result.size);
    const out: string[] = [];
    rt.resetAll(rows, 5n);
    for (let t = 0; t < 6; t++) {
      for (let i = 0; i < N; i++) {
        rt.actions[2 * i] = i === 2 ? (t === 3 ? BOOM : -0.25) : 0.25;
        rt.actions[2 * i + 1] = 0.25;
      }
      try {
        rt.step(rows);
        for (let i = 0; i < N; i++) out.push(rows.row(i));
      } catch (error) {
        out.push(messageOnly(error));
      }
    }
    const batches = new AsyncBatches(rt);
    batches.reset(9n);
    await batches.recv(N);
    rt.actions[4] = BOOM;
    batches.send([0, 1, 2, 3]);
    const got = new Map<number, string>();
    while (got.size < N) {
      try {
        for (const i of await batches.recv(1)) {
          const size = rt.result.size;
          got.set(i, Buffer.from(batches.records.bytes.subarray(i * size, (i + 1) * size)).toString("hex"));
        }
      } catch (error) {
        got.set(2, messageOnly(error));
      }
    }
    for (let i = 0; i < N; i++) out.push(got.get(i)!);
    return out;
  } finally {
    rt.close();
  }
}

if (isMainThread) {
  test("actionOf: Discrete a number; an array action (any element count, even 1) an owned Float64Array", () => {
    const actions = Float64Array.of(1, 2, 3, 4);
    assert.equal(actionOf({ kind: "discrete", elements: 1 }, actions, 2), 3);
    const one = actionOf({ kind: "box", elements: 1 }, actions, 2);
    assert.ok(one instanceof Float64Array);
    assert.deepEqual(Array.from(one), [3]);
    const two = actionOf({ kind: "multi_discrete", elements: 2 }, actions, 1) as Float64Array;
    assert.deepEqual(Array.from(two), [3, 4]);
    two[0] = 99; // owned: the runtime's actions are untouched
    assert.equal(actions[2], 3);
  });

  for (const env of ["reach", "lock"]) {
    describe(`${env} in 2 worker threads: the in-thread bytes`, () => {
      for (const mode of [AutoReset.DISABLED, AutoReset.NEXT_STEP, AutoReset.SAME_STEP]) {
        test(`auto-reset mode ${mode}, lock-step and async`, async () => {
          if (mode === AutoReset.DISABLED) {
            // no auto-reset: a done env refuses its next step; a short run before any end
            const local = hostOf(env, 0).runtime();
            const pooled = hostOf(env, 2).runtime();
            try {
              const a = new Rows(local.result.size);
              const b = new Rows(pooled.result.size);
              local.resetAll(a, 3n);
              pooled.resetAll(b, 3n);
              const next = rng(5);
              for (let t = 0; t < 2; t++) {
                putActions(env, local, next);
                pooled.actions.set(local.actions);
                local.step(a);
                pooled.step(b);
                assert.deepEqual(Buffer.from(b.bytes), Buffer.from(a.bytes));
              }
            } finally {
              local.close();
              pooled.close();
            }
            return;
          }
          const expected = lockstep(hostOf(env, 0), env, mode);
          if (mode === AutoReset.SAME_STEP) assert.ok(expected.some((line) => line.includes(":")), "no episode ended");
          assert.deepEqual(await asyncTrace(hostOf(env, 0), env, mode, N), expected);
          assert.deepEqual(lockstep(hostOf(env, 2), env, mode), expected);
          assert.deepEqual(await asyncTrace(hostOf(env, 2), env, mode, N / 2), expected);
        });
      }
    });
  }

  test("a Box-action env that throws: the same ENV_ERROR and recovery in worker threads", async () => {
    const expected = await explodingTrace(hostOf("reach", 0, true));
    assert.ok(expected.some((line) => line.includes("env 2: RangeError: boom at [0.75, 0.25]")), expected.join("\n"));
    assert.deepEqual(await explodingTrace(hostOf("reach", 2, true)), expected);
  });

  test(
    "a multi-dimensional Box action (f32[2,2]) and f32[1] reach a worker's env as in this thread",
    { skip: !existsSync(SCHEMA_CLI) && "no .venv/bin/transport-schema" },
    () => {
      const dir = mkdtempSync(join(tmpdir(), "transport-pool-actions-"));
      try {
        for (const [type, values] of [
          ["f32[2,2]", [0.5, -1.5, 2.25, 3]],
          ["f32[1]", [0.75]],
          ["f64[3]", [0.1, 1e300, -2]],
        ] as const) {
          const file = probeSchemaFile(dir, type);
          const schema = schemaFromPath(file);
          const out: string[][] = [];
          for (const workers of [0, 2]) {
            const workerEnv = { schemaModule: file, module: __filename, exportName: "makeProbe" };
            const options: HostOptions = { schema, numEnvs: 2, ...(workers ? { workers, workerEnv } : {}) };
            const rt = new EnvHost(makeProbe, options).runtime();
            try {
              const rows = new Rows(rt.result.size, 2);
              rt.resetAll(rows, 1n);
              const k = values.length;
              for (let i = 0; i < 2; i++) for (let j = 0; j < k; j++) rt.actions[i * k + j] = (values[j] as number) * (i + 1);
              rt.step(rows);
              out.push([rows.row(0), rows.row(1)]);
              const obs = new Float64Array(rows.bytes.buffer.slice(0, 16 * 8));
              assert.deepEqual(Array.from(obs.subarray(0, 2 + k)), [2, k, ...values], type);
            } finally {
              rt.close();
            }
          }
          assert.deepEqual(out[1], out[0], type);
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );

  test("a pool of an array-action schema starts (no refusal)", () => {
    const rt = hostOf("lock", 2).runtime();
    try {
      assert.equal(rt.actionRule.kind, "multi_discrete");
    } finally {
      rt.close();
    }
  });
}
