#!/usr/bin/env node
/**
 * The Tetris env server (examples/tetris/): `node node_bridge/dist/examples/tetris_server.js
 * unix:///tmp/tetris.sock [--num-envs N] [--seed S] [--max-steps M]`. Serves TetrisEnv on the
 * tetris schema with the generic Session; prints exactly `ready <url>` once clients can connect;
 * on SIGINT or SIGTERM closes (removing the socket file) and exits 0.
 */

import * as tetris from "../generated/tetris";
import { type Server, serve } from "../server";
import { DEFAULT_MAX_STEPS, TetrisEnv } from "./tetris";

const USAGE = `usage: tetris_server.js URL [--num-envs N] [--seed S] [--max-steps M]

Serve the Tetris example env (schema/tetris.toml) until SIGINT or SIGTERM. Prints one line
"ready URL" on stdout once clients can connect.

  URL            unix:///path.sock or http://127.0.0.1:PORT (any registered backend)
  --num-envs N   envs per connection (default 1)
  --seed S       seed of each connection's first unseeded reset (env i: S + i)
  --max-steps M  pieces per episode before it is truncated (default ${DEFAULT_MAX_STEPS})
`;

interface Args {
  url: string;
  numEnvs: number;
  seed: bigint | null;
  maxSteps: number;
}

function parseArgs(argv: readonly string[]): Args | null {
  let url: string | undefined;
  let numEnvs = 1;
  let seed: bigint | null = null;
  let maxSteps = DEFAULT_MAX_STEPS;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === "-h" || arg === "--help") return null;
    const value = (): string => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${arg} needs a value`);
      return v;
    };
    const positive = (text: string): number => {
      if (!/^[0-9]+$/.test(text) || Number(text) < 1) {
        throw new Error(`${arg} must be a positive integer, got ${JSON.stringify(text)}`);
      }
      return Number(text);
    };
    if (arg === "--num-envs") numEnvs = positive(value());
    else if (arg === "--max-steps") maxSteps = positive(value());
    else if (arg === "--seed") {
      const text = value();
      if (!/^[0-9]+$/.test(text)) throw new Error(`--seed must be a non-negative integer, got ${JSON.stringify(text)}`);
      seed = BigInt(text);
    } else if (arg.startsWith("-") || url !== undefined) {
      throw new Error(`unexpected argument ${JSON.stringify(arg)}`);
    } else url = arg;
  }
  if (url === undefined) throw new Error("the URL is required");
  return { url, numEnvs, seed, maxSteps };
}

export async function main(argv: readonly string[]): Promise<number> {
  let args: Args | null;
  try {
    args = parseArgs(argv);
  } catch (error) {
    process.stderr.write(`${USAGE}\ntetris_server: error: ${(error as Error).message}\n`);
    return 2;
  }
  if (args === null) {
    process.stdout.write(USAGE);
    return 0;
  }
  const { maxSteps } = args;
  let server: Server;
  try {
    server = await serve(() => new TetrisEnv({ maxSteps }), args.url, {
      schema: tetris.SCHEMA,
      envName: "tetris",
      numEnvs: args.numEnvs,
      seed: args.seed,
      validate: false, // TetrisEnv's result is well-formed by construction
    });
  } catch (error) {
    process.stderr.write(`tetris_server: error: ${(error as Error).message}\n`);
    return 1;
  }
  process.stdout.write(`ready ${server.url}\n`);
  return new Promise<number>((resolve) => {
    const stop = (): void => {
      const force = setTimeout(() => resolve(0), 5000);
      force.unref();
      server.close().then(
        () => resolve(0),
        () => resolve(1),
      );
    };
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
}

/** Run the server with these arguments and exit with its status (examples/tetris/serve.js). */
export function run(argv: readonly string[]): void {
  main(argv).then(
    (code) => process.exit(code),
    (error: unknown) => {
      process.stderr.write(`tetris_server: error: ${String(error)}\n`);
      process.exit(1);
    },
  );
}

if (require.main === module) run(process.argv.slice(2));
