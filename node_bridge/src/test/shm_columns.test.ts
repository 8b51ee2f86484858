/**
 * The shm column layout (issue 25 item 2; docs/shm.md "Column layout"): `[env] shm = "columns"`
 * keeps each request / result field of all envs contiguous after the final areas.
 *
 * - the layout math (ir.ts `shmColumns`, ShmLayout.regionSize / slotsIn) against a hand-computed
 *   tiny schema, and the conformance testee's "columns" op answering it byte for byte;
 * - a Node server (the contract env on image_columns, a real process) serving a column region:
 *   a Node client gets the results of the same env over unix://, lock-step, every auto-reset
 *   mode, N = 1 and N = 4, SEND / RECV too, with `?checksum=crc32` chained over the columns;
 * - the client's column arrays and per-env views are the mapping itself (no copy), one
 *   contiguous block per field.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { statSync, truncateSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import * as zlib from "node:zlib";

import { Decoder, Encoder } from "@msgpack/msgpack";

import { ShmChannel } from "../backends/shm/channel";
import { columnsArea } from "../backends/shm/columns";
import { CB, LAYOUT_VERSION, MAGIC, Region, RegionState, ShmLayout, SlotChecksums, off, parseShmUrl, procStartTime, schemaArea } from "../backends/shm/region";
import { RegionMismatchError } from "../errors";
import { type AnyStructCodec } from "../codec";
import { FrameReader, frame } from "../conformance/frames";
import { computeFingerprint } from "../fingerprint";
import * as image_columns from "../generated/image_columns";
import { type Client, connect } from "../index";
import { type SchemaJson, shmColumns } from "../ir";
import { ServerProcess } from "../testing/servers";

const SCHEMA = image_columns.SCHEMA;
const RESULT = SCHEMA.structs["StepResult"] as AnyStructCodec;
const OBS = 3 * 84 * 84;
const TESTEE = resolve(__dirname, "..", "conformance", "testee.js");

// -- a tiny column schema, its layout computed by hand ---------------------------------------------

const field = (name: string, type: string, offset: number, size: number, count = 1, role?: string): Record<string, unknown> => ({
  name,
  type,
  offset,
  size,
  count,
  ...(role === undefined ? {} : { role }),
});

/** Request {action: i32}, result {obs: f32[3], done: u8} (16 bytes), slot 1344, final 128. */
function tinyIr(): SchemaJson {
  const ir = {
    name: "tiny_columns",
    version: 1,
    fingerprint: "",
    structs: {
      StepResult: { size: 16, align: 4, layout: "natural", fields: [field("obs", "f32[3]", 0, 12, 3, "observation"), field("done", "u8", 12, 1, 1, "done")] },
      StepRequest: { size: 4, align: 4, layout: "natural", fields: [field("action", "i32", 0, 4, 1, "action")] },
      ShmControl: { size: 64, align: 8, layout: "natural", fields: [field("magic", "u32", 0, 4)] },
      ShmSlot: { size: 1344, align: 64, layout: "natural", fields: [field("sem_action_ready", "u32", 0, 4), field("info", "u8[256]", 1088, 256, 256)] },
      ShmFinal: { size: 128, align: 64, layout: "natural", fields: [field("final_seq", "u32", 0, 4), field("result", "StepResult", 64, 16)] },
    },
    enums: {},
    messages: {},
    env: { result: "StepResult", request: "StepRequest", multi_request: "StepRequest", multi_result: "StepResult", seats: 1 },
    shm: {
      profile: "columns",
      control: "ShmControl",
      slot: "ShmSlot",
      final: "ShmFinal",
      request_offsets: {},
      result_offsets: {},
      final_result_offsets: { obs: 64, done: 76 },
      layout: "columns",
    },
  };
  return { ...ir, fingerprint: computeFingerprint(ir as unknown as SchemaJson).hex } as unknown as SchemaJson;
}

