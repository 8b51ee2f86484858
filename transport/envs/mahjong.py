"""The mahjong env: a simplified four-seat draw/discard/claim tile game on the mahjong_env schema.

A turn-based game for the PettingZoo AEC adapter (``transport.pettingzoo.RemoteAECEnv``, seed
003). One env is one table of four seats; ``agent`` in every result names the seat that acts next.

Rules (simplified mahjong: no flowers, no kongs, no scoring patterns):

- 136 tiles: 34 kinds x 4 (0-8 characters, 9-17 dots, 18-26 bamboo, 27-33 honours). A seeded
  shuffle (``_shuffled_tiles``: mulberry32 seeded as the pac env seeds it, so that the Node twin,
  node_bridge/src/envs/mahjong.ts, deals the same tiles; reset without a seed keeps the
  generator running); seat s gets tiles 13s .. 13s + 12, the wall is the rest, drawn from its
  end; East (seat 0) draws a 14th and acts first.
- The seat to act holds 14 tiles (melded sets included). Actions 0-33: discard one tile of that
  kind (legal when held in hand); 102 (win): legal when the hand and the melds form four sets
  (a pung of three equal tiles, or a chow of three consecutive tiles of one suit) and a pair.
- After a discard, the other seats may claim it, asked one at a time in priority order (a seat
  that can win on it first, then the seat that can pung it, then the next seat, which can chow
  it), each with the mask of what it can do: 102 win on the discard, 97 pung (two of that kind
  in hand), 34-96 chow (34 + 3 x sequence + position: sequence = suit x 7 + first rank, position
  = which of its three tiles is the discard; only the seat after the discarder), 103 pass. A pung
  or chow becomes a meld, and the claimer discards next; if every seat passes, the next seat
  draws from the wall. Kongs (98-101) are always masked. An empty wall ends the hand in a draw.
- Rewards are zero-sum, paid at the end only: a win (self-drawn or on a discard) pays the winner
  +3 and costs each other seat 1. The final result names the winner in ``agent`` and carries
  its reward (3.0); on a draw it names the seat that would have drawn, with reward 0. Every
  other result has reward 0. The AEC adapter gives the other seats -reward / 3 (zero-sum).
  Claims make wins happen: in 600 seeded hands (seeds 0..599), random legal play wins 20 (51
  when it takes every win offered) and a greedy player (win when it can, claim what it can,
  discard its least connected tile) 597 (tests/test_pettingzoo_adapter.py
  ``test_wins_happen_and_score``; docs/adapters.md "Many tables per connection").

Observation (290 f32 in [0, 1], from the point of view of the seat in ``agent``): own hand
counts / 4 (34) | flowers (8, always 0) | the discards of the next, opposite and previous seats,
counts / 4 (3 x 34) | their melds, counts / 4 (3 x 34) | own melds, counts / 4 (34) | seat wind
one-hot (4) | prevailing wind one-hot (4, East) | tiles left in the wall / 83 | turn / 83.
``last_discard`` names the tile on offer while a seat is asked to claim it (-1 otherwise).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from transport.envs.pac import mulberry32, seed_state
from transport.runtime.env import Spaces

OBS_N = 290
ACT_N = 104
N_SEATS = 4
N_KINDS = 34
HAND = 13
WALL = N_KINDS * 4 - N_SEATS * HAND - 1  # draws left after the deal and East's first draw: 83
A_CHOW = 34  # 34 .. 96: 21 sequences x 3 positions
A_PUNG = 97
A_WIN = 102
A_PASS = 103
WIN_REWARD = 3.0

# observation offsets
O_HAND = 0
O_DISCARDS = 34 + 8
O_MELDS = O_DISCARDS + 3 * 34
O_OWN_MELDS = O_MELDS + 3 * 34
O_SEAT_WIND = O_OWN_MELDS + 34
O_PREVAILING = O_SEAT_WIND + 4
O_WALL = O_PREVAILING + 4
O_TURN = O_WALL + 1

MELD_PUNG = 1  # mahjong_env MeldKind.PONG
MELD_CHOW = 0  # MeldKind.CHI


def chow_action(sequence: int, position: int) -> int:
    """The action that claims a discard as tile ``position`` (0-2) of chow ``sequence`` (0-20)."""
    return A_CHOW + 3 * sequence + position


def chow_of(action: int) -> tuple[int, int]:
    """(first tile kind of the chow, position of the claimed tile) of a chow action."""
    sequence, position = divmod(action - A_CHOW, 3)
    suit, rank = divmod(sequence, 7)
    return suit * 9 + rank, position


def is_winning(counts: npt.NDArray[np.int64]) -> bool:
    """A hand of 3k + 2 tiles that forms k sets (pungs or chows) and a pair (its melds aside)."""
    if int(counts.sum()) % 3 != 2:
        return False
    for pair in np.flatnonzero(counts >= 2):
        rest = counts.copy()
        rest[pair] -= 2
        if _all_sets(rest):
            return True
    return False


def _all_sets(counts: npt.NDArray[np.int64]) -> bool:
    counts = counts.copy()
    for kind in range(N_KINDS):
        while counts[kind] > 0:
            if counts[kind] >= 3:
                counts[kind] -= 3  # a pung first is always safe (three chows = three pungs)
                continue
            if kind >= 27 or kind % 9 > 6 or counts[kind + 1] < 1 or counts[kind + 2] < 1:
                return False
            counts[kind] -= 1
            counts[kind + 1] -= 1
            counts[kind + 2] -= 1
    return True


def chow_options(hand: npt.NDArray[np.int64], tile: int) -> list[int]:
    """The chow actions that claim ``tile`` with two tiles of ``hand``."""
    if tile >= 27:
        return []
    suit, rank = divmod(tile, 9)
    out = []
    for position in range(3):
        first = rank - position
        if not 0 <= first <= 6:
            continue
        kinds = [suit * 9 + first + k for k in range(3) if k != position]
        if all(hand[k] > 0 for k in kinds):
            out.append(chow_action(suit * 7 + first, position))
    return out


class MahjongEnv:
    """One table. ``reset_into`` / ``step_into`` write the result in place."""

    def __init__(self) -> None:
        self.rng = seed_state(0)  # mulberry32 state: a fresh env's first deal is seed 0's
        self.hands = np.zeros((N_SEATS, N_KINDS), dtype=np.int64)  # concealed tiles
        self.melded = np.zeros((N_SEATS, N_KINDS), dtype=np.int64)  # tiles in exposed melds
        self.melds: list[list[tuple[int, int, list[int]]]] = [[] for _ in range(N_SEATS)]
        self.discards = np.zeros((N_SEATS, N_KINDS), dtype=np.int64)
        self.scores = np.zeros(N_SEATS, dtype=np.int64)
        self.wall: list[int] = []
        self.current = 0  # the seat that acts next (discards, or is asked to claim)
        self.discarder = -1  # while a discard is on offer: who threw it
        self.claimers: list[int] = []  # seats still to ask about the discard on offer
        self.turn = 0
        self.last_discard = -1
        self.episode = 0
        self.over = False

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    # -- the game ------------------------------------------------------------------------------

    def _next(self) -> int:
        """The pac env's generator (mulberry32), portable to Node."""
        self.rng, out = mulberry32(self.rng)
        return out

    def _shuffled_tiles(self) -> npt.NDArray[np.int64]:
        """The 136 tiles (kind k four times, in kind order), Fisher-Yates shuffled from the top:
        for i = 135 .. 1, swap tile i with tile next() % (i + 1)."""
        tiles = [kind for kind in range(N_KINDS) for _ in range(4)]
        for i in range(len(tiles) - 1, 0, -1):
            j = self._next() % (i + 1)
            tiles[i], tiles[j] = tiles[j], tiles[i]
        return np.array(tiles, dtype=np.int64)

    def _deal(self, seed: int | None) -> None:
        if seed is not None:
            self.rng = seed_state(seed)
        tiles = self._shuffled_tiles()
        self.hands[:] = 0
        self.melded[:] = 0
        self.melds = [[] for _ in range(N_SEATS)]
        self.discards[:] = 0
        for seat in range(N_SEATS):
            np.add.at(self.hands[seat], tiles[seat * HAND : (seat + 1) * HAND], 1)
        self.wall = [int(t) for t in tiles[N_SEATS * HAND :]]
        self.current = 0
        self.discarder = -1
        self.claimers = []
        self.hands[0, self.wall.pop()] += 1
        self.turn = 0
        self.last_discard = -1
        self.episode += 1
        self.over = False

    def _claims(self, seat: int) -> list[int]:
        """What ``seat`` may do with the discard on offer (pass aside)."""
        tile, hand = self.last_discard, self.hands[seat]
        options = []
        with_tile = hand.copy()
        with_tile[tile] += 1
        if is_winning(with_tile):
            options.append(A_WIN)
        if hand[tile] >= 2:
            options.append(A_PUNG)
        if seat == (self.discarder + 1) % N_SEATS:
            options += chow_options(hand, tile)
        return options

    def _offer(self) -> None:
        """Queue the seats that can claim the discard: winners first, then pung, then chow."""
        seats = [(self.discarder + k) % N_SEATS for k in range(1, N_SEATS)]
        rank = {seat: self._claims(seat) for seat in seats}

        def priority(seat: int) -> int:
            options = rank[seat]
            return 0 if A_WIN in options else 1 if A_PUNG in options else 2

        self.claimers = sorted((s for s in seats if rank[s]), key=priority)

    def _mask(self, seat: int, out: npt.NDArray[np.bool_]) -> None:
        out[:] = False
        if self.discarder >= 0:  # asked to claim the discard on offer
            for action in self._claims(seat):
                out[action] = True
            out[A_PASS] = True
            return
        out[:N_KINDS] = self.hands[seat] > 0
        out[A_WIN] = is_winning(self.hands[seat])

    def _write(self, out: np.ndarray, seat: int, reward: float, terminated: bool) -> None:
        out["agent"] = seat
        out["terminated"] = terminated
        out["truncated"] = False
        out["seat_wind"] = seat
        out["reward"] = reward
        obs = out["observation"]
        obs[:] = 0
        obs[O_HAND : O_HAND + N_KINDS] = self.hands[seat] / 4
        for k in range(1, N_SEATS):
            other = (seat + k) % N_SEATS
            start = O_DISCARDS + (k - 1) * N_KINDS
            obs[start : start + N_KINDS] = self.discards[other] / 4
            start = O_MELDS + (k - 1) * N_KINDS
            obs[start : start + N_KINDS] = self.melded[other] / 4
        obs[O_OWN_MELDS : O_OWN_MELDS + N_KINDS] = self.melded[seat] / 4
        obs[O_SEAT_WIND + seat] = 1
        obs[O_PREVAILING] = 1
        obs[O_WALL] = len(self.wall) / WALL
        obs[O_TURN] = min(self.turn, WALL) / WALL
        if terminated:
            out["action_mask"] = False
        else:
            self._mask(seat, out["action_mask"])
        out["prevailing_wind"] = 0
        out["tiles_remaining"] = len(self.wall)
        out["turn"] = self.turn
        melds = out["melds"]
        melds["kind"] = -1
        melds["from_seat"] = -1
        melds["tiles"] = 255
        for m, (kind, from_seat, tiles) in enumerate(self.melds[seat][: len(melds)]):
            melds[m]["kind"] = kind
            melds[m]["from_seat"] = from_seat
            melds[m]["tiles"][: len(tiles)] = tiles
        out["score"] = self.scores[seat]
        out["episode_id"] = self.episode
        out["hand_value"] = reward if terminated else 0.0
        out["last_discard"] = self.last_discard if self.discarder >= 0 else -1
        out["dealer_streak"] = 0

    def _win(self, out: np.ndarray, seat: int) -> None:
        self.over = True
        self.scores -= 1
        self.scores[seat] += N_SEATS
        self.discarder = -1
        self._write(out, seat, WIN_REWARD, True)

    def _next_draw(self, out: np.ndarray) -> None:
        """Nobody claimed the discard: the seat after the discarder draws (or the hand is over)."""
        self.current = (self.discarder + 1) % N_SEATS
        self.discarder = -1
        if not self.wall:
            self.over = True
            self._write(out, self.current, 0.0, True)
            return
        self.hands[self.current, self.wall.pop()] += 1
        self._write(out, self.current, 0.0, False)

    def _meld(self, seat: int, kind: int, tiles: list[int]) -> None:
        """``seat`` claims the discard on offer into a meld of ``tiles`` and discards next."""
        tile = self.last_discard
        self.discards[self.discarder, tile] -= 1  # the discard leaves the river for the meld
        self.hands[seat, tile] += 1
        for t in tiles:
            self.hands[seat, t] -= 1
            self.melded[seat, t] += 1
        self.melds[seat].append((kind, self.discarder, tiles))
        self.current = seat
        self.discarder = -1
        self.claimers = []

    # -- the env interface ---------------------------------------------------------------------

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self._deal(seed)
        self._write(out, self.current, 0.0, False)

    def step_into(self, action: int, out: np.ndarray) -> None:
        if self.over:
            raise RuntimeError("the hand is over: reset first")
        seat = self.current
        if self.discarder >= 0:
            self._claim(seat, action, out)
            return
        hand = self.hands[seat]
        if action == A_WIN:
            if not is_winning(hand):
                raise ValueError(f"seat {seat} cannot win with this hand")
            self._win(out, seat)
            return
        if not 0 <= action < N_KINDS or hand[action] == 0:
            raise ValueError(f"seat {seat} cannot discard tile kind {action}")
        hand[action] -= 1
        self.discards[seat, action] += 1
        self.last_discard = action
        self.turn += 1
        self.discarder = seat
        self._offer()
        if self.claimers:
            self.current = self.claimers.pop(0)
            self._write(out, self.current, 0.0, False)
        else:
            self._next_draw(out)

    def _claim(self, seat: int, action: int, out: np.ndarray) -> None:
        """``seat`` answers the offer of the last discard: pass, win, pung or chow."""
        tile = self.last_discard
        if action != A_PASS and action not in self._claims(seat):
            raise ValueError(f"seat {seat} cannot claim tile kind {tile} with action {action}")
        if action == A_WIN:
            self.hands[seat, tile] += 1
            self.discards[self.discarder, tile] -= 1
            self._win(out, seat)
        elif action == A_PUNG:
            self._meld(seat, MELD_PUNG, [tile] * 3)
            self._write(out, seat, 0.0, False)
        elif action != A_PASS:
            first, _ = chow_of(action)
            self._meld(seat, MELD_CHOW, [first, first + 1, first + 2])
            self._write(out, seat, 0.0, False)
        elif self.claimers:
            self.current = self.claimers.pop(0)
            self._write(out, self.current, 0.0, False)
        else:
            self._next_draw(out)

    def reset(self, seed: int | None = None) -> np.ndarray:
        from transport.generated import mahjong_env

        record = mahjong_env.SCHEMA["AgentStep"].zeros()
        self.reset_into(seed, record)
        return record

    def step(self, action: int) -> np.ndarray:
        from transport.generated import mahjong_env

        record = mahjong_env.SCHEMA["AgentStep"].zeros()
        self.step_into(action, record)
        return record
