/** The testee's frame reader reassembles frames from arbitrarily split chunks. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { FrameReader, frame } from "../conformance/frames";

test("frames split at every possible point come out whole and in order", () => {
  const bodies = [Buffer.from("a"), Buffer.alloc(0), Buffer.alloc(70000, 7), Buffer.from("xyz")];
  const stream = Buffer.concat(bodies.map((body) => frame(body)));
  for (const pieceSize of [1, 3, 4, 5, 1000, 65536, stream.length]) {
    const reader = new FrameReader();
    const got: Buffer[] = [];
    for (let at = 0; at < stream.length; at += pieceSize) {
      got.push(...reader.push(stream.subarray(at, at + pieceSize)));
    }
    assert.deepEqual(got, bodies, `pieces of ${pieceSize}`);
    assert.equal(reader.pending, 0);
  }
});
