"""Gymnasium details (issue 15 items 5 and 7): hints that name what exists, bools for flag
fields, and the gymnasium / PettingZoo API against real servers, checked against gymnasium's
own ``SyncVectorEnv`` on the same local env where it applies."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import transport
from transport.api import Server
from transport.envs.pac import PacEnv
from transport.errors import AdapterError, ValueTypeError
from transport.generated import pac_env

from .servers import ROOT, ServerProcess, require_lang, unique_url

# -- item 5: hints and flags ---------------------------------------------------------------------


def test_remote_env_hint_names_classes_and_both_ways_to_serve_one_env() -> None:
    from transport.gym import RemoteEnv

    with ServerProcess(unique_url("unix"), env="pac", num_envs=4) as server:
        with pytest.raises(AdapterError) as info:
            RemoteEnv(server.url)
    text = str(info.value)
    assert "RemoteVectorEnv" in text and "RemoteVecEnv" in text
    assert "--num-envs 1" in text and "transport.serve(..., num_envs=1)" in text
    assert "num_envs=16" not in text


def test_remote_aec_env_hint_names_both_ways_to_serve_one_table() -> None:
    pytest.importorskip("pettingzoo")
    from transport.pettingzoo import RemoteAECEnv

    with ServerProcess(unique_url("unix"), env="mahjong", num_envs=2) as server:
        with pytest.raises(AdapterError) as info:
            RemoteAECEnv(server.url)
    text = str(info.value)
    assert server.url in text
    assert "--num-envs 1" in text and "transport.serve(..., num_envs=1)" in text


def _result(**changes: Any) -> dict[str, Any]:
    codec = pac_env.SCHEMA["StepResult"]
    values: dict[str, Any] = {f.name: 0 for f in codec.ir.fields}
    values.update(observation=np.zeros(612, np.float32), action_mask=[1] * 92, reward=0.0)
    values.update(changes)
    return values


def test_python_bool_is_accepted_for_flag_fields_only() -> None:
    """``done`` (u8, role done) and ``action_mask`` (u8[92]) are flags; ``rank`` is a number."""
    codec = pac_env.SCHEMA["StepResult"]
    mask = [True, False] * 46
    decoded = codec.decode(codec.encode(_result(done=True, action_mask=mask)))
    assert decoded["done"] == 1
    assert decoded["action_mask"].tolist() == [1, 0] * 46
    assert codec.decode(codec.encode(_result(done=np.bool_(False))))["done"] == 0
    with pytest.raises(ValueTypeError, match="rank"):
        codec.encode(_result(rank=True))


class DictPac(PacEnv):
    """pac whose results are plain dicts with Python bools in the flag fields."""

    def step(self, action: int) -> Any:
        record = super().step(action)
        out: dict[str, Any] = {name: record[name] for name in record.dtype.names or ()}
        out["done"] = bool(record["done"])
        out["action_mask"] = [bool(x) for x in record["action_mask"]]
        return out


def test_an_env_may_return_bools_in_flag_fields() -> None:
    with (
        Server(DictPac, unique_url("unix")).start() as server,
        transport.connect(server.bound_url) as client,
    ):
        client.reset(1)
        result = client.step(0)
        assert result["done"] in (0, 1)


def test_node_codec_takes_booleans_for_flag_fields_only() -> None:
    require_lang("node")
    pac_js = json.dumps(str(ROOT / "node_bridge" / "dist" / "generated" / "pac_env.js"))
    script = (
        f"const pac = require({pac_js});"
        + """
const codec = pac.SCHEMA.structs.StepResult;
const fields = {observation: new Float32Array(612), action_mask: new Array(92).fill(true),
  reward: 0, done: true, rank: 0, life: 0, money: 0, stage: 0, board_size: 0, level: 0,
  synergy_count: 0, items_held: 0, actions_this_turn: 0};
const out = codec.decode(codec.encode(fields));
let refused = "";
try { codec.encode({...fields, rank: true}); } catch (e) { refused = e.constructor.name; }
console.log(JSON.stringify({done: out.done, mask: out.action_mask[0], refused}));
"""
    )
    run = subprocess.run(
        ["node", "-e", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(run.stdout) == {"done": 1, "mask": 1, "refused": "ValueTypeError"}
