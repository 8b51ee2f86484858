/**
 * Masked-action policies of the Node server (issue 15 item 2) with the Node client: reject,
 * pass and noop (no step; the previous result with the env's `maskedActionPenalty` as reward),
 * announced in the HELLO info (`client.maskedActions`).
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import { RemoteError, connect, serve, type Server } from "../index";
import { PacEnv } from "../envs";
import * as pac_env from "../generated/pac_env";
import { ErrorCode } from "../protocol";

const MASKED = 60; // pac reserves 51..91: always masked
const servers = new Set<Server>();

after(async () => {
  for (const server of servers) await server.close();
});

function uniqueUnixUrl(): string {
  return `unix://${join(tmpdir(), `transport-node-masked-${randomBytes(6).toString("hex")}.sock`)}`;
}

async function served(maskedActions: "reject" | "pass" | "noop" | undefined, make: () => PacEnv): Promise<Server> {
  const server = await serve(make, uniqueUnixUrl(), maskedActions === undefined ? {} : { maskedActions });
  servers.add(server);
  return server;
}

test("reject is the default: MASKED_ACTION, announced as reject", async () => {
  const client = await connect((await served(undefined, () => new PacEnv())).url);
  try {
    assert.equal(client.maskedActions, "reject");
    await client.reset(1n);
    await assert.rejects(client.step(MASKED), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.MASKED_ACTION);
  } finally {
    await client.close();
  }
});

test("noop: no step, the previous result with the env's penalty", async () => {
  const penalized = (): PacEnv => Object.assign(new PacEnv(), { maskedActionPenalty: -0.25 });
  const client = await connect((await served("noop", penalized)).url);
  try {
    assert.equal(client.maskedActions, "noop");
    const first = (await client.reset(3n, { copy: true })) as pac_env.StepResult;
    const kept = (await client.step(MASKED, { copy: true })) as pac_env.StepResult;
    assert.equal(kept.reward, -0.25);
    assert.equal(kept.done, 0);
    assert.deepEqual(Array.from(kept.observation), Array.from(first.observation));
    const local = new PacEnv();
    local.reset(3n);
    const next = (await client.step(0, { copy: true })) as pac_env.StepResult;
    assert.deepEqual(Array.from(next.observation), Array.from(local.step(0).observation)); // it had not stepped
  } finally {
    await client.close();
  }
});

test("pass: the env gets the masked action (pac refuses it: ENV_ERROR, not MASKED_ACTION)", async () => {
  const client = await connect((await served("pass", () => new PacEnv())).url);
  try {
    assert.equal(client.maskedActions, "pass");
    await client.reset(3n);
    await assert.rejects(client.step(MASKED), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.ENV_ERROR);
  } finally {
    await client.close();
  }
});

test("an unknown policy is refused when the server starts", async () => {
  await assert.rejects(serve(() => new PacEnv(), uniqueUnixUrl(), { maskedActions: "ignore" as never }), /reject, pass, noop/);
});