/** k = 3: C0 = 64 + 3 x (1344 + 128) = 4480; action 4480..4492, obs at 4544 (36 bytes), done at
 * 4608 (3 bytes); the region ends at 4611 rounded up to 64 = 4672. */
const TINY_K = 3;
const TINY = { c0: 4480, size: 4672, offsets: { "StepRequest.action": 4480, "StepResult.obs": 4544, "StepResult.done": 4608 } };

function tinyRecords(): { requests: Uint8Array[]; results: Uint8Array[]; area: Uint8Array } {
  const requests: Uint8Array[] = [];
  const results: Uint8Array[] = [];
  const area = new Uint8Array(TINY.size - TINY.c0);
  const adv = new DataView(area.buffer);
  for (let i = 0; i < TINY_K; i++) {
    const req = new Uint8Array(4);
    new DataView(req.buffer).setInt32(0, -7 * (i + 1), true);
    requests.push(req);
    adv.setInt32(4480 - TINY.c0 + 4 * i, -7 * (i + 1), true);
    const res = new Uint8Array(16);
    const dv = new DataView(res.buffer);
    for (let j = 0; j < 3; j++) {
      dv.setFloat32(4 * j, i * 10 + j + 0.5, true);
      adv.setFloat32(4544 - TINY.c0 + 12 * i + 4 * j, i * 10 + j + 0.5, true);
    }
    res[12] = i % 2;
    area[4608 - TINY.c0 + i] = i % 2;
    results.push(res);
  }
  return { requests, results, area };
}

/** One request to a fresh Node testee process: its answer. */
async function askTestee(requests: Array<Record<string, unknown>>): Promise<Array<Record<string, unknown>>> {
  const proc = spawn(process.execPath, [TESTEE], { stdio: ["pipe", "pipe", "inherit"] });
  const encoder = new Encoder({ useBigInt64: true });
  const decoder = new Decoder({ useBigInt64: true });
  const reader = new FrameReader();
  const answers: Array<Record<string, unknown>> = [];
  const done = new Promise<void>((ok, fail) => {
    proc.stdout.on("data", (chunk: Buffer) => {
      for (const body of reader.push(chunk)) answers.push(decoder.decode(body) as Record<string, unknown>);
      if (answers.length === requests.length) ok();
    });
    proc.once("exit", (code) => (answers.length === requests.length ? ok() : fail(new Error(`testee exited with ${code}`))));
  });
  for (const request of requests) proc.stdin.write(frame(encoder.encode(request)));
  await done;
  proc.stdin.end();
  return answers;
}

