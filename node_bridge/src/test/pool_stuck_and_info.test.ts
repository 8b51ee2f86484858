/**
 * Two holes of the worker pool (runtime/pool.ts), with real worker threads and real servers:
 *
 * - an env whose step never returns: the pool's lock-step wait has a deadline (`stepTimeoutMs`),
 *   after which the stuck thread is terminated and replaced and its envs fail with a typed
 *   ENV_ERROR that says so; the server answers the stepping client, serves the others, keeps
 *   serving that client and stops on SIGTERM (it ignored all of it: its event loop blocked);
 * - `info()` maps of any size (a rendered frame) through OBSERVE with workers: the same maps as
 *   envs in the server's own thread (a map over ~1 KB failed: "RangeError: Insufficient data").
 *
 * This file is also the module the pool's threads (and the child server) load the envs from:
 * its tests run only in the test process's main thread.
 */

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { isMainThread } from "node:worker_threads";

import * as pac_env from "../generated/pac_env";
import { connect, serve } from "../index";
import { ErrorCode } from "../protocol";
import { Op } from "../runtime/core";
import type { Env, Spaces } from "../runtime/env";
import { WorkerPool } from "../runtime/pool";
import { blankPacResult } from "../testing/fixtures";

/** The action with which a StuckEnv's step never returns. */
const LOOP = 9;
/** The child server's step timeout: short, so that the test is. */
const STEP_TIMEOUT_MS = 2000;
/** What a loaded 2-core machine may add to a bound (thread start, a fresh worker's envs). */
const SLACK_MS = 4000;
const CHILD = "TRANSPORT_POOL_STUCK_CHILD";

/** Counts its steps in observation[1]; step(LOOP) never returns. */
class StuckEnv implements Env<pac_env.StepResultInput> {
  steps = 0;
  readonly #out = blankPacResult();

  spaces(): Spaces {
    return { obsN: 612, actN: 92 };
  }

  reset(): pac_env.StepResultInput {
    this.steps = 0;
    this.#out.observation[1] = 0;
    return this.#out;
  }

  step(action: number): pac_env.StepResultInput {
    if (action === LOOP) for (;;) {
      // an env stuck in its step (a bug, a deadlock in native code)
    }
    this.steps++;
    this.#out.observation[1] = this.steps;
    return this.#out;
  }
}

export function makeStuck(): Env<pac_env.StepResultInput> {
  return new StuckEnv();
}

/** `info()`: an RGB frame of `height` x `width` that depends on the env's steps, as a renderer's. */
class FramedEnv extends StuckEnv {
  constructor(
    readonly height: number,
    readonly width: number,
  ) {
    super();
  }

  info(): Record<string, unknown> {
    const frame = new Uint8Array(this.height * this.width * 3);
    for (let j = 0; j < frame.length; j++) frame[j] = (j * 31 + this.steps * 7) & 0xff;
    return { frame, frame_shape: [this.height, this.width, 3], steps: this.steps };
  }
}

export function makeFrame210(): Env<pac_env.StepResultInput> {
  return new FramedEnv(210, 160);
}

export function makeFrame480(): Env<pac_env.StepResultInput> {
  return new FramedEnv(480, 480);
}

export function makeFrameTiny(): Env<pac_env.StepResultInput> {
  return new FramedEnv(2, 3);
}

function unixUrl(): string {
  return `unix://${join(tmpdir(), `transport-pstuck-${randomBytes(5).toString("hex")}.sock`)}`;
}

/**
 * A server in a child process (as the bin runs one: SIGTERM closes it), its envs StuckEnvs in 2
 * worker threads with a step timeout of STEP_TIMEOUT_MS.
 */
class ChildServer {
  readonly url = unixUrl();
  readonly child: ChildProcess;
  #exited: Promise<number | null>;
  #out = "";

