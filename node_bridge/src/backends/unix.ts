/**
 * unix:///path.sock: frames over a Unix domain stream socket (transport/backends/unix.py).
 *
 * The socket file is created mode 0600 (umask while binding, chmod right after listen, before
 * anyone is told the server is ready) and removed when the listener closes. A file left by a
 * dead server is replaced only when nothing accepts connections on it; a live one is never
 * stolen (`ConnectError` "... is in use ...").
 */

import { chmodSync, lstatSync, statSync, unlinkSync } from "node:fs";
import * as net from "node:net";
import { dirname } from "node:path";
import { ConnectError } from "../errors";
import { singleParams } from "./url_params";
import type { EnvHost } from "../runtime/host";
import { type Session, sessionsOf } from "../runtime/session";
import {
  type ChannelOptions,
  ConnectionGuard,
  type ConnectionStats,
  type Expiry,
  StreamChannel,
  cannotMakeEnvs,
  errorFrame,
  linger,
  newStats,
  serveConnection,
  serverLimits,
  timeoutOption,
} from "../stream";
import { DEFAULT_MAX_BODY, ErrorCode } from "../protocol";
import type { Listener, ListenOptions } from "./backend";

/**
 * The socket file of `unix:///path`; a unix URL takes no query parameters, so any `?name=value`
 * is refused (it would otherwise become part of the file name), as in transport/backends/unix.py.
 */
export function socketPath(url: string): string {
  const sep = url.indexOf("://");
  const rest = sep < 0 ? "" : url.slice(sep + 3);
  const q = rest.indexOf("?");
  if (q >= 0) {
    const given = [...singleParams(url, rest.slice(q + 1)).keys()].join(", ") || "an empty query";
    throw new ConnectError(`${JSON.stringify(url)}: unknown parameter(s) ${given} (unix:// URLs take none)`);
  }
  const path = rest;
  if (!path) {
    throw new ConnectError(`${JSON.stringify(url)} names no socket path (expected unix:///path/to.sock)`);
  }
  if (Buffer.byteLength(path) > 107) {
    throw new ConnectError(`socket path ${JSON.stringify(path)} is longer than the 107 bytes Linux allows`);
  }
  return path;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

function tryConnect(path: string, timeoutMs: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection({ path });
    const timer = setTimeout(() => {
      socket.destroy();
      const error = new Error("connect timed out") as NodeJS.ErrnoException;
      error.code = "ETIMEDOUT";
      reject(error);
    }, Math.max(1, timeoutMs));
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      resolve(socket);
    });
    socket.once("error", (error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(error);
    });
  });
}

/** Connect, retrying with backoff while the server is not up yet, until the deadline. */
export async function openChannel(url: string, options: ChannelOptions = {}): Promise<StreamChannel> {
  const path = socketPath(url);
  const timeoutMs = timeoutOption(options.timeoutMs);
  const deadline = Date.now() + (timeoutMs ?? 10_000);
  let delay = 5;
  for (;;) {
    try {
      const socket = await tryConnect(path, deadline - Date.now());
      return new StreamChannel(socket, options);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code ?? "";
      if (code === "ENOENT" || code === "ECONNREFUSED") {
        if (Date.now() + delay > deadline) {
          throw new ConnectError(`nothing accepts connections on ${path} (${code})`);
        }
        await sleep(delay);
        delay = Math.min(delay * 2, 200);
        continue;
      }
      if (code === "ETIMEDOUT") throw new ConnectError(`connecting to ${path} timed out`);
      throw new ConnectError(`cannot connect to ${path}: ${code || (error as Error).message}`);
    }
  }
}

/** True when something accepts connections on `path` (a silent socket counts as live). */
async function isLive(path: string): Promise<boolean> {
  try {
    const socket = await tryConnect(path, 1000);
    socket.destroy();
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "ETIMEDOUT";
  }
}

/** A listening Unix socket: one Session per connection. */
export class UnixListener implements Listener {
  readonly url: string;
  readonly path: string;
  readonly stats: ConnectionStats = newStats();
  readonly server: net.Server;
  /** The connection cap and timeouts (ServerLimits; set by `listen`). */
  guard: ConnectionGuard | null = null;
  readonly #sockets = new Set<net.Socket>();
  #inode: number | null = null;
  #closed: Promise<void> | null = null;

  constructor(url: string, server: net.Server, path: string) {
    this.url = url;
    this.server = server;
    this.path = path;
  }

