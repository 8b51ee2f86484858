/**
 * A Node vector env that writes an shm column region's result columns itself (issue 25 item 2,
 * docs/shm.md "Column layout"): with `writesColumns` the server hands the env the region's
 * columns (no copy of the results per step); without it the runtime's private columns are
 * copied over as before. Two real server processes (the same env, with and without the
 * declaration, `--masked-actions noop`, `?checksum=crc32`) must answer every request with the
 * same bytes: lock-step in every auto-reset mode (SAME_STEP finals from the final areas), a
 * masked "noop" action (its penalty written into the reward column), OBSERVE; and the env's
 * info map shows which columns it was handed (the region's, or private ones).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { resolve } from "node:path";
import { after, before, describe, test } from "node:test";

import type { AnyStructCodec } from "../codec";
import * as image_columns from "../generated/image_columns";
import { type Client, connect } from "../index";
import { shmColumns } from "../ir";
import { ServerProcess } from "../testing/servers";

const SCHEMA = image_columns.SCHEMA;
const RESULT = SCHEMA.structs["StepResult"] as AnyStructCodec;
const ENV_MODULE = resolve(__dirname, "shm_columns_fastpath_env.js");
const N = 4;
const MASKED = 17;

type Row = Record<string, unknown>;

const servers: ServerProcess[] = [];
let direct: ServerProcess;
let rows: ServerProcess;

before(async () => {
  const id = `${process.pid}-${randomBytes(4).toString("hex")}`;
  const start = (factory: string, tag: string): Promise<ServerProcess> =>
    ServerProcess.start(
      "node",
      `shm://fastpath-cols-${tag}-${id}?num_envs=${N}&checksum=crc32`,
      "--env",
      `${ENV_MODULE}:${factory}`,
      "--schema",
      "image_columns",
      "--num-envs",
      String(N),
      "--masked-actions",
      "noop",
    );
  direct = await start("VectorImages", "d");
  servers.push(direct);
  rows = await start("VectorImagesRows", "r");
  servers.push(rows);
});

after(async () => {
  for (const server of servers) await server.stop();
});

function bytesOf(result: unknown): Buffer {
  const view = result as Row;
  const values: Row = {};
  for (const f of SCHEMA.ir.structs["StepResult"]!.fields) values[f.name] = view[f.name];
  return Buffer.from(RESULT.encode(values));
}

function list(results: unknown): unknown[] {
  return Array.isArray(results) ? results : [results];
}

/** The same script on both clients: every result, final and OBSERVE equal; the episodes ended. */
async function sameTrace(a: Client<unknown, unknown>, b: Client<unknown, unknown>, disabled: boolean): Promise<number> {
  assert.deepEqual(list(await a.reset(7n)).map(bytesOf), list(await b.reset(7n, { copy: true })).map(bytesOf));
  let ended = 0;
  for (let t = 0; t < 12; t++) {
    // env 1's action at t = 2 is masked out: a "noop" (no step, reward = the penalty)
    const actions = Array.from({ length: N }, (_, i) => (t === 2 && i === 1 ? MASKED : (t * 5 + i * 3) % MASKED));
    const va = list(await a.step(actions)).map(bytesOf);
    const resultsB = list(await b.step(actions, { copy: true }));
    assert.deepEqual(va, resultsB.map(bytesOf), `step ${t}`);
    if (t === 2) assert.equal((resultsB[1] as Row)["reward"], -2, "the noop's penalty");
    assert.deepEqual(
      a.finals.map((f) => [f.index, bytesOf(f.result)]),
      b.finals.map((f) => [f.index, bytesOf(f.result)]),
      `finals of step ${t}`,
    );
    ended += a.finals.length;
    if (disabled && resultsB.some((r) => (r as Row)["terminated"])) {
      assert.deepEqual(list(await a.reset(BigInt(t))).map(bytesOf), list(await b.reset(BigInt(t), { copy: true })).map(bytesOf));
      ended++;
    }
  }
  const oa = await a.observe();
  const ob = await b.observe({ copy: true });
  assert.deepEqual(list(oa.results).map(bytesOf), list(ob.results).map(bytesOf), "OBSERVE");
  return ended;
}

describe("a Node vector env writing an shm column region's columns (writesColumns)", () => {
  for (const mode of ["disabled", "next_step", "same_step"] as const) {
    test(`the same bytes as the copying server (${mode})`, async () => {
      const a = await connect<unknown, unknown>(direct.url, { schema: SCHEMA, autoreset: mode });
      const b = await connect<unknown, unknown>(rows.url, { schema: SCHEMA, autoreset: mode });
      try {
        const ended = await sameTrace(a, b, mode === "disabled");
        if (mode !== "next_step") assert.ok(ended > 0, "episodes ended");
      } finally {
        await a.close();
        await b.close();
      }
    });
  }

  test("the env was handed the region's columns (no copy); without writesColumns, private ones", async () => {
    const start = shmColumns(SCHEMA.ir, N).columns.find((c) => c.key === "StepResult.observation")?.start;
    assert.ok(start !== undefined && start > 0);
    for (const [server, expected] of [[direct, start], [rows, 0]] as const) {
      const client = await connect<unknown, unknown>(server.url, { schema: SCHEMA });
      try {
        await client.reset(1n);
        await client.step([0, 1, 2, 3]);
        const { infos } = await client.observe();
        assert.deepEqual(
          infos.map((info) => info["observation_offset"]),
          new Array(N).fill(expected),
          server === direct ? "the region's observation column" : "a private column",
        );
      } finally {
        await client.close();
      }
    }
  });
});
