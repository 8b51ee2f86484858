/**
 * The codec's non-validating `writeInto` fast path and the cached views behind `encodeInto`
 * (a server encoding the same env arrays into the same response buffer every step).
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { CodecError } from "../errors";
import { StepResultCodec, type StepResultInput } from "../generated/tetris";

function result(): StepResultInput & { observation: Float32Array; action_mask: Uint8Array } {
  const observation = new Float32Array(214);
  for (let i = 0; i < observation.length; i++) observation[i] = i / 4;
  return {
    observation,
    action_mask: new Uint8Array(40).fill(1),
    reward: 3,
    done: 0,
    truncated: 0,
    lines: 2,
    piece: 6,
    total_lines: 70000,
    pieces: 123456,
  };
}

describe("writeInto", () => {
  test("writes the same bytes as encodeInto, over dirty bytes", () => {
    const a = new Uint8Array(5 + StepResultCodec.size).fill(0xee);
    const b = new Uint8Array(5 + StepResultCodec.size).fill(0xee);
    StepResultCodec.encodeInto(result(), a, 5);
    StepResultCodec.writeInto(result(), b, 5);
    assert.deepEqual(b, a);
    assert.equal(StepResultCodec.decode(b, 5).pieces, 123456);
  });

  test("does not validate (encodeInto does)", () => {
    const bad = { ...result(), lines: 300 };
    assert.throws(() => StepResultCodec.encodeInto(bad, new Uint8Array(StepResultCodec.size)), CodecError);
    const buf = new Uint8Array(StepResultCodec.size);
    StepResultCodec.writeInto(bad, buf, 0);
    assert.equal(StepResultCodec.decode(buf).lines, 300 & 0xff);
  });

  test("still refuses a buffer that is too short", () => {
    assert.throws(() => StepResultCodec.writeInto(result(), new Uint8Array(10), 0), CodecError);
  });

  test("the same arrays mutated in place and the same buffer: every write is fresh", () => {
    const value = result();
    const buf = new Uint8Array(2 * StepResultCodec.size);
    for (let step = 0; step < 5; step++) {
      value.observation[7] = step;
      value.action_mask[3] = step % 2;
      StepResultCodec.encodeInto(value, buf, 0);
      StepResultCodec.writeInto(value, buf, StepResultCodec.size);
      for (const at of [0, StepResultCodec.size]) {
        const decoded = StepResultCodec.decode(buf, at);
        assert.equal(decoded.observation[7], step);
        assert.equal(decoded.action_mask[3], step % 2);
      }
    }
    const other = new Uint8Array(StepResultCodec.size); // another buffer after the cached one
    StepResultCodec.encodeInto(value, other, 0);
    assert.deepEqual(other, buf.subarray(0, StepResultCodec.size));
  });
});
