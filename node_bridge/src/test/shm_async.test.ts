/**
 * Asynchronous batches over shm:// from the Node client (backends/shm/channel.ts: SEND, RECV,
 * ASYNC_RESET mapped onto the slots, docs/shm.md "Asynchronous batches") against real server
 * processes, a Node one and a Python one: each env's results equal lock-step's (pipelined sends
 * of B = N/2 envs), misuse is refused with the runtime's codes, SAME_STEP finals come with RECV, a
 * timed-out RECV leaves the envs in flight, a server killed during a RECV is PeerGoneError, the
 * one-word fallback (no futex_waitv) works, and no segment is left in /dev/shm.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { resolve } from "node:path";
import { after, describe, test } from "node:test";

import { ShmChannel } from "../backends/shm/channel";
import { native } from "../backends/shm/native";
import { PREFIX, SHM_DIR, parseShmUrl } from "../backends/shm/region";
import * as gridworld from "../generated/gridworld";
import type * as pac_env from "../generated/pac_env";
import { type Client, PeerGoneError, RemoteError, TransportError, TransportTimeoutError, connect } from "../index";
import { ErrorCode } from "../protocol";
import { POISON } from "../testing/faulty";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";

const FAULTY = resolve(__dirname, "..", "testing", "faulty.js");
const ENVS = resolve(__dirname, "..", "testing", "envs.js");
const GRIDWORLD = resolve(__dirname, "..", "generated", "gridworld.js");

const N = 4;
const B = N / 2;
const TAG = `node-async-${randomBytes(3).toString("hex")}`;

function shmUrl(numEnvs = N, query = ""): string {
  return `shm://${TAG}-${randomBytes(4).toString("hex")}?num_envs=${numEnvs}${query}`;
}

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop("SIGKILL");
  for (const server of servers) native().shmUnlink(parseShmUrl(server.url).segment); // a killed server's segment
  const left = readdirSync(SHM_DIR).filter((name) => name.startsWith(`${PREFIX}${TAG}`));
  assert.deepEqual(left, [], "no segment of these tests is left in /dev/shm");
});

async function started(lang: "node" | "python" | "faulty" | "gridworld", url: string, ...args: string[]): Promise<ServerProcess> {
  const server =
    lang === "faulty"
      ? await ServerProcess.start({ module: FAULTY, factory: "makeFaulty", numEnvs: 3 }, url)
      : lang === "gridworld"
        ? await ServerProcess.start({ module: ENVS, factory: "makeGridWorld", numEnvs: N, schemaModule: GRIDWORLD }, url)
        : await ServerProcess.start(lang, url, "--env", "pac", ...args);
  servers.push(server);
  return server;
}

/** A deterministic policy: the k-th legal action of a result. */
function policy(result: pac_env.StepResult, k: number): number {
  const moves: number[] = [];
  result.action_mask.forEach((m, a) => {
    if (m) moves.push(a);
  });
  return moves[(k * 7) % moves.length] as number;
}

function hexOf(result: pac_env.StepResult): string {
  return JSON.stringify(result, (_, v) => (ArrayBuffer.isView(v) ? Buffer.from((v as Uint8Array).buffer, (v as Uint8Array).byteOffset, (v as Uint8Array).byteLength).toString("hex") : v));
}

/** Each env's results (and SAME_STEP finals, tagged) over `steps` lock-step steps from reset(seed). */
async function lockstep(client: Client, seed: number, steps: number): Promise<string[][]> {
  const traces: string[][] = Array.from({ length: client.numEnvs }, () => []);
  let results = (await client.reset(seed, { copy: true })) as pac_env.StepResult[];
  for (let t = 0; ; t++) {
    results.forEach((r, i) => traces[i]!.push(hexOf(r)));
    for (const final of client.finals) traces[final.index]!.push(`final ${hexOf(final.result as pac_env.StepResult)}`);
    if (t === steps) return traces;
    results = (await client.step(results.map((r, i) => policy(r, t + i)), { copy: true })) as pac_env.StepResult[];
  }
}

/**
 * The same per-env traces through asyncReset / send / recv(B), pipelined as EnvPool is used:
 * each env that comes back is sent again at once, until every env did `steps` steps.
 */
