/**
 * Decision-boundary runs (issue 14 item 3) with the Node client and the Node server over unix://:
 * frames and events carried, and the runtime's no-progress watchdog answered as a NoProgressError
 * with the request numbers and the last state (the env is reset, the next request works).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { FramesEnv } from "../envs";
import * as frames from "../generated/frames";
import { NoProgressError, connect, serve } from "../index";

test("frames env: a jammed engine is a NoProgressError after stall_requests requests", async () => {
  const url = `unix://${join(tmpdir(), `transport-node-frames-${randomBytes(6).toString("hex")}.sock`)}`;
  const server = await serve(() => new FramesEnv(), url, { schema: frames.SCHEMA, envName: "frames", numEnvs: 1 });
  try {
    const client = await connect<frames.StepResultView, frames.StepResult>(server.url, { schema: frames.SCHEMA });
    try {
      await client.reset(5n);
      const run = (await client.step(0, { copy: true })) as frames.StepResult;
      assert.ok(run.frames >= 1 && run.frames < 64, `frames ${run.frames}`);
      assert.equal(Array.from(run.events)[2], 1); // one spawn per run
      await client.step(2); // jams: 0 frames
      await client.step(0);
      await assert.rejects(client.step(0), (error: unknown) => {
        assert.ok(error instanceof NoProgressError, String(error));
        assert.equal(error.envId, 0);
        assert.deepEqual(error.requests, [2, 4]);
        assert.equal(error.lastState["frames"], 0);
        assert.equal(error.lastState["decisions"], 1);
        return true;
      });
      const after = (await client.step(0, { copy: true })) as frames.StepResult; // the env was reset
      assert.ok(after.frames >= 1);
      await assert.rejects(client.step(3), NoProgressError); // spins: no decision within 64 frames
    } finally {
      await client.close();
    }
  } finally {
    await server.close();
  }
});
