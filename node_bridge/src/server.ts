/**
 * `serve(envOrFactory, url)`: an env server on any registered backend (transport/api.py).
 *
 *   const server = await serve(() => new PacEnv(), "unix:///tmp/pac.sock", { envName: "pac" });
 *   console.log(server.url);   // http://127.0.0.1:0 comes back with the bound port
 *   await server.close();      // drops connections, removes the socket file
 *
 * A process that gets SIGINT or SIGTERM while servers are open and has no handler of its own for
 * that signal closes them (socket files and shm segments removed) and then dies of the signal as
 * it would have: nothing is left behind. With a handler of its own, the application decides.
 */

import { backendFor, type Listener } from "./backends";
import type { SchemaModule } from "./codec";
import * as pac_env from "./generated/pac_env";
import { DEFAULT_MAX_BODY, encodeHelloRequest } from "./protocol";
import type { MaskedActions } from "./runtime/core";
import { bodyCodec } from "./runtime/core";
import { type Env, type EnvOrFactory, asyncMethodText, isEnv, isThenable, isVectorEnv } from "./runtime/env";
import { EnvHost, declaredSchema } from "./runtime/host";
import type { WorkerEnvSpec } from "./runtime/pool";
import { type ConnectionStats, type ServerLimits, serverLimits } from "./stream";
import { MAX_NUM_ENVS } from "./backends/backend";

export interface ServeOptions {
  /** Envs per connection (N); needs a factory when above 1. Default 1. */
  readonly numEnvs?: number;
  /** The env name the HELLO_RESP info carries. */
  readonly envName?: string;
  /** The seed of each connection's first unseeded reset (env i gets seed + i). */
  readonly seed?: bigint | number | null;
  /** Largest request body accepted (bytes). Default 64 MiB. */
  readonly maxBody?: number;
  /** http: allow a non-loopback bind. */
  readonly allowRemote?: boolean;
  /**
   * unix, http: at most `maxConnections` clients at once (default 1024; one more gets a
   * "server busy" ERROR, on http a 503, and is closed), `idleTimeoutMs` between requests
   * (default 600 s) and `readTimeoutMs` for a started request to arrive completely (default
   * 30 s); zmq: a session idle for `idleTimeoutMs` is closed. Non-positive values are a
   * RangeError. docs/server.md "Limits".
   */
  readonly limits?: Partial<ServerLimits>;
  /**
   * Schema (default: the one the env or its class declares as `SCHEMA`, else the reference
   * pac_env): any generated module that declares the protocol
   * messages by name, with an integer `action` role in the STEP_REQ body and the result struct
   * as the STEP_RESP body (runtime/core.ts).
   */
  readonly schema?: SchemaModule;
  /**
   * Validate every env result against the schema (default true); false writes results
   * unchecked, for envs whose output is well-formed by construction.
   */
  readonly validate?: boolean;
  /**
   * Step each connection's envs in this many worker_threads (runtime/pool.ts; default 0: in this
   * thread). The threads build their envs from `workerEnv` (default: `envName` in `ENVS`).
   */
  readonly workers?: number;
  readonly workerEnv?: WorkerEnvSpec;
  /**
   * What an action the env's mask forbids does: "reject" (MASKED_ACTION, default), "pass" (the
   * env steps with it) or "noop" (no step; the previous result with reward
   * `env.maskedActionPenalty`, default 0). docs/adapters.md says which trainer needs which.
   */
  readonly maskedActions?: MaskedActions;
}

export { MAX_NUM_ENVS };
/** The largest maxBody: a frame header's body_len is a u32. */
export const MAX_BODY_LIMIT = 0xffffffff;
/** SAME_STEP tail: a u32 count, then per ended env a u32 index and its final result. */
const FINAL_ENTRY_EXTRA = 4;

function bodySize(schema: SchemaModule, message: string): number {
  const body = schema.messages[message]?.body;
  return body ? (schema.structs[body]?.size ?? 0) : 0;
}

/**
 * Refuse, before anything is created, limits with which a server would start and then refuse
 * every client: a `RangeError` naming the numbers. The rules and texts of Python's
 * `check_server_limits` (docs/decisions.md "Start-up validation"): numEnvs in 1..65536; maxBody
 * in 1..2^32-1; framed backends (all but shm://): the largest request (a STEP_BATCH, STEP_MULTI,
 * RESET_SEED or the HELLO with its tail) fits maxBody, and the
 * largest response (a step with same_step finals for every env) fits max(maxBody, 64 MiB).
 */
