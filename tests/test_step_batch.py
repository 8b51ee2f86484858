"""An env with step_batch (seed 000's self-play stepBatch): STEP_MULTI steps one game's 8 seats.

The Python server in process and the Node server in a real process (library serve()), each
with a self-play echo env: seat k's result echoes its action, and the game counts its turns.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import transport
from transport.errors import RemoteError
from transport.generated import pac_env
from transport.protocol import ErrorCode
from transport.runtime.env import Spaces

from .servers import ROOT, require_lang, unique_unix_url

SEATS = 8


class SelfPlayEcho:
    """One game, 8 seats: step_batch(actions) gives seat k observation[0] = actions[k]."""

    def __init__(self) -> None:
        self.turns = 0

    def spaces(self) -> Spaces:
        return Spaces(612, 92)

    def reset(self, seed: int | None = None) -> np.ndarray:
        self.turns = 0
        record = pac_env.StepResult.zeros()
        record["action_mask"] = 1
        return record

    def step(self, action: int) -> np.ndarray:
        return self.step_batch(np.full(SEATS, action))[0]

    def step_batch(self, actions: np.ndarray) -> list[np.ndarray]:
        if int(actions[0]) == 66:
            raise RuntimeError("seat 0 played 66")
        self.turns += 1
        records = []
        for seat, action in enumerate(actions):
            record = pac_env.StepResult.zeros()
            record["action_mask"] = 1
            record["observation"][0] = action
            record["observation"][1] = seat
            record["life"] = self.turns
            record["done"] = int(self.turns >= 3)
            records.append(record)
        return records


NODE_SERVER = """
const { serve } = require(process.argv[2] + "/index");
class SelfPlayEcho {
  turns = 0;
  spaces() { return { obsN: 612, actN: 92 }; }
  result(seat, action) {
    const observation = new Float32Array(612);
    observation[0] = action;
    observation[1] = seat;
    return { observation, action_mask: new Uint8Array(92).fill(1), reward: 0,
             done: this.turns >= 3 ? 1 : 0, rank: 0, life: this.turns, money: 0, stage: 0,
             board_size: 0, level: 0, synergy_count: 0, items_held: 0, actions_this_turn: 0 };
  }
  reset() { this.turns = 0; return this.result(0, 0); }
  step(action) { return this.stepBatch([action, 0, 0, 0, 0, 0, 0, 0])[0]; }
  stepBatch(actions) {
    if (actions[0] === 66) throw new Error("seat 0 played 66");
    this.turns += 1;
    return Array.from(actions, (a, seat) => this.result(seat, a));
  }
}
serve(() => new SelfPlayEcho(), process.argv[1]).then((s) => console.log("ready " + s.url));
"""


@pytest.fixture(params=["python", "node"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    url = unique_unix_url()
    if request.param == "python":
        with transport.Server(SelfPlayEcho, url).start():
            yield url
        return
    require_lang("node")
    dist = ROOT / "node_bridge" / "dist"
    proc = subprocess.Popen(
        ["node", "-e", NODE_SERVER, url, str(dist)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(ROOT),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready"), "the Node server did not start"
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_step_multi_steps_the_seats_of_one_game(url: str) -> None:
    with transport.connect(url, timeout=5) as client:
        assert client.num_envs == 1
        with pytest.raises(RemoteError) as before:
            client.step_multi(range(SEATS))
        assert before.value.code == ErrorCode.NOT_RESET
        client.reset(seed=1)
        actions = np.arange(10, 10 + SEATS)
        result = client.step_multi(actions)
        assert result.observation.shape == (SEATS, 612)
        assert result.observation[:, 0].tolist() == actions.tolist()
        assert result.observation[:, 1].tolist() == list(range(SEATS))
        assert result.life.tolist() == [1] * SEATS
        # a single-seat step still works (the env's own step)
        assert float(client.step(5).observation[0]) == 5

        with pytest.raises(RemoteError) as bad:
            client.step_multi([1, 2, 3, 200, 5, 6, 7, 8])
        assert bad.value.code == ErrorCode.INVALID_ACTION and "seat 3" in str(bad.value)
        with pytest.raises(RemoteError) as raised:
            client.step_multi([66] + [0] * (SEATS - 1))
        assert raised.value.code == ErrorCode.ENV_ERROR and "66" in str(raised.value)
        # the env was reset after it raised: the game goes on from turn 1
        assert client.step_multi(range(SEATS)).life.tolist() == [1] * SEATS
        client.step_multi(range(SEATS))
        assert client.step_multi(range(SEATS)).done.tolist() == [1] * SEATS
        with pytest.raises(RemoteError) as over:
            client.step_multi(range(SEATS))
        assert over.value.code == ErrorCode.NOT_RESET


def test_seats_do_not_auto_reset(url: str) -> None:
    with transport.connect(url, timeout=5, autoreset="next_step") as client:
        client.reset()
        with pytest.raises(RemoteError) as refused:
            client.step_multi(range(SEATS))
        assert refused.value.code == ErrorCode.BAD_BATCH and "auto-reset" in str(refused.value)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
