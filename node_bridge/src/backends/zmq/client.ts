/**
 * The zmq client channel: a Dealer whose replies are matched to requests by msg_id.
 */

import { randomBytes } from "node:crypto";
import * as zmq from "zeromq";
import { BadFrameError, ConnectError, PeerGoneError, TransportTimeoutError, requestInFlight } from "../../errors";
import { BODY_OFFSET, DEFAULT_MAX_BODY, HEADER_SIZE, packHeader, readU32 } from "../../protocol";
import { type Channel, type ChannelOptions } from "../../stream";
import type { OpenOptions } from "../backend";
import { commonOptions, Address, asBuffer, binary, clientCurve, errorCode, parseUrl, sendable } from "./wire";

// -- client ---------------------------------------------------------------------------------------

/** How long libzmq may keep sending a closed client's goodbye (in the background). */
const GOODBYE_LINGER_MS = 500;

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
  readonly #header = Buffer.alloc(HEADER_SIZE);
  #nextId = 1;
  #connected = false;
  #lost = false;
  #failure = "";
  #closed = false;
  #receiving: Promise<Buffer[]> | null = null;
  #wait: Wait | null = null;
  /** A `request` is in flight (one at a time). */
  #requesting = false;
  #connectWaiters: Array<() => void> = [];

  constructor(address: Address, options: ChannelOptions = {}) {
    this.address = address;
    this.timeoutMs = options.timeoutMs === undefined ? 10_000 : options.timeoutMs;
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.buffer = Buffer.alloc(BODY_OFFSET + (64 << 10));
    const curve = clientCurve(address);
    const sock = new zmq.Dealer({
      ...commonOptions(address, this.maxBody),
      routingId: binary(Buffer.concat([Buffer.from("T"), randomBytes(16)])),
      immediate: true, // never queue a request for a server that is not there
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
      const events = sock.events;
      events.on("handshake", () => {
        this.#connected = true;
        this.#failure = "";
        this.#wakeConnectWaiters();
      });
      events.on("disconnect", () => {
        if (this.#connected) {
          this.#lost = true;
          this.#connected = false;
          this.#failWait();
        }
      });
      for (const type of ["handshake:error:auth", "handshake:error:protocol", "handshake:error:other"] as const) {
        events.on(type, (event: { error?: unknown }) => {
          this.#failure = describeFailure(type, event.error);
          this.#wakeConnectWaiters();
        });
      }
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
      if (bodyLen > this.maxBody) {
        const error = new BadFrameError(`reply body_len ${bodyLen} exceeds the maximum ${this.maxBody}`);
        error.msgId = replyId;
        throw error;
      }
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
      if (this.#closed) throw new ConnectError("the channel is closed");
      if (this.#failure.startsWith("the server refused")) {
        throw new ConnectError(`${this.address.endpoint}: ${this.#failure}`);
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        const detail = this.#failure ? `; last failure: ${this.#failure}` : "";
        throw new ConnectError(`nothing accepted a ZeroMQ connection on ${this.address.endpoint}${detail}`);
      }
      await this.#connectEvent(Math.min(remaining, 100));
    }
  }

  /** Queue a last message, without waiting (the server is not told when a Dealer goes):
   * `close` then lets libzmq send it for up to `GOODBYE_LINGER_MS`. */
  sayGoodbye(msgType: number, body: Uint8Array): void {
    if (this.#closed || !this.#connected || this.#lost) return;
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
    if (this.#lost) {
      this.#lost = false;
      throw new PeerGoneError(
        `the connection to ${this.address.endpoint} was closed or its heartbeats stopped`,
      );
    }
  }

  /** The next message, or a rejection at the deadline or when the connection is lost. */
  #next(deadline: number | null): Promise<Buffer[]> {
    // one waiter: a second would take the first's place, and the first would time out
    if (this.#wait !== null) return Promise.reject(requestInFlight());
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
          wait.reject(
            this.#connected
              ? new TransportTimeoutError(`no reply from ${this.address.endpoint} within ${this.timeoutMs} ms`)
              : new PeerGoneError(`no connection to ${this.address.endpoint} (no reply within ${this.timeoutMs} ms)`),
          );
        }, Math.max(0, deadline - Date.now()));
      }
      receiving.then(
        (parts) => {
          if (this.#wait !== wait) return; // abandoned: the message stays for the next wait
          if (timer !== null) clearTimeout(timer);
          this.#wait = null;
          this.#receiving = null;
          resolve(parts);
        },
        (error: unknown) => {
          if (this.#receiving === receiving) this.#receiving = null;
          wait.reject(
            this.#closed
              ? new PeerGoneError("the channel is closed")
              : new PeerGoneError(`receiving from ${this.address.endpoint} failed: ${errorCode(error)}`),
          );
        },
      );
    });
  }

  #failWait(): void {
    const wait = this.#wait;
    if (wait === null) return;
    this.#lost = false; // reported to this request
    wait.reject(new PeerGoneError(`the connection to ${this.address.endpoint} was closed or its heartbeats stopped`));
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

  async #waitForConnection(deadline: number | null, what: string): Promise<void> {
    this.#checkUsable();
    if (deadline !== null && Date.now() >= deadline) {
      if (this.#connected) throw new TransportTimeoutError(`could not ${what} to ${this.address.endpoint} in time`);
      const detail = this.#failure ? `: ${this.#failure}` : "";
      throw new PeerGoneError(`no connection to ${this.address.endpoint}${detail}`);
    }
    const remaining = deadline === null ? 50 : Math.max(1, Math.min(50, deadline - Date.now()));
    await this.#connectEvent(remaining);
  }
}

/** Connect a Dealer and wait (until the deadline) for the handshake with the server. */
export async function openChannel(url: string, options: OpenOptions = {}): Promise<ZmqChannel> {
  const address = parseUrl(url);
  const channel = new ZmqChannel(address, options);
  const timeoutMs = options.timeoutMs ?? 10_000;
  try {
    await channel.waitConnected(Date.now() + timeoutMs);
  } catch (error) {
    channel.close();
    throw error;
  }
  return channel;
}
