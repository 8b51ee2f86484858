/**
 * The Node client against a real Python server process (`python3 -m transport.tools.serve_cli
 * URL --env pac --lang python`) and against the Node server: the same seeded pac games must give
 * byte-identical traces over unix:// and http://. Skipped when Python cannot import `transport`.
 */

import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { describe, test } from "node:test";

import { PacEnv } from "../envs";
import {
  type Client,
  FingerprintMismatchError,
  PeerGoneError,
  RemoteError,
  TransportTimeoutError,
  connect,
  serve,
} from "../index";
import * as pac_env from "../generated/pac_env";
import { BODY_OFFSET, ErrorCode } from "../protocol";

const ROOT = resolve(__dirname, "..", "..", "..");
const PYTHON = process.env.PYTHON ?? join(ROOT, ".venv", "bin", "python"); // the set-up's venv
const HAVE_PYTHON =
  spawnSync(PYTHON, ["-c", "import transport.tools.serve_cli"], { cwd: ROOT }).status === 0;
const skip = HAVE_PYTHON ? false : `${PYTHON} cannot import transport (pip install -e '.[dev]')`;

const GAMES = 12;
const MAX_STEPS = 2000;

function uniqueUrl(backend: "unix" | "http"): string {
  return backend === "unix"
    ? `unix://${join(tmpdir(), `transport-node-client-${randomBytes(6).toString("hex")}.sock`)}`
    : "http://127.0.0.1:0";
}

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

  static async start(backend: "unix" | "http", ...args: string[]): Promise<PythonServer> {
    const server = new PythonServer(uniqueUrl(backend), args);
    server.url = await new Promise<string>((ok, fail) => {
      let out = "";
      let err = "";
      const timer = setTimeout(() => fail(new Error(`no ready line in 20 s: ${err}`)), 20_000);
      server.proc.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
      server.proc.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        const line = out.split("\n")[0] as string;
        if (out.includes("\n")) {
          clearTimeout(timer);
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

  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<number | null> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return this.proc.exitCode;
    const exited = new Promise<number | null>((ok) => this.proc.once("exit", (code) => ok(code)));
    this.proc.kill(signal);
    const code = await exited;
    if (this.url.startsWith("unix://")) {
      const path = this.url.slice("unix://".length);
      if (signal === "SIGKILL" && existsSync(path)) {
        (await import("node:fs")).unlinkSync(path); // SIGKILL leaves the file
      }
      assert.equal(existsSync(path), false, `the server left ${path}`);
    }
    return code;
  }
}

/**
 * Wait until every thread of `pid` is stopped: SIGSTOP wakes one thread of a multi-threaded
 * process, which then stops the others, so a request sent right after kill() can still be
 * answered by a thread that has not been told yet.
 */
async function waitStopped(pid: number): Promise<void> {
  const deadline = Date.now() + 5000;
  while (Date.now() < deadline) {
    const tasks = readdirSync(`/proc/${pid}/task`);
    const stopped = tasks.every((task) => {
      try {
        return /^State:\s+[Tt]/m.test(readFileSync(`/proc/${pid}/task/${task}/status`, "utf8"));
      } catch {
        return true; // the thread is gone
      }
    });
    if (stopped) return;
    await new Promise((ok) => setTimeout(ok, 5));
  }
  throw new Error(`process ${pid} did not stop`);
}

/** mulberry32: the games' policy RNG. */
function policyRng(seed: number): (n: number) => number {
  let a = seed >>> 0;
  return (n: number) => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) % n;
  };
}

/** Seeded pac games under a random legal policy: a digest of every response body. */
async function play(client: Client): Promise<{ digest: string; steps: number }> {
  const hash = createHash("sha256");
  const channel = client.channel;
  const record = (): void => {
    hash.update(channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength));
  };
  let steps = 0;
  const legal: number[] = [];
  for (let game = 0; game < GAMES; game++) {
    const rng = policyRng(game);
    let result = (await client.reset(BigInt(game))) as pac_env.StepResultView;
    record();
    for (let i = 0; i < MAX_STEPS; i++) {
      legal.length = 0;
      const mask = result.action_mask;
      for (let a = 0; a < mask.length; a++) if (mask[a]) legal.push(a);
      assert.ok(legal.length > 0, "the mask forbids every action");
      result = (await client.step(legal[rng(legal.length)] as number)) as pac_env.StepResultView;
      record();
      steps += 1;
      if (result.done) break;
      assert.ok(i < MAX_STEPS - 1, `game ${game} did not end`);
    }
  }
  return { digest: hash.digest("hex"), steps };
}

