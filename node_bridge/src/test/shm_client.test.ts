/**
 * The Node shm:// client (backends/shm/channel.ts) through the one `Client`, against real server
 * processes: the Node server (`node dist/cli/serve.js`) and the Python server (`python -m
 * transport.tools.serve_cli --lang python`). Seeded pac traces over shm:// are byte-identical to
 * unix:// in every auto-reset mode (finals included), results are views into the slots, errors
 * are typed, a dead server is PeerGoneError within about a second, and the lease holds.
 */

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, describe, test } from "node:test";

import { ShmChannel } from "../backends/shm/channel";
import { native } from "../backends/shm/native";
import { parseShmUrl } from "../backends/shm/region";
import * as pac_env from "../generated/pac_env";
import { type Client, ConnectError, PeerGoneError, RemoteError, connect } from "../index";
import { ErrorCode } from "../protocol";
import { POISON } from "../testing/faulty";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";

const FAULTY = resolve(__dirname, "..", "testing", "faulty.js");

function shmUrl(numEnvs: number): string {
  return `shm://node-client-${randomBytes(5).toString("hex")}?num_envs=${numEnvs}`;
}

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop("SIGKILL");
});

async function started(lang: "node" | "python" | "faulty", url: string, ...args: string[]): Promise<ServerProcess> {
  const what = lang === "faulty" ? { module: FAULTY, factory: "makeFaulty", numEnvs: 3 } : lang;
  const server = await ServerProcess.start(what, url, ...args);
  servers.push(server);
  return server;
}

/** The first legal action of each env's result (a deterministic policy). */
function legal(results: pac_env.StepResultView[], turn: number): number[] {
  return results.map((r) => {
    const moves: number[] = [];
    r.action_mask.forEach((m, a) => {
      if (m) moves.push(a);
    });
    return moves[(turn * 7) % moves.length] as number;
  });
}

/** A seeded game of `steps` batch steps: a hash of every result and final, and the finals seen. */
async function play(client: Client, steps: number): Promise<{ hash: string; finals: number }> {
  const hash = createHash("sha256");
  const record = (value: pac_env.StepResult): void => {
    hash.update(Buffer.from(pac_env.StepResultCodec.encode(value)));
  };
  let results = (await client.reset(42n)) as pac_env.StepResultView[];
  let finals = 0;
  for (let t = 0; t <= steps; t++) {
    for (const view of results) record(copyOf(view));
    for (const final of client.finals) {
      hash.update(`final ${final.index}`);
      record(final.result);
      finals++;
    }
    if (t === steps) break;
    if (client.autoreset === 0 && results.some((r) => r.done)) {
      results = (await client.reset(1000n + BigInt(t))) as pac_env.StepResultView[];
    } else {
      results = (await client.step(legal(results, t))) as pac_env.StepResultView[];
    }
  }
  return { hash: hash.digest("hex"), finals };
}

/** Owned values of a view (what the view shows now). */
function copyOf(view: pac_env.StepResultView): pac_env.StepResult {
  const out: Record<string, unknown> = {};
  for (const field of pac_env.SCHEMA.ir.structs["StepResult"]!.fields) {
    const value = (view as unknown as Record<string, unknown>)[field.name];
    out[field.name] = ArrayBuffer.isView(value) ? (value as Float32Array).slice() : value;
  }
  return out as unknown as pac_env.StepResult;
}

const LANGS: Array<"node" | "python"> = HAVE_PYTHON ? ["node", "python"] : ["node"];

