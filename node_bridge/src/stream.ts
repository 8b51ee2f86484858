/**
 * Frames over a connected stream socket (Unix domain, TCP): shared by every stream backend
 * (transport/stream.py).
 *
 * `FrameReader` keeps the received chunks in a queue and hands out each frame's body in place:
 * a frame that arrived whole in one chunk is parsed from that chunk (no concatenation); only a
 * frame split across chunks is assembled, once, into a reused buffer (no quadratic copying). A
 * body_len over the maximum is refused as soon as the header is there, before the body is
 * buffered.
 *
 * `serveConnection` is the server loop: it answers frames through a `Session` and writes each
 * response frame from the session's buffer in one `write`; while `write()` returns false it
 * stops reading (`socket.pause()`) and resumes on 'drain', so a client that pipelines requests
 * without reading cannot make the server buffer without bound.
 *
 * `StreamChannel` is the client side: numbered requests, each awaited with a deadline
 * (`TransportTimeoutError`), `PeerGoneError` when the connection closes or resets. A response
 * is copied once, from Node's chunks into the channel's aligned receive buffer: a frame split
 * across chunks is assembled there directly (the reader's `AssemblySink`), one that came in one
 * chunk is copied there.
 */

import type { Socket } from "node:net";
import {
  BadFrameError,
  PeerGoneError,
  ProtocolError,
  TransportTimeoutError,
  replyTooLarge,
  requestInFlight,
} from "./errors";
import {
  BODY_OFFSET,
  DEFAULT_MAX_BODY,
  ErrorCode,
  HEADER_SIZE,
  MESSAGE_IDS,
  encodeError,
  packHeader,
  readU32,
} from "./protocol";
import type { SchemaModule } from "./codec";
import { LATER, type Session } from "./runtime/session";

/** Seconds a refused connection is drained before it is destroyed (the peer reads the ERROR). */
const LINGER_MS = 1000;

/**
 * Where a frame body of `length` bytes that arrived in several chunks is assembled: a buffer
 * with room for it at the returned offset.
 */
export type AssemblySink = (length: number) => [Buffer, number];

/** Incremental frame parser over a queue of received chunks. */
export class FrameReader {
  readonly maxBody: number;
  /** The last frame `next()` returned: type, id, and its body at `body[offset, offset+length)`. */
  msgType = 0;
  msgId = 0;
  body: Buffer = Buffer.alloc(0);
  offset = 0;
  length = 0;
  /** The body_len of the frame `next()` last refused as over `maxBody` (see `drop`). */
  refusedLength = 0;

  #chunks: Buffer[] = [];
  #first = 0; // index of the first live chunk
  #at = 0; // read position in the first live chunk
  #available = 0;
  readonly #header = Buffer.alloc(HEADER_SIZE);
  #assembly = Buffer.alloc(0);
  readonly #sink: AssemblySink | null;
  #dropping = 0; // bytes of a refused frame still to be skipped as they arrive

  /**
   * `sink`: where a frame split across chunks is assembled (a client's receive buffer, so the
   * body lands where its views are and is not copied again); without one, a reused buffer of
   * the reader's own.
   */
  constructor(maxBody = DEFAULT_MAX_BODY, sink: AssemblySink | null = null) {
    this.maxBody = maxBody;
    this.#sink = sink;
  }

  /** Bytes received and not yet returned as frames. */
  get available(): number {
    return this.#available;
  }

  push(chunk: Buffer): void {
    if (chunk.byteLength === 0) return;
    this.#chunks.push(chunk);
    this.#available += chunk.byteLength;
  }

