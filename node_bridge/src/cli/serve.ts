#!/usr/bin/env node
/**
 * The Node env server behind `transport-serve URL --lang node` (transport/tools/serve_cli.py
 * execs `node node_bridge/dist/cli/serve.js URL --env NAME --num-envs N [--seed S]
 * [--max-body B]`). Prints exactly `ready <url>` on stdout once clients can connect; on SIGINT
 * or SIGTERM closes (removing the socket file or the shm:// segment) and exits 0; on a start
 * failure prints `transport-serve: error: <message>` on stderr and exits 1 (2 for bad arguments).
 */

import { basename, join, resolve } from "node:path";
import { ShmLayout, checkRoom, parseShmUrl } from "../backends/shm/region";
import { ENV_SCHEMAS, ENVS } from "../envs";
import * as pac_env from "../generated/pac_env";
import type { EnvFactory } from "../runtime/env";
import { MASKED_ACTION_POLICIES, type MaskedActions } from "../runtime/core";
import { type WorkerEnvSpec, schemaFromPath } from "../runtime/pool";
import { ContractEnv } from "../envs/contract";
import { SCHEMAS } from "../generated";
import { DEFAULT_MAX_BODY } from "../protocol";
import { MAX_BODY_LIMIT, MAX_NUM_ENVS, type Server, checkServerLimits, serve } from "../server";
import type { ServerLimits } from "../stream";

const USAGE = `usage: serve.js URL [--env NAME] [--num-envs N] [--seed S] [--max-body B]
                [--max-connections C] [--idle-timeout SECONDS] [--read-timeout SECONDS]

Serve a reference env (Node implementation) until SIGINT or SIGTERM. Prints one line
"ready URL" on stdout once clients can connect (with http://127.0.0.1:0 the URL carries the
port that was bound).

  URL            unix:///path.sock, http://127.0.0.1:PORT (?allow_remote=1 for other hosts)
                 zmq+ipc:///path, zmq+tcp://127.0.0.1:PORT (docs/zmq.md: CURVE, allow_insecure)
                 or shm://name?num_envs=N (region /dev/shm/transport-name; docs/shm.md)
  --env NAME     reference env: ${Object.keys(ENVS).sort().join(", ")} (default echo), contract
                 (the backend contract suite's env: any --schema), or MODULE:FACTORY, a JS
                 module (path) exporting an env factory or class
  --schema S     the schema the env speaks (default pac_env): a built-in schema by name
                 (${Object.keys(SCHEMAS).sort().join(", ")}; schema/NAME.toml names it too), a
                 compiled IR (.json, transport-schema inspect --json) or a generated module
                 exporting SCHEMA
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
step response for every env must fit in max(--max-body, 64 MiB): the rules of the Python CLI).
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
      if (v === undefined) throw new UsageError(`${flag} needs a value`);
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
        if (!Object.prototype.hasOwnProperty.call(ENVS, env) && env !== "contract" && !env.includes(":")) {
          throw new UsageError(
            `unknown env ${JSON.stringify(env)} (choose from ${Object.keys(ENVS).sort().join(", ")}, contract, or MODULE:FACTORY)`,
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
        if (arg.startsWith("-") || url !== undefined) throw new UsageError(`unexpected argument ${JSON.stringify(arg)}`);
        url = arg;
    }
  }
  if (url === undefined) throw new UsageError("the URL is required");
  return { url, env, schema, numEnvs: numEnvs ?? 1, seed, maxBody, numEnvsGiven: numEnvs !== null, workers, limits, maskedActions };
}

/** A reference env by name, or `MODULE:FACTORY` (a user's JS module, resolved from the cwd). */
function loadEnv(spec: string): { factory: EnvFactory<unknown>; envName: string; workerEnv: WorkerEnvSpec | null } {
  const known = ENVS[spec];
  if (known !== undefined && Object.prototype.hasOwnProperty.call(ENVS, spec)) {
    return { factory: known as EnvFactory<unknown>, envName: spec, workerEnv: null };
  }
  const cut = spec.lastIndexOf(":");
  const module = resolve(spec.slice(0, cut));
  const exportName = spec.slice(cut + 1);
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const factory = (require(module) as Record<string, unknown>)[exportName];
  if (typeof factory !== "function") throw new Error(`${module} exports no env factory or class ${JSON.stringify(exportName)}`);
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

async function main(argv: readonly string[]): Promise<number> {
  let args: Args | null;
  try {
    args = parseArgs(argv);
  } catch (error) {
    process.stderr.write(`${USAGE}\ntransport-serve: error: ${(error as Error).message}\n`);
    return 2;
  }
  if (args === null) {
    process.stdout.write(USAGE);
    return 0;
  }
  let server: Server;
  try {
    const schemaName = args.schema ?? ENV_SCHEMAS[args.env] ?? null; // a reference env's own schema
    const schemaPath = schemaName === null ? null : schemaLocation(schemaName);
    const schema = schemaPath === null ? pac_env.SCHEMA : schemaFromPath(schemaPath);
    const { factory, envName, workerEnv } =
      args.env === "contract"
        ? {
            factory: () => new ContractEnv(schema),
            envName: "contract",
            workerEnv: { module: join(__dirname, "..", "envs", "contract_worker.js"), exportName: "contract" },
          }
        : loadEnv(args.env);
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
    process.stderr.write(`transport-serve: error: ${(error as Error).message}\n`);
    return 1;
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