describe("node client against the python and node servers", { skip }, () => {
  test("the same seeded pac traces from python and node servers, over unix and http", async () => {
    const traces = new Map<string, { digest: string; steps: number }>();
    for (const backend of ["unix", "http"] as const) {
      const python = await PythonServer.start(backend, "--env", "pac");
      try {
        const client = await connect(python.url, { timeoutMs: 10_000 });
        const { num_envs, env, server } = client.serverInfo;
        assert.deepEqual({ num_envs, env, server }, { num_envs: 1, env: "pac", server: "python" });
        traces.set(`${backend}/python`, await play(client));
        await client.close();
      } finally {
        assert.equal(await python.stop(), 0);
      }
      const node = await serve(() => new PacEnv(), uniqueUrl(backend), { envName: "pac" });
      try {
        const client = await connect(node.url, { timeoutMs: 10_000 });
        traces.set(`${backend}/node`, await play(client));
        await client.close();
      } finally {
        await node.close();
      }
    }
    const reference = traces.get("unix/python");
    assert.ok(reference !== undefined && reference.steps > GAMES);
    for (const [key, trace] of traces) assert.deepEqual(trace, reference, `${key} differs from unix/python`);
  });

  for (const backend of ["unix", "http"] as const) {
    test(`python server over ${backend}://: batches, errors, fingerprints, first seed`, async () => {
      const python = await PythonServer.start(backend, "--env", "pac", "--num-envs", "3", "--seed", "40");
      const node = await serve(() => new PacEnv(), uniqueUrl(backend), { envName: "pac", numEnvs: 3, seed: 40 });
      try {
        const bodies: Buffer[] = [];
        for (const url of [python.url, node.url]) {
          const client = await connect(url, { timeoutMs: 10_000 });
          assert.equal(client.numEnvs, 3);
          const first = (await client.reset()) as pac_env.StepResultView[]; // first seed 40, 41, 42
          assert.equal(first.length, 3);
          const reset = Buffer.from(client.channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + client.channel.bodyLength));
          await assert.rejects(client.step([0, 0, 92]), (e: unknown) =>
            e instanceof RemoteError && e.code === ErrorCode.INVALID_ACTION && /env 2: action 92/.test(e.text));
          const stepped = (await client.step([0, 0, 0])) as pac_env.StepResultView[];
          assert.equal(stepped.length, 3);
          const step = Buffer.from(client.channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + client.channel.bodyLength));
          bodies.push(Buffer.concat([reset, step]));
          assert.deepEqual(await client.spaces(), { obsN: 612, actN: 92 });
          await client.close();
          const other = { ...pac_env.SCHEMA, fingerprint: 0x0123456789abcdefn };
          await assert.rejects(connect(url, { timeoutMs: 5000, schema: other }), (e: unknown) =>
            e instanceof FingerprintMismatchError && /0123456789abcdef/.test(e.message) && e.message.includes(pac_env.FINGERPRINT_HEX));
        }
        assert.equal(bodies[0]?.equals(bodies[1] as Buffer), true, "python and node answer different bytes");
      } finally {
        await node.close();
        assert.equal(await python.stop(), 0);
      }
    });

    test(`python server over ${backend}://: killed is PeerGoneError, stopped is a timeout`, async () => {
      const python = await PythonServer.start(backend, "--env", "echo");
      const client = await connect(python.url, { timeoutMs: 500 });
      try {
        await client.reset();
        python.proc.kill("SIGSTOP");
        await waitStopped(python.proc.pid as number);
        let started = Date.now();
        await assert.rejects(client.step(1), TransportTimeoutError);
        assert.ok(Date.now() - started < 2000);
        python.proc.kill("SIGCONT");
        const fresh = await connect(python.url, { timeoutMs: 2000 });
        await fresh.reset();
        await python.stop("SIGKILL");
        started = Date.now();
        await assert.rejects(fresh.step(1), PeerGoneError);
        assert.ok(Date.now() - started < 2000);
        await fresh.close();
      } finally {
        await client.close();
        await python.stop("SIGKILL");
      }
    });
  }
});

