/**
 * The zmq server: a Router serving every client, one `Session` per routing id.
 */

import { chmodSync, lstatSync, statSync, unlinkSync } from "node:fs";
import * as net from "node:net";
import * as zmq from "zeromq";
import { ConnectError } from "../../errors";
import { CLOSING_ERRORS, DEFAULT_MAX_BODY, ErrorCode, HEADER_SIZE, encodeError, isGoodbye, messageIds, packHeader, readU32 } from "../../protocol";
import type { EnvHost } from "../../runtime/host";
import { LATER, type Session, sessionsOf } from "../../runtime/session";
import { type ConnectionStats, SWEEP_INTERVAL_MS, cannotMakeEnvs, newStats, serverLimits } from "../../stream";
import type { Listener, ListenOptions } from "../backend";
import { commonOptions, Address, EMPTY, ENV_SERVER_SECRET, MAX_SESSIONS, ZAP_ENDPOINT, binary, errorCode, parseUrl, sendable, serverCurve, z85Encode } from "./wire";

// -- server ---------------------------------------------------------------------------------------

/** True when something accepts connections on `path` (a silent socket counts as live). */
export function isLive(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.createConnection({ path });
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(true);
    }, 1000);
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(false);
    });
  });
}

export async function claimPath(path: string): Promise<void> {
  let stat: ReturnType<typeof lstatSync> | undefined;
  try {
    stat = lstatSync(path);
  } catch {
    return;
  }
  if (!stat.isSocket()) throw new ConnectError(`${path} exists and is not a socket; not replacing it`);
  if (await isLive(path)) throw new ConnectError(`${path} is in use by a live server`);
  try {
    unlinkSync(path); // stale: its server is gone
  } catch {
    // someone else removed it
  }
}

/** ZAP (RFC 27) handler admitting exactly the allowed CURVE client keys. */
export async function serveZap(sock: zmq.Reply, allowed: ReadonlySet<string>): Promise<void> {
  for (;;) {
    let request: Buffer[];
    try {
      request = await sock.receive();
    } catch {
      return; // closed
    }
    const [version, requestId, , , , mechanism, key] = request;
    let status = "400";
    let text = "unknown key";
    if (version?.toString() !== "1.0") {
      status = "500";
      text = "unsupported ZAP version";
    } else if (mechanism?.toString() === "CURVE" && key !== undefined && key.byteLength === 32) {
      const z85 = z85Encode(key);
      if (allowed.has(z85)) {
        status = "200";
        text = "OK";
      } else {
        process.emitWarning(`refused a CURVE client with key ${z85}`);
      }
    } else {
      text = "only CURVE clients are admitted";
    }
    try {
      await sock.send(["1.0", requestId ?? EMPTY, status, text, "", ""]);
    } catch {
      return;
    }
  }
}

/**
 * A Router serving every client; one Session per client routing id. A HELLO from a client that
 * already said hello starts a fresh Session; errors that close a stream connection drop the
 * session instead (a Router cannot close one peer): the client must HELLO again. A session that
 * sent nothing for `limits.idleTimeoutMs` is closed (a Router is not told when a peer dies): its
 * client's next request gets HELLO_REQUIRED.
 */
export class ZmqListener implements Listener {
  url: string;
  readonly address: Address;
  readonly stats: ConnectionStats = newStats();
  readonly maxBody: number;
  readonly maxSessions: number;
  readonly idleTimeoutMs: number;

  readonly #sessions = new Map<string, Session>(); // least recently used first
  readonly #seen = new Map<string, number>(); // each session's last request (performance.now())
  #sweeper: NodeJS.Timeout | null = null;
  readonly #factory: () => Session;
  readonly #errorType: number;
  readonly #helloType: number;
  readonly #header = Buffer.alloc(HEADER_SIZE);
  #sock: zmq.Router | null = null;
  #zap: zmq.Reply | null = null;
  #inode: number | null = null;
  #loop: Promise<void> | null = null;
  #closed: Promise<void> | null = null;