async function pipelined(client: Client, seed: number, steps: number, b = B): Promise<{ traces: string[][]; batches: number }> {
  const n = client.numEnvs;
  const traces: string[][] = Array.from({ length: n }, () => []);
  const done = new Array<number>(n).fill(0);
  await client.asyncReset(seed);
  let flying = n;
  let batches = 0;
  while (flying > 0) {
    const got = await client.recv(b);
    batches++;
    assert.ok(got.envIds.length >= 1 && got.envIds.length <= b, `recv returned ${got.envIds.length} results`);
    assert.equal(got.results.length, got.envIds.length);
    flying -= got.envIds.length;
    const ids: number[] = [];
    const actions: number[] = [];
    got.envIds.forEach((i, k) => {
      const result = got.results[k] as pac_env.StepResult;
      traces[i]!.push(hexOf(result));
      for (const final of got.finals) if (final.index === i) traces[i]!.push(`final ${hexOf(final.result as pac_env.StepResult)}`);
      if (done[i]! < steps) {
        ids.push(i);
        actions.push(policy(result, done[i]! + i));
        done[i]!++;
      }
    });
    for (const final of got.finals) assert.ok(got.envIds.includes(final.index), `final of env ${final.index}, not returned`);
    if (ids.length) {
      await client.send(actions, ids);
      flying += ids.length;
    }
  }
  return { traces, batches };
}

async function rejectsWith(promise: Promise<unknown>, code: number, pattern?: RegExp): Promise<void> {
  await assert.rejects(promise, (e: unknown) => {
    assert.ok(e instanceof RemoteError, `expected RemoteError ${code}, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    if (pattern !== undefined) assert.match(e.text, pattern);
    return true;
  });
}

/** SIGSTOP the server and wait until it is stopped (a signal takes effect asynchronously). */
async function silence(server: ServerProcess): Promise<void> {
  server.proc.kill("SIGSTOP");
  const stat = `/proc/${server.proc.pid}/stat`;
  for (let tries = 0; tries < 500; tries++) {
    const text = readFileSync(stat, "utf8");
    if (text.slice(text.lastIndexOf(")") + 2).startsWith("T")) return;
    await new Promise((ok) => setTimeout(ok, 2));
  }
  throw new Error(`server pid ${server.proc.pid} did not stop`);
}

/** Resolves with `promise`, or fails after `ms` (a watchdog: the tests never hang). */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const watchdog = new Promise<never>((_, fail) => {
    timer = setTimeout(() => fail(new Error(`${what}: no outcome within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, watchdog]);
  } finally {
    clearTimeout(timer);
  }
}

const LANGS: Array<"node" | "python"> = HAVE_PYTHON ? ["node", "python"] : ["node"];

