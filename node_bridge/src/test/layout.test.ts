/** The seed layouts come out byte for byte (seed 000 Appendix A and B). */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { dataViewOf } from "../codec";
import { mahjong_env, pac_env, pac_shm } from "../generated";
import type { SchemaJson } from "../ir";
import { stepResult } from "../testing/fixtures";

function offsets(ir: SchemaJson, struct: string): Record<string, number> {
  const fields = ir.structs[struct]?.fields ?? [];
  return Object.fromEntries(fields.map((f) => [f.name, f.offset]));
}

describe("pac_env (Appendix A)", () => {
  test("StepResult offsets and size", () => {
    assert.equal(pac_env.StepResultCodec.size, 2557);
    assert.deepEqual(offsets(pac_env.IR, "StepResult"), {
      observation: 0,
      action_mask: 2448,
      reward: 2540,
      done: 2544,
      rank: 2545,
      life: 2546,
      money: 2548,
      stage: 2550,
      board_size: 2552,
      level: 2553,
      synergy_count: 2554,
      items_held: 2555,
      actions_this_turn: 2556,
    });
  });

  test("encoded StepResult puts each field at its offset", () => {
    const bytes = pac_env.StepResultCodec.encode(stepResult());
    const dv = dataViewOf(bytes);
    assert.equal(bytes.length, 2557);
    assert.equal(dv.getFloat32(0, true), 0);
    assert.equal(dv.getFloat32(4 * 611, true), 611 / 8);
    assert.equal(bytes[2448], 0);
    assert.equal(bytes[2449], 1);
    assert.equal(dv.getFloat32(2540, true), 1.5);
    assert.equal(bytes[2544], 1);
    assert.equal(bytes[2545], 2);
    assert.equal(dv.getUint16(2546, true), 300);
    assert.equal(dv.getUint16(2548, true), 65535);
    assert.equal(dv.getUint16(2550, true), 7);
    assert.deepEqual([...bytes.subarray(2552)], [9, 3, 4, 5, 6]);
  });

  test("other struct sizes", () => {
    assert.equal(pac_env.FrameHeaderCodec.size, 9);
    assert.equal(pac_env.StepMultiResultCodec.size, 8 * 2557);
    assert.equal(pac_env.HelloCodec.size, 12);
    assert.equal(pac_env.MessageId.HELLO_REQ, 0x0d);
    assert.equal(pac_env.MessageId.ERROR, 0x0f);
  });
});

describe("pac_shm (Appendix B)", () => {
  test("ControlBlock is 64 bytes with the fingerprint at 24 and state at 36", () => {
    assert.equal(pac_shm.ControlBlockCodec.size, 64);
    const at = offsets(pac_shm.IR, "ControlBlock");
    assert.equal(at["fingerprint"], 24);
    assert.equal(at["state"], 36);
    assert.equal(at["client_pid"], 60);
  });

  test("Slot is 5120 bytes with the observation at 32 and the mask at 2480", () => {
    assert.equal(pac_shm.SlotCodec.size, 5120);
    const at = offsets(pac_shm.IR, "Slot");
    assert.equal(at["observation"], 32);
    assert.equal(at["action_mask"], 2480);
    assert.equal(at["reward"], 16);
  });
});

describe("mahjong_env (natural alignment)", () => {
  test("ActionRequest has a padding byte at 1", () => {
    assert.equal(mahjong_env.ActionRequestCodec.size, 4);
    assert.deepEqual(offsets(mahjong_env.IR, "ActionRequest"), { agent: 0, action: 2 });
  });

  test("ScoreUpdate ends in two padding bytes", () => {
    assert.equal(mahjong_env.ScoreUpdateCodec.size, 32);
    assert.equal(offsets(mahjong_env.IR, "ScoreUpdate")["fan"], 26);
  });
});
