/**
 * The bin `transport-serve-node` serving a user's own env module (`--env ./mod.js:FACTORY`), as a
 * user runs it: a real process started in the module's folder, real Node clients.
 *
 * - an env class (not only a zero-argument function) with `--workers K`, over unix and shm;
 * - without `--schema`: the schema FACTORY or its module exports as SCHEMA is served (workers
 *   too); an env that declares none is tried on pac_env at start and refused there (exit 2, one
 *   line; nothing created) when its results do not fit, served when they do;
 * - `shm://NAME?num_envs=a` with `--num-envs b` (b not 1, not a): a usage error, exit 2, in the
 *   Python CLI's words; b = 1 yields to the URL;
 * - the help and the error lines name the command that was run (`transport-serve-node`, or
 *   `transport-serve` for `dist/cli/serve.js`, which `transport-serve --lang node` runs), the
 *   synopsis has every flag, and a bad URL exits 1 as the help says.
 */

import assert from "node:assert/strict";
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { randomBytes } from "node:crypto";
import { connect } from "../index";
import { HAVE_PYTHON, PYTHON } from "../testing/servers";

const BIN = join(__dirname, "..", "..", "bin", "transport-serve-node.js");
const SERVE_JS = join(__dirname, "..", "cli", "serve.js");
const DIST = join(__dirname, "..");
const TAG = `cliuser-${process.pid}-${randomBytes(3).toString("hex")}`;
const place = mkdtempSync(join(tmpdir(), "transport-cli-user-env-"));

// the user's modules, in the folder the bin is started from (--env ./drift.js:Drift)
const DRIFT = `
"use strict";
const { dictbox } = require(${JSON.stringify(join(DIST, "generated"))});
/** dictbox (Box action f32[2]): vec[0] counts steps, distance sums the first action element. */
class Drift {
  constructor() { this.sum = 0; this.t = 0; }
  spaces() { return { obsN: 54, actN: 2 }; }
  reset(seed) { this.sum = seed === undefined ? 0 : Number(seed); this.t = 0; return this.view(0); }
  step(action) { this.sum += action[0]; this.t += 1; return this.view(action[1]); }
  view(reward) {
    return { grid: new Float32Array(50), vec: new Float32Array([this.t / 100, 0, 0, 0]), reward,
      terminated: false, truncated: false, distance: this.sum };
  }
}
class Declared extends Drift {}
Declared.SCHEMA = dictbox.SCHEMA; // the class declares it; the module does not
module.exports = { Drift, Declared, makeDrift: () => new Drift() };
`;
writeFileSync(join(place, "drift.js"), DRIFT);
writeFileSync(
  join(place, "declared.js"),
  `const { Drift } = require("./drift.js");\nexports.Drift = Drift;\nexports.SCHEMA = require(${JSON.stringify(join(DIST, "generated"))}).dictbox.SCHEMA;\n`,
);
writeFileSync(
  join(place, "misfit.js"),
  "exports.N = class { spaces() { return { obsN: 4, actN: 3 }; } reset() { return this.step(0); } " +
    "step() { return { observation: [1, 2, 3, 4], reward: 1, terminated: false, truncated: false }; } };\n",
);
writeFileSync(join(place, "pacfit.js"), `exports.Pac = class extends require(${JSON.stringify(join(DIST, "envs"))}).PacEnv {};\n`);
writeFileSync(join(place, "notaschema.js"), `exports.Drift = require("./drift.js").Drift;\nexports.SCHEMA = "dictbox";\n`);

const children = new Set<ChildProcessWithoutNullStreams>();
after(async () => {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((ok) => child.once("exit", ok));
      child.kill("SIGKILL");
      await exited;
    }
  }
  rmSync(place, { recursive: true, force: true });
  const left = readdirSync("/dev/shm").filter((name) => name.includes(TAG));
  for (const name of left) rmSync(join("/dev/shm", name), { force: true });
  assert.deepEqual(left, [], "no region of these tests is left in /dev/shm");
});

let serial = 0;
const unixUrl = (): string => `unix://${join(tmpdir(), `${TAG}-${++serial}.sock`)}`;
const shmUrl = (numEnvs: number): string => `shm://${TAG}-${++serial}?num_envs=${numEnvs}`;

/** What a start came to: `ready URL` (the server is running: `child`), or an exit. */
interface Started {
  readonly ready: string | null;
  readonly status: number | null;
  readonly stderr: string;
  readonly child: ChildProcessWithoutNullStreams;
}

/** Start `command` (the bin, by default) in the modules' folder; resolves at `ready` or exit. */
function start(args: string[], command: string[] = [process.execPath, BIN]): Promise<Started> {
  const [file, ...first] = command as [string, ...string[]];
  const child = spawn(file, [...first, ...args], { cwd: place, stdio: ["pipe", "pipe", "pipe"] });
  children.add(child);
  let out = "";
  let err = "";
  child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`neither ready nor an exit in 60 s: ${err}`)), 60_000);
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      const line = out.split("\n")[0] as string;
      if (out.includes("\n") && line.startsWith("ready ")) {
        clearTimeout(timer);
        resolve({ ready: line.slice(6).trim(), status: null, stderr: err, child });
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve({ ready: null, status: code, stderr: err, child });
    });
  });
}

