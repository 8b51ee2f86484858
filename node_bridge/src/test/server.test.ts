/**
 * The Node server with the Node client, in process, over unix:// and http://: round trips,
 * batches, bad input answered with ERROR while other clients keep being served, backpressure,
 * socket files (0600, removed on close, live ones never stolen).
 */

import assert from "node:assert/strict";
import { existsSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { after, describe, test } from "node:test";

import {
  ConnectError,
  FingerprintMismatchError,
  PeerGoneError,
  RemoteError,
  TransportTimeoutError,
  connect,
  serve,
  type Server,
} from "../index";
import { EchoEnv, PacEnv } from "../envs";
import * as pac_env from "../generated/pac_env";
import { ErrorCode, MESSAGE_IDS as IDS, encodeHello, packHeader } from "../protocol";
import { FrameReader } from "../stream";

const RESULT = pac_env.StepResultCodec.size;
const servers = new Set<Server>();

after(async () => {
  for (const server of servers) await server.close();
});

function uniqueUnixUrl(): string {
  return `unix://${join(tmpdir(), `transport-node-test-${randomBytes(6).toString("hex")}.sock`)}`;
}

function pathOf(url: string): string {
  return url.slice("unix://".length);
}

async function start(
  backend: "unix" | "http",
  ...args: Parameters<typeof serve> extends [unknown, unknown, ...infer R] ? R : never
): Promise<Server> {
  const url = backend === "unix" ? uniqueUnixUrl() : "http://127.0.0.1:0";
  const server = await serve(() => new EchoEnv(), url, { envName: "echo", ...(args[0] ?? {}) });
  servers.add(server);
  return server;
}

async function stop(server: Server): Promise<void> {
  await server.close();
  servers.delete(server);
  if (server.url.startsWith("unix://")) assert.equal(existsSync(pathOf(server.url)), false);
}

function frame(msgType: number, msgId: number, body: Uint8Array = new Uint8Array(0)): Buffer {
  const out = Buffer.alloc(9 + body.byteLength);
  packHeader(out, 0, msgType, msgId, body.byteLength);
  out.set(body, 9);
  return out;
}

/** A raw unix connection that reads whole frames. */
class Raw {
  readonly socket: net.Socket;
  readonly #reader = new FrameReader(1 << 30);
  readonly #frames: { type: number; id: number; body: Buffer }[] = [];
  #waiters: (() => void)[] = [];
  closed = false;

  private constructor(socket: net.Socket) {
    this.socket = socket;
    socket.on("data", (chunk: Buffer) => {
      this.#reader.push(chunk);
      while (this.#reader.next()) {
        const r = this.#reader;
        this.#frames.push({
          type: r.msgType,
          id: r.msgId,
          body: Buffer.from(r.body.subarray(r.offset, r.offset + r.length)),
        });
      }
      this.#wake();
    });
    socket.on("error", () => undefined);
    socket.on("close", () => {
      this.closed = true;
      this.#wake();
    });
  }

  static open(url: string): Promise<Raw> {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path: pathOf(url) });
      socket.once("connect", () => resolve(new Raw(socket)));
      socket.once("error", reject);
    });
  }

  #wake(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const wake of waiters) wake();
  }

  async read(timeoutMs = 5000): Promise<{ type: number; id: number; body: Buffer }> {
    const deadline = Date.now() + timeoutMs;
    while (this.#frames.length === 0) {
      if (this.closed) throw new Error("closed before a frame");
      if (Date.now() > deadline) throw new Error("no frame in time");
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        setTimeout(resolve, 50);
      });
    }
    return this.#frames.shift() as { type: number; id: number; body: Buffer };
  }

  async waitClosed(timeoutMs = 5000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (!this.closed && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        setTimeout(resolve, 50);
      });
    }
    return this.closed;
  }

  close(): void {
    this.socket.destroy();
  }
}

const code = (body: Buffer): number => body.readUInt16LE(0);