export function checkServerLimits(schema: SchemaModule, url: string, numEnvs: number, maxBody: number): void {
  if (!Number.isInteger(numEnvs) || numEnvs < 1 || numEnvs > MAX_NUM_ENVS) {
    throw new RangeError(`num_envs must be 1..${MAX_NUM_ENVS}, not ${numEnvs}`);
  }
  if (!Number.isInteger(maxBody) || maxBody < 1 || maxBody > MAX_BODY_LIMIT) {
    throw new RangeError(`max_body must be 1..${MAX_BODY_LIMIT} bytes, not ${maxBody}`);
  }
  if (url.split("://")[0]?.toLowerCase() === "shm") return; // no frames: /dev/shm room is checked on creation
  const action = bodySize(schema, "STEP_REQ");
  const requests: Array<[number, string]> = [
    [numEnvs * action, `a STEP_BATCH request for ${numEnvs} envs (${numEnvs} x ${action})`],
    [bodySize(schema, "STEP_MULTI_REQ"), "a STEP_MULTI request"],
    [bodySize(schema, "RESET_SEED_REQ"), "a RESET_SEED request"],
    // the HELLO_REQ: 12 bytes and a msgpack tail naming the schema (or asking to discover it)
    [Math.max(encodeHelloRequest(schema).byteLength, encodeHelloRequest(null).byteLength), "a HELLO request"],
  ];
  const [needRequest, whatRequest] = requests.reduce((a, b) => (b[0] > a[0] ? b : a));
  if (needRequest > maxBody) {
    throw new RangeError(
      `max_body ${maxBody} is too small for num_envs=${numEnvs} with schema ${schema.name}: ` +
        `${whatRequest} is ${needRequest} bytes; raise max_body to at least ${needRequest}`,
    );
  }
  const result = bodySize(schema, "STEP_RESP");
  const multi = schema.messages.STEP_MULTI_REQ?.body;
  const seats = multi ? (schema.ir.structs[multi]?.fields[0]?.count ?? 0) : 0;
  const rows = Math.max(numEnvs, seats);
  const needResponse = rows * result + FINAL_ENTRY_EXTRA + numEnvs * (FINAL_ENTRY_EXTRA + result);
  const limit = Math.max(maxBody, DEFAULT_MAX_BODY);
  if (needResponse > limit) {
    throw new RangeError(
      `num_envs=${numEnvs} is too many for schema ${schema.name} with max_body ${maxBody}: ` +
        `a step response for ${numEnvs} envs with same_step finals (${rows} x ${result} + 4 + ` +
        `${numEnvs} x (4 + ${result})) is ${needResponse} bytes, over ${limit} (the larger of ` +
        `max_body and the default ${DEFAULT_MAX_BODY} clients accept); serve fewer envs, or raise ` +
        `max_body to at least ${needResponse} and connect clients with max_body >= ${needResponse}`,
    );
  }
}

/** A running server. */
export interface Server {
  /** The URL clients should use (a port 0 request is resolved to the real port). */
  readonly url: string;
  /** Connection counters (accepted, backpressure pauses). */
  readonly stats: ConnectionStats;
  /** Stop accepting, drop every connection and remove what the server created. */
  close(): Promise<void>;
}

/**
 * Serve `envOrFactory` at `url` until `close()`. An env instance is shared by every connection
 * (numEnvs must be 1); a factory (or an env class) gives each connection `numEnvs` fresh envs.
 * Resolves once clients can connect; rejects with `ConnectError` when the address cannot be
 * used (a live server holds the socket path: "... is in use ...").
 */
