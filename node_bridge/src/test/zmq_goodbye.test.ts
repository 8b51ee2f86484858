/**
 * A zmq client that closes says goodbye (a HELLO_REQ with GOODBYE_FLAG), and the server closes
 * that client's envs then, not at its 1024-session LRU (a Router is not told when a Dealer
 * goes). Node clients against a Node server (in process) and a Python server (the Python CLI
 * serving tests/test_zmq_goodbye.py's MarkedEcho); tests/test_zmq_goodbye.py has the Python
 * clients. Real ZeroMQ sockets.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { EchoEnv } from "../envs/echo";
import { pac_env } from "../generated";
import { type Server, connect, serve } from "../index";
import { encodeGoodbye, encodeHello, isGoodbye } from "../protocol";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";

const NUM_ENVS = 3;
const TAG = `goodbye-${process.pid}-${randomBytes(3).toString("hex")}`;
const marks = mkdtempSync(join(tmpdir(), "transport-goodbye-"));
let serial = 0;
const ipcUrl = (): string => `zmq+ipc://${join(tmpdir(), `${TAG}-${++serial}.sock`)}`;

const servers: Server[] = [];
const processes: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.close();
  for (const proc of processes) await proc.stop();
  rmSync(marks, { recursive: true, force: true });
});

/** Whether `count()` is `want` within `ms` (a goodbye is handled in the server's own time). */
async function reaches(count: () => number, want: number, ms = 10_000): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (count() === want) return true;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return count() === want;
}

async function useAndClose(url: string, seed: bigint): Promise<void> {
  const client = await connect(url, { timeoutMs: 10_000 });
  await client.reset(seed);
  await client.step(new Array<number>(NUM_ENVS).fill(1));
  await client.close();
}

describe("a zmq client that closes has its envs closed by the server", () => {
  test("the goodbye body", () => {
    const body = encodeGoodbye();
    assert.equal(body.byteLength, 12);
    assert.ok(isGoodbye(body));
    assert.ok(!isGoodbye(body.subarray(0, 11)));
    assert.ok(!isGoodbye(encodeHello(0x1234n, { schema_name: "pac_env" })));
  });

  test("Node server, Node clients (zmq+ipc)", async () => {
    let closed = 0;
    class ClosedEcho extends EchoEnv {
      close(): void {
        closed += 1;
      }
    }
    const server = await serve(() => new ClosedEcho(), ipcUrl(), { schema: pac_env.SCHEMA, numEnvs: NUM_ENVS });
    servers.push(server);
    const staying = await connect(server.url, { timeoutMs: 10_000 });
    await staying.reset(1n);
    for (let round = 1; round <= 3; round++) {
      await useAndClose(server.url, BigInt(round));
      assert.ok(await reaches(() => closed, round * NUM_ENVS), `closed ${closed} after ${round} clients`);
    }
    const result = (await staying.step([2, 2, 2], { copy: true })) as unknown as Array<{ observation: Float32Array }>;
    assert.equal(result[0]?.observation[0], 2, "the other client's session is untouched");
    await staying.close();
    assert.ok(await reaches(() => closed, 4 * NUM_ENVS), `closed ${closed}`);
  });

  test("Python server, Node clients (zmq+ipc)", { skip: HAVE_PYTHON ? false : "python cannot import transport" }, async () => {
    process.env["TRANSPORT_TEST_CLOSE_MARKS"] = marks;
    const proc = await ServerProcess.start(
      "python",
      ipcUrl(),
      "--env",
      "tests.test_zmq_goodbye:MarkedEcho",
      "--schema",
      "schema/pac_env.toml",
      "--num-envs",
      String(NUM_ENVS),
    );
    processes.push(proc);
    for (let round = 1; round <= 2; round++) {
      await useAndClose(proc.url, BigInt(round));
      assert.ok(await reaches(() => readdirSync(marks).length, round * NUM_ENVS), `${readdirSync(marks).length} closed`);
    }
  });
});
