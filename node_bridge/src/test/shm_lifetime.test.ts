/**
 * Issue 22 items 2 and 5, the Node shm:// client: typed arrays a caller kept outlive close(),
 * and close() always lets go of the lease.
 *
 * Item 2: results are typed arrays over the mapping itself. Before the fix close() unmapped it
 * under them, and reading a kept one killed the process (SIGSEGV): the crash cases run in a
 * child `node` process, which must exit 0 printing the right values. Item 5: a server that
 * answers SHUTDOWN with a status (the Python stand-in `tests/shm_refusing_peer.py`) must not
 * leave the lease taken.
 */

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { after, describe, test } from "node:test";

import { native } from "../backends/shm/native";
import { CB, off, parseShmUrl } from "../backends/shm/region";
import { connect, TransportError } from "../index";
import { HAVE_PYTHON, PYTHON, ROOT, ServerProcess } from "../testing/servers";

const INDEX_JS = resolve(__dirname, "..", "index.js");

function shmUrl(numEnvs: number): string {
  return `shm://node-lifetime-${process.pid}-${randomBytes(5).toString("hex")}?num_envs=${numEnvs}`;
}

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) await server.stop("SIGKILL");
});

/** `script` in a child `node --expose-gc` (URL and the package as `transport`); its last line is JSON. */
function runChild(script: string, url: string): Record<string, unknown> {
  const code = `const transport = require(${JSON.stringify(INDEX_JS)});\nconst URL = ${JSON.stringify(url)};\n(async () => {\n${script}\n})().catch((e) => { console.error(e); process.exit(3); });`;
  const child = spawnSync(process.execPath, ["--expose-gc", "-e", code], { cwd: ROOT, encoding: "utf8", timeout: 60_000 });
  assert.equal(child.status, 0, `the child died: status ${child.status} signal ${child.signal} (SIGSEGV before the fix)\n${child.stdout}\n${child.stderr}`);
  const lines = child.stdout.trim().split("\n");
  return JSON.parse(lines[lines.length - 1] as string) as Record<string, unknown>;
}

const MAPS_HELPERS = `
const { readFileSync } = require("node:fs");
const maps = () => readFileSync("/proc/self/maps", "utf8").split("\\n").filter(Boolean);
const mapsSegment = (name) => maps().filter((l) => l.includes(name)).length;
const holds = (address) => maps().some((l) => {
  const [lo, hi] = l.split(" ")[0].split("-").map((x) => BigInt("0x" + x));
  return lo <= address && address < hi;
});
const tick = () => new Promise((r) => setTimeout(r, 10));
`;

