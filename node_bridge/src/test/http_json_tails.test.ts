/**
 * JSON answers (`Accept: application/json`) of responses with a tail, Node server: exactly one
 * row per result, and the tail rendered as JSON (docs/protocol.md, "JSON answers").
 *
 * Regression: the server cut the whole body into records, tails included, so a RECV_RESP (its
 * msgpack `[env ids, ended ids, finals]`), a SAME_STEP step response (`u32 k` + k final results)
 * and an OBSERVE_RESP (msgpack infos) came back with made-up rows and without the env ids, the
 * final results or the infos. The Python server answers the same JSON (tests/test_http_json_tails.py
 * compares both on the same script).
 */

import assert from "node:assert/strict";
import * as http from "node:http";
import { after, before, describe, test } from "node:test";

import { encode as msgpackEncode } from "@msgpack/msgpack";

import { stringifyJson } from "../backends/http/wire";
import { LockEnv } from "../envs";
import * as multidiscrete from "../generated/multidiscrete";
import { type Server, serve } from "../index";
import { fingerprintHex16 } from "../protocol";

const N = 6;
const FP = fingerprintHex16(multidiscrete.SCHEMA.fingerprint);
const SAME_STEP = 2;

type Json = Record<string, unknown>;
type Row = Record<string, unknown>;
type Final = { env_id: number; result: Row };

/** One keep-alive connection (its own envs) that posts JSON and reads JSON answers. */
class JsonSession {
  readonly agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

  constructor(readonly port: number) {}

  post(method: string, body: unknown = null, raw: Buffer | null = null): Promise<[number, Json]> {
    const data = raw ?? Buffer.from(body === null ? "" : stringifyJson(body), "utf8"); // u64s exact
    const headers: http.OutgoingHttpHeaders = { Accept: "application/json", "Content-Length": String(data.byteLength) };
    if (raw === null) headers["Content-Type"] = "application/json";
    if (method !== "hello") headers["X-Transport-Fingerprint"] = FP;
    return new Promise((resolve, reject) => {
      const req = http.request({ host: "127.0.0.1", port: this.port, method: "POST", path: `/v1/${method}`, agent: this.agent, headers }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => resolve([res.statusCode ?? 0, JSON.parse(Buffer.concat(chunks).toString("utf8")) as Json]));
      });
      req.on("error", reject);
      req.end(data);
    });
  }

  async ok(method: string, body: unknown = null, raw: Buffer | null = null): Promise<Json> {
    const [status, answer] = await this.post(method, body, raw);
    assert.equal(status, 200, JSON.stringify(answer));
    return answer;
  }

  static async open(port: number, flags: number): Promise<JsonSession> {
    const session = new JsonSession(port);
    const hello = await session.ok("hello", { protocol_version: 0x0100, flags, fingerprint: multidiscrete.SCHEMA.fingerprint });
    assert.equal(hello.fingerprint, FP);
    return session;
  }

  close(): void {
    this.agent.destroy();
  }
}

/** Env i sets its dials to (i % 3, i % 4, i % 5) every step: episodes end by the time limit. */
const actions = (): Array<{ dials: number[] }> => Array.from({ length: N }, (_, i) => ({ dials: [i % 3, i % 4, i % 5] }));

describe("JSON answers render tails, never made-up rows (Node http:// server)", () => {
  let server: Server;
  let port: number;
  before(async () => {
    server = await serve(() => new LockEnv(), "http://127.0.0.1:0", { numEnvs: N, schema: multidiscrete.SCHEMA });
    port = Number(server.url.slice(server.url.lastIndexOf(":") + 1));
  });
  after(async () => {
    await server.close();
  });

  test("RECV: B results, their env ids, the finals", async () => {
    const session = await JsonSession.open(port, SAME_STEP);
    try {
      await session.ok("async_reset", { seed: 0, has_seed: true });
      const all = await session.ok("recv", { batch_size: N });
      assert.equal(all.message, "RECV_RESP");
      assert.equal((all.results as Row[]).length, N); // was N + 1: the msgpack tail as a record
      assert.deepEqual([...(all.env_ids as number[])].sort((a, b) => a - b), [...Array(N).keys()]);
      assert.deepEqual(all.finals, []);
      await session.ok("async_reset", { seed: 0, has_seed: true });
      const one = await session.ok("recv", { batch_size: 1 });
      assert.equal(one.results, undefined);
      assert.equal(typeof one.result, "object");
      assert.equal((one.env_ids as number[]).length, 1);
      const rest = await session.ok("recv", { batch_size: N });
      assert.equal((rest.results as Row[]).length, N - 1);
      // SEND (binary body: the env ids are a msgpack tail) until the time limit ends every episode
      let got: Json = rest;
      for (let step = 0; step < 40 && (got.finals as Final[]).length === 0; step++) {
        const raw = Buffer.concat([Buffer.from(actions().flatMap((a) => a.dials)), Buffer.from(msgpackEncode([...Array(N).keys()]))]);
        await session.ok("send", null, raw);
        got = await session.ok("recv", { batch_size: N });
        assert.equal((got.results as Row[]).length, N);
      }
      const finals = got.finals as Final[];
      assert.ok(finals.length > 0, "no episode ended");
      for (const final of finals) {
        assert.ok(final.env_id >= 0 && final.env_id < N);
        assert.ok(final.result.terminated === true || final.result.truncated === true);
      }
    } finally {
      session.close();
    }
  });

  test("SAME_STEP step_batch: N results and the finals; other modes: no finals key", async () => {
    const session = await JsonSession.open(port, SAME_STEP);
    try {
      const reset = await session.ok("reset_seed", { seed: 7 });
      assert.equal((reset.results as Row[]).length, N);
      assert.equal(reset.finals, undefined); // RESET_RESP carries no tail
      let answer: Json = reset;
      for (let step = 0; step < 40; step++) {
        answer = await session.ok("step_batch", actions());
        assert.equal(answer.message, "STEP_BATCH_RESP");
        assert.equal((answer.results as Row[]).length, N); // was more: the final tail's bytes
        if ((answer.finals as Final[]).length > 0) break;
      }
      const finals = answer.finals as Final[];
      assert.ok(finals.length > 0, "no episode ended");
      for (const final of finals) assert.ok(final.result.terminated === true || final.result.truncated === true);
    } finally {
      session.close();
    }
    const plain = await JsonSession.open(port, 0);
    try {
      await plain.ok("reset_seed", { seed: 7 });
      const answer = await plain.ok("step_batch", actions());
      assert.equal((answer.results as Row[]).length, N);
      assert.equal(answer.finals, undefined);
      const observed = await plain.ok("observe");
      assert.equal((observed.results as Row[]).length, N); // was more: the msgpack infos
      assert.equal((observed.infos as unknown[]).length, N);
    } finally {
      plain.close();
    }
  });
});
