/**
 * The Node client's asynchronous `send` applies step's action rule (`ActionShapes`, docs/client.md
 * "Actions") with K env ids in place of N: Box and MultiDiscrete actions go out as from Python and
 * deliver lock-step's results; a wrong shape, a float into an integer field or a value its field
 * cannot hold is an ActionError naming send() before any bytes move (before, `actions[j] | 0`
 * truncated floats and array actions were refused outright). Over shm a send before any reset is
 * NOT_RESET at send, as over unix. Action errors name a Discrete space's range and a
 * gymnasium-derived integer Box as the Box it is.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { ActionError, type Client, describeActionSpace } from "../client";
import { RemoteError, connect } from "../index";
import { ErrorCode, schemaFromIrText } from "../protocol";
import { HAVE_PYTHON, PYTHON, ROOT, ServerProcess } from "../testing/servers";

const N = 2;
const BOX = "Box(-1.0, 1.0, (2,), float32)";
const LOCK = "MultiDiscrete([3, 4, 5])";

function url(scheme: "unix" | "shm"): string {
  const tag = randomBytes(6).toString("hex");
  return scheme === "unix" ? `unix://${join(tmpdir(), `transport-asyncsend-${tag}.sock`)}` : `shm://asyncsend-${tag}`;
}

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop();
});

async function started(lang: "node" | "python", scheme: "unix" | "shm", ...args: string[]): Promise<ServerProcess> {
  const server = await ServerProcess.start(lang, url(scheme), ...args);
  servers.push(server);
  return server;
}

function text(value: unknown): string {
  return JSON.stringify(value, (_, v: unknown) => (ArrayBuffer.isView(v) ? Array.from(v as Uint8Array) : v));
}

/** Each env's result after reset(seed) and one lock-step step(actions). */
async function lockstep(serverUrl: string, actions: number[][]): Promise<string[]> {
  const client = await connect(serverUrl, { timeoutMs: 20_000 });
  try {
    await client.reset(5);
    return ((await client.step(actions, { copy: true })) as unknown[]).map(text);
  } finally {
    await client.close();
  }
}

/** Each env's result after asyncReset(seed), send(actions, ids) and recv, in env order. */
async function sent(serverUrl: string, actions: Parameters<Client["send"]>[0], ids: number[]): Promise<string[]> {
  const client = await connect(serverUrl, { timeoutMs: 20_000 });
  try {
    await client.asyncReset(5);
    for (let got = 0; got < N; ) got += (await client.recv(N)).envIds.length;
    await client.send(actions, ids);
    const out: string[] = [];
    for (let got = 0; got < ids.length; ) {
      const back = await client.recv(N);
      back.envIds.forEach((i, k) => (out[i] = text(back.results[k])));
      got += back.envIds.length;
    }
    return out;
  } finally {
    await client.close();
  }
}

async function refused(call: Promise<unknown>, ...parts: string[]): Promise<string> {
  let message = "";
  await assert.rejects(call, (error: unknown) => {
    assert.ok(error instanceof ActionError, `not an ActionError: ${String(error)}`);
    message = error.message;
    assert.ok(message.startsWith("send(): "), message);
    for (const part of parts) assert.ok(message.includes(part), `${part} not in ${message}`);
    return true;
  });
  return message;
}

async function nothingInFlight(client: Client): Promise<void> {
  await assert.rejects(client.recv(N), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.ASYNC_STATE);
}

const TARGETS: Array<["node" | "python", "unix" | "shm"]> = [
  ["node", "unix"],
  ["node", "shm"],
  ["python", "unix"],
  ["python", "shm"],
];

