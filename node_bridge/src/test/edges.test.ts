/**
 * Bad input at the edges (issue 17 items 6 and 7), unit level: the HELLO tail reader against
 * Python's vectors (tests/test_start_validation.py), the number-aware JSON body parser, and the
 * start-up limits. The servers themselves: tests/test_http_edge_cases.py, test_start_agreement.py.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { BadFrameError } from "../errors";
import { pac_env } from "../generated";
import { JSON_MAX_DEPTH, parseJsonBody, stringifyJson } from "../backends/http/wire";
import { ErrorCode, RequestError, acceptHello, decodeHelloTail, encodeHello } from "../protocol";
import { checkServerLimits } from "../server";

const hex = (text: string): Buffer => Buffer.from(text, "hex");

const TAIL_REFUSED: Array<[string, string]> = [
  ["810101", "every key must be a string"],
  ["81c4016101", "every key must be a string"],
  ["81c001", "every key must be a string"],
  ["818001", "every key must be a string"],
  ["81a161a1ff", "not UTF-8"],
  ["81a1ff01", "not UTF-8"],
  ["81a161a3eda080", "not UTF-8"],
  ["82a16101a16102", "twice"],
  ["9101", "expected a map"],
  ["c0", "expected a map"],
  ["01", "expected a map"],
  ["8000", "not one msgpack value"],
  ["81a161", "not one msgpack value"],
  ["c1", "not one msgpack value"],
  ["81a161d40100", "ext types are refused"],
  ["81a161d6ff00000001", "ext types are refused"],
  [`81a161${"91".repeat(32)}01`, "deeper than 32"],
];

test("HELLO tails Python refuses are refused, as BAD_FRAME by a server", () => {
  for (const [tail, message] of TAIL_REFUSED) {
    assert.throws(() => decodeHelloTail(hex(tail)), (error: unknown) => {
      return error instanceof BadFrameError && error.message.includes(message);
    }, tail);
    const body = Buffer.concat([encodeHello(pac_env.SCHEMA.fingerprint), hex(tail)]);
    assert.throws(() => acceptHello(body, pac_env.SCHEMA.fingerprint), (error: unknown) => {
      return error instanceof RequestError && error.code === ErrorCode.BAD_FRAME;
    }, tail);
  }
});

test("HELLO tails Python accepts are read the same", () => {
  assert.deepEqual(decodeHelloTail(hex("80")), {});
  const info = decodeHelloTail(hex("82a16101a16295c0c3cb3ff8000000000000c4017881a163a2c3a9"));
  assert.deepEqual(info, { a: 1, b: [null, true, 1.5, Uint8Array.of(0x78), { c: "é" }] });
  assert.ok(decodeHelloTail(hex(`81a161${"91".repeat(30)}01`)));
  assert.equal(decodeHelloTail(hex("81a161cf0020000000000001")).a, 2n ** 53n + 1n);
});

test("JSON bodies: integers exact, depth capped, strict JSON", () => {
  assert.deepEqual(parseJsonBody('{"seed": 9007199254740993}'), { seed: 9007199254740993n });
  assert.deepEqual(parseJsonBody('[1, -2.5e1, "a\\"b", true, null, {}]'), [1, -25, 'a"b', true, null, {}]);
  assert.equal(stringifyJson({ seed: 2n ** 64n - 1n, a: [1, "x"] }), '{"seed":18446744073709551615,"a":[1,"x"]}');
  const deep = (n: number): string => "[".repeat(n) + "]".repeat(n);
  assert.ok(parseJsonBody(deep(JSON_MAX_DEPTH)));
  assert.throws(() => parseJsonBody(deep(JSON_MAX_DEPTH + 1)), /nests deeper than 32 arrays and objects/);
  assert.throws(() => parseJsonBody(deep(200000)), /nests deeper than 32/);
  for (const bad of ["NaN", "[1,]", "01", '{"a" 1}', '"abc', "1 2", ""]) assert.throws(() => parseJsonBody(bad), SyntaxError, bad);
});

test("start-up limits: Python's rules and texts", () => {
  const url = "unix:///tmp/x.sock";
  checkServerLimits(pac_env.SCHEMA, url, 1, 33); // the HELLO: 12 + {"schema_name": "pac_env"} (21)
  checkServerLimits(pac_env.SCHEMA, url, 30000, 153540004);
  checkServerLimits(pac_env.SCHEMA, "shm://x", 65536, 1);
  assert.throws(() => checkServerLimits(pac_env.SCHEMA, url, 1, 32), /a HELLO request is 33 bytes; raise max_body to at least 33/);
  assert.throws(() => checkServerLimits(pac_env.SCHEMA, url, 0, 64), /num_envs must be 1\.\.65536, not 0/);
  assert.throws(() => checkServerLimits(pac_env.SCHEMA, url, 1, 0), /max_body must be 1\.\.4294967295 bytes, not 0/);
  assert.throws(() => checkServerLimits(pac_env.SCHEMA, url, 30000, 64 << 20), /is 153540004 bytes, over 67108864/);
});
