/**
 * A client and node's event loop, and a client whose server died, on every backend (real server
 * processes, real client processes).
 *
 * Before: a script that ended without `close()` never exited over unix://, zmq+ipc:// and
 * zmq+tcp:// (the socket, and zeromq.js's pending monitor read, held the loop), also with a
 * SIGKILLed server; over zmq the request after a PeerGoneError waited its whole timeoutMs (with
 * `timeoutMs: null`, forever) before "no connection to ...", where unix and http rejected it at
 * once ("...; open a new client").
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, describe, test } from "node:test";
import { PeerGoneError } from "../errors";
import { connect } from "../index";
import { ServerProcess } from "../testing/servers";

const INDEX_JS = resolve(__dirname, "..", "index.js");
const DIR = mkdtempSync(join(tmpdir(), "transport-client-exit-"));
const tag = (): string => `${process.pid}-${randomBytes(3).toString("hex")}`;

/** A fresh URL of each backend (zmq+tcp and http: port 0, the server's ready line names its port;
 * a port picked here could be taken by another test process before the server binds it). */
function urls(): Record<string, string> {
  return {
    unix: `unix://${join(DIR, `cexit-${tag()}.sock`)}`,
    http: "http://127.0.0.1:0",
    "zmq+ipc": `zmq+ipc://${join(DIR, `cexit-${tag()}.zmq`)}`,
    "zmq+tcp": "zmq+tcp://127.0.0.1:0",
    shm: `shm://cexit-${tag()}?num_envs=2`,
  };
}

// an env whose step takes 1.5 s (SLOW_STEP_MS): a request that is in flight for a while
writeFileSync(
  join(DIR, "slow.js"),
  `class Slow {
  spaces() { return { obsN: 612, actN: 92 }; }
  #r = { observation: new Float32Array(612), action_mask: new Uint8Array(92).fill(1), reward: 0, done: false, rank: 0, life: 0, money: 0, stage: 0, board_size: 0, level: 0, synergy_count: 0, items_held: 0, actions_this_turn: 0 };
  reset() { return this.#r; }
  step() { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Number(process.env.SLOW_STEP_MS ?? 1500)); this.#r.reward = 1; return this.#r; }
}
module.exports = { Slow };
`,
);

after(() => {
  rmSync(DIR, { recursive: true, force: true });
  // the regions of SIGKILLed shm servers
  for (const name of readdirSync("/dev/shm")) {
    if (name.includes(`cexit-${process.pid}-`)) rmSync(join("/dev/shm", name), { force: true });
  }
});

/** Run `body` (an async function body; `tb` is the package, `url` the server's) in a new node. */
function runScript(body: string, url: string, limitMs = 20_000): Promise<{ code: number | null; signal: string | null; out: string; ms: number }> {
  const script = `const tb = require(${JSON.stringify(INDEX_JS)}); const url = ${JSON.stringify(url)};\n(async () => {\n${body}\n})().catch((e) => { console.log("script failed", e.constructor.name, e.message); process.exitCode = 3; });`;
  return new Promise((ok) => {
    const started = Date.now();
    const child = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (out += chunk.toString()));
    const timer = setTimeout(() => child.kill("SIGKILL"), limitMs);
    const reap = (): void => void child.kill("SIGKILL"); // a cancelled test leaves no client behind
    process.once("exit", reap);
    child.once("exit", (code, signal) => {
      process.removeListener("exit", reap);
      clearTimeout(timer);
      ok({ code, signal, out, ms: Date.now() - started });
    });
  });
}

