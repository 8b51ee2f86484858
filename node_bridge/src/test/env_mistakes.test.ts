/**
 * A user's env that makes a mistake the runtime can name: an `async step` / `async reset` (it
 * returns a Promise, which the runtime never awaits) gets ENV_ERROR saying so and what to do,
 * not the codec's "StepResult.image: no value given"; a rejected one does not end the server as
 * an unhandled rejection. In the server's thread, in worker threads, and over shm through the
 * bin. Also: `serve(EnvClass, url, { workers })` (a class, not a function) in worker threads.
 * Real servers, real Node clients.
 */

import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { RemoteError } from "../errors";
import { VectorEchoEnv } from "../envs/vector_echo";
import { dictbox, pac_env } from "../generated";
import type { VectorResults } from "../runtime/env";
import { type EnvOrFactory, type Server, connect, serve } from "../index";
import { ErrorCode } from "../protocol";

const DIST = join(__dirname, "..");
const BIN = join(DIST, "..", "bin", "transport-serve-node.js");
const DICTBOX_JS = join(DIST, "generated", "dictbox.js");
const TAG = `envmistakes-${process.pid}-${randomBytes(3).toString("hex")}`;
const place = mkdtempSync(join(tmpdir(), "transport-env-mistakes-"));
const MODULE = join(place, "mistakes.js");

writeFileSync(
  MODULE,
  `"use strict";
/** dictbox (Box action f32[2]); distance sums the first action element. */
class Drift {
  constructor() { this.sum = 0; }
  spaces() { return { obsN: 54, actN: 2 }; }
  reset(seed) { this.sum = seed === undefined ? 0 : Number(seed); return this.view(); }
  step(action) { this.sum += action[0]; return this.view(); }
  view() {
    return { grid: new Float32Array(50), vec: new Float32Array(4), reward: 0, terminated: false,
      truncated: false, distance: this.sum };
  }
}
class AsyncStep extends Drift { async step(action) { return super.step(action); } }
class AsyncReset extends Drift { async reset(seed) { return super.reset(seed); } }
class AsyncRejects extends Drift { async step() { throw new Error("async boom"); } }
class SnakeSpaces extends Drift { spaces() { return { obs_n: 54, act_n: 2 }; } }
module.exports = { Drift, AsyncStep, AsyncReset, AsyncRejects, SnakeSpaces, mkAsyncStep: () => new AsyncStep() };
`,
);
// eslint-disable-next-line @typescript-eslint/no-require-imports
const envs = require(MODULE) as Record<string, new () => unknown>;

const servers = new Set<Server>();
const children = new Set<ChildProcessWithoutNullStreams>();
after(async () => {
  for (const server of servers) await server.close();
  for (const child of children) {
    if (child.exitCode !== null || child.signalCode !== null) continue;
    const exited = new Promise((ok) => child.once("exit", ok));
    child.kill("SIGKILL");
    await exited;
  }
  rmSync(place, { recursive: true, force: true });
  const left = readdirSync("/dev/shm").filter((name) => name.includes(TAG));
  for (const name of left) rmSync(join("/dev/shm", name), { force: true });
  assert.deepEqual(left, [], "no region of these tests is left in /dev/shm");
});

let serial = 0;
const unixUrl = (): string => `unix://${join(tmpdir(), `${TAG}-${++serial}.sock`)}`;

async function served(env: EnvOrFactory, options: Parameters<typeof serve>[2] = {}): Promise<string> {
  const server = await serve(env, unixUrl(), { schema: dictbox.SCHEMA, ...options });
  servers.add(server);
  return server.url;
}

