/**
 * The response tails' readers in the protocol layer (Python: tests/test_protocol_tails.py): the
 * client, async batches and the HTTP JSON renderer share them, so a malformed tail is a
 * ProtocolError everywhere and a result is never read as a tail.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { encode as msgpackEncode } from "@msgpack/msgpack";

import { ProtocolError } from "../errors";
import { readFinalTail, splitRecvTail } from "../protocol";

const SIZE = 6;

function fill(char: string, count: number): Buffer {
  return Buffer.alloc(count, char);
}

function sameStep(results: Buffer, finals: [number, Buffer][]): Buffer {
  const parts = [results, Buffer.alloc(4)];
  parts[1]!.writeUInt32LE(finals.length, 0);
  for (const [index, data] of finals) {
    const head = Buffer.alloc(4);
    head.writeUInt32LE(index, 0);
    parts.push(head, data);
  }
  return Buffer.concat(parts);
}

test("a final tail gives each env index and where its result starts", () => {
  const body = sameStep(fill("r", 3 * SIZE), [
    [2, fill("A", SIZE)],
    [0, fill("B", SIZE)],
  ]);
  const finals = readFinalTail(body, 3 * SIZE, SIZE, 3);
  assert.deepEqual(
    finals.map(({ index, at }) => [index, body.subarray(at, at + SIZE).toString()]),
    [
      [2, "AAAAAA"],
      [0, "BBBBBB"],
    ],
  );
  assert.deepEqual(readFinalTail(sameStep(fill("r", SIZE), []), SIZE, SIZE, 1), []);
});

test("a malformed final tail is a ProtocolError", () => {
  const one = sameStep(fill("r", SIZE), [[0, fill("A", SIZE)]]);
  const cases: [Buffer, number, RegExp][] = [
    [Buffer.concat([fill("r", SIZE), Buffer.from([1, 0])]), 1, /lacks its final tail/],
    [Buffer.concat([one, fill("x", 1)]), 1, /final tail says 1/],
    [one.subarray(0, one.byteLength - 1), 1, /final tail says 1/],
    [sameStep(fill("r", SIZE), [[0, fill("A", SIZE)], [0, fill("B", SIZE)]]), 1, /final tail says 2/],
  ];
  for (const [body, most, text] of cases) {
    assert.throws(() => readFinalTail(body, SIZE, SIZE, most), (error: unknown) => error instanceof ProtocolError && text.test(error.message));
  }
});

test("a result whose first byte is 0x93 (a msgpack fixarray of 3) is still a result", () => {
  const results = Buffer.concat([Buffer.from([0x93]), Buffer.alloc(SIZE - 1), fill("r", SIZE)]);
  const body = Buffer.concat([results, msgpackEncode([[4, 1], [1], fill("F", SIZE)])]);
  const tail = splitRecvTail(body, SIZE, 4);
  assert.deepEqual([tail.count, tail.envIds, tail.ended], [2, [4, 1], [1]]);
  assert.equal(Buffer.from(tail.finals).toString(), "FFFFFF");
});

test("a malformed RECV_RESP tail is a ProtocolError", () => {
  const tails: Uint8Array[] = [
    msgpackEncode([[4], [], new Uint8Array(0)]), // one env id for two results
    msgpackEncode([[4, 1], [1], fill("F", 1)]), // a final result of the wrong size
    Buffer.concat([msgpackEncode([[4, 1], [], new Uint8Array(0)]), fill("x", 1)]), // bytes after the tail
    new Uint8Array(0), // no tail at all
  ];
  for (const tail of tails) {
    const body = Buffer.concat([fill("r", 2 * SIZE), tail]);
    assert.throws(() => splitRecvTail(body, SIZE, 2), (error: unknown) => error instanceof ProtocolError && /no \[env ids, ended, finals\] tail/.test(error.message));
  }
});

test("more results than the caller asked for is no answer to its request", () => {
  const body = Buffer.concat([fill("r", 3 * SIZE), msgpackEncode([[0, 1, 2], [], new Uint8Array(0)])]);
  assert.equal(splitRecvTail(body, SIZE, 3).count, 3);
  assert.throws(() => splitRecvTail(body, SIZE, 2), ProtocolError);
});