/** A server that must start: its URL (stopped by `stop`). */
async function served(args: string[]): Promise<Started & { ready: string }> {
  const started = await start(args);
  assert.ok(started.ready !== null, `the server did not start (exit ${started.status}): ${started.stderr}`);
  return started as Started & { ready: string };
}

async function stop(started: Started): Promise<void> {
  const child = started.child;
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((ok) => child.once("exit", ok));
  child.kill("SIGTERM");
  await exited;
}

/** A start that must be refused: exit `status`, one stderr line (returned), nothing created. */
async function refused(args: string[], status: number, command?: string[]): Promise<string> {
  const started = await start(args, command);
  if (started.ready !== null) await stop(started);
  assert.equal(started.ready, null, `it served ${started.ready}, instead of refusing`);
  assert.equal(started.status, status, started.stderr);
  const lines = started.stderr.split("\n").filter((line) => line !== "");
  assert.equal(lines.length, 1, started.stderr);
  assert.ok(!started.stderr.includes("Require stack") && !/\n\s+at /.test(started.stderr), started.stderr);
  const url = args[0] as string;
  if (url.startsWith("unix://")) assert.ok(!existsSync(url.slice("unix://".length)), "the socket file is left");
  assert.deepEqual(readdirSync("/dev/shm").filter((name) => name.includes(TAG)), [], "a region was created");
  return lines[0] as string;
}

type Row = { vec: Float32Array; distance: number };

/** Reset with seed 10 and step once: each env's distance (seed + i + its action) and step count. */
async function driftOnce(url: string, numEnvs: number): Promise<void> {
  const client = await connect(url, { timeoutMs: 30_000 });
  try {
    assert.equal(client.numEnvs, numEnvs);
    assert.equal(client.schema.name, "dictbox");
    const reset = [await client.reset(10n, { copy: true })].flat() as unknown as Row[];
    assert.deepEqual(
      reset.map((r) => r.distance),
      Array.from({ length: numEnvs }, (_, i) => 10 + i),
    );
    const actions = Array.from({ length: numEnvs }, (_, i) => [i % 2 === 0 ? 0.5 : -0.5, 0]);
    const stepped = [await client.step(numEnvs === 1 ? (actions[0] as number[]) : actions, { copy: true })].flat() as unknown as Row[];
    assert.deepEqual(
      stepped.map((r) => r.distance),
      Array.from({ length: numEnvs }, (_, i) => 10 + i + (i % 2 === 0 ? 0.5 : -0.5)),
    );
    assert.deepEqual(
      stepped.map((r) => Math.round((r.vec[0] as number) * 100)),
      new Array(numEnvs).fill(1),
    );
  } finally {
    await client.close();
  }
}

describe("transport-serve-node --env MODULE:Class --workers K (a class factory in worker threads)", () => {
  for (const scheme of ["unix", "shm"] as const) {
    test(`an env class with --workers 2 over ${scheme}: every env steps`, async () => {
      const url = scheme === "unix" ? unixUrl() : shmUrl(4);
      const server = await served([url, "--env", "./drift.js:Drift", "--schema", "dictbox", "--num-envs", "4", "--workers", "2"]);
      try {
        await driftOnce(server.ready, 4);
      } finally {
        await stop(server);
      }
    });
  }

  test("a zero-argument function with --workers 2 still serves (unix)", async () => {
    const server = await served([unixUrl(), "--env", "./drift.js:makeDrift", "--schema", "dictbox", "--num-envs", "3", "--workers", "2"]);
    try {
      await driftOnce(server.ready, 3);
    } finally {
      await stop(server);
    }
  });
});

