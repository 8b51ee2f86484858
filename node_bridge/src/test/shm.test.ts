/**
 * The shm:// region code of the Node server (src/backends/shm/): URLs, liveness,
 * the koffi mapping (zero copy, both directions), creation rules (0600, stale replaced, live
 * never), futex waits, and a full round trip against a client in a worker thread that speaks
 * docs/shm.md's request order on its own mapping of the segment.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { after, describe, test } from "node:test";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";

import { openChannel, resultLayout, utf8Cut } from "../backends/shm";
import { ConnectError, REMOTE_TRACEBACK_MARKER } from "../errors";
import { EchoEnv, type EchoResult } from "../envs/echo";
import * as pac_env from "../generated/pac_env";
import { type Server, serve } from "../server";
import {
  CB,
  CONTROL_SIZE,
  MAGIC,
  Region,
  RegionState,
  SEQ_MASK,
  SLEEP_BIT,
  ShmLayout,
  SlotCommand,
  WAIT_TIMEOUT,
  loadSeq,
  off,
  parseShmUrl,
  peerAlive,
  procStartTime,
  publishWord,
  schemaArea,
  waitWord,
} from "../backends/shm/region";

/** pac_env's layout: the pac_shm profile (Appendix B). */
const PAC = ShmLayout.of(pac_env.SCHEMA);
const SLOT = PAC.slot;
const SLOT_SIZE = PAC.slotSize;
const FINAL_SIZE = PAC.finalSize;
const regionSize = (k: number): number => PAC.regionSize(k);
const finalsOffset = (k: number): number => PAC.finalsOffset(k);

function uniqueName(): string {
  return `node-test-${randomBytes(6).toString("hex")}`;
}

// -- the client, in a worker thread ------------------------------------------------------------

interface ClientReply {
  info: string;
  resetLife: number;
  obs0: number;
  reward: number;
  life: number;
  badStatus: number;
  badText: string;
  obsAfter: number[];
  shutdownStatus: number;
}

/** One request on every slot, docs/shm.md order: fields, request words, doorbell, wait. */
function clientRoundTrip(region: Region, command: number, fill: (i: number) => void): number {
  const n = region.numSlots;
  const dv = region.dv;
  for (let i = 0; i < n; i++) {
    dv.setUint32(region.slotAt(i, "command"), command, true);
    fill(i);
  }
  const seqs: number[] = [];
  for (let i = 0; i < n; i++) {
    const at = region.slotAt(i, "sem_action_ready");
    const seq = (loadSeq(region, at) + 1) & SEQ_MASK;
    seqs.push(seq);
    Atomics.store(region.words, at >> 2, seq);
  }
  const bell = off(CB, "doorbell");
  publishWord(region, bell, (loadSeq(region, bell) + 1) & SEQ_MASK);
  for (let i = 0; i < n; i++) {
    const rc = waitWord(region, region.slotAt(i, "sem_result_ready"), seqs[i]!, true, 5e9, { spin: 1000, sliceMs: 20 });
    if (rc < 0) throw new Error(`wait failed: ${rc}`);
  }
  for (let i = 0; i < n; i++) {
    const status = dv.getUint16(region.slotAt(i, "status"), true);
    if (status !== 0) return status;
  }
  return 0;
}