describe("Node shm:// client: what results view outlives close()", () => {
  test("kept typed arrays read their values after close, and are unmapped once collected", async () => {
    const server = await ServerProcess.start("node", shmUrl(2), "--env", "echo");
    servers.push(server);
    const segment = `transport-${parseShmUrl(server.url).name}`;
    try {
      const out = runChild(
        `${MAPS_HELPERS}
        let client = await transport.connect(URL, { timeoutMs: 10000 });
        await client.reset();
        let results = await client.step([3, 4]);
        let a = results[0].observation, b = results[1].observation, second = results[1];
        const address = client.channel.region.address;
        const before = mapsSegment(${JSON.stringify(segment)});
        const open = [a[0], a[1], b[0], second.reward, second.life];
        await client.close();
        const afterClose = mapsSegment(${JSON.stringify(segment)});
        const kept = [a[0], a[1], b[0], second.reward, second.life];
        a[0] = 42; // a private copy: reaches no other process
        client = null; results = null;
        for (let i = 0; i < 3; i++) { global.gc(); await tick(); }
        const collected = [a[0], b[0], b.length];
        const heldWithViews = holds(address);
        a = null; b = null; second = null;
        let freed = false;
        for (let i = 0; i < 200 && !freed; i++) { global.gc(); await tick(); freed = !holds(address); }
        console.log(JSON.stringify({ before, afterClose, open, kept, collected, heldWithViews, freed }));`,
        server.url,
      );
      assert.ok((out["before"] as number) >= 1, "the client mapped the segment");
      assert.equal(out["afterClose"], 0, "after close the process holds none of the segment");
      assert.deepEqual((out["open"] as number[]).slice(0, 3), [3, 1, 4]);
      assert.deepEqual(out["kept"], out["open"], "the kept views read what they read before close");
      assert.deepEqual(out["collected"], [42, 4, 612]);
      assert.equal(out["heldWithViews"], true);
      assert.equal(out["freed"], true, "unmapped once the last view was collected");
    } finally {
      await server.stop();
    }
  });

  test("a closed client raises TransportError and its kept results stay readable", async () => {
    const server = await ServerProcess.start("node", shmUrl(1), "--env", "echo");
    servers.push(server);
    try {
      const out = runChild(
        `const client = await transport.connect(URL, { timeoutMs: 10000 });
        await client.reset();
        const r = await client.step(5);
        await client.close();
        const errors = {};
        const calls = { step: () => client.step(1), reset: () => client.reset(), health: () => client.health(), spaces: () => client.spaces() };
        for (const [name, call] of Object.entries(calls)) {
          try { await call(); errors[name] = "no error"; }
          catch (e) { errors[name] = e instanceof transport.TransportError ? "TransportError" : String(e); }
        }
        await client.close();
        console.log(JSON.stringify({ errors, obs: r.observation[0], life: r.life }));`,
        server.url,
      );
      assert.deepEqual(out["errors"], { step: "TransportError", reset: "TransportError", health: "TransportError", spaces: "TransportError" });
      assert.equal(out["obs"], 5);
    } finally {
      await server.stop();
    }
  });

  test("a region truncated by another process is closed without a fault; kept views read zeros past its end", () => {
    const url = shmUrl(2);
    let out: Record<string, unknown>;
    try {
      out = runChild(
        `const { truncateSync } = require("node:fs");
        const shmRegion = require(${JSON.stringify(resolve(__dirname, "..", "backends", "shm", "region.js"))});
        const pac_env = require(${JSON.stringify(resolve(__dirname, "..", "generated", "pac_env.js"))});
        const shm = shmRegion.parseShmUrl(URL);
        const region = shmRegion.Region.create(shm, shmRegion.ShmLayout.of(pac_env.SCHEMA), 2);
        try {
          const head = region.bytes.subarray(0, 64);
          const far = region.bytes.subarray(region.size - 16);
          head[1] = 9;
          far[1] = 5;
          truncateSync(shm.path, 100); // another process's truncation: the pages past it are gone
          region.unmap();
          console.log(JSON.stringify({ head: head[1], far: far[1] }));
        } finally {
          region.unlinkIfOurs();
        }`,
        url,
      );
    } finally {
      native().shmUnlink(parseShmUrl(url).segment); // left by a child that crashed (else ENOENT)
    }
    assert.deepEqual(out, { head: 9, far: 0 });
  });
});

/** The Python stand-in server that answers SHUTDOWN with an error status. */
async function refusingPeer(url: string): Promise<{ stop(): Promise<void> }> {
  const proc = spawn(PYTHON, ["-m", "tests.shm_refusing_peer", url], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  proc.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
  await new Promise<void>((ok, fail) => {
    let out = "";
    const timer = setTimeout(() => fail(new Error(`the peer printed no ready line: ${err}`)), 20_000);
    proc.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (!out.includes("\n")) return;
      clearTimeout(timer);
      if (out.startsWith(`ready ${url}`)) ok();
      else fail(new Error(`the peer failed: ${out} ${err}`));
    });
  });
  return {
    stop: () =>
      new Promise<void>((done) => {
        if (proc.exitCode !== null) return done();
        proc.once("exit", () => done());
        proc.kill("SIGTERM");
      }),
  };
}

function clientPidOf(url: string): number {
  const data = readFileSync(`/dev/shm/transport-${parseShmUrl(url).name}`);
  return data.readUInt32LE(off(CB, "client_pid"));
}

describe("Node shm:// client: close() always lets go of the lease", { skip: HAVE_PYTHON ? false : "needs the Python package" }, () => {
  test("a SHUTDOWN answered with a status still releases the lease", async () => {
    const url = `shm://node-refusing-${process.pid}-${randomBytes(5).toString("hex")}`;
    const peer = await refusingPeer(url);
    try {
      for (let i = 0; i < 3; i++) {
        const client = await connect(url, { timeoutMs: 10_000 });
        assert.equal(clientPidOf(url), process.pid);
        await client.reset();
        try {
          await client.close();
        } catch (error) {
          assert.ok(error instanceof TransportError, `close() threw ${String(error)}`);
        }
        assert.equal(clientPidOf(url), 0, "the lease is released");
      }
    } finally {
      await peer.stop();
    }
  });
});