for (const backend of ["unix", "http"] as const) {
  describe(`node client <-> node server over ${backend}://`, () => {
    test("round trip: hello info, health, spaces, reset, step", async () => {
      const server = await start(backend);
      if (backend === "http") assert.match(server.url, /^http:\/\/127\.0\.0\.1:[1-9][0-9]*$/);
      if (backend === "unix") assert.equal(statSync(pathOf(server.url)).mode & 0o777, 0o600);
      const client = await connect(server.url, { timeoutMs: 5000 });
      try {
        assert.deepEqual(client.serverInfo, { num_envs: 1, env: "echo", server: "node", masked_actions: "reject", autoreset: "disabled" });
        assert.equal(await client.health(), true);
        assert.deepEqual(await client.spaces(), { obsN: 612, actN: 92 });
        const first = (await client.reset(3n)) as pac_env.StepResultView;
        assert.equal(first.observation.length, 612);
        assert.ok(first.action_mask.every((m) => m === 1));
        for (let a = 1; a <= 5; a++) {
          const result = (await client.step(a)) as pac_env.StepResultView;
          assert.equal(result.observation[0], a);
          assert.equal(result.observation[1], a);
          assert.equal(result.reward, a / 4);
          assert.equal(result.observation.byteOffset % 16, 0); // aligned, zero-copy
        }
        const owned = (await client.step(9, { copy: true })) as pac_env.StepResult;
        await client.step(10);
        assert.equal(owned.observation[0], 9); // a copy is not overwritten by the next step
      } finally {
        await client.close();
        await stop(server);
      }
    });

    test("batched server: reset and step_batch give one view per env", async () => {
      const server = await start(backend, { numEnvs: 4, seed: 5 });
      const client = await connect(server.url, { timeoutMs: 5000 });
      try {
        assert.equal(client.numEnvs, 4);
        const reset = (await client.reset()) as pac_env.StepResultView[];
        assert.equal(reset.length, 4);
        const results = (await client.step([1, 2, 3, 4])) as pac_env.StepResultView[];
        assert.deepEqual(results.map((r) => r.observation[0]), [1, 2, 3, 4]);
        assert.deepEqual(results.map((r) => r.reward), [0.25, 0.5, 0.75, 1]);
        await assert.rejects(client.step(1), /one action per env/);
        await assert.rejects(client.step([1, 2]), /expected 4 actions/);
        const type = await client.channel.request(IDS.STEP_REQ, Buffer.alloc(4));
        assert.equal(type, IDS.ERROR);
        assert.equal(client.channel.buffer.readUInt16LE(16), ErrorCode.BAD_BATCH);
        await assert.rejects(client.step([0, 0, 0, 92]), (error: unknown) => {
          assert.ok(error instanceof RemoteError);
          assert.equal(error.code, ErrorCode.INVALID_ACTION);
          assert.match(error.text, /env 3: action 92 is outside 0\.\.91/);
          return true;
        });
        const again = (await client.step([5, 6, 7, 8])) as pac_env.StepResultView[];
        assert.deepEqual(again.map((r) => r.observation[0]), [5, 6, 7, 8]);
      } finally {
        await client.close();
        await stop(server);
      }
    });

    test("out-of-range, masked and not-reset actions are RemoteErrors; the client stays usable", async () => {
      const server = await serve(() => new PacEnv(), backend === "unix" ? uniqueUnixUrl() : "http://127.0.0.1:0");
      servers.add(server);
      const client = await connect(server.url, { timeoutMs: 5000 });
      try {
        await assert.rejects(client.step(0), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.NOT_RESET);
        const first = (await client.reset(1n)) as pac_env.StepResultView;
        const masked = first.action_mask.indexOf(0);
        await assert.rejects(client.step(92), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.INVALID_ACTION && e.codeName === "INVALID_ACTION");
        await assert.rejects(client.step(-1), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.INVALID_ACTION);
        await assert.rejects(client.step(masked), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.MASKED_ACTION);
        const next = (await client.step(0)) as pac_env.StepResultView;
        assert.equal(typeof next.reward, "number");
        assert.equal(await client.health(), true);
      } finally {
        await client.close();
        await stop(server);
      }
    });

    test("a wrong fingerprint fails both ways, naming both fingerprints", async () => {
      const server = await start(backend);
      const other = { ...pac_env.SCHEMA, fingerprint: 0x0123456789abcdefn };
      try {
        await assert.rejects(connect(server.url, { timeoutMs: 5000, schema: other }), (error: unknown) => {
          assert.ok(error instanceof FingerprintMismatchError);
          assert.match(error.message, /0123456789abcdef/);
          assert.match(error.message, new RegExp(pac_env.FINGERPRINT_HEX));
          return true;
        });
        const client = await connect(server.url, { timeoutMs: 5000 });
        assert.equal(await client.health(), true);
        await client.close();
      } finally {
        await stop(server);
      }
    });

    test("a closed server is PeerGoneError, a dead address ConnectError", async () => {
      const server = await start(backend);
      const client = await connect(server.url, { timeoutMs: 2000 });
      await client.reset();
      await stop(server);
      const started = Date.now();
      await assert.rejects(client.step(1), PeerGoneError);
      assert.ok(Date.now() - started < 2000);
      await assert.rejects(client.step(1), PeerGoneError); // no silent reconnect
      await client.close();
      await assert.rejects(connect(server.url, { timeoutMs: 300 }), ConnectError);
    });
  });
}

