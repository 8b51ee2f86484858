/**
 * `Producer.push` and `Producer.committed` of the Node ring, with the semantics of Python's
 * (tests/test_channels_misuse.py, test_channels_ring.py, test_channels_lifetime.py): records in
 * as few reservations as possible (the wrap splits them), the first index back (-1n for none);
 * input that is not the ring's records is a ChannelMismatchError before a record is reserved; a
 * copy that fails after the reservation gives it back (nothing half-written is published, the
 * producer is not wedged); `committed` counts this producer's committed records. Real shared
 * memory: every ring is created under a unique name and closed (unlinked) by its test.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { ChannelClosedError, ChannelError, ChannelMismatchError, ChannelTimeoutError, type Consumer, type Ring } from "../channels";
import { CodecError } from "../errors";
import { experience } from "../generated";
import { type Transition, ZERO, codec, createRing, takeActions, withRing } from "../testing/rings";

const rec = (action: number): Transition => ({ ...ZERO, action });

function create(tag: string, capacity: number, options: { multiProducer?: boolean; policy?: "block" | "overwrite" } = {}): Ring {
  return createRing("trp", tag, capacity, options);
}

/** Whole records as bytes, as a Uint8Array push takes them. */
function bytesOf(actions: readonly number[]): Uint8Array {
  const out = new Uint8Array(actions.length * codec.size);
  actions.forEach((a, i) => codec.encodeInto(rec(a), out, i * codec.size));
  return out;
}

/** Take what is there (up to 16 records, waiting up to `timeoutMs`): its first index and actions. */
function take(ring: Ring, consumer: Consumer, timeoutMs = 1000): { first: bigint; actions: number[] } {
  return takeActions(ring, consumer, 16, timeoutMs);
}

