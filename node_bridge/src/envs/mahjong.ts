/**
 * The mahjong env: a simplified four-seat draw/discard/claim tile game on the mahjong_env schema.
 *
 * The Node twin of transport/envs/mahjong.py (its docstring has the rules): the same deal, the
 * same claims, masks and rewards, so the same seed and actions give byte-identical results in
 * both languages (tests/test_mahjong_tables.py compares the traces). One env is one table of
 * four seats; `agent` in every result names the seat that acts next.
 *
 * Deal: mulberry32 seeded with the pac env's `seedState`; the 136 tiles (kind k four times, in
 * kind order) are Fisher-Yates shuffled from the top (for i = 135 .. 1, swap tile i with tile
 * next() % (i + 1)); seat s gets tiles 13s .. 13s + 12, the wall is the rest, drawn from its end;
 * East draws a 14th. reset() without a seed keeps the generator running (a fresh env is seeded
 * with 0).
 */

import type { AgentStepInput } from "../generated/mahjong_env";
import type { Env, Spaces } from "../runtime/env";
import { mulberry32, seedState } from "./pac";

export const OBS_N = 290;
export const ACT_N = 104;
export const N_SEATS = 4;
export const N_KINDS = 34;
const HAND = 13;
const WALL = N_KINDS * 4 - N_SEATS * HAND - 1; // 83
export const A_CHOW = 34;
export const A_PUNG = 97;
export const A_WIN = 102;
export const A_PASS = 103;
const WIN_REWARD = 3;

const O_HAND = 0;
const O_DISCARDS = 34 + 8;
const O_MELDS = O_DISCARDS + 3 * 34;
const O_OWN_MELDS = O_MELDS + 3 * 34;
const O_SEAT_WIND = O_OWN_MELDS + 34;
const O_PREVAILING = O_SEAT_WIND + 4;
const O_WALL = O_PREVAILING + 4;
const O_TURN = O_WALL + 1;

const MELD_PUNG = 1; // MeldKind.PONG
const MELD_CHOW = 0; // MeldKind.CHI
const MAX_MELDS = 4; // AgentStep.melds

/** (first tile kind of the chow, position of the claimed tile) of a chow action. */
export function chowOf(action: number): [number, number] {
  const sequence = Math.floor((action - A_CHOW) / 3);
  const position = (action - A_CHOW) % 3;
  return [Math.floor(sequence / 7) * 9 + (sequence % 7), position];
}

function allSets(counts: Int32Array): boolean {
  for (let kind = 0; kind < N_KINDS; kind++) {
    while (counts[kind]! > 0) {
      if (counts[kind]! >= 3) {
        counts[kind]! -= 3; // a pung first is always safe (three chows = three pungs)
        continue;
      }
      if (kind >= 27 || kind % 9 > 6 || counts[kind + 1]! < 1 || counts[kind + 2]! < 1) {
        return false;
      }
      counts[kind]! -= 1;
      counts[kind + 1]! -= 1;
      counts[kind + 2]! -= 1;
    }
  }
  return true;
}

/** A hand of 3k + 2 tiles that forms k sets (pungs or chows) and a pair (its melds aside). */
export function isWinning(counts: Int32Array): boolean {
  let total = 0;
  for (let k = 0; k < N_KINDS; k++) total += counts[k]!;
  if (total % 3 !== 2) return false;
  for (let pair = 0; pair < N_KINDS; pair++) {
    if (counts[pair]! < 2) continue;
    const rest = Int32Array.from(counts);
    rest[pair]! -= 2;
    if (allSets(rest)) return true;
  }
  return false;
}

/** The chow actions that claim `tile` with two tiles of `hand`. */
export function chowOptions(hand: Int32Array, tile: number): number[] {
  if (tile >= 27) return [];
  const suit = Math.floor(tile / 9);
  const rank = tile % 9;
  const out: number[] = [];
  for (let position = 0; position < 3; position++) {
    const first = rank - position;
    if (first < 0 || first > 6) continue;
    let ok = true;
    for (let k = 0; k < 3; k++) {
      if (k !== position && hand[suit * 9 + first + k]! <= 0) ok = false;
    }
    if (ok) out.push(A_CHOW + 3 * (suit * 7 + first) + position);
  }
  return out;
}

/** The result object a MahjongEnv returns: the same object, overwritten by every call. */
export interface MahjongResult extends AgentStepInput {
  observation: Float32Array;
  action_mask: boolean[];
  melds: { kind: number; from_seat: number; tiles: number[] }[];
}

interface MeldRecord {
  kind: number;
  fromSeat: number;
  tiles: number[];
}

