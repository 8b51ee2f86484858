/** The seed layouts come out byte for byte (seed 000 Appendix A and B). */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { dataViewOf } from "../codec";
import { mahjong_env, pac_env, pac_shm, tetris } from "../generated";
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

describe("shm layouts in the env schemas (IR.shm, SHM_LAYOUT)", () => {
  const CONTROL = {
    magic: 0,
    version: 4,
    num_envs: 8,
    obs_size: 12,
    act_size: 16,
    slot_size: 20,
    fingerprint: 24,
    owner_pid: 32,
    state: 36,
    owner_start_time: 40,
    client_start_time: 48,
    doorbell: 56,
    client_pid: 60,
  };

  test("pac_env's pac_shm profile is Appendix B: slot 5120, action 12, observation 32", () => {
    const shm = pac_env.IR.shm;
    assert.ok(shm !== undefined && pac_env.IR.env !== undefined);
    assert.equal(shm.profile, "pac_shm");
    assert.equal(pac_env.SCHEMA.ir.shm, shm);
    assert.deepEqual(offsets(pac_env.IR, shm.control), CONTROL);
    assert.equal(pac_env.ShmSlotCodec.size, 5120);
    assert.equal(pac_env.ShmFinalCodec.size, 2576);
    assert.deepEqual(shm.request_offsets, { action: 12 });
    const result = shm.result_offsets;
    assert.equal(result["reward"], 16);
    assert.equal(result["done"], 20);
    assert.equal(result["items_held"], 31);
    assert.equal(result["observation"], 32);
    assert.equal(result["action_mask"], 2480);
    assert.deepEqual(shm.final_result_offsets, result);
    assert.deepEqual(pac_env.SHM_LAYOUT.resultOffsets, result);
    assert.equal(pac_env.SHM_LAYOUT.slotSize, 5120);
    // the profile's Slot, copied: the same offsets as pac_shm.toml's
    assert.deepEqual(offsets(pac_env.IR, shm.slot), offsets(pac_shm.IR, "Slot"));
  });

  test("tetris derives a cache-line aligned layout; every offset is in IR.shm", () => {
    const shm = tetris.IR.shm;
    assert.ok(shm !== undefined);
    assert.equal(shm.profile, "derived");
    assert.deepEqual(offsets(tetris.IR, shm.control), CONTROL);
    const slot = offsets(tetris.IR, shm.slot);
    assert.equal(slot["sem_action_ready"], 0);
    assert.equal(slot["sem_result_ready"], 4);
    assert.equal(slot["command"], 8);
    assert.equal(slot["request"], 64);
    assert.equal(slot["result"], 128);
    assert.equal(tetris.ShmSlotCodec.size % 64, 0);
    assert.deepEqual(shm.request_offsets, { action: 64 });
    assert.equal(shm.result_offsets["observation"], 128);
    assert.equal(shm.final_result_offsets["observation"], 64);
    // a result written through the codec lands at the flat offsets
    const buf = new Uint8Array(tetris.ShmSlotCodec.size);
    const dv = dataViewOf(buf);
    const obs = new Float32Array(214).map((_, i) => i);
    tetris.StepResultCodec.encodeInto(
      {
        observation: obs,
        action_mask: new Uint8Array(40).fill(1),
        reward: 3,
        done: 0,
        truncated: 0,
        lines: 2,
        piece: 4,
        total_lines: 9,
        pieces: 17,
      },
      buf,
      slot["result"],
    );
    assert.equal(dv.getFloat32((shm.result_offsets["observation"] as number) + 4 * 5, true), 5);
    assert.equal(dv.getFloat32(shm.result_offsets["reward"] as number, true), 3);
    assert.equal(dv.getUint32(shm.result_offsets["pieces"] as number, true), 17);
    assert.equal(tetris.SHM_LAYOUT.finalSize, tetris.ShmFinalCodec.size);
  });

  test("mahjong_env's derived slot keeps the request's padding byte", () => {
    const shm = mahjong_env.IR.shm;
    assert.ok(shm !== undefined);
    assert.deepEqual(shm.request_offsets, { agent: 64, action: 66 });
    assert.equal(shm.result_offsets["agent"], 128);
  });
});