describe("transport-serve-node without --schema: the env's own schema, or a refusal at start", () => {
  test("the module's SCHEMA export is served (unix)", async () => {
    const server = await served([unixUrl(), "--env", "./declared.js:Drift", "--num-envs", "2"]);
    try {
      await driftOnce(server.ready, 2);
    } finally {
      await stop(server);
    }
  });

  test("the class's own SCHEMA is served, in worker threads too (shm, --workers 2)", async () => {
    const server = await served([shmUrl(2), "--env", "./drift.js:Declared", "--workers", "2"]);
    try {
      await driftOnce(server.ready, 2);
    } finally {
      await stop(server);
    }
  });

  for (const scheme of ["unix", "shm"] as const) {
    test(`results that do not fit pac_env are refused at start over ${scheme}: exit 2, one line`, async () => {
      const line = await refused([scheme === "unix" ? unixUrl() : shmUrl(1), "--env", "./misfit.js:N"], 2);
      assert.ok(
        line.startsWith(
          'transport-serve-node: error: --env "./misfit.js:N": its results do not fit the default schema pac_env ' +
            "(no --schema was given, and neither N nor ./misfit.js exports SCHEMA): StepResult.observation: expected 612 elements, got 4; " +
            "pass --schema FILE",
        ),
        line,
      );
    });
  }

  test("with --workers 2 too (unix)", async () => {
    const line = await refused([unixUrl(), "--env", "./misfit.js:N", "--workers", "2"], 2);
    assert.match(line, /its results do not fit the default schema pac_env/);
  });

  test("through transport-serve --lang node: the same refusal", { skip: !HAVE_PYTHON && "no Python transport" }, async () => {
    const line = await refused([unixUrl(), "--env", "./misfit.js:N", "--lang", "node"], 2, [PYTHON, "-m", "transport.tools.serve_cli"]);
    assert.match(line, /^transport-serve: error: --env "\.\/misfit\.js:N": its results do not fit the default schema pac_env/);
  });

  test("an env whose results fit pac_env is still served with it", async () => {
    const server = await served([unixUrl(), "--env", "./pacfit.js:Pac"]);
    try {
      const client = await connect(server.ready, { timeoutMs: 30_000 });
      assert.equal(client.schema.name, "pac_env");
      await client.reset(1n);
      await client.step(0);
      await client.close();
    } finally {
      await stop(server);
    }
  });

  test("a SCHEMA export that is not a schema: exit 2, one line", async () => {
    const line = await refused([unixUrl(), "--env", "./notaschema.js:Drift"], 2);
    assert.ok(line.startsWith(`transport-serve-node: error: --env "./notaschema.js:Drift": ./notaschema.js's SCHEMA export is not a schema`), line);
  });
});

describe("transport-serve-node shm://NAME?num_envs=a --num-envs b", () => {
  test("b other than a and 1: a usage error before anything is created, the Python CLI's words", async () => {
    const url = shmUrl(2);
    const line = await refused([url, "--env", "echo", "--num-envs", "4"], 2);
    assert.equal(
      line,
      `transport-serve-node: error: ${url} asks for 2 envs but --num-envs is 4: give the same number, or one of them (see transport-serve-node --help)`,
    );
  });

  test("with a user's env too (the first case the tester found)", async () => {
    const url = shmUrl(4);
    const line = await refused([url, "--env", "./drift.js:Drift", "--schema", "dictbox", "--num-envs", "2"], 2);
    assert.match(line, /asks for 4 envs but --num-envs is 2: give the same number, or one of them/);
  });

  for (const given of ["1", "2"]) {
    test(`--num-envs ${given} with num_envs=2: serves 2 envs`, async () => {
      const server = await served([shmUrl(2), "--env", "./drift.js:Drift", "--schema", "dictbox", "--num-envs", given]);
      try {
        await driftOnce(server.ready, 2);
      } finally {
        await stop(server);
      }
    });
  }
});

describe("transport-serve-node's help and error lines name the command that was run", () => {
  const help = (command: string): string => {
    const done = spawnSync(process.execPath, [command, "--help"], { cwd: place, encoding: "utf8", timeout: 60_000 });
    assert.equal(done.status, 0, done.stderr);
    return done.stdout;
  };

  test("--help: the bin's name, every flag in the synopsis, where MODULE and the schema come from", () => {
    const text = help(BIN);
    assert.ok(text.startsWith("usage: transport-serve-node URL "), text.slice(0, 200));
    const synopsis = text.slice(0, text.indexOf("\n\n"));
    for (const flag of ["--env", "--schema", "--num-envs", "--workers", "--seed", "--max-body", "--masked-actions", "--max-connections", "--idle-timeout", "--read-timeout"]) {
      assert.ok(synopsis.includes(`[${flag} `), `${flag} is not in the synopsis:\n${synopsis}`);
    }
    assert.ok(!text.includes("serve.js"), "the help names serve.js");
    assert.match(text, /MODULE:FACTORY: a JS\s+module's path, resolved from the current directory/);
    assert.match(text, /Without --schema: .*\s+MODULE:FACTORY the SCHEMA that FACTORY, else the module, exports/);
    // a bad URL exits 1 (what fails while binding, as in the Python CLI), and the help says so
    assert.match(text, /1 when the server\s+cannot start while it binds \(a bad URL/);
  });

  test("dist/cli/serve.js (what transport-serve --lang node runs) names transport-serve", () => {
    assert.ok(help(SERVE_JS).startsWith("usage: transport-serve URL --lang node "));
  });

  test("a usage error through the bin points at the bin's help", async () => {
    const line = await refused([unixUrl(), "--bogus"], 2);
    assert.equal(line, "transport-serve-node: error: unrecognized arguments: --bogus (see transport-serve-node --help)");
  });

  test("through dist/cli/serve.js: transport-serve's words (the Python CLI's, as before)", async () => {
    const line = await refused([unixUrl(), "--bogus"], 2, [process.execPath, SERVE_JS]);
    assert.equal(line, "transport-serve: error: unrecognized arguments: --bogus (see transport-serve --help)");
  });

  test("an unknown scheme fails while binding: exit 1, one line, as the help says", async () => {
    const line = await refused(["ftp://x", "--env", "echo"], 1);
    assert.match(line, /^transport-serve-node: error: no backend for ftp:\/\//);
  });
});
