/**
 * Issue 22 item 7, issue 26 item 4: the Node server CLI (`dist/cli/serve.js`, the bin
 * transport-serve-node that `transport-serve --lang node` runs) refuses bad input in one line
 * (no "Require stack", no stack trace, no usage block) and exits 2; it reads a `--schema
 * FILE.toml` (compiled by transport-schema); and the URL parsers refuse repeated parameters, a
 * unix URL's parameters and a bad `heartbeat=`. Real processes, a real FIFO.
 */

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { parseUrl as parseHttpUrl } from "../backends/http/wire";
import { socketPath } from "../backends/unix";
import { heartbeatMs, parseUrl as parseZmqUrl } from "../backends/zmq/wire";
import { ConnectError, SchemaError } from "../errors";
import { connect } from "../index";
import { checkSchemaFile, loadSchemaFile } from "../schema_file";
import { ROOT } from "../testing/servers";

const SERVE = join(__dirname, "..", "cli", "serve.js");
const SCHEMA_CLI = join(ROOT, ".venv", "bin", "transport-schema");
const HAVE_SCHEMA_CLI = existsSync(SCHEMA_CLI);
const place = mkdtempSync(join(tmpdir(), "transport-cli-refusals-"));
after(() => rmSync(place, { recursive: true, force: true }));

const fifo = join(place, "fifo.toml");
spawnSync("mkfifo", [fifo]);
mkdirSync(join(place, "folder.toml"));
writeFileSync(join(place, "noenv.toml"), '[schema]\nname = "noenv"\nversion = 1\n\n[structs.Thing]\nfields = [{ name = "x", type = "u8" }]\n');
writeFileSync(join(place, "grid.toml"), spawnSync("cat", [join(ROOT, "schema", "tetris.toml")]).stdout);

const url = (): string => `unix://${join(tmpdir(), `transport-cli-refusals-${process.pid}-${Math.random().toString(16).slice(2)}.sock`)}`;

/** Run the CLI with `args`; a hang fails on the timeout. */
function serve(args: string[], env: NodeJS.ProcessEnv = {}): { status: number | null; line: string; stdout: string } {
  const done = spawnSync(process.execPath, [SERVE, ...args], {
    cwd: place,
    encoding: "utf8",
    timeout: 60_000,
    env: { ...process.env, TRANSPORT_SCHEMA_CLI: SCHEMA_CLI, ...env },
  });
  const lines = done.stderr.split("\n").filter((l) => l !== "");
  assert.equal(lines.length, 1, done.stderr);
  assert.ok(!done.stderr.includes("Require stack") && !/\n\s+at /.test(done.stderr), done.stderr);
  assert.ok(!done.stdout.startsWith("ready"), done.stdout);
  return { status: done.status, line: lines[0] as string, stdout: done.stdout };
}

describe("transport-serve-node refuses bad input in one line, exit 2", () => {
  const rows: [string[], string][] = [
    [["--bogus"], "transport-serve: error: unrecognized arguments: --bogus (see transport-serve --help)"],
    [["--env"], "transport-serve: error: argument --env: expected one argument (see transport-serve --help)"],
    [["--env", "os:system"], 'transport-serve: error: --env "os:system": cannot load os: Cannot find module'],
    [["--schema", "missing.toml", "--env", "contract"], "transport-serve: error: missing.toml: cannot read schema: No such file or directory"],
    [["--schema", "folder.toml", "--env", "contract"], "transport-serve: error: folder.toml: cannot read schema: not a regular file (a directory)"],
    [["--schema", "fifo.toml", "--env", "contract"], "transport-serve: error: fifo.toml: cannot read schema: not a regular file (a FIFO)"],
    [["--schema", "/dev/zero", "--env", "contract"], "transport-serve: error: /dev/zero: cannot read schema: not a regular file (a device)"],
    [
      ["--env", "echo", "--schema", "schema/tetris.toml"],
      "transport-serve: error: --env echo speaks schema pac_env (7f1be4e3b718a454), not tetris (c39db8b06055a524) of --schema schema/tetris.toml",
    ],
  ];
  for (const [args, prefix] of rows) {
    test(args.join(" "), () => {
      const done = serve([url(), ...args]);
      assert.equal(done.status, 2, done.line);
      assert.ok(done.line.startsWith(prefix), `${done.line}\n  does not start with\n${prefix}`);
    });
  }

  test("a module without the factory: one line naming it", () => {
    writeFileSync(join(place, "plain.js"), "exports.other = 1;\n");
    const done = serve([url(), "--env", "./plain.js:Factory"]);
    assert.equal(done.status, 2);
    assert.ok(done.line.startsWith('transport-serve: error: --env "./plain.js:Factory": ./plain.js has no callable Factory'), done.line);
  });

  test("a schema without an [env] table", { skip: !HAVE_SCHEMA_CLI && "no .venv/bin/transport-schema" }, () => {
    const done = serve([url(), "--env", "contract", "--schema", "noenv.toml"]);
    assert.equal(done.status, 2);
    assert.ok(done.line.startsWith("transport-serve: error: noenv.toml: schema noenv has no [env] table"), done.line);
  });

  test("no transport-schema to compile a .toml: one line saying what to do", () => {
    const done = serve([url(), "--env", "contract", "--schema", "grid.toml"], { TRANSPORT_SCHEMA_CLI: join(place, "no-such-tool") });
    assert.equal(done.status, 2);
    assert.match(done.line, /grid\.toml: cannot compile a \.toml schema: .* is not on PATH/);
  });
});