describe("the column layout's math", () => {
  test("shmColumns and columnsArea: the hand-computed layout of a tiny schema", () => {
    const ir = tinyIr();
    const { columns, size } = shmColumns(ir, TINY_K);
    assert.equal(size, TINY.size);
    assert.deepEqual(Object.fromEntries(columns.map((c) => [c.key, c.start])), TINY.offsets);
    const { requests, results, area } = tinyRecords();
    const answer = columnsArea(ir, TINY_K, requests, results);
    assert.equal(answer.regionSize, TINY.size);
    assert.deepEqual(answer.offsets, TINY.offsets);
    assert.deepEqual(Buffer.from(answer.area), Buffer.from(area));
  });

  test("the testee's columns op answers the hand-computed bytes (integers on the wire)", async () => {
    const ir = tinyIr();
    const { requests, results, area } = tinyRecords();
    const [loaded, answer, refused, tooFew, tooShort] = await askTestee([
      { op: "load", ir: JSON.stringify(ir) },
      { op: "columns", schema: "tiny_columns", slots: TINY_K, requests, results },
      { op: "columns", schema: "pac_env", slots: 1, requests: [], results: [] },
      { op: "columns", schema: "tiny_columns", slots: 2, requests, results },
      { op: "columns", schema: "tiny_columns", slots: TINY_K, requests, results: [results[0], results[1], new Uint8Array(15)] },
      { op: "exit" },
    ]);
    assert.equal(tooFew!["ok"], false);
    assert.match(String(tooFew!["error"]), /3 records for 2 slots/);
    assert.equal(tooShort!["ok"], false);
    assert.match(String(tooShort!["error"]), /result record 2 is 15 bytes, StepResult is 16/);
    assert.equal(loaded!["ok"], true, String(loaded!["error"]));
    assert.equal(answer!["ok"], true, String(answer!["error"]));
    assert.equal(answer!["region_size"], BigInt(TINY.size), "region_size is a msgpack integer");
    const offsets = answer!["offsets"] as Record<string, unknown>;
    assert.deepEqual(offsets, Object.fromEntries(Object.entries(TINY.offsets).map(([k, v]) => [k, BigInt(v)])));
    assert.deepEqual(Buffer.from(answer!["area"] as Uint8Array), Buffer.from(area));
    assert.equal(refused!["ok"], false);
    assert.match(String(refused!["error"]), /no column shm layout/);
  });

  test("image_columns: region size, slot count from a size, checksum-free fields", () => {
    const layout = ShmLayout.of(SCHEMA);
    assert.equal(layout.columns, true);
    assert.equal(layout.slotSize, 1344);
    for (const k of [1, 2, 3, 4, 8, 17, 256]) {
      const perEnv = 1344 + layout.finalSize;
      let at = 64 + k * perEnv;
      for (const size of [4, OBS, 18, 4, 1, 1]) at = Math.ceil(at / 64) * 64 + k * size; // action, then the result fields
      assert.equal(layout.regionSize(k), Math.ceil(at / 64) * 64, `k=${k}`);
      assert.equal(layout.slotsIn(layout.regionSize(k)), k);
      assert.equal(layout.slotsIn(layout.regionSize(k) + 64), null, "a size that fits no k");
    }
    assert.equal(layout.slotsIn(100), null);
  });
});

// -- a Node server over a column region against the same env over unix:// --------------------------

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop(); // SIGTERM: the server removes its segment or socket
});

interface Pair {
  readonly shm: ServerProcess;
  readonly unix: ServerProcess;
}

const pairs = new Map<number, Pair>();

before(async () => {
  for (const n of [1, 4, 8]) {
    const id = `${process.pid}-${randomBytes(4).toString("hex")}`;
    const args = ["--env", "contract", "--schema", "image_columns", "--num-envs", String(n)];
    const shm = await ServerProcess.start("node", `shm://node-columns-${id}?num_envs=${n}&checksum=crc32`, ...args);
    servers.push(shm);
    const unix = await ServerProcess.start("node", `unix://${join(tmpdir(), `transport-columns-${id}.sock`)}`, ...args);
    servers.push(unix);
    pairs.set(n, { shm, unix });
  }
});

type Row = Record<string, unknown>;

function bytesOf(result: unknown): Buffer {
  const view = result as Row;
  const values: Row = {};
  for (const f of SCHEMA.ir.structs["StepResult"]!.fields) values[f.name] = view[f.name];
  return Buffer.from(RESULT.encode(values));
}

/** Seeded steps on both clients: every result (shm: the zero-copy views), final and error equal. */
function list(results: unknown): unknown[] {
  return Array.isArray(results) ? results : [results];
}

/** A legal action of a result other than the contract env's poison (1): the `turn`-th one. */
function legal(result: unknown, turn: number): number {
  const mask = (result as Row)["action_mask"] as Uint8Array;
  const moves: number[] = [];
  for (let a = 0; a < mask.length; a++) if (mask[a] && a !== 1) moves.push(a);
  return moves[(turn * 7) % moves.length] ?? 0;
}

