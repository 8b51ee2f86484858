/**
 * RESET_SEEDS (issue 15 item 7) with the Node client and the Node server, over unix:// and
 * shm://: `client.reset([s0, null, s2])` resets env i with its own seed (null: unseeded).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { TransportError, connect, serve } from "../index";
import { PacEnv } from "../envs";
import type * as pac_env from "../generated/pac_env";

const SEEDS = [7, null, 3n] as const;

function urls(): string[] {
  const name = randomBytes(6).toString("hex");
  return [`unix://${join(tmpdir(), `transport-node-seeds-${name}.sock`)}`, `shm://node-seeds-${name}?num_envs=3`];
}

for (const url of urls()) {
  test(`reset with a seed per env over ${url.split(":")[0]}://`, async () => {
    const server = await serve(() => new PacEnv(), url, { numEnvs: 3 });
    try {
      const client = await connect(server.url);
      try {
        const got = (await client.reset([...SEEDS], { copy: true })) as pac_env.StepResult[];
        SEEDS.forEach((seed, i) => {
          const local = new PacEnv();
          const want = seed === null ? local.reset() : local.reset(BigInt(seed));
          assert.deepEqual(Array.from(got[i]?.observation ?? []), Array.from(want.observation), `env ${i}`);
        });
        await assert.rejects(client.reset([1, 2]), TransportError);
      } finally {
        await client.close();
      }
    } finally {
      await server.close();
    }
  });
}
