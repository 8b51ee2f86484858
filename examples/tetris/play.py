#!/usr/bin/env python3
"""Play Tetris against the Node env server over the transport (examples/tetris/README.md).

    python examples/tetris/play.py --spawn                 # start the Node server, play 3 games
    python examples/tetris/play.py unix:///tmp/tetris.sock --games 10 --policy random

The client speaks schema/tetris.toml (``transport.connect(url, schema="schema/tetris.toml")``),
plays with a greedy policy (the classic four-feature placement heuristic) or uniformly among
the legal placements, and prints each game's lines and pieces, then the steps per second.

Every step it recomputes the legal placements from the observation with its own copy of the
rules and checks them against the server's action_mask (exit 1 on a mismatch), and it only
plays placements the mask allows: the server would refuse any other with MASKED_ACTION.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import transport
from transport.errors import ConnectError, PeerGoneError, TransportTimeoutError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schema" / "tetris.toml"
SERVER = ROOT / "node_bridge" / "dist" / "examples" / "tetris_server.js"

ROWS, COLS, N_PIECES, N_ROTATIONS = 20, 10, 7, 4
BOARD = ROWS * COLS
LINE_REWARDS = (0, 1, 3, 5, 8)

# The spawn shapes, (row, column) cells: I O T S Z J L (node_bridge/src/examples/tetris.ts).
SPAWN = (
    ((0, 0), (0, 1), (0, 2), (0, 3)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
    ((0, 1), (1, 0), (1, 1), (1, 2)),
    ((0, 1), (0, 2), (1, 0), (1, 1)),
    ((0, 0), (0, 1), (1, 1), (1, 2)),
    ((0, 0), (1, 0), (1, 1), (1, 2)),
    ((0, 2), (1, 0), (1, 1), (1, 2)),
)
Cells = tuple[tuple[int, int], ...]


def turn(cells: Cells) -> Cells:
    """A clockwise quarter turn, (r, c) -> (c, -r), moved back to the top-left corner; sorted."""
    turned = [(c, -r) for r, c in cells]
    min_r = min(r for r, _ in turned)
    min_c = min(c for _, c in turned)
    return tuple(sorted((r - min_r, c - min_c) for r, c in turned))


@dataclass(frozen=True)
class Rotation:
    cells: Cells
    width: int
    bottom: tuple[int, ...]  # per column of the piece, its lowest cell's row


def rotations_of(spawn: Cells) -> list[Rotation]:
    cells = turn(turn(turn(turn(spawn))))
    out = []
    for _ in range(N_ROTATIONS):
        width = max(c for _, c in cells) + 1
        bottom = tuple(max(r for r, c in cells if c == dc) for dc in range(width))
        out.append(Rotation(cells, width, bottom))
        cells = turn(cells)
    return out


ROTATIONS = [rotations_of(spawn) for spawn in SPAWN]


def column_tops(board: np.ndarray) -> np.ndarray:
    """Per column, the row of its highest filled cell (ROWS when empty)."""
    filled = board.any(axis=0)
    return np.where(filled, board.argmax(axis=0), ROWS)


def landing_row(tops: np.ndarray, piece: int, action: int) -> int:
    """Where a placement lands when hard-dropped from above, or -1 when it is not legal."""
    rot = ROTATIONS[piece][action // COLS]
    column = action % COLS
    if column + rot.width > COLS:
        return -1
    row = min(int(tops[column + dc]) - 1 - rot.bottom[dc] for dc in range(rot.width))
    return row if row >= 0 else -1


def place(board: np.ndarray, piece: int, action: int, row: int) -> tuple[np.ndarray, int]:
    """The board after the placement and its line clears, and the lines cleared."""
    after = board.copy()
    column = action % COLS
    for r, c in ROTATIONS[piece][action // COLS].cells:
        after[row + r, column + c] = True
    full = after.all(axis=1)
    lines = int(full.sum())
    if lines:
        after = np.vstack([np.zeros((lines, COLS), dtype=bool), after[~full]])
    return after, lines


def score(board: np.ndarray, lines: int) -> float:
    """The classic four-feature heuristic: lines, aggregate height, holes, bumpiness."""
    heights = ROWS - column_tops(board)
    holes = int((np.cumsum(board, axis=0) > 0).sum() - board.sum())
    bumpiness = int(np.abs(np.diff(heights)).sum())
    return 0.760666 * lines - 0.510066 * int(heights.sum()) - 0.35663 * holes - 0.184483 * bumpiness


class MaskMismatch(RuntimeError):
    """The server's action_mask and these rules disagree."""


