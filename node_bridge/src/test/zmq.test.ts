/**
 * zmq+ipc:// and zmq+tcp:// on the Node side: the Node client (zeromq.js Dealer) with the Node
 * server (Router) in process, and with a real Python server process (`python3 -m
 * transport.tools.serve_cli zmq+ipc://... --env pac --lang python`): round trips, batches,
 * pipelining, bad input, stale replies, dead servers, ipc files, CURVE.
 */

import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, describe, test } from "node:test";
import * as zmq from "zeromq";

import {
  ZERO_COPY_THRESHOLD,
  ZmqChannel,
  curvePublic,
  openChannel,
  parseUrl,
  z85Decode,
  z85Encode,
} from "../backends/zmq";
import { EchoEnv, PacEnv } from "../envs";
import {
  type Client,
  ConnectError,
  PeerGoneError,
  RemoteError,
  type Server,
  TransportTimeoutError,
  connect,
  serve,
} from "../index";
import * as pac_env from "../generated/pac_env";
import { BODY_OFFSET, ErrorCode, MESSAGE_IDS as IDS, encodeHello, packHeader, readU32 } from "../protocol";

const ROOT = resolve(__dirname, "..", "..", "..");
const PYTHON = process.env.PYTHON ?? join(ROOT, ".venv", "bin", "python"); // the set-up's venv
const HAVE_PYTHON =
  spawnSync(PYTHON, ["-c", "import transport.backends.zmq"], { cwd: ROOT }).status === 0;
const skipPython = HAVE_PYTHON ? false : `${PYTHON} cannot import transport.backends.zmq`;
const RESULT = pac_env.StepResultCodec.size;
const KINDS = ["ipc", "tcp"] as const;

const servers = new Set<Server>();
after(async () => {
  for (const server of servers) await server.close();
});

function zmqUrl(kind: "ipc" | "tcp"): string {
  return kind === "ipc"
    ? `zmq+ipc://${join(tmpdir(), `transport-node-zmq-${randomBytes(6).toString("hex")}.sock`)}`
    : "zmq+tcp://127.0.0.1:0";
}

function ipcPath(url: string): string {
  return parseUrl(url).path;
}

async function start(url: string, numEnvs = 1, env: "echo" | "pac" = "echo"): Promise<Server> {
  const factory = env === "echo" ? () => new EchoEnv() : () => new PacEnv();
  const server = await serve(factory, url, { envName: env, numEnvs });
  servers.add(server);
  return server;
}

async function stop(server: Server): Promise<void> {
  await server.close();
  servers.delete(server);
  if (server.url.startsWith("zmq+ipc")) assert.equal(existsSync(ipcPath(server.url)), false);
}

function errorCodeOf(body: Buffer): number {
  return body.readUInt16LE(0);
}

/** A bare zeromq.js Dealer speaking (or mangling) the protocol by hand. */
class Raw {
  readonly sock = new zmq.Dealer({ linger: 0, receiveTimeout: 5000 });
  constructor(url: string) {
    this.sock.connect(parseUrl(url).endpoint);
  }
  async frame(msgType: number, msgId: number, body: Buffer = Buffer.alloc(0)): Promise<void> {
    const header = Buffer.alloc(9);
    packHeader(header, 0, msgType, msgId, body.byteLength);
    await this.sock.send([header, body]);
  }
  async recv(): Promise<[number, number, Buffer]> {
    const [header, body] = (await this.sock.receive()) as [Buffer, Buffer];
    assert.equal(header.byteLength, 9);
    assert.equal(readU32(header, 5), body.byteLength);
    return [header[0] as number, readU32(header, 1), body];
  }
  close(): void {
    this.sock.close();
  }
}

