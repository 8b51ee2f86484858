#!/usr/bin/env node
/**
 * The Node env server: the package's bin `transport-serve-node` (bin/transport-serve-node.js
 * requires this file), and what `transport-serve URL --lang node` runs
 * (transport/tools/serve_cli.py execs `node node_bridge/dist/cli/serve.js URL --env NAME
 * --num-envs N [--schema S] ...`). Prints exactly `ready <url>` on stdout once clients can
 * connect; on SIGINT or SIGTERM closes (removing the socket file or the shm:// segment) and
 * exits 0; on a start failure prints one line `PROG: error: <message>` on stderr (never a
 * stack), PROG the command that was run (`transport-serve-node` through the bin, else
 * `transport-serve`), and exits 1 when the server cannot bind (a bad URL, an address in use, no
 * room in /dev/shm), or 2 for bad arguments, a schema file that cannot be read, an --env that
 * cannot be loaded, a factory that throws when the first env is made, an env whose results do
 * not fit the schema it gets by default, and a reference env given another schema (the rules and
 * words of the Python CLI).
 */

import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
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

/** `names`, comma-separated, in lines of at most `width` characters indented by `indent`. */
function wrapped(names: readonly string[], indent: number, width: number): string {
  const lines: string[] = [];
  let line = "";
  for (const [i, name] of names.entries()) {
    const word = i < names.length - 1 ? `${name},` : name;
    if (line !== "" && indent + line.length + 1 + word.length > width) {
      lines.push(line);
      line = word;
    } else {
      line = line === "" ? word : `${line} ${word}`;
    }
  }
  if (line !== "") lines.push(line);
  return lines.map((l) => " ".repeat(indent) + l).join("\n");
}

/**
 * Run through the package's bin (`transport-serve-node`, whose file requires this one), or
 * directly (`node dist/cli/serve.js`: what `transport-serve --lang node` execs, whose help and
 * usage errors are the Python CLI's).
 */
const VIA_BIN =
  require.main !== undefined && require.main !== module && basename(require.main.filename).startsWith("transport-serve-node");
/** The command the messages name: `PROG: error: ... (see PROG --help)`. */
const PROG = VIA_BIN ? "transport-serve-node" : "transport-serve";
/** How the usage line starts. */
const SYNOPSIS = VIA_BIN ? "transport-serve-node URL" : "transport-serve URL --lang node";
const INDENT = " ".repeat(`usage: ${SYNOPSIS} `.length);

