/**
 * Issue 22 item 6 (and item 8's last sentence), Node side: the http:// server answers pipelined
 * requests in order through the async-state rules, answers a valid request before refusing the
 * garbage that followed it in the same write, refuses bare-LF heads at once and reads leading
 * zeros of a Content-Length; SEND_REQ env ids that are not msgpack integers, or are outside
 * 0..N-1 at any size, are BAD_BATCH with Python's texts; async misuse names the message.
 * Both servers against the same requests: tests/test_http_parity_issue22.py.
 */

import assert from "node:assert/strict";
import * as net from "node:net";
import { after, before, describe, test } from "node:test";

import { encode as msgpackEncode } from "@msgpack/msgpack";

import { PacEnv } from "../envs";
import { type Server, serve } from "../index";
import * as pac_env from "../generated/pac_env";
import { ErrorCode, MESSAGE_IDS, RequestError, fingerprintHex16 } from "../protocol";
import { checkIdle, sendEnvIds } from "../runtime/async_batches";

const FP = fingerprintHex16(pac_env.SCHEMA.fingerprint);
const N = 2;
const STEP_SIZE = 4; // pac's StepRequest
const STEP = Buffer.alloc(STEP_SIZE);

function post(path: string, body: Uint8Array = Buffer.alloc(0), length: string = String(body.byteLength)): Buffer {
  const head = `POST ${path} HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: ${FP}\r\nContent-Length: ${length}\r\n\r\n`;
  return Buffer.concat([Buffer.from(head, "latin1"), body]);
}

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

/** Every whole response in `raw`, in order. */
function parse(raw: Buffer): Answer[] {
  const out: Answer[] = [];
  let at = 0;
  for (;;) {
    const end = raw.indexOf("\r\n\r\n", at, "latin1");
    if (end < 0) return out;
    const lines = raw.subarray(at, end).toString("latin1").split("\r\n");
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(":");
      headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    const length = Number(headers["content-length"] ?? "0");
    if (raw.byteLength < end + 4 + length) return out;
    out.push({ status: Number((lines[0] as string).split(" ")[1]), headers, body: raw.subarray(end + 4, end + 4 + length) });
    at = end + 4 + length;
  }
}

/** One write on a new connection; the answers until `count` came, the server closed, or 10 s. */
function exchange(url: string, data: Buffer, count: number): Promise<Answer[]> {
  const port = Number(url.slice(url.lastIndexOf(":") + 1));
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1", () => socket.write(data));
    let raw = Buffer.alloc(0);
    const done = (): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(parse(raw));
    };
    const timer = setTimeout(done, 10_000);
    socket.on("data", (chunk: Buffer) => {
      raw = Buffer.concat([raw, chunk]);
      if (parse(raw).length >= count) done();
    });
    socket.on("close", done);
    socket.on("error", done);
  });
}

const codes = (answers: Answer[]): Array<[number, number | null]> =>
  answers.map((a) => [a.status, a.headers["x-transport-error"] === undefined ? null : Number(a.headers["x-transport-error"])]);
const text = (answer: Answer): string => answer.body.subarray(4).toString("utf8");
const sendBody = (ids: unknown[], requests = ids.length): Buffer => Buffer.concat([Buffer.alloc(requests * STEP_SIZE), msgpackEncode(ids)]);