  constructor() {
    const script = `
      const { serve } = require(${JSON.stringify(join(__dirname, "..", "index.js"))});
      const mod = ${JSON.stringify(__filename)};
      serve(require(mod).makeStuck, ${JSON.stringify(this.url)}, {
        numEnvs: 2, workers: 2,
        workerEnv: { module: mod, exportName: "makeStuck", stepTimeoutMs: ${STEP_TIMEOUT_MS} },
      }).then((server) => {
        process.on("SIGTERM", () => server.close().then(() => process.exit(0)));
        process.stdout.write("ready\\n");
      });`;
    this.child = spawn(process.execPath, ["-e", script], { env: { ...process.env, [CHILD]: "1" }, stdio: ["ignore", "pipe", "pipe"] });
    this.child.stdout?.on("data", (chunk: Buffer) => (this.#out += chunk.toString()));
    this.child.stderr?.on("data", (chunk: Buffer) => (this.#out += chunk.toString()));
    this.#exited = new Promise((resolve) => this.child.on("exit", (code) => resolve(code)));
  }

  async ready(): Promise<void> {
    const deadline = Date.now() + 30_000;
    while (!this.#out.includes("ready")) {
      if (Date.now() > deadline || this.child.exitCode !== null) throw new Error(`the server did not start: ${this.#out}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /** SIGTERM; resolves with the milliseconds it took to exit (null: it did not within `ms`). */
  async terminate(ms: number): Promise<number | null> {
    const start = Date.now();
    this.child.kill("SIGTERM");
    const timer = new Promise<"late">((resolve) => setTimeout(() => resolve("late"), ms).unref());
    const how = await Promise.race([this.#exited, timer]);
    return how === "late" ? null : Date.now() - start;
  }

  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGKILL");
  }
}

function codeOf(error: unknown): unknown {
  return (error as { code?: unknown }).code;
}

if (isMainThread && process.env[CHILD] === undefined) {
  describe("an env whose step never returns, in a worker thread", () => {
    test("the client gets ENV_ERROR within the step timeout; the others are served; the pool recovers; SIGTERM stops the server", async () => {
      const server = new ChildServer();
      const socket = server.url.slice("unix://".length);
      try {
        await server.ready();
        const client = await connect(server.url, { timeoutMs: 30_000 });
        await client.reset(1);
        await client.step([0, 0]);
        const start = Date.now();
        const stuck = client.step([LOOP, 0]).then(
          () => null,
          (error: unknown) => ({ error, ms: Date.now() - start }),
        );
        await new Promise((resolve) => setTimeout(resolve, 200));
        // a second client, while the first one's env is stuck: served at the latest once the
        // stuck worker was given up on
        const other = await connect(server.url, { timeoutMs: 30_000 });
        await other.reset(2);
        assert.equal(((await other.step([1, 2])) as unknown[]).length, 2);
        const otherMs = Date.now() - start;
        assert.ok(otherMs < STEP_TIMEOUT_MS + SLACK_MS, `the second client was served after ${otherMs} ms`);

        const failed = await stuck;
        assert.notEqual(failed, null, "the stuck step succeeded");
        const { error, ms } = failed as { error: unknown; ms: number };
        assert.equal(codeOf(error), ErrorCode.ENV_ERROR, String(error));
        const text = String((error as Error).message);
        assert.match(text, /env 0: worker thread 0 \(thread id \d+, envs 0\) did not answer within the step timeout \(2 s/);
        assert.ok(ms >= STEP_TIMEOUT_MS - 100 && ms < STEP_TIMEOUT_MS + SLACK_MS, `answered after ${ms} ms`);

        // the worker was replaced and env 0 recreated: the connection's envs step again
        const after = (await client.step([0, 0], { copy: true })) as pac_env.StepResult[];
        assert.equal(after.length, 2);
        assert.equal(after[1]!.observation[1], 3); // env 1's worker was not touched: its third step
        const again = (await client.step([0, 0], { copy: true })) as pac_env.StepResult[];
        assert.equal(again[1]!.observation[1], 4);
        await other.close();

        // stuck again, then SIGTERM: the server stops once the step timeout gave the loop back
        const stuckAgain = client.step([LOOP, 0]).catch((e: unknown) => e);
        await new Promise((resolve) => setTimeout(resolve, 200));
        const exitMs = await server.terminate(STEP_TIMEOUT_MS + SLACK_MS);
        assert.notEqual(exitMs, null, "the server was still alive after SIGTERM");
        assert.ok(await stuckAgain, "a step on a server that stopped succeeded");
        await client.close().catch(() => undefined);
        assert.equal(existsSync(socket), false, "the socket file was left behind");
      } finally {
        server.kill();
      }
    });

    test("a WorkerPool used directly: the stuck env fails by name, its worker is replaced, the pool goes on", () => {
      const pool = new WorkerPool({ module: __filename, exportName: "makeStuck", stepTimeoutMs: 500 }, 2, 2);
      try {
        const size = pool.resultSize;
        const out = {
          bytes: new Uint8Array(2 * size),
          at: (i: number) => i * size,
          written: () => undefined,
          keepFinal: () => undefined,
        };
        const ops = Uint8Array.of(Op.RESET, Op.RESET);
        assert.equal(pool.run(ops, new Float64Array(2), [null, null], out), null);
        const ids = pool.threadIds();
        const start = Date.now();
        const failures = pool.run(Uint8Array.of(Op.STEP, Op.STEP), Float64Array.of(LOOP, 0), [null, null], out);
        const ms = Date.now() - start;
        assert.ok(ms < 500 + SLACK_MS, `run returned after ${ms} ms`);
        assert.deepEqual(failures?.map((failure) => failure[0]), [0]);
        assert.match(String((failures?.[0]?.[1] as Error | undefined)?.message), /env 0: worker thread 0 .* did not answer within the step timeout \(0\.5 s/);
        assert.equal(pool.takeReplaced(0) !== null, true);
        const now = pool.threadIds();
        assert.notEqual(now[0], ids[0], "the stuck worker was not replaced");
        assert.equal(now[1], ids[1]);
        // the fresh worker serves: reset then step every env
        assert.equal(pool.run(ops, new Float64Array(2), [null, null], out), null);
        assert.equal(pool.run(Uint8Array.of(Op.STEP, Op.STEP), Float64Array.of(0, 0), [null, null], out), null);
        assert.deepEqual(pool.ping(), []);
      } finally {
        pool.close();
      }
    });
  });

  describe("info() maps of any size through OBSERVE with workers", () => {
    for (const [name, factory] of [
      ["a 2x3x3 frame (fits the env record)", makeFrameTiny],
      ["a 210x160x3 frame", makeFrame210],
      ["a 480x480x3 frame", makeFrame480],
    ] as const) {
      test(`${name}: the in-process server's maps`, async () => {
        const exportName = factory.name;
        const infos: unknown[] = [];
        for (const workers of [0, 2]) {
          const url = unixUrl();
          const server = await serve(factory, url, {
            numEnvs: 3,
            ...(workers ? { workers, workerEnv: { module: __filename, exportName } } : {}),
          });
          const client = await connect(server.url, { timeoutMs: 30_000 });
          try {
            await client.reset(0);
            await client.step([0, 0, 0]);
            const first = (await client.observe({ copy: true })).infos;
            await client.step([0, 0, 0]);
            const second = (await client.observe({ copy: true })).infos;
            infos.push([first, second]);
          } finally {
            await client.close();
            await server.close();
          }
        }
        const [inProcess, pooled] = infos as Array<Array<Array<Record<string, unknown>>>>;
        const frame = (inProcess![1]![2]!["frame"] as Uint8Array);
        assert.equal(frame.length, (inProcess![1]![2]!["frame_shape"] as number[]).reduce((a, b) => a * b));
        assert.equal(inProcess![1]![2]!["steps"], 2);
        assert.deepEqual(pooled, inProcess);
      });
    }
  });
}
