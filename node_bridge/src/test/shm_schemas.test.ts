/**
 * shm:// for every schema (Node server and Node client, separate processes): tetris, mahjong and
 * gridworld (the newcomer schema: multi-dimensional arrays, an f64) run over their derived
 * layouts (results encoded in place, views into the slots) with the same traces as over unix://, SAME_STEP finals included; STEP_MULTI of a one-env `stepBatch` game on
 * shm:// (a region with 8 slots) answers like the stream backends.
 */

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, describe, test } from "node:test";

import { ShmChannel } from "../backends/shm/channel";
import { ShmLayout, parseShmUrl, schemaArea } from "../backends/shm/region";
import type { SchemaModule } from "../codec";
import * as gridworld from "../generated/gridworld";
import * as mahjong_env from "../generated/mahjong_env";
import * as pac_env from "../generated/pac_env";
import * as tetris from "../generated/tetris";
import { type Client, connect } from "../index";
import { type ModuleServer, ServerProcess } from "../testing/servers";

const ENVS = resolve(__dirname, "..", "testing", "envs.js");
const GENERATED = resolve(__dirname, "..", "generated");

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop("SIGKILL");
});

async function started(what: ModuleServer, url: string): Promise<ServerProcess> {
  const server = await ServerProcess.start(what, url);
  servers.push(server);
  return server;
}

function urls(numEnvs: number): { shm: string; unix: string } {
  const id = randomBytes(5).toString("hex");
  return { shm: `shm://node-schemas-${id}?num_envs=${numEnvs}`, unix: `unix://${join(tmpdir(), `transport-schemas-${id}.sock`)}` };
}

interface Case {
  readonly schema: SchemaModule;
  readonly module: string;
  readonly factory: string;
  readonly mode: "disabled" | "next_step" | "same_step";
}

const CASES: Record<string, Case> = {
  tetris: { schema: tetris.SCHEMA, module: "tetris", factory: "makeTetris", mode: "next_step" },
  mahjong: { schema: mahjong_env.SCHEMA, module: "mahjong_env", factory: "makeMahjongTable", mode: "same_step" },
  gridworld: { schema: gridworld.SCHEMA, module: "gridworld", factory: "makeGridWorld", mode: "same_step" },
};

/** A legal action of a result: the `turn`-th legal one (mask as bytes or booleans). */
function legal(result: Record<string, unknown>, turn: number): number {
  const mask = result["action_mask"] as ArrayLike<number | boolean>;
  const moves: number[] = [];
  for (let a = 0; a < mask.length; a++) if (mask[a]) moves.push(a);
  return (moves[(turn * 7) % moves.length] ?? 0) as number;
}

/** A seeded trace: the hash of every result (owned copies) and final. */
async function trace(client: Client<unknown, unknown>, schema: SchemaModule, steps: number): Promise<{ hash: string; finals: number }> {
  const codec = schema.structs[schema.ir.env!.result]!;
  const hash = createHash("sha256");
  let finals = 0;
  let results = (await client.reset(11n, { copy: true })) as Array<Record<string, unknown>>;
  for (let t = 0; ; t++) {
    for (const r of results) hash.update(Buffer.from(codec.encode(r)));
    for (const final of client.finals) {
      hash.update(`final ${final.index}`);
      hash.update(Buffer.from(codec.encode(final.result)));
      finals++;
    }
    if (t === steps) break;
    results = (await client.step(results.map((r) => legal(r, t)), { copy: true })) as Array<Record<string, unknown>>;
  }
  return { hash: hash.digest("hex"), finals };
}

for (const [name, c] of Object.entries(CASES)) {
  describe(`${name} over shm:// (derived layout)`, () => {
    test(`the same seeded trace as over unix:// (${c.mode}), results in place`, async () => {
      const where = urls(3);
      const what = { module: ENVS, factory: c.factory, numEnvs: 3, schemaModule: join(GENERATED, `${c.module}.js`) };
      const shm = await started(what, where.shm);
      const unix = await started(what, where.unix);
      const overShm = await connect<unknown, unknown>(shm.url, { schema: c.schema, autoreset: c.mode });
      const overUnix = await connect<unknown, unknown>(unix.url, { schema: c.schema, autoreset: c.mode });
      try {
        const layout = ShmLayout.of(c.schema);
        assert.equal(layout.ir.profile, "derived");
        assert.equal(statSync(parseShmUrl(shm.url).path).size, layout.regionSize(3) + schemaArea(c.schema).byteLength);
        const channel = overShm.channel as ShmChannel;
        const views = (await overShm.reset(11n)) as Array<{ observation: Float32Array }>;
        assert.equal(views[0]!.observation.buffer, channel.region.bytes.buffer, "the observation is the mapping");
        const a = await trace(overShm, c.schema, 40);
        const b = await trace(overUnix, c.schema, 40);
        assert.deepEqual(a, b);
        if (c.mode === "same_step") assert.ok(a.finals > 0, "episodes ended");
        assert.deepEqual(await overShm.spaces(), await overUnix.spaces());
      } finally {
        await overShm.close();
        await overUnix.close();
        await shm.stop();
        await unix.stop();
      }
    });
  });
}

describe("STEP_MULTI over shm:// (a one-env stepBatch game)", () => {
  test("one action per seat in slots 0..7, one stepBatch call, the seat results in place", async () => {
    const where = urls(1);
    const what = { module: ENVS, factory: "makeSelfPlay", numEnvs: 1 };
    const shm = await started(what, where.shm);
    const unix = await started(what, where.unix);
    const overShm = await connect(shm.url);
    const overUnix = await connect(unix.url);
    try {
      const layout = ShmLayout.of(pac_env.SCHEMA);
      assert.equal(statSync(parseShmUrl(shm.url).path).size, layout.regionSize(8) + schemaArea(pac_env.SCHEMA).byteLength, "8 seat slots");
      assert.equal(overShm.numEnvs, 1);
      await overShm.reset(1n);
      await overUnix.reset(1n);
      const actions = [3, 1, 4, 1, 5, 9, 2, 6];
      const seats = (await overShm.stepMulti(actions)) as pac_env.StepResultView[];
      assert.deepEqual(seats.map((s) => s.observation[0]), actions);
      assert.deepEqual(seats.map((s) => s.rank), [0, 1, 2, 3, 4, 5, 6, 7]);
      const stream = (await overUnix.stepMulti(actions, { copy: true })) as pac_env.StepResult[];
      const owned = (await overShm.stepMulti([0, 0, 0, 0, 0, 0, 0, 0], { copy: true })) as pac_env.StepResult[];
      const again = (await overUnix.stepMulti([0, 0, 0, 0, 0, 0, 0, 0], { copy: true })) as pac_env.StepResult[];
      const hex = (rs: pac_env.StepResult[]): string[] => rs.map((r) => Buffer.from(pac_env.StepResultCodec.encode(r)).toString("hex"));
      assert.deepEqual(hex(owned), hex(again));
      assert.equal(stream.length, 8);
      const single = (await overShm.step(7)) as pac_env.StepResultView; // a plain STEP uses slot 0 only
      assert.equal(single.observation[0], 7);
    } finally {
      await overShm.close();
      await overUnix.close();
      await shm.stop();
      await unix.stop();
    }
  });
});
