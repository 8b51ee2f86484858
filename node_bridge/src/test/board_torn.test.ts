/**
 * Regressions of issue 22 item 1 in Node: a failed `PolicyBoard.publish()`, a publisher killed
 * mid-publish and a takeover never leave readers accepting torn versions or unable to read new
 * ones; impossible words are a typed ChannelCorruptError, never a RangeError. Versions are
 * `board_arrays(version)` (board_torn_cli.ts): every element derives from the version. The
 * Python x Node runs are tests/test_board_torn.py.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, test } from "node:test";

import { ChannelError, ChannelMismatchError, PolicyBoard, TornReadError } from "../channels";
import { offsets } from "../channels/segment";
import { consistent, invalidArrays, versionArrays } from "../testing/board_torn_cli";

const CLI = join(__dirname, "..", "testing", "board_torn_cli.js");
const MODES = ["double_buffer", "seqlock"] as const;
const W = offsets("BoardWords", 128);
let counter = 0;
const unique = (tag: string): string => `tnt${tag}-${process.pid}-${counter++}`;
const template = (): Record<string, Float32Array | BigInt64Array> => ({
  w0: new Float32Array(1000),
  w1: new Float32Array(37),
  w2: new Float32Array(4096),
  tag: new BigInt64Array(2),
});

const corrupt = (error: unknown): boolean => error instanceof ChannelError && error.constructor.name === "ChannelCorruptError";

function seqWords(board: PolicyBoard): bigint[] {
  return Array.from({ length: board.slotCount }, (_, s) => Atomics.load(board.segment.u64, W[`slot${s}_seq`]! >> 3));
}

/** A board and a reader of it, both closed (the board unlinked) however `body` ends. */
function withBoard(tag: string, mode: (typeof MODES)[number], body: (board: PolicyBoard, reader: () => PolicyBoard) => void): void {
  const board = PolicyBoard.create(unique(tag), template(), mode);
  let reader: PolicyBoard | null = null;
  try {
    body(board, () => (reader = PolicyBoard.open(board.segment.name)));
  } finally {
    (reader as PolicyBoard | null)?.close();
    board.close();
  }
}

function readsWhole(reader: PolicyBoard, version: bigint): void {
  const got = reader.read(null, 2000);
  assert.equal(got.version, version);
  assert.ok(consistent(got.version, got.arrays), `version ${got.version} is torn`);
}

describe("board: a publish that fails changes nothing", { timeout: 60_000 }, () => {
  for (const mode of MODES) {
    test(`${mode}: missing, short, long, wrong element kind, not an array`, () => {
      withBoard("fail", mode, (board, open) => {
        const reader = open();
        board.publish(versionArrays(board, 1n));
        const bad: Record<string, unknown>[] = [
          invalidArrays(board, 2n, 0), // tag missing
          invalidArrays(board, 2n, 1), // tag too short
          invalidArrays(board, 2n, 2), // tag of numbers
          { ...versionArrays(board, 2n), tag: BigInt64Array.of(1n, 2n, 3n) }, // too long
          { ...versionArrays(board, 2n), w2: 7 }, // not an array
          { ...versionArrays(board, 2n), tag: [2n, 3] }, // a plain array, one element a number
        ];
        let version = 1n;
        for (const arrays of bad) {
          const before = seqWords(board);
          assert.throws(() => board.publish(arrays as never), ChannelMismatchError);
          assert.deepEqual(seqWords(board), before);
          readsWhole(reader, version);
          version++;
          assert.equal(board.publish(versionArrays(board, version)), version);
          assert.ok(seqWords(board).every((s) => s % 2n === 0n), String(seqWords(board)));
          readsWhole(reader, version);
        }
      });
    });
  }
});

describe("board: a publisher killed mid-publish, then a takeover", { timeout: 60_000 }, () => {
  for (const mode of MODES) {
    test(`${mode}: the new publisher repairs the slot and every version it publishes is read whole`, () => {
      withBoard("take", mode, (board, open) => {
        const died = spawnSync(process.execPath, [CLI, "die-mid-publish", board.segment.name, "3"], { encoding: "utf8" });
        assert.equal(died.signal, "SIGKILL", died.stderr);
        const reader = open();
        if (mode === "double_buffer") readsWhole(reader, 3n);
        else assert.throws(() => reader.read(null, 200), (e: unknown) => e instanceof ChannelError);
        for (let i = 0; i < 5; i++) {
          const version = board.version + 1n; // what publish gives (it takes the lease first)
          assert.equal(board.publish(versionArrays(board, version)), version);
          readsWhole(reader, version);
        }
      });
    });
  }
});

describe("board: impossible words are typed errors", { timeout: 60_000 }, () => {
  for (const active of [2, 7, -1]) {
    test(`active ${active >>> 0}: ChannelCorruptError (not a RangeError); the publisher repairs it`, () => {
      withBoard("active", "double_buffer", (board, open) => {
        const reader = open();
        board.publish(versionArrays(board, 1n));
        Atomics.store(board.segment.i32, W["active"]! >> 2, active);
        assert.throws(() => reader.read(null, 500), corrupt);
        assert.equal(board.publish(versionArrays(board, 2n)), 2n);
        readsWhole(reader, 2n);
      });
    });
  }

  for (const mode of MODES) {
    test(`${mode}: a version word that goes back is ChannelCorruptError; the publisher keeps its count`, () => {
      withBoard("back", mode, (board, open) => {
        const reader = open();
        for (let v = 1n; v <= 5n; v++) board.publish(versionArrays(board, v));
        readsWhole(reader, 5n);
        Atomics.store(board.segment.u64, W["version"]! >> 3, 2n);
        assert.throws(() => reader.read(null, 500), corrupt);
        assert.equal(board.publish(versionArrays(board, 6n)), 6n);
        readsWhole(reader, 6n);
      });
    });
  }

  test("a version word of 2**64 - 1 is ChannelCorruptError to readers and ignored by the publisher", () => {
    withBoard("huge", "double_buffer", (board, open) => {
      const reader = open();
      board.publish(versionArrays(board, 1n));
      Atomics.store(board.segment.u64, W["version"]! >> 3, (1n << 64n) - 1n);
      assert.throws(() => reader.read(null, 500), corrupt);
      assert.equal(board.publish(versionArrays(board, 2n)), 2n);
      readsWhole(reader, 2n);
    });
  });

  test("seqlock: an odd slot left by a scribble is a TornReadError until the next publish repairs it", () => {
    withBoard("odd", "seqlock", (board, open) => {
      const reader = open();
      board.publish(versionArrays(board, 1n));
      const seq = W["slot0_seq"]! >> 3;
      Atomics.store(board.segment.u64, seq, Atomics.load(board.segment.u64, seq) + 1n);
      assert.throws(() => reader.read(null, 200), TornReadError);
      assert.equal(board.publish(versionArrays(board, 2n)), 2n);
      readsWhole(reader, 2n);
    });
  });
});