for (const lang of LANGS) {
  describe(`Node shm:// client, ${lang} server`, () => {
    for (const mode of ["disabled", "next_step", "same_step"] as const) {
      test(`a seeded pac game is byte-identical to unix:// (${mode})`, async () => {
        const shm = await started(lang, shmUrl(4), "--env", "pac");
        const unixUrl = `unix://${join(tmpdir(), `transport-shm-client-${randomBytes(5).toString("hex")}.sock`)}`;
        const unix = await started(lang, unixUrl, "--env", "pac", "--num-envs", "4");
        const overShm = await connect(shm.url, { autoreset: mode });
        const overUnix = await connect(unix.url, { autoreset: mode });
        try {
          assert.equal(overShm.numEnvs, 4);
          assert.equal(overShm.serverInfo["server"], lang);
          assert.equal(overShm.serverInfo["autoreset"], mode);
          const a = await play(overShm, 300);
          const b = await play(overUnix, 300);
          assert.deepEqual(a, b);
          if (mode === "same_step") assert.ok(a.finals > 0, "some episodes ended");
        } finally {
          await overShm.close();
          await overUnix.close();
          await shm.stop();
          await unix.stop();
        }
      });
    }

    test("results are views into the slots; errors are typed; the lease holds", async () => {
      const server = await started(lang, shmUrl(2), "--env", "pac");
      const client = await connect(server.url);
      try {
        const results = (await client.reset(7n)) as pac_env.StepResultView[];
        const channel = client.channel as ShmChannel;
        assert.ok(channel instanceof ShmChannel);
        assert.equal(results[0]!.observation.buffer, channel.region.bytes.buffer, "the observation is the mapping");
        await client.step(legal(results, 1));
        const again = (await client.step(legal(results, 2))) as pac_env.StepResultView[];
        assert.equal(again[0], results[0], "the same view objects every step");
        await assert.rejects(client.step([9999, 0]), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.INVALID_ACTION);
        const masked = again[0]!.action_mask.findIndex((m) => m === 0);
        if (masked >= 0) {
          await assert.rejects(client.step([masked, legal(again, 3)[1]!]), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.MASKED_ACTION);
        }
        await assert.rejects(connect(server.url, { timeoutMs: 500 }), (e: unknown) => e instanceof ConnectError && /in use by this process/.test((e as Error).message));
        assert.equal(await client.health(), true);
        assert.deepEqual(await client.spaces(), { obsN: 612, actN: 92 });
        const copy = (await client.reset(7n, { copy: true })) as pac_env.StepResult[];
        assert.ok(!(copy[0]!.observation.buffer === channel.region.bytes.buffer));
      } finally {
        await client.close();
      }
      // released: a new client takes the lease
      const next = await connect(server.url);
      await next.close();
      await server.stop();
    });

    test("a dead server is PeerGoneError within about a second", async () => {
      const server = await started(lang, shmUrl(1), "--env", "pac");
      const client = await connect(server.url, { timeoutMs: 10_000 });
      await client.reset(1n);
      await server.stop("SIGKILL");
      const start = Date.now();
      await assert.rejects(client.step(0), (e: unknown) => e instanceof PeerGoneError);
      assert.ok(Date.now() - start < 2000, `took ${Date.now() - start} ms`);
      await client.close();
      native().shmUnlink(parseShmUrl(server.url).segment); // SIGKILL leaves the segment behind
    });
  });
}

describe("Node shm:// client, env errors and OBSERVE (Node server)", () => {
  test("an env error names the env; the next request works", async () => {
    const server = await started("faulty", shmUrl(3));
    const client = await connect(server.url);
    try {
      await client.reset();
      await assert.rejects(
        client.step([1, POISON, 1]),
        (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.ENV_ERROR && e.text === "env 1: TypeError: poisoned action (the env was reset)",
      );
      const results = (await client.step([2, 3, 4])) as pac_env.StepResultView[];
      assert.deepEqual(results.map((r) => r.observation[0]), [2, 3, 4]);
    } finally {
      await client.close();
      await server.stop();
    }
  });

  test("OBSERVE rewrites the results in place and carries the info maps", async () => {
    const server = await started("node", shmUrl(2), "--env", "pac");
    const client = await connect(server.url);
    try {
      await assert.rejects(client.observe(), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.NOT_RESET);
      const reset = (await client.reset(3n, { copy: true })) as pac_env.StepResult[];
      const { results, infos } = await client.observe({ copy: true });
      assert.deepEqual(
        (results as pac_env.StepResult[]).map((r) => Buffer.from(pac_env.StepResultCodec.encode(r)).toString("hex")),
        reset.map((r) => Buffer.from(pac_env.StepResultCodec.encode(r)).toString("hex")),
      );
      assert.deepEqual(infos, [{}, {}]);
    } finally {
      await client.close();
      await server.stop();
    }
  });
});
