/**
 * Server limits (docs/server.md "Limits") with the Node server and the Node client, in process,
 * over unix:// and http://: a client over maxConnections is refused with a typed RemoteError
 * ("server busy") while the open one keeps working; idle and trickling connections are closed;
 * non-positive limits are a RangeError before anything starts.
 */

import assert from "node:assert/strict";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { after, describe, test } from "node:test";

import { RemoteError, connect, serve, type Server } from "../index";
import { EchoEnv } from "../envs";
import * as pac_env from "../generated/pac_env";
import { MESSAGE_IDS as IDS, packHeader } from "../protocol";
import { type ServerLimits, serverLimits } from "../stream";

const servers = new Set<Server>();

after(async () => {
  for (const server of servers) await server.close();
});

async function start(backend: "unix" | "http", limits: Partial<ServerLimits>): Promise<Server> {
  const url =
    backend === "unix"
      ? `unix://${join(tmpdir(), `transport-limits-test-${randomBytes(6).toString("hex")}.sock`)}`
      : "http://127.0.0.1:0";
  const server = await serve(() => new EchoEnv(), url, { envName: "echo", limits });
  servers.add(server);
  return server;
}

function rawConnect(url: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = url.startsWith("unix://")
      ? net.createConnection({ path: url.slice("unix://".length) })
      : net.createConnection({ host: "127.0.0.1", port: Number(url.slice(url.lastIndexOf(":") + 1)) });
    socket.once("connect", () => resolve(socket));
    socket.once("error", reject);
  });
}

/** Resolves when the server closes `socket` (with what it sent); rejects after `ms`. */
function closedWithin(socket: net.Socket, ms: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => reject(new Error(`still open after ${ms} ms`)), ms);
    socket.on("data", (chunk: Buffer) => chunks.push(chunk));
    socket.on("error", () => undefined);
    socket.once("close", () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks));
    });
  });
}

for (const backend of ["unix", "http"] as const) {
  describe(`limits over ${backend}://`, () => {
    test("a client over maxConnections gets RemoteError 'server busy'; the open one works", async () => {
      const server = await start(backend, { maxConnections: 1 });
      // pinned schema: a discovering connect opens a second connection right after the first
      const schema = pac_env.SCHEMA;
      const first = await connect(server.url, { schema });
      await first.reset();
      await assert.rejects(connect(server.url, { schema, timeoutMs: 5000 }), (error: unknown) => {
        assert.ok(error instanceof RemoteError, String(error));
        assert.match(error.text, /server busy.*max_connections/);
        return true;
      });
      assert.equal(await first.health(), true);
      await first.close();
    });

    test("an idle connection and a trickled request are closed", async () => {
      const server = await start(backend, { idleTimeoutMs: 300, readTimeoutMs: 300 });
      const idle = await rawConnect(server.url);
      const trickler = await rawConnect(server.url);
      const idleClosed = closedWithin(idle, 10_000);
      const trickleClosed = closedWithin(trickler, 10_000);
      let request: Buffer;
      if (backend === "unix") {
        request = Buffer.alloc(9 + 100);
        packHeader(request, 0, IDS.STEP_REQ, 1, 100);
      } else {
        request = Buffer.from("POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + "x".repeat(100));
      }
      let at = 0;
      const timer = setInterval(() => {
        if (trickler.destroyed || at >= request.byteLength) return;
        trickler.write(request.subarray(at, at + 1));
        at += 1;
      }, 100);
      try {
        assert.equal((await idleClosed).byteLength, 0);
        const said = await trickleClosed;
        assert.ok(at < request.byteLength, "the whole request was trickled in");
        if (said.byteLength) assert.match(said.toString("latin1"), /read_timeout/);
        if (said.byteLength && backend === "http") assert.match(said.toString("latin1"), /^HTTP\/1\.1 408 /);
      } finally {
        clearInterval(timer);
        idle.destroy();
        trickler.destroy();
      }
    });
  });
}

test("non-positive limits are a RangeError", async () => {
  assert.throws(() => serverLimits({ maxConnections: 0 }), RangeError);
  assert.throws(() => serverLimits({ idleTimeoutMs: -1 }), RangeError);
  assert.throws(() => serverLimits({ readTimeoutMs: Number.NaN }), RangeError);
  assert.deepEqual(serverLimits(), { maxConnections: 1024, idleTimeoutMs: 600_000, readTimeoutMs: 30_000 });
  await assert.rejects(serve(() => new EchoEnv(), "http://127.0.0.1:0", { limits: { maxConnections: 1.5 } }), RangeError);
});
