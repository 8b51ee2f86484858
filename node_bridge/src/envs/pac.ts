/**
 * The pac env: a small seeded auto-battler on the pac_env schema (seed 000, Appendix A).
 *
 * The Python env (transport/envs/pac.py) implements the same rules and produces the same bytes
 * for the same seed and actions. Rules (identical in both files):
 *
 * - 20 unit types; unit u costs 1 + u % 5 gold and has trait (3 * u) % 8. 22 slots: board 0-8,
 *   bench 9-16, shop 17-21. Start: life 100, money 5, stage 1, level 1, xp 0, no units or items,
 *   7 ghost opponents with life 100, a shop of 5 draws. The board holds at most `level` units.
 * - Actions (92): 0 end turn (always legal); 1 reroll the shop (2 gold); 2 buy 4 xp (4 gold,
 *   level < 9; a level costs 4 * level xp); 3-7 buy shop slot to the first free bench slot;
 *   8-16 sell board slot / 17-24 sell bench slot (refund the cost, its items return to the hand,
 *   at most 9 held); 25-32 move bench slot to the first free board slot; 33-41 move board slot to
 *   the first free bench slot; 42-50 put one held item on a board unit (at most 3 per unit);
 *   51-91 reserved (always masked). After 8 actions in a turn only "end turn" is legal.
 * - Synergies: traits with at least 2 board units. Board power = sum(2 * cost + 3 * items) +
 *   4 * synergies. End turn: a fight against power 2 * stage + rand(2 * stage + 6). A win pays
 *   1 gold, reward (8 + min(margin, 8)) / 8 and, one time in four, an item; a loss costs
 *   2 + deficit // 2 life, reward -damage / 8. Then income 5 + min(money // 10, 5) (money at most
 *   999), 2 xp, every living ghost loses rand(2 * stage + 6) life, stage + 1, a new shop.
 * - Other actions reward 2 * (change in synergies) / 8. rank = 1 + ghosts with more life. The
 *   episode ends when life is 0, all ghosts are out, or after stage 20's fight; the last reward
 *   adds 2 * (9 - 2 * rank) / 8.
 * - RNG: mulberry32 (32-bit), seeded with fmix32(lo ^ fmix32(hi ^ 0x9E3779B9)) from the u64 seed;
 *   rand(n) = next() % n. reset() without a seed keeps the RNG running (a fresh env is seeded
 *   with 0).
 *
 * Observation (612 f32, every value an integer times a power of two, so exact in both languages):
 * [0, 484) 22 slots x (20 unit one-hot, items / 4, cost / 8); [484, 492) board trait counts / 4;
 * [492, 502) life / 128, money / 64, stage / 32, level / 16, xp / 64, items held / 16,
 * actions this turn / 8, rank / 8, board units / 16, synergies / 8; [502, 509) ghost lives / 128;
 * [509, 512) last fight: power / 64, opponent / 64, won; [512, 604) the action mask;
 * [604, 612) (last action + 1) / 128, steps / 256, power / 64, wins / 32, losses / 32,
 * streak / 8, bench units / 8, board capacity / 16.
 *
 * Integer arithmetic stays in int32 (`| 0`, `Math.imul`, `>>> 0`), so no -0 or rounding appears.
 */

import type { Env, Spaces } from "../runtime/env";
import type { StepResultInput } from "../generated/pac_env";

export const OBS_N = 612;
export const ACT_N = 92;

const N_UNITS = 20;
const N_TRAITS = 8;
const N_BOARD = 9;
const N_BENCH = 8;
const N_SHOP = 5;
const N_SLOTS = N_BOARD + N_BENCH + N_SHOP;
const BENCH0 = N_BOARD;
const SHOP0 = N_BOARD + N_BENCH;
const SLOT_FEATURES = N_UNITS + 2;

const MAX_LEVEL = 9;
const MAX_STAGE = 20;
const MAX_ACTIONS_PER_TURN = 8;
const MAX_ITEMS_HELD = 9;
const MAX_ITEMS_PER_UNIT = 3;
const MAX_MONEY = 999;
const N_GHOSTS = 7;
const START_LIFE = 100;
const START_MONEY = 5;

// Action ranges (first action of each range).
const A_END = 0;
const A_REROLL = 1;
const A_XP = 2;
const A_BUY = 3;
const A_SELL_BOARD = 8;
const A_SELL_BENCH = 17;
const A_PLACE = 25;
const A_UNPLACE = 33;
const A_EQUIP = 42; // 42..50; 51..91 are reserved (always masked)

const COST = Int32Array.from({ length: N_UNITS }, (_, u) => 1 + (u % 5));
const TRAIT = Int32Array.from({ length: N_UNITS }, (_, u) => (3 * u) % N_TRAITS);

