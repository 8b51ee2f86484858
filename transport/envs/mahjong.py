"""The mahjong env: a simplified four-seat draw/discard tile game on the mahjong_env schema.

A turn-based game for the PettingZoo AEC adapter (``transport.pettingzoo.RemoteAECEnv``, seed
003). One env is one table of four seats; ``agent`` in every result names the seat that acts next.

Rules (simplified mahjong, no claims: no chi, pong, kong or winning on another seat's discard):

- 136 tiles: 34 kinds x 4 (0-8 characters, 9-17 dots, 18-26 bamboo, 27-33 honours). A seeded
  shuffle; each seat gets 13 tiles, then East (seat 0) draws a 14th and acts first.
- The seat to act holds 14 tiles. Actions 0-33: discard one tile of that kind (legal when held);
  102 (win): legal when the 14 tiles form four sets (a pung of three equal tiles, or a chow of
  three consecutive tiles of one suit) and a pair. Every other action (chi 34-96, pong 97,
  kongs 98-101, pass 103) is always masked.
- After a discard the next seat draws from the wall. An empty wall ends the hand in a draw.
- Rewards are zero-sum, paid at the end only: a win (always self-drawn here) pays the winner
  +3 and costs each other seat 1. The final result names the winner in ``agent`` and carries
  its reward (3.0); on a draw it names the seat that would have drawn, with reward 0. Every
  other result has reward 0. The AEC adapter gives the other seats -reward / 3 (zero-sum).

Observation (290 f32 in [0, 1], from the point of view of the seat in ``agent``): own hand
counts / 4 (34) | flowers (8, always 0) | the discards of the next, opposite and previous seats,
counts / 4 (3 x 34) | their melds (3 x 34, always 0) | own melds (34, always 0) | seat wind
one-hot (4) | prevailing wind one-hot (4, East) | tiles left in the wall / 83 | turn / 83.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from transport.runtime.env import Spaces

OBS_N = 290
ACT_N = 104
N_SEATS = 4
N_KINDS = 34
HAND = 13
WALL = N_KINDS * 4 - N_SEATS * HAND - 1  # draws left after the deal and East's first draw: 83
A_WIN = 102
WIN_REWARD = 3.0

# observation offsets
O_HAND = 0
O_DISCARDS = 34 + 8
O_SEAT_WIND = O_DISCARDS + 3 * 34 + 3 * 34 + 34
O_PREVAILING = O_SEAT_WIND + 4
O_WALL = O_PREVAILING + 4
O_TURN = O_WALL + 1


def is_winning(counts: npt.NDArray[np.int64]) -> bool:
    """Fourteen tiles: four sets (pungs or chows) and a pair."""
    if int(counts.sum()) != 14:
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


class MahjongEnv:
    """One table. ``reset_into`` / ``step_into`` write the result in place."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.hands = np.zeros((N_SEATS, N_KINDS), dtype=np.int64)
        self.discards = np.zeros((N_SEATS, N_KINDS), dtype=np.int64)
        self.scores = np.zeros(N_SEATS, dtype=np.int64)
        self.wall: list[int] = []
        self.current = 0
        self.turn = 0
        self.last_discard = -1
        self.episode = 0
        self.over = False

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    # -- the game ------------------------------------------------------------------------------

    def _deal(self, seed: int | None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        tiles = self.rng.permutation(np.repeat(np.arange(N_KINDS), 4))
        self.hands[:] = 0
        self.discards[:] = 0
        for seat in range(N_SEATS):
            np.add.at(self.hands[seat], tiles[seat * HAND : (seat + 1) * HAND], 1)
        self.wall = [int(t) for t in tiles[N_SEATS * HAND :]]
        self.current = 0
        self.hands[0, self.wall.pop()] += 1
        self.turn = 0
        self.last_discard = -1
        self.episode += 1
        self.over = False

    def _mask(self, seat: int, out: npt.NDArray[np.bool_]) -> None:
        out[:] = False
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
            start = O_DISCARDS + (k - 1) * N_KINDS
            obs[start : start + N_KINDS] = self.discards[(seat + k) % N_SEATS] / 4
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
        out["score"] = self.scores[seat]
        out["episode_id"] = self.episode
        out["hand_value"] = reward if terminated else 0.0
        out["last_discard"] = self.last_discard
        out["dealer_streak"] = 0

    # -- the env interface ---------------------------------------------------------------------

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self._deal(seed)
        self._write(out, self.current, 0.0, False)

    def step_into(self, action: int, out: np.ndarray) -> None:
        if self.over:
            raise RuntimeError("the hand is over: reset first")
        seat = self.current
        hand = self.hands[seat]
        if action == A_WIN:
            if not is_winning(hand):
                raise ValueError(f"seat {seat} cannot win with this hand")
            self.over = True
            self.scores -= 1
            self.scores[seat] += N_SEATS
            self._write(out, seat, WIN_REWARD, True)
            return
        if not 0 <= action < N_KINDS or hand[action] == 0:
            raise ValueError(f"seat {seat} cannot discard tile kind {action}")
        hand[action] -= 1
        self.discards[seat, action] += 1
        self.last_discard = action
        self.turn += 1
        self.current = (seat + 1) % N_SEATS
        if not self.wall:
            self.over = True
            self._write(out, self.current, 0.0, True)
            return
        self.hands[self.current, self.wall.pop()] += 1
        self._write(out, self.current, 0.0, False)

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
