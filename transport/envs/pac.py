"""The pac env: a small seeded auto-battler on the pac_env schema (seed 000, Appendix A).

The Node env (node_bridge/src/envs/pac.ts) implements the same rules and produces the same bytes
for the same seed and actions. Rules (identical in both files):

- 20 unit types; unit u costs 1 + u % 5 gold and has trait (3 * u) % 8. 22 slots: board 0-8,
  bench 9-16, shop 17-21. Start: life 100, money 5, stage 1, level 1, xp 0, no units or items,
  7 ghost opponents with life 100, a shop of 5 draws. The board holds at most `level` units.
- Actions (92): 0 end turn (always legal); 1 reroll the shop (2 gold); 2 buy 4 xp (4 gold,
  level < 9; a level costs 4 * level xp); 3-7 buy shop slot to the first free bench slot;
  8-16 sell board slot / 17-24 sell bench slot (refund the cost, its items return to the hand,
  at most 9 held); 25-32 move bench slot to the first free board slot; 33-41 move board slot to
  the first free bench slot; 42-50 put one held item on a board unit (at most 3 per unit);
  51-91 reserved (always masked). After 8 actions in a turn only "end turn" is legal.
- Synergies: traits with at least 2 board units. Board power = sum(2 * cost + 3 * items) +
  4 * synergies. End turn: a fight against power 2 * stage + rand(2 * stage + 6). A win pays
  1 gold, reward (8 + min(margin, 8)) / 8 and, one time in four, an item; a loss costs
  2 + deficit // 2 life, reward -damage / 8. Then income 5 + min(money // 10, 5) (money at most
  999), 2 xp, every living ghost loses rand(2 * stage + 6) life, stage + 1, a new shop.
- Other actions reward 2 * (change in synergies) / 8. rank = 1 + ghosts with more life. The
  episode ends when life is 0, all ghosts are out, or after stage 20's fight; the last reward
  adds 2 * (9 - 2 * rank) / 8.
- RNG: mulberry32 (32-bit), seeded with fmix32(lo ^ fmix32(hi ^ 0x9E3779B9)) from the u64 seed;
  rand(n) = next() % n. reset(None) keeps the RNG running (a fresh env is seeded with 0).

Observation (612 f32, every value an integer times a power of two, so exact in both languages):
[0, 484) 22 slots x (20 unit one-hot, items / 4, cost / 8); [484, 492) board trait counts / 4;
[492, 502) life / 128, money / 64, stage / 32, level / 16, xp / 64, items held / 16,
actions this turn / 8, rank / 8, board units / 16, synergies / 8; [502, 509) ghost lives / 128;
[509, 512) last fight: power / 64, opponent / 64, won; [512, 604) the action mask;
[604, 612) (last action + 1) / 128, steps / 256, power / 64, wins / 32, losses / 32,
streak / 8, bench units / 8, board capacity / 16.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from transport.runtime.env import Spaces

OBS_N = 612
ACT_N = 92

N_UNITS = 20
N_TRAITS = 8
N_BOARD = 9
N_BENCH = 8
N_SHOP = 5
N_SLOTS = N_BOARD + N_BENCH + N_SHOP
BENCH0 = N_BOARD
SHOP0 = N_BOARD + N_BENCH
SLOT_FEATURES = N_UNITS + 2

MAX_LEVEL = 9
MAX_STAGE = 20
MAX_ACTIONS_PER_TURN = 8
MAX_ITEMS_HELD = 9
MAX_ITEMS_PER_UNIT = 3
MAX_MONEY = 999
N_GHOSTS = 7
START_LIFE = 100
START_MONEY = 5

# Action ranges (first action of each range).
A_END = 0
A_REROLL = 1
A_XP = 2
A_BUY = 3
A_SELL_BOARD = 8
A_SELL_BENCH = 17
A_PLACE = 25
A_UNPLACE = 33
A_EQUIP = 42
A_RESERVED = 51

M32 = 0xFFFFFFFF

COST = np.array([1 + u % 5 for u in range(N_UNITS)], dtype=np.int64)
TRAIT = np.array([(3 * u) % N_TRAITS for u in range(N_UNITS)], dtype=np.int64)
COST_EXT = np.concatenate(([0], COST))  # indexed by unit + 1 (empty slot = -1 -> 0)

O_SLOTS = 0
O_TRAITS = N_SLOTS * SLOT_FEATURES  # 484
O_SCALARS = O_TRAITS + N_TRAITS  # 492
O_GHOSTS = O_SCALARS + 10  # 502
O_FIGHT = O_GHOSTS + N_GHOSTS  # 509
O_MASK = O_FIGHT + 3  # 512
O_EXTRA = O_MASK + ACT_N  # 604


def _scale() -> npt.NDArray[np.float32]:
    scale = np.ones(OBS_N, dtype=np.float32)
    slots = scale[:O_TRAITS].reshape(N_SLOTS, SLOT_FEATURES)
    slots[:, N_UNITS] = 1 / 4
    slots[:, N_UNITS + 1] = 1 / 8
    scale[O_TRAITS:O_SCALARS] = 1 / 4
    scale[O_SCALARS:O_GHOSTS] = [
        1 / 128,
        1 / 64,
        1 / 32,
        1 / 16,
        1 / 64,
        1 / 16,
        1 / 8,
        1 / 8,
        1 / 16,
        1 / 8,
    ]
    scale[O_GHOSTS:O_FIGHT] = 1 / 128
    scale[O_FIGHT:O_MASK] = [1 / 64, 1 / 64, 1]
    scale[O_EXTRA:] = [1 / 128, 1 / 256, 1 / 64, 1 / 32, 1 / 32, 1 / 8, 1 / 8, 1 / 16]
    return scale


SCALE = _scale()


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser."""
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    h ^= h >> 16
    return h