describe("unix:// server robustness", () => {
  test("bad input is answered with ERROR and a second client is still served", async () => {
    const server = await start("unix");
    const good = await connect(server.url, { timeoutMs: 5000 });
    await good.reset();
    const stillServed = async (action: number): Promise<void> => {
      const result = (await good.step(action)) as pac_env.StepResultView;
      assert.equal(result.observation[0], action);
    };
    try {
      // garbage: an impossible header (body_len 0xFFFFFFFF) -> BODY_TOO_LARGE, then closed
      let raw = await Raw.open(server.url);
      raw.socket.write(Buffer.alloc(64, 0xff));
      let reply = await raw.read();
      assert.equal(reply.type, IDS.ERROR);
      assert.equal(code(reply.body), ErrorCode.BODY_TOO_LARGE);
      assert.equal(await raw.waitClosed(), true);
      await stillServed(1);

      // 4 GiB - 1 body_len: refused before the body, the msg_id echoed
      raw = await Raw.open(server.url);
      raw.socket.write(frame(IDS.STEP_REQ, 9, new Uint8Array(0)).fill(0xff, 5, 9));
      reply = await raw.read();
      assert.deepEqual([reply.type, reply.id, code(reply.body)], [IDS.ERROR, 9, ErrorCode.BODY_TOO_LARGE]);
      assert.match(reply.body.subarray(4).toString(), /body_len 4294967295 exceeds the maximum/);
      assert.equal(await raw.waitClosed(), true);
      await stillServed(2);

      // unknown msg_type: UNKNOWN_MESSAGE, closed
      raw = await Raw.open(server.url);
      raw.socket.write(frame(0x77, 5));
      reply = await raw.read();
      assert.deepEqual([reply.type, reply.id, code(reply.body)], [IDS.ERROR, 5, ErrorCode.UNKNOWN_MESSAGE]);
      assert.match(reply.body.subarray(4).toString(), /msg_type 0x77 is not a request/);
      assert.equal(await raw.waitClosed(), true);
      await stillServed(3);

      // a truncated frame, then close
      raw = await Raw.open(server.url);
      raw.socket.end(frame(IDS.HELLO_REQ, 1, Buffer.alloc(12)).subarray(0, 11));
      await raw.waitClosed();
      await stillServed(4);

      // STEP before HELLO: HELLO_REQUIRED, connection kept; a split HELLO then works
      raw = await Raw.open(server.url);
      raw.socket.write(frame(IDS.STEP_REQ, 1, Buffer.alloc(4)));
      reply = await raw.read();
      assert.deepEqual([reply.type, reply.id, code(reply.body)], [IDS.ERROR, 1, ErrorCode.HELLO_REQUIRED]);
      const hello = frame(IDS.HELLO_REQ, 2, encodeHello(pac_env.FINGERPRINT));
      raw.socket.write(hello.subarray(0, 4));
      await new Promise((resolve) => setTimeout(resolve, 20));
      raw.socket.write(hello.subarray(4));
      reply = await raw.read();
      assert.equal(reply.type, IDS.HELLO_RESP);
      assert.equal(reply.id, 2);
      // wrong body size: BAD_BODY_SIZE, kept; out-of-range: INVALID_ACTION, kept
      raw.socket.write(frame(IDS.RESET_REQ, 3, Buffer.alloc(2)));
      assert.equal(code((await raw.read()).body), ErrorCode.BAD_BODY_SIZE);
      raw.socket.write(frame(IDS.RESET_REQ, 4));
      assert.equal((await raw.read()).body.byteLength, RESULT);
      const action = Buffer.alloc(4);
      action.writeInt32LE(1000);
      raw.socket.write(frame(IDS.STEP_REQ, 5, action));
      reply = await raw.read();
      assert.deepEqual([reply.id, code(reply.body)], [5, ErrorCode.INVALID_ACTION]);
      action.writeInt32LE(6);
      raw.socket.write(frame(IDS.STEP_REQ, 6, action));
      reply = await raw.read();
      assert.equal(reply.type, IDS.STEP_RESP);
      assert.equal(reply.body.readFloatLE(0), 6);
      raw.close();
      await stillServed(5);

      // a fingerprint mismatch on the raw stream: ERROR 7 naming both, closed
      raw = await Raw.open(server.url);
      raw.socket.write(frame(IDS.HELLO_REQ, 7, encodeHello(0xabcdef0123456789n)));
      reply = await raw.read();
      assert.equal(code(reply.body), ErrorCode.FINGERPRINT_MISMATCH);
      assert.match(reply.body.toString(), new RegExp(`pac_env \\(fp ${pac_env.FINGERPRINT_HEX}\\).*abcdef0123456789`));
      assert.equal(await raw.waitClosed(), true);
      await stillServed(6);
    } finally {
      await good.close();
      await stop(server);
    }
  });

  test("a client that pipelines without reading makes the server pause, not buffer", async () => {
    const server = await start("unix");
    const raw = await Raw.open(server.url);
    try {
      raw.socket.pause(); // read nothing for now
      raw.socket.removeAllListeners("data");
      const count = 4000; // 4000 x 2557 bytes of responses = 10 MB
      const parts = [frame(IDS.HELLO_REQ, 1, encodeHello(pac_env.FINGERPRINT)), frame(IDS.RESET_REQ, 2)];
      const action = Buffer.alloc(4);
      for (let i = 0; i < count; i++) {
        action.writeInt32LE(i % 92);
        parts.push(frame(IDS.STEP_REQ, 3 + i, action));
      }
      raw.socket.write(Buffer.concat(parts));
      const deadline = Date.now() + 5000;
      while (server.stats.paused === 0 && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      assert.equal(server.stats.paused, 1, "the server should stop reading while its writes back up");
      assert.ok(server.stats.pauses >= 1);
      // now read everything: every request gets its response, in order
      const reader = new FrameReader(1 << 20);
      let seen = 0;
      let lastId = 0;
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`only ${seen} responses`)), 20000);
        raw.socket.on("data", (chunk: Buffer) => {
          reader.push(chunk);
          while (reader.next()) {
            seen += 1;
            assert.equal(reader.msgId, lastId + 1);
            lastId = reader.msgId;
            if (reader.msgId >= 3) {
              assert.equal(reader.msgType, IDS.STEP_RESP);
              assert.equal(reader.body.readFloatLE(reader.offset), (reader.msgId - 3) % 92);
            }
          }
          if (seen === count + 2) {
            clearTimeout(timer);
            resolve();
          }
        });
        raw.socket.resume();
      });
      assert.equal(server.stats.paused, 0);
    } finally {
      raw.close();
      await stop(server);
    }
  });

  test("socket file: 0600, a stale one replaced, a live one never stolen, removed on close", async () => {
    const url = uniqueUnixUrl();
    const path = pathOf(url);
    // a stale socket file: a server SIGKILLed while listening leaves it behind
    const crash = spawnSync(process.execPath, [
      "-e",
      "require('net').createServer().listen(process.argv[1], () => process.kill(process.pid, 'SIGKILL'))",
      path,
    ]);
    assert.equal(crash.signal, "SIGKILL");
    assert.equal(statSync(path).isSocket(), true);
    const server = await serve(() => new EchoEnv(), url);
    servers.add(server);
    try {
      assert.equal(statSync(path).mode & 0o777, 0o600);
      await assert.rejects(serve(() => new EchoEnv(), url), (error: unknown) => {
        assert.ok(error instanceof ConnectError);
        assert.match(error.message, /in use/);
        return true;
      });
      const client = await connect(url, { timeoutMs: 5000 });
      assert.equal(await client.health(), true);
      await client.close();
      // a regular file is never replaced
      const file = `${path}.file`;
      writeFileSync(file, "");
      try {
        await assert.rejects(serve(() => new EchoEnv(), `unix://${file}`), /not a socket/);
      } finally {
        unlinkSync(file);
      }
    } finally {
      await stop(server);
    }
    assert.equal(existsSync(path), false);
  });

  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    test(`library serve(): ${signal} removes the socket file, then the process dies of it`, async () => {
      const path = pathOf(uniqueUnixUrl());
      const script = [
        `const { serve } = require(${JSON.stringify(join(__dirname, "..", "index"))});`,
        `const { EchoEnv } = require(${JSON.stringify(join(__dirname, "..", "envs"))});`,
        "serve(() => new EchoEnv(), 'unix://' + process.argv[1]).then(() => console.log('ready'));",
      ].join("\n");
      const child = spawn(process.execPath, ["-e", script, path], { stdio: ["ignore", "pipe", "inherit"] });
      await new Promise<void>((resolve) => child.stdout.once("data", () => resolve()));
      assert.equal(statSync(path).isSocket(), true);
      const exited = new Promise<NodeJS.Signals | null>((resolve) =>
        child.once("exit", (_code, sig) => resolve(sig)),
      );
      child.kill(signal);
      assert.equal(await exited, signal);
      assert.equal(existsSync(path), false);
    });
  }

  test("library serve(): an application's own SIGTERM handler is left in charge", async () => {
    const path = pathOf(uniqueUnixUrl());
    const script = [
      `const { serve } = require(${JSON.stringify(join(__dirname, "..", "index"))});`,
      `const { EchoEnv } = require(${JSON.stringify(join(__dirname, "..", "envs"))});`,
      "serve(() => new EchoEnv(), 'unix://' + process.argv[1]).then((server) => {",
      "  process.on('SIGTERM', () => { console.log('app'); server.close().then(() => process.exit(7)); });",
      "  console.log('ready');",
      "});",
    ].join("\n");
    const child = spawn(process.execPath, ["-e", script, path], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    await new Promise<void>((resolve) =>
      child.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes("ready")) resolve();
      }),
    );
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    assert.equal(await exited, 7);
    assert.match(out, /app/);
    assert.equal(existsSync(path), false);
  });

  test("a silent server is TransportTimeoutError within the timeout", async () => {
    const url = uniqueUnixUrl();
    const silent = net.createServer((socket) => socket.on("data", () => undefined));
    await new Promise<void>((resolve) => silent.listen(pathOf(url), resolve));
    try {
      const started = Date.now();
      await assert.rejects(connect(url, { timeoutMs: 300 }), TransportTimeoutError);
      assert.ok(Date.now() - started < 2000);
    } finally {
      await new Promise((resolve) => silent.close(resolve));
    }
    assert.equal(existsSync(pathOf(url)), false);
  });
});