/** An ENV_ERROR that says `method` returned a Promise and must be synchronous. */
function promiseError(method: string): (error: unknown) => boolean {
  return (error) => {
    assert.ok(error instanceof RemoteError, String(error));
    assert.equal(error.code, ErrorCode.ENV_ERROR, error.message);
    assert.match(error.message, new RegExp(`env 0: ${method}\\(\\) returned a Promise \\(is it async\\?\\), not a result`));
    assert.match(error.message, new RegExp(`calls ${method} synchronously and never awaits it; make ${method} a plain method`));
    assert.match(error.message, /do asynchronous work elsewhere/);
    assert.doesNotMatch(error.message, /no value given|returned bad values/);
    return true;
  };
}

/** Reset, then step twice: each step is refused with the Promise's message (the env is reset). */
async function stepsRefused(url: string): Promise<void> {
  const client = await connect(url, { timeoutMs: 30_000 });
  try {
    await client.reset(3n);
    await assert.rejects(client.step([0.5, 0]), promiseError("step"));
    await assert.rejects(client.step([0.5, 0]), promiseError("step"));
  } finally {
    await client.close();
  }
}

describe("an async env method gets an error that says so", () => {
  test("async step, in the server's thread (unix)", async () => {
    await stepsRefused(await served(() => new (envs.AsyncStep as new () => never)()));
  });

  test("async reset, in the server's thread (unix)", async () => {
    const client = await connect(await served(() => new (envs.AsyncReset as new () => never)()), { timeoutMs: 30_000 });
    try {
      await assert.rejects(client.reset(3n), promiseError("reset"));
    } finally {
      await client.close();
    }
  });

  test("async reset and no schema: serve() says so at start (not pac_env's 'no value given')", async () => {
    await assert.rejects(serve(() => new (envs.AsyncReset as new () => never)(), unixUrl()), (error: unknown) => {
      assert.ok(error instanceof TypeError, String(error));
      assert.match(error.message, /reset\(\) returned a Promise \(is it async\?\), not a result/);
      assert.doesNotMatch(error.message, /no value given|do not fit/);
      return true;
    });
  });

  test("a rejected async step: the same error, and no unhandled rejection", async () => {
    const unhandled: unknown[] = [];
    const record = (reason: unknown): void => void unhandled.push(reason);
    process.on("unhandledRejection", record);
    try {
      await stepsRefused(await served(() => new (envs.AsyncRejects as new () => never)()));
      await new Promise((resolve) => setTimeout(resolve, 100));
      assert.deepEqual(unhandled.map(String), []);
    } finally {
      process.off("unhandledRejection", record);
    }
  });

  test("async step in worker threads (unix, --workers 1)", async () => {
    const url = await served(() => new (envs.AsyncStep as new () => never)(), {
      workers: 1,
      workerEnv: { module: MODULE, exportName: "mkAsyncStep", schemaModule: DICTBOX_JS },
    });
    await stepsRefused(url);
  });

  test("async step over shm, served by the bin", async () => {
    const url = `shm://${TAG}-${++serial}?num_envs=1`;
    const child = spawn(process.execPath, [BIN, url, "--env", "./mistakes.js:AsyncStep", "--schema", "dictbox"], {
      cwd: place,
      stdio: ["pipe", "pipe", "pipe"],
    });
    children.add(child);
    let err = "";
    child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
    const ready = await new Promise<string>((resolve, reject) => {
      let out = "";
      child.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (out.startsWith("ready ") && out.includes("\n")) resolve(out.slice(6).split("\n")[0] as string);
      });
      child.once("exit", (code) => reject(new Error(`the server exited with ${code}: ${err}`)));
    });
    try {
      await stepsRefused(ready);
    } finally {
      const exited = new Promise((ok) => child.once("exit", ok));
      child.kill("SIGTERM");
      await exited;
    }
    assert.equal(child.exitCode, 0, err);
  });
});

/** A vector env whose `stepEnvs` is async (it writes after the runtime has read the columns). */
class AsyncStepEnvs extends VectorEchoEnv {
  override async stepEnvs(actions: Float64Array, ids: Int32Array | null, out: VectorResults): Promise<void> {
    await Promise.resolve();
    super.stepEnvs(actions, ids, out);
  }
}
/** A vector env whose `resetEnvs` is async and rejects. */
class AsyncRejectsResetEnvs extends VectorEchoEnv {
  override async resetEnvs(): Promise<void> {
    throw new Error("async boom");
  }
}