describe("http:// parity with the Python server (issue 22 item 6)", () => {
  let server: Server;
  before(async () => {
    server = await serve(() => new PacEnv(), "http://127.0.0.1:0", { numEnvs: N });
  });
  after(async () => {
    await server.close();
  });

  test("pipelined RESET, SEND, RESET, RECV: the second RESET is ASYNC_STATE, the RECV returns the SEND's env", async () => {
    const seed = Buffer.alloc(8);
    seed.writeBigUInt64LE(5n);
    const recv = Buffer.alloc(4);
    recv.writeUInt32LE(1);
    const answers = await exchange(server.url, Buffer.concat([post("/v1/reset_seed", seed), post("/v1/send", sendBody([0])), post("/v1/reset"), post("/v1/recv", recv)]), 4);
    assert.deepEqual(codes(answers), [[200, null], [200, null], [409, ErrorCode.ASYNC_STATE], [200, null]]);
    assert.equal(text(answers[2] as Answer), "RESET_REQ while 1 env(s) are in flight: call recv() for their results first");
  });

  test("a valid request with a body, then garbage in the same write: its answer, then a 400", async () => {
    const seed = Buffer.alloc(8, 1);
    const answers = await exchange(server.url, Buffer.concat([post("/v1/reset_seed", seed), Buffer.from("\x00garbage\r\n\r\n", "latin1")]), 2);
    assert.deepEqual(codes(answers), [[200, null], [400, ErrorCode.BAD_FRAME]]);
    assert.equal(answers[1]?.headers.connection, "close");
  });

  test("two pipelined requests with bodies, then garbage: both answers, then a 400", async () => {
    const seed = Buffer.alloc(8, 1);
    const answers = await exchange(server.url, Buffer.concat([post("/v1/reset_seed", seed), post("/v1/step_batch", Buffer.alloc(N * STEP_SIZE)), Buffer.from("\x00", "latin1")]), 3);
    assert.deepEqual(codes(answers), [[200, null], [200, null], [400, ErrorCode.BAD_FRAME]]);
  });

  test("a bare LF ends no line: 400 BAD_FRAME at once", async () => {
    for (const head of [
      `POST /v1/health HTTP/1.1\nX-Transport-Fingerprint: ${FP}\n\n`,
      `POST /v1/health HTTP/1.1\r\nX-Transport-Fingerprint: ${FP}\r\n\n`,
      "POST /v1/health HTTP/1.1\n",
    ]) {
      const answers = await exchange(server.url, Buffer.from(head, "latin1"), 1);
      assert.deepEqual(codes(answers), [[400, ErrorCode.BAD_FRAME]], JSON.stringify(head));
    }
  });

  test("Content-Length: leading zeros are read as the value", async () => {
    const cases: Array<[string, [number, number | null]]> = [
      ["0".repeat(20), [200, null]],
      ["0".repeat(40), [200, null]],
      [String(2n ** 64n - 1n), [413, ErrorCode.BODY_TOO_LARGE]],
      [String(2n ** 64n), [400, ErrorCode.BAD_FRAME]],
    ];
    for (const [length, expected] of cases) {
      const answers = await exchange(server.url, post("/v1/health", Buffer.alloc(0), length), 1);
      assert.deepEqual(codes(answers), [expected], length);
    }
  });

  test("SEND_REQ env ids: not integers, or outside 0..N-1 at any size, are 422 BAD_BATCH", async () => {
    const cases: Array<[Buffer, string]> = [
      [sendBody([true]), "SEND_REQ env ids must be integers"],
      [Buffer.concat([STEP, Buffer.from([0x91, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0])]), "SEND_REQ env ids must be integers"], // [1.0]
      [Buffer.concat([STEP, Buffer.from([0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0])]), `env id ${2n ** 63n} is outside 0..${N - 1}`],
    ];
    for (const [body, expected] of cases) {
      const answers = await exchange(server.url, Buffer.concat([post("/v1/reset"), post("/v1/send", body)]), 2);
      assert.deepEqual(codes(answers), [[200, null], [422, ErrorCode.BAD_BATCH]], expected);
      assert.equal(text(answers[1] as Answer), expected);
    }
  });
});

describe("sendEnvIds and checkIdle (the runtime's rules)", () => {
  const refused = (body: Buffer, message: string): void => {
    assert.throws(() => sendEnvIds(body, STEP_SIZE, 4), (error: unknown) => {
      return error instanceof RequestError && error.code === ErrorCode.BAD_BATCH && error.text === message;
    }, message);
  };
  const ints = (...tail: number[]): Buffer => Buffer.concat([Buffer.alloc(STEP_SIZE * ((tail[0] as number) & 0x0f)), Buffer.from(tail)]);

  test("booleans, floats, strings and nil are not env ids", () => {
    for (const item of [0xc3, 0xc2, 0xc0, 0xa1]) {
      const tail = item === 0xa1 ? [0x91, 0xa1, 0x61] : [0x91, item];
      refused(ints(...tail), "SEND_REQ env ids must be integers");
    }
    refused(ints(0x91, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0), "SEND_REQ env ids must be integers");
    refused(ints(0x91, 0xca, 0, 0, 0, 0), "SEND_REQ env ids must be integers");
    refused(ints(0x92, 0x00, 0xc3), "SEND_REQ env ids must be integers");
  });

  test("integers are exact at any size; outside the safe range they are out of 0..N-1", () => {
    assert.deepEqual(sendEnvIds(ints(0x93, 0x00, 0xcc, 0x01, 0xd0, 0x02), STEP_SIZE, 4), [0, 1, 2]);
    assert.deepEqual(sendEnvIds(ints(0x91, 0xcf, 0, 0, 0, 0, 0, 0, 0, 3), STEP_SIZE, 4), [3]);
    refused(ints(0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0), `env id ${2n ** 63n} is outside 0..3`);
    refused(ints(0x91, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), `env id ${2n ** 64n - 1n} is outside 0..3`);
    refused(ints(0x91, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0), `env id ${-(2n ** 63n)} is outside 0..3`);
    refused(ints(0x91, 0xcf, 0, 0x20, 0, 0, 0, 0, 0, 1), `env id ${2n ** 53n + 1n} is outside 0..3`);
  });

  test("checkIdle names the message and what to call", () => {
    for (const request of [MESSAGE_IDS.STEP_BATCH_REQ, "STEP_BATCH_REQ"]) {
      assert.throws(() => checkIdle(3, request), (error: unknown) => {
        return (
          error instanceof RequestError &&
          error.code === ErrorCode.ASYNC_STATE &&
          error.text === "STEP_BATCH_REQ while 3 env(s) are in flight: call recv() for their results first"
        );
      }, String(request));
    }
    checkIdle(0, MESSAGE_IDS.STEP_BATCH_REQ);
  });
});
