/**
 * Issue 24 item 3 (Node server): a response buffer handed to libzmq (a body above the zero-copy
 * threshold) is replaced by a fresh one that carries only the header and the results region
 * over, not the whole buffer (copying ~2x the body per step was the biggest cost of a zmq Node
 * server at N = 256). The replies must still never tear: a client that pipelines requests
 * without reading (or one whose request timed out) gets each reply with its own bytes.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import * as zmq from "zeromq";

import { ZERO_COPY_THRESHOLD, parseUrl } from "../backends/zmq";
import { EchoEnv, PacEnv } from "../envs";
import { connect, serve } from "../index";
import * as pac_env from "../generated/pac_env";
import { BODY_OFFSET, MESSAGE_IDS as IDS, encodeHello, packHeader, readU32 } from "../protocol";
import { EnvHost } from "../runtime/host";
import { Session } from "../runtime/session";

const RESULT = pac_env.StepResultCodec.size;
const ENVS = Math.ceil(ZERO_COPY_THRESHOLD / RESULT) + 7; // every batch reply is given to libzmq

function actionsBody(step: number): Buffer {
  const body = Buffer.alloc(4 * ENVS);
  for (let i = 0; i < ENVS; i++) body.writeInt32LE((i * 7 + step) % 92, 4 * i);
  return body;
}

test("a detached buffer carries the header and every env's result over, and steps on", () => {
  const host = new EnvHost(() => new EchoEnv(), { numEnvs: ENVS });
  const session = new Session(host.runtime());
  try {
    assert.equal(session.handle(IDS.HELLO_REQ, encodeHello(pac_env.FINGERPRINT), 0, encodeHello(pac_env.FINGERPRINT).byteLength), IDS.HELLO_RESP);
    assert.equal(session.handle(IDS.RESET_REQ, Buffer.alloc(0), 0, 0), IDS.RESET_RESP);
    const step = actionsBody(1);
    assert.equal(session.handle(IDS.STEP_BATCH_REQ, step, 0, step.byteLength), IDS.STEP_BATCH_RESP);
    const old = session.buffer;
    const results = BODY_OFFSET + ENVS * RESULT;
    const before = Buffer.from(old.subarray(0, results));
    session.detachBuffer();
    assert.notEqual(session.buffer, old);
    assert.ok(session.buffer.byteLength >= old.byteLength);
    assert.deepEqual(session.buffer.subarray(0, results), before, "the results region is carried over");
    assert.deepEqual(Buffer.from(session.body()), before.subarray(BODY_OFFSET));
    old.fill(0xee); // libzmq's copy: nothing the session does reads it again
    const next = actionsBody(2);
    assert.equal(session.handle(IDS.STEP_BATCH_REQ, next, 0, next.byteLength), IDS.STEP_BATCH_RESP);
    const body = session.body();
    for (let i = 0; i < ENVS; i++) {
      assert.equal(body.readFloatLE(i * RESULT), next.readInt32LE(4 * i), `env ${i}`);
      assert.equal(body.readFloatLE(i * RESULT + 4), 2, `env ${i}: its second step`);
    }
  } finally {
    session.runtime.close();
  }
});

test("zmq: pipelined batch replies above the zero-copy threshold keep their own bytes", async () => {
  const url = `zmq+ipc://${join(tmpdir(), `transport-node-detach-${process.pid}-${randomBytes(4).toString("hex")}.sock`)}`;
  const server = await serve(() => new EchoEnv(), url, { envName: "echo", numEnvs: ENVS });
  const sock = new zmq.Dealer({ linger: 0, receiveTimeout: 10_000 });
  try {
    sock.connect(parseUrl(server.url).endpoint);
    const send = async (msgType: number, msgId: number, body: Buffer): Promise<void> => {
      const header = Buffer.alloc(9);
      packHeader(header, 0, msgType, msgId, body.byteLength);
      await sock.send([header, body]);
    };
    const recv = async (): Promise<[number, number, Buffer]> => {
      const [header, body] = (await sock.receive()) as [Buffer, Buffer];
      assert.equal(readU32(header, 5), body.byteLength);
      return [header[0] as number, readU32(header, 1), body];
    };
    await send(IDS.HELLO_REQ, 1, encodeHello(pac_env.FINGERPRINT));
    assert.equal((await recv())[0], IDS.HELLO_RESP);
    await send(IDS.RESET_REQ, 2, Buffer.alloc(0));
    assert.equal((await recv())[0], IDS.RESET_RESP);
    const detachedBefore = server.stats.detached;
    const STEPS = 6;
    // every request sent before any reply is read: each reply is still queued in libzmq (or
    // being written) while the next step writes its results
    for (let step = 1; step <= STEPS; step++) await send(IDS.STEP_BATCH_REQ, 100 + step, actionsBody(step));
    for (let step = 1; step <= STEPS; step++) {
      const [type, msgId, body] = await recv();
      assert.equal(type, IDS.STEP_BATCH_RESP);
      assert.equal(msgId, 100 + step);
      assert.equal(body.byteLength, ENVS * RESULT);
      const actions = actionsBody(step);
      for (let i = 0; i < ENVS; i++) {
        assert.equal(body.readFloatLE(i * RESULT), actions.readInt32LE(4 * i), `step ${step} env ${i}: action`);
        assert.equal(body.readFloatLE(i * RESULT + 4), step, `step ${step} env ${i}: step count`);
      }
    }
    assert.equal(server.stats.detached - detachedBefore, STEPS, "each reply's buffer was given to libzmq");
  } finally {
    sock.close();
    await server.close();
  }
});

test("zmq: a masked noop env keeps its previous result across replaced response buffers", async () => {
  const MASKED = 60; // pac reserves 51..91: always masked
  const url = `zmq+ipc://${join(tmpdir(), `transport-node-detach-noop-${process.pid}-${randomBytes(4).toString("hex")}.sock`)}`;
  const penalized = (): PacEnv => Object.assign(new PacEnv(), { maskedActionPenalty: -0.25 });
  const server = await serve(penalized, url, { envName: "pac", numEnvs: ENVS, maskedActions: "noop" });
  try {
    const client = await connect(server.url, { timeoutMs: 10_000 });
    try {
      const first = (await client.reset(3n, { copy: true })) as pac_env.StepResult[];
      const detached = server.stats.detached;
      // env 0 steps, every other env is a noop: twice, each reply's buffer given to libzmq
      for (let round = 1; round <= 2; round++) {
        const actions = Array.from({ length: ENVS }, (_, i) => (i === 0 ? 0 : MASKED));
        const kept = (await client.step(actions, { copy: true })) as pac_env.StepResult[];
        for (let i = 1; i < ENVS; i++) {
          assert.equal(kept[i]?.reward, -0.25, `round ${round} env ${i}`);
          assert.deepEqual(Array.from(kept[i]?.observation ?? []), Array.from(first[i]?.observation ?? []), `round ${round} env ${i}`);
        }
      }
      assert.ok(server.stats.detached - detached >= 2, "the replies were handed to libzmq");
    } finally {
      await client.close();
    }
  } finally {
    await server.close();
  }
});
