/**
 * Issue 24 item 3: a batch response bigger than the socket's send buffer is sent from the
 * session's own buffer and that buffer is reused: the server waits for the write to complete
 * (it pauses reading) instead of allocating a fresh response buffer per step
 * (`stats.detached` stays 0), and every result is still right. On the client, a frame split
 * across chunks is assembled straight into the channel's receive buffer (one copy, not two).
 */

import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { test } from "node:test";

import { connect, serve } from "../index";
import { packHeader } from "../protocol";
import { FrameReader } from "../stream";
import { EchoEnv } from "../envs";
import type * as pac_env from "../generated/pac_env";

const ENVS = 256; // 256 x 2557 bytes = 654 KB: more than a Unix socket's send buffer

test("a big batch response is sent from the reused session buffer (no per-step buffer)", async () => {
  const url = `unix://${join(tmpdir(), `transport-node-copies-${process.pid}-${randomBytes(4).toString("hex")}.sock`)}`;
  const server = await serve(() => new EchoEnv(), url, { envName: "echo", numEnvs: ENVS });
  try {
    const client = await connect(url);
    try {
      await client.reset();
      for (let step = 1; step <= 6; step++) {
        const actions = Array.from({ length: ENVS }, (_, i) => (i + step) % 92);
        const results = (await client.step(actions)) as pac_env.StepResultView[];
        assert.equal(results.length, ENVS);
        for (let i = 0; i < ENVS; i++) {
          assert.equal(results[i]?.observation[0], actions[i], `env ${i} step ${step}`);
          assert.equal(results[i]?.observation[1], step, `env ${i} step ${step}`);
        }
      }
    } finally {
      await client.close();
    }
    assert.equal(server.stats.detached, 0, "a response buffer was replaced: a fresh buffer per step");
  } finally {
    await server.close();
  }
});

test("a frame split across chunks is assembled straight into the sink's buffer", () => {
  const target = Buffer.alloc(16 + 1000);
  const asked: number[] = [];
  const reader = new FrameReader(1 << 20, (length) => {
    asked.push(length);
    return [target, 16];
  });
  const body = Buffer.from(Array.from({ length: 1000 }, (_, i) => (i * 7) & 0xff));
  const frame = Buffer.alloc(9 + body.byteLength);
  packHeader(frame, 0, 0x21, 5, body.byteLength);
  body.copy(frame, 9);
  reader.push(frame.subarray(0, 300));
  assert.equal(reader.next(), false);
  reader.push(frame.subarray(300));
  assert.equal(reader.next(), true);
  assert.deepEqual(asked, [1000]);
  assert.equal(reader.body, target, "the body was assembled elsewhere (then copied again)");
  assert.equal(reader.offset, 16);
  assert.deepEqual(target.subarray(16, 1016), body);
  // a frame that came in one chunk is used in place: the sink is not asked
  reader.push(frame);
  assert.equal(reader.next(), true);
  assert.deepEqual(asked, [1000]);
  assert.notEqual(reader.body, target);
});
