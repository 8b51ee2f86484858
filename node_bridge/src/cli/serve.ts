#!/usr/bin/env node
/**
 * The Node env server behind `transport-serve URL --lang node` (transport/tools/serve_cli.py
 * execs `node node_bridge/dist/cli/serve.js URL --env NAME --num-envs N [--seed S]
 * [--max-body B]`). Prints exactly `ready <url>` on stdout once clients can connect; on SIGINT
 * or SIGTERM closes (removing the socket file or the shm:// segment) and exits 0; on a start
 * failure prints one line `transport-serve: error: <message>` on stderr (never a stack) and
 * exits 1, or 2 for bad arguments, a schema file that cannot be read, an --env that cannot be
 * loaded and a reference env given another schema (the words of the Python CLI).
 */

import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { ShmLayout, checkRoom, parseShmUrl } from "../backends/shm/region";
import { onShmServerStopped } from "../backends/shm/server";
import { ENV_SCHEMAS, ENVS, VECTOR_ENVS } from "../envs";
import * as pac_env from "../generated/pac_env";
import type { EnvFactory, EnvOrFactory } from "../runtime/env";
import { MASKED_ACTION_POLICIES, type MaskedActions } from "../runtime/core";
import type { WorkerEnvSpec } from "../runtime/pool";
import { ContractEnv } from "../envs/contract";
import { SCHEMAS } from "../generated";
import type { SchemaModule } from "../codec";
import { SchemaError } from "../errors";
import { loadSchemaFile } from "../schema_file";
import { DEFAULT_MAX_BODY } from "../protocol";
import { MAX_BODY_LIMIT, MAX_NUM_ENVS, type Server, checkServerLimits, serve } from "../server";
import type { ServerLimits } from "../stream";

/** Whether `name` is a reference env (a one-env factory of ENVS or a vector env class of VECTOR_ENVS). */
function isReference(name: string): boolean {
  return Object.prototype.hasOwnProperty.call(ENVS, name) || Object.prototype.hasOwnProperty.call(VECTOR_ENVS, name);
}

/** Every reference env name, sorted. */
const REFERENCE_NAMES = [...Object.keys(ENVS), ...Object.keys(VECTOR_ENVS)].sort();

const USAGE = `usage: serve.js URL [--env NAME] [--num-envs N] [--seed S] [--max-body B]
                [--max-connections C] [--idle-timeout SECONDS] [--read-timeout SECONDS]

Serve a reference env (Node implementation) until SIGINT or SIGTERM. Prints one line
"ready URL" on stdout once clients can connect (with http://127.0.0.1:0 the URL carries the
port that was bound).

  URL            unix:///path.sock, http://127.0.0.1:PORT (?allow_remote=1 for other hosts)
                 zmq+ipc:///path, zmq+tcp://127.0.0.1:PORT (docs/zmq.md: CURVE, allow_insecure)
                 or shm://name?num_envs=N (region /dev/shm/transport-name; docs/shm.md)
  --env NAME     a reference env (default echo):
                 ${REFERENCE_NAMES.join(", ")}
                 (vector-echo: one vector env stepping all --num-envs envs in one call),
                 contract
                 (the backend contract suite's env: any --schema), or MODULE:FACTORY, a JS
                 module (path) exporting an env factory or class
  --schema S     the schema the env speaks (default pac_env): a built-in schema by name
                 (${Object.keys(SCHEMAS).sort().join(", ")}; schema/NAME.toml names it too), a
                 schema file (.toml, compiled by transport-schema on PATH or
                 TRANSPORT_SCHEMA_CLI), a compiled IR (.json, transport-schema inspect --json)
                 or a generated module exporting SCHEMA; a reference env serves only its own
                 schema (--env contract serves any)
  --num-envs N   envs per connection (default 1, or the shm:// URL's num_envs)
  --seed S       seed of each connection's first unseeded reset (env i: S + i)
  --max-body B   largest request body accepted, in bytes (default 64 MiB)
  --workers K    step each connection's envs in K worker threads (default 0: in-process)
  --max-connections C    unix/http: clients served at once (default 1024); one more gets a
                 "server busy" ERROR (http: 503) and is closed
  --idle-timeout S       unix/http: seconds a connection may be idle between requests (default 600)
  --read-timeout S       unix/http: seconds a started request has to arrive completely, and a
                 response to be taken (default 30)
  --masked-actions P
                 an action the env's mask forbids: reject (MASKED_ACTION, default), pass (the
                 env steps with it) or noop (no step; reward env.maskedActionPenalty, default 0)

Exit status: 0 after a signal, 1 when the server cannot start, 2 for bad arguments or limits
(--num-envs 1..65536, --max-body 1..4294967295 and large enough for the schema's requests; a
step response for every env must fit in max(--max-body, 64 MiB): the rules of the Python CLI),
a schema that cannot be read or has no [env] table, an --env that cannot be loaded, or a
reference env given a schema other than its own.
`;

