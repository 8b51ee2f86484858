/**
 * The Node server CLI (`dist/cli/serve.js`, and the bin transport-serve-node) on misuse, as the
 * Python CLI answers it: a --seed outside u64 (env i gets seed + i, so seed + N - 1 < 2**64 too)
 * is a usage error at start, and a user factory that throws when the first env is made is
 * refused with Python's words and status ("cannot serve these envs: making one failed: ...",
 * exit 2), not as a server that cannot bind (exit 1). Real processes.
 */

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { connect } from "../index";

const SERVE = join(__dirname, "..", "cli", "serve.js");
const BIN = join(__dirname, "..", "..", "bin", "transport-serve-node.js");
const place = mkdtempSync(join(tmpdir(), "transport-cli-misuse-"));
after(() => rmSync(place, { recursive: true, force: true }));

writeFileSync(
  join(place, "throws.js"),
  [
    'exports.F = function () { throw new Error("node factory exploded"); };',
    'exports.C = class { constructor() { throw new RangeError("class ctor exploded"); } };',
    "",
  ].join("\n"),
);

const url = (): string => `unix://${join(tmpdir(), `transport-cli-misuse-${process.pid}-${Math.random().toString(16).slice(2)}.sock`)}`;

/** Run `script` with `args`: its exit status and its one stderr line (never a stack). */
function refused(script: string, args: string[]): { status: number | null; line: string } {
  const done = spawnSync(process.execPath, [script, ...args], { cwd: place, encoding: "utf8", timeout: 20_000 });
  const lines = done.stderr.split("\n").filter((l) => l !== "");
  assert.equal(lines.length, 1, done.stderr);
  assert.ok(!/\n\s+at /.test(done.stderr), done.stderr);
  assert.ok(!done.stdout.startsWith("ready"), `it served: ${done.stdout}`);
  return { status: done.status, line: lines[0] as string };
}

/** Start the server, run `use` on the URL it is ready on, then stop it (exit 0, socket gone). */
async function serving(args: string[], use: (address: string) => Promise<void>): Promise<void> {
  const address = url();
  const child = spawn(process.execPath, [SERVE, address, ...args], { cwd: place, stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  try {
    const line = await new Promise<string>((resolve) => {
      let out = "";
      child.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes("\n")) resolve(out.split("\n")[0] as string);
      });
      child.on("exit", () => resolve(out));
    });
    assert.equal(line, `ready ${address}`, stderr);
    await use(address);
  } finally {
    child.kill("SIGTERM");
  }
  assert.equal(await exited, 0, stderr);
  assert.ok(!existsSync(address.slice("unix://".length)));
}

describe("--seed is a u64, and seed + N - 1 too", () => {
  const rows: [string[], string][] = [
    [["--seed", "-5"], "--seed must be 0..18446744073709551615, not -5 (seeds are u64 on the wire; env i gets seed + i, i < --num-envs 1)"],
    [["--seed", "-1"], "--seed must be 0..18446744073709551615, not -1"],
    [["--seed", "18446744073709551616"], "--seed must be 0..18446744073709551615, not 18446744073709551616"],
    [["--seed", "18446744073709551615", "--num-envs", "2"], "--seed must be 0..18446744073709551614, not 18446744073709551615"],
    [["--num-envs", "4", "--seed", "18446744073709551613"], "--seed must be 0..18446744073709551612, not 18446744073709551613"],
  ];
  for (const [args, message] of rows) {
    test(args.join(" "), () => {
      const done = refused(SERVE, [url(), "--env", "echo", ...args]);
      assert.equal(done.status, 2, done.line);
      assert.ok(done.line.startsWith(`transport-serve: error: ${message}`), done.line);
    });
  }

  test("the bin says its own name", () => {
    const done = refused(BIN, [url(), "--seed", "-5"]);
    assert.equal(done.status, 2, done.line);
    assert.ok(done.line.startsWith("transport-serve-node: error: --seed must be 0..18446744073709551615, not -5"), done.line);
  });

  test("the largest seed of N envs serves: env N-1 resets with 2**64 - 1", async () => {
    await serving(["--env", "echo", "--num-envs", "2", "--seed", "18446744073709551614"], async (address) => {
      const client = await connect(address);
      try {
        await client.reset(); // unseeded: env 0 gets 2**64 - 2, env 1 gets 2**64 - 1
      } finally {
        await client.close();
      }
    });
  });
});

describe("a factory that throws when the first env is made: exit 2, the Python CLI's words", () => {
  test("a function factory, through the bin", () => {
    const done = refused(BIN, [url(), "--env", "./throws.js:F", "--schema", "pac_env"]);
    assert.equal(done.status, 2, done.line);
    assert.equal(done.line, "transport-serve-node: error: cannot serve these envs: making one failed: Error: node factory exploded");
  });

  test("an env class whose constructor throws, as transport-serve --lang node runs it", () => {
    const done = refused(SERVE, [url(), "--env", "./throws.js:C", "--schema", "pac_env", "--num-envs", "3"]);
    assert.equal(done.status, 2, done.line);
    assert.equal(done.line, "transport-serve: error: cannot serve these envs: making one failed: RangeError: class ctor exploded");
  });

  test("with worker threads (the env made at start to ask its spaces)", () => {
    const done = refused(SERVE, [url(), "--env", "./throws.js:F", "--schema", "pac_env", "--workers", "2"]);
    assert.equal(done.status, 2, done.line);
    assert.equal(done.line, "transport-serve: error: cannot serve these envs: making one failed: Error: node factory exploded");
  });

  test("a vector env class is still made with new C(numEnvs) and serves", async () => {
    await serving(["--env", "vector-echo", "--num-envs", "3"], async (address) => {
      const client = await connect(address);
      try {
        assert.equal(client.numEnvs, 3);
        await client.reset(7n);
      } finally {
        await client.close();
      }
    });
  });
});
