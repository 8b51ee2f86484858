/**
 * `transport-serve URL --lang node --env vector-echo --num-envs N` (issue 24): the Node CLI
 * serves `VectorEchoEnv` (N echo envs in one object, one call per request) under the reference
 * name Python uses for its own `VectorEchoEnv`. Real processes: its responses over unix:// are
 * byte for byte those of N ordinary echo envs (the Node CLI's `--env echo`, and the Python
 * server's when Python is there), and over shm:// too; `--workers` is refused clearly.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";

import type { AnyStructCodec } from "../codec";
import * as pac_env from "../generated/pac_env";
import { type Client, connect } from "../index";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";

const RESULT = pac_env.StepResultCodec as unknown as AnyStructCodec;
const SERVE_JS = resolve(__dirname, "..", "cli", "serve.js");
const N = 4;

type Row = Record<string, unknown>;

const servers = new Map<string, ServerProcess>();

before(async () => {
  const id = `${process.pid}-${randomBytes(4).toString("hex")}`;
  const sock = (tag: string): string => `unix://${join(tmpdir(), `transport-vecho-${tag}-${id}.sock`)}`;
  const args = (env: string): string[] => ["--env", env, "--num-envs", String(N)];
  servers.set("vector", await ServerProcess.start("node", sock("v"), ...args("vector-echo")));
  servers.set("vector-shm", await ServerProcess.start("node", `shm://vecho-${id}?num_envs=${N}`, ...args("vector-echo")));
  servers.set("echo", await ServerProcess.start("node", sock("e"), ...args("echo")));
  if (HAVE_PYTHON) servers.set("python", await ServerProcess.start("python", sock("p"), ...args("echo")));
});

after(async () => {
  for (const server of servers.values()) await server.stop();
});

function bytesOf(result: unknown): Buffer {
  const view = result as Row;
  const values: Row = {};
  for (const f of pac_env.SCHEMA.ir.structs["StepResult"]!.fields) values[f.name] = view[f.name];
  return Buffer.from(RESULT.encode(values));
}

function list(results: unknown): unknown[] {
  return Array.isArray(results) ? results : [results];
}

/** Reset, then 6 batched steps: every response's bytes (copies). */
async function trace(client: Client<unknown, unknown>): Promise<Buffer[][]> {
  const out: Buffer[][] = [list(await client.reset(3n, { copy: true })).map(bytesOf)];
  for (let t = 0; t < 6; t++) {
    const actions = Array.from({ length: N }, (_, i) => (t * 11 + i * 5) % 92);
    out.push(list(await client.step(actions, { copy: true })).map(bytesOf));
  }
  return out;
}

describe("transport-serve --lang node --env vector-echo", () => {
  test("its responses are those of N echo envs (Node and Python), over unix:// and shm://", async () => {
    const traces = new Map<string, Buffer[][]>();
    for (const [name, server] of servers) {
      const client = await connect<unknown, unknown>(server.url);
      try {
        traces.set(name, await trace(client));
        if (name.startsWith("vector")) assert.equal(client.serverInfo["env"], "vector-echo");
      } finally {
        await client.close();
      }
    }
    const expected = traces.get("echo");
    assert.ok(expected !== undefined);
    for (const [name, got] of traces) assert.deepEqual(got, expected, `${name} vs the Node echo envs`);
    assert.equal((expected[1]?.[2] as Buffer).readFloatLE(0), (0 * 11 + 2 * 5) % 92); // env 2's first action
  });

  test("--workers is refused with the reason, and the name is in --help", () => {
    const refused = spawnSync(process.execPath, [SERVE_JS, `unix://${join(tmpdir(), `vecho-w-${process.pid}.sock`)}`, "--env", "vector-echo", "--workers", "2"], { encoding: "utf8" });
    assert.equal(refused.status, 1, refused.stderr);
    assert.match(refused.stderr, /transport-serve: error: a vector env steps its envs itself: serve it without workers/);
    const help = spawnSync(process.execPath, [SERVE_JS, "--help"], { encoding: "utf8" });
    assert.match(help.stdout, /vector-echo/);
  });
});
