/**
 * node_bridge as a normal npm package: `npm pack` (the built dist, no tests), installed offline
 * into an empty project (`npm ci --offline` with a lock that pins the tarball and the bridge's own
 * locked dependencies, which `npm ci` put in the cache), then required by package name: a user's
 * env module served with `serve()` and with the package's bin (`transport-serve-node --env
 * module:Factory`), a client connecting, and a TypeScript file type-checked against the
 * package's `exports` types. Skipped when the cache cannot serve the dependencies offline.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";

import * as pac_env from "../generated/pac_env";

const BRIDGE = resolve(__dirname, "..", "..");
const NPM = process.platform === "win32" ? "npm.cmd" : "npm";
const work = mkdtempSync(join(tmpdir(), "transport-package-"));
const project = join(work, "project");
let installed = "";

after(() => rmSync(work, { recursive: true, force: true }));

function run(command: string, args: string[], cwd: string, timeout = 120_000): { status: number | null; out: string } {
  const result = spawnSync(command, args, { cwd, encoding: "utf8", timeout });
  return { status: result.status, out: `${result.stdout}${result.stderr}` };
}

/** The user's env: a plain JS module on the pac_env schema (no build step). */
const USER_ENV = `
const { pac_env } = require("@transport/node-bridge");
class CountingEnv {
  constructor() { this.t = 0; this.out = { ...pac_env.StepResultCodec.decode(new Uint8Array(pac_env.StepResultCodec.size), 0, false) }; this.out.action_mask = new Uint8Array(92).fill(1); }
  spaces() { return { obsN: 612, actN: 92 }; }
  reset() { this.t = 0; this.out.observation[0] = 0; return this.out; }
  step(action) { this.t++; this.out.observation[0] = action; this.out.observation[1] = this.t; return this.out; }
}
module.exports = { CountingEnv, makeEnv: () => new CountingEnv() };
`;

const USER_MAIN = `
const { serve, connect, SCHEMAS } = require("@transport/node-bridge");
const { EnvRuntime, EnvHost } = require("@transport/node-bridge/runtime");
const tetris = require("@transport/node-bridge/generated/tetris");
const { makeEnv } = require("./env.js");
(async () => {
  if (typeof EnvRuntime !== "function" || typeof EnvHost !== "function") throw new Error("runtime exports missing");
  if (!tetris.SCHEMA || !SCHEMAS) throw new Error("generated exports missing");
  const url = process.argv[2];
  const server = await serve(makeEnv, url, { numEnvs: 2 });
  const client = await connect(server.url);
  await client.reset(1n);
  const results = await client.step([5, 7]);
  console.log(JSON.stringify(results.map((r) => [r.observation[0], r.observation[1]])));
  await client.close();
  await server.close();
})().catch((e) => { console.error(e); process.exit(1); });
`;

const USER_TS = `
import { type Client, type Env, type Spaces, connect, pac_env } from "@transport/node-bridge";
import { EnvRuntime } from "@transport/node-bridge/runtime";
import * as rt from "@transport/node-bridge/codec";
import type { SchemaJson } from "@transport/node-bridge/ir";
export class MyEnv implements Env<pac_env.StepResultInput> {
  spaces(): Spaces { return { obsN: 612, actN: 92 }; }
  reset(): pac_env.StepResultInput { throw new Error("types only"); }
  step(_action: number): pac_env.StepResultInput { throw new Error("types only"); }
}
export const typed: Array<unknown> = [connect, EnvRuntime, rt.defineStruct];
export type Ir = SchemaJson;
export type C = Client;
`;

/** A user's Box env (schema dictbox): array actions as Float64Arrays, bigint seeds; the channels
 * and generated modules by their documented names. Compiled with no @types/node (issue 26). */
