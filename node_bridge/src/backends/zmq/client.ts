/**
 * The zmq client channel: a Dealer whose replies are matched to requests by msg_id.
 */

import { randomBytes } from "node:crypto";
import * as zmq from "zeromq";
import { BadFrameError, ConnectError, PeerGoneError, TransportTimeoutError, replyTooLarge, requestInFlight } from "../../errors";
import { BODY_OFFSET, DEFAULT_MAX_BODY, HEADER_SIZE, packHeader, readU32 } from "../../protocol";
import { type Channel, type ChannelOptions, MAX_TIMER_MS, timeoutOption } from "../../stream";
import type { OpenOptions } from "../backend";
import { commonOptions, Address, asBuffer, binary, clientCurve, errorCode, parseUrl, sendable } from "./wire";

// -- client ---------------------------------------------------------------------------------------

/**
 * libzmq's limit on the client's received messages: the largest body a frame header can say.
 * With `maxBody` there, libzmq ended the connection at a larger reply without a word (the client
 * saw only "closed", and the Dealer never reconnects after that); `recvResponse` checks `maxBody`
 * itself instead: the reply is dropped with `ReplyTooLargeError` and the connection kept. The
 * server keeps `maxBody` as its limit on requests. Python: `_REPLY_MAXMSGSIZE`.
 */
const REPLY_MAX_MESSAGE_SIZE = 0xffffffff;

/** How long libzmq may keep sending a closed client's goodbye (in the background). */
const GOODBYE_LINGER_MS = 500;

/** libzmq (draft) options: the message a Dealer receives when its connection drops, and when
 * to stop reconnecting (4: after an established connection was lost). */
const ZMQ_HICCUP_MSG = 114;
const ZMQ_RECONNECT_STOP = 109;
const ZMQ_RECONNECT_STOP_AFTER_DISCONNECT = 4;
/** The hiccup message: one part (a reply has two), never sent on the wire. */
const HICCUP = Buffer.from("transport: connection lost");

function isHiccup(parts: Buffer[]): boolean {
  return parts.length === 1 && (parts[0] as Buffer).equals(HICCUP);
}

export function describeFailure(type: string, error: unknown): string {
  const status = (error as { status?: unknown } | undefined)?.status;
  if (type === "handshake:error:auth") {
    return `the server refused this client's CURVE key (ZAP status ${status ?? "?"})`;
  }
  if (type === "handshake:error:protocol") {
    return "the ZMTP handshake failed (CURVE on one side only, or the wrong server key?)";
  }
  return "the ZMTP handshake failed (wrong server key, or not a ZeroMQ server?)";
}

export interface Wait {
  resolve: (parts: Buffer[]) => void;
  reject: (error: Error) => void;
}

/**
 * The client side: a Dealer whose replies are matched to requests by msg_id. `request` is
 * `sendRequest` + `recvResponse`; callers may pipeline with the two halves (a reply whose msg_id
 * is not the awaited one is discarded).
 *
 * An idle channel holds nothing on node's event loop (a script that ends without `close()`
 * exits): the socket's monitor is read only while connecting (a pending monitor read would hold
 * the loop for good), and a lost connection is seen through libzmq's hiccup message, which the
 * Dealer receives in its reply queue (a closed or reset connection, or heartbeats that
 * stopped); no reconnection follows (the server's session is gone with it), so every request
 * after a lost connection is a `PeerGoneError` at once. A receive's native wait ends at its
 * timeout too (`receiveTimeout`), so a timed-out request leaves no read pending.
 */
export class ZmqChannel implements Channel {
  info: Record<string, unknown> = {};
  readonly speaksAnySchema = true;
  buffer: Buffer;
  bodyLength = 0;
  generation = 0;
  timeoutMs: number | null;
  readonly address: Address;
  readonly maxBody: number;

  readonly #sock: zmq.Dealer;
  /** The socket's monitor: read only while connecting (`waitConnected`). */
  readonly #observer: zmq.Observer;
  #observing: Promise<void> | null = null;
  readonly #header = Buffer.alloc(HEADER_SIZE);
  #nextId = 1;
  #connected = false;
  /** Why the connection is gone for good ("" while usable). */
  #gone = "";
  #failure = "";
  #receiveTimeout = -2;
  #closed = false;
  #receiving: Promise<Buffer[]> | null = null;
  /** A message a receive took after its wait was abandoned (a late reply): the next wait's. */
  #stale: Buffer[] | null = null;
  #wait: Wait | null = null;
  /** A `request` is in flight (one at a time). */
  #requesting = false;
  #connectWaiters: Array<() => void> = [];