for (const lang of LANGS) {
  describe(`shm:// asynchronous batches, Node client, ${lang} server`, () => {
    test("send / recv(N/2) pipelined: every env's results equal lock-step's", async () => {
      const server = await started(lang, shmUrl());
      const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "next_step" });
      try {
        const got = await pipelined(client, 11, 40);
        assert.ok(got.batches >= (40 * N) / B, `${got.batches} recv calls`);
        const expected = await lockstep(client, 11, 40);
        assert.deepEqual(got.traces, expected);
      } finally {
        await client.close();
        await server.stop();
      }
    });

    test("same_step: RECV carries the finals of the episodes that ended", async () => {
      const server = await started(lang, shmUrl());
      const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "same_step" });
      try {
        const got = await pipelined(client, 5, 300);
        const finals = got.traces.flat().filter((line) => line.startsWith("final ")).length;
        assert.ok(finals > 0, "some episodes ended");
        assert.deepEqual(got.traces, await lockstep(client, 5, 300));
      } finally {
        await client.close();
        await server.stop();
      }
    });

    test("misuse is refused with the runtime's codes, touching no slot", async () => {
      const server = await started(lang, shmUrl());
      const client = await connect(server.url, { timeoutMs: 10_000 });
      try {
        await rejectsWith(client.recv(1), ErrorCode.ASYNC_STATE, /no env in flight/);
        const reset = (await client.reset(2, { copy: true })) as pac_env.StepResult[];
        const actions = reset.map((r) => policy(r, 0));
        await rejectsWith(client.send([actions[1]!, actions[1]!], [1, 1]), ErrorCode.ASYNC_STATE, /appears twice/);
        await rejectsWith(client.send([0], [N]), ErrorCode.BAD_BATCH, /outside 0\.\.3/);
        await client.send([actions[0]!, actions[2]!], [0, 2]);
        await rejectsWith(client.send([actions[2]!], [2]), ErrorCode.ASYNC_STATE, /already in flight/);
        const region = (client.channel as ShmChannel).region;
        const requestWords = (): number[] => Array.from({ length: N }, (_, i) => Atomics.load(region.words, region.slotAt(i, "sem_action_ready") >> 2));
        const before = requestWords();
        await rejectsWith(client.step(actions), ErrorCode.ASYNC_STATE, /in flight/);
        await rejectsWith(client.reset(), ErrorCode.ASYNC_STATE, /in flight/);
        await rejectsWith(client.asyncReset(1), ErrorCode.ASYNC_STATE, /in flight/);
        assert.deepEqual(requestWords(), before, "a refused request publishes nothing");
        assert.equal(await client.health(), true); // not a lock-step request
        const first = await client.recv(1);
        const second = await client.recv(5); // min(B, in flight): the one left
        assert.deepEqual([...first.envIds, ...second.envIds].sort(), [0, 2]);
        await rejectsWith(client.recv(1), ErrorCode.ASYNC_STATE);
        // idle again: lock-step works; envs 1 and 3 did not step, 0 and 2 did once
        const stepped = (await client.step(actions, { copy: true })) as pac_env.StepResult[];
        assert.equal(stepped.length, N);
        // a refused action: that env's RECV is the error and it leaves flight; the other stays
        await client.send([9999, policy(stepped[3]!, 1)], [1, 3]);
        await rejectsWith(client.recv(2), ErrorCode.INVALID_ACTION);
        const rest = await client.recv(2);
        assert.deepEqual(rest.envIds, [3]);
        await rejectsWith(client.recv(1), ErrorCode.ASYNC_STATE);
      } finally {
        await client.close();
        await server.stop();
      }
    });

    test("a RECV that times out leaves the envs in flight; a later RECV returns them", async () => {
      const server = await started(lang, shmUrl());
      const client = await connect(server.url, { timeoutMs: 300 });
      try {
        await client.asyncReset(4);
        assert.equal((await client.recv(N)).envIds.length, N);
        await silence(server);
        try {
          await client.send([0, 0], [1, 2]);
          await assert.rejects(client.recv(2), (e: unknown) => e instanceof TransportTimeoutError && /stay in flight/.test(e.message));
          await rejectsWith(client.step([0, 0, 0, 0]), ErrorCode.ASYNC_STATE);
        } finally {
          server.proc.kill("SIGCONT");
        }
        const got = await client.recv(2);
        assert.deepEqual([...got.envIds].sort(), [1, 2]);
        assert.equal(((await client.step([0, 0, 0, 0], { copy: true })) as pac_env.StepResult[]).length, N);
      } finally {
        await client.close();
        await server.stop();
      }
    });

    test("close() while a RECV waits: the RECV fails (TransportError), the process lives on", async () => {
      const server = await started(lang, shmUrl(N, "&wait=futex"));
      const client = await connect(server.url, { timeoutMs: 30_000 });
      try {
        await client.asyncReset(1);
        await client.recv(N);
        await silence(server);
        await client.send([0], [2]);
        const waiting = client.recv(1);
        await new Promise((ok) => setTimeout(ok, 100)); // the RECV sleeps in the kernel
        await client.close();
        await within(assert.rejects(waiting, (e: unknown) => e instanceof TransportError && /closed while a RECV waited/.test(e.message)), 10_000, "RECV after close");
      } finally {
        server.proc.kill("SIGCONT");
        await server.stop();
      }
    });

    test("close() while a lock-step step waits: the step fails once answered, the lease is released", async () => {
      const server = await started(lang, shmUrl(N, "&wait=futex"));
      const client = await connect(server.url, { timeoutMs: 30_000 });
      try {
        await client.reset(1);
        await silence(server);
        const waiting = client.step([0, 0, 0, 0]);
        await new Promise((ok) => setTimeout(ok, 100)); // the step sleeps in FUTEX_WAIT
        await client.close();
        server.proc.kill("SIGCONT"); // answered now: the step ends, then the region is unmapped
        await within(assert.rejects(waiting, (e: unknown) => e instanceof TransportError && /closed during this request/.test(e.message)), 10_000, "step after close");
        const next = await connect(server.url, { timeoutMs: 5_000 }); // the lease was released
        await next.close();
      } finally {
        server.proc.kill("SIGCONT");
        await server.stop();
      }
    });

    test("a server killed while the client waits in RECV is PeerGoneError", async () => {
      const server = await started(lang, shmUrl());
      const client = await connect(server.url, { timeoutMs: 30_000 });
      try {
        await client.asyncReset(1);
        await client.recv(N);
        await silence(server); // the RECV below waits (nothing answers) ...
        await client.send([0, 0], [0, 3]);
        const waiting = client.recv(2);
        setTimeout(() => server.proc.kill("SIGKILL"), 200); // ... until the server dies
        await within(
          assert.rejects(waiting, (e: unknown) => e instanceof PeerGoneError && /died/.test(e.message)),
          10_000,
          "RECV on a dead server",
        );
      } finally {
        await client.close();
        native().shmUnlink(parseShmUrl(server.url).segment); // SIGKILL leaves the segment behind
      }
    });
  });
}