interface Args {
  url: string;
  env: string;
  schema: string | null;
  numEnvs: number;
  seed: bigint | null;
  maxBody: number | undefined;
  numEnvsGiven: boolean;
  workers: number;
  limits: Partial<ServerLimits>;
  maskedActions: MaskedActions;
}

class UsageError extends Error {}

function parseArgs(argv: readonly string[]): Args | null {
  let url: string | undefined;
  let env = "echo";
  let schema: string | null = null;
  let numEnvs: number | null = null;
  let seed: bigint | null = null;
  let maxBody: number | undefined;
  let workers = 0;
  const limits: { -readonly [K in keyof ServerLimits]?: number } = {};
  const positive = (text: string, name: string, integral: boolean): number => {
    const number = /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/.test(text) ? Number(text) : Number.NaN;
    if (!Number.isFinite(number) || number <= 0 || (integral && !Number.isInteger(number))) {
      const what = integral ? "a positive integer" : "a positive number of seconds";
      throw new UsageError(`${name} must be ${what}, not ${JSON.stringify(text)}`);
    }
    return number;
  };
  let maskedActions: MaskedActions = "reject";
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === "-h" || arg === "--help") return null;
    const [flag, inline] = arg.startsWith("--") && arg.includes("=") ? arg.split(/=(.*)/s, 2) : [arg, undefined];
    const value = (): string => {
      const v = inline ?? argv[++i];
      if (v === undefined) throw new UsageError(`argument ${flag}: expected one argument`);
      return v;
    };
    const integer = (text: string, name: string): number => {
      if (!/^[0-9]+$/.test(text)) throw new UsageError(`${name} must be a non-negative integer, got ${JSON.stringify(text)}`);
      return Number(text);
    };
    // --num-envs and --max-body: any integer parses, then the range rule and text of Python's CLI
    const ranged = (text: string, name: string, max: number, unit: string): number => {
      if (!/^[+-]?[0-9]+$/.test(text)) throw new UsageError(`argument ${name}: invalid int value: '${text}'`);
      const number = Number(text);
      if (number < 1 || number > max) throw new UsageError(`${name} must be 1..${max}${unit}, not ${BigInt(text)}`);
      return number;
    };
    switch (flag) {
      case "--env":
        env = value();
        if (!isReference(env) && env !== "contract" && !env.includes(":")) {
          throw new UsageError(
            `unknown env ${JSON.stringify(env)} (choose from ${REFERENCE_NAMES.join(", ")}, contract, or MODULE:FACTORY)`,
          );
        }
        break;
      case "--schema":
        schema = value();
        break;
      case "--num-envs":
        numEnvs = ranged(value(), "--num-envs", MAX_NUM_ENVS, "");
        break;
      case "--seed": {
        const text = value();
        if (!/^-?[0-9]+$/.test(text)) throw new UsageError(`--seed must be an integer, got ${JSON.stringify(text)}`);
        seed = BigInt(text);
        break;
      }
      case "--max-body":
        maxBody = ranged(value(), "--max-body", MAX_BODY_LIMIT, " bytes");
        break;
      case "--workers":
        workers = integer(value(), "--workers");
        break;
      case "--max-connections":
        limits.maxConnections = positive(value(), "--max-connections", true);
        break;
      case "--idle-timeout":
        limits.idleTimeoutMs = positive(value(), "--idle-timeout", false) * 1000;
        break;
      case "--read-timeout":
        limits.readTimeoutMs = positive(value(), "--read-timeout", false) * 1000;
        break;
      case "--masked-actions": {
        const text = value();
        const found = MASKED_ACTION_POLICIES.find((p) => p === text);
        if (found === undefined) {
          throw new UsageError(`--masked-actions must be one of ${MASKED_ACTION_POLICIES.join(", ")}, got ${JSON.stringify(text)}`);
        }
        maskedActions = found;
        break;
      }
      default:
        // argparse's words, as the Python CLI says them
        if (arg.startsWith("-") || url !== undefined) throw new UsageError(`unrecognized arguments: ${arg}`);
        url = arg;
    }
  }
  if (url === undefined) throw new UsageError("the URL is required");
  return { url, env, schema, numEnvs: numEnvs ?? 1, seed, maxBody, numEnvsGiven: numEnvs !== null, workers, limits, maskedActions };
}