/** The episodes that ended (SAME_STEP finals, or resets after an end with auto-reset disabled). */
async function sameTrace(shm: Client<unknown, unknown>, unix: Client<unknown, unknown>, n: number, steps: number, disabled: boolean): Promise<number> {
  const a = list(await shm.reset(7n));
  let b = list(await unix.reset(7n, { copy: true }));
  assert.deepEqual(a.map(bytesOf), b.map(bytesOf));
  let finals = 0;
  for (let t = 0; t < steps; t++) {
    // action 1 is the contract env's poison (ENV_ERROR): env 0's at t = 5
    const actions = b.map((r, i) => (t === 5 && i === 0 ? 1 : legal(r, t + i)));
    let va: unknown[] | Error;
    let vb: unknown[] | Error;
    try {
      va = list(await shm.step(n === 1 ? (actions[0] as number) : actions));
    } catch (error) {
      va = error as Error;
    }
    try {
      vb = list(await unix.step(n === 1 ? (actions[0] as number) : actions, { copy: true }));
      b = vb;
    } catch (error) {
      vb = error as Error;
    }
    if (va instanceof Error || vb instanceof Error) {
      assert.ok(va instanceof Error && vb instanceof Error, `step ${t}: ${String(va)} vs ${String(vb)}`);
      assert.equal(va.constructor.name, vb.constructor.name);
      continue;
    }
    assert.deepEqual(va.map(bytesOf), vb.map(bytesOf), `step ${t}`);
    assert.deepEqual(
      shm.finals.map((f) => [f.index, bytesOf(f.result)]),
      unix.finals.map((f) => [f.index, bytesOf(f.result)]),
      `finals of step ${t}`,
    );
    finals += shm.finals.length;
    if (disabled && vb.some((r) => (r as Row)["terminated"] || (r as Row)["truncated"])) {
      // auto-reset disabled: an ended episode is reset by the client
      assert.deepEqual(list(await shm.reset(BigInt(t))).map(bytesOf), (b = list(await unix.reset(BigInt(t), { copy: true }))).map(bytesOf));
      finals++;
    }
  }
  return finals;
}

for (const n of [1, 4]) {
  describe(`a Node server over a column region, N=${n}`, () => {
    for (const mode of ["disabled", "next_step", "same_step"] as const) {
      test(`the same results as over unix:// (${mode})`, async () => {
        const { shm, unix } = pairs.get(n)!;
        const overShm = await connect<unknown, unknown>(shm.url, { schema: SCHEMA, autoreset: mode });
        const overUnix = await connect<unknown, unknown>(unix.url, { schema: SCHEMA, autoreset: mode });
        try {
          const ended = await sameTrace(overShm, overUnix, n, 14, mode === "disabled");
          if (mode !== "next_step") assert.ok(ended > 0, "episodes ended (SAME_STEP: finals from the final areas)");
          assert.deepEqual(await overShm.spaces(), await overUnix.spaces());
        } finally {
          await overShm.close();
          await overUnix.close();
        }
      });
    }
  });
}