  constructor(url: string, host: EnvHost, options: ListenOptions = {}, maxSessions = MAX_SESSIONS) {
    this.url = url;
    this.address = parseUrl(url);
    this.#factory = sessionsOf(host);
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.maxSessions = maxSessions;
    this.idleTimeoutMs = serverLimits(options.limits).idleTimeoutMs; // RangeError when not > 0
    const ids = messageIds(host.schema);
    this.#errorType = ids.ERROR;
    this.#helloType = ids.HELLO_REQ;
  }

  /** Bind now; refuses a live ipc path or a tcp port in use, and insecure remote binds. */
  async start(allowRemote = false): Promise<void> {
    const address = this.address;
    const curve = serverCurve(address);
    if (address.transport === "tcp" && !address.isLoopback && curve === null) {
      if (!address.flag("allow_insecure") && !allowRemote) {
        throw new ConnectError(
          `refusing to bind ${address.host} without CURVE keys: anyone who can reach it could drive ` +
            "the envs; give ?server_key=FILE&clients=DIR (or " +
            `${ENV_SERVER_SECRET}) or add ?allow_insecure=1`,
        );
      }
    }
    if (address.transport === "ipc") await claimPath(address.path);
    const context = new zmq.Context({ ioThreads: 1 });
    const sock = new zmq.Router({
      ...commonOptions(address, this.maxBody),
      context,
      handover: true, // a reconnecting client keeps its session
      mandatory: true, // a reply to a gone client fails (EHOSTUNREACH): the reply is dropped
      sendTimeout: 0, // never wait on a client that does not read its replies
    });
    let zap: zmq.Reply | null = null;
    try {
      if (curve !== null) {
        zap = new zmq.Reply({ context, linger: 0 });
        await zap.bind(ZAP_ENDPOINT); // before the Router binds: no handler would admit anyone
        void serveZap(zap, curve.allowed);
        sock.curveServer = true;
        sock.curvePublicKey = binary(curve.publicKey);
        sock.curveSecretKey = binary(curve.secretKey);
        sock.zapDomain = "transport";
      }
      await this.#bind(sock, address);
    } catch (error) {
      sock.close();
      zap?.close();
      throw error;
    }
    this.#sock = sock;
    this.#zap = zap;
    this.#loop = this.#serve(sock);
    this.#sweeper = setInterval(() => this.#sweep(), SWEEP_INTERVAL_MS);
    this.#sweeper.unref();
  }

