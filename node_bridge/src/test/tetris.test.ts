/**
 * The Tetris example: the game's rules (7-bag, legal placements, line clears, top-out) and the
 * generic Session serving it on its own schema (tetris.toml) over a real unix:// server.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import {
  ACT_N,
  COLS,
  N_PIECES,
  OBS_N,
  ROTATIONS,
  ROWS,
  TetrisEnv,
} from "../examples/tetris";
import * as tetris from "../generated/tetris";
import { RemoteError, connect, serve } from "../index";
import { ErrorCode } from "../protocol";

/**
 * Legal by simulation: the piece enters above the board and moves down one row at a time while
 * its cells (those inside the board) are free; legal when it stops with every cell inside.
 */
function bruteForceLegal(env: TetrisEnv, action: number): boolean {
  const rot = ROTATIONS[env.current]![Math.floor(action / COLS)]!;
  const column = action % COLS;
  if (column + rot.width > COLS) return false;
  const free = (y: number): boolean =>
    rot.cells.every(([r, c]) => y + r < ROWS && (y + r < 0 || !env.board[(y + r) * COLS + column + c]));
  let y = -4;
  while (free(y + 1)) y++;
  const legal = y >= 0;
  assert.equal(env.landingRow(env.current, Math.floor(action / COLS), column), legal ? y : -1);
  return legal;
}

describe("Tetris rules", () => {
  test("shapes: 4 cells each, I/S/Z have 2 distinct rotations, O one, T/J/L four", () => {
    const distinct = ROTATIONS.map(
      (rots) => new Set(rots.map((rot) => JSON.stringify(rot.cells))).size,
    );
    assert.deepEqual(distinct, [2, 1, 4, 2, 2, 4, 4]);
    for (const rots of ROTATIONS) for (const rot of rots) assert.equal(rot.cells.length, 4);
  });

  test("the 7-bag deals every piece once per 7 draws", () => {
    const env = new TetrisEnv();
    env.reset(11n);
    const seen: number[] = [env.current, env.next];
    for (let i = 0; seen.length < 5 * N_PIECES; i++) {
      const result = env.step(firstLegal(Array.from(stepMask(env))));
      if (result.done) break;
      seen.push(env.next);
    }
    for (let bag = 0; bag + N_PIECES <= seen.length; bag += N_PIECES) {
      assert.deepEqual([...seen.slice(bag, bag + N_PIECES)].sort(), [0, 1, 2, 3, 4, 5, 6]);
    }
  });

  test("the mask is exactly the placements that fit, and play ends in a top-out", () => {
    const env = new TetrisEnv();
    let result = env.reset(3n);
    let steps = 0;
    let state = 12345;
    while (!result.done) {
      const legal: number[] = [];
      for (let a = 0; a < ACT_N; a++) {
        assert.equal(result.action_mask[a] === 1, bruteForceLegal(env, a), `action ${a}`);
        if (result.action_mask[a]) legal.push(a);
      }
      state = (Math.imul(state, 1103515245) + 12345) >>> 0;
      result = env.step(legal[state % legal.length] as number);
      steps++;
    }
    assert.equal(result.truncated, 0);
    assert.equal(result.action_mask.reduce((a, b) => a + b, 0), 0);
    assert.equal(result.pieces, steps);
    assert.throws(() => env.step(0), RangeError);
  });

  test("a full row is cleared and rewarded; the board shifts down", () => {
    const env = new TetrisEnv();
    let seed = 1n;
    env.reset(seed);
    while (env.current === 3 || env.current === 4) env.reset(++seed); // S and Z have no flat bottom
    // fill the bottom row but for the columns the current piece's flat rotation covers
    const piece = env.current;
    const rotation = ROTATIONS[piece]!.findIndex((rot) => rot.bottom.every((b) => b === Math.max(...rot.bottom)));
    const rot = ROTATIONS[piece]![rotation]!;
    const bottomCells = rot.cells.filter(([r]) => r === Math.max(...rot.bottom)).map(([, c]) => c);
    assert.equal(bottomCells.length, rot.width);
    const board = new Uint8Array(ROWS * COLS);
    for (let c = rot.width; c < COLS; c++) board[(ROWS - 1) * COLS + c] = 1;
    board[(ROWS - 2) * COLS + COLS - 1] = 1; // a cell above, which must move down
    env.setBoard(board);
    const result = env.step(rotation * COLS + 0);
    assert.equal(result.lines, 1);
    assert.equal(result.reward, 1);
    assert.equal(result.total_lines, 1);
    assert.equal(env.board[(ROWS - 1) * COLS + COLS - 1], 1);
    assert.equal(result.observation[(ROWS - 1) * COLS + COLS - 1], 1);
    assert.equal(result.observation.length, OBS_N);
  });

  test("seeded resets replay; maxSteps truncates", () => {
    const a = new TetrisEnv({ maxSteps: 3 });
    const b = new TetrisEnv({ maxSteps: 3 });
    const first = Array.from(a.reset(5n).observation);
    assert.deepEqual(Array.from(b.reset(5n).observation), first);
    let result = a.reset(5n);
    for (let i = 0; i < 3; i++) result = a.step(firstLegal(Array.from(result.action_mask)));
    assert.equal(result.done, 1);
    assert.equal(result.truncated, 1);
  });
});

function stepMask(env: TetrisEnv): Uint8Array {
  const mask = new Uint8Array(ACT_N);
  for (let a = 0; a < ACT_N; a++) mask[a] = bruteForceLegal(env, a) ? 1 : 0;
  return mask;
}

function firstLegal(mask: readonly number[]): number {
  const a = mask.indexOf(1);
  assert.ok(a >= 0, "no legal placement");
  return a;
}

describe("Tetris over the generic Session", () => {
  test("serve on the tetris schema: spaces, masks enforced, same_step auto-reset", async () => {
    const url = `unix://${join(tmpdir(), `transport-tetris-${randomBytes(6).toString("hex")}.sock`)}`;
    const server = await serve(() => new TetrisEnv({ maxSteps: 50 }), url, {
      schema: tetris.SCHEMA,
      envName: "tetris",
      numEnvs: 2,
      validate: false,
    });
    try {
      const client = await connect<tetris.StepResultView, tetris.StepResult>(server.url, {
        schema: tetris.SCHEMA,
        autoreset: "same_step",
      });
      try {
        assert.equal(client.serverInfo.env, "tetris");
        assert.deepEqual(await client.spaces(), { obsN: OBS_N, actN: ACT_N });
        let results = (await client.reset(9n)) as tetris.StepResultView[];
        const masked = Array.from(results[0]!.action_mask).indexOf(0);
        assert.ok(masked >= 0, "some placement is illegal at the start (e.g. I vertical at column 9? width)");
        await assert.rejects(client.step([masked, 0]), (error: unknown) => {
          assert.ok(error instanceof RemoteError);
          assert.equal(error.code, ErrorCode.MASKED_ACTION);
          return true;
        });
        let ended = 0;
        for (let i = 0; i < 200 && ended < 2; i++) {
          const actions = results.map((r) => firstLegal(Array.from(r.action_mask)));
          results = (await client.step(actions)) as tetris.StepResultView[];
          for (const { result } of client.finals) {
            ended++;
            assert.equal(result.done, 1);
          }
          for (const r of results) assert.equal(r.done, 0);
        }
        assert.ok(ended >= 2);
      } finally {
        await client.close();
      }
    } finally {
      await server.close();
    }
  });
});