/** A start-up refusal of the command line's content (exit 2, like a usage error). */
class StartError extends Error {}

/** The first line of an error's message: Node's "Require stack" and stacks stay out. */
function firstLine(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split("\n", 1)[0] as string;
}

/** A reference env by name, or `MODULE:FACTORY` (a user's JS module, resolved from the cwd). */
function loadEnv(spec: string): { factory: EnvOrFactory; envName: string; workerEnv: WorkerEnvSpec | null } {
  const known = ENVS[spec];
  if (known !== undefined && Object.prototype.hasOwnProperty.call(ENVS, spec)) {
    return { factory: known as EnvFactory<unknown>, envName: spec, workerEnv: null };
  }
  const vector = VECTOR_ENVS[spec];
  if (vector !== undefined && Object.prototype.hasOwnProperty.call(VECTOR_ENVS, spec)) {
    return { factory: vector, envName: spec, workerEnv: null }; // new C(--num-envs) per client
  }
  const cut = spec.lastIndexOf(":");
  const modulePath = spec.slice(0, cut);
  const exportName = spec.slice(cut + 1);
  if (!modulePath || !exportName) throw new StartError(`--env ${JSON.stringify(spec)}: expected path/to/module.js:Factory`);
  const module = resolve(modulePath);
  let exports: Record<string, unknown>;
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    exports = require(module) as Record<string, unknown>;
  } catch (error) {
    throw new StartError(`--env ${JSON.stringify(spec)}: cannot load ${modulePath}: ${firstLine(error)}`);
  }
  const factory = exports?.[exportName];
  if (typeof factory !== "function") {
    throw new StartError(
      `--env ${JSON.stringify(spec)}: ${modulePath} has no callable ${exportName} (a class or a zero-argument function that returns an env)`,
    );
  }
  return { factory: factory as EnvFactory<unknown>, envName: exportName, workerEnv: { module, exportName } };
}

/**
 * Where `--schema` points: a built-in schema by name (or a path whose file name names one, as
 * the Python CLI passes schema/NAME.toml) is its generated module; anything else is a path to an
 * IR (.json) or a generated module. Worker threads load the same path.
 */
function schemaLocation(spec: string): string {
  const name = basename(spec).replace(/\.(toml|js)$/, "");
  if (!spec.endsWith(".json") && Object.prototype.hasOwnProperty.call(SCHEMAS, name)) {
    return join(__dirname, "..", "generated", name);
  }
  return resolve(spec);
}

/**
 * The schema `--schema` names and the path worker threads load it from: a `.toml` file is
 * compiled by `transport-schema` (loadSchemaFile) and, when there are `workers`, its IR written
 * to a private temporary file for them (removed at exit). Every failure is a one-line
 * `SchemaError`.
 */
function loadSchemaSpec(spec: string, workers: number): { schema: SchemaModule; path: string } {
  const location = schemaLocation(spec);
  if (location.startsWith(join(__dirname, "..", "generated"))) {
    return { schema: loadSchemaFile(location), path: location };
  }
  if (spec.endsWith(".toml")) {
    const schema = loadSchemaFile(spec);
    if (workers === 0) return { schema, path: location }; // only worker threads load the path
    const dir = mkdtempSync(join(tmpdir(), "transport-serve-schema-"));
    process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
    const path = join(dir, `${schema.name}.json`);
    writeFileSync(path, JSON.stringify(schema.ir), { mode: 0o600 });
    return { schema, path };
  }
  try {
    return { schema: loadSchemaFile(spec), path: location };
  } catch (error) {
    if (error instanceof SchemaError) throw error;
    throw new SchemaError(`${spec}: cannot load schema: ${firstLine(error)}`);
  }
}

/** The refusal of a reference env given another schema: the Python CLI's words. */
function checkOwnSchema(env: string, given: SchemaModule, file: string): void {
  if (!isReference(env)) return;
  const own = SCHEMAS[ENV_SCHEMAS[env] ?? "pac_env"];
  if (own === undefined || own.fingerprint === given.fingerprint) return;
  throw new StartError(
    `--env ${env} speaks schema ${own.name} (${own.fingerprintHex}), not ${given.name} (${given.fingerprintHex}) ` +
      `of --schema ${file}: every step would fail; serve any schema with --env contract, or your env with --env module:Factory`,
  );
}

