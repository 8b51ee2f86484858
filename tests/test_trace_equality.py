"""Seed 000 section 1.4a: the same seeded games give byte-identical traces on every path.

100 games of `pac` under a seeded random legal policy, over unix and http, against the Python
and the Node server: the four traces (observation, mask, reward, done and every info scalar of
every step) must be identical bytes.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

import transport.api as api

from .servers import ServerProcess, require_lang, unique_url

GAMES = 100
MAX_STEPS = 2000


def play(url: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    steps = 0
    with api.connect(url, timeout=10) as client:
        for game in range(GAMES):
            policy = random.Random(game)
            result = client.reset(seed=game)
            digest.update(result.record.tobytes())
            for _ in range(MAX_STEPS):
                legal = np.flatnonzero(result.action_mask).tolist()
                assert legal, "the mask forbids every action"
                result = client.step(policy.choice(legal))
                digest.update(result.record.tobytes())
                steps += 1
                if result.done:
                    break
            else:
                pytest.fail(f"game {game} did not end within {MAX_STEPS} steps")
    return digest.hexdigest(), steps


def test_pac_traces_identical_over_unix_and_http_python_and_node() -> None:
    traces: dict[tuple[str, str], tuple[str, int]] = {}
    for lang in ("python", "node"):
        require_lang(lang)
        for backend in ("unix", "http"):
            with ServerProcess(unique_url(backend), env="pac", lang=lang) as server:
                traces[(backend, lang)] = play(server.url)
    reference = traces[("unix", "python")]
    assert reference[1] > GAMES  # games last more than one step
    for key, trace in traces.items():
        assert trace == reference, f"{key} differs from unix/python"