function runClient(url: string): ClientReply {
  const region = Region.open(parseShmUrl(url), PAC);
  try {
    assert.equal(Atomics.load(region.words, region.cbWord("state")), RegionState.READY);
    const dv = region.dv;
    const leaseWord = region.cbWord("client_pid");
    assert.equal(Atomics.compareExchange(region.words, leaseWord, 0, process.pid), 0);
    dv.setBigUint64(off(CB, "client_start_time"), procStartTime(process.pid), true);
    const infoLen = dv.getUint16(region.slotAt(0, "info_len"), true);
    const info = Buffer.from(region.bytes.subarray(region.slotAt(0, "info"), region.slotAt(0, "info") + infoLen)).toString("latin1");
    assert.equal(
      clientRoundTrip(region, SlotCommand.RESET, (i) => {
        region.bytes[region.slotAt(i, "has_seed")] = 1;
        dv.setBigUint64(region.slotAt(i, "seed"), 5n + BigInt(i), true);
      }),
      0,
    );
    const resetLife = dv.getUint16(region.slotAt(0, "life"), true);
    assert.equal(clientRoundTrip(region, SlotCommand.STEP, (i) => dv.setInt32(region.slotAt(i, "action"), 7 + i, true)), 0);
    const obs0 = dv.getFloat32(region.slotAt(0, "observation"), true);
    const reward = dv.getFloat32(region.slotAt(0, "reward"), true);
    const life = dv.getUint16(region.slotAt(0, "life"), true);
    const badStatus = clientRoundTrip(region, SlotCommand.STEP, (i) => dv.setInt32(region.slotAt(i, "action"), i === 1 ? 100 : 1, true));
    const textAt = region.slotAt(0, "error_text");
    const badText = Buffer.from(region.bytes.subarray(textAt, textAt + dv.getUint16(region.slotAt(0, "error_len"), true))).toString("utf8");
    assert.equal(clientRoundTrip(region, SlotCommand.STEP, (i) => dv.setInt32(region.slotAt(i, "action"), 3, true)), 0);
    const obsAfter = Array.from({ length: region.numSlots }, (_, i) => dv.getFloat32(region.slotAt(i, "observation"), true));
    const shutdownStatus = clientRoundTrip(region, SlotCommand.SHUTDOWN, () => undefined);
    dv.setBigUint64(off(CB, "client_start_time"), 0n, true);
    Atomics.compareExchange(region.words, leaseWord, process.pid, 0);
    return { info, resetLife, obs0, reward, life, badStatus, badText, obsAfter, shutdownStatus };
  } finally {
    region.unmap();
  }
}

/**
 * Echo, but action 90 throws, 91 throws and breaks the next reset (of any instance), 89 throws
 * and breaks the next two resets, 50 ends the episode (done = 1).
 */
class FaultyEnv extends EchoEnv {
  static brokenResets = 0;

  override reset(seed?: bigint): EchoResult {
    if (FaultyEnv.brokenResets > 0) {
      FaultyEnv.brokenResets--;
      throw new RangeError("the simulator crashed during reset");
    }
    const out = super.reset(seed);
    out.done = 0;
    return out;
  }

  override step(action: number): EchoResult {
    if (action === 91) FaultyEnv.brokenResets = 1;
    if (action === 89) FaultyEnv.brokenResets = 2;
    if (action === 89 || action === 90 || action === 91) throw new TypeError("poisoned action");
    const out = super.step(action);
    out.done = action === 50 ? 1 : 0;
    return out;
  }
}

/** What the auto-reset / env-error client saw: [status, text of slot 0] per request, and more. */
interface FaultReply {
  answers: Array<[number, string]>;
  stepsAfterError: number[];
  final: { seq0: boolean; seq1: boolean; obs0: number; done: number; slotObs0: number; slotDone: number };
  nextStep: { doneBefore: number; steps: number; done: number };
}

function slotText(region: Region, i: number): string {
  const at = region.slotAt(i, "error_text");
  const len = region.dv.getUint16(region.slotAt(i, "error_len"), true);
  return Buffer.from(region.bytes.subarray(at, at + len)).toString("utf8");
}

