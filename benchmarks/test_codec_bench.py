"""StepResult encode/decode: the NumPy codec next to a struct.pack/unpack baseline, one run.

Run: pytest benchmarks/test_codec_bench.py --benchmark-enable --benchmark-group-by=group
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport

ROOT = Path(__file__).resolve().parents[1]
STEP = transport.load_schema(ROOT / "schema" / "pac_env.toml")["StepResult"]
LAYOUT = struct.Struct("<612f92BfBBHHHBBBBB")
SCALARS = (
    "done",
    "rank",
    "life",
    "money",
    "stage",
    "board_size",
    "level",
    "synergy_count",
    "items_held",
    "actions_this_turn",
)


def values() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "observation": rng.standard_normal(612).astype(np.float32),
        "action_mask": rng.integers(0, 2, 92).astype(np.uint8),
        "reward": 0.5,
        **{name: i for i, name in enumerate(SCALARS)},
    }


@pytest.fixture(scope="module")
def step() -> dict[str, Any]:
    return values()


@pytest.mark.benchmark(group="encode StepResult")
def test_encode_struct_pack_baseline(benchmark: Any, step: dict[str, Any]) -> None:
    out = bytearray(LAYOUT.size)
    obs, mask = step["observation"].tolist(), step["action_mask"].tolist()

    def run() -> None:
        LAYOUT.pack_into(out, 0, *obs, *mask, step["reward"], *(step[k] for k in SCALARS))

    benchmark(run)


@pytest.mark.benchmark(group="encode StepResult")
def test_encode_record_into_buffer(benchmark: Any, step: dict[str, Any]) -> None:
    record = STEP.zeros()
    STEP.encode_into(bytearray(STEP.size), 0, step)
    record[()] = STEP.view(STEP.encode(step))
    out = bytearray(STEP.size)
    benchmark(STEP.encode_into, out, 0, record, validate=False)


@pytest.mark.benchmark(group="encode StepResult")
def test_encode_in_place_through_view(benchmark: Any, step: dict[str, Any]) -> None:
    out = bytearray(STEP.size)
    view = STEP.view(out)
    obs = step["observation"]

    def run() -> None:  # what an env server does: write fields straight into the send buffer
        view["observation"] = obs
        view["reward"] = 0.5
        view["done"] = 0

    benchmark(run)


@pytest.mark.benchmark(group="encode StepResult")
def test_encode_validated_dict(benchmark: Any, step: dict[str, Any]) -> None:
    out = bytearray(STEP.size)
    benchmark(STEP.encode_into, out, 0, step)


@pytest.mark.benchmark(group="decode StepResult")
def test_decode_struct_unpack_baseline(benchmark: Any, step: dict[str, Any]) -> None:
    data = STEP.encode(step)

    def run() -> tuple[Any, ...]:
        fields = LAYOUT.unpack_from(data, 0)
        return (np.array(fields[:612], dtype=np.float32), fields[612:704], *fields[704:])

    benchmark(run)


@pytest.mark.benchmark(group="decode StepResult")
def test_decode_zero_copy_view(benchmark: Any, step: dict[str, Any]) -> None:
    data = STEP.encode(step)

    def run() -> tuple[Any, ...]:
        view = STEP.view(data)
        return view["observation"], view["action_mask"], view["reward"]

    benchmark(run)


@pytest.mark.benchmark(group="decode StepResult")
def test_decode_strict_to_dict(benchmark: Any, step: dict[str, Any]) -> None:
    data = STEP.encode(step)
    benchmark(STEP.decode, data)