describe("transport-serve-node --schema FILE.toml (the --help example)", () => {
  test("serves a TOML schema compiled by transport-schema, in workers too", { skip: !HAVE_SCHEMA_CLI && "no .venv/bin/transport-schema" }, async () => {
    const address = url();
    const child = spawn(process.execPath, [SERVE, address, "--env", "contract", "--schema", "grid.toml", "--workers", "2"], {
      cwd: place,
      env: { ...process.env, TRANSPORT_SCHEMA_CLI: SCHEMA_CLI },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const line = await new Promise<string>((resolve) => {
      let out = "";
      child.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes("\n")) resolve(out.split("\n")[0] as string);
      });
      child.on("exit", () => resolve(out));
    });
    assert.equal(line, `ready ${address}`, stderr);
    const client = await connect(address);
    try {
      assert.equal(client.schema.name, "tetris");
      await client.reset(1n);
    } finally {
      await client.close();
    }
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    assert.equal(await exited, 0);
    assert.ok(!existsSync(address.slice("unix://".length)));
  });
});

describe("schema files", () => {
  test("checkSchemaFile refuses what it must not read", () => {
    for (const [path, why] of [
      [fifo, "(a FIFO)"],
      ["/dev/zero", "(a device)"],
      [join(place, "folder.toml"), "(a directory)"],
    ] as const) {
      assert.throws(() => checkSchemaFile(path), (e: unknown) => e instanceof SchemaError && e.message.endsWith(why));
      assert.throws(() => loadSchemaFile(path.endsWith(".toml") ? path : `${path}`), SchemaError);
    }
  });
});

describe("URL parameters", () => {
  test("zmq: heartbeat must be 0 or 0.001..86400 seconds; no parameter twice", () => {
    for (const bad of ["-1", "nan", "Infinity", "86401", "0.0001"]) {
      assert.throws(() => parseZmqUrl(`zmq+ipc:///tmp/x.zmq?heartbeat=${bad}`), ConnectError, bad);
    }
    assert.throws(() => parseZmqUrl("zmq+ipc:///tmp/x.zmq?heartbeat=1&heartbeat=0"), /"heartbeat" is given more than once/);
    assert.equal(heartbeatMs(parseZmqUrl("zmq+ipc:///tmp/x.zmq?heartbeat=0")), 0);
    assert.equal(heartbeatMs(parseZmqUrl("zmq+ipc:///tmp/x.zmq?heartbeat=2.5")), 2500);
  });

  test("unix: no parameters (they would become part of the file name)", () => {
    assert.throws(() => socketPath("unix:///tmp/x.sock?foo=1"), /unknown parameter\(s\) foo \(unix:\/\/ URLs take none\)/);
    assert.throws(() => socketPath("unix:///tmp/x.sock?"), ConnectError);
    assert.equal(socketPath("unix:///tmp/x.sock"), "/tmp/x.sock");
  });

  test("http: no parameter twice", () => {
    assert.throws(() => parseHttpUrl("http://127.0.0.1:0?allow_remote=1&allow_remote=0", true), /"allow_remote" is given more than once/);
  });
});