describe("column views", () => {
  test("the region is the column layout's size; columns and views are the mapping (no copy)", async () => {
    const n = 4;
    const { shm } = pairs.get(n)!;
    const client = await connect<unknown, unknown>(shm.url, { schema: SCHEMA });
    try {
      const layout = ShmLayout.of(SCHEMA);
      assert.equal(statSync(parseShmUrl(shm.url).path).size, layout.regionSize(n) + schemaArea(SCHEMA).byteLength);
      const channel = client.channel as ShmChannel;
      const mapping = channel.region.bytes.buffer;
      const views = (await client.reset(3n)) as Array<Record<string, unknown>>;
      const columns = client.columns()!;
      const obs = columns["observation"] as Uint8Array;
      const start = channel.region.resultColumns["observation"]!.start;
      assert.ok(obs instanceof Uint8Array && obs.buffer === mapping, "the observation column is the mapping");
      assert.equal(obs.byteOffset, start);
      assert.equal(obs.length, n * OBS, "one contiguous block: N x 3 x 84 x 84");
      const reward = columns["reward"] as Float32Array;
      assert.ok(reward instanceof Float32Array && reward.buffer === mapping && reward.length === n);
      assert.equal(reward.byteOffset % 64, 0);
      for (let i = 0; i < n; i++) {
        const view = views[i]!["observation"] as Uint8Array;
        assert.equal(view.buffer, mapping, "env i's view is the mapping");
        assert.equal(view.byteOffset, start + i * OBS, "env i's value is row i of the column");
        assert.equal(views[i]!["reward"], reward[i]);
      }
      // the next step rewrites the same memory: the arrays kept from before see it (no copy)
      const before = Buffer.from(obs);
      const copies = (await client.step([2, 3, 4, 5], { copy: true })) as Row[];
      assert.notDeepEqual(Buffer.from(obs), before);
      for (let i = 0; i < n; i++) {
        assert.deepEqual(Buffer.from(obs.subarray(i * OBS, (i + 1) * OBS)), Buffer.from(copies[i]!["observation"] as Uint8Array));
        assert.notEqual((copies[i]!["observation"] as Uint8Array).buffer, mapping, "copy: true owns its values");
      }
      // ?checksum=crc32: env i's word is CRC-32 chained over its value in each result column
      const region = channel.region;
      for (let i = 0; i < n; i++) {
        let crc = 0;
        for (const f of SCHEMA.ir.structs["StepResult"]!.fields) {
          const at = region.resultColumns[f.name]!.start + i * f.size;
          crc = (zlib as unknown as { crc32: (d: Uint8Array, v: number) => number }).crc32(region.bytes.subarray(at, at + f.size), crc);
        }
        assert.equal(region.dv.getUint32(region.slotAt(i, "checksum"), true), crc >>> 0, `env ${i}'s checksum`);
      }
      // a write into a result column after the server published: the checksum check names it
      const checks = new SlotChecksums(region);
      assert.equal(checks.firstBad(n), -1);
      const rewardAt = region.resultColumns["reward"]!.start + 2 * 4;
      const kept = region.dv.getFloat32(rewardAt, true);
      region.dv.setFloat32(rewardAt, kept + 1, true);
      assert.equal(checks.firstBad(n), 2);
      region.dv.setFloat32(rewardAt, kept, true);
      // the actions are in the request column (the server read them there)
      const action = region.requestColumns["action"]!;
      assert.deepEqual(Array.from(new Int32Array(mapping, action.start, n)), [2, 3, 4, 5]);
    } finally {
      await client.close();
    }
  });

  test("STEP_MULTI over an 8-env column region: one seat action per slot in the action column", async () => {
    const { shm, unix } = pairs.get(8)!;
    const overShm = await connect<unknown, unknown>(shm.url, { schema: SCHEMA });
    const overUnix = await connect<unknown, unknown>(unix.url, { schema: SCHEMA });
    try {
      await overShm.reset(3n);
      const b = (await overUnix.reset(3n, { copy: true })) as unknown[];
      const actions = b.map((r, i) => legal(r, i));
      const a = (await overShm.stepMulti(actions)) as unknown[];
      const c = (await overUnix.stepMulti(actions, { copy: true })) as unknown[];
      assert.deepEqual(a.map(bytesOf), c.map(bytesOf));
      const region = (overShm.channel as ShmChannel).region;
      assert.deepEqual(Array.from(new Int32Array(region.bytes.buffer, region.requestColumns["action"]!.start, 8)), actions);
    } finally {
      await overShm.close();
      await overUnix.close();
    }
  });

  test("SEND / RECV over a column region: the results of the same env over unix://", async () => {
    const n = 4;
    const { shm, unix } = pairs.get(n)!;
    const overShm = await connect<unknown, unknown>(shm.url, { schema: SCHEMA });
    const overUnix = await connect<unknown, unknown>(unix.url, { schema: SCHEMA });
    try {
      await overShm.reset(9n);
      await overUnix.reset(9n);
      for (let t = 0; t < 3; t++) {
        const ids = t % 2 === 0 ? [0, 2] : [1, 3];
        const actions = ids.map((i) => (i + t) % 18 === 1 ? 4 : (i + t) % 18);
        await overShm.send(actions, ids);
        await overUnix.send(actions, ids);
        const a = await overShm.recv(2);
        const b = await overUnix.recv(2);
        const byId = (r: { results: unknown[]; envIds: number[] }): Array<[number, Buffer]> =>
          r.envIds.map((id, k): [number, Buffer] => [id, bytesOf(r.results[k])]).sort((x, y) => x[0] - y[0]);
        assert.deepEqual(byId(a), byId(b));
      }
    } finally {
      await overShm.close();
      await overUnix.close();
    }
  });
});

