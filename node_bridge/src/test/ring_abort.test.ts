/**
 * `Producer.abort` of the Node ring, with the semantics of Python's (tests/test_channels_misuse.py):
 * a reservation nobody reserved after is undone (head moves back), one another producer reserved
 * after is skipped once the consumer reaches it (counted in `lost`), a wait for the consumer that
 * runs out is a ChannelTimeoutError that keeps the reservation; `close()` with a reservation open
 * gives it back, or leaves it as a dead producer's. Real shared memory: every ring is created
 * under a unique name and closed (unlinked) by its test.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { ChannelClosedError, ChannelError, ChannelTimeoutError, type Consumer, type Ring } from "../channels";
import { ZERO, codec, createRing, takeActions, withRing } from "../testing/rings";

function create(tag: string, capacity: number, multiProducer = false): Ring {
  return createRing("tab", tag, capacity, { multiProducer });
}

/** Write `action` into the reservation's i-th record. */
function put(ring: Ring, offset: number, action: number, i = 0): void {
  codec.writeInto({ ...ZERO, action }, ring.segment.bytes, offset + i * ring.recordSize);
}

/** Take what is there (up to 8 records, waiting up to `timeoutMs`): its first index and actions. */
function take(ring: Ring, consumer: Consumer, timeoutMs = 1000): { first: bigint; actions: number[] } {
  return takeActions(ring, consumer, 8, timeoutMs);
}

