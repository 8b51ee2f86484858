/** pac_env requests handed straight to a Session (no socket): the node:test suites that
 * compare a session in this thread with one whose envs run in a worker pool. */

import assert from "node:assert/strict";

import * as pac_env from "../generated/pac_env";
import { type AutoReset, MESSAGE_IDS as IDS, encodeHello } from "../protocol";
import type { Session } from "../runtime/session";

/** HELLO with pac_env's fingerprint and auto-reset `mode` (asserts it is accepted). */
export function hello(session: Session, mode: AutoReset): void {
  const body = encodeHello(pac_env.SCHEMA.fingerprint, undefined, mode);
  assert.equal(session.handle(IDS.HELLO_REQ, body, 0, body.byteLength), IDS.HELLO_RESP);
}

/** STEP_BATCH of one i32 action per env; the response's message type. */
export function step(session: Session, actions: readonly number[]): number {
  const body = Buffer.alloc(4 * actions.length);
  actions.forEach((a, i) => body.writeInt32LE(a, 4 * i));
  return session.handle(IDS.STEP_BATCH_REQ, body, 0, body.byteLength);
}

/** RESET (null) or RESET_SEED (`seed`); the response's message type. */
export function reset(session: Session, seed: bigint | null = null): number {
  if (seed === null) return session.handle(IDS.RESET_REQ, new Uint8Array(0), 0, 0);
  const body = Buffer.alloc(8);
  body.writeBigUInt64LE(seed);
  return session.handle(IDS.RESET_SEED_REQ, body, 0, 8);
}