describe("http:// server robustness", () => {
  test("non-loopback binds are refused unless allowed", async () => {
    await assert.rejects(serve(() => new EchoEnv(), "http://0.0.0.0:0"), /allow_remote/);
    await assert.rejects(serve(() => new EchoEnv(), "http://:0"), /allow_remote/);
    const server = await serve(() => new EchoEnv(), "http://0.0.0.0:0?allow_remote=1");
    servers.add(server);
    assert.doesNotMatch(server.url, /:0$/);
    await stop(server);
    await assert.rejects(serve(() => new EchoEnv(), "http://127.0.0.1:0/path"), ConnectError);
    await assert.rejects(connect("http://127.0.0.1", { timeoutMs: 300 }), ConnectError);
    await assert.rejects(connect("nope://127.0.0.1:1", { timeoutMs: 300 }), /no backend for nope/);
  });

  test("413 before the body, then the connection is closed; others are served", async () => {
    const server = await start("http", { maxBody: 1024 });
    try {
      const client = await connect(server.url, { timeoutMs: 5000 });
      const type = await client.channel.request(IDS.STEP_BATCH_REQ, Buffer.alloc(4096));
      assert.equal(type, IDS.ERROR);
      assert.equal(client.channel.buffer.readUInt16LE(16), ErrorCode.BODY_TOO_LARGE);
      await assert.rejects(client.health(), PeerGoneError);
      await client.close();
      const other = await connect(server.url, { timeoutMs: 5000 });
      assert.equal(await other.health(), true);
      await other.close();
    } finally {
      await stop(server);
    }
  });
});
