/**
 * Server processes for tests: the Node CLI (`dist/cli/serve.js`), the Python CLI (`python -m
 * transport.tools.serve_cli --lang python`), or `serve()` of a factory exported by a module (any
 * schema). Each resolves once the server printed `ready URL`.
 */

import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";

export const ROOT = resolve(__dirname, "..", "..", "..");
const SERVE_JS = resolve(__dirname, "..", "cli", "serve.js");
const INDEX_JS = resolve(__dirname, "..", "index.js");
export const PYTHON =
  process.env.PYTHON ?? (existsSync(join(ROOT, ".venv/bin/python")) ? join(ROOT, ".venv/bin/python") : "python3");
/** Python can run the project's server (`pip install -e .` done). */
export const HAVE_PYTHON = spawnSync(PYTHON, ["-c", "import transport.tools.serve_cli"], { cwd: ROOT }).status === 0;

/** `serve(require(module)[factory], url, { numEnvs, schema: require(schemaModule).SCHEMA })`. */
export interface ModuleServer {
  readonly module: string;
  readonly factory: string;
  readonly numEnvs?: number;
  /** A generated schema module (default: pac_env). */
  readonly schemaModule?: string;
}

export class ServerProcess {
  readonly proc: ChildProcessWithoutNullStreams;
  url = "";

  private constructor(command: string, args: string[]) {
    this.proc = spawn(command, args, { cwd: ROOT, stdio: ["pipe", "pipe", "pipe"] });
  }

  /** The Node CLI, the Python CLI, or a module's factory, serving `url`. */
  static async start(what: "node" | "python" | ModuleServer, url: string, ...args: string[]): Promise<ServerProcess> {
    let server: ServerProcess;
    if (what === "node") server = new ServerProcess(process.execPath, [SERVE_JS, url, ...args]);
    else if (what === "python") server = new ServerProcess(PYTHON, ["-m", "transport.tools.serve_cli", url, "--lang", "python", ...args]);
    else {
      const schema = what.schemaModule === undefined ? "" : `, schema: require(${JSON.stringify(what.schemaModule)}).SCHEMA`;
      const script =
        `require(${JSON.stringify(INDEX_JS)}).serve(require(${JSON.stringify(what.module)})[${JSON.stringify(what.factory)}], ` +
        `${JSON.stringify(url)}, { numEnvs: ${what.numEnvs ?? 1}${schema} })` +
        ".then((s) => { process.stdout.write('ready ' + s.url + '\\n'); }, (e) => { process.stdout.write('error ' + e.message + '\\n'); });";
      server = new ServerProcess(process.execPath, ["-e", script]);
    }
    server.url = await new Promise<string>((ok, fail) => {
      let out = "";
      let err = "";
      const timer = setTimeout(() => fail(new Error(`no ready line in 20 s: ${err}`)), 20_000);
      server.proc.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
      server.proc.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        if (!out.includes("\n")) return;
        clearTimeout(timer);
        const line = out.split("\n")[0] as string;
        if (line.startsWith("ready ")) ok(line.slice(6).trim());
        else fail(new Error(`server failed to start: ${line} ${err}`));
      });
      server.proc.once("exit", (code) => {
        clearTimeout(timer);
        fail(new Error(`server exited with ${code}: ${err}`));
      });
    });
    return server;
  }

  /** Signal the server and wait until it exited. */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise<void>((ok) => this.proc.once("exit", () => ok()));
    this.proc.kill(signal);
    await exited;
  }
}