const O_TRAITS = N_SLOTS * SLOT_FEATURES; // 484
const O_SCALARS = O_TRAITS + N_TRAITS; // 492
const O_GHOSTS = O_SCALARS + 10; // 502
const O_FIGHT = O_GHOSTS + N_GHOSTS; // 509
const O_MASK = O_FIGHT + 3; // 512
const O_EXTRA = O_MASK + ACT_N; // 604

const SCALE: Float32Array = (() => {
  const scale = new Float32Array(OBS_N).fill(1);
  for (let s = 0; s < N_SLOTS; s++) {
    scale[s * SLOT_FEATURES + N_UNITS] = 1 / 4;
    scale[s * SLOT_FEATURES + N_UNITS + 1] = 1 / 8;
  }
  scale.fill(1 / 4, O_TRAITS, O_SCALARS);
  const scalars = [1 / 128, 1 / 64, 1 / 32, 1 / 16, 1 / 64, 1 / 16, 1 / 8, 1 / 8, 1 / 16, 1 / 8];
  scale.set(scalars, O_SCALARS);
  scale.fill(1 / 128, O_GHOSTS, O_FIGHT);
  scale.set([1 / 64, 1 / 64, 1], O_FIGHT);
  scale.set([1 / 128, 1 / 256, 1 / 64, 1 / 32, 1 / 32, 1 / 8, 1 / 8, 1 / 16], O_EXTRA);
  return scale;
})();