describe("channels: ring push", { timeout: 60_000 }, () => {
  test("push of record values and of whole-record bytes: one reservation each, the first index back, committed counts them", () => {
    withRing(create("ok", 8), (ring) => {
      const producer = ring.producer();
      const consumer = ring.consumer();
      assert.equal(producer.committed, 0n);
      assert.equal(producer.push([rec(3), rec(4)], 1000), 0n);
      assert.equal(producer.committed, 2n);
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [3, 4] });
      assert.equal(producer.push(bytesOf([5, 6, 7]), 1000), 2n);
      assert.equal(producer.committed, 5n);
      const got = consumer.take(16, 1000);
      assert.equal(got.first, 2n);
      assert.deepEqual(codec.decode(ring.segment.bytes, got.offsetOf(1)), rec(6)); // byte for byte
      got.release();
      assert.equal(producer.push([]), -1n); // no records: nothing reserved
      assert.equal(producer.push(new Uint8Array(0)), -1n);
      assert.equal(ring.head, 5n);
      assert.equal(producer.committed, 5n);
      producer.close();
      consumer.close();
    });
  });

  test("a push across the wrap takes two reservations; committed is this producer's own count", () => {
    withRing(create("wrap", 8, { multiProducer: true }), (ring) => {
      const a = ring.producer();
      const b = ring.producer();
      const consumer = ring.consumer();
      assert.equal(a.push([1, 2, 3, 4, 5].map(rec), 1000), 0n);
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [1, 2, 3, 4, 5] });
      assert.equal(b.push(bytesOf([6, 7, 8, 9, 10, 11]), 1000), 5n); // slots 5..7, then 0..2
      const batch = consumer.take(16, 1000);
      assert.equal(batch.parts.length, 2);
      batch.release();
      assert.equal(a.committed, 5n);
      assert.equal(b.committed, 6n);
      for (const role of [a, b, consumer]) role.close();
    });
  });

  test("input that is not the ring's records is a ChannelMismatchError before a record is reserved", () => {
    withRing(create("mis", 8), (ring) => {
      const producer = ring.producer();
      const consumer = ring.consumer();
      const probe = experience.Probe64Codec.encode(experience.Probe64Codec.decode(new Uint8Array(64)));
      const bad: unknown[] = [
        new Float64Array([7, 7]), // not records at all
        probe, // another struct's bytes: not a multiple of the record size
        new Uint8Array(codec.size + 1),
        rec(1), // one record value, not an array of them
        [0, 1], // an array, but not of records
        [rec(1), null],
        [rec(1), [rec(2)]],
        "records",
        undefined,
      ];
      for (const value of bad) {
        assert.throws(() => producer.push(value as Uint8Array, 0), (e: unknown) => {
          assert.ok(e instanceof ChannelMismatchError, String(e));
          assert.match(
            (e as Error).message,
            /^\/dev\/shm\/\S+: push takes an array of Transition records or a Uint8Array of whole ones \(a 1816-byte struct \(obs, next_obs, mask, next_mask, \.\.\.\)\), got .+$/,
          );
          return true;
        });
        assert.equal(ring.head, 0n); // nothing reserved
      }
      assert.throws(() => producer.push([0, 1] as unknown as Transition[]), /got an array of 2 items, item 0 of which is number$/);
      assert.throws(() => producer.push(new Float64Array(2) as unknown as Uint8Array), /got a Float64Array of 2 elements$/);
      assert.throws(() => producer.push(probe), /got a Uint8Array of 64 bytes, not a multiple of 1816$/);
      assert.equal(producer.push([rec(3), rec(4)], 1000), 0n);
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [3, 4] });
      producer.close();
      consumer.close();
    });
  });

  test("a push whose copy fails gives its reservation back: nothing published, nothing lost, the producer goes on", () => {
    withRing(create("fail", 8), (ring) => {
      const producer = ring.producer();
      const consumer = ring.consumer();
      // a record the codec refuses, after the reservation was made and two records were written
      const records: unknown[] = [rec(1), rec(2), { ...ZERO, action: "three" }];
      assert.throws(() => producer.push(records as Transition[], 1000), (e: unknown) => {
        assert.ok(e instanceof CodecError, String(e));
        assert.match((e as Error).message, /action/);
        return true;
      });
      assert.equal(ring.head, 0n); // undone: nothing reserved
      assert.equal(ring.lost, 0n);
      assert.equal(producer.committed, 0n);
      assert.throws(() => consumer.take(16, 0), ChannelTimeoutError); // nothing published
      // a record whose values throw when read (Python's _Exploding): that error propagates
      const exploding = Object.defineProperty({ ...ZERO }, "action", {
        enumerable: true,
        get: () => {
          throw new Error("boom");
        },
      });
      assert.throws(() => producer.push([rec(1), exploding as Transition], 1000), { message: "boom" });
      assert.equal(ring.head, 0n);
      assert.equal(producer.push([rec(1), rec(2), rec(3)], 1000), 0n); // the producer is not wedged
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [1, 2, 3] }); // nor the consumer
      assert.equal(producer.committed, 3n);
      producer.close();
      consumer.close();
    });
  });

  test("a copy that fails in a later reservation keeps the earlier ones published and gives its own back", () => {
    withRing(create("late", 8, { multiProducer: true }), (ring) => {
      const other = ring.producer();
      const producer = ring.producer();
      const consumer = ring.consumer();
      producer.push([rec(0), rec(0), rec(0), rec(0), rec(0), rec(0)], 1000);
      take(ring, consumer);
      // records 6, 7 fit before the wrap; record 8 (the bad one) is in the second reservation
      const records: unknown[] = [rec(6), rec(7), { ...ZERO, reward: "x" }];
      assert.throws(() => producer.push(records as Transition[], 1000), CodecError);
      assert.equal(ring.head, 8n); // the second reservation was undone
      assert.deepEqual(take(ring, consumer), { first: 6n, actions: [6, 7] });
      assert.equal(other.push([rec(9)], 1000), 8n); // slot 0 is reserved again, by another producer
      assert.deepEqual(take(ring, consumer), { first: 8n, actions: [9] });
      assert.equal(ring.lost, 0n);
      for (const role of [other, producer, consumer]) role.close();
    });
  });

  test("push with a reservation open is refused and leaves that reservation alone; a full ring times out", () => {
    withRing(create("busy", 4), (ring) => {
      const producer = ring.producer();
      const consumer = ring.consumer();
      const r = producer.reserve(1, 1000);
      assert.throws(() => producer.push([rec(1)], 0), { name: "ChannelError", message: /commit the previous reservation first \(or abort it\)/ });
      codec.writeInto(rec(5), ring.segment.bytes, r.offset);
      assert.equal(producer.commit(), 0n); // still this producer's
      assert.equal(producer.push([rec(6), rec(7), rec(8)], 1000), 1n); // full now
      assert.throws(() => producer.push([rec(9)], 50), (e: unknown) => {
        assert.ok(e instanceof ChannelTimeoutError);
        assert.match((e as Error).message, /: reserve timed out after 50 ms$/);
        return true;
      });
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [5, 6, 7, 8] });
      assert.equal(producer.committed, 4n);
      producer.close();
      consumer.close();
    });
  });

  test("overwrite: a push into a full ring drops the oldest records the consumer does not hold", () => {
    withRing(create("ow", 8, { policy: "overwrite" }), (ring) => {
      const producer = ring.producer();
      const consumer = ring.consumer();
      producer.push([0, 1, 2, 3, 4, 5, 6, 7].map(rec));
      const held = consumer.take(3, 0); // holds records 0..2
      held.release();
      producer.push([8, 9, 10, 11, 12].map(rec), 1000); // 3 free slots, then drops the oldest: 3, 4
      assert.equal(ring.overwritten, 2n);
      assert.deepEqual(take(ring, consumer, 0), { first: 5n, actions: [5, 6, 7, 8, 9, 10, 11, 12] });
      assert.equal(producer.committed, 13n);
      producer.close();
      consumer.close();
    });
  });

  test("push and committed after close throw ChannelClosedError", () => {
    withRing(create("closed", 8), (ring) => {
      const producer = ring.producer();
      producer.push([rec(1)]);
      producer.close();
      assert.throws(() => producer.committed, (e: unknown) => {
        assert.ok(e instanceof ChannelClosedError);
        assert.match((e as Error).message, /: committed: this producer was closed$/);
        return true;
      });
      assert.throws(() => producer.push([rec(2)], 0), ChannelClosedError);
      assert.throws(() => producer.push(bytesOf([2]), 0), ChannelClosedError);
    });
    const ring = create("closedring", 8);
    const producer = ring.producer();
    ring.close();
    assert.throws(() => producer.committed, ChannelClosedError);
    assert.throws(() => producer.push([rec(1)], 0), ChannelClosedError);
    producer.close();
    assert.ok(new ChannelClosedError("x") instanceof ChannelError);
  });
});
