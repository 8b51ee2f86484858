/**
 * Asynchronous batches on a Node server whose envs run in worker threads (`transport-serve URL
 * --lang node --workers 2`, a real server process over unix): SEND submits the envs to the pool,
 * RECV returns the first that finished (a slow env does not hold back the others), results are
 * those of lock-step per env id, misuse codes are unchanged, and an env that throws (or a worker
 * thread that dies) is the RECV's ENV_ERROR while the next request works.
 *
 * This file is also the module the server's worker threads load `makeGated` from: its tests run
 * only when it is the main module (node --test), not when a server requires it.
 */

import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { spawnSync } from "node:child_process";
import { test } from "node:test";

import { encode as msgpackEncode } from "@msgpack/msgpack";
import { EchoEnv, type EchoResult } from "../envs/echo";
import * as pac_env from "../generated/pac_env";
import { type Client, RemoteError, connect } from "../index";
import { AutoReset, ErrorCode, MESSAGE_IDS as IDS, encodeHello } from "../protocol";
import { LATER, sessionFactory } from "../runtime/session";
import { GATE_ENV, waitForGate } from "./gate";

const N = 4;
/** Actions of the gated env: SLOW waits for the gate file, POISON throws, EXIT ends the thread. */
const SLOW = 50;
const POISON = 7;
const EXIT = 8;

/** Echo, but SLOW waits (up to 20 s) until the file `$TRANSPORT_TEST_GATE` exists. */
class GatedEnv extends EchoEnv {
  override step(action: number): EchoResult {
    if (action === POISON) throw new TypeError("poisoned action");
    if (action === EXIT) process.exit(3);
    if (action === SLOW) waitForGate();
    return super.step(action);
  }
}

export function makeGated(): GatedEnv {
  return new GatedEnv();
}

const NODE_ROOT = resolve(__dirname, "..", "..");
const SERVE = join(NODE_ROOT, "dist", "cli", "serve.js");
const ROOT = resolve(NODE_ROOT, "..");
const PYTHON = process.env.PYTHON ?? join(ROOT, ".venv", "bin", "python");
const HAVE_PYTHON = spawnSync(PYTHON, ["-c", "import transport"], { cwd: ROOT }).status === 0;

/**
 * The Python shm client's side of the shm test (argv: URL, gate file; 5 envs: worker 0 has envs
 * 0..2, worker 1 envs 3 and 4): a gated env among fast ones, sent as a subset (a SEND of every
 * env is a lock-step STEP to an shm server); prints JSON of what came back.
 */
const SHM_CLIENT = `
import json, sys
import transport
url, gate = sys.argv[1], sys.argv[2]
out = {}
def rows(got):
    return [[int(i), [float(v) for v in got.results["observation"][k][:2]]] for k, i in enumerate(got.env_ids.tolist())]
with transport.connect(url, timeout=20.0) as c:
    c.async_reset(0)
    out["reset"] = sorted(c.recv(5).env_ids.tolist())
    c.send([${SLOW}, 3, 4], [0, 3, 4])
    out["first"] = sorted(rows(c.recv(2)))
    c.send([9], [3])  # a new SEND while env 0 is in flight
    out["second"] = rows(c.recv(1))
    open(gate, "w").write("open")
    out["rest"] = rows(c.recv(1))
    try:
        c.send([${POISON}, 2], [1, 2])
        c.recv(2)
    except transport.errors.RemoteError as e:
        out["error"] = [int(e.code), str(e)]
    out["later"] = rows(c.recv(2))
    c.send([4, 4], [1, 4])
    out["after"] = sorted(c.recv(2).env_ids.tolist())
print(json.dumps(out))
`;

function unixUrl(): string {
  return `unix://${join(tmpdir(), `transport-apool-${randomBytes(6).toString("hex")}.sock`)}`;
}

/** A real Node server process (`serve.js URL ARGS`), with `env` added to its environment. */
class NodeServer {
  readonly proc: ChildProcessWithoutNullStreams;
  stderr = "";
  /** The URL clients connect to (the ready line's: http://127.0.0.1:0 gets its port). */
  url: string;