  constructor(address: Address, options: ChannelOptions = {}) {
    this.address = address;
    this.timeoutMs = timeoutOption(options.timeoutMs);
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.buffer = Buffer.alloc(BODY_OFFSET + (64 << 10));
    const curve = clientCurve(address);
    const sock = new zmq.Dealer({
      ...commonOptions(address, this.maxBody),
      maxMessageSize: REPLY_MAX_MESSAGE_SIZE,
      routingId: binary(Buffer.concat([Buffer.from("T"), randomBytes(16)])),
      reconnectInterval: 100,
      reconnectMaxInterval: 1000,
      sendTimeout: 0, // a send without a connection fails at once; we wait for one ourselves
    });
    try {
      if (curve !== null) {
        sock.curveServerKey = binary(curve.serverPublic);
        sock.curvePublicKey = binary(curve.publicKey);
        sock.curveSecretKey = binary(curve.secretKey);
      }
      const native = sock as unknown as {
        setStringOption(option: number, value: Buffer): void;
        setInt32Option(option: number, value: number): void;
      };
      try {
        native.setStringOption(ZMQ_HICCUP_MSG, HICCUP);
        native.setInt32Option(ZMQ_RECONNECT_STOP, ZMQ_RECONNECT_STOP_AFTER_DISCONNECT);
      } catch {
        // a libzmq built without the draft API (zeromq.js's own build has it): a lost
        // connection is then seen only at the request's deadline
      }
      this.#observer = new zmq.Observer(sock);
      sock.connect(address.endpoint);
    } catch (error) {
      sock.close();
      throw new ConnectError(`cannot connect to ${address.endpoint}: ${(error as Error).message}`);
    }
    this.#sock = sock;
  }

  get connected(): boolean {
    return this.#connected;
  }