/** One table (rules in transport/envs/mahjong.py); returns one preallocated result object. */
export class MahjongEnv implements Env<MahjongResult> {
  /** mulberry32 state (unsigned 32-bit). */
  rng: number = seedState(0n);
  /** Concealed tiles per seat (seat * 34 + kind). */
  readonly hands = new Int32Array(N_SEATS * N_KINDS);
  /** Tiles in exposed melds per seat. */
  readonly melded = new Int32Array(N_SEATS * N_KINDS);
  readonly discards = new Int32Array(N_SEATS * N_KINDS);
  readonly scores = [0, 0, 0, 0];
  melds: MeldRecord[][] = [[], [], [], []];
  wall: number[] = [];
  current = 0;
  discarder = -1;
  claimers: number[] = [];
  turn = 0;
  lastDiscard = -1;
  episode = 0;
  over = false;

  readonly #result: MahjongResult = {
    agent: 0,
    terminated: false,
    truncated: false,
    seat_wind: 0,
    reward: 0,
    observation: new Float32Array(OBS_N),
    action_mask: new Array<boolean>(ACT_N).fill(false),
    prevailing_wind: 0,
    tiles_remaining: 0,
    turn: 0,
    melds: Array.from({ length: MAX_MELDS }, () => ({ kind: -1, from_seat: -1, tiles: [255, 255, 255, 255] })),
    score: 0,
    episode_id: 0,
    hand_value: 0,
    last_discard: -1,
    dealer_streak: 0,
  };

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  reset(seed?: bigint): MahjongResult {
    if (seed !== undefined) this.rng = seedState(BigInt.asUintN(64, BigInt(seed)));
    this.#deal();
    return this.#write(this.current, 0, false);
  }

  step(action: number): MahjongResult {
    if (this.over) throw new Error("the hand is over: reset first");
    const seat = this.current;
    if (this.discarder >= 0) return this.#claim(seat, action);
    const hand = this.#hand(seat);
    if (action === A_WIN) {
      if (!isWinning(hand)) throw new RangeError(`seat ${seat} cannot win with this hand`);
      return this.#win(seat);
    }
    if (!(Number.isInteger(action) && action >= 0 && action < N_KINDS && hand[action]! > 0)) {
      throw new RangeError(`seat ${seat} cannot discard tile kind ${action}`);
    }
    hand[action]! -= 1;
    this.discards[seat * N_KINDS + action]! += 1;
    this.lastDiscard = action;
    this.turn += 1;
    this.discarder = seat;
    this.#offer();
    if (this.claimers.length > 0) {
      this.current = this.claimers.shift()!;
      return this.#write(this.current, 0, false);
    }
    return this.#nextDraw();
  }

  // -- the game ----------------------------------------------------------------------------------

  /** The pac env's generator (mulberry32), portable to Python. */
  #next(): number {
    return mulberry32(this);
  }

  #hand(seat: number): Int32Array {
    return this.hands.subarray(seat * N_KINDS, (seat + 1) * N_KINDS);
  }

  #deal(): void {
    const tiles: number[] = [];
    for (let kind = 0; kind < N_KINDS; kind++) tiles.push(kind, kind, kind, kind);
    for (let i = tiles.length - 1; i > 0; i--) {
      const j = this.#next() % (i + 1);
      const swap = tiles[i]!;
      tiles[i] = tiles[j]!;
      tiles[j] = swap;
    }
    this.hands.fill(0);
    this.melded.fill(0);
    this.discards.fill(0);
    this.melds = [[], [], [], []];
    for (let seat = 0; seat < N_SEATS; seat++) {
      for (let k = seat * HAND; k < (seat + 1) * HAND; k++) this.hands[seat * N_KINDS + tiles[k]!]! += 1;
    }
    this.wall = tiles.slice(N_SEATS * HAND);
    this.current = 0;
    this.discarder = -1;
    this.claimers = [];
    this.hands[this.wall.pop()!]! += 1; // East's 14th tile
    this.turn = 0;
    this.lastDiscard = -1;
    this.episode += 1;
    this.over = false;
  }

  /** What `seat` may do with the discard on offer (pass aside). */
  #claims(seat: number): number[] {
    const tile = this.lastDiscard;
    const hand = this.#hand(seat);
    const options: number[] = [];
    const withTile = Int32Array.from(hand);
    withTile[tile]! += 1;
    if (isWinning(withTile)) options.push(A_WIN);
    if (hand[tile]! >= 2) options.push(A_PUNG);
    if (seat === (this.discarder + 1) % N_SEATS) options.push(...chowOptions(hand, tile));
    return options;
  }

  /** Queue the seats that can claim the discard: winners first, then pung, then chow. */
  #offer(): void {
    const ranked: [number, number][] = [];
    for (let k = 1; k < N_SEATS; k++) {
      const seat = (this.discarder + k) % N_SEATS;
      const options = this.#claims(seat);
      if (options.length === 0) continue;
      ranked.push([seat, options.includes(A_WIN) ? 0 : options.includes(A_PUNG) ? 1 : 2]);
    }
    ranked.sort((a, b) => a[1] - b[1]); // stable: seat order within a priority
    this.claimers = ranked.map(([seat]) => seat);
  }

  #fillMask(seat: number, out: boolean[]): void {
    out.fill(false);
    if (this.discarder >= 0) {
      for (const action of this.#claims(seat)) out[action] = true;
      out[A_PASS] = true;
      return;
    }
    const hand = this.#hand(seat);
    for (let k = 0; k < N_KINDS; k++) out[k] = hand[k]! > 0;
    out[A_WIN] = isWinning(hand);
  }

  #write(seat: number, reward: number, terminated: boolean): MahjongResult {
    const out = this.#result;
    out.agent = seat;
    out.terminated = terminated;
    out.truncated = false;
    out.seat_wind = seat;
    out.reward = reward;
    const obs = out.observation;
    obs.fill(0);
    for (let k = 0; k < N_KINDS; k++) {
      obs[O_HAND + k] = this.hands[seat * N_KINDS + k]! / 4;
      obs[O_OWN_MELDS + k] = this.melded[seat * N_KINDS + k]! / 4;
    }
    for (let d = 1; d < N_SEATS; d++) {
      const other = (seat + d) % N_SEATS;
      for (let k = 0; k < N_KINDS; k++) {
        obs[O_DISCARDS + (d - 1) * N_KINDS + k] = this.discards[other * N_KINDS + k]! / 4;
        obs[O_MELDS + (d - 1) * N_KINDS + k] = this.melded[other * N_KINDS + k]! / 4;
      }
    }
    obs[O_SEAT_WIND + seat] = 1;
    obs[O_PREVAILING] = 1;
    obs[O_WALL] = this.wall.length / WALL;
    obs[O_TURN] = Math.min(this.turn, WALL) / WALL;
    if (terminated) out.action_mask.fill(false);
    else this.#fillMask(seat, out.action_mask);
    out.prevailing_wind = 0;
    out.tiles_remaining = this.wall.length;
    out.turn = this.turn;
    const mine = this.melds[seat]!;
    for (let m = 0; m < MAX_MELDS; m++) {
      const slot = out.melds[m]!;
      const meld = mine[m];
      slot.kind = meld === undefined ? -1 : meld.kind;
      slot.from_seat = meld === undefined ? -1 : meld.fromSeat;
      for (let t = 0; t < 4; t++) slot.tiles[t] = meld?.tiles[t] ?? 255;
    }
    out.score = this.scores[seat]!;
    out.episode_id = this.episode;
    out.hand_value = terminated ? reward : 0;
    out.last_discard = this.discarder >= 0 ? this.lastDiscard : -1;
    out.dealer_streak = 0;
    return out;
  }

  #win(seat: number): MahjongResult {
    this.over = true;
    for (let s = 0; s < N_SEATS; s++) this.scores[s]! -= 1;
    this.scores[seat]! += N_SEATS;
    this.discarder = -1;
    return this.#write(seat, WIN_REWARD, true);
  }

  /** Nobody claimed the discard: the seat after the discarder draws (or the hand is over). */
  #nextDraw(): MahjongResult {
    this.current = (this.discarder + 1) % N_SEATS;
    this.discarder = -1;
    if (this.wall.length === 0) {
      this.over = true;
      return this.#write(this.current, 0, true);
    }
    this.hands[this.current * N_KINDS + this.wall.pop()!]! += 1;
    return this.#write(this.current, 0, false);
  }

  /** `seat` claims the discard on offer into a meld of `tiles` and discards next. */
  #meld(seat: number, kind: number, tiles: number[]): void {
    const tile = this.lastDiscard;
    this.discards[this.discarder * N_KINDS + tile]! -= 1; // the discard leaves the river
    this.hands[seat * N_KINDS + tile]! += 1;
    for (const t of tiles) {
      this.hands[seat * N_KINDS + t]! -= 1;
      this.melded[seat * N_KINDS + t]! += 1;
    }
    this.melds[seat]!.push({ kind, fromSeat: this.discarder, tiles });
    this.current = seat;
    this.discarder = -1;
    this.claimers = [];
  }

  /** `seat` answers the offer of the last discard: pass, win, pung or chow. */
  #claim(seat: number, action: number): MahjongResult {
    const tile = this.lastDiscard;
    if (action !== A_PASS && !this.#claims(seat).includes(action)) {
      throw new RangeError(`seat ${seat} cannot claim tile kind ${tile} with action ${action}`);
    }
    if (action === A_WIN) {
      this.hands[seat * N_KINDS + tile]! += 1;
      this.discards[this.discarder * N_KINDS + tile]! -= 1;
      return this.#win(seat);
    }
    if (action === A_PUNG) {
      this.#meld(seat, MELD_PUNG, [tile, tile, tile]);
      return this.#write(seat, 0, false);
    }
    if (action !== A_PASS) {
      const [first] = chowOf(action);
      this.#meld(seat, MELD_CHOW, [first, first + 1, first + 2]);
      return this.#write(seat, 0, false);
    }
    if (this.claimers.length > 0) {
      this.current = this.claimers.shift()!;
      return this.#write(this.current, 0, false);
    }
    return this.#nextDraw();
  }
}
