/**
 * A small, real Tetris as an env on the tetris schema (schema/tetris.toml, examples/tetris/).
 *
 * Rules:
 * - A 20 x 10 board (row 0 at the top), the 7 tetrominoes I O T S Z J L (piece ids 0-6), drawn
 *   from a 7-bag: each bag is a seeded shuffle of the 7 pieces.
 * - An action is a placement, `rotation * 10 + column` (40): the piece at that rotation, its
 *   leftmost cell in that column, hard-dropped straight down from above the board. A placement
 *   is legal (action_mask 1) when the piece fits inside the board's width there and, dropped
 *   from above, comes to rest with every cell inside the board. Rotations are clockwise quarter turns of the spawn shape
 *   (`ROTATIONS`); the O piece's four rotations are the same shape, S, Z and I have two each.
 * - Full rows are cleared; the reward is 0, 1, 3, 5 or 8 for 0-4 lines.
 * - The episode ends (done, top-out) when the next piece has no legal placement, or is
 *   truncated (done and truncated) after `maxSteps` pieces.
 * - RNG: mulberry32 (32-bit), seeded with fmix32(lo ^ fmix32(hi ^ 0x9E3779B9)) from the u64
 *   seed (the pac env's). reset() without a seed keeps the RNG running; a fresh env is seeded
 *   with 0.
 *
 * Observation (214 f32): [0, 200) the board, 1 where a cell is filled; [200, 207) the current
 * piece one-hot; [207, 214) the next piece one-hot. Every step reuses one result object and
 * its typed arrays: a step allocates nothing.
 */

import type { Env, Spaces } from "../runtime/env";
import type { StepResultInput } from "../generated/tetris";

export const ROWS = 20;
export const COLS = 10;
export const N_PIECES = 7;
export const N_ROTATIONS = 4;
export const OBS_N = ROWS * COLS + 2 * N_PIECES; // 214
export const ACT_N = N_ROTATIONS * COLS; // 40
export const PIECE_NAMES = "IOTSZJL";
export const LINE_REWARDS: readonly number[] = [0, 1, 3, 5, 8];
export const DEFAULT_MAX_STEPS = 1000;

/** The spawn shapes: (row, column) cells, top-left at (0, 0). */
const SPAWN: readonly (readonly (readonly [number, number])[])[] = [
  [[0, 0], [0, 1], [0, 2], [0, 3]], // I
  [[0, 0], [0, 1], [1, 0], [1, 1]], // O
  [[0, 1], [1, 0], [1, 1], [1, 2]], // T
  [[0, 1], [0, 2], [1, 0], [1, 1]], // S
  [[0, 0], [0, 1], [1, 1], [1, 2]], // Z
  [[0, 0], [1, 0], [1, 1], [1, 2]], // J
  [[0, 2], [1, 0], [1, 1], [1, 2]], // L
];

/** One rotation of a piece: its cells, width, and per column its lowest cell's row. */
export interface Rotation {
  readonly cells: readonly (readonly [number, number])[];
  readonly width: number;
  /** bottom[dc]: the largest row of the piece's cells in its column dc. */
  readonly bottom: readonly number[];
}

/** A clockwise quarter turn, (r, c) -> (c, -r), moved back to the top-left corner; sorted. */
function turn(cells: readonly (readonly [number, number])[]): [number, number][] {
  const turned = cells.map(([r, c]) => [c, -r] as [number, number]);
  const minR = Math.min(...turned.map(([r]) => r));
  const minC = Math.min(...turned.map(([, c]) => c));
  return turned
    .map(([r, c]) => [r - minR, c - minC] as [number, number])
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
}

function rotationOf(cells: readonly (readonly [number, number])[]): Rotation {
  const width = Math.max(...cells.map(([, c]) => c)) + 1;
  const bottom = Array.from({ length: width }, (_, dc) =>
    Math.max(...cells.filter(([, c]) => c === dc).map(([r]) => r)),
  );
  return { cells, width, bottom };
}

/** ROTATIONS[piece][rotation]. */
export const ROTATIONS: readonly (readonly Rotation[])[] = SPAWN.map((spawn) => {
  const out: Rotation[] = [];
  let cells = turn(turn(turn(turn(spawn)))); // normalised spawn (sorted)
  for (let r = 0; r < N_ROTATIONS; r++) {
    out.push(rotationOf(cells));
    cells = turn(cells);
  }
  return out;
});

function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** mulberry32, seeded from a u64 like the pac env. */
export class Rng {
  #state = 0;

  constructor(seed: bigint = 0n) {
    this.seed(seed);
  }

  seed(seed: bigint): void {
    const value = BigInt.asUintN(64, seed);
    const lo = Number(value & 0xffffffffn);
    const hi = Number(value >> 32n);
    this.#state = fmix32((lo ^ fmix32((hi ^ 0x9e3779b9) >>> 0)) >>> 0);
  }

  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) | 0;
    let t = Math.imul(this.#state ^ (this.#state >>> 15), 1 | this.#state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return (t ^ (t >>> 14)) >>> 0;
  }

  /** 0..n-1 */
  below(n: number): number {
    return this.next() % n;
  }
}

/** The result object a TetrisEnv returns: the same object, overwritten by every call. */
export interface TetrisResult extends StepResultInput {
  observation: Float32Array;
  action_mask: Uint8Array;
  reward: number;
  done: number;
  truncated: number;
  lines: number;
  piece: number;
  total_lines: number;
  pieces: number;
}

export interface TetrisOptions {
  /** Pieces per episode before it is truncated (default 1000). */
  readonly maxSteps?: number;
}

