/**
 * Backend registry: one module (a file or a folder) per URL scheme, loaded on first use.
 *
 * A backend provides `listen(url, host, options) -> Listener` (server side: it moves bytes
 * between its peers and the env runtime that `host` makes per client) and
 * `openChannel(url, options) -> Channel` (client side). Adding a backend is adding a module
 * and one line to `BACKENDS`.
 */

import { ConnectError } from "../errors";
import type { Backend } from "./backend";

export type { Backend, Listener, ListenOptions, OpenOptions } from "./backend";

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
    // auto:// (Python: pick the fastest backend a named server is reachable on) has no Node client
    const auto = scheme === "auto" ? "; auto:// is Python-only: the Node client does not support it, name the server's URL" : "";
    throw new ConnectError(`no backend for ${scheme}:// (known: ${known}${auto})`);
  }
  return load();
}