async function main(argv: readonly string[]): Promise<number> {
  let args: Args | null;
  try {
    args = parseArgs(argv);
  } catch (error) {
    process.stderr.write(`transport-serve: error: ${(error as Error).message} (see transport-serve --help)\n`);
    return 2;
  }
  if (args === null) {
    process.stdout.write(USAGE);
    return 0;
  }
  let server: Server;
  try {
    // the order of the Python CLI: a user's module is imported before its schema is read
    const userEnv = args.env !== "contract" && !isReference(args.env) ? loadEnv(args.env) : null;
    const schemaName = args.schema ?? ENV_SCHEMAS[args.env] ?? null; // a reference env's own schema
    const loaded = schemaName === null ? null : loadSchemaSpec(schemaName, args.workers);
    const schemaPath = loaded === null ? null : loaded.path;
    const schema = loaded === null ? pac_env.SCHEMA : loaded.schema;
    if (args.schema !== null && args.env !== "contract") checkOwnSchema(args.env, schema, args.schema);
    if (schema.ir.env === undefined || schema.ir.env === null) {
      const where = args.schema !== null ? `${args.schema}: ` : "";
      throw new SchemaError(
        `${where}schema ${schema.name} has no [env] table: a served schema names its result and request structs there (docs/schema.md)`,
      );
    }
    const { factory, envName, workerEnv } =
      args.env === "contract"
        ? {
            factory: () => new ContractEnv(schema),
            envName: "contract",
            workerEnv: { module: join(__dirname, "..", "envs", "contract_worker.js"), exportName: "contract" },
          }
        : (userEnv ?? loadEnv(args.env));
    if (args.url.toLowerCase().startsWith("shm://")) {
      // before any env is made: the URL's num_envs, and room in /dev/shm for that many slots
      const shm = parseShmUrl(args.url);
      if (!args.numEnvsGiven && shm.numEnvs !== null) args.numEnvs = shm.numEnvs;
      checkRoom(shm, ShmLayout.of(schema), args.numEnvs);
    }
    try {
      checkServerLimits(schema, args.url, args.numEnvs, args.maxBody ?? DEFAULT_MAX_BODY);
    } catch (error) {
      if (!(error instanceof RangeError)) throw error;
      // a limit with which every client would be refused: exit 2 before anything is created
      process.stderr.write(`transport-serve: error: ${error.message}\n`);
      return 2;
    }
    server = await serve(factory, args.url, {
      numEnvs: args.numEnvs,
      envName,
      schema,
      ...(workerEnv !== null || schemaPath !== null
        ? { workerEnv: { ...(workerEnv ?? {}), ...(schemaPath !== null ? { schemaModule: schemaPath } : {}) } }
        : {}),
      seed: args.seed,
      ...(args.maxBody !== undefined ? { maxBody: args.maxBody } : {}),
      ...(args.workers ? { workers: args.workers } : {}),
      limits: args.limits,
      maskedActions: args.maskedActions,
    });
  } catch (error) {
    // the command line names something unusable: a usage error (2), as in the Python CLI
    const refused = error instanceof StartError || error instanceof SchemaError;
    const message = refused ? firstLine(error) : String((error as Error).message).replace(/\nRequire stack:[\s\S]*$/, "");
    process.stderr.write(`transport-serve: error: ${message}\n`);
    return refused ? 2 : 1;
  }
  return new Promise<number>((resolve) => {
    let stopping = false;
    const stop = (): void => {
      if (stopping) return;
      stopping = true;
      const force = setTimeout(() => resolve(0), 5000);
      force.unref();
      server.close().then(
        () => resolve(0),
        (error: unknown) => {
          process.stderr.write(`transport-serve: error while closing: ${String(error)}\n`);
          resolve(1);
        },
      );
    };
    process.on("SIGINT", stop);
    process.on("SIGTERM", stop);
    // an shm:// server whose region another process changed stops on its own: exit 1, saying why
    onShmServerStopped((reason) => {
      process.stderr.write(`transport-serve: error: ${reason}\n`);
      resolve(1);
    });
    process.stdout.write(`ready ${server.url}\n`);
  });
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
    // flush stdout/stderr, then leave even if a client still holds a socket open
    setImmediate(() => process.exit(code));
  },
  (error: unknown) => {
    process.stderr.write(`transport-serve: error: ${String(error)}\n`);
    process.exit(1);
  },
);