  track(socket: net.Socket): void {
    this.#sockets.add(socket);
    socket.once("close", () => this.#sockets.delete(socket));
  }

  setInode(inode: number): void {
    this.#inode = inode;
  }

  /** Stop accepting, drop the connections and remove the socket file (if still ours). */
  close(): Promise<void> {
    if (this.#closed) return this.#closed;
    this.guard?.close();
    this.#closed = new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      for (const socket of this.#sockets) socket.destroy();
    }).then(() => {
      try {
        if (this.#inode !== null && statSync(this.path).ino === this.#inode) unlinkSync(this.path);
      } catch {
        // already gone (libuv unlinks the path of a closed listening pipe)
      }
    });
    return this.#closed;
  }
}

/** Bind errors in the words of Python's `strerror` (transport/backends/unix.py says them). */
const BIND_ERRORS: Readonly<Record<string, string>> = {
  ENOENT: "No such file or directory",
  ENOTDIR: "Not a directory",
  EACCES: "Permission denied",
  EROFS: "Read-only file system",
};

/**
 * Why `path` cannot be bound. libuv reports a missing directory as EACCES (for Windows' sake),
 * so the socket's directory is asked: one that does not exist (or is not a directory) is said
 * so, as Python says it, not "permission denied".
 */
function bindFailure(path: string, error: NodeJS.ErrnoException): string {
  let code = error.code;
  try {
    if (!statSync(dirname(path)).isDirectory()) code = "ENOTDIR";
  } catch (problem) {
    const found = (problem as NodeJS.ErrnoException).code;
    if (found === "ENOENT" || found === "ENOTDIR") code = found;
  }
  return (code !== undefined ? BIND_ERRORS[code] : undefined) ?? code ?? error.message;
}

/** Bind and listen; refuses a path a live server holds, replaces a stale one. */
export async function listen(
  url: string,
  host: EnvHost,
  options: ListenOptions = {},
): Promise<UnixListener> {
  const sessions = sessionsOf(host);
  const path = socketPath(url);
  const maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
  let stat: ReturnType<typeof lstatSync> | undefined;
  try {
    stat = lstatSync(path);
  } catch {
    stat = undefined;
  }
  if (stat !== undefined) {
    if (!stat.isSocket()) throw new ConnectError(`${path} exists and is not a socket; not replacing it`);
    if (await isLive(path)) throw new ConnectError(`${path} is in use by a live server`);
    try {
      unlinkSync(path); // stale: its server is gone
    } catch {
      // someone else removed it
    }
  }
  const server = net.createServer();
  const listener = new UnixListener(url, server, path);
  const guard = new ConnectionGuard(serverLimits(options.limits), (socket: net.Socket, why: Expiry) => {
    // a request that trickles is told why; an idle connection or a client that does not read
    // its responses is closed
    if (why === "read") {
      socket.write(errorFrame(ErrorCode.BAD_FRAME, guard.readTimeoutText()));
      linger(socket);
    } else socket.destroy();
  });
  listener.guard = guard;
  server.on("connection", (socket: net.Socket) => {
    listener.track(socket);
    const watch = guard.admit(socket);
    if (watch === null) {
      // over max_connections: an ERROR that answers no request (msg_id 0), then close
      socket.on("error", () => undefined);
      socket.write(errorFrame(ErrorCode.INTERNAL, guard.busyText()));
      linger(socket);
      return;
    }
    listener.stats.connections += 1;
    let session: Session;
    try {
      session = sessions();
    } catch (error) {
      process.emitWarning(`cannot create a session for a new connection on ${path}: ${String(error)}`);
      // an ERROR that answers no request (msg_id 0) says why, then close
      socket.on("error", () => undefined);
      socket.write(errorFrame(ErrorCode.INTERNAL, cannotMakeEnvs(error)));
      linger(socket);
      return;
    }
    serveConnection(socket, session, maxBody, listener.stats, watch);
  });
  await new Promise<void>((resolve, reject) => {
    const onError = (error: NodeJS.ErrnoException): void => {
      server.close();
      guard.close();
      if (error.code === "EADDRINUSE") reject(new ConnectError(`${path} is in use`));
      else reject(new ConnectError(`cannot bind ${path}: ${bindFailure(path, error)}`));
    };
    server.once("error", onError);
    let old: number | null = null;
    try {
      old = process.umask(0o177); // the file is born 0600 (no window with a wider mode)
    } catch {
      old = null; // worker threads cannot change the umask: chmod below still applies
    }
    try {
      server.listen(path, () => {
        server.removeListener("error", onError);
        resolve();
      });
    } finally {
      if (old !== null) process.umask(old);
    }
  });
  chmodSync(path, 0o600);
  listener.setInode(statSync(path).ino);
  server.on("error", (error) => process.emitWarning(`unix listener ${path}: ${String(error)}`));
  return listener;
}
