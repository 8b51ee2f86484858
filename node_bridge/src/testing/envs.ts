/**
 * Small envs on the project's other schemas, for tests that serve them from a server process
 * (`require("dist/testing/envs.js")`): a mahjong table whose episodes are truncated after a few
 * turns, a seeded tetris, a pac self-play game with `stepBatch` (8 seats, one env) and a seeded
 * gridworld (the newcomer schema).
 */

import { TetrisEnv } from "../examples/tetris";
import type * as gridworld from "../generated/gridworld";
import * as mahjong_env from "../generated/mahjong_env";
import type * as pac_env from "../generated/pac_env";
import type { Env, Spaces } from "../runtime/env";
import { blankPacResult } from "./fixtures";

/** Turns before the table's episode is truncated. */
export const TABLE_LIMIT = 5;

/** Counts its turns in `turn`, echoes the action in observation[0]; truncated after TABLE_LIMIT. */
class MahjongTable implements Env<mahjong_env.AgentStepInput> {
  turn = 0;
  episode = 0n;
  readonly #none = { kind: mahjong_env.MeldKind.NONE, from_seat: -1, tiles: [255, 255, 255, 255] };
  readonly #out = {
    agent: mahjong_env.Agent.PLAYER_0 as number,
    terminated: false,
    truncated: false,
    seat_wind: mahjong_env.Wind.EAST as number,
    reward: 0,
    observation: new Float32Array(290),
    action_mask: new Array<boolean>(104).fill(true),
    prevailing_wind: mahjong_env.Wind.SOUTH as number,
    tiles_remaining: 70,
    turn: 0,
    melds: [this.#none, this.#none, this.#none, this.#none],
    score: 0n,
    episode_id: 0n,
    hand_value: 0.5,
    last_discard: -1,
    dealer_streak: 0,
  };

  spaces(): Spaces {
    return { obsN: 290, actN: 104 };
  }

  reset(seed?: bigint): mahjong_env.AgentStepInput {
    this.turn = 0;
    this.episode = seed ?? this.episode + 1n;
    return this.#result(0);
  }

  step(action: number): mahjong_env.AgentStepInput {
    this.turn++;
    return this.#result(action);
  }

  #result(action: number): mahjong_env.AgentStepInput {
    const out = this.#out;
    out.turn = this.turn;
    out.truncated = this.turn >= TABLE_LIMIT;
    out.observation[0] = action;
    out.reward = action / 10;
    out.episode_id = this.episode;
    out.score = BigInt(this.turn) * -3n;
    out.action_mask[103] = this.turn % 2 === 0;
    return out as mahjong_env.AgentStepInput;
  }
}

export function makeMahjongTable(): Env<mahjong_env.AgentStepInput> {
  return new MahjongTable();
}

export function makeTetris(): Env<unknown> {
  return new TetrisEnv();
}

/** One game, 8 seats: `stepBatch(actions)` gives seat k observation[0] = actions[k], observation[1] = the turn. */
class SelfPlay implements Env<pac_env.StepResultInput> {
  turn = 0;
  readonly #seats = Array.from({ length: 8 }, () => blankPacResult());

  spaces(): Spaces {
    return { obsN: 612, actN: 92 };
  }

  reset(): pac_env.StepResultInput {
    this.turn = 0;
    return this.#fill([0, 0, 0, 0, 0, 0, 0, 0])[0] as pac_env.StepResultInput;
  }

  step(action: number): pac_env.StepResultInput {
    return this.stepBatch(Int32Array.of(action, 0, 0, 0, 0, 0, 0, 0))[0] as pac_env.StepResultInput;
  }

  stepBatch(actions: Int32Array): ArrayLike<pac_env.StepResultInput> {
    this.turn++;
    return this.#fill(actions);
  }

  #fill(actions: ArrayLike<number>): ReturnType<typeof blankPacResult>[] {
    this.#seats.forEach((seat, k) => {
      seat.observation[0] = actions[k] as number;
      seat.observation[1] = this.turn;
      seat.rank = k;
    });
    return this.#seats;
  }
}

export function makeSelfPlay(): Env<pac_env.StepResultInput> {
  return new SelfPlay();
}

/**
 * A seeded 5 x 5 gridworld on the gridworld schema (the newcomer schema: f32[2,5,5], f64,
 * bool[5,5], u16[5,5], i8[2]): the agent walks towards a goal around seeded walls; terminated
 * at the goal, truncated after 30 steps.
 */
class GridWorld implements Env<gridworld.StepResultInput> {
  #rng = 1;
  #steps = 0;
  readonly #at = Int8Array.of(0, 0);
  readonly #goal = Int8Array.of(4, 4);
  readonly #out = {
    observation: new Float32Array(50),
    reward: 0,
    terminated: false,
    truncated: false,
    action_mask: [true, true, true, true],
    walls: new Array<boolean>(25).fill(false),
    visits: new Uint16Array(25),
    position: new Int8Array(2),
  };

  spaces(): Spaces {
    return { obsN: 50, actN: 4 };
  }

  reset(seed?: bigint): gridworld.StepResultInput {
    if (seed !== undefined) this.#rng = Number(BigInt.asUintN(32, seed)) | 1;
    this.#steps = 0;
    const out = this.#out;
    out.walls.fill(false);
    out.visits.fill(0);
    for (let k = 0; k < 4; k++) out.walls[1 + (this.#next() % 23)] = true; // never the corners
    this.#at.set([0, 0]);
    this.#goal.set([4, 4]);
    return this.#result(0, false);
  }

  step(action: number): gridworld.StepResultInput {
    const [dr, dc] = [
      [-1, 0],
      [0, 1],
      [1, 0],
      [0, -1],
    ][action] as [number, number];
    const r = (this.#at[0] as number) + dr;
    const c = (this.#at[1] as number) + dc;
    if (r >= 0 && r < 5 && c >= 0 && c < 5 && !this.#out.walls[r * 5 + c]) this.#at.set([r, c]);
    this.#steps++;
    const goal = this.#at[0] === this.#goal[0] && this.#at[1] === this.#goal[1];
    return this.#result(goal ? 1 : -0.01 * (this.#next() % 7), goal);
  }

  #next(): number {
    let x = this.#rng;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.#rng = x >>> 0;
    return this.#rng;
  }

  #result(reward: number, goal: boolean): gridworld.StepResultInput {
    const out = this.#out;
    const cell = (this.#at[0] as number) * 5 + (this.#at[1] as number);
    out.visits[cell] = (out.visits[cell] as number) + 1;
    out.observation.fill(0);
    out.observation[cell] = 1;
    out.observation[25 + (this.#goal[0] as number) * 5 + (this.#goal[1] as number)] = 1;
    out.reward = reward;
    out.terminated = goal;
    out.truncated = !goal && this.#steps >= 30;
    out.position.set(this.#at);
    return out as unknown as gridworld.StepResultInput;
  }
}

export function makeGridWorld(): Env<gridworld.StepResultInput> {
  return new GridWorld();
}