/** The Tetris game and env. */
export class TetrisEnv implements Env<TetrisResult> {
  /** board[r * COLS + c]: 1 when filled. */
  readonly board = new Uint8Array(ROWS * COLS);
  readonly maxSteps: number;
  readonly rng = new Rng(0n);
  current = 0;
  next = 0;
  readonly #bag = new Uint8Array(N_PIECES);
  #bagIndex = N_PIECES;
  /** top[c]: the row of column c's highest filled cell (ROWS when empty). */
  readonly #top = new Int32Array(COLS);
  readonly #result: TetrisResult = {
    observation: new Float32Array(OBS_N),
    action_mask: new Uint8Array(ACT_N),
    reward: 0,
    done: 0,
    truncated: 0,
    lines: 0,
    piece: 0,
    total_lines: 0,
    pieces: 0,
  };

  constructor(options: TetrisOptions = {}) {
    this.maxSteps = options.maxSteps ?? DEFAULT_MAX_STEPS;
  }

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  reset(seed?: bigint): TetrisResult {
    if (seed !== undefined) {
      this.rng.seed(seed);
      this.#bagIndex = N_PIECES; // a seeded reset starts a fresh bag
    }
    this.board.fill(0);
    const out = this.#result;
    out.reward = 0;
    out.done = 0;
    out.truncated = 0;
    out.lines = 0;
    out.total_lines = 0;
    out.pieces = 0;
    this.current = this.#draw();
    this.next = this.#draw();
    this.#finish();
    return out;
  }

  step(action: number): TetrisResult {
    const out = this.#result;
    const rotation = Math.floor(action / COLS);
    const column = action % COLS;
    const row = this.landingRow(this.current, rotation, column);
    if (out.done || row < 0) {
      // the server refuses masked actions and steps after done; a direct caller gets an error
      throw new RangeError(`placement ${action} is not legal now`);
    }
    for (const [r, c] of ROTATIONS[this.current]![rotation]!.cells) {
      this.board[(row + r) * COLS + column + c] = 1;
    }
    const lines = this.#clearLines();
    out.lines = lines;
    out.reward = LINE_REWARDS[lines] as number;
    out.total_lines += lines;
    out.pieces += 1;
    this.current = this.next;
    this.next = this.#draw();
    this.#finish();
    return out;
  }

  /** Replace the board (ROWS * COLS cells, 0 or 1; tests, puzzles); the mask follows it. */
  setBoard(cells: ArrayLike<number>): TetrisResult {
    if (cells.length !== ROWS * COLS) throw new RangeError(`a board has ${ROWS * COLS} cells`);
    for (let i = 0; i < ROWS * COLS; i++) this.board[i] = cells[i] ? 1 : 0;
    this.#finish();
    return this.#result;
  }

  /**
   * The row where the placement's top-left corner lands when hard-dropped, or -1 when the
   * placement is not legal (outside the board, or blocked at the top).
   */
  landingRow(piece: number, rotation: number, column: number): number {
    const rot = ROTATIONS[piece]![rotation]!;
    if (column + rot.width > COLS) return -1;
    const top = this.#top;
    let row = ROWS;
    for (let dc = 0; dc < rot.width; dc++) {
      const r = (top[column + dc] as number) - 1 - (rot.bottom[dc] as number);
      if (r < row) row = r;
    }
    return row < 0 ? -1 : row;
  }

  #draw(): number {
    if (this.#bagIndex >= N_PIECES) {
      const bag = this.#bag;
      for (let i = 0; i < N_PIECES; i++) bag[i] = i;
      for (let i = N_PIECES - 1; i > 0; i--) {
        const j = this.rng.below(i + 1);
        const t = bag[i] as number;
        bag[i] = bag[j] as number;
        bag[j] = t;
      }
      this.#bagIndex = 0;
    }
    return this.#bag[this.#bagIndex++] as number;
  }

  #clearLines(): number {
    const board = this.board;
    let lines = 0;
    let write = ROWS - 1;
    for (let read = ROWS - 1; read >= 0; read--) {
      let full = true;
      for (let c = 0; c < COLS; c++) {
        if (!board[read * COLS + c]) {
          full = false;
          break;
        }
      }
      if (full) {
        lines++;
        continue;
      }
      if (write !== read) board.copyWithin(write * COLS, read * COLS, read * COLS + COLS);
      write--;
    }
    if (write >= 0) board.fill(0, 0, (write + 1) * COLS);
    return lines;
  }

  /** Column tops, the mask, done and the observation for the current piece. */
  #finish(): void {
    const board = this.board;
    const top = this.#top;
    for (let c = 0; c < COLS; c++) {
      let r = 0;
      while (r < ROWS && !board[r * COLS + c]) r++;
      top[c] = r;
    }
    const out = this.#result;
    const mask = out.action_mask;
    let legal = 0;
    for (let rotation = 0; rotation < N_ROTATIONS; rotation++) {
      for (let column = 0; column < COLS; column++) {
        const ok = this.landingRow(this.current, rotation, column) >= 0 ? 1 : 0;
        mask[rotation * COLS + column] = ok;
        legal += ok;
      }
    }
    out.piece = this.current;
    out.truncated = legal > 0 && out.pieces >= this.maxSteps ? 1 : 0;
    out.done = legal === 0 || out.truncated ? 1 : 0;
    const obs = out.observation;
    for (let i = 0; i < ROWS * COLS; i++) obs[i] = board[i] as number;
    obs.fill(0, ROWS * COLS);
    obs[ROWS * COLS + this.current] = 1;
    obs[ROWS * COLS + N_PIECES + this.next] = 1;
  }
}
