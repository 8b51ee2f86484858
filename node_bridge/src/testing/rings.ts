/**
 * Rings of the `experience` schema's `Transition` records for the ring tests (ring_abort,
 * ring_push): each under a unique name, taken by action, closed and unlinked whatever happens.
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";

import { type Consumer, Ring, type RingPolicy } from "../channels";
import { experience } from "../generated";

export const codec = experience.TransitionCodec;
export type Transition = ReturnType<typeof codec.decode>;
export const ZERO: Transition = codec.decode(new Uint8Array(codec.size));

let counter = 0;

/** A new ring named `prefix` + `tag`, unique to this process. */
export function createRing(
  prefix: string,
  tag: string,
  capacity: number,
  options: { multiProducer?: boolean; policy?: RingPolicy } = {},
): Ring {
  return Ring.create(`${prefix}${tag}-${process.pid}-${counter++}`, experience.SCHEMA, "Transition", capacity, options);
}

/** Take what is there (up to `max` records, waiting up to `timeoutMs`): its first index and actions. */
export function takeActions(ring: Ring, consumer: Consumer, max: number, timeoutMs = 1000): { first: bigint; actions: number[] } {
  const batch = consumer.take(max, timeoutMs);
  const actions: number[] = [];
  for (let i = 0; i < batch.count; i++) actions.push(codec.view(ring.segment.bytes, batch.offsetOf(i)).action);
  batch.release();
  return { first: batch.first, actions };
}

/** Run `body` with a ring that is closed (and unlinked) whatever happens. */
export function withRing(ring: Ring, body: (ring: Ring) => void): void {
  const path = ring.segment.path;
  try {
    body(ring);
  } finally {
    ring.close();
    assert.equal(existsSync(path), false);
  }
}