describe("a client's envs are made once, and a factory's repeat is refused", () => {
  // unix and zmq frames carry no schema and HTTP adopts the discovered fingerprint: the
  // server builds one session (and its envs) per client, not one per connection attempt (the
  // client used to reconnect after a discovering HELLO: two sets of envs, one thrown away);
  // the envs the server makes at start to check the factory serve the first client
  const urls = {
    unix: () => uniqueUrl("unix"),
    http: () => uniqueUrl("http"),
    "zmq+ipc": () => `zmq+ipc://${join(tmpdir(), `transport-node-disc-${randomBytes(6).toString("hex")}.sock`)}`,
    shm: () => `shm://transport-node-disc-${randomBytes(6).toString("hex")}`,
  };
  for (const [scheme, url] of Object.entries(urls)) {
    test(`over ${scheme}://: a discovering client's envs are the ones made at start`, async () => {
      let made = 0;
      const factory = (): PacEnv => {
        made += 1;
        return new PacEnv();
      };
      const server = await serve(factory, url(), { envName: "pac", numEnvs: 3, schema: pac_env.SCHEMA });
      try {
        assert.equal(made, 3);
        const client = await connect(server.url, { timeoutMs: 10_000 });
        assert.equal(client.schema.fingerprint, pac_env.SCHEMA.fingerprint);
        const first = (await client.reset(5)) as pac_env.StepResultView[];
        assert.equal(first.length, 3);
        await client.step([0, 0, 0]);
        assert.equal(made, 3); // (an shm server makes the next client's envs once this one left)
        await client.close();
      } finally {
        await server.close();
      }
    });

    test(`over ${scheme}://: a factory returning one object again is refused, saying why`, async () => {
      const env = new PacEnv();
      const server = await serve(() => env, url(), { envName: "pac", schema: pac_env.SCHEMA });
      try {
        const client = await connect(server.url, { timeoutMs: 10_000 });
        await client.reset(1); // the first client steps the env made at start
        await client.close();
        const second = async (): Promise<void> => {
          const again = await connect(server.url, { timeoutMs: 10_000 });
          try {
            await again.reset(1); // shm: the client's first request is the server's first word
          } finally {
            await again.close();
          }
        };
        await assert.rejects(
          second(),
          (e: unknown) =>
            e instanceof RemoteError &&
            e.code === ErrorCode.INTERNAL &&
            /returned an env object it had returned before/.test(e.text) &&
            /pass the object itself/.test(e.text),
        );
      } finally {
        await server.close();
      }
    });
  }
});

describe("a second call while a request is in flight is refused at once, on every backend", () => {
  // zmq let both go: the second's reply wait took the first's, which timed out (3 s) with no
  // word of why; the other backends refused the second call (the rule is the channels')
  const urls = {
    unix: () => uniqueUrl("unix"),
    http: () => uniqueUrl("http"),
    "zmq+ipc": () => `zmq+ipc://${join(tmpdir(), `transport-node-busy-${randomBytes(6).toString("hex")}.sock`)}`,
    shm: () => `shm://transport-node-busy-${randomBytes(6).toString("hex")}`,
  };
  for (const [scheme, url] of Object.entries(urls)) {
    test(`over ${scheme}://`, async () => {
      const server = await serve(() => new PacEnv(), url(), { envName: "pac", numEnvs: 2, schema: pac_env.SCHEMA });
      try {
        const client = await connect(server.url, { timeoutMs: 3000 });
        try {
          await client.reset(1);
          const started = Date.now();
          const outcome = (p: Promise<unknown>): Promise<string> =>
            p.then(
              () => "ok",
              (e: unknown) => (e as Error).message,
            );
          const [first, second] = await Promise.all([outcome(client.step([0, 0])), outcome(client.step([1, 1]))]);
          assert.equal(first, "ok");
          assert.match(second, /a request is already in flight on this client \(await it first\)/);
          assert.ok(Date.now() - started < 2000, `took ${Date.now() - started} ms`);
          await client.step([0, 0]); // the client goes on
        } finally {
          await client.close();
        }
      } finally {
        await server.close();
      }
    });
  }
});

describe("a client's envs are closed when it leaves; a shared env is not", () => {
  // before: an ordinary env a factory made was never closed (only a vector env was); the stream
  // servers did not even close a session's runtime when its connection ended
  class Closing extends PacEnv {
    static closed = 0;
    close(): void {
      Closing.closed += 1;
    }
  }
  const urls = {
    unix: () => uniqueUrl("unix"),
    http: () => uniqueUrl("http"),
    "zmq+ipc": () => `zmq+ipc://${join(tmpdir(), `transport-node-close-${randomBytes(6).toString("hex")}.sock`)}`,
    shm: () => `shm://transport-node-close-${randomBytes(6).toString("hex")}`,
  };
  const until = async (ok: () => boolean): Promise<void> => {
    for (let i = 0; i < 200 && !ok(); i++) await new Promise((r) => setTimeout(r, 25));
  };
  for (const [scheme, url] of Object.entries(urls)) {
    test(`over ${scheme}:// (zmq: when the server drops the session, here at its close)`, async () => {
      Closing.closed = 0;
      let server = await serve(() => new Closing(), url(), { envName: "pac", schema: pac_env.SCHEMA });
      try {
        const client = await connect(server.url, { timeoutMs: 10_000 });
        await client.reset(1);
        await client.close();
        if (scheme === "zmq+ipc") await server.close();
        await until(() => Closing.closed === 1);
        assert.equal(Closing.closed, 1);
      } finally {
        await server.close();
      }
      Closing.closed = 0;
      const shared = new Closing();
      server = await serve(shared, url(), { envName: "pac", schema: pac_env.SCHEMA });
      try {
        for (const seed of [1, 2]) {
          const client = await connect(server.url, { timeoutMs: 10_000 });
          await client.reset(seed);
          await client.close();
        }
        await new Promise((r) => setTimeout(r, 200));
        assert.equal(Closing.closed, 0);
      } finally {
        await server.close();
      }
    });
  }
});