describe("a vector env's async stepEnvs / resetEnvs gets an error that says so", () => {
  /** Every env of the call fails with the Promise's message (not a step with the old columns). */
  const vectorPromiseError = (method: string, numEnvs: number) => (error: unknown): boolean => {
    assert.ok(error instanceof RemoteError, String(error));
    assert.equal(error.code, ErrorCode.ENV_ERROR, error.message);
    for (let i = 0; i < numEnvs; i++) {
      assert.match(error.message, new RegExp(`env ${i}: ${method}\\(\\) returned a Promise \\(is it async\\?\\), not a result`));
    }
    return true;
  };

  test("async stepEnvs (unix, 3 envs): ENV_ERROR for every env, no stale results", async () => {
    const server = await serve(new AsyncStepEnvs(3), unixUrl(), { schema: pac_env.SCHEMA });
    servers.add(server);
    const client = await connect(server.url, { timeoutMs: 30_000 });
    try {
      await client.reset(1n);
      await assert.rejects(client.step([1, 2, 3]), vectorPromiseError("stepEnvs", 3));
    } finally {
      await client.close();
    }
  });

  test("a rejected async resetEnvs (unix, 2 envs): the same error, and no unhandled rejection", async () => {
    const unhandled: unknown[] = [];
    const record = (reason: unknown): void => void unhandled.push(reason);
    process.on("unhandledRejection", record);
    try {
      const server = await serve(new AsyncRejectsResetEnvs(2), unixUrl(), { schema: pac_env.SCHEMA });
      servers.add(server);
      const client = await connect(server.url, { timeoutMs: 30_000 });
      try {
        await assert.rejects(client.reset(1n), vectorPromiseError("resetEnvs", 2));
      } finally {
        await client.close();
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
      assert.deepEqual(unhandled.map(String), []);
    } finally {
      process.off("unhandledRejection", record);
    }
  });
});

describe("spaces() of another shape is refused at start, saying what to return", () => {
  const spacesError = (error: unknown): boolean => {
    assert.ok(error instanceof TypeError, String(error));
    assert.match(error.message, /spaces\(\) returned \{"obs_n":54,"act_n":2\}, not \{ obsN, actN \}: return \{ obsN: /);
    assert.doesNotMatch(error.message, /no value given/);
    return true;
  };

  test("in the server's thread (unix)", async () => {
    await assert.rejects(served(() => new (envs.SnakeSpaces as new () => never)()), spacesError);
  });

  test("in worker threads (unix, 1 worker)", async () => {
    const start = served(() => new (envs.SnakeSpaces as new () => never)(), {
      workers: 1,
      workerEnv: { module: MODULE, exportName: "SnakeSpaces", schemaModule: DICTBOX_JS },
    });
    await assert.rejects(start, spacesError);
  });
});

describe("serve(EnvClass, url, { workers }): a class factory in worker threads", () => {
  test("the threads make their envs with new (unix, 2 workers, 4 envs)", async () => {
    const url = await served(envs.Drift as EnvOrFactory, {
      numEnvs: 4,
      workers: 2,
      workerEnv: { module: MODULE, exportName: "Drift", schemaModule: DICTBOX_JS },
    });
    const client = await connect(url, { timeoutMs: 30_000 });
    try {
      const reset = (await client.reset(10n, { copy: true })) as unknown as Array<{ distance: number }>;
      assert.deepEqual(reset.map((r) => r.distance), [10, 11, 12, 13]);
      const stepped = (await client.step([[1, 0], [0.5, 0], [-0.5, 0], [-1, 0]], { copy: true })) as unknown as Array<{ distance: number }>;
      assert.deepEqual(stepped.map((r) => r.distance), [11, 11.5, 11.5, 12]);
    } finally {
      await client.close();
    }
  });
});