const USAGE = `usage: ${SYNOPSIS} [--env NAME | --env MODULE:FACTORY] [--schema S]
${INDENT}[--num-envs N] [--workers K] [--step-timeout S] [--seed S] [--max-body B]
${INDENT}[--masked-actions reject|pass|noop] [--max-connections C]
${INDENT}[--idle-timeout SECONDS] [--read-timeout SECONDS]

Serve a reference env, or your own env from a JS module, with the Node server until SIGINT or
SIGTERM. Prints one line "ready URL" on stdout once clients can connect (with
http://127.0.0.1:0 the URL carries the port that was bound).

  ${SYNOPSIS.replace(" URL", ' "unix:///tmp/g.sock"')} --env ./dist/grid.js:GridWorld --schema grid.toml
                 (./dist/grid.js from the current directory; grid.toml compiled by transport-schema)

  URL            unix:///path.sock, http://127.0.0.1:PORT (?allow_remote=1 for other hosts)
                 zmq+ipc:///path, zmq+tcp://127.0.0.1:PORT (docs/zmq.md: CURVE, allow_insecure)
                 or shm://name?num_envs=N (region /dev/shm/transport-name; docs/shm.md)
  --env NAME     a reference env (default echo):
${wrapped(REFERENCE_NAMES, 17, 94)}
                 (vector-echo: one vector env stepping all --num-envs envs in one call),
                 contract
                 (the backend contract suite's env: any --schema), or MODULE:FACTORY: a JS
                 module's path, resolved from the current directory (./dist/my_env.js), and
                 its export FACTORY, an env class or a zero-argument function that returns an
                 env (or a vector env class: new FACTORY(--num-envs))
  --schema S     the schema the env speaks: a built-in schema by name
${wrapped(Object.keys(SCHEMAS).sort(), 17, 94)}
                 (schema/NAME.toml names one too), a schema file (.toml, compiled by
                 transport-schema on PATH or TRANSPORT_SCHEMA_CLI), a compiled IR (.json,
                 transport-schema inspect --json) or a generated module exporting SCHEMA; a
                 reference env serves only its own schema (--env contract serves any).
                 Without --schema: a reference env's own schema (pac_env for contract); for
                 MODULE:FACTORY the SCHEMA that FACTORY, else the module, exports
                 (loadSchemaFile(...) or a generated module's SCHEMA), else pac_env, tried on
                 the first env's reset at start: results that do not fit it are refused (exit 2)
  --num-envs N   envs per connection, 1..65536 (default 1, or the shm:// URL's num_envs;
                 another number than the URL's is refused, except 1, which yields to the URL)
  --seed S       seed of each connection's first unseeded reset (env i: S + i); a u64, so
                 0..2**64 - N with N envs
  --max-body B   largest request body accepted, in bytes (default 64 MiB)
  --workers K    step each connection's envs in K worker threads (default 0: in-process;
                 each thread loads MODULE itself)
  --step-timeout S       workers: seconds one worker may take over a lock-step request before
                 it counts as stuck: it is replaced and its envs fail (ENV_ERROR) (default 60)
  --max-connections C    unix/http: clients served at once (default 1024); one more gets a
                 "server busy" ERROR (http: 503) and is closed
  --idle-timeout S       unix/http: seconds a connection may be idle between requests; zmq: a
                 session (default 600)
  --read-timeout S       unix/http: seconds a started request has to arrive completely, and a
                 response to be taken (default 30)
  --masked-actions P
                 an action the env's mask forbids: reject (MASKED_ACTION, default), pass (the
                 env steps with it) or noop (no step; reward env.maskedActionPenalty, default 0)

Exit status (those of the Python CLI, transport-serve): 0 after a signal; 1 when the server
cannot start while it binds (a bad URL: an unknown scheme, a bad shm:// name or parameter; a
live server on the socket or shm name; no room in /dev/shm; a CURVE key that is missing,
malformed or readable by others) or stops serving on its own; 2 for
bad arguments or limits (--num-envs 1..65536, --max-body 1..4294967295 and large enough for
the schema's requests; a step response for every env must fit in max(--max-body, 64 MiB)), a
schema that cannot be read or has no [env] table, an --env that cannot be loaded, a factory
that throws when the first env is made ("cannot serve these envs: making one failed: ..."), an
env whose results do not fit the default schema, or a reference env given a schema other than
its own.
`;

interface Args {
  url: string;
  env: string;
  schema: string | null;
  numEnvs: number;
  seed: bigint | null;
  maxBody: number | undefined;
  workers: number;
  stepTimeoutMs: number | undefined;
  limits: Partial<ServerLimits>;
  maskedActions: MaskedActions;
}

class UsageError extends Error {}

/** 2**64: a seed is a u64 on the wire, and env i of N gets seed + i, so seed + N - 1 < 2**64. */
const SEED_LIMIT = 1n << 64n;