  constructor(
    url: string,
    args: readonly string[],
    env: Record<string, string> = {},
  ) {
    this.url = url;
    this.proc = spawn(process.execPath, [SERVE, url, ...args], { env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "pipe"] });
    this.proc.stderr.on("data", (chunk: Buffer) => {
      this.stderr += chunk.toString();
    });
  }

  async ready(): Promise<void> {
    await new Promise<void>((ok, fail) => {
      let out = "";
      const timer = setTimeout(() => fail(new Error(`no ready line in 30 s: ${this.stderr}`)), 30_000);
      this.proc.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes("\n")) {
          clearTimeout(timer);
          if (out.startsWith("ready ")) {
            this.url = (out.split("\n")[0] as string).slice("ready ".length).trim();
            ok();
          }
          else fail(new Error(out + this.stderr));
        }
      });
      this.proc.once("exit", (code) => fail(new Error(`the server exited (${code}): ${this.stderr}`)));
    });
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null) return;
    const exited = new Promise<void>((ok) => this.proc.once("exit", () => ok()));
    this.proc.kill("SIGTERM");
    await exited;
  }
}

async function withServer(
  args: readonly string[],
  env: Record<string, string>,
  body: (url: string) => Promise<void>,
  url = unixUrl(),
): Promise<void> {
  const server = new NodeServer(url, args, env);
  try {
    await server.ready();
    await body(server.url);
  } finally {
    await server.stop();
  }
  if (url.startsWith("unix://")) assert.equal(existsSync(url.slice("unix://".length)), false, "the socket file was left behind");
}

const bytesOf = (r: unknown): string => JSON.stringify(r, (_, v) => (ArrayBuffer.isView(v) ? Array.from(v as Uint8Array) : v));

function allowed(result: unknown, salt: number): number {
  const mask = Array.from((result as { action_mask: Uint8Array }).action_mask);
  const legal = mask.flatMap((m, a) => (m ? [a] : []));
  return legal[salt % legal.length] as number;
}

/**
 * Per env id: its result after each round of send(all) / recv(batch) until every env came back
 * (SAME_STEP: its final results too), each env acting on its own last result.
 */
async function asyncRuns(client: Client, rounds: number, batch: number, seed: number): Promise<string[][]> {
  const runs: string[][] = Array.from({ length: N }, () => []);
  const last = new Array<unknown>(N);
  await client.asyncReset(seed);
  for (let round = 0; round <= rounds; round++) {
    const back = new Set<number>();
    while (back.size < N) {
      const got = await client.recv(batch);
      assert.ok(got.envIds.length >= 1 && got.envIds.length <= batch, `recv returned ${got.envIds.length}`);
      got.envIds.forEach((i, k) => {
        assert.ok(!back.has(i), `env ${i} came back twice in round ${round}`);
        back.add(i);
        last[i] = got.results[k];
        for (const f of got.finals) if (f.index === i) (runs[i] as string[]).push(`final ${bytesOf(f.result)}`);
        (runs[i] as string[]).push(bytesOf(got.results[k]));
      });
    }
    if (round === rounds) break;
    const ids = [3, 1, 0, 2]; // not in env order
    await client.send(ids.map((i) => allowed(last[i], round + i)), ids);
  }
  return runs;
}

/** The same runs in lock-step (reset, then step every env). */
async function lockstepRuns(client: Client, rounds: number, seed: number): Promise<string[][]> {
  const runs: string[][] = Array.from({ length: N }, () => []);
  let results = (await client.reset(seed, { copy: true })) as unknown[];
  for (let round = 0; round <= rounds; round++) {
    results.forEach((r, i) => (runs[i] as string[]).push(bytesOf(r)));
    if (round === rounds) break;
    const out = await client.step(results.map((r, i) => allowed(r, round + i)), { copy: true });
    for (const f of client.finals) (runs[f.index] as string[]).push(`final ${bytesOf(f.result)}`);
    results = out as unknown[];
  }
  return runs;
}

/** The env ids of a RECV_RESP body of one result (the msgpack tail's first array). */
function msgpackTail(body: Buffer): string {
  const size = pac_env.StepResultCodec.size;
  return String(body[size + 2]); // fixarray of 3, fixarray of 1, the id
}

function isCode(code: ErrorCode): (e: unknown) => boolean {
  return (e: unknown) => e instanceof RemoteError && e.code === code;
}