describe("shm:// asynchronous batches: checksums, env errors, many envs (Node server)", () => {
  test("?checksum=crc32: RECV checks the slots it returns", async () => {
    const server = await started("node", shmUrl(N, "&checksum=crc32"));
    const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "next_step" });
    try {
      const got = await pipelined(client, 8, 10);
      assert.deepEqual(got.traces, await lockstep(client, 8, 10));
    } finally {
      await client.close();
      await server.stop();
    }
  });

  test("an env that throws: its RECV is ENV_ERROR naming it, the other env comes back", async () => {
    const server = await started("faulty", shmUrl(3));
    const client = await connect(server.url, { timeoutMs: 10_000 });
    try {
      await client.reset();
      await client.send([1, POISON], [0, 1]);
      await rejectsWith(client.recv(2), ErrorCode.ENV_ERROR, /^env 1: TypeError: poisoned action \(the env was reset\)$/);
      const rest = await client.recv(2);
      assert.deepEqual(rest.envIds, [0]);
      assert.equal((rest.results[0] as pac_env.StepResult).observation[0], 1);
      const next = (await client.step([2, 3, 4], { copy: true })) as pac_env.StepResult[];
      assert.deepEqual(next.map((r) => r.observation[0]), [2, 3, 4]);
    } finally {
      await client.close();
      await server.stop();
    }
  });

  test("a derived layout (gridworld: results whole in the slots), same_step finals", async () => {
    const server = await started("gridworld", shmUrl());
    const client = (await connect<unknown, unknown>(server.url, {
      schema: gridworld.SCHEMA,
      timeoutMs: 10_000,
      autoreset: "same_step",
    })) as unknown as Client;
    try {
      const got = await pipelined(client, 6, 60);
      assert.ok(got.traces.flat().some((line) => line.startsWith("final ")), "some episodes ended");
      assert.deepEqual(got.traces, await lockstep(client, 6, 60));
    } finally {
      await client.close();
      await server.stop();
    }
  });

  for (const n of [20, 130]) {
    test(`${n} envs (${n > 128 ? "more unanswered words than one futex_waitv takes" : "a msgpack array16 of env ids"})`, async () => {
      const server = await started("node", shmUrl(n, "&wait=futex"));
      const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "next_step" });
      try {
        const got = await pipelined(client, 2, 4, n / 2);
        assert.deepEqual(got.traces, await lockstep(client, 2, 4));
      } finally {
        await client.close();
        await server.stop();
      }
    });
  }
});

describe("shm:// asynchronous batches, Python server with worker processes", { skip: HAVE_PYTHON ? false : "no Python transport" }, () => {
  test("pipelined send / recv: each slot answered as its env finishes, lock-step's results", async () => {
    const server = await started("python", shmUrl(), "--workers", "2");
    const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "same_step" });
    try {
      const got = await pipelined(client, 12, 30);
      assert.deepEqual(got.traces, await lockstep(client, 12, 30));
    } finally {
      await client.close();
      await server.stop();
    }
  });
});

describe("shm:// asynchronous batches without futex_waitv (one word in short slices)", () => {
  test("the pipelined trace still equals lock-step (Node server)", async () => {
    const nat = native() as unknown as { futexWaitvAsync: unknown };
    const saved = nat.futexWaitvAsync;
    nat.futexWaitvAsync = null; // as on Linux < 5.16
    const server = await started("node", shmUrl(N, "&wait=futex")); // every wait sleeps
    const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "next_step" });
    try {
      const got = await pipelined(client, 9, 20);
      assert.deepEqual(got.traces, await lockstep(client, 9, 20));
    } finally {
      nat.futexWaitvAsync = saved;
      await client.close();
      await server.stop();
    }
  });

  test("with futex_waitv and wait=futex (every RECV sleeps in the kernel)", { skip: native().futexWaitvAsync === null ? "no futex_waitv" : false }, async () => {
    const server = await started("node", shmUrl(N, "&wait=futex"));
    const client = await connect(server.url, { timeoutMs: 10_000, autoreset: "next_step" });
    try {
      const got = await pipelined(client, 9, 20);
      assert.deepEqual(got.traces, await lockstep(client, 9, 20));
    } finally {
      await client.close();
      await server.stop();
    }
  });
});