  /**
   * Parse the next complete frame into `msgType`, `msgId`, `body`, `offset`, `length`; false
   * when it has not fully arrived. Throws `BadFrameError` (with `msgId`) for a body_len over the
   * maximum, as soon as the header is complete.
   */
  next(): boolean {
    if (this.#dropping > 0) {
      const n = Math.min(this.#dropping, this.#available);
      this.#skip(n);
      this.#dropping -= n;
      if (this.#dropping > 0) return false;
    }
    if (this.#available < HEADER_SIZE) return false;
    const chunk = this.#chunks[this.#first] as Buffer;
    const at = this.#at;
    let header: Buffer;
    let hat: number;
    if (chunk.byteLength - at >= HEADER_SIZE) {
      header = chunk;
      hat = at;
    } else {
      this.#peek(this.#header, HEADER_SIZE);
      header = this.#header;
      hat = 0;
    }
    const msgType = header[hat] as number;
    const msgId = readU32(header, hat + 1);
    const bodyLen = readU32(header, hat + 5);
    if (bodyLen > this.maxBody) {
      const error = new BadFrameError(`body_len ${bodyLen} exceeds the maximum ${this.maxBody}`);
      error.msgId = msgId;
      this.refusedLength = bodyLen;
      throw error;
    }
    const frameLen = HEADER_SIZE + bodyLen;
    if (this.#available < frameLen) return false;
    this.msgType = msgType;
    this.msgId = msgId;
    this.length = bodyLen;
    if (chunk.byteLength - at >= frameLen) {
      // the common case: the whole frame is in one chunk; its body is used in place
      this.body = chunk;
      this.offset = at + HEADER_SIZE;
      this.#skip(frameLen);
      return true;
    }
    this.#skip(HEADER_SIZE);
    if (this.#sink !== null) {
      const [target, offset] = this.#sink(bodyLen);
      this.#take(target, bodyLen, offset);
      this.body = target;
      this.offset = offset;
      return true;
    }
    if (this.#assembly.byteLength < bodyLen) {
      this.#assembly = Buffer.alloc(Math.max(bodyLen, 2 * this.#assembly.byteLength, 4096));
    }
    this.#take(this.#assembly, bodyLen);
    this.body = this.#assembly;
    this.offset = 0;
    return true;
  }

  /**
   * Skip the frame whose header `next()` just refused (its body over `maxBody`), as its bytes
   * arrive, without holding them: the frames after it are read as usual (a client keeps its
   * connection after a reply too large; Python: `FramedSocket.drop_frame`).
   */
  drop(): void {
    this.#dropping = HEADER_SIZE + this.refusedLength;
  }

  /** Drop everything buffered (a connection being closed). */
  clear(): void {
    this.#dropping = 0;
    this.#chunks = [];
    this.#first = 0;
    this.#at = 0;
    this.#available = 0;
  }

  #peek(target: Buffer, count: number): void {
    let index = this.#first;
    let at = this.#at;
    let filled = 0;
    while (filled < count) {
      const chunk = this.#chunks[index] as Buffer;
      const n = Math.min(count - filled, chunk.byteLength - at);
      chunk.copy(target, filled, at, at + n);
      filled += n;
      index += 1;
      at = 0;
    }
  }

  #take(target: Buffer, count: number, offset = 0): void {
    let filled = 0;
    while (filled < count) {
      const chunk = this.#chunks[this.#first] as Buffer;
      const n = Math.min(count - filled, chunk.byteLength - this.#at);
      chunk.copy(target, offset + filled, this.#at, this.#at + n);
      filled += n;
      this.#skip(n);
    }
  }

  #skip(count: number): void {
    this.#available -= count;
    let rest = count;
    while (rest > 0) {
      const chunk = this.#chunks[this.#first] as Buffer;
      const left = chunk.byteLength - this.#at;
      if (rest < left) {
        this.#at += rest;
        return;
      }
      rest -= left;
      this.#chunks[this.#first] = undefined as unknown as Buffer;
      this.#first += 1;
      this.#at = 0;
    }
    if (this.#first === this.#chunks.length) {
      this.#chunks.length = 0;
      this.#first = 0;
    } else if (this.#first > 64) {
      this.#chunks = this.#chunks.slice(this.#first);
      this.#first = 0;
    }
  }
}

/** Counters a listener keeps over its connections (tests check that backpressure engaged). */
export interface ConnectionStats {
  /** Connections accepted so far. */
  connections: number;
  /** Times a connection stopped reading because its socket's write buffer was full. */
  pauses: number;
  /** Connections paused right now. */
  paused: number;
  /** Response buffers replaced because a write was still pending (not the hot path). */
  detached: number;
}

export function newStats(): ConnectionStats {
  return { connections: 0, pauses: 0, paused: 0, detached: 0 };
}

/** What a client whose envs the server cannot make is told (Python: the same words). */
export function cannotMakeEnvs(error: unknown): string {
  const what = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return `the server cannot make this client's envs: ${what}`;
}

/** Half-close, drain what the peer still sends for a moment, then destroy. */
export function linger(socket: Socket): void {
  if (socket.destroyed) return;
  socket.removeAllListeners("data");
  socket.on("data", () => undefined);
  socket.on("error", () => undefined);
  socket.resume();
  socket.end();
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  timer.unref();
  socket.once("close", () => clearTimeout(timer));
}

// -- server limits (transport/backends/socket_listener.py) ---------------------------------------

/**
 * What one socket server accepts from its clients, the same defaults as the Python server:
 * `maxConnections` served at once (one more gets a "server busy" ERROR, on http a 503, and is
 * closed), `idleTimeoutMs` a connection may wait between requests, `readTimeoutMs` a started
 * request (frame, or HTTP head and body) has to arrive completely and a response to be taken.
 */
export interface ServerLimits {
  readonly maxConnections: number;
  readonly idleTimeoutMs: number;
  readonly readTimeoutMs: number;
}

export const DEFAULT_SERVER_LIMITS: ServerLimits = {
  maxConnections: 1024,
  idleTimeoutMs: 600_000,
  readTimeoutMs: 30_000,
};

/** Milliseconds between two looks at the connections' deadlines (a timeout fires this late). */
export const SWEEP_INTERVAL_MS = 200;

/** The limits with defaults filled in; a non-positive or non-numeric one is a RangeError. */
export function serverLimits(given: Partial<ServerLimits> = {}): ServerLimits {
  const limits = { ...DEFAULT_SERVER_LIMITS };
  for (const key of Object.keys(DEFAULT_SERVER_LIMITS) as Array<keyof ServerLimits>) {
    const value = given[key];
    if (value === undefined) continue;
    const integral = key === "maxConnections";
    if (typeof value !== "number" || !Number.isFinite(value) || value <= 0 || (integral && !Number.isInteger(value))) {
      const what = integral ? "a positive integer" : "a positive number of milliseconds";
      throw new RangeError(`${key} must be ${what}, not ${String(value)}`);
    }
    (limits as Record<keyof ServerLimits, number>)[key] = value;
  }
  return limits;
}

const IDLE = 0;
const READING = 1;
const SENDING = 2;

/**
 * When one connection's current wait must end (performance.now() ms): kept by its serving code
 * (idle between requests, reading a started request, sending a response that the client does
 * not take) and enforced by the listener's `ConnectionGuard` sweep. An idle connection whose
 * bytesRead moved is reading from the next sweep on (http: the parser reads in C++).
 */
export class ConnectionWatch {
  state = IDLE;
  deadline: number;
  mark = 0;
  readonly #limits: ServerLimits;

  constructor(limits: ServerLimits) {
    this.#limits = limits;
    this.deadline = performance.now() + limits.idleTimeoutMs;
  }

  /** Nothing of the next request yet (`bytesRead`: the socket's count now). */
  idle(bytesRead: number): void {
    this.state = IDLE;
    this.mark = bytesRead;
    this.deadline = performance.now() + this.#limits.idleTimeoutMs;
  }

  /** A request has started: it must be complete within readTimeoutMs of its first bytes. */
  reading(restart = false): void {
    if (this.state === READING && !restart) return;
    this.state = READING;
    this.deadline = performance.now() + this.#limits.readTimeoutMs;
  }

  /** A response waits for the client to take it (a full socket buffer). */
  sending(): void {
    this.state = SENDING;
    this.deadline = performance.now() + this.#limits.readTimeoutMs;
  }
}

/** Why a connection is closed by its guard. */
export type Expiry = "idle" | "read" | "send";

/**
 * The connection cap and the timeouts of one listener: `admit` a socket (null over the cap),
 * `release` it when it closes; every SWEEP_INTERVAL_MS the sockets past their deadline are
 * handed to `onExpire` (the backend answers or closes them).
 */
export class ConnectionGuard {
  readonly limits: ServerLimits;
  readonly #watches = new Map<Socket, ConnectionWatch>();
  readonly #onExpire: (socket: Socket, why: Expiry) => void;
  readonly #timer: NodeJS.Timeout;
  /** Connections refused over the cap, and closed by a timeout, so far. */
  refused = 0;
  timedOut = 0;

  constructor(limits: ServerLimits, onExpire: (socket: Socket, why: Expiry) => void) {
    this.limits = limits;
    this.#onExpire = onExpire;
    this.#timer = setInterval(() => this.sweep(), SWEEP_INTERVAL_MS);
    this.#timer.unref();
  }

  get open(): number {
    return this.#watches.size;
  }

  /** A watch for a new connection, or null when maxConnections are open (refuse it). */
  admit(socket: Socket): ConnectionWatch | null {
    if (this.#watches.size >= this.limits.maxConnections) {
      this.refused += 1;
      return null;
    }
    const watch = new ConnectionWatch(this.limits);
    this.#watches.set(socket, watch);
    socket.once("close", () => this.#watches.delete(socket));
    return watch;
  }

  /** The text a refused client reads. */
  busyText(): string {
    return (
      `server busy: ${this.limits.maxConnections} connections are open, the server's ` +
      "max_connections; retry later"
    );
  }

  /** The text a client whose request did not arrive in time reads. */
  readTimeoutText(): string {
    return (
      `the request did not arrive completely within read_timeout ${this.limits.readTimeoutMs / 1000} s; ` +
      "closing the connection"
    );
  }

  sweep(): void {
    const now = performance.now();
    for (const [socket, watch] of this.#watches) {
      if (watch.state === IDLE && socket.bytesRead !== watch.mark) watch.reading();
      if (watch.deadline > now) continue;
      const why: Expiry = watch.state === IDLE ? "idle" : watch.state === READING ? "read" : "send";
      this.#watches.delete(socket);
      this.timedOut += 1;
      try {
        this.#onExpire(socket, why);
      } catch {
        socket.destroy();
      }
    }
  }

  close(): void {
    clearInterval(this.#timer);
    this.#watches.clear();
  }
}

/** An ERROR frame with `code` and `text`, answering request `msgId` (0: no request). */
export function errorFrame(code: number, text: string, msgId = 0): Buffer {
  const body = encodeError(code, text);
  const frame = Buffer.alloc(HEADER_SIZE + body.byteLength);
  packHeader(frame, 0, MESSAGE_IDS.ERROR, msgId, body.byteLength);
  body.copy(frame, HEADER_SIZE);
  return frame;
}

/** Answer one connection's frames through `session` until it closes or must be closed. */
export function serveConnection(
  socket: Socket,
  session: Session,
  maxBody: number,
  stats: ConnectionStats = newStats(),
  watch: ConnectionWatch | null = null,
): void {
  const reader = new FrameReader(maxBody);
  let blocked = false;
  let done = false;

  const finish = (): void => {
    if (done) return;
    done = true;
    if (blocked) stats.paused -= 1;
    blocked = false;
    reader.clear();
    linger(socket);
  };

  /**
   * Write one response frame (the session's own buffer: no copy). True when the kernel took it
   * all; false when part of it is still queued: the queued write holds the session's buffer, so
   * nothing is answered (nothing written into that buffer) until the write completes: `pause()`
   * until then. A lock-step client sends nothing before it has read the whole response anyway,
   * so waiting costs it nothing, and no fresh response buffer is allocated per big response.
   */
  const send = (frame: Buffer): boolean => {
    socket.write(frame, onWritten);
    return socket.writableLength === 0;
  };

  let waiting = false; // a response is pending (Session.later): the next frames wait for it
  const pump = (): void => {
    let answered = false;
    while (!blocked && !done && !waiting) {
      let ready: boolean;
      try {
        ready = reader.next();
      } catch (error) {
        if (!(error instanceof BadFrameError)) throw error;
        const type = session.error(ErrorCode.BODY_TOO_LARGE, error.message);
        send(session.frame(type, error.msgId));
        finish();
        return;
      }
      if (!ready) break;
      answered = true;
      let type: number;
      try {
        type = session.handle(reader.msgType, reader.body, reader.offset, reader.length);
      } catch (error) {
        // `handle` never throws but for a bug: the request gets INTERNAL and the connection
        // closes (the session's state is unknown), never a request left unanswered
        const why = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
        socket.write(errorFrame(ErrorCode.INTERNAL, `the server failed: ${why}`, reader.msgId));
        finish();
        return;
      }
      if (type === LATER) {
        waiting = true;
        const msgId = reader.msgId;
        void (session.later as Promise<number>).then((later) => {
          waiting = false;
          if (done) return;
          const ok = send(session.frame(later, msgId));
          if (session.closing) finish();
          else if (!ok) pause();
          pump();
        });
        break;
      }
      const ok = send(session.frame(type, reader.msgId));
      if (session.closing) {
        finish();
        return;
      }
      if (!ok) pause();
    }
    if (watch === null || done) return;
    if (blocked) watch.sending();
    else if (reader.available === 0) watch.idle(socket.bytesRead);
    else watch.reading(answered); // the rest of a frame: its clock starts with its first bytes
  };

  /** The socket did not take a whole response: stop reading until it has been written. */
  const pause = (): void => {
    if (blocked) return;
    blocked = true;
    stats.pauses += 1;
    stats.paused += 1;
    socket.pause();
  };

  /** A response write completed: when the socket holds nothing more, answer on. */
  const onWritten = (): void => {
    if (done || !blocked || socket.writableLength > 0) return;
    blocked = false;
    stats.paused -= 1;
    socket.resume();
    pump();
  };

  socket.on("data", (chunk: Buffer) => {
    if (done) return;
    reader.push(chunk);
    pump();
  });
  socket.on("error", () => undefined); // 'close' follows
  socket.on("close", () => {
    if (!done) {
      done = true;
      if (blocked) stats.paused -= 1;
      blocked = false;
      reader.clear();
    }
    session.runtime.close(); // the client left: the envs made for it are closed
  });
}

/** The longest delay Node's timers take (2**31-1 ms, about 24.8 days): a longer one fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * A client's `timeoutMs` as its waits use it (Python: the same rule for `timeout`): undefined is
 * `fallback` (the default), null no deadline; otherwise a number > 0, where Infinity or anything
 * above MAX_TIMER_MS means no deadline too (a timer that long would fire at once). 0, negatives
 * and NaN are a RangeError, a non-number a TypeError, both naming `timeoutMs` and the value.
 */
export function timeoutOption(value: unknown, fallback: number | null = 10_000): number | null {
  if (value === undefined) return fallback;
  if (value === null) return null;
  const shown = typeof value === "string" ? JSON.stringify(value) : String(value);
  if (typeof value !== "number") {
    throw new TypeError(
      `timeoutMs must be a number of milliseconds > 0, or null for no deadline, not ${typeof value} ${shown}`,
    );
  }
  if (Number.isNaN(value) || value <= 0) {
    throw new RangeError(`timeoutMs must be a number of milliseconds > 0 (or null for no deadline), not ${shown}`);
  }
  return value > MAX_TIMER_MS ? null : value;
}

/** Options of a client channel. */
export interface ChannelOptions {
  /** Milliseconds any one wait may take; null waits forever. Default 10000 (`timeoutOption`). */
  readonly timeoutMs?: number | null;
  /** Largest response body accepted (bytes). */
  readonly maxBody?: number;
}

/** A SAME_STEP final result: the env whose episode ended and its owned, decoded result. */
export interface Final<T = unknown> {
  readonly index: number;
  readonly result: T;
}

/**
 * Results that live outside the channel's receive buffer (shm:// slots): the Client reads them
 * through this instead of the response body.
 */
export interface ChannelRecords {
  /** Records there are (k >= N: an shm region may have seat slots for STEP_MULTI). */
  readonly count: number;
  /** A zero-copy view of env `index`'s result of the last response (the same object every time). */
  view(index: number): unknown;
  /** Env `index`'s result decoded into owned values. */
  decode(index: number): unknown;
  /** SAME_STEP: the envs whose episode the last step ended, with their owned final results. */
  finals(): Final<unknown>[];
  /** OBSERVE: each env's info map. */
  infos(): Array<Record<string, unknown>>;
}

/** What a backend gives the client: one request/response exchange at a time. */
export interface Channel {
  /** The server's HELLO info (set by the handshake). */
  info: Record<string, unknown>;
  /** The receive buffer: the last response body is at BODY_OFFSET, `bodyLength` bytes. */
  readonly buffer: Buffer;
  readonly bodyLength: number;
  /** Changes when `buffer` is replaced (views of the old one must be rebuilt). */
  readonly generation: number;
  /** Where results live when not in the response body (shm://); absent for stream backends. */
  readonly records?: ChannelRecords;
  /** Send a request; resolves to the response's msg_type (its body: `buffer`, `bodyLength`). */
  request(msgType: number, body: Uint8Array): Promise<number>;
  close(): void | Promise<void>;
  /** Queue a goodbye before `close` (zmq: its server is not told when a client goes). */
  sayGoodbye?(msgType: number, body: Uint8Array): void;
  /** The schema the channel speaks, where it carries one (shm: the region's; HTTP: its headers'). */
  readonly schema?: SchemaModule;
  /** True where frames carry no schema (unix, zmq): a discovering connect keeps the channel. */
  readonly speaksAnySchema?: boolean;
  /** Speak `schema` from now on, on this connection (HTTP: the fingerprint header). */
  adopt?(schema: SchemaModule): void;
}

/** A response body as a Buffer view of the channel's receive buffer (valid until the next call). */
export function responseBody(channel: Channel): Buffer {
  return channel.buffer.subarray(BODY_OFFSET, BODY_OFFSET + channel.bodyLength);
}

/** The client side of a stream backend over one connected socket. */
export class StreamChannel implements Channel {
  info: Record<string, unknown> = {};
  readonly speaksAnySchema = true;
  buffer: Buffer;
  bodyLength = 0;
  generation = 0;
  readonly timeoutMs: number | null;

  readonly #socket: Socket;
  readonly #reader: FrameReader;
  #send = Buffer.alloc(HEADER_SIZE + 64);
  #sends = new Map<number, Buffer>();
  #nextId = 1;
  #pendingId = -1;
  #resolve: ((type: number) => void) | null = null;
  #reject: ((error: Error) => void) | null = null;
  #timer: NodeJS.Timeout | null = null;
  #gone = "";
  /** msg_ids of requests that timed out: their late replies are dropped when they come. */
  readonly #late = new Set<number>();

  constructor(socket: Socket, options: ChannelOptions = {}) {
    this.#socket = socket;
    this.timeoutMs = timeoutOption(options.timeoutMs);
    // an idle client does not keep node running: the socket holds the event loop only while a
    // request waits for its response (`request` refs it, settling unrefs it)
    socket.unref();
    // a frame split across chunks (every big batch) is assembled straight into `buffer`
    this.#reader = new FrameReader(options.maxBody ?? DEFAULT_MAX_BODY, (length) => [this.#room(length), BODY_OFFSET]);
    this.buffer = Buffer.alloc(BODY_OFFSET + (64 << 10));
    socket.setNoDelay?.(true);
    socket.on("data", (chunk: Buffer) => this.#onData(chunk));
    socket.on("error", (error: NodeJS.ErrnoException) => {
      this.#abandon(new PeerGoneError(`the server reset the connection (${error.code ?? error.message})`));
    });
    socket.on("close", () => {
      this.#abandon(
        new PeerGoneError(
          this.#reader.available
            ? "peer closed the connection in the middle of a frame"
            : "peer closed the connection",
        ),
      );
    });
  }

  request(msgType: number, body: Uint8Array): Promise<number> {
    if (this.#gone) return Promise.reject(new PeerGoneError(this.#gone));
    if (this.#resolve !== null) {
      return Promise.reject(
        requestInFlight(),
      );
    }
    const msgId = this.#nextId;
    this.#nextId = (msgId + 1) >>> 0;
    const length = body.byteLength;
    if (HEADER_SIZE + length > this.#send.byteLength) {
      this.#send = Buffer.alloc(Math.max(HEADER_SIZE + length, 2 * this.#send.byteLength));
      this.#sends.clear();
    }
    const send = this.#send;
    packHeader(send, 0, msgType, msgId, length);
    send.set(body, HEADER_SIZE);
    let frame = this.#sends.get(length);
    if (frame === undefined) {
      frame = send.subarray(0, HEADER_SIZE + length);
      if (this.#sends.size > 64) this.#sends.clear();
      this.#sends.set(length, frame);
    }
    const promise = new Promise<number>((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    this.#pendingId = msgId;
    this.#socket.ref();
    this.#socket.write(frame);
    if (this.#socket.writableLength > 0) {
      // a pending write holds the send buffer: use a fresh one for the next request
      this.#send = Buffer.alloc(this.#send.byteLength);
      this.#sends = new Map();
    }
    this.#arm();
    return promise;
  }

  close(): void {
    if (!this.#gone) this.#gone = "the channel is closed";
    this.#fail(new PeerGoneError("the channel was closed while a request was outstanding"));
    this.#socket.destroy();
    if (this.#timer !== null) clearTimeout(this.#timer);
  }

  #arm(): void {
    if (this.timeoutMs === null) return;
    if (this.#timer === null) {
      this.#timer = setTimeout(() => this.#onTimeout(), this.timeoutMs);
      this.#timer.unref();
    } else {
      this.#timer.refresh();
    }
  }

  /**
   * The request timed out: it fails, the connection stays (resynchronisation): its late reply is
   * dropped by msg_id when it comes, and a frame half-read meanwhile is finished by the reader.
   */
  #onTimeout(): void {
    if (this.#resolve === null) return;
    if (this.#late.size >= 1024) this.#late.clear(); // a server that never answers: bounded
    this.#late.add(this.#pendingId);
    this.#fail(new TransportTimeoutError(`peer sent no complete response for ${this.timeoutMs} ms`));
  }

  #onData(chunk: Buffer): void {
    const reader = this.#reader;
    reader.push(chunk);
    let ready: boolean;
    for (;;) {
      try {
        ready = reader.next();
      } catch (error) {
        // a reply over maxBody to the request outstanding (or a late one): dropped as it
        // arrives, the connection kept; any other frame refused puts the stream out of step
        const id = error instanceof BadFrameError ? error.msgId : -1;
        const late = this.#late.delete(id);
        if (!late && (this.#resolve === null || id !== this.#pendingId)) {
          this.#abandon(error as Error);
          return;
        }
        reader.drop();
        if (!late) this.#fail(replyTooLarge(reader.refusedLength, reader.maxBody, id));
        continue;
      }
      if (!ready) return;
      if (!this.#late.delete(reader.msgId)) break;
      // the late reply to a request that timed out: dropped
    }
    // an ERROR with msg_id 0 answers no request: the server refused or closed the connection
    // (max_connections, read_timeout) and says why; it is the outstanding request's answer
    const connectionError = reader.msgId === 0 && reader.msgType === MESSAGE_IDS.ERROR;
    if (this.#resolve === null || (reader.msgId !== this.#pendingId && !connectionError)) {
      this.#abandon(
        new ProtocolError(
          this.#resolve === null
            ? `unsolicited frame (msg_id ${reader.msgId})`
            : `response msg_id ${reader.msgId} does not echo request ${this.#pendingId}`,
        ),
      );
      return;
    }
    const length = reader.length;
    if (reader.body !== this.buffer) {
      // the frame came in one chunk of Node's: the one copy, into the aligned buffer
      reader.body.copy(this.#room(length), BODY_OFFSET, reader.offset, reader.offset + length);
    }
    this.bodyLength = length;
    const resolve = this.#resolve;
    this.#resolve = null;
    this.#reject = null;
    this.#socket.unref();
    resolve(reader.msgType);
    if (reader.available) {
      this.#abandon(new ProtocolError("the server sent bytes beyond the response"));
    }
  }

  /** The receive buffer, grown (a new generation) when a body of `length` does not fit. */
  #room(length: number): Buffer {
    if (BODY_OFFSET + length > this.buffer.byteLength) {
      this.buffer = Buffer.alloc(Math.max(BODY_OFFSET + length, 2 * this.buffer.byteLength));
      this.generation += 1;
    }
    return this.buffer;
  }

  #fail(error: Error): void {
    const reject = this.#reject;
    this.#resolve = null;
    this.#reject = null;
    this.#socket.unref();
    if (reject !== null) reject(error);
  }

  #abandon(error: Error): void {
    if (!this.#gone) this.#gone = `${error.message}; open a new client`;
    this.#fail(error);
    this.#reader.clear();
    if (!this.#socket.destroyed) this.#socket.destroy();
  }
}