describe("channels: ring abort", { timeout: 60_000 }, () => {
  test("abort undoes a reservation: head moves back, the consumer never sees it, the next reserve gets the same indices", () => {
    withRing(create("undo", 8), (ring) => {
      const producer = ring.producer();
      const consumer = ring.consumer();
      const r = producer.reserve(3, 1000);
      assert.equal(r.first, 0n);
      assert.equal(r.count, 3);
      for (let i = 0; i < r.count; i++) put(ring, r.offset, 7, i);
      assert.equal(ring.head, 3n);
      producer.abort();
      assert.equal(ring.head, 0n);
      assert.equal(ring.lost, 0n);
      assert.throws(() => consumer.take(8, 0), ChannelTimeoutError); // nothing published
      const again = producer.reserve(2, 1000); // the same indices, the same slots
      assert.equal(again.first, 0n);
      assert.equal(again.offset, r.offset);
      put(ring, again.offset, 1, 0);
      put(ring, again.offset, 2, 1);
      assert.equal(producer.commit(), 0n);
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [1, 2] });
      assert.throws(() => consumer.take(8, 0), ChannelTimeoutError); // the aborted third never shows
      assert.deepEqual(ring.stats(), { head: 2n, tail: 2n, held: 0n, overwritten: 0n, lost: 0n });
      producer.close();
      consumer.close();
    });
  });

  test("abort with nothing reserved does nothing", () => {
    withRing(create("none", 8), (ring) => {
      const producer = ring.producer();
      producer.abort();
      producer.abort(0);
      assert.equal(ring.head, 0n);
      producer.reserve(1, 1000);
      producer.commit();
      producer.abort(); // after a commit: nothing reserved either
      assert.equal(ring.head, 1n);
      assert.equal(ring.lost, 0n);
      const r = producer.reserve(1, 1000);
      assert.equal(r.first, 1n);
      assert.throws(() => producer.reserve(1, 0), { name: "ChannelError", message: /commit the previous reservation first \(or abort it\)/ });
      producer.abort();
      producer.close();
    });
  });

  test("abort after close throws ChannelClosedError (this producer, or this ring, was closed)", () => {
    withRing(create("closed", 8), (ring) => {
      const producer = ring.producer();
      producer.close();
      assert.throws(() => producer.abort(), (e: unknown) => {
        assert.ok(e instanceof ChannelClosedError);
        assert.match((e as Error).message, /: abort: this producer was closed$/);
        return true;
      });
    });
    const ring = create("closedring", 8);
    const producer = ring.producer();
    producer.reserve(1, 1000);
    ring.close();
    assert.throws(() => producer.abort(), ChannelClosedError);
    producer.close(); // nothing to give back once the ring is closed
    assert.throws(() => producer.abort(), ChannelClosedError);
  });

  test("abort skips a reservation another producer reserved after (counted in lost)", () => {
    withRing(create("skip", 8, true), (ring) => {
      const a = ring.producer();
      const b = ring.producer();
      const consumer = ring.consumer();
      a.abort(); // nothing reserved: nothing to do
      const ra = a.reserve(2, 1000);
      assert.equal(ra.first, 0n);
      const rb = b.reserve(1, 1000);
      put(ring, rb.offset, 9);
      b.commit();
      a.abort(1000); // records 0, 1 cannot be un-reserved: skipped, counted as lost
      assert.deepEqual(take(ring, consumer), { first: 2n, actions: [9] });
      assert.equal(ring.lost, 2n);
      put(ring, a.reserve(1, 1000).offset, 5); // a goes on
      a.commit();
      assert.deepEqual(take(ring, consumer), { first: 3n, actions: [5] });
      a.reserve(1, 1000);
      a.abort(); // the last reservation: undone, not lost
      assert.equal(ring.head, 4n);
      assert.equal(ring.lost, 2n);
      for (const role of [a, b, consumer]) role.close();
    });
  });

  test("abort times out while the consumer has not reached the records; the reservation is kept, a later abort succeeds", () => {
    withRing(create("timeout", 8, true), (ring) => {
      const early = ring.producer();
      const a = ring.producer();
      const late = ring.producer();
      const consumer = ring.consumer();
      put(ring, early.reserve(1, 1000).offset, 1); // record 0: still being written
      const ra = a.reserve(2, 1000); // records 1, 2
      assert.equal(ra.first, 1n);
      put(ring, late.reserve(1, 1000).offset, 4); // record 3
      late.commit();
      const started = performance.now();
      assert.throws(() => a.abort(50), (e: unknown) => {
        assert.ok(e instanceof ChannelTimeoutError);
        assert.match((e as Error).message, /^\/dev\/shm\/\S+: abort: the consumer did not reach records 1\.\.2 within 50 ms$/);
        return true;
      });
      assert.ok(performance.now() - started >= 45);
      assert.throws(() => a.abort(0), ChannelTimeoutError);
      // the reservation is still a's: no new one, nothing lost, head where it was
      assert.throws(() => a.reserve(1, 0), ChannelError);
      assert.equal(ring.head, 4n);
      assert.equal(ring.lost, 0n);
      early.commit();
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [1] }); // stops at record 1
      a.abort(1000); // the consumer is there now: skipped
      assert.equal(ring.lost, 2n);
      assert.deepEqual(take(ring, consumer), { first: 3n, actions: [4] });
      put(ring, a.reserve(1, 1000).offset, 6); // a goes on
      a.commit();
      assert.deepEqual(take(ring, consumer), { first: 4n, actions: [6] });
      for (const role of [early, a, late, consumer]) role.close();
    });
  });

  test("closing a producer with an open reservation does not stall the consumer", () => {
    withRing(create("cs", 8), (ring) => {
      const producer = ring.producer();
      const consumer = ring.consumer();
      put(ring, producer.reserve(1, 1000).offset, 1);
      producer.commit();
      producer.reserve(1, 1000); // e.g. filling it threw
      producer.close(); // given back: head moves back
      assert.equal(ring.head, 1n);
      assert.deepEqual(take(ring, consumer), { first: 0n, actions: [1] });
      assert.throws(() => consumer.take(8, 1000), ChannelClosedError); // the end of the stream, not a hang
      consumer.close();
    });
  });

  test("closing a producer whose reservation others reserved after leaves it as a dead producer's", () => {
    withRing(create("cm", 8, true), (ring) => {
      const early = ring.producer();
      const leaver = ring.producer();
      const late = ring.producer();
      const consumer = ring.consumer();
      put(ring, early.reserve(1, 1000).offset, 1); // record 0: still being written
      leaver.reserve(1, 1000); // record 1
      put(ring, late.reserve(1, 1000).offset, 3); // record 2
      late.commit();
      leaver.close(); // record 1 can be neither undone nor skipped yet: left as a dead one's
      early.commit();
      const got: number[] = [];
      while (got.length < 2) got.push(...take(ring, consumer, 5000).actions);
      assert.deepEqual(got, [1, 3]);
      assert.equal(ring.lost, 1n);
      for (const role of [early, late, consumer]) role.close();
    });
  });
});
