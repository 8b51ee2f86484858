/**
 * Property: the protocol's FrameReader turns any byte stream, split into chunks anywhere, into
 * exactly the frames of a reference parser of seed 000 Appendix A, then stops with nothing or
 * a BadFrameError naming the oversized frame's msg_id: never another exception.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import fc from "fast-check";

import { BadFrameError } from "../errors";
import { HEADER_SIZE } from "../protocol";
import { FrameReader } from "../stream";

interface Frame {
  msgType: number;
  msgId: number;
  body: Buffer;
}

function frameBytes(msgType: number, msgId: number, body: Uint8Array, bodyLen = body.length): Buffer {
  const header = Buffer.alloc(HEADER_SIZE);
  header.writeUInt8(msgType, 0);
  header.writeUInt32LE(msgId, 1);
  header.writeUInt32LE(bodyLen, 5);
  return Buffer.concat([header, body]);
}

/** The frames of `data`, and the msg_id of an oversized header that ends it (or null). */
function referenceParse(data: Buffer, maxBody: number): { frames: Frame[]; tooLarge: number | null } {
  const frames: Frame[] = [];
  let at = 0;
  while (data.length - at >= HEADER_SIZE) {
    const msgType = data.readUInt8(at);
    const msgId = data.readUInt32LE(at + 1);
    const bodyLen = data.readUInt32LE(at + 5);
    if (bodyLen > maxBody) return { frames, tooLarge: msgId };
    const end = at + HEADER_SIZE + bodyLen;
    if (end > data.length) break;
    frames.push({ msgType, msgId, body: Buffer.from(data.subarray(at + HEADER_SIZE, end)) });
    at = end;
  }
  return { frames, tooLarge: null };
}

/** Feed `data` in chunks of `sizes` (cycled) and collect frames until the reader throws. */
function readAll(data: Buffer, sizes: number[], maxBody: number): { frames: Frame[]; error: unknown } {
  const reader = new FrameReader(maxBody);
  const frames: Frame[] = [];
  let at = 0;
  let k = 0;
  try {
    while (at < data.length) {
      const size = sizes[k++ % sizes.length] as number;
      reader.push(Buffer.from(data.subarray(at, at + size))); // a fresh buffer, as sockets give
      at += size;
      while (reader.next()) {
        const body = Buffer.from(reader.body.subarray(reader.offset, reader.offset + reader.length));
        frames.push({ msgType: reader.msgType, msgId: reader.msgId, body });
      }
    }
  } catch (error) {
    return { frames, error };
  }
  return { frames, error: null };
}

const u32 = fc.integer({ min: 0, max: 0xffffffff });
const u8 = fc.integer({ min: 0, max: 255 });
const chunkSizes = fc.array(fc.integer({ min: 1, max: 700 }), { minLength: 1, maxLength: 20 });

/** Valid frames, frames at and over the limit, truncated frames and noise, in any order. */
const hostileStream = fc.integer({ min: 0, max: 400 }).chain((maxBody) =>
  fc
    .array(
      fc.oneof(
        fc.tuple(u8, u32, fc.uint8Array({ maxLength: maxBody })).map(([t, id, b]) => frameBytes(t, id, b)),
        fc.tuple(u8, u32).map(([t, id]) => frameBytes(t, id, new Uint8Array(maxBody))),
        fc.tuple(u8, u32).map(([t, id]) => frameBytes(t, id, new Uint8Array(maxBody + 1))),
        fc
          .tuple(u8, u32, fc.uint8Array({ maxLength: maxBody }), fc.double({ min: 0, max: 1, noNaN: true }))
          .map(([t, id, b, cut]) => {
            const whole = frameBytes(t, id, b);
            return whole.subarray(0, Math.min(whole.length - 1, Math.floor(cut * whole.length)));
          }),
        fc.uint8Array({ maxLength: 40 }).map((b) => Buffer.from(b)),
      ),
      { maxLength: 8 },
    )
    .map((parts) => ({ data: Buffer.concat(parts), maxBody })),
);

test("FrameReader: hostile streams give the reference frames, then BadFrameError or nothing", () => {
  fc.assert(
    fc.property(hostileStream, chunkSizes, ({ data, maxBody }, sizes) => {
      const expected = referenceParse(data, maxBody);
      const got = readAll(data, sizes, maxBody);
      assert.deepEqual(got.frames, expected.frames);
      if (expected.tooLarge === null) {
        assert.equal(got.error, null);
      } else {
        assert.ok(got.error instanceof BadFrameError, `expected BadFrameError, got ${String(got.error)}`);
        assert.equal(got.error.msgId, expected.tooLarge);
      }
    }),
    { numRuns: 500, seed: 7 },
  );
});

test("FrameReader: an oversized header is refused before its body arrives", () => {
  fc.assert(
    fc.property(u8, u32, fc.integer({ min: 301, max: 0xffffffff }), (msgType, msgId, bodyLen) => {
      const reader = new FrameReader(300);
      reader.push(frameBytes(msgType, msgId, new Uint8Array(0), bodyLen));
      assert.throws(
        () => reader.next(),
        (error: unknown) => error instanceof BadFrameError && error.msgId === msgId,
      );
    }),
    { numRuns: 200, seed: 8 },
  );
});
