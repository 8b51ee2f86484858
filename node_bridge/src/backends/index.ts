/**
 * Backend registry: one module (a file or a folder) per URL scheme, loaded on first use.
 *
 * A backend provides `listen(url, host, options) -> Listener` (server side: it moves bytes
 * between its peers and the env runtime that `host` makes per client) and
 * `openChannel(url, options) -> Channel` (client side). Adding a backend is adding a module
 * and one line to `BACKENDS`.
 */

import type { SchemaModule } from "../codec";
import { ConnectError } from "../errors";
import type { EnvHost } from "../runtime/host";
import type { Channel, ChannelOptions, ConnectionStats, ServerLimits } from "../stream";

/** Server-side options every backend understands. */
export interface ListenOptions {
  /** Largest request body accepted (bytes); larger ones are refused before they are read. */
  readonly maxBody?: number;
  /** http: bind a non-loopback address (the protocol has no authentication). */
  readonly allowRemote?: boolean;
  /** unix, http: the connection cap and timeouts (defaults: DEFAULT_SERVER_LIMITS). */
  readonly limits?: Partial<ServerLimits>;
}

/** A listening server endpoint. */
export interface Listener {
  /** The URL clients use (a requested port 0 is resolved). */
  readonly url: string;
  readonly stats: ConnectionStats;
  /** Stop accepting, drop every connection, remove what was created (socket files). */
  close(): Promise<void>;
}

/** Client-side options every backend understands. */
export interface OpenOptions extends ChannelOptions {
  readonly schema?: SchemaModule;
}

export interface Backend {
  listen(url: string, host: EnvHost, options?: ListenOptions): Promise<Listener>;
  openChannel(url: string, options?: OpenOptions): Promise<Channel>;
}

export const BACKENDS: Readonly<Record<string, () => Promise<Backend>>> = {
  unix: async () => require("./unix") as Backend,
  http: async () => require("./http") as Backend,
  shm: async () => require("./shm") as Backend,
  "zmq+ipc": async () => require("./zmq") as Backend,
  "zmq+tcp": async () => require("./zmq") as Backend,
};

export function schemeOf(url: string): string {
  const sep = url.indexOf("://");
  if (sep < 0) throw new ConnectError(`${JSON.stringify(url)} is not a URL: expected scheme://address`);
  return url.slice(0, sep).toLowerCase();
}

/** The backend serving `url`'s scheme. */
export async function backendFor(url: string): Promise<Backend> {
  const scheme = schemeOf(url);
  const load = Object.prototype.hasOwnProperty.call(BACKENDS, scheme) ? BACKENDS[scheme] : undefined;
  if (load === undefined) {
    const known = Object.keys(BACKENDS)
      .sort()
      .map((s) => `${s}://`)
      .join(", ");
    throw new ConnectError(`no backend for ${scheme}:// (known: ${known})`);
  }
  return load();
}