const BOX_TS = `
import { type Env, type Spaces } from "@transport/node-bridge";
import { dictbox } from "@transport/node-bridge/generated";
import { Ring } from "@transport/node-bridge/channels";
export class Drift implements Env<dictbox.StepResultInput> {
  x = 0;
  readonly out: dictbox.StepResultInput = { grid: new Float32Array(50), vec: new Float32Array(4), reward: 0, terminated: false, truncated: false, distance: 0 };
  spaces(): Spaces { return { obsN: 54, actN: 2 }; }
  reset(seed?: bigint): dictbox.StepResultInput { this.x = Number((seed ?? 0n) % 5n); return this.out; }
  step(action: Float64Array): dictbox.StepResultInput { this.x += action[0]!; this.out.distance = 4 - this.x; return this.out; }
}
export const ring: string = typeof Ring;
`;

describe("node_bridge as an npm package", () => {
  before(() => {
    const pack = run(NPM, ["pack", "--ignore-scripts", "--pack-destination", work], BRIDGE);
    assert.equal(pack.status, 0, pack.out);
    const tarball = join(work, readdirSync(work).find((f) => f.endsWith(".tgz"))!);
    const lock = JSON.parse(readFileSync(join(BRIDGE, "package-lock.json"), "utf8")) as {
      packages: Record<string, { dev?: boolean }>;
    };
    const manifest = JSON.parse(readFileSync(join(BRIDGE, "package.json"), "utf8")) as Record<string, unknown>;
    const integrity = `sha512-${createHash("sha512").update(readFileSync(tarball)).digest("base64")}`;
    const packages: Record<string, unknown> = {
      "": { name: "project", version: "1.0.0", dependencies: { "@transport/node-bridge": `file:${tarball}` } },
      "node_modules/@transport/node-bridge": {
        version: manifest["version"],
        resolved: `file:${tarball}`,
        integrity,
        dependencies: manifest["dependencies"],
        bin: manifest["bin"],
      },
    };
    for (const [key, entry] of Object.entries(lock.packages)) if (key && !entry.dev) packages[key] = entry;
    run("mkdir", ["-p", project], work);
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "project", version: "1.0.0", private: true, dependencies: { "@transport/node-bridge": `file:${tarball}` } }));
    writeFileSync(join(project, "package-lock.json"), JSON.stringify({ name: "project", version: "1.0.0", lockfileVersion: 3, requires: true, packages }));
    const install = run(NPM, ["ci", "--offline", "--no-audit", "--no-fund"], project);
    installed = install.status === 0 ? "" : install.out;
    writeFileSync(join(project, "env.js"), USER_ENV);
    writeFileSync(join(project, "main.js"), USER_MAIN);
    writeFileSync(join(project, "user.ts"), USER_TS);
    writeFileSync(join(project, "box.ts"), BOX_TS);
  });

  test("its bin lives outside dist/ (a rebuild re-emits dist/ 0644) and is executable", () => {
    const manifest = JSON.parse(readFileSync(join(BRIDGE, "package.json"), "utf8")) as { bin: Record<string, string> };
    for (const target of Object.values(manifest.bin)) {
      assert.ok(!target.startsWith("dist/"), `${target}: a rebuild drops its execute bit`);
      assert.ok((statSync(join(BRIDGE, target)).mode & 0o111) !== 0, `${target} is not executable`);
    }
    const tarball = readdirSync(work).find((f) => f.endsWith(".tgz"))!;
    const listing = run("tar", ["-tvzf", join(work, tarball)], work).out.split("\n");
    const bin = listing.find((line) => line.endsWith("package/bin/transport-serve-node.js"));
    assert.ok(bin?.startsWith("-rwx"), `bin mode in the tarball: ${bin}`);
  });

  test("the channels and generated modules import by their documented names", (t) => {
    if (installed) return t.skip("not installed");
    const script =
      'const { Ring, PolicyBoard, RunControl } = require("@transport/node-bridge/channels");' +
      'const { experience } = require("@transport/node-bridge/generated");' +
      "console.log([Ring, PolicyBoard, RunControl].map((f) => typeof f).join(), experience.TransitionCodec.size);";
    const result = run(process.execPath, ["-e", script], project, 60_000);
    assert.equal(result.status, 0, result.out);
    assert.equal(result.out.trim(), "function,function,function 1816");
  });

  test("a TypeScript Box env (Float64Array actions, bigint seeds) type-checks without @types/node", (t) => {
    if (installed) return t.skip("not installed");
    assert.ok(!existsSync(join(project, "node_modules", "@types", "node")), "@types/node is installed in the project");
    writeFileSync(
      join(project, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: { strict: true, module: "node16", moduleResolution: "node16", target: "ES2022", lib: ["ES2022"], types: [], skipLibCheck: true, noEmit: true },
        files: ["box.ts"],
      }),
    );
    const result = run(process.execPath, [join(BRIDGE, "node_modules", "typescript", "bin", "tsc"), "-p", "."], project);
    assert.equal(result.status, 0, result.out);
  });

  test("the tarball holds the built package and no tests", () => {
    const tarball = readdirSync(work).find((f) => f.endsWith(".tgz"))!;
    const list = run("tar", ["-tzf", join(work, tarball)], work).out.split("\n");
    assert.ok(list.includes("package/dist/index.js"));
    assert.ok(list.includes("package/dist/index.d.ts"));
    assert.ok(list.includes("package/dist/runtime/worker_main.js"));
    assert.ok(list.includes("package/dist/cli/serve.js"));
    assert.ok(list.includes("package/bin/transport-serve-node.js"));
    assert.ok(!list.some((f) => f.startsWith("package/dist/test/")), "no tests in the package");
  });

  test("required by name from an empty project, it serves a user's env and connects", (t) => {
    if (installed) return t.skip(`npm ci --offline could not install: ${installed.split("\n")[0]}`);
    const url = `unix://${join(tmpdir(), `transport-package-${randomBytes(5).toString("hex")}.sock`)}`;
    const result = run(process.execPath, ["main.js", url], project, 60_000);
    assert.equal(result.status, 0, result.out);
    assert.deepEqual(JSON.parse(result.out.trim()), [
      [5, 1],
      [7, 1],
    ]);
  });

  test("its bin serves a user's module: transport-serve-node URL --env ./env.js:CountingEnv --schema pac.json", (t) => {
    if (installed) return t.skip("not installed");
    // the schema as a compiled IR read at run time (no build step): pac_env's, dumped as JSON
    writeFileSync(join(project, "pac.json"), JSON.stringify(pac_env.IR));
    const url = `unix://${join(tmpdir(), `transport-package-${randomBytes(5).toString("hex")}.sock`)}`;
    const script =
      `const { spawn } = require("child_process");` +
      `const p = spawn("node_modules/.bin/transport-serve-node", [${JSON.stringify(url)}, "--env", "./env.js:CountingEnv", "--schema", "pac.json"]);` +
      `p.stdout.once("data", async (d) => { const { connect } = require("@transport/node-bridge");` +
      ` const c = await connect(String(d).trim().slice(6)); await c.reset(); const r = await c.step(9);` +
      ` console.log(r.observation[0], c.serverInfo.env); await c.close(); p.kill("SIGTERM"); });` +
      `p.stderr.on("data", (d) => process.stderr.write(d));`;
    const result = run(process.execPath, ["-e", script], project, 60_000);
    assert.equal(result.status, 0, result.out);
    assert.equal(result.out.trim(), "9 CountingEnv");
  });

  test("a TypeScript user file type-checks against the package's exports", (t) => {
    if (installed) return t.skip("not installed");
    const tsc = join(BRIDGE, "node_modules", "typescript", "bin", "tsc");
    const result = run(
      process.execPath,
      [tsc, "--noEmit", "--strict", "--module", "node16", "--moduleResolution", "node16", "--target", "ES2022", "--skipLibCheck",
        "--typeRoots", join(BRIDGE, "node_modules", "@types"), "--types", "node", "user.ts"],
      project,
    );
    assert.equal(result.status, 0, result.out);
  });
});