function parseArgs(argv: readonly string[]): Args | null {
  let url: string | undefined;
  let env = "echo";
  let schema: string | null = null;
  let numEnvsText: string | null = null;
  let seed: bigint | null = null;
  let maxBody: number | undefined;
  let workers = 0;
  let stepTimeoutMs: number | undefined;
  const limits: { -readonly [K in keyof ServerLimits]?: number } = {};
  const positive = (text: string, name: string, integral: boolean): number => {
    const number = /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/.test(text) ? Number(text) : Number.NaN;
    if (!Number.isFinite(number) || number <= 0 || (integral && !Number.isInteger(number))) {
      const what = integral ? "a positive integer" : "a positive number of seconds";
      throw new UsageError(`${name} must be ${what}, not ${JSON.stringify(text)}`);
    }
    return number;
  };
  // --num-envs and --max-body: any integer parses, then the range rule and text of Python's CLI
  const ranged = (text: string, name: string, max: number, unit: string): number => {
    if (!/^[+-]?[0-9]+$/.test(text)) throw new UsageError(`argument ${name}: invalid int value: '${text}'`);
    const number = Number(text);
    if (number < 1 || number > max) throw new UsageError(`${name} must be 1..${max}${unit}, not ${BigInt(text)}`);
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
      case "--num-envs": {
        const text = value(); // an integer now (argparse's type=int); its range below, as in Python
        if (!/^[+-]?[0-9]+$/.test(text)) throw new UsageError(`argument --num-envs: invalid int value: '${text}'`);
        numEnvsText = text;
        break;
      }
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
      case "--step-timeout":
        stepTimeoutMs = positive(value(), "--step-timeout", false) * 1000;
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
  // the shm server's rule (a URL's num_envs wins over 1 only), a usage error now: the Python CLI's
  const urlNumEnvs = shmNumEnvs(url);
  if (numEnvsText !== null && urlNumEnvs !== null) {
    const given = BigInt(numEnvsText);
    if (given !== 1n && given !== BigInt(urlNumEnvs)) {
      throw new UsageError(`${url} asks for ${urlNumEnvs} envs but --num-envs is ${given}: give the same number, or one of them`);
    }
  }
  const given = numEnvsText === null ? null : ranged(numEnvsText, "--num-envs", MAX_NUM_ENVS, "");
  const numEnvs = given === null || (given === 1 && urlNumEnvs !== null) ? (urlNumEnvs ?? 1) : given;
  // env i of a connection gets seed + i, a u64 on the wire: the Python CLI's rule and words
  const maxSeed = SEED_LIMIT - BigInt(numEnvs);
  if (seed !== null && (seed < 0n || seed > maxSeed)) {
    throw new UsageError(
      `--seed must be 0..${maxSeed}, not ${seed} (seeds are u64 on the wire; env i gets seed + i, i < --num-envs ${numEnvs})`,
    );
  }
  return { url, env, schema, numEnvs, seed, maxBody, workers, stepTimeoutMs, limits, maskedActions };
}

/** An shm:// URL's num_envs (null: none, another scheme, or a bad URL, which binding reports). */
function shmNumEnvs(url: string): number | null {
  if (!url.toLowerCase().startsWith("shm://")) return null;
  try {
    return parseShmUrl(url).numEnvs;
  } catch {
    return null;
  }
}

/** A start-up refusal of the command line's content (exit 2, like a usage error). */
class StartError extends Error {}

/** The first line of an error's message: Node's "Require stack" and stacks stay out. */
function firstLine(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split("\n", 1)[0] as string;
}

/** What `--env` names: the factory, the HELLO's env name, where worker threads find it. */
interface LoadedEnv {
  readonly factory: EnvOrFactory;
  readonly envName: string;
  readonly workerEnv: WorkerEnvSpec | null;
  /** A user module's: the schema its FACTORY, else the module, exports as `SCHEMA` (or null). */
  readonly declared?: SchemaModule | null;
}

/** A schema module (what `loadSchemaFile` returns, a generated module's `SCHEMA`). */
function isSchemaModule(value: unknown): value is SchemaModule {
  const schema = value as Partial<SchemaModule> | null;
  return (
    typeof schema === "object" &&
    schema !== null &&
    typeof schema.name === "string" &&
    typeof schema.fingerprint === "bigint" &&
    typeof schema.ir === "object" &&
    typeof schema.structs === "object" &&
    typeof schema.messages === "object"
  );
}

/** A reference env by name, or `MODULE:FACTORY` (a user's JS module, resolved from the cwd). */
function loadEnv(spec: string): LoadedEnv {
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
  // the schema it declares, as the Python CLI finds it: FACTORY's SCHEMA, else the module's
  const own = (factory as { SCHEMA?: unknown }).SCHEMA;
  const declared = own ?? exports.SCHEMA;
  if (declared !== undefined && declared !== null && !isSchemaModule(declared)) {
    const owner = own !== undefined ? `${exportName}.SCHEMA` : `${modulePath}'s SCHEMA export`;
    throw new StartError(
      `--env ${JSON.stringify(spec)}: ${owner} is not a schema (loadSchemaFile("my_env.toml") or a generated module's SCHEMA)`,
    );
  }
  return {
    factory: factory as EnvFactory<unknown>,
    envName: exportName,
    workerEnv: { module, exportName },
    declared: declared ?? null,
  };
}

/** What the env factory threw, the last time it threw (`watchFactory`). */
let factoryThrew: { readonly error: unknown } | null = null;

/**
 * `factory`, noting what it throws (and rethrowing it unchanged): serve() makes one env at start,
 * and a factory that cannot make one is refused in the Python CLI's words, exit 2
 * (`cannot serve these envs: making one failed: ...`), not as a server that cannot bind. A class
 * stays a class (a subclass: `new C()`, and `new C(numEnvs)` for a vector env class).
 */
function watchFactory(factory: EnvOrFactory): EnvOrFactory {
  if (typeof factory !== "function") return factory;
  const note = (error: unknown): never => {
    factoryThrew = { error };
    throw error;
  };
  let watched: EnvOrFactory;
  if (/^class[\s{]/.test(Function.prototype.toString.call(factory))) {
    const Base = factory as unknown as new (...args: unknown[]) => object;
    watched = class extends Base {
      constructor(...args: unknown[]) {
        try {
          super(...args);
        } catch (error) {
          note(error);
        }
      }
    } as unknown as EnvOrFactory;
  } else {
    const make = factory as (...args: unknown[]) => unknown;
    watched = function (this: unknown, ...args: unknown[]): unknown {
      try {
        return make.apply(this, args);
      } catch (error) {
        return note(error);
      }
    } as unknown as EnvOrFactory;
  }
  Object.defineProperty(watched, "name", { value: factory.name });
  return watched;
}

/** An exception as one line, as Python's `describe` writes it: `Error: text`. */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error).split("\n", 1)[0] as string;
  const text = firstLine(error).trim();
  return text ? `${error.name}: ${text}` : error.name;
}