def choose(observation: np.ndarray, mask: np.ndarray, policy: str, rng: random.Random) -> int:
    board = observation[:BOARD].reshape(ROWS, COLS) > 0.5
    piece = int(np.argmax(observation[BOARD : BOARD + N_PIECES]))
    tops = column_tops(board)
    rows = [landing_row(tops, piece, a) for a in range(N_ROTATIONS * COLS)]
    legal = [a for a, row in enumerate(rows) if row >= 0]
    if legal != np.flatnonzero(mask).tolist():
        raise MaskMismatch(f"piece {piece}: rules say {legal}, mask says {np.flatnonzero(mask)}")
    if policy == "random":
        return rng.choice(legal)
    best, best_score = legal[0], -float("inf")
    for action in legal:
        value = score(*place(board, piece, action, rows[action]))
        if value > best_score:
            best, best_score = action, value
    return best


def spawn_server(max_steps: int) -> tuple[subprocess.Popen[str], str]:
    """Start the Node Tetris server on a fresh unix socket; returns it and its URL."""
    if not SERVER.is_file():
        sys.exit(f"play.py: {SERVER} is missing: build node_bridge (cd node_bridge; npm run build)")
    path = Path(tempfile.gettempdir()) / f"tetris-{uuid.uuid4().hex[:12]}.sock"
    proc = subprocess.Popen(
        ["node", str(SERVER), f"unix://{path}", "--max-steps", str(max_steps)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("ready "):
        proc.kill()
        sys.exit(f"play.py: the server did not start: {line!r}")
    return proc, line.split(" ", 1)[1]


def stop_server(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def play(url: str, games: int, policy: str, seed: int) -> int:
    rng = random.Random(seed)
    total_steps = 0
    total_lines = 0
    in_step = 0.0  # seconds inside client.step: the transport and the env server
    with transport.connect(url, schema=os.fspath(SCHEMA)) as client:
        if client.num_envs != 1:
            raise SystemExit(
                f"play.py plays one game at a time: {url} serves {client.num_envs} envs; "
                "start the server with --num-envs 1 (the default)"
            )
        spaces = client.spaces()
        print(
            f"connected to {url}: {client.server_info.get('server')} server, "
            f"obs {spaces.obs_n}, {spaces.act_n} placements, policy {policy}"
        )
        started = time.perf_counter()
        for game in range(games):
            result = client.reset(seed=seed + game)
            while not result.done:
                action = choose(result.observation, result.action_mask, policy, rng)
                before = time.perf_counter()
                result = client.step(action)
                in_step += time.perf_counter() - before
                total_steps += 1
            lines, pieces = int(result.total_lines), int(result.pieces)
            total_lines += lines
            end = "truncated" if result.truncated else "top-out"
            print(f"game {game + 1}: {lines} lines, {pieces} pieces ({end})")
        elapsed = time.perf_counter() - started
    rate = total_steps / elapsed if elapsed > 0 else float("inf")
    step_rate = total_steps / in_step if in_step > 0 else float("inf")
    print(
        f"{games} games: {total_lines} lines, {total_steps} steps, {rate:.0f} steps/s "
        f"with the policy, {step_rate:.0f} steps/s in client.step"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Play Tetris against the Node env server over the transport.",
    )
    parser.add_argument("url", nargs="?", help="server URL, e.g. unix:///tmp/tetris.sock")
    parser.add_argument(
        "--spawn",
        action="store_true",
        help="start the Node server (node_bridge/dist/examples/tetris_server.js)",
    )
    parser.add_argument("--games", type=int, default=3, help="games to play (default 3)")
    parser.add_argument(
        "--policy",
        choices=["greedy", "random"],
        default="greedy",
        help="greedy heuristic or uniform among legal placements (default greedy)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of game 1 (game i: seed + i)")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=500,
        help="with --spawn: pieces per game before it is truncated (default 500)",
    )
    args = parser.parse_args(argv)
    if (args.url is None) == (not args.spawn):
        parser.error("give a URL or --spawn (not both)")
    if args.games < 1:
        parser.error("--games must be at least 1")
    if not args.spawn:
        return play(args.url, args.games, args.policy, args.seed)
    proc, url = spawn_server(args.max_steps)
    try:
        return play(url, args.games, args.policy, args.seed)
    finally:
        stop_server(proc)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (MaskMismatch, ConnectError, PeerGoneError, TransportTimeoutError) as exc:
        print(f"play.py: {exc}", file=sys.stderr)  # no server, a lost one: one line, not a trace
        sys.exit(1)