/** MurmurHash3's 32-bit finaliser (unsigned result). */
export function fmix32(h: number): number {
  h |= 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** The 32-bit RNG state for a 64-bit seed. */
export function seedState(seed: bigint): number {
  const lo = Number(seed & 0xffffffffn);
  const hi = Number((seed >> 32n) & 0xffffffffn);
  return fmix32(lo ^ fmix32(hi ^ 0x9e3779b9));
}

/** One mulberry32 step on `holder.rng` (unsigned 32-bit state): advances it and returns the
 * 32-bit output; the envs' portable generator (Python: `mulberry32` in transport/envs/pac.py). */
export function mulberry32(holder: { rng: number }): number {
  const s = (holder.rng + 0x6d2b79f5) >>> 0;
  holder.rng = s;
  let t = Math.imul(s ^ (s >>> 15), s | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return (t ^ (t >>> 14)) >>> 0;
}

/** The result object a PacEnv returns: the same object, overwritten by every call. */
export interface PacResult extends StepResultInput {
  observation: Float32Array;
  action_mask: Uint8Array;
}

/** The pac reference env (rules above); returns one preallocated result object. */
export class PacEnv implements Env<PacResult> {
  /** mulberry32 state (unsigned 32-bit). */
  rng: number = 0;
  readonly units = new Int32Array(N_SLOTS).fill(-1);
  readonly items = new Int32Array(N_SLOTS);
  readonly ghosts = new Int32Array(N_GHOSTS);
  life = 0;
  money = 0;
  stage = 0;
  level = 0;
  xp = 0;
  itemsHeld = 0;
  actionsThisTurn = 0;
  rank = 1;
  steps = 0;
  lastAction = -1;
  lastPower = 0;
  lastOpp = 0;
  lastWon = 0;
  wins = 0;
  losses = 0;
  streak = 0;
  done = false;

  readonly #feat = new Int32Array(OBS_N);
  readonly #counts = new Int32Array(N_TRAITS);
  readonly #result: PacResult = {
    observation: new Float32Array(OBS_N),
    action_mask: new Uint8Array(ACT_N),
    reward: 0,
    done: 0,
    rank: 0,
    life: 0,
    money: 0,
    stage: 0,
    board_size: 0,
    level: 0,
    synergy_count: 0,
    items_held: 0,
    actions_this_turn: 0,
  };
  // Board statistics, refreshed by #board().
  #power = 0;
  #boardUnits = 0;

  constructor() {
    this.#newGame();
    this.rng = seedState(0n); // so that a fresh env's reset() equals reset(0n)
  }

  spaces(): Spaces {
    return { obsN: OBS_N, actN: ACT_N };
  }

  reset(seed?: bigint): PacResult {
    if (seed !== undefined) this.rng = seedState(BigInt.asUintN(64, BigInt(seed)));
    this.#newGame();
    return this.#write(0);
  }

  step(action: number): PacResult {
    if (this.done) throw new Error("pac: step after the episode ended; reset first");
    const mask = this.#result.action_mask;
    if (!(Number.isInteger(action) && action >= 0 && action < ACT_N && mask[action] === 1)) {
      throw new RangeError(`pac: action ${action} is not legal now`);
    }
    const reward = this.#apply(action);
    this.steps += 1;
    this.lastAction = action;
    return this.#write(reward);
  }

  // -- RNG ---------------------------------------------------------------------------------------

  #next(): number {
    return mulberry32(this);
  }

  #rand(n: number): number {
    return this.#next() % n;
  }

  // -- state -------------------------------------------------------------------------------------

  #newGame(): void {
    this.units.fill(-1);
    this.items.fill(0);
    this.life = START_LIFE;
    this.money = START_MONEY;
    this.stage = 1;
    this.level = 1;
    this.xp = 0;
    this.itemsHeld = 0;
    this.actionsThisTurn = 0;
    this.ghosts.fill(START_LIFE);
    this.rank = 1;
    this.steps = 0;
    this.lastAction = -1;
    this.lastPower = 0;
    this.lastOpp = 0;
    this.lastWon = 0;
    this.wins = 0;
    this.losses = 0;
    this.streak = 0;
    this.done = false;
    this.#result.action_mask.fill(0);
    this.#drawShop();
  }

  #drawShop(): void {
    for (let s = 0; s < N_SHOP; s++) {
      this.units[SHOP0 + s] = this.#rand(N_UNITS);
      this.items[SHOP0 + s] = 0;
    }
  }

  #firstFree(start: number, count: number): number {
    for (let i = start; i < start + count; i++) if (this.units[i]! < 0) return i;
    return -1;
  }

  /** Refresh trait counts, power and board units; returns the synergies. */
  #board(): number {
    const counts = this.#counts;
    counts.fill(0);
    let power = 0;
    let boardUnits = 0;
    for (let i = 0; i < N_BOARD; i++) {
      const u = this.units[i]!;
      if (u < 0) continue;
      counts[TRAIT[u]!]! += 1;
      power += 2 * COST[u]! + 3 * this.items[i]!;
      boardUnits += 1;
    }
    let synergies = 0;
    for (let t = 0; t < N_TRAITS; t++) if (counts[t]! >= 2) synergies += 1;
    this.#power = power + 4 * synergies;
    this.#boardUnits = boardUnits;
    return synergies;
  }

  #gainXp(xp: number): void {
    this.xp += xp;
    while (this.level < MAX_LEVEL && this.xp >= 4 * this.level) {
      this.xp -= 4 * this.level;
      this.level += 1;
    }
    if (this.level === MAX_LEVEL) this.xp = 0;
  }

  #move(src: number, dst: number): void {
    this.units[dst] = this.units[src]!;
    this.items[dst] = this.items[src]!;
    this.units[src] = -1;
    this.items[src] = 0;
  }

  #sell(slot: number): void {
    this.money = Math.min(MAX_MONEY, this.money + COST[this.units[slot]!]!);
    this.itemsHeld = Math.min(MAX_ITEMS_HELD, this.itemsHeld + this.items[slot]!);
    this.units[slot] = -1;
    this.items[slot] = 0;
  }

  /** End the turn; returns the reward in eighths. */
  #fight(power: number): number {
    const opp = 2 * this.stage + this.#rand(2 * this.stage + 6);
    this.lastPower = power;
    this.lastOpp = opp;
    let reward: number;
    if (power >= opp) {
      this.lastWon = 1;
      this.wins += 1;
      this.streak = Math.max(this.streak, 0) + 1;
      this.money += 1;
      reward = 8 + Math.min(power - opp, 8);
      if (this.#rand(4) === 0 && this.itemsHeld < MAX_ITEMS_HELD) this.itemsHeld += 1;
    } else {
      this.lastWon = 0;
      const damage = Math.min(this.life, 2 + Math.floor((opp - power) / 2));
      this.life -= damage;
      this.losses += 1;
      this.streak = Math.min(this.streak, 0) - 1;
      reward = 0 - damage;
    }
    this.money = Math.min(MAX_MONEY, this.money + 5 + Math.min(Math.floor(this.money / 10), 5));
    this.#gainXp(2);
    let ghostsAlive = 0;
    for (let g = 0; g < N_GHOSTS; g++) {
      if (this.ghosts[g]! > 0) {
        this.ghosts[g] = Math.max(0, this.ghosts[g]! - this.#rand(2 * this.stage + 6));
      }
      if (this.ghosts[g]! > 0) ghostsAlive += 1;
    }
    this.stage += 1;
    this.actionsThisTurn = 0;
    this.#drawShop();
    let rank = 1;
    for (let g = 0; g < N_GHOSTS; g++) if (this.ghosts[g]! > this.life) rank += 1;
    this.rank = rank;
    if (this.life === 0 || this.stage > MAX_STAGE || ghostsAlive === 0) {
      this.done = true;
      reward += 2 * (9 - 2 * rank);
    }
    return reward;
  }

  /** Play one legal action; returns the reward in eighths. */
  #apply(action: number): number {
    if (action === A_END) {
      this.#board();
      return this.#fight(this.#power);
    }
    const synergiesBefore = this.#board();
    this.actionsThisTurn += 1;
    if (action === A_REROLL) {
      this.money -= 2;
      this.#drawShop();
    } else if (action === A_XP) {
      this.money -= 4;
      this.#gainXp(4);
    } else if (action < A_SELL_BOARD) {
      const slot = SHOP0 + action - A_BUY;
      this.money -= COST[this.units[slot]!]!;
      this.#move(slot, this.#firstFree(BENCH0, N_BENCH));
    } else if (action < A_SELL_BENCH) {
      this.#sell(action - A_SELL_BOARD);
    } else if (action < A_PLACE) {
      this.#sell(BENCH0 + action - A_SELL_BENCH);
    } else if (action < A_UNPLACE) {
      this.#move(BENCH0 + action - A_PLACE, this.#firstFree(0, N_BOARD));
    } else if (action < A_EQUIP) {
      this.#move(action - A_UNPLACE, this.#firstFree(BENCH0, N_BENCH));
    } else {
      this.itemsHeld -= 1;
      this.items[action - A_EQUIP]! += 1;
    }
    return 2 * (this.#board() - synergiesBefore);
  }

  #fillMask(): void {
    const mask = this.#result.action_mask;
    mask.fill(0);
    mask[A_END] = 1;
    if (this.done || this.actionsThisTurn >= MAX_ACTIONS_PER_TURN) return;
    const units = this.units;
    const benchFree = this.#firstFree(BENCH0, N_BENCH) >= 0;
    mask[A_REROLL] = this.money >= 2 ? 1 : 0;
    mask[A_XP] = this.money >= 4 && this.level < MAX_LEVEL ? 1 : 0;
    for (let s = 0; s < N_SHOP; s++) {
      const u = units[SHOP0 + s]!;
      mask[A_BUY + s] = u >= 0 && COST[u]! <= this.money && benchFree ? 1 : 0;
    }
    for (let i = 0; i < N_BOARD; i++) {
      const occupied = units[i]! >= 0;
      mask[A_SELL_BOARD + i] = occupied ? 1 : 0;
      mask[A_UNPLACE + i] = occupied && benchFree ? 1 : 0;
      mask[A_EQUIP + i] =
        occupied && this.items[i]! < MAX_ITEMS_PER_UNIT && this.itemsHeld > 0 ? 1 : 0;
    }
    const boardRoom = this.#boardUnits < this.level;
    for (let i = 0; i < N_BENCH; i++) {
      const occupied = units[BENCH0 + i]! >= 0;
      mask[A_SELL_BENCH + i] = occupied ? 1 : 0;
      mask[A_PLACE + i] = occupied && boardRoom ? 1 : 0;
    }
  }

  #write(rewardEighths: number): PacResult {
    const synergies = this.#board();
    this.#fillMask();
    const out = this.#result;
    const units = this.units;
    const feat = this.#feat;
    feat.fill(0, 0, O_TRAITS);
    let benchUnits = 0;
    for (let s = 0; s < N_SLOTS; s++) {
      const u = units[s]!;
      const base = s * SLOT_FEATURES;
      if (u >= 0) {
        feat[base + u] = 1;
        feat[base + N_UNITS + 1] = COST[u]!;
        if (s >= BENCH0 && s < SHOP0) benchUnits += 1;
      }
      feat[base + N_UNITS] = this.items[s]!;
    }
    feat.set(this.#counts, O_TRAITS);
    let o = O_SCALARS;
    feat[o++] = this.life;
    feat[o++] = this.money;
    feat[o++] = this.stage;
    feat[o++] = this.level;
    feat[o++] = this.xp;
    feat[o++] = this.itemsHeld;
    feat[o++] = this.actionsThisTurn;
    feat[o++] = this.rank;
    feat[o++] = this.#boardUnits;
    feat[o++] = synergies;
    feat.set(this.ghosts, O_GHOSTS);
    o = O_FIGHT;
    feat[o++] = this.lastPower;
    feat[o++] = this.lastOpp;
    feat[o++] = this.lastWon;
    feat.set(out.action_mask, O_MASK);
    o = O_EXTRA;
    feat[o++] = this.lastAction + 1;
    feat[o++] = this.steps;
    feat[o++] = this.#power;
    feat[o++] = this.wins;
    feat[o++] = this.losses;
    feat[o++] = this.streak;
    feat[o++] = benchUnits;
    feat[o++] = this.level;
    const obs = out.observation;
    for (let i = 0; i < OBS_N; i++) obs[i] = feat[i]! * SCALE[i]!;
    out.reward = rewardEighths / 8;
    out.done = this.done ? 1 : 0;
    out.rank = this.rank;
    out.life = this.life;
    out.money = this.money;
    out.stage = this.stage;
    out.board_size = this.#boardUnits;
    out.level = this.level;
    out.synergy_count = synergies;
    out.items_held = this.itemsHeld;
    out.actions_this_turn = this.actionsThisTurn;
    return out;
  }
}