describe("a client does not keep node running while idle", () => {
  for (const [kind, url] of Object.entries(urls())) {
    test(`${kind}: a script that ends without close() exits; a request in flight is answered first`, async () => {
      const server = await ServerProcess.start("node", url, "--env", `${join(DIR, "slow.js")}:Slow`, "--num-envs", "2");
      try {
        const idle = await runScript(
          `const c = await tb.connect(url, { timeoutMs: 10000 }); await c.reset(7n); await c.health(); console.log("script end");`,
          server.url,
        );
        assert.equal(idle.signal, null, `the idle client kept node running (killed after 20 s): ${idle.out}`);
        assert.equal(idle.code, 0, idle.out);
        assert.match(idle.out, /script end/);

        const pending = await runScript(
          `const c = await tb.connect(url, { timeoutMs: 10000 }); await c.reset(7n);
           c.step([0, 0]).then((r) => console.log("step answered", r[0].reward), (e) => console.log("step failed", e.message));
           console.log("script end");`,
          server.url,
        );
        assert.equal(pending.code, 0, pending.out);
        assert.match(pending.out, /script end\n[^]*step answered 1/);
      } finally {
        await server.stop();
      }
    });
  }

  for (const kind of Object.keys(urls())) {
    test(`${kind}: a script whose request timed out exits without close() (its late response not awaited)`, async () => {
      process.env["SLOW_STEP_MS"] = "60000"; // the server's step: a minute
      let server: ServerProcess;
      try {
        server = await ServerProcess.start("node", urls()[kind] as string, "--env", `${join(DIR, "slow.js")}:Slow`, "--num-envs", "2");
      } finally {
        delete process.env["SLOW_STEP_MS"];
      }
      try {
        const run = await runScript(
          `const c = await tb.connect(url, { timeoutMs: 500 }); await c.reset(7n);
           try { await c.step([0, 0]); console.log("step answered?!"); } catch (e) { console.log("step failed", e.constructor.name); }
           console.log("script end");`,
          server.url,
        );
        assert.equal(run.signal, null, `the client kept node running (killed after 20 s): ${run.out}`);
        assert.match(run.out, /step failed TransportTimeoutError[^]*script end/);
      } finally {
        await server.stop("SIGKILL");
      }
    });
  }

  for (const kind of ["unix", "zmq+ipc", "zmq+tcp"]) {
    test(`${kind}: a script whose server was SIGKILLed exits without close()`, async () => {
      const server = await ServerProcess.start("node", urls()[kind] as string, "--env", "echo", "--num-envs", "2");
      const pid = server.proc.pid as number;
      try {
        const run = await runScript(
          `const c = await tb.connect(url, { timeoutMs: 3000 }); await c.reset(7n);
           process.kill(${pid}, "SIGKILL");
           await new Promise((r) => setTimeout(r, 300));
           try { await c.step([0, 0]); console.log("step answered?!"); } catch (e) { console.log("step failed", e.constructor.name); }
           console.log("script end");`,
          server.url,
        );
        assert.equal(run.signal, null, `the client kept node running (killed after 20 s): ${run.out}`);
        assert.match(run.out, /step failed PeerGoneError[^]*script end/);
      } finally {
        await server.stop("SIGKILL");
      }
    });
  }
});

describe("after a PeerGoneError every request is a PeerGoneError at once", () => {
  for (const kind of Object.keys(urls())) {
    for (const timeoutMs of [30_000, null]) {
      test(`${kind}, timeoutMs ${timeoutMs}: the server SIGKILLed while idle`, async () => {
        const url = urls()[kind] as string;
        const server = await ServerProcess.start("node", url, "--env", "echo", "--num-envs", "2");
        const client = await connect(server.url, { timeoutMs });
        try {
          await client.reset(7n);
          await server.stop("SIGKILL");
          await new Promise((r) => setTimeout(r, 300));
          // the first request learns it (a zmq or shm client may need a moment)
          const bound = new Promise<never>((_, reject) =>
            setTimeout(() => reject(new Error("no answer within 10 s")), 10_000).unref(),
          );
          await assert.rejects(Promise.race([client.step([0, 0]), bound]), PeerGoneError);
          for (let i = 0; i < 2; i++) {
            const started = Date.now();
            await assert.rejects(Promise.race([client.step([0, 0]), bound]), (error: unknown) => {
              assert.ok(error instanceof PeerGoneError, String(error));
              assert.ok(error.message.startsWith(kind === "shm" ? "shm://" : server.url), error.message);
              return true;
            });
            assert.ok(Date.now() - started < 5000, `request ${i + 2} took ${Date.now() - started} ms`);
          }
        } finally {
          await client.close();
          await server.stop("SIGKILL");
        }
      });
    }
  }
});