def seed_state(seed: int) -> int:
    """The 32-bit RNG state for a 64-bit seed."""
    lo = seed & M32
    hi = (seed >> 32) & M32
    return fmix32(lo ^ fmix32(hi ^ 0x9E3779B9))


def mulberry32(state: int) -> tuple[int, int]:
    """One mulberry32 step: (the next state, its 32-bit output); the envs' portable generator
    (Node: ``mulberry32`` in node_bridge/src/envs/pac.ts)."""
    s = (state + 0x6D2B79F5) & M32
    t = ((s ^ (s >> 15)) * (s | 1)) & M32
    t ^= (t + (((t ^ (t >> 7)) * (t | 61)) & M32)) & M32
    return s, (t ^ (t >> 14)) & M32


class PacEnv:
    """The pac reference env (rules in the module docstring); writes results in place."""

    def __init__(self) -> None:
        from transport.generated import pac_env

        self._record = pac_env.StepResult.zeros()
        self._feat = np.zeros(OBS_N, dtype=np.float32)
        self._slot_feat = self._feat[:O_TRAITS].reshape(N_SLOTS, SLOT_FEATURES)
        self._mask = np.zeros(ACT_N, dtype=np.uint8)
        self._slot_index = np.arange(N_SLOTS)
        self.units = np.full(N_SLOTS, -1, dtype=np.int64)
        self.items = np.zeros(N_SLOTS, dtype=np.int64)
        self.ghosts = [START_LIFE] * N_GHOSTS
        self.rng = 0
        self._new_game()
        self.rng = seed_state(0)  # so that a fresh env's reset() equals reset(0)
        self._stats = self._board()  # (trait counts, synergies, power, board units), kept current

    # -- RNG ---------------------------------------------------------------------------------

    def _next(self) -> int:
        self.rng, out = mulberry32(self.rng)
        return out

    def _rand(self, n: int) -> int:
        return self._next() % n

    # -- state -------------------------------------------------------------------------------

    def _new_game(self) -> None:
        self.units.fill(-1)
        self.items.fill(0)
        self.life = START_LIFE
        self.money = START_MONEY
        self.stage = 1
        self.level = 1
        self.xp = 0
        self.items_held = 0
        self.actions_this_turn = 0
        self.ghosts = [START_LIFE] * N_GHOSTS
        self.rank = 1
        self.steps = 0
        self.last_action = -1
        self.last_power = 0
        self.last_opp = 0
        self.last_won = 0
        self.wins = 0
        self.losses = 0
        self.streak = 0
        self.done = False
        self._draw_shop()

    def _draw_shop(self) -> None:
        for s in range(N_SHOP):
            self.units[SHOP0 + s] = self._rand(N_UNITS)
            self.items[SHOP0 + s] = 0

    def _first_free(self, start: int, count: int) -> int:
        free = np.flatnonzero(self.units[start : start + count] < 0)
        return start + int(free[0]) if free.size else -1

    def _board(self) -> tuple[npt.NDArray[np.int64], int, int, int]:
        """(trait counts, synergies, power, board units)."""
        board = self.units[:N_BOARD]
        occupied = board >= 0
        counts = np.bincount(TRAIT[board[occupied]], minlength=N_TRAITS)
        synergies = int(np.count_nonzero(counts >= 2))
        power = int(2 * COST_EXT[board + 1].sum() + 3 * self.items[:N_BOARD].sum())
        return counts, synergies, power + 4 * synergies, int(np.count_nonzero(occupied))

    def _gain_xp(self, xp: int) -> None:
        self.xp += xp
        while self.level < MAX_LEVEL and self.xp >= 4 * self.level:
            self.xp -= 4 * self.level
            self.level += 1
        if self.level == MAX_LEVEL:
            self.xp = 0

    def _move(self, src: int, dst: int) -> None:
        self.units[dst] = self.units[src]
        self.items[dst] = self.items[src]
        self.units[src] = -1
        self.items[src] = 0

    def _sell(self, slot: int) -> None:
        self.money = min(MAX_MONEY, self.money + int(COST[self.units[slot]]))
        self.items_held = min(MAX_ITEMS_HELD, self.items_held + int(self.items[slot]))
        self.units[slot] = -1
        self.items[slot] = 0

    def _fight(self, power: int) -> int:
        """End the turn; returns the reward in eighths."""
        opp = 2 * self.stage + self._rand(2 * self.stage + 6)
        self.last_power, self.last_opp = power, opp
        if power >= opp:
            self.last_won = 1
            self.wins += 1
            self.streak = max(self.streak, 0) + 1
            self.money += 1
            reward = 8 + min(power - opp, 8)
            if self._rand(4) == 0 and self.items_held < MAX_ITEMS_HELD:
                self.items_held += 1
        else:
            self.last_won = 0
            damage = min(self.life, 2 + (opp - power) // 2)
            self.life -= damage
            self.losses += 1
            self.streak = min(self.streak, 0) - 1
            reward = -damage
        self.money = min(MAX_MONEY, self.money + 5 + min(self.money // 10, 5))
        self._gain_xp(2)
        for g in range(N_GHOSTS):
            if self.ghosts[g] > 0:
                self.ghosts[g] = max(0, self.ghosts[g] - self._rand(2 * self.stage + 6))
        self.stage += 1
        self.actions_this_turn = 0
        self._draw_shop()
        self.rank = 1 + sum(1 for g in self.ghosts if g > self.life)
        if self.life == 0 or self.stage > MAX_STAGE or not any(self.ghosts):
            self.done = True
            reward += 2 * (9 - 2 * self.rank)
        return reward

    def _apply(self, action: int) -> int:
        """Play one legal action; returns the reward in eighths."""
        if action == A_END:
            return self._fight(self._stats[2])  # the fight leaves the board as it is
        synergies_before = self._stats[1]
        self.actions_this_turn += 1
        if action == A_REROLL:
            self.money -= 2
            self._draw_shop()
        elif action == A_XP:
            self.money -= 4
            self._gain_xp(4)
        elif action < A_SELL_BOARD:
            slot = SHOP0 + action - A_BUY
            self.money -= int(COST[self.units[slot]])
            self._move(slot, self._first_free(BENCH0, N_BENCH))
        elif action < A_SELL_BENCH:
            self._sell(action - A_SELL_BOARD)
        elif action < A_PLACE:
            self._sell(BENCH0 + action - A_SELL_BENCH)
        elif action < A_UNPLACE:
            self._move(BENCH0 + action - A_PLACE, self._first_free(0, N_BOARD))
        elif action < A_EQUIP:
            self._move(action - A_UNPLACE, self._first_free(BENCH0, N_BENCH))
        else:
            self.items_held -= 1
            self.items[action - A_EQUIP] += 1
        self._stats = self._board()
        return 2 * (self._stats[1] - synergies_before)

    def _fill_mask(self, board_units: int) -> None:
        mask = self._mask
        mask.fill(0)
        mask[A_END] = 1
        if self.done or self.actions_this_turn >= MAX_ACTIONS_PER_TURN:
            return
        units = self.units
        board_occ = units[:N_BOARD] >= 0
        bench_occ = units[BENCH0:SHOP0] >= 0
        bench_free = not bench_occ.all()
        shop = units[SHOP0:]
        mask[A_REROLL] = self.money >= 2
        mask[A_XP] = self.money >= 4 and self.level < MAX_LEVEL
        mask[A_BUY:A_SELL_BOARD] = (shop >= 0) & (COST_EXT[shop + 1] <= self.money) & bench_free
        mask[A_SELL_BOARD:A_SELL_BENCH] = board_occ
        mask[A_SELL_BENCH:A_PLACE] = bench_occ
        mask[A_PLACE:A_UNPLACE] = bench_occ & (board_units < self.level)
        mask[A_UNPLACE:A_EQUIP] = board_occ & bench_free
        mask[A_EQUIP:A_RESERVED] = (
            board_occ & (self.items[:N_BOARD] < MAX_ITEMS_PER_UNIT) & (self.items_held > 0)
        )

    def _write(self, reward_eighths: int, out: np.ndarray) -> None:
        counts, synergies, power, board_units = self._stats
        self._fill_mask(board_units)
        bench_units = int(np.count_nonzero(self.units[BENCH0:SHOP0] >= 0))
        units = self.units
        feat = self._feat
        slots = self._slot_feat
        slots.fill(0)
        occupied = self._slot_index[units >= 0]
        slots[occupied, units[occupied]] = 1
        slots[:, N_UNITS] = self.items
        slots[:, N_UNITS + 1] = COST_EXT[units + 1]
        feat[O_TRAITS:O_SCALARS] = counts
        feat[O_SCALARS:O_GHOSTS] = (
            self.life,
            self.money,
            self.stage,
            self.level,
            self.xp,
            self.items_held,
            self.actions_this_turn,
            self.rank,
            board_units,
            synergies,
        )
        feat[O_GHOSTS:O_FIGHT] = self.ghosts
        feat[O_FIGHT:O_MASK] = (self.last_power, self.last_opp, self.last_won)
        feat[O_MASK:O_EXTRA] = self._mask
        feat[O_EXTRA:] = (
            self.last_action + 1,
            self.steps,
            power,
            self.wins,
            self.losses,
            self.streak,
            bench_units,
            self.level,
        )
        np.multiply(feat, SCALE, out=out["observation"])
        out["action_mask"] = self._mask
        out["reward"] = reward_eighths / 8
        out["done"] = 1 if self.done else 0
        out["rank"] = self.rank
        out["life"] = self.life
        out["money"] = self.money
        out["stage"] = self.stage
        out["board_size"] = board_units
        out["level"] = self.level
        out["synergy_count"] = synergies
        out["items_held"] = self.items_held
        out["actions_this_turn"] = self.actions_this_turn

    # -- Env interface -----------------------------------------------------------------------

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        if seed is not None:
            self.rng = seed_state(int(seed))
        self._new_game()
        self._stats = self._board()
        self._write(0, out)

    def step_into(self, action: int, out: np.ndarray) -> None:
        if self.done:
            raise RuntimeError("pac: step after the episode ended; reset first")
        if not (0 <= action < ACT_N and self._mask[action]):
            raise ValueError(f"pac: action {action} is not legal now")
        reward = self._apply(action)
        self.steps += 1
        self.last_action = action
        self._write(reward, out)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """The reset result: a record of StepResult's dtype, reused (overwritten) by each call."""
        self.reset_into(seed, self._record)
        return self._record

    def step(self, action: int) -> np.ndarray:
        """The step result: a record of StepResult's dtype, reused (overwritten) by each call."""
        self.step_into(action, self._record)
        return self._record