describe("send: step's rule for K env ids", () => {
  for (const [lang, scheme] of TARGETS) {
    const skip = lang === "python" && !HAVE_PYTHON ? "python cannot import transport" : false;
    test(`Box and MultiDiscrete actions, sent: lock-step's results (${lang} server, ${scheme})`, { skip }, async () => {
      const reach = await started(lang, scheme, "--env", "reach", "--num-envs", String(N));
      const box = [
        [0.75, -0.25],
        [-1, 0.5],
      ];
      const expected = await lockstep(reach.url, box);
      assert.deepEqual(await sent(reach.url, [box[1] as number[], box[0] as number[]], [1, 0]), expected);
      assert.deepEqual(await sent(reach.url, Float32Array.from(box.flat()), [0, 1]), expected); // flat K x elements
      await reach.stop();
      const lock = await started(lang, scheme, "--env", "lock", "--num-envs", String(N));
      const dials = [
        [2, 3, 4],
        [1, 0, 2],
      ];
      assert.deepEqual(await sent(lock.url, [dials[1] as number[], dials[0] as number[]], [1, 0]), await lockstep(lock.url, dials));
      await lock.stop();
    });
  }

  test("what step refuses, send refuses, naming send() (nothing is sent)", async () => {
    const reach = await started("node", "unix", "--env", "reach", "--num-envs", String(N));
    const lock = await started("node", "unix", "--env", "lock", "--num-envs", String(N));
    const echo = await started("node", "unix", "--env", "echo", "--num-envs", String(N));
    const want = "pass one action per env id: an array of shape (2, 2)";
    let client = await connect(reach.url, { timeoutMs: 20_000 });
    await client.asyncReset(1);
    await client.recv(N);
    const message = await refused(client.send([0.5, -0.5], [0, 1]), want);
    assert.equal(message, `send(): Array of shape (2,) is not an action for ${BOX} (2 env ids): ${want}`);
    await refused(client.send([[0.25], [0.5]], [0, 1]), want);
    await refused(client.send(0.5, [0, 1]), want);
    await refused(client.send([[0.5, 0.5]], [0, 1]), "expected 2 actions, got 1; ");
    await refused(client.send([0.5, 0.5], [1]), "(1 env id): pass one action per env id: an array of shape (1, 2)");
    await nothingInFlight(client);
    await client.close();
    client = await connect(lock.url, { timeoutMs: 20_000 });
    await client.asyncReset(1);
    await client.recv(N);
    const head = `is not an action for ${LOCK} (2 env ids): `;
    const outside = "a value is outside 0..255: it does not fit the u8 action field";
    await refused(
      client.send(
        [
          [0.5, 1, 2],
          [0, 0, 0],
        ],
        [0, 1],
      ),
      head,
      "would be truncated to the u8 action field",
    );
    await refused(
      client.send(
        [
          [-1, 0, 0],
          [0, 0, 0],
        ],
        [0, 1],
      ),
      head,
      outside,
    );
    await refused(client.send(Int32Array.from([300, 0, 0, 0, 0, 0]), [0, 1]), head, outside);
    await nothingInFlight(client);
    await client.close();
    client = await connect(echo.url, { timeoutMs: 20_000 });
    await client.asyncReset(1);
    await client.recv(N);
    await refused(client.send([1.7, 2.9], [0, 1]), "its value 1.7 would be truncated");
    await refused(client.send(Float64Array.from([1, 2]), [0, 1]), "its float64 values would be truncated");
    await refused(client.send([2 ** 40, 1], [0, 1]), "does not fit the");
    await nothingInFlight(client);
    await client.send([7, 9], [1, 0]);
    const got = await client.recv(N);
    const observed = new Map(got.envIds.map((i, k) => [i, (got.results[k] as { observation: Float32Array }).observation[0]]));
    assert.deepEqual(observed, new Map([
      [1, 7],
      [0, 9],
    ]));
    await client.close();
  });

  for (const lang of ["node", "python"] as const) {
    const skip = lang === "python" && !HAVE_PYTHON ? "python cannot import transport" : false;
    test(`shm: a send before any reset is NOT_RESET at send, as over unix (${lang} server)`, { skip }, async () => {
      const texts: string[] = [];
      for (const scheme of ["unix", "shm"] as const) {
        const server = await started(lang, scheme, "--env", "echo", "--num-envs", String(N));
        const client = await connect(server.url, { timeoutMs: 20_000 });
        await assert.rejects(client.send([0, 0], [0, 1]), (e: unknown) => {
          assert.ok(e instanceof RemoteError && e.code === ErrorCode.NOT_RESET, `${scheme}: ${String(e)}`);
          texts.push(e.text);
          return true;
        });
        await nothingInFlight(client);
        await client.asyncReset(3);
        for (let got = 0; got < N; ) got += (await client.recv(N)).envIds.length;
        await client.send([5, 6], [0, 1]);
        for (let got = 0; got < N; ) got += (await client.recv(N)).envIds.length;
        await client.close();
        await server.stop();
      }
      assert.deepEqual(texts, ["env 0: step before the first reset", "env 0: step before the first reset"]);
    });
  }

  const skip = HAVE_PYTHON ? false : "python cannot import transport";
  test("action errors name a Discrete space's range and a gymnasium integer Box", { skip }, async () => {
    const cartpole = await started("python", "unix", "--gym", "CartPole-v1");
    const client = await connect(cartpole.url, { timeoutMs: 20_000 });
    await client.reset(0);
    await assert.rejects(client.step(-1), {
      message: "step(): number -1 is not an action for Discrete(2) (1 env): -1 is outside 0..1 (and does not fit the u8 action field)",
    });
    await assert.rejects(client.step(5), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.INVALID_ACTION);
    await client.close();
    const script = [
      "import json, numpy as np",
      "from gymnasium import spaces",
      "from transport.gym_schema import schema_of_spaces",
      "from transport.protocol import schema_ir_text",
      "obs = spaces.Box(-1.0, 1.0, (2,), np.float32)",
      "out = []",
      "for a in (spaces.Box(-5, 5, (2,), np.int16), spaces.Discrete(3, start=-1), spaces.MultiBinary(4),",
      "          spaces.MultiDiscrete([3, 4], start=[0, -1])):",
      "    s = schema_of_spaces(obs, a)",
      "    out.append([schema_ir_text(s), str(s.fingerprint)])",
      "print(json.dumps(out))",
    ].join("\n");
    const done = spawnSync(PYTHON, ["-c", script], { cwd: ROOT, encoding: "utf8" });
    assert.equal(done.status, 0, done.stderr);
    const schemas = (JSON.parse(done.stdout) as Array<[string, string]>).map(([ir, fp]) => schemaFromIrText(ir, BigInt(fp), "test"));
    assert.deepEqual(
      schemas.map((schema) => describeActionSpace(schema, null)),
      ["Box(-5, 5, (2,), int16)", "Discrete(3, start=-1)", "MultiBinary(4)", "MultiDiscrete([3, 4], start=[0, -1])"],
    );
  });
});