if (require.main === module) {
  for (const [env, mode] of [
    ["heavy_tail", "next_step"],
    ["pac", "next_step"],
    ["pac", "same_step"],
  ] as const) {
    test(`${env} in 2 worker threads, ${mode}: each env's async results are its lock-step results`, async () => {
      await withServer(["--env", env, "--num-envs", String(N), "--workers", "2"], {}, async (url) => {
        const client = await connect(url, { timeoutMs: 20_000, autoreset: mode });
        try {
          const got = await asyncRuns(client, 25, 2, 11);
          const expected = await lockstepRuns(client, 25, 11);
          assert.deepEqual(got, expected);
        } finally {
          await client.close();
        }
      });
    });
  }

  const streamUrls: ReadonlyArray<readonly [string, () => string]> = [
    ["unix", unixUrl],
    ["http", () => "http://127.0.0.1:0"],
    ["zmq+ipc", () => `zmq+ipc://${join(tmpdir(), `transport-apool-${randomBytes(6).toString("hex")}`)}`],
  ];
  for (const [scheme, makeUrl] of streamUrls) {
    test(`${scheme}: a slow env does not hold back the others: the first RECV returns the envs that finished`, async () => {
      const gate = join(tmpdir(), `transport-apool-gate-${randomBytes(6).toString("hex")}`);
      const module = `${join(__dirname, "async_pool.test.js")}:makeGated`;
      await withServer(["--env", module, "--num-envs", String(N), "--workers", "2"], { [GATE_ENV]: gate }, async (url) => {
        const client = await connect(url, { timeoutMs: 20_000 });
        try {
          await client.asyncReset(0);
          assert.deepEqual((await client.recv(N)).envIds, [0, 1, 2, 3]);
          // worker 0 has envs 0 and 1, worker 1 envs 2 and 3: env 0 waits for the gate
          await client.send([SLOW, 1, 2, 3], [0, 1, 2, 3]);
          const first = await client.recv(2);
          assert.deepEqual(first.envIds, [2, 3]);
          assert.deepEqual(first.results.map((r) => Array.from((r as EchoResult).observation.subarray(0, 2))), [[2, 1], [3, 1]]);
          const waiting = client.recv(2); // env 0 (gated) and env 1 behind it
          // the server keeps serving: another client's lock-step requests are answered meanwhile
          const other = await connect(url, { timeoutMs: 20_000 });
          try {
            await other.reset(5);
            assert.equal(((await other.step([1, 2, 3, 4])) as unknown[]).length, N);
          } finally {
            await other.close();
          }
          writeFileSync(gate, "open");
          const second = await waiting;
          assert.deepEqual(second.envIds, [0, 1]);
          assert.deepEqual(second.results.map((r) => Array.from((r as EchoResult).observation.subarray(0, 2))), [[SLOW, 1], [1, 1]]);
        } finally {
          rmSync(gate, { force: true });
          await client.close();
        }
      }, makeUrl());
    });
  }

  test("shm with worker threads: a SEND of a subset goes to the pool, each slot answered as its env finishes", { skip: HAVE_PYTHON ? false : "no Python transport" }, async () => {
    const gate = join(tmpdir(), `transport-apool-gate-${randomBytes(6).toString("hex")}`);
    const module = `${join(__dirname, "async_pool.test.js")}:makeGated`;
    const url = `shm://apool-${randomBytes(5).toString("hex")}?num_envs=5`;
    const server = new NodeServer(url, ["--env", module, "--workers", "2"], { [GATE_ENV]: gate });
    try {
      await server.ready();
      const client = spawnSync(PYTHON, ["-c", SHM_CLIENT, url, gate], { cwd: ROOT, encoding: "utf8", timeout: 60_000 });
      assert.equal(client.status, 0, client.stderr);
      const out = JSON.parse(client.stdout) as Record<string, unknown>;
      assert.deepEqual(out["reset"], [0, 1, 2, 3, 4]);
      // env 0 waits for the gate: envs 3 and 4 (worker 1) come first, and env 3 again
      assert.deepEqual(out["first"], [[3, [3, 1]], [4, [4, 1]]]);
      assert.deepEqual(out["second"], [[3, [9, 2]]]);
      assert.deepEqual(out["rest"], [[0, [SLOW, 1]]]);
      const [code, text] = out["error"] as [number, string];
      assert.equal(code, ErrorCode.ENV_ERROR);
      assert.match(text, /env 1: TypeError: poisoned action.*\(the env was reset\)/s);
      assert.deepEqual(out["later"], [[2, [2, 1]]]); // env 2 finished beside the failed env 1
      assert.deepEqual(out["after"], [1, 4]);
    } finally {
      rmSync(gate, { force: true });
      await server.stop();
    }
    assert.equal(existsSync(`/dev/shm/transport-${url.slice("shm://".length, url.indexOf("?"))}`), false, "the segment was left behind");
  });

  test("shm with worker threads, from the Node client: a subset SEND answered as each env finishes", async () => {
    const gate = join(tmpdir(), `transport-apool-gate-${randomBytes(6).toString("hex")}`);
    const module = `${join(__dirname, "async_pool.test.js")}:makeGated`;
    const url = `shm://apool-${randomBytes(5).toString("hex")}?num_envs=5`;
    await withServer(["--env", module, "--workers", "2"], { [GATE_ENV]: gate }, async (served) => {
      const client = await connect(served, { timeoutMs: 20_000 });
      try {
        await client.asyncReset(0);
        assert.deepEqual([...(await client.recv(5)).envIds].sort(), [0, 1, 2, 3, 4]);
        await client.send([SLOW, 3, 4], [0, 3, 4]); // worker 0 has envs 0..2, worker 1 envs 3 and 4
        const first = await client.recv(2);
        assert.deepEqual([...first.envIds].sort(), [3, 4]);
        writeFileSync(gate, "open");
        const rest = await client.recv(1);
        assert.deepEqual(rest.envIds, [0]);
        assert.deepEqual(Array.from((rest.results[0] as EchoResult).observation.subarray(0, 2)), [SLOW, 1]);
      } finally {
        rmSync(gate, { force: true });
        await client.close();
      }
    }, url);
  });

  test("shm with worker threads: a client that dies with an env in flight is reclaimed; the next client works", { skip: HAVE_PYTHON ? false : "no Python transport" }, async () => {
    const module = `${join(__dirname, "async_pool.test.js")}:makeGated`;
    const url = `shm://apool-${randomBytes(5).toString("hex")}?num_envs=5`;
    const gate = join(tmpdir(), `transport-apool-never-${randomBytes(6).toString("hex")}`); // never opened
    const server = new NodeServer(url, ["--env", module, "--workers", "2"], { [GATE_ENV]: gate });
    try {
      await server.ready();
      const dying = `
import os, transport, sys
c = transport.connect(sys.argv[1], timeout=20.0)
c.async_reset(0)
c.recv(5)
c.send([${SLOW}, 1], [0, 3])
c.recv(1)
os._exit(0)  # dies holding the lease, env 0 still stepping
`;
      const first = spawnSync(PYTHON, ["-c", dying, url], { cwd: ROOT, encoding: "utf8", timeout: 60_000 });
      assert.equal(first.status, 0, first.stderr);
      const next = `
import sys, transport
with transport.connect(sys.argv[1], timeout=10.0) as c:  # below the stuck env's 20 s: reclaimed while it runs
    c.reset(1)
    c.step([1, 2, 3, 4, 5])
    print("stepped")
`;
      const second = spawnSync(PYTHON, ["-c", next, url], { cwd: ROOT, encoding: "utf8", timeout: 60_000 });
      assert.equal(second.status, 0, second.stderr);
      assert.equal(second.stdout.trim(), "stepped");
      for (let k = 0; k < 100 && !server.stderr.includes("is gone"); k++) await new Promise((ok) => setTimeout(ok, 50)); // spawnSync held the pipe's data
      assert.match(server.stderr, /client pid \d+ is gone; reclaiming its lease/);
    } finally {
      await server.stop();
    }
  });

  test("a request that arrives while a RECV waits is answered after it, in order (Session.later)", async () => {
    const gate = join(tmpdir(), `transport-apool-gate-${randomBytes(6).toString("hex")}`);
    const before = process.env[GATE_ENV];
    process.env[GATE_ENV] = gate; // the worker threads copy the environment when they start
    const session = sessionFactory(makeGated, {
      numEnvs: N,
      workers: 2,
      workerEnv: { module: __filename, exportName: "makeGated" },
    })();
    try {
      const hello = encodeHello(pac_env.SCHEMA.fingerprint, undefined, AutoReset.DISABLED);
      assert.equal(session.handle(IDS.HELLO_REQ, hello, 0, hello.byteLength), IDS.HELLO_RESP);
      const seed = Buffer.alloc(16);
      assert.equal(session.handle(IDS.ASYNC_RESET_REQ, seed, 0, 16), IDS.SEND_RESP);
      const recvReq = (b: number): Buffer => Buffer.from(Uint32Array.of(b).buffer);
      assert.equal(session.handle(IDS.RECV_REQ, recvReq(N), 0, 4), IDS.RECV_RESP);
      const send = Buffer.concat([Buffer.from(Int32Array.of(SLOW, 1).buffer), Buffer.from(msgpackEncode([0, 2]))]);
      assert.equal(session.handle(IDS.SEND_REQ, send, 0, send.byteLength), IDS.SEND_RESP);
      const first = session.handle(IDS.RECV_REQ, recvReq(1), 0, 4); // env 2: at once, or once stepped
      assert.equal(first === LATER ? await (session.later as Promise<number>) : first, IDS.RECV_RESP);
      assert.equal(msgpackTail(session.body()), "2");
      assert.equal(session.handle(IDS.RECV_REQ, recvReq(1), 0, 4), LATER); // env 0: gated
      const recv = session.later as Promise<number>;
      const health = new Uint8Array(0);
      assert.equal(session.handle(IDS.HEALTH_REQ, health, 0, 0), LATER); // queued behind the RECV
      const queued = session.later as Promise<number>;
      assert.equal(session.handle(IDS.SPACES_REQ, health, 0, 0), LATER); // and this one behind it
      const last = session.later as Promise<number>;
      const order: string[] = [];
      void recv.then((type) => order.push(`recv ${type} ${msgpackTail(session.body())}`));
      void queued.then((type) => order.push(`health ${type}`));
      void last.then((type) => order.push(`spaces ${type}`));
      writeFileSync(gate, "open");
      await last;
      assert.deepEqual(order, [`recv ${IDS.RECV_RESP} 0`, `health ${IDS.HEALTH_RESP}`, `spaces ${IDS.SPACES_RESP}`]);
      assert.equal(session.later, null);
    } finally {
      rmSync(gate, { force: true });
      if (before === undefined) delete process.env[GATE_ENV];
      else process.env[GATE_ENV] = before;
      session.runtime.close();
    }
  });

  test("misuse is refused with the same codes as in one thread; env errors are the RECV's ENV_ERROR", async () => {
    const module = `${join(__dirname, "async_pool.test.js")}:makeGated`;
    await withServer(["--env", module, "--num-envs", String(N), "--workers", "2"], {}, async (url) => {
      const client = await connect(url, { timeoutMs: 20_000 });
      try {
        await assert.rejects(client.recv(1), isCode(ErrorCode.ASYNC_STATE));
        await client.asyncReset(0);
        await assert.rejects(client.step([1, 1, 1, 1]), isCode(ErrorCode.ASYNC_STATE));
        assert.deepEqual((await client.recv(N)).envIds, [0, 1, 2, 3]);
        await assert.rejects(client.send([1], [N]), isCode(ErrorCode.BAD_BATCH));
        await assert.rejects(client.send([1, 1], [2, 2]), isCode(ErrorCode.ASYNC_STATE));
        await client.send([1], [2]);
        await assert.rejects(client.send([1], [2]), isCode(ErrorCode.ASYNC_STATE));
        await assert.rejects(client.send([200], [0]), isCode(ErrorCode.INVALID_ACTION));
        assert.deepEqual((await client.recv(4)).envIds, [2]);

        // an env that throws: ENV_ERROR naming it (reset); the others come with the next RECV
        await client.send([POISON, 1, 1, 1], [0, 1, 2, 3]);
        await assert.rejects(client.recv(N), (e: unknown) => {
          assert.ok(e instanceof RemoteError && e.code === ErrorCode.ENV_ERROR, String(e));
          assert.match(e.message, /env 0: TypeError: poisoned action.*\(the env was reset\)/s);
          return true;
        });
        assert.deepEqual((await client.recv(N)).envIds.sort(), [1, 2, 3]);
        await assert.rejects(client.recv(1), isCode(ErrorCode.ASYNC_STATE));

        // a worker thread that dies: its envs fail by name, a new thread takes over
        await client.send([EXIT], [2]);
        await assert.rejects(client.recv(1), (e: unknown) => {
          assert.ok(e instanceof RemoteError && e.code === ErrorCode.ENV_ERROR, String(e));
          assert.match(e.message, /env 2: worker thread 1 \(thread id \d+, envs 2\.\.3\) died.*new worker thread/s);
          return true;
        });
        await client.send([5, 6, 7 - 1, 9], [0, 1, 2, 3]);
        const after = await client.recv(N);
        assert.deepEqual([...after.envIds].sort(), [0, 1, 2, 3]);
        const byId = new Map(after.envIds.map((i, k) => [i, Array.from((after.results[k] as EchoResult).observation.subarray(0, 2))]));
        assert.deepEqual(byId.get(2), [6, 1]); // a fresh env, reset by the recovery
        assert.deepEqual(byId.get(3), [9, 1]); // a fresh env, reset when its thread was replaced
        // lock-step works again once nothing is in flight
        assert.equal(((await client.step([1, 1, 1, 1])) as unknown[]).length, N);
      } finally {
        await client.close();
      }
    });
  });
}