  async #bind(sock: zmq.Router, address: Address): Promise<void> {
    let old: number | null = null;
    if (address.transport === "ipc") {
      try {
        old = process.umask(0o177); // the file is born 0600
      } catch {
        old = null; // worker threads cannot change the umask: chmod below still applies
      }
    }
    try {
      await sock.bind(address.endpoint);
    } catch (error) {
      const where = address.path || `${address.host}:${address.port}`;
      const code = errorCode(error);
      if (code === "EADDRINUSE") throw new ConnectError(`${where} is in use (EADDRINUSE)`);
      throw new ConnectError(`cannot bind ${where}: ${(error as Error).message}`);
    } finally {
      if (old !== null) process.umask(old);
    }
    if (address.transport === "ipc") {
      chmodSync(address.path, 0o600);
      this.#inode = statSync(address.path).ino;
    } else {
      const endpoint = sock.lastEndpoint ?? "";
      this.url = address.withPort(Number(endpoint.slice(endpoint.lastIndexOf(":") + 1)));
    }
  }

  async #serve(sock: zmq.Router): Promise<void> {
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await sock.receive();
      } catch (error) {
        if (this.#closed !== null || sock.closed) return;
        process.emitWarning(`zmq listener ${this.url}: receive failed: ${errorCode(error)}`);
        continue;
      }
      try {
        this.#serveOne(sock, parts);
      } catch (error) {
        process.emitWarning(`zmq listener ${this.url}: ${String(error)}`);
      }
    }
  }

  /** Handle one message `[identity, (""), header, body]` and answer it. */
  #serveOne(sock: zmq.Router, parts: Buffer[]): void {
    const identity = parts[0] as Buffer;
    if (parts.length < 2) return;
    let at = 1;
    const envelope = (parts[1] as Buffer).byteLength === 0 && parts.length > 2; // a REQ client
    if (envelope) at = 2;
    const header = parts[at] as Buffer;
    const n = header.byteLength;
    let msgType = 0;
    let msgId = 0;
    let bodyLen = 0;
    if (n >= HEADER_SIZE) {
      msgType = header[0] as number;
      msgId = readU32(header, 1);
      bodyLen = readU32(header, 5);
    }
    let problem: [number, string] | null = null;
    if (n !== HEADER_SIZE) problem = [ErrorCode.BAD_FRAME, `the header part is ${n} bytes, expected 9`];
    else if (bodyLen > this.maxBody) {
      problem = [ErrorCode.BODY_TOO_LARGE, `body_len ${bodyLen} exceeds the maximum ${this.maxBody}`];
    }
    let body: Buffer = EMPTY;
    if (parts.length > at + 1) {
      body = parts[at + 1] as Buffer;
      if (problem === null && body.byteLength !== bodyLen) {
        problem = [ErrorCode.BAD_FRAME, `the body part is ${body.byteLength} bytes, its header says ${bodyLen}`];
      }
      if (parts.length > at + 2 && problem === null) {
        problem = [ErrorCode.BAD_FRAME, "a frame is [header, body]: 2 parts"];
      }
    } else if (problem === null && bodyLen) {
      problem = [ErrorCode.BAD_FRAME, `header says ${bodyLen} body bytes, no body part`];
    }
    const key = identity.toString("latin1");
    if (problem !== null) {
      const [code, text] = problem;
      if (CLOSING_ERRORS.has(code)) this.#drop(key);
      this.#reply(sock, identity, envelope, this.#errorType, msgId, encodeError(code, text), null);
      return;
    }
    if (msgType === this.#helloType && isGoodbye(body)) {
      this.#drop(key); // the client left: its envs are closed now, not at LRU or idle
      return;
    }
    if (msgType !== this.#helloType && !this.#sessions.has(key)) {
      // an unknown client (or one whose session was dropped): no session is made for it
      const error = encodeError(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first");
      this.#reply(sock, identity, envelope, this.#errorType, msgId, error, null);
      return;
    }
    const session = this.#sessionFor(key, msgType);
    if (typeof session === "string") {
      const error = encodeError(ErrorCode.INTERNAL, session);
      this.#reply(sock, identity, envelope, this.#errorType, msgId, error, null);
      return;
    }
    this.#seen.set(key, performance.now());
    const type = session.handle(msgType, body, 0, bodyLen);
    const hello = msgType === this.#helloType;
    if (type === LATER) {
      // a RECV waiting for worker threads: answer when it is ready (other clients go on)
      void (session.later as Promise<number>).then((later) => {
        if (this.#sessions.get(key) === session) this.#seen.set(key, performance.now());
        if (session.closing) this.#drop(key);
        this.#reply(sock, identity, envelope, later, msgId, session.body(), session, hello);
      });
      return;
    }
    if (session.closing) this.#drop(key);
    this.#reply(sock, identity, envelope, type, msgId, session.body(), session, hello);
  }

  /** Forget a client's session and close its envs (as a stream server does when its
   * connection ends: zmq has no connection, so this is when the session is dropped). */
  #drop(key: string): void {
    const session = this.#sessions.get(key);
    if (session === undefined) return;
    this.#sessions.delete(key);
    this.#seen.delete(key);
    session.runtime.close();
  }

  /** Close the sessions that sent nothing for idleTimeoutMs (least recently used first: the
   * look stops at the first one still in time; one awaiting its envs is not idle). */
  #sweep(): void {
    const cutoff = performance.now() - this.idleTimeoutMs;
    const expired: string[] = [];
    for (const [key, session] of this.#sessions) {
      if ((this.#seen.get(key) ?? cutoff) > cutoff) break;
      if (session.later === null) expired.push(key);
    }
    for (const key of expired) this.#drop(key);
  }

  /** The client's session, made on its first message; why not, when it cannot be made. */
  #sessionFor(key: string, msgType: number): Session | string {
    const sessions = this.#sessions;
    let session = sessions.get(key);
    if (session !== undefined) {
      if (!(session.helloDone && msgType === session.ids.HELLO_REQ)) {
        if (sessions.size > 1) {
          sessions.delete(key); // most recently used last
          sessions.set(key, session);
        }
        return session;
      }
      this.#drop(key); // a second HELLO: a fresh session, fresh envs
    }
    try {
      session = this.#factory();
    } catch (error) {
      process.emitWarning(`cannot create a session for a new client on ${this.url}: ${String(error)}`);
      return cannotMakeEnvs(error);
    }
    this.stats.connections += 1;
    sessions.set(key, session);
    while (sessions.size > this.maxSessions) {
      this.#drop(sessions.keys().next().value as string);
    }
    return session;
  }

  #reply(
    sock: zmq.Router,
    identity: Buffer,
    envelope: boolean,
    msgType: number,
    msgId: number,
    body: Buffer,
    session: Session | null,
    forgetIfGone = false,
  ): void {
    packHeader(this.#header, 0, msgType, msgId, body.byteLength);
    // a body we built for this reply alone is never reused: hand it over as it is
    const { part, given } = session === null ? { part: body, given: false } : sendable(body);
    const parts = envelope ? [identity, EMPTY, this.#header, part] : [identity, this.#header, part];
    // sendTimeout 0: the send happens now (header and identity copied); failures come async
    sock.send(parts).then(undefined, (error: unknown) => {
      const code = errorCode(error);
      // EHOSTUNREACH: its connection is down, not necessarily the client: one that comes back
      // with the same routing id (a cut link) goes on with its session, which otherwise waits
      // for the idle timeout like any silent client's
      if (code !== "EHOSTUNREACH") {
        process.emitWarning(`dropped a reply to a client whose queue is full: ${code}`);
      } else if (forgetIfGone) {
        // a HELLO_RESP: it never learnt of this session (a retry sends HELLO again)
        const key = identity.toString("latin1");
        if (session !== null && this.#sessions.get(key) === session) this.#drop(key);
      }
    });
    if (given && session !== null) {
      session.detachBuffer(); // libzmq owns the old buffer until it has sent it
      this.stats.detached += 1;
    }
  }

  /** Stop serving, close the sockets and remove the ipc file (if still ours). */
  close(): Promise<void> {
    if (this.#closed !== null) return this.#closed;
    this.#closed = (async () => {
      if (this.#sweeper !== null) clearInterval(this.#sweeper);
      this.#sock?.close();
      this.#zap?.close();
      await this.#loop?.catch(() => undefined);
      for (const key of [...this.#sessions.keys()]) this.#drop(key); // their envs
      if (this.address.transport === "ipc" && this.#inode !== null) {
        try {
          if (statSync(this.address.path).ino === this.#inode) unlinkSync(this.address.path);
        } catch {
          // already gone (libzmq unlinks the ipc file it bound on close)
        }
      }
    })();
    return this.#closed;
  }

  /** Sessions alive now (tests). */
  get sessionCount(): number {
    return this.#sessions.size;
  }
}

/** Bind a Router at `url` (ready for clients when this resolves). */
export async function listen(url: string, host: EnvHost, options: ListenOptions = {}): Promise<ZmqListener> {
  const listener = new ZmqListener(url, host, options);
  await listener.start(options.allowRemote ?? false);
  return listener;
}
