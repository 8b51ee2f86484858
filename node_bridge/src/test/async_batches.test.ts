/**
 * Asynchronous batches from the Node client (send / recv / asyncReset) against a Node server
 * and a Python server with worker processes: each env comes back once, at most B per recv,
 * results equal those of lock-step, misuse is ASYNC_STATE.
 */

import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";

import { PacEnv } from "../envs";
import { type Client, RemoteError, connect, serve } from "../index";
import type * as pac_env from "../generated/pac_env";
import { ErrorCode } from "../protocol";

const ROOT = resolve(__dirname, "..", "..", "..");
const PYTHON = process.env.PYTHON ?? join(ROOT, ".venv", "bin", "python");
const HAVE_PYTHON = spawnSync(PYTHON, ["-c", "import transport.tools.serve_cli"], { cwd: ROOT }).status === 0;
const N = 4;

function unixUrl(): string {
  return `unix://${join(tmpdir(), `transport-async-${randomBytes(6).toString("hex")}.sock`)}`;
}

function firstAllowed(result: pac_env.StepResult): number {
  return Array.from(result.action_mask).findIndex((m) => m !== 0);
}

/** Every env's result bytes after each round of send(all) / recv(B), in env order. */
async function asyncTrace(client: Client, rounds: number, batch: number): Promise<string[]> {
  const out: string[] = [];
  await client.asyncReset(3);
  for (let round = 0; round <= rounds; round++) {
    const rows = new Map<number, pac_env.StepResult>();
    while (rows.size < N) {
      const got = await client.recv(batch);
      assert.ok(got.envIds.length >= 1 && got.envIds.length <= batch, `recv returned ${got.envIds.length}`);
      got.envIds.forEach((i, k) => {
        assert.ok(!rows.has(i), `env ${i} came back twice`);
        rows.set(i, got.results[k] as pac_env.StepResult);
      });
    }
    for (let i = 0; i < N; i++) out.push(JSON.stringify(rows.get(i), (_, v) => (ArrayBuffer.isView(v) ? Array.from(v as Uint8Array) : v)));
    if (round === rounds) break;
    const ids = [0, 1, 2, 3];
    await client.send(ids.map((i) => firstAllowed(rows.get(i) as pac_env.StepResult)), ids);
  }
  return out;
}

async function lockstepTrace(client: Client, rounds: number): Promise<string[]> {
  const out: string[] = [];
  let results = (await client.reset(3, { copy: true })) as pac_env.StepResult[];
  for (let round = 0; round <= rounds; round++) {
    for (const r of results) out.push(JSON.stringify(r, (_, v) => (ArrayBuffer.isView(v) ? Array.from(v as Uint8Array) : v)));
    if (round === rounds) break;
    results = (await client.step(results.map(firstAllowed), { copy: true })) as pac_env.StepResult[];
  }
  return out;
}

test("async send/recv against the Node server: lock-step's results, misuse refused", async () => {
  const server = await serve(() => new PacEnv(), unixUrl(), { envName: "pac", numEnvs: N });
  try {
    const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "next_step" });
    await assert.rejects(client.recv(1), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.ASYNC_STATE);
    const got = await asyncTrace(client, 30, 2);
    await assert.rejects(client.recv(1), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.ASYNC_STATE);
    await client.send([0], [1]);
    await assert.rejects(client.send([0], [1]), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.ASYNC_STATE);
    assert.deepEqual((await client.recv()).envIds, [1]);
    const expected = await lockstepTrace(client, 30);
    assert.deepEqual(got, expected);
    await client.close();
  } finally {
    await server.close();
  }
});

class PythonServer {
  readonly proc: ChildProcessWithoutNullStreams;
  constructor(readonly url: string, args: string[]) {
    this.proc = spawn(PYTHON, ["-m", "transport.tools.serve_cli", url, ...args], { cwd: ROOT, stdio: ["pipe", "pipe", "pipe"] });
  }
  async ready(): Promise<void> {
    await new Promise<void>((ok, fail) => {
      let out = "";
      const timer = setTimeout(() => fail(new Error("no ready line in 30 s")), 30_000);
      this.proc.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes("\n")) {
          clearTimeout(timer);
          if (out.startsWith("ready ")) ok();
          else fail(new Error(out));
        }
      });
    });
  }
  async stop(): Promise<void> {
    const exited = new Promise<void>((ok) => this.proc.once("exit", () => ok()));
    this.proc.kill("SIGTERM");
    await exited;
  }
}

test("async send/recv against a Python server with worker processes", { skip: HAVE_PYTHON ? false : "no Python transport" }, async () => {
  const server = new PythonServer(unixUrl(), ["--env", "pac", "--num-envs", String(N), "--workers", "2"]);
  try {
    await server.ready();
    const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "next_step" });
    const got = await asyncTrace(client, 20, 2);
    const expected = await lockstepTrace(client, 20);
    assert.deepEqual(got, expected);
    await client.close();
  } finally {
    await server.stop();
  }
});