describe("a pooled Node server (--workers 2) over a column region", () => {
  test("lock-step SAME_STEP and SEND / RECV: the results of the same env over unix://", async () => {
    const n = 4;
    const id = `${process.pid}-${randomBytes(4).toString("hex")}`;
    const args = ["--env", "contract", "--schema", "image_columns", "--num-envs", String(n)];
    const pooled = await ServerProcess.start("node", `shm://node-columns-pool-${id}?num_envs=${n}&checksum=crc32`, ...args, "--workers", "2");
    servers.push(pooled);
    const { unix } = pairs.get(n)!;
    const overShm = await connect<unknown, unknown>(pooled.url, { schema: SCHEMA, autoreset: "same_step" });
    const overUnix = await connect<unknown, unknown>(unix.url, { schema: SCHEMA, autoreset: "same_step" });
    try {
      assert.ok((await sameTrace(overShm, overUnix, n, 12, false)) > 0, "episodes ended");
      const b = (await overUnix.reset(2n, { copy: true })) as unknown[];
      await overShm.reset(2n);
      const actions = [legal(b[1], 0), legal(b[3], 0)];
      await overShm.send(actions, [1, 3]);
      await overUnix.send(actions, [1, 3]);
      const byId = (r: { results: unknown[]; envIds: number[] }): string[] => r.envIds.map((e, k) => `${e}:${bytesOf(r.results[k]).toString("hex")}`).sort();
      assert.deepEqual(byId(await overShm.recv(2)), byId(await overUnix.recv(2)));
    } finally {
      await overShm.close();
      await overUnix.close();
    }
  });
});

describe("a column region of the wrong size", () => {
  /** A READY column region of k slots whose control block says `numEnvs` envs (this process owns it). */
  function fakeRegion(k: number, numEnvs: number): { url: string; region: Region } {
    const url = `shm://node-columns-bad-${process.pid}-${randomBytes(4).toString("hex")}`;
    const layout = ShmLayout.of(SCHEMA);
    const region = Region.create(parseShmUrl(url), layout, k, schemaArea(SCHEMA));
    const dv = region.dv;
    dv.setUint32(off(CB, "owner_pid"), process.pid, true);
    dv.setBigUint64(off(CB, "owner_start_time"), procStartTime(process.pid), true);
    dv.setUint32(off(CB, "magic"), MAGIC, true);
    dv.setUint32(off(CB, "version"), LAYOUT_VERSION, true);
    dv.setUint32(off(CB, "num_envs"), numEnvs, true);
    dv.setUint32(off(CB, "obs_size"), layout.obsSize, true);
    dv.setUint32(off(CB, "act_size"), layout.actSize, true);
    dv.setUint32(off(CB, "slot_size"), layout.slotSize, true);
    dv.setBigUint64(off(CB, "fingerprint"), SCHEMA.fingerprint, true);
    Atomics.store(region.words, region.cbWord("state"), RegionState.READY);
    return { url, region };
  }

  test("fewer column slots than envs, or a size that fits no k: RegionMismatchError", async () => {
    for (const grow of [0, 64]) {
      const { url, region } = fakeRegion(3, 4);
      try {
        if (grow) truncateSync(parseShmUrl(url).path, region.size + grow); // fits no k (and no schema area)
        await assert.rejects(ShmChannel.open(url, { schema: SCHEMA, timeoutMs: 2000 }), (error: unknown) => {
          assert.ok(error instanceof RegionMismatchError, String(error));
          assert.equal(error.field, "region size");
          assert.match(error.message, /the columns, k >= 4/);
          return true;
        });
      } finally {
        region.unlinkIfOurs();
        region.unmap();
      }
    }
  });
});