  /** Send a request and await its reply: resolves to the reply's msg_type (body in `buffer`).
   * One at a time, as every channel (a second one's reply wait would take the first's). */
  async request(msgType: number, body: Uint8Array): Promise<number> {
    if (this.#requesting) throw requestInFlight();
    this.#requesting = true;
    try {
      const deadline = this.timeoutMs === null ? null : Date.now() + this.timeoutMs;
      const msgId = await this.sendRequest(msgType, body, deadline);
      return await this.recvResponse(msgId, deadline);
    } finally {
      this.#requesting = false;
    }
  }

  /** Queue one request; resolves to its msg_id. Waits for a connection until the deadline. */
  async sendRequest(msgType: number, body: Uint8Array, deadline: number | null = null): Promise<number> {
    this.#checkUsable();
    const msgId = this.#nextId;
    this.#nextId = (msgId + 1) >>> 0 || 1;
    const data = asBuffer(body);
    packHeader(this.#header, 0, msgType, msgId, data.byteLength);
    const { part } = sendable(data);
    for (;;) {
      try {
        // sendTimeout 0: resolved or rejected synchronously; the 9-byte header is copied
        await this.#sock.send([this.#header, part]);
        return msgId;
      } catch (error) {
        if (this.#closed) throw new PeerGoneError("the channel is closed");
        if (errorCode(error) !== "EAGAIN") {
          throw new PeerGoneError(`cannot send to ${this.address.endpoint}: ${(error as Error).message}`);
        }
      }
      await this.#waitForConnection(deadline, "send");
    }
  }

  /** The reply to `msgId`: its msg_type; the body is `buffer[BODY_OFFSET, +bodyLength)`. */
  async recvResponse(msgId: number, deadline: number | null = null): Promise<number> {
    for (;;) {
      this.#checkUsable();
      const parts = await this.#next(deadline);
      const header = parts[0];
      if (parts.length !== 2 || header === undefined || header.byteLength !== HEADER_SIZE) {
        throw new BadFrameError(`reply header part is ${header?.byteLength ?? 0} bytes, or has no body part`);
      }
      const replyId = readU32(header, 1);
      const bodyLen = readU32(header, 5);
      if (replyId !== msgId) continue; // a stale reply to an abandoned request
      // dropped whole (libzmq received it): the connection goes on
      if (bodyLen > this.maxBody) throw replyTooLarge(bodyLen, this.maxBody, replyId);
      const body = parts[1] as Buffer;
      if (body.byteLength !== bodyLen) {
        throw new BadFrameError(`reply body part is ${body.byteLength} bytes, its header says ${bodyLen}`);
      }
      if (BODY_OFFSET + bodyLen > this.buffer.byteLength) {
        this.buffer = Buffer.alloc(Math.max(BODY_OFFSET + bodyLen, 2 * this.buffer.byteLength));
        this.generation += 1;
      }
      body.copy(this.buffer, BODY_OFFSET); // the one copy: libzmq's message -> aligned buffer
      this.bodyLength = bodyLen;
      return header[0] as number;
    }
  }

  /** Wait (until the deadline) for the ZMTP handshake; `ConnectError` otherwise. */
  async waitConnected(deadline: number): Promise<void> {
    while (!this.#connected) {
      this.#observe();
      if (this.#closed) throw new ConnectError("the channel is closed");
      if (this.#failure) {
        // a handshake that failed (a refused key, CURVE on one side only, the wrong server key)
        // fails the same way on every retry: at once, not at the deadline; only "nothing
        // accepts yet" (a server still starting) is waited for
        throw new ConnectError(`${this.address.endpoint}: ${this.#failure}`);
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        throw new ConnectError(`nothing accepted a ZeroMQ connection on ${this.address.endpoint}`);
      }
      await this.#connectEvent(Math.min(remaining, 100));
    }
  }

  /** Queue a last message, without waiting (the server is not told when a Dealer goes):
   * `close` then lets libzmq send it for up to `GOODBYE_LINGER_MS`. */
  sayGoodbye(msgType: number, body: Uint8Array): void {
    if (this.#closed || !this.#connected || this.#gone) return;
    const header = Buffer.alloc(HEADER_SIZE);
    packHeader(header, 0, msgType, this.#nextId, body.byteLength);
    // sendTimeout 0: handed to libzmq now, or refused (no room, no connection: the server
    // drops the session at LRU, as before)
    this.#sock.send([header, asBuffer(body)]).then(
      () => undefined,
      () => undefined,
    );
    this.#sock.linger = GOODBYE_LINGER_MS;
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const wait = this.#wait;
    this.#wait = null;
    wait?.reject(new PeerGoneError("the channel was closed while a request was outstanding"));
    this.#wakeConnectWaiters();
    this.#sock.close();
  }

  // -- internals -------------------------------------------------------------------------------

  #checkUsable(): void {
    if (this.#closed) throw new PeerGoneError("the channel is closed");
    if (this.#gone) throw new PeerGoneError(this.#gone);
  }

  /** The connection is lost for good: this error now, every later request rejected at once. */
  #lose(message: string): PeerGoneError {
    if (!this.#gone) this.#gone = `${message}; open a new client`;
    return new PeerGoneError(message);
  }

  /** The next message, or a rejection at the deadline or when the connection is lost. */
  #next(deadline: number | null): Promise<Buffer[]> {
    // one waiter: a second would take the first's place, and the first would time out
    if (this.#wait !== null) return Promise.reject(requestInFlight());
    // the native wait ends by itself (EAGAIN) at most a timeout after it starts, so a request
    // that timed out leaves no receive holding node's event loop; none: it waits as the request
    const native = deadline === null ? -1 : Math.min(MAX_TIMER_MS, Math.max(1, Math.ceil(this.timeoutMs ?? 1000)));
    if (native !== this.#receiveTimeout) {
      this.#sock.receiveTimeout = native;
      this.#receiveTimeout = native;
    }
    return new Promise<Buffer[]>((resolve, reject) => {
      let timer: NodeJS.Timeout | null = null;
      const wait: Wait = {
        resolve,
        reject: (error: Error) => {
          if (timer !== null) clearTimeout(timer);
          if (this.#wait === wait) this.#wait = null;
          reject(error);
        },
      };
      this.#wait = wait;
      if (deadline !== null) {
        timer = setTimeout(() => {
          wait.reject(new TransportTimeoutError(`no reply from ${this.address.endpoint} within ${this.timeoutMs} ms`));
        }, Math.min(MAX_TIMER_MS, Math.max(0, deadline - Date.now())));
      }
      const attach = (): void => {
        let receiving = this.#receiving;
        if (receiving === null) {
          // one receive is outstanding at a time (zeromq.js); a timed-out one is picked up later
          receiving = this.#sock.receive();
          this.#receiving = receiving;
          receiving.then(
            () => undefined,
            () => undefined,
          );
        }
        const current = receiving;
        current.then(
          (parts) => {
            if (this.#receiving === current) this.#receiving = null;
            if (this.#wait !== wait) {
              // abandoned: a reply stays for the next wait (dropped by msg_id there); a hiccup
              // marks the connection lost for the next request. A wait that attached since
              // takes the message itself.
              if (this.#wait !== null) return;
              if (isHiccup(parts)) this.#lose(`the connection to ${this.address.endpoint} was closed or its heartbeats stopped`);
              else this.#stale = parts;
              return;
            }
            if (isHiccup(parts)) {
              wait.reject(this.#lose(`the connection to ${this.address.endpoint} was closed or its heartbeats stopped`));
              return;
            }
            if (timer !== null) clearTimeout(timer);
            this.#wait = null;
            resolve(parts);
          },
          (error: unknown) => {
            if (this.#receiving === current) this.#receiving = null;
            if (!this.#closed && errorCode(error) === "EAGAIN") {
              if (this.#wait === wait) attach(); // the native wait's own timeout: wait on
              return;
            }
            wait.reject(
              this.#closed
                ? new PeerGoneError("the channel is closed")
                : this.#lose(`receiving from ${this.address.endpoint} failed: ${errorCode(error)}`),
            );
          },
        );
      };
      const stale = this.#stale;
      if (stale !== null) {
        this.#stale = null;
        if (this.#wait === wait) {
          if (timer !== null) clearTimeout(timer);
          this.#wait = null;
          resolve(stale);
          return;
        }
      }
      attach();
    });
  }

  #connectEvent(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.#connectWaiters.push(done);
    });
  }

  #wakeConnectWaiters(): void {
    const waiters = this.#connectWaiters;
    this.#connectWaiters = [];
    for (const wake of waiters) wake();
  }

  /** The send queue is full (EAGAIN): wait a little, until the deadline. */
  async #waitForConnection(deadline: number | null, what: string): Promise<void> {
    this.#checkUsable();
    if (deadline !== null && Date.now() >= deadline) {
      throw new TransportTimeoutError(`could not ${what} to ${this.address.endpoint} in time`);
    }
    const remaining = deadline === null ? 50 : Math.max(1, Math.min(50, deadline - Date.now()));
    await new Promise((resolve) => setTimeout(resolve, remaining));
  }

  /** Read the monitor's events while connecting: one read at a time, none once connected or
   * closed (a read left pending would hold node's event loop). */
  #observe(): void {
    const observer = this.#observer;
    if (this.#observing !== null || this.#connected || this.#closed) return;
    this.#observing = observer.receive().then(
      (event) => {
        this.#observing = null;
        if (event === undefined) return; // the observer closed with the socket
        const type = event.type as string;
        if (type === "handshake") {
          this.#connected = true;
          this.#failure = "";
          // never read again; kept (not closed, not collected): a closed monitor would stall
          // libzmq's I/O thread at the next event, and the few events after this one queue
        } else if (type.startsWith("handshake:error:")) {
          this.#failure = describeFailure(type, (event as { error?: unknown }).error);
        }
        this.#wakeConnectWaiters();
        if (!this.#connected && !this.#closed && this.#connectWaiters.length > 0) this.#observe();
      },
      () => {
        this.#observing = null;
        this.#wakeConnectWaiters();
      },
    );
  }
}

/** Connect a Dealer and wait (until the deadline) for the handshake with the server. */
export async function openChannel(url: string, options: OpenOptions = {}): Promise<ZmqChannel> {
  const address = parseUrl(url);
  const channel = new ZmqChannel(address, options);
  const timeoutMs = timeoutOption(options.timeoutMs) ?? 10_000;
  try {
    await channel.waitConnected(Date.now() + timeoutMs);
  } catch (error) {
    channel.close();
    throw error;
  }
  return channel;
}