function runFaultClient(url: string): FaultReply {
  const region = Region.open(parseShmUrl(url), PAC);
  try {
    const dv = region.dv;
    const leaseWord = region.cbWord("client_pid");
    assert.equal(Atomics.compareExchange(region.words, leaseWord, 0, process.pid), 0);
    dv.setBigUint64(off(CB, "client_start_time"), procStartTime(process.pid), true);
    const answers: Array<[number, string]> = [];
    const ask = (command: number, actions: readonly number[]): number => {
      const status = clientRoundTrip(region, command, (i) => {
        region.bytes[region.slotAt(i, "has_seed")] = 0;
        dv.setInt32(region.slotAt(i, "action"), actions[i] ?? 0, true);
      });
      // the message only: the env's stack follows it after the marker (tests/test_env_error_reports.py)
      const failed = [0, 1, 2].find((i) => dv.getUint16(region.slotAt(i, "status"), true) !== 0) ?? 0; // an env error: its slots only
      answers.push([status, status === 0 ? "" : (slotText(region, failed).split(REMOTE_TRACEBACK_MARKER)[0] as string)]);
      return status;
    };
    const steps = (i: number): number => dv.getFloat32(region.slotAt(i, "observation") + 4, true);
    ask(SlotCommand.RESET, []);
    ask(SlotCommand.STEP, [1, 1, 1]);
    ask(SlotCommand.STEP, [1, 90, 1]); // env 1 throws: reset
    ask(SlotCommand.STEP, [1, 1, 1]);
    const stepsAfterError = [steps(0), steps(1), steps(2)];
    ask(SlotCommand.STEP, [91, 1, 90]); // env 0: reset fails, recreated; env 2: reset
    ask(SlotCommand.STEP, [89, 1, 1]); // env 0: reset and recreation fail
    ask(SlotCommand.STEP, [1, 1, 1]); // NOT_RESET
    ask(SlotCommand.RESET, []);
    ask(SlotCommand.HELLO, [7, 7, 7]); // BAD_FRAME
    ask(SlotCommand.HELLO, [2, 2, 2]); // same_step
    ask(SlotCommand.STEP, [50, 1, 1]);
    const finalAt = (i: number): number => finalsOffset(region.numSlots) + i * FINAL_SIZE;
    const reqSeq = (i: number): number => loadSeq(region, region.slotAt(i, "sem_action_ready"));
    const final = {
      seq0: dv.getUint32(finalAt(0), true) === reqSeq(0),
      seq1: dv.getUint32(finalAt(1), true) === reqSeq(1),
      obs0: dv.getFloat32(finalAt(0) + off(SLOT, "observation"), true),
      done: region.bytes[finalAt(0) + off(SLOT, "done")]!,
      slotObs0: dv.getFloat32(region.slotAt(0, "observation"), true),
      slotDone: region.bytes[region.slotAt(0, "done")]!,
    };
    ask(SlotCommand.HELLO, [1, 1, 1]); // next_step
    ask(SlotCommand.STEP, [50, 1, 1]);
    const doneBefore = region.bytes[region.slotAt(0, "done")]!;
    ask(SlotCommand.STEP, [500, 1, 1]); // env 0 is done: its (invalid) action is ignored, reset
    const nextStep = { doneBefore, steps: steps(0), done: region.bytes[region.slotAt(0, "done")]! };
    ask(SlotCommand.SHUTDOWN, []);
    dv.setBigUint64(off(CB, "client_start_time"), 0n, true);
    Atomics.compareExchange(region.words, leaseWord, process.pid, 0);
    return { answers, stepsAfterError, final, nextStep };
  } finally {
    region.unmap();
  }
}

function clientInWorker(url: string): Promise<ClientReply>;
function clientInWorker(url: string, script: "faults"): Promise<FaultReply>;
function clientInWorker(url: string, script = "basic"): Promise<ClientReply | FaultReply> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(__filename, { workerData: { url, script } });
    worker.once("message", (reply: ClientReply | FaultReply | { error: string }) => {
      if ("error" in reply) reject(new Error(reply.error));
      else resolve(reply);
    });
    worker.once("error", reject);
  });
}

