/**
 * Issue 22 item 4: an shm:// server whose region another process changes notices it within a
 * second, says so in one line, and either repairs what it owns or stops (exit 1, segment gone).
 * Real server processes (the Node CLI and, when Python is installed, the Python CLI); this test
 * process is the "other process": it writes words into /dev/shm/transport-NAME with pwrite (no
 * mapping kept) or truncates it, and checks with the Node client. Before the fix: the Node
 * server exited 0 silently on a flipped state word and left its segment; a truncated idle
 * region, a scribbled magic or a foreign `client_pid` left both servers alive but refusing
 * every new client forever.
 */

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, ftruncateSync, openSync, statSync, writeSync } from "node:fs";
import { after, describe, test } from "node:test";

import { native } from "../backends/shm/native";
import { CB, RegionState, parseShmUrl } from "../backends/shm/region";
import { connect } from "../index";
import { HAVE_PYTHON, ServerProcess } from "../testing/servers";

const NOTICE_MS = 15_000; // "within a second", with room for a loaded 2-core machine
const LANGS: Array<"node" | "python"> = HAVE_PYTHON ? ["node", "python"] : ["node"];

const servers: ServerProcess[] = [];
after(async () => {
  for (const server of servers) {
    await server.stop("SIGKILL");
    native().shmUnlink(parseShmUrl(server.url).segment);
  }
});

/** A server on a fresh name, and everything it writes on stderr from now on. */
async function started(lang: "node" | "python"): Promise<{ server: ServerProcess; path: string; stderr: () => string }> {
  const url = `shm://node-loss-${process.pid}-${randomBytes(5).toString("hex")}`;
  const server = await ServerProcess.start(lang, url, "--env", "echo");
  servers.push(server);
  let err = "";
  server.proc.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
  return { server, path: parseShmUrl(url).path, stderr: () => err };
}

function writeField(path: string, field: string, value: bigint): void {
  const f = CB[field]!;
  const data = Buffer.alloc(f.size);
  if (f.size === 8) data.writeBigUInt64LE(value);
  else data.writeUInt32LE(Number(value));
  const fd = openSync(path, "r+");
  try {
    writeSync(fd, data, 0, data.length, f.offset);
  } finally {
    closeSync(fd);
  }
}

/** The exit code of a server that must stop by itself within NOTICE_MS. */
async function exitCode(server: ServerProcess): Promise<number | null> {
  const proc = server.proc;
  if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error("the server lost its region but its process stays alive")), NOTICE_MS);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      ok(code);
    });
  });
}

/** A new Node client attaches and steps, retried until the server repaired the region. */
async function connects(url: string): Promise<void> {
  const deadline = Date.now() + NOTICE_MS;
  for (;;) {
    try {
      const client = await connect(url, { timeoutMs: 2000 });
      try {
        await client.reset(1n);
        const results = (await client.step([3])) as Array<{ observation: Float32Array }>;
        assert.equal(results[0]!.observation[0], 3);
        return;
      } finally {
        await client.close();
      }
    } catch (error) {
      if (Date.now() > deadline) throw new Error(`no new client could attach after the repair: ${(error as Error).message}`);
      await new Promise((ok) => setTimeout(ok, 50));
    }
  }
}

async function stopped(server: ServerProcess): Promise<void> {
  await server.stop("SIGTERM");
  await new Promise((ok) => setImmediate(ok)); // the last stderr chunks
}

for (const lang of LANGS) {
  describe(`shm:// region changed under a ${lang} server`, () => {
    test("a flipped state word: exit 1, one line saying why, the segment removed", async () => {
      const { server, path, stderr } = await started(lang);
      writeField(path, "state", BigInt(RegionState.CLOSED));
      assert.equal(await exitCode(server), 1, stderr());
      assert.match(stderr(), /state word was set to 2 \(CLOSED\) by another process/);
      assert.match(stderr(), /transport-serve: error: /);
      assert.equal(existsSync(path), false, "the server removes the region it stopped serving");
    });

    test("an idle region truncated to a page: exit 1, the segment removed", async () => {
      const { server, path, stderr } = await started(lang);
      const was = statSync(path).size;
      const fd = openSync(path, "r+");
      ftruncateSync(fd, 4096);
      closeSync(fd);
      assert.equal(await exitCode(server), 1, stderr());
      assert.ok(stderr().includes(`another process truncated ${path} (now 4096 bytes, was ${was})`), stderr());
      assert.equal(existsSync(path), false);
    });

    test("a scribbled magic is rewritten: a new client attaches", async () => {
      const { server, path, stderr } = await started(lang);
      writeField(path, "magic", 0xdeadbeefn);
      await connects(server.url);
      await stopped(server);
      assert.match(stderr(), /control block field magic was changed to 0xDEADBEEF/);
    });

    test("a live process that is not a client in client_pid loses the lease", async () => {
      const { server, path, stderr } = await started(lang);
      const foreign: ChildProcess = spawn("sleep", ["120"], { stdio: "ignore" });
      try {
        writeField(path, "client_pid", BigInt(foreign.pid!));
        await connects(server.url);
      } finally {
        foreign.kill("SIGKILL");
      }
      await stopped(server);
      assert.ok(stderr().includes(`client pid ${foreign.pid} is alive but does not map`), stderr());
    });
  });
}