describe("zmq: Node client <-> Node server", () => {
  for (const kind of KINDS) {
    test(`${kind}: round trip, 8-env batch, file mode, removal on close`, async () => {
      const server = await start(zmqUrl(kind));
      if (kind === "ipc") assert.equal(statSync(ipcPath(server.url)).mode & 0o777, 0o600);
      else assert.doesNotMatch(server.url, /:0$/);
      const client = await connect(server.url, { timeoutMs: 5000 });
      assert.ok(client.channel instanceof ZmqChannel);
      assert.equal(client.serverInfo.server, "node");
      assert.equal(await client.health(), true);
      assert.deepEqual(await client.spaces(), { obsN: 612, actN: 92 });
      await client.reset();
      const result = (await client.step(7)) as pac_env.StepResultView;
      assert.equal(result.observation[0], 7);
      await client.close();

      const batch = await start(zmqUrl(kind), 8);
      const many = await connect(batch.url, { timeoutMs: 5000 });
      assert.equal(many.numEnvs, 8);
      await many.reset(1n);
      const actions = [0, 1, 2, 3, 88, 89, 90, 91];
      const views = (await many.step(actions)) as pac_env.StepResultView[];
      assert.deepEqual(
        views.map((v) => v.observation[0]),
        actions,
      );
      await many.close();
      await stop(batch);
      await stop(server);
    });
  }

  test("bad input is answered with ERROR and other clients keep being served", async () => {
    const server = await start(zmqUrl("ipc"));
    const good = await connect(server.url, { timeoutMs: 5000 });
    await good.reset();
    const stillServed = async (): Promise<void> => {
      assert.equal(((await good.step(3)) as pac_env.StepResultView).observation[0], 3);
    };
    const raw = new Raw(server.url);
    try {
      await raw.sock.send(Buffer.alloc(64, 0xff)); // one part: no [header, body]
      let [type, , body] = await raw.recv();
      assert.deepEqual([type, errorCodeOf(body)], [IDS.ERROR, ErrorCode.BAD_FRAME]);
      await stillServed();

      const huge = Buffer.alloc(9);
      packHeader(huge, 0, IDS.STEP_REQ, 9, 0xffffffff);
      await raw.sock.send([huge, Buffer.alloc(0)]);
      let id: number;
      [type, id, body] = await raw.recv();
      assert.deepEqual([type, id, errorCodeOf(body)], [IDS.ERROR, 9, ErrorCode.BODY_TOO_LARGE]);

      await raw.frame(IDS.HELLO_REQ, 1, encodeHello(pac_env.FINGERPRINT));
      assert.equal((await raw.recv())[0], IDS.HELLO_RESP);
      await raw.frame(0x77, 5);
      [type, id, body] = await raw.recv();
      assert.deepEqual([type, id, errorCodeOf(body)], [IDS.ERROR, 5, ErrorCode.UNKNOWN_MESSAGE]);
      await raw.frame(IDS.HEALTH_REQ, 6);
      assert.equal(errorCodeOf((await raw.recv())[2]), ErrorCode.HELLO_REQUIRED);

      await raw.frame(IDS.HELLO_REQ, 7, encodeHello(pac_env.FINGERPRINT ^ 1n));
      [type, id, body] = await raw.recv();
      assert.deepEqual([type, id, errorCodeOf(body)], [IDS.ERROR, 7, ErrorCode.FINGERPRINT_MISMATCH]);
      assert.match(body.toString("utf8"), new RegExp(pac_env.FINGERPRINT.toString(16).padStart(16, "0")));
      await stillServed();
    } finally {
      raw.close();
    }
    await assert.rejects(good.step(92), (e: unknown) => e instanceof RemoteError && e.code === ErrorCode.INVALID_ACTION);
    await stillServed();
    await good.close();
    await stop(server);
  });

  test("pipelined requests keep their own reply bytes, above the zero-copy threshold too", async () => {
    const envs = Math.floor(ZERO_COPY_THRESHOLD / RESULT) + 1;
    for (const numEnvs of [1, envs]) {
      const server = await start(zmqUrl("ipc"), numEnvs);
      const client = await connect(server.url, { timeoutMs: 5000 });
      await client.reset();
      const channel = client.channel as ZmqChannel;
      const type = numEnvs === 1 ? IDS.STEP_REQ : IDS.STEP_BATCH_REQ;
      const ids: number[] = [];
      for (const action of [4, 5, 6]) {
        const body = Buffer.alloc(4 * numEnvs);
        for (let i = 0; i < numEnvs; i++) body.writeInt32LE(action, 4 * i);
        ids.push(await channel.sendRequest(type, body));
      }
      for (const [i, action] of [4, 5, 6].entries()) {
        await channel.recvResponse(ids[i] as number, Date.now() + 5000);
        assert.equal(channel.bodyLength, numEnvs * RESULT);
        for (let e = 0; e < numEnvs; e += Math.max(1, numEnvs - 1)) {
          assert.equal(channel.buffer.readFloatLE(BODY_OFFSET + e * RESULT), action);
        }
      }
      await client.close();
      await stop(server);
    }
  });

  test("a silent server is a timeout, its late reply is discarded, a closed one PeerGone", async () => {
    const router = new zmq.Router({ linger: 0 });
    await router.bind("tcp://127.0.0.1:*");
    const url = `zmq+${router.lastEndpoint as string}`;
    const client = await openChannel(url, { timeoutMs: 300 });
    try {
      await silentThenClosed(router, client);
    } finally {
      client.close();
      router.close();
    }
  });

  async function silentThenClosed(router: zmq.Router, client: ZmqChannel): Promise<void> {
    const started = Date.now();
    await assert.rejects(client.request(IDS.HEALTH_REQ, Buffer.alloc(0)), TransportTimeoutError);
    assert.ok(Date.now() - started < 2000);
    const [identity, staleHeader] = (await router.receive()) as [Buffer, Buffer, Buffer];
    const reply = async (header: Buffer, body: Buffer): Promise<void> => {
      const out = Buffer.alloc(9);
      packHeader(out, 0, IDS.HEALTH_RESP, readU32(header, 1), body.byteLength);
      await router.send([identity, out, body]);
    };
    await reply(staleHeader, Buffer.from([0])); // late: must be dropped by msg_id
    client.timeoutMs = 5000;
    const pending = client.request(IDS.HEALTH_REQ, Buffer.alloc(0));
    const [, header] = (await router.receive()) as [Buffer, Buffer, Buffer];
    await reply(header, Buffer.from([1]));
    assert.equal(await pending, IDS.HEALTH_RESP);
    assert.equal(client.buffer[BODY_OFFSET], 1);

    const waiting = client.request(IDS.HEALTH_REQ, Buffer.alloc(0));
    await router.receive();
    router.close();
    await assert.rejects(waiting, PeerGoneError);
    client.timeoutMs = 300; // the connection is lost for good: the next request fails at once
    await assert.rejects(client.request(IDS.HEALTH_REQ, Buffer.alloc(0)), PeerGoneError);
  }

  test("ipc: a live path is never stolen, a stale one replaced; nothing listening is ConnectError", async () => {
    const server = await start(zmqUrl("ipc"));
    await assert.rejects(start(server.url), /in use by a live server/);
    await stop(server);
    const stalePath = ipcPath(zmqUrl("ipc"));
    writeFileSync(stalePath, "not a socket");
    await assert.rejects(start(`zmq+ipc://${stalePath}`), /not a socket/);
    rmSync(stalePath);
    await assert.rejects(connect(zmqUrl("ipc"), { timeoutMs: 300 }), ConnectError);
    await assert.rejects(start("zmq+tcp://0.0.0.0:0"), /allow_insecure/);
    await assert.rejects(connect("zmq+tcp://127.0.0.1:1?bogus=1"), ConnectError);
  });

  test("CURVE: an allowed key works, an unknown key is refused", async () => {
    const dir = mkdtempSync(join(tmpdir(), "transport-node-curve-"));
    try {
      const serverKeys = zmq.curveKeyPair();
      const clientKeys = zmq.curveKeyPair();
      const otherKeys = zmq.curveKeyPair();
      assert.equal(z85Encode(curvePublic(z85Decode(clientKeys.secretKey))), clientKeys.publicKey);
      const cert = (pub: string, sec?: string): string =>
        `#   ZeroMQ CURVE Certificate\n\nmetadata\ncurve\n    public-key = "${pub}"\n` +
        (sec ? `    secret-key = "${sec}"\n` : "");
      writeFileSync(join(dir, "server.key_secret"), cert(serverKeys.publicKey, serverKeys.secretKey), { mode: 0o600 });
      writeFileSync(join(dir, "server.key"), cert(serverKeys.publicKey));
      writeFileSync(join(dir, "client.key_secret"), cert(clientKeys.publicKey, clientKeys.secretKey), { mode: 0o600 });
      writeFileSync(join(dir, "other.key_secret"), cert(otherKeys.publicKey, otherKeys.secretKey), { mode: 0o600 });
      mkdirSync(join(dir, "clients"));
      writeFileSync(join(dir, "clients", "client.key"), cert(clientKeys.publicKey));
      const server = await start(
        `zmq+tcp://0.0.0.0:0?server_key=${dir}/server.key_secret&clients=${dir}/clients`,
      );
      const port = server.url.slice(server.url.lastIndexOf(":") + 1).split("?")[0];
      const base = `zmq+tcp://127.0.0.1:${port}?server_key=${dir}/server.key`;
      const client = await connect(`${base}&client_key=${dir}/client.key_secret`, { timeoutMs: 5000 });
      await client.reset();
      assert.equal(((await client.step(9)) as pac_env.StepResultView).observation[0], 9);
      await client.close();
      await assert.rejects(
        connect(`${base}&client_key=${dir}/other.key_secret`, { timeoutMs: 3000 }),
        /refused this client's CURVE key/,
      );
      await assert.rejects(connect(base, { timeoutMs: 1000 }), /own key pair/);
      await stop(server);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** A Python `transport-serve` process; resolves once it printed `ready URL`. */
class PythonServer {
  readonly proc: ChildProcessWithoutNullStreams;
  url = "";

  constructor(url: string, args: string[]) {
    this.proc = spawn(PYTHON, ["-m", "transport.tools.serve_cli", url, "--lang", "python", ...args], {
      cwd: ROOT,
      stdio: ["pipe", "pipe", "pipe"],
    });
  }

  static async start(url: string, ...args: string[]): Promise<PythonServer> {
    const server = new PythonServer(url, args);
    server.url = await new Promise<string>((ok, fail) => {
      let out = "";
      let err = "";
      const timer = setTimeout(() => fail(new Error(`no ready line in 20 s: ${err}`)), 20_000);
      server.proc.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
      server.proc.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes("\n")) {
          clearTimeout(timer);
          const line = out.split("\n")[0] as string;
          if (line.startsWith("ready ")) ok(line.slice(6).trim());
          else fail(new Error(`server failed to start: ${line} ${err}`));
        }
      });
      server.proc.once("exit", (code) => {
        clearTimeout(timer);
        fail(new Error(`server exited with ${code}: ${err}`));
      });
    });
    return server;
  }

  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise<void>((ok) => this.proc.once("exit", () => ok()));
    this.proc.kill(signal);
    await exited;
  }
}

async function playDigest(client: Client, games: number): Promise<[string, number]> {
  const hash = createHash("sha256");
  const channel = client.channel;
  let steps = 0;
  for (let game = 0; game < games; game++) {
    let result = (await client.reset(BigInt(game))) as pac_env.StepResultView;
    hash.update(channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength));
    for (let step = 0; step < 2000; step++) {
      const legal: number[] = [];
      for (let a = 0; a < 92; a++) if (result.action_mask[a]) legal.push(a);
      assert.ok(legal.length > 0);
      result = (await client.step(legal[(game * 31 + step * 7) % legal.length] as number)) as pac_env.StepResultView;
      hash.update(channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength));
      steps += 1;
      if (result.done) break;
    }
  }
  return [hash.digest("hex"), steps];
}