export async function serve(
  envOrFactory: EnvOrFactory,
  url: string,
  options: ServeOptions = {},
): Promise<Server> {
  // a vector env instance serves its own numEnvs unless the options name one
  const numEnvs = options.numEnvs ?? (isVectorEnv(envOrFactory) ? envOrFactory.numEnvs : 1);
  // no schema given: the one the env (its class, or the instance) declares as SCHEMA, as in Python
  const schema = options.schema ?? declaredSchema(envOrFactory) ?? undefined;
  checkServerLimits(schema ?? pac_env.SCHEMA, url, numEnvs, options.maxBody ?? DEFAULT_MAX_BODY);
  const host = new EnvHost(envOrFactory, {
    ...(options.numEnvs !== undefined ? { numEnvs: options.numEnvs } : {}),
    envName: options.envName ?? "",
    seed: options.seed ?? null,
    serverLang: "node",
    ...(schema ? { schema } : {}),
    ...(options.validate !== undefined ? { validate: options.validate } : {}),
    ...(options.workers ? { workers: options.workers } : {}),
    ...(options.workerEnv ? { workerEnv: options.workerEnv } : {}),
    ...(options.maskedActions ? { maskedActions: options.maskedActions } : {}),
  });
  // no schema: the default is tried on the first env made (the first client's, made below)
  if (schema === undefined) host.inspectFirstEnv(defaultSchemaCheck(envOrFactory, url));
  const limits = serverLimits(options.limits); // a bad limit fails before anything starts
  const backend = await backendFor(url);
  // fail now, not on the first connection; the envs made serve the first client
  if (!url.toLowerCase().startsWith("shm://")) host.check();
  let listener: Listener;
  try {
    listener = await backend.listen(url, host, {
      maxBody: options.maxBody ?? DEFAULT_MAX_BODY,
      allowRemote: options.allowRemote ?? false,
      limits,
    });
  } catch (error) {
    host.close();
    throw error;
  }
  const server: Server = {
    url: listener.url,
    stats: listener.stats,
    close: async () => {
      OPEN_SERVERS.delete(server);
      await listener.close();
      host.close(); // the first client's envs, if no client took them
    },
  };
  OPEN_SERVERS.add(server);
  watchSignals();
  return server;
}

/**
 * For `serve()` without `schema`: a check that resets an env (the first one the host makes, or
 * the instance) and tells whether its result fits the default pac_env; a `TypeError` naming
 * what to pass when it does not, so a server never starts serving results it cannot encode
 * (Python: `default_schema_check`).
 */
function defaultSchemaCheck(envOrFactory: EnvOrFactory, url: string): (env: Env<unknown>) => void {
  const name = (isEnv(envOrFactory) ? envOrFactory.constructor?.name : (envOrFactory as { name?: string }).name) || "the env";
  return (env) => {
    let result: unknown;
    try {
      result = env.reset();
    } catch {
      return; // resetting it fails: the server reports that itself, with the reason
    }
    if (isThenable(result)) throw new TypeError(`serve(${name}, ${JSON.stringify(url)}): ${asyncMethodText("reset", result)}`);
    try {
      bodyCodec(pac_env.SCHEMA, "STEP_RESP").encode(result as never);
    } catch (err) {
      throw new TypeError(
        `serve(${name}, ${JSON.stringify(url)}): no schema was given, so the default schema pac_env was ` +
          `tried, and ${name}'s results do not fit it: ${(err as Error).message}. Pass { schema: ` +
          `loadSchemaFile("your_env.toml") } or a generated module's SCHEMA`,
      );
    }
  };
}

const OPEN_SERVERS = new Set<Server>();
const SIGNALS = ["SIGINT", "SIGTERM"] as const;
/** How long a signalled process waits for its servers to close before it dies anyway. */
const CLOSE_ON_SIGNAL_MS = 2000;
let watching = false;

/** Close the open servers on SIGINT/SIGTERM when no one else handles the signal (see top). */
function watchSignals(): void {
  if (watching) return;
  watching = true;
  const handlers = new Map<NodeJS.Signals, () => void>();
  for (const signal of SIGNALS) {
    const onSignal = (): void => {
      if (process.listenerCount(signal) > 1) return; // the application handles it
      const closing = [...OPEN_SERVERS].map((server) => server.close().catch(() => undefined));
      const deadline = new Promise((resolve) => setTimeout(resolve, CLOSE_ON_SIGNAL_MS).unref());
      void Promise.race([Promise.all(closing), deadline]).then(() => {
        for (const [s, handler] of handlers) process.removeListener(s, handler);
        watching = false;
        process.kill(process.pid, signal); // the default action now: die of the signal
      });
    };
    handlers.set(signal, onSignal);
    process.on(signal, onSignal);
  }
}
