"""JSON answers (``Accept: application/json``) of responses with a tail: exactly one row per
result, and the tail's content rendered as JSON (docs/protocol.md, "JSON answers").

Regression: the http:// servers (Python and Node) cut the whole body into records, tails
included, so a RECV_RESP (its msgpack ``[env ids, ended ids, finals]``), a SAME_STEP step
response (``u32 k`` + k final results) and an OBSERVE_RESP (msgpack infos) came back with
made-up rows, and without the env ids, the final results or the infos. Now: ``results`` holds
exactly B (RECV) or N results, ``env_ids`` the RECV's env ids, ``finals`` the final results of
the envs that ended (``[{"env_id": i, "result": {...}}]``), ``infos`` OBSERVE's info maps, and
both servers answer the same JSON.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest

import transport.api as api
from transport.backends import http as http_backend
from transport.gym_serve import gym_server

from .servers import ServerProcess, require_lang

N = 16
TIMEOUT = 10.0
SAME_STEP = 2
HOLE = 12  # FrozenLake 4x4, not slippery: three steps down from the start fall into state 12


class JsonSession:
    """One keep-alive connection that posts JSON and reads JSON answers."""

    def __init__(self, url: str, autoreset: int) -> None:
        address = http_backend.parse_url(url)
        self.conn = http.client.HTTPConnection(address.host, address.port, timeout=TIMEOUT)
        with api.connect(url) as client:
            fingerprint = client.schema.fingerprint
        self.fp = f"{fingerprint:016x}"
        hello = {"protocol_version": 0x0100, "flags": autoreset, "fingerprint": fingerprint}
        status, answer = self.post("hello", hello)
        assert status == 200 and answer["fingerprint"] == self.fp, answer

    def post(self, method: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if method != "hello":
            headers["X-Transport-Fingerprint"] = self.fp
        data = b"" if body is None else json.dumps(body).encode()
        self.conn.request("POST", f"/v1/{method}", body=data, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())

    def ok(self, method: str, body: Any = None) -> dict[str, Any]:
        status, answer = self.post(method, body)
        assert status == 200, answer
        return answer

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def lake() -> Iterator[str]:
    """FrozenLake-v1 (not slippery: deterministic) x 16 on an in-process Python server. Its
    result is 18 bytes, so any tail is longer than a record."""
    server = gym_server(
        "FrozenLake-v1", "http://127.0.0.1:0", num_envs=N, gym_kwargs={"is_slippery": False}
    )
    with server.start():
        yield server.bound_url


def mixed_actions() -> list[dict[str, int]]:
    """Even envs walk down (into the hole on the third step), odd envs walk right (never end)."""
    return [{"action": 1 if i % 2 == 0 else 2} for i in range(N)]


def test_recv_renders_b_results_and_their_env_ids(lake: str) -> None:
    session = JsonSession(lake, SAME_STEP)
    try:
        session.ok("async_reset", {"seed": 0, "has_seed": True})
        answer = session.ok("recv", {"batch_size": N})
        assert answer["message"] == "RECV_RESP"
        assert len(answer["results"]) == N  # was N + 1: the msgpack tail read as a record
        assert sorted(answer["env_ids"]) == list(range(N))
        assert answer["finals"] == []
        assert all(row["observation"] == 0 for row in answer["results"])
        # a partial RECV: B rows and B env ids, the rest in the next RECV
        session.ok("async_reset", {"seed": 0, "has_seed": True})
        first = session.ok("recv", {"batch_size": 3})
        assert len(first["results"]) == 3 and len(first["env_ids"]) == 3
        rest = session.ok("recv", {"batch_size": N})
        assert len(rest["results"]) == N - 3
        assert sorted(first["env_ids"] + rest["env_ids"]) == list(range(N))
    finally:
        session.close()


def test_same_step_step_batch_renders_n_results_and_the_finals(lake: str) -> None:
    session = JsonSession(lake, SAME_STEP)
    try:
        reset = session.ok("reset_seed", {"seed": 7})
        assert len(reset["results"]) == N and "finals" not in reset  # RESET_RESP has no tail
        for step in range(3):
            answer = session.ok("step_batch", mixed_actions())
            assert answer["message"] == "STEP_BATCH_RESP"
            assert len(answer["results"]) == N, step  # was N + 1 + ...: the tail's bytes
            if step < 2:
                assert answer["finals"] == []  # SAME_STEP: the tail is there, k = 0
        ended = [final["env_id"] for final in answer["finals"]]
        assert ended == list(range(0, N, 2))
        for final in answer["finals"]:
            assert final["result"]["observation"] == HOLE
            assert final["result"]["terminated"] is True
        rows = answer["results"]
        assert [rows[i]["observation"] for i in ended] == [0] * len(ended)  # reset at once
        assert [rows[i]["observation"] for i in range(1, N, 2)] == [3] * (N // 2)
    finally:
        session.close()
    # the binary client on the same server sees the same finals
    with api.connect(lake, autoreset="same_step") as client:
        client.reset(seed=7)
        for _ in range(3):
            client.step(np.array([a["action"] for a in mixed_actions()]))
        assert [i for i, _ in client.finals] == ended


def test_recv_renders_same_step_finals(lake: str) -> None:
    session = JsonSession(lake, SAME_STEP)
    try:
        session.ok("async_reset", {"seed": 0, "has_seed": True})
        assert len(session.ok("recv", {"batch_size": N})["results"]) == N
        actions = mixed_actions()
        for _ in range(3):
            # SEND: K requests, then the msgpack array of their env ids (a JSON body cannot
            # carry that tail): the binary body, a JSON answer
            ids = list(range(N))
            raw = bytes(a["action"] for a in actions) + msgpack.packb(ids)
            session.conn.request(
                "POST",
                "/v1/send",
                body=raw,
                headers={"Accept": "application/json", "X-Transport-Fingerprint": session.fp},
            )
            resp = session.conn.getresponse()
            assert resp.status == 200, resp.read()
            resp.read()
            got = session.ok("recv", {"batch_size": N})
            assert len(got["results"]) == N and sorted(got["env_ids"]) == ids
        ended = sorted(final["env_id"] for final in got["finals"])
        assert ended == list(range(0, N, 2))
        assert all(final["result"]["observation"] == HOLE for final in got["finals"])
        rows = dict(zip(got["env_ids"], got["results"], strict=True))
        assert all(rows[i]["observation"] == 0 for i in ended)
    finally:
        session.close()


def test_observe_renders_n_results_and_their_infos(lake: str) -> None:
    session = JsonSession(lake, 0)
    try:
        session.ok("reset_seed", {"seed": 1})
        answer = session.ok("observe")
        assert answer["message"] == "OBSERVE_RESP"
        assert len(answer["results"]) == N  # was more: the msgpack infos read as records
        assert len(answer["infos"]) == N and all(isinstance(i, dict) for i in answer["infos"])
        # next_step / disabled step responses carry no tail: no "finals" key
        answer = session.ok("step_batch", mixed_actions())
        assert len(answer["results"]) == N and "finals" not in answer
    finally:
        session.close()


def test_one_env_same_step_step_renders_result_and_finals() -> None:
    server = gym_server(
        "FrozenLake-v1", "http://127.0.0.1:0", num_envs=1, gym_kwargs={"is_slippery": False}
    )
    with server.start():
        session = JsonSession(server.bound_url, SAME_STEP)
        try:
            session.ok("reset_seed", {"seed": 3})
            for _ in range(2):
                answer = session.ok("step", {"action": 1})
                assert "results" not in answer and answer["finals"] == []
            answer = session.ok("step", {"action": 1})
            assert "results" not in answer  # was a list: the result and the tail's bytes
            assert answer["result"]["observation"] == 0
            assert answer["finals"] == [
                {
                    "env_id": 0,
                    "result": {
                        "observation": HOLE,
                        "reward": 0.0,
                        "terminated": True,
                        "truncated": False,
                    },
                }
            ]
        finally:
            session.close()


# -- both servers: the same JSON ----------------------------------------------------------------

LOCK_N = 4


def lock_transcript(url: str) -> list[dict[str, Any]]:
    """The JSON answers of a fixed script on the ``lock`` reference env (40-byte results, f64
    rewards; episodes end when solved or after 20 steps): SAME_STEP lock-step batches until an
    episode ends, OBSERVE, then asynchronous RECVs (one of a single result)."""
    session = JsonSession(url, SAME_STEP)
    out: list[dict[str, Any]] = []
    try:
        out.append(session.ok("reset_seed", {"seed": 3}))
        for step in range(40):
            actions = [{"dials": [(i + step) % 3, i % 4, (i * step) % 5]} for i in range(LOCK_N)]
            answer = session.ok("step_batch", actions)
            assert len(answer["results"]) == LOCK_N  # was more: the final tail's bytes
            out.append(answer)
            if answer["finals"]:
                break
        else:
            raise AssertionError("no lock episode ended in 40 steps")
        observed = session.ok("observe")
        assert len(observed["results"]) == LOCK_N and len(observed["infos"]) == LOCK_N
        out.append(observed)
        session.ok("async_reset", {"seed": 5, "has_seed": True})
        first = session.ok("recv", {"batch_size": 1})
        assert "result" in first and len(first["env_ids"]) == 1 and first["finals"] == []
        rest = session.ok("recv", {"batch_size": LOCK_N})
        assert len(rest["results"]) == LOCK_N - 1 and len(rest["env_ids"]) == LOCK_N - 1
        assert sorted(first["env_ids"] + rest["env_ids"]) == list(range(LOCK_N))
        out += [first, rest]
    finally:
        session.close()
    return out


@pytest.fixture(scope="module")
def python_lock() -> Iterator[list[dict[str, Any]]]:
    with ServerProcess("http://127.0.0.1:0", env="lock", lang="python", num_envs=LOCK_N) as proc:
        yield lock_transcript(proc.url)


@pytest.mark.parametrize("lang", ["python", "node"])
def test_each_server_renders_the_tails(lang: str, python_lock: list[dict[str, Any]]) -> None:
    if lang == "python":
        transcript = python_lock
    else:
        require_lang("node")
        with ServerProcess("http://127.0.0.1:0", env="lock", lang="node", num_envs=LOCK_N) as proc:
            transcript = lock_transcript(proc.url)
    last_step = transcript[-4]
    assert last_step["message"] == "STEP_BATCH_RESP" and last_step["finals"]
    for final in last_step["finals"]:
        assert 0 <= final["env_id"] < LOCK_N
        assert final["result"]["terminated"] or final["result"]["truncated"]
    if lang == "node":
        assert transcript == python_lock  # both servers answer the same JSON