/** A private temporary file (removed at exit) holding `schema`'s IR, for worker threads to load. */
function irFileFor(schema: SchemaModule): string {
  const dir = mkdtempSync(join(tmpdir(), "transport-serve-schema-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, `${schema.name}.json`);
  writeFileSync(path, JSON.stringify(schema.ir), { mode: 0o600 });
  return path;
}

/**
 * Where `--schema` points: a built-in schema by name, or the project's own schema/NAME.toml (as
 * the Python CLI passes it), is its generated module; anything else, a user's file named like a
 * built-in schema included, is a path to a TOML file, an IR (.json) or a generated module.
 * Worker threads load the same path.
 */
function schemaLocation(spec: string): string {
  const name = basename(spec).replace(/\.(toml|js)$/, "");
  const builtIn = !spec.endsWith(".json") && Object.prototype.hasOwnProperty.call(SCHEMAS, name);
  if (builtIn && (!existsSync(spec) || isProjectSource(spec, name))) {
    return join(__dirname, "..", "generated", name);
  }
  return resolve(spec);
}

/** `spec` is the project's schema/NAME.toml, byte for byte: the source of the generated module. */
function isProjectSource(spec: string, name: string): boolean {
  if (!spec.endsWith(".toml")) return false;
  try {
    return readFileSync(spec).equals(readFileSync(join(__dirname, "..", "..", "..", "schema", `${name}.toml`)));
  } catch {
    return false;
  }
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
    return { schema, path: irFileFor(schema) };
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

/**
 * serve()'s refusal of an env whose results do not fit the default schema (no schema was given:
 * server.ts `defaultSchemaCheck`), in the command line's words; null for any other error.
 */
function defaultSchemaRefusal(error: unknown, spec: string): string | null {
  if (!(error instanceof TypeError) || !error.message.includes("no schema was given, so the default schema")) return null;
  const why = /results do not fit it: ([\s\S]*?)\. Pass \{ schema:/.exec(error.message)?.[1] ?? firstLine(error);
  const cut = spec.lastIndexOf(":");
  const [modulePath, exportName] = [spec.slice(0, cut), spec.slice(cut + 1)];
  return (
    `--env ${JSON.stringify(spec)}: its results do not fit the default schema ${pac_env.SCHEMA.name} (no --schema was given, ` +
    `and neither ${exportName} nor ${modulePath} exports SCHEMA): ${firstLine(why)}; pass --schema FILE (the schema its ` +
    `results follow), or give ${exportName} or ${modulePath} a SCHEMA export (loadSchemaFile("my_env.toml"))`
  );
}

async function main(argv: readonly string[]): Promise<number> {
  let args: Args | null;
  try {
    args = parseArgs(argv);
  } catch (error) {
    process.stderr.write(`${PROG}: error: ${(error as Error).message} (see ${PROG} --help)\n`);
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
    // no --schema: a user's module's SCHEMA export, as the Python CLI takes it
    const declared = loaded === null ? (userEnv?.declared ?? null) : null;
    const schemaPath = loaded !== null ? loaded.path : declared !== null && args.workers > 0 ? irFileFor(declared) : null;
    const schema = loaded?.schema ?? declared ?? pac_env.SCHEMA;
    // a user's env that declares none: serve() tries the default schema on its first env, and
    // refuses it at start when its results do not fit (defaultSchemaRefusal: exit 2)
    const byDefault = userEnv !== null && loaded === null && declared === null;
    if (args.schema !== null && args.env !== "contract") checkOwnSchema(args.env, schema, args.schema);
    if (schema.ir.env === undefined || schema.ir.env === null) {
      const where = args.schema !== null ? `${args.schema}: ` : declared !== null ? `--env ${JSON.stringify(args.env)}: its SCHEMA: ` : "";
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
    try {
      checkServerLimits(schema, args.url, args.numEnvs, args.maxBody ?? DEFAULT_MAX_BODY);
    } catch (error) {
      if (!(error instanceof RangeError)) throw error;
      // a limit with which every client would be refused: exit 2 before anything is created
      process.stderr.write(`${PROG}: error: ${error.message}\n`);
      return 2;
    }
    if (args.url.toLowerCase().startsWith("shm://")) {
      // before any env is made, after the limits: room in /dev/shm for the slots (args.numEnvs:
      // the URL's num_envs when it has one, parseArgs)
      const shm = parseShmUrl(args.url);
      checkRoom(shm, ShmLayout.of(schema), args.numEnvs);
    }
    server = await serve(watchFactory(factory), args.url, {
      numEnvs: args.numEnvs,
      envName,
      ...(byDefault ? {} : { schema }),
      ...(workerEnv !== null || schemaPath !== null || args.stepTimeoutMs !== undefined
        ? {
            workerEnv: {
              ...(workerEnv ?? {}),
              ...(schemaPath !== null ? { schemaModule: schemaPath } : {}),
              ...(args.stepTimeoutMs !== undefined ? { stepTimeoutMs: args.stepTimeoutMs } : {}),
            },
          }
        : {}),
      seed: args.seed,
      ...(args.maxBody !== undefined ? { maxBody: args.maxBody } : {}),
      ...(args.workers ? { workers: args.workers } : {}),
      limits: args.limits,
      maskedActions: args.maskedActions,
    });
  } catch (error) {
    // the command line names something unusable: a usage error (2), as in the Python CLI
    const misfit = defaultSchemaRefusal(error, args.env);
    if (misfit !== null) {
      process.stderr.write(`${PROG}: error: ${misfit}\n`);
      return 2;
    }
    if (factoryThrew !== null && factoryThrew.error === error) {
      // the Python CLI's words and status (transport/runtime/host.py check)
      process.stderr.write(`${PROG}: error: cannot serve these envs: making one failed: ${describe(error)}\n`);
      return 2;
    }
    const refused = error instanceof StartError || error instanceof SchemaError;
    const message = refused ? firstLine(error) : String((error as Error).message).replace(/\nRequire stack:[\s\S]*$/, "");
    process.stderr.write(`${PROG}: error: ${message}\n`);
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
          process.stderr.write(`${PROG}: error while closing: ${String(error)}\n`);
          resolve(1);
        },
      );
    };
    process.on("SIGINT", stop);
    process.on("SIGTERM", stop);
    // an error thrown outside any request (an env's timer or a promise it did not await) is
    // logged and serving goes on, as a Python server logs an exception of an env's own thread:
    // one env's stray callback does not end every client's session
    const escaped = (error: unknown): void => {
      const text = error instanceof Error ? (error.stack ?? String(error)) : String(error);
      process.stderr.write(`${PROG}: an error escaped the env code outside a request (serving goes on): ${text}\n`);
    };
    process.on("uncaughtException", escaped);
    process.on("unhandledRejection", escaped);
    // an shm:// server whose region another process changed stops on its own: exit 1, saying why
    onShmServerStopped((reason) => {
      process.stderr.write(`${PROG}: error: ${reason}\n`);
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
    process.stderr.write(`${PROG}: error: ${String(error)}\n`);
    process.exit(1);
  },
);