if (!isMainThread) {
  const { url, script } = workerData as { url: string; script: string };
  try {
    parentPort!.postMessage(script === "faults" ? runFaultClient(url) : runClient(url));
  } catch (error) {
    parentPort!.postMessage({ error: String((error as Error).stack ?? error) });
  }
} else {
  const servers = new Set<Server>();
  after(async () => {
    for (const server of servers) await server.close();
  });

  describe("shm:// URLs", () => {
    test("name, num_envs and wait policies", () => {
      const u = parseShmUrl("shm://pac-1?num_envs=32&wait=futex");
      assert.equal(u.name, "pac-1");
      assert.equal(u.numEnvs, 32);
      assert.deepEqual(u.wait, { spin: 0, futexSliceMs: 50 });
      assert.equal(u.segment, "/transport-pac-1");
      assert.equal(u.path, "/dev/shm/transport-pac-1");
      assert.deepEqual(parseShmUrl("shm://x?spin=5&slice_ms=2").wait, { spin: 5, futexSliceMs: 2 });
      assert.equal(parseShmUrl("shm://x").numEnvs, null);
    });

    test("bad URLs are ConnectErrors naming the problem", () => {
      for (const [url, what] of [
        ["shm://", "region name"],
        ["shm://a/b", "region name"],
        ["shm://x?num_envs=0", "num_envs"],
        ["shm://x?bogus=1", "bogus"],
        ["shm://x?wait=nap", "nap"],
        ["unix:///x", "not an shm"],
      ] as const) {
        assert.throws(() => parseShmUrl(url), (e: unknown) => e instanceof ConnectError && e.message.includes(what), url);
      }
    });
  });

  describe("liveness", () => {
    test("own start time, pid reuse, dead processes", () => {
      const mine = procStartTime(process.pid);
      assert.ok(mine > 0n);
      assert.ok(peerAlive(process.pid));
      assert.ok(peerAlive(process.pid, mine));
      assert.ok(!peerAlive(process.pid, mine + 1n)); // another process under a reused pid
      const child = spawnSync(process.execPath, ["-e", "0"]);
      assert.ok(!peerAlive(child.pid));
      assert.ok(!peerAlive(0));
    });
  });

  describe("result layout", () => {
    test("every StepResult field lands at its Slot offset", () => {
      const layout = resultLayout(pac_env.SCHEMA);
      const moved = new Map<number, number>();
      for (const c of layout.copies) for (let k = 0; k < c.size; k++) moved.set(c.from + k, c.to + k);
      for (const f of pac_env.SCHEMA.ir.structs["StepResult"]!.fields) {
        assert.equal(moved.get(f.offset), off(SLOT, f.name), f.name);
      }
      assert.equal(moved.size, pac_env.StepResultCodec.size);
      assert.ok(layout.copies.length <= 4, "adjacent fields are copied in one run");
    });

    test("utf8Cut never splits a character", () => {
      assert.equal(utf8Cut("abc", 10).toString(), "abc");
      assert.equal(utf8Cut("ééé", 5).toString(), "éé");
      assert.equal(utf8Cut("ééé", 5).length, 4);
    });
  });

  describe("region", () => {
    test("created 0600 at its exact size; the koffi view is the mapping (both ways)", () => {
      const shm = parseShmUrl(`shm://${uniqueName()}`);
      const region = Region.create(shm, PAC, 2);
      try {
        const st = statSync(shm.path);
        assert.equal(st.mode & 0o777, 0o600);
        assert.equal(st.size, regionSize(2));
        assert.equal(region.numSlots, 2);
        region.dv.setUint32(0, MAGIC, true);
        region.bytes[CONTROL_SIZE + SLOT_SIZE + 7] = 0xab;
        const file = readFileSync(shm.path);
        assert.equal(file.readUInt32LE(0), MAGIC);
        assert.equal(file[CONTROL_SIZE + SLOT_SIZE + 7], 0xab);
        const other = Region.open(shm, PAC); // a second mapping sees the first one's writes
        try {
          Atomics.store(other.words, 5, 1234);
          assert.equal(Atomics.load(region.words, 5), 1234);
          assert.equal(other.bytes[CONTROL_SIZE + SLOT_SIZE + 7], 0xab);
        } finally {
          other.unmap();
        }
      } finally {
        assert.ok(region.unlinkIfOurs());
        region.unmap();
      }
      assert.ok(!existsSync(shm.path));
    });

    test("a live owner's region is never replaced; a dead owner's is", () => {
      const shm = parseShmUrl(`shm://${uniqueName()}`);
      const first = Region.create(shm, PAC, 1);
      try {
        first.dv.setUint32(off(CB, "magic"), MAGIC, true);
        first.dv.setUint32(off(CB, "owner_pid"), process.pid, true);
        first.dv.setBigUint64(off(CB, "owner_start_time"), procStartTime(process.pid), true);
        assert.throws(
          () => Region.create(shm, PAC, 1),
          (e: unknown) => e instanceof ConnectError && e.message.includes(`in use by a live server (pid ${process.pid})`),
        );
        const dead = spawnSync(process.execPath, ["-e", "0"]).pid;
        first.dv.setUint32(off(CB, "owner_pid"), dead, true);
        const second = Region.create(shm, PAC, 3);
        try {
          assert.equal(statSync(shm.path).size, regionSize(3));
          assert.ok(!first.unlinkIfOurs(), "the old mapping no longer owns the name");
        } finally {
          assert.ok(second.unlinkIfOurs());
          second.unmap();
        }
      } finally {
        first.unmap();
      }
    });

    test("a header-less segment is only replaced once it is old", () => {
      const shm = parseShmUrl(`shm://${uniqueName()}`);
      writeFileSync(shm.path, Buffer.alloc(10), { mode: 0o600 });
      try {
        assert.throws(() => Region.create(shm, PAC, 1), /a server starting up/);
      } finally {
        require("node:fs").unlinkSync(shm.path);
      }
    });

    test("futex waits time out, and a publish wakes a sleeper", async () => {
      const shm = parseShmUrl(`shm://${uniqueName()}`);
      const region = Region.create(shm, PAC, 1);
      try {
        Atomics.store(region.words, region.cbWord("state"), RegionState.READY);
        const at = region.slotAt(0, "sem_result_ready");
        const started = performance.now();
        assert.equal(waitWord(region, at, 1, true, 30e6, { spin: 100, sliceMs: 10 }), WAIT_TIMEOUT);
        assert.ok(performance.now() - started >= 25);
        assert.ok(Atomics.load(region.words, at >> 2) & SLEEP_BIT, "the waiter announced itself");
        assert.ok(publishWord(region, at, 1), "a publish after a sleeper wakes it");
        assert.ok(!publishWord(region, at, 2), "no sleeper: no FUTEX_WAKE");
        assert.equal(waitWord(region, at, 2, true, 1e6, { spin: 0, sliceMs: 1 }), 2);
        Atomics.store(region.words, region.cbWord("state"), RegionState.CLOSED);
        assert.equal(waitWord(region, at, 9, true, 1e9, { spin: 0, sliceMs: 5 }), -2);
      } finally {
        region.unlinkIfOurs();
        region.unmap();
      }
    });
  });

  describe("server", () => {
    test("serve(factory, shm://) answers a client that follows docs/shm.md", async () => {
      const url = `shm://${uniqueName()}?num_envs=3`;
      const server = await serve(() => new EchoEnv(), url, { envName: "echo" }); // N from the URL
      servers.add(server);
      const path = parseShmUrl(url).path;
      assert.equal(statSync(path).size, regionSize(3) + schemaArea(pac_env.SCHEMA).byteLength); // + the schema area
      const reply = await clientInWorker(url);
      assert.ok(reply.info.includes("echo") && reply.info.includes("node"));
      assert.equal(reply.resetLife, 0);
      assert.equal(reply.obs0, 7);
      assert.equal(reply.reward, 1.75);
      assert.equal(reply.life, 1);
      assert.equal(reply.badStatus, 8);
      assert.equal(reply.badText, "env 1: action 100 is outside 0..91");
      assert.deepEqual(reply.obsAfter, [3, 3, 3]); // the refused batch stepped nothing
      assert.equal(reply.shutdownStatus, 0);
      await server.close();
      servers.delete(server);
      assert.ok(!existsSync(path), "close() unlinks the segment");
    });

    test("a shared env cannot serve several envs; a live name is refused", async () => {
      const url = `shm://${uniqueName()}?num_envs=2`;
      await assert.rejects(serve(new EchoEnv(), url), (e: unknown) => e instanceof ConnectError && e.message.includes("factory"));
      assert.ok(!existsSync(parseShmUrl(url).path));
      const server = await serve(() => new EchoEnv(), url, { numEnvs: 2 });
      servers.add(server);
      await assert.rejects(serve(() => new EchoEnv(), url, { numEnvs: 2 }), /in use by a live server/);
      await server.close();
      servers.delete(server);
    });

    test("env errors are recovered and named; HELLO sets the auto-reset mode; finals", async () => {
      FaultyEnv.brokenResets = 0;
      const url = `shm://${uniqueName()}?num_envs=3`;
      const server = await serve(() => new FaultyEnv(), url, { numEnvs: 3, envName: "faulty" });
      servers.add(server);
      assert.equal(statSync(parseShmUrl(url).path).size, regionSize(3) + schemaArea(pac_env.SCHEMA).byteLength);
      assert.equal(regionSize(3), CONTROL_SIZE + 3 * SLOT_SIZE + 3 * 2576);
      const reply = await clientInWorker(url, "faults");
      const poisoned = "TypeError: poisoned action";
      assert.deepEqual(reply.answers, [
        [0, ""],
        [0, ""],
        [10, `env 1: ${poisoned} (the env was reset)`],
        [0, ""],
        [10, `env 0: ${poisoned} (the env was recreated); env 2: ${poisoned} (the env was reset)`],
        [10, `env 0: ${poisoned} (the env could not be reset: send a reset)`],
        [12, "env 0: step before the first reset"],
        [0, ""],
        [1, "unknown auto-reset mode 7"],
        [0, ""],
        [0, ""],
        [0, ""],
        [0, ""],
        [0, ""],
        [0, ""],
      ]);
      assert.deepEqual(reply.stepsAfterError, [3, 1, 3]); // env 1 was reset, the others kept on
      assert.deepEqual(reply.final, { seq0: true, seq1: false, obs0: 50, done: 1, slotObs0: 0, slotDone: 0 });
      assert.deepEqual(reply.nextStep, { doneBefore: 1, steps: 0, done: 0 });
      await server.close();
      servers.delete(server);
    });

    test("a client of a region no server made fails clearly, in bounded time", async () => {
      const name = uniqueName();
      await assert.rejects(
        openChannel(`shm://${name}`, { timeoutMs: 200 }),
        (e: unknown) => e instanceof ConnectError && e.message.includes(`is a server running on shm://${name}`),
      );
    });
  });
}