describe("zmq: Node client <-> Python server", { skip: skipPython }, () => {
  test("pac over zmq+ipc: the same bytes as the Node server; errors typed", async () => {
    const python = await PythonServer.start(zmqUrl("ipc"), "--env", "pac");
    try {
      const client = await connect(python.url, { timeoutMs: 10_000 });
      assert.equal(client.serverInfo.server, "python");
      const fromPython = await playDigest(client, 5);
      await assert.rejects(client.step(92), (e: unknown) => e instanceof RemoteError);
      await client.close();

      const node = await start(zmqUrl("ipc"), 1, "pac");
      const nodeClient = await connect(node.url, { timeoutMs: 10_000 });
      const fromNode = await playDigest(nodeClient, 5);
      await nodeClient.close();
      await stop(node);
      assert.ok(fromPython[1] > 5);
      assert.deepEqual(fromNode, fromPython);
    } finally {
      await python.stop();
    }
    assert.equal(existsSync(ipcPath(python.url)), false);
  });

  test("pac over zmq+tcp, 8 envs; a killed server is PeerGoneError within the timeout", async () => {
    const python = await PythonServer.start(zmqUrl("tcp"), "--env", "echo", "--num-envs", "8");
    try {
      const client = await connect(python.url, { timeoutMs: 2000 });
      assert.equal(client.numEnvs, 8);
      await client.reset();
      const views = (await client.step([1, 2, 3, 4, 5, 6, 7, 8])) as pac_env.StepResultView[];
      assert.deepEqual(
        views.map((v) => v.observation[0]),
        [1, 2, 3, 4, 5, 6, 7, 8],
      );
      await python.stop("SIGKILL");
      const started = Date.now();
      await assert.rejects(client.step([1, 1, 1, 1, 1, 1, 1, 1]), PeerGoneError);
      assert.ok(Date.now() - started < 2500);
      await assert.rejects(client.step([1, 1, 1, 1, 1, 1, 1, 1]), PeerGoneError);
      await client.close();
    } finally {
      await python.stop("SIGKILL");
    }
  });
});
