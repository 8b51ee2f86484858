/**
 * What a reset's seed may be (Python: tests/test_seed_types.py): a bigint or a safe integer
 * number in 0..2**64-1, or an array of one such seed or null per env. A negative number wrapped
 * to a huge seed (reset(-1) was seed 2**64-1), a string was read as its number and a fraction
 * was a raw RangeError; each is now refused before any bytes move, and the client stays usable.
 * A real unix server in process, a real Node client.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { EchoEnv } from "../envs/echo";
import { pac_env } from "../generated";
import { type Client, type Server, connect, serve } from "../index";

let server: Server;
let client: Client;
before(async () => {
  const url = `unix://${join(tmpdir(), `seeds-${process.pid}-${randomBytes(3).toString("hex")}.sock`)}`;
  server = await serve(() => new EchoEnv(), url, { schema: pac_env.SCHEMA, numEnvs: 2 });
  client = await connect(server.url, { timeoutMs: 10_000 });
});
after(async () => {
  await client.close();
  await server.close();
});

describe("reset seeds are checked before any bytes move", () => {
  const cases: Array<[unknown, RegExp, ErrorConstructor]> = [
    [-1, /reset\(seed\): a seed must be an integer in 0\.\.2\*\*64-1, not -1/, RangeError],
    [1n << 64n, /0\.\.2\*\*64-1/, RangeError],
    ["12", /reset\(seed\): a seed is an integer .*not string "12"/, TypeError],
    [1.5, /not number 1\.5/, TypeError],
    [2 ** 60, /not number/, TypeError], // not a safe integer: it may not be the number meant
    [{ seed: 1 }, /an array of one integer or null per env/, TypeError],
    [[1, "2"], /reset\(seed\[1\]\): .*not string "2"/, TypeError],
    [[1, -3], /reset\(seed\[1\]\): a seed must be an integer in 0\.\.2\*\*64-1/, RangeError],
  ];
  for (const [seed, said, type] of cases) {
    test(`reset(${typeof seed === "bigint" ? `${seed}n` : JSON.stringify(seed)})`, async () => {
      await assert.rejects(client.reset(seed as never), (error: unknown) => {
        assert.ok(error instanceof type, String(error));
        assert.match((error as Error).message, said);
        return true;
      });
      await client.reset(5n); // still usable
    });
  }

  test("good seeds", async () => {
    for (const seed of [7, 7n, [7, null], [7n, 8]] as const) await client.reset(seed);
  });

  test("asyncReset", async () => {
    await assert.rejects(client.asyncReset(-1), /asyncReset\(seed\): a seed must be an integer in 0\.\.2\*\*64-1/);
    await assert.rejects(client.asyncReset("3" as never), /asyncReset\(seed\): a seed is an integer/);
    await client.asyncReset(4);
    assert.equal((await client.recv(2)).envIds.length, 2);
  });
});
