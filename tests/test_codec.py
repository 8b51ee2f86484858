"""The Python codec: canonical bytes, zero-copy views over any buffer, typed errors."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport
from transport.errors import (
    ArrayLengthError,
    BufferSizeError,
    InvalidBoolError,
    InvalidEnumError,
    MissingFieldError,
    NonCanonicalError,
    UnknownFieldError,
    ValueRangeError,
    ValueTypeError,
)

ROOT = Path(__file__).resolve().parents[1]
PAC = transport.load_schema(ROOT / "schema" / "pac_env.toml")
SHM = transport.load_schema(ROOT / "schema" / "pac_shm.toml")
MAHJONG = transport.load_schema(ROOT / "schema" / "mahjong_env.toml")
STEP = PAC["StepResult"]


def step_values(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.standard_normal(612).astype(np.float32),
        "action_mask": rng.integers(0, 2, 92).astype(np.uint8),
        "reward": 1.5,
        "done": 1,
        "rank": 2,
        "life": 65535,
        "money": 300,
        "stage": 7,
        "board_size": 9,
        "level": 4,
        "synergy_count": 3,
        "items_held": 2,
        "actions_this_turn": 255,
    }


def test_step_result_bytes_match_struct_pack() -> None:
    values = step_values()
    expected = struct.pack(
        "<612f92BfBBHHHBBBBB",
        *values["observation"].tolist(),
        *values["action_mask"].tolist(),
        values["reward"],
        *(
            values[k]
            for k in (
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
        ),
    )
    assert STEP.encode(values) == expected
    decoded = STEP.decode(expected)
    assert np.array_equal(decoded["observation"], values["observation"])
    assert decoded["life"] == 65535 and decoded["reward"] == 1.5


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "numpy", "mmap"])
def test_encode_into_and_view_any_buffer_at_an_offset(kind: str) -> None:
    size = 9 + STEP.size
    buffers: dict[str, Any] = {
        "bytearray": lambda: bytearray(size),
        "memoryview": lambda: memoryview(bytearray(size)),
        "numpy": lambda: np.zeros(size, dtype=np.uint8),
        "mmap": lambda: mmap.mmap(-1, size),
    }
    buf = buffers[kind]()
    values = step_values(1)
    STEP.encode_into(buf, 9, values)
    view = STEP.view(buf, 9)
    assert np.array_equal(view["observation"], values["observation"])
    assert np.shares_memory(view["observation"], np.frombuffer(buf, dtype=np.uint8))
    view["reward"] = -2.0  # writes through to the buffer
    assert STEP.decode(buf, 9)["reward"] == -2.0
    assert bytes(memoryview(buf)[9:]) == STEP.encode({**values, "reward": -2.0})


def test_view_of_many_records_and_read_only_bytes() -> None:
    data = b"".join(STEP.encode(step_values(i)) for i in range(4))
    views = STEP.view(data, 0, count=4)
    assert views["observation"].shape == (4, 612)
    assert views["observation"].strides[0] == STEP.size
    assert not views.flags.writeable
    assert np.array_equal(views["observation"][3], step_values(3)["observation"])


def test_record_fast_path_zeroes_padding_and_canonicalises_nan() -> None:
    codec = MAHJONG["ScoreUpdate"]
    record = codec.zeros()
    record["scores"] = [1, -2, 3, -4]
    raw = bytearray(b"\xff" * codec.size)
    codec.encode_into(raw, 0, record)
    assert raw[30:32] == b"\0\0"  # trailing padding
    step = STEP.zeros()
    step["observation"][5] = np.float32(np.nan) * -1
    step["reward"] = np.frombuffer(struct.pack("<I", 0x7FC00123), dtype=np.float32)[0]
    out = bytearray(STEP.size)
    STEP.encode_into(out, 0, step)
    assert out[20:24] == struct.pack("<I", 0x7FC00000)
    assert out[2540:2544] == struct.pack("<I", 0x7FC00000)


def test_nested_arrays_of_structs() -> None:
    multi = PAC["StepMultiResult"]
    results = [step_values(i) for i in range(8)]
    data = multi.encode({"results": results})
    assert len(data) == 20456
    assert data[2557 * 5 : 2557 * 6] == STEP.encode(results[5])
    view = multi.view(data)
    assert view["results"]["observation"].shape == (8, 612)
    assert multi.decode(data)["results"][7]["life"] == 65535


def test_enum_bool_and_64_bit_fields() -> None:
    codec = MAHJONG["AgentStep"]
    record = codec.zeros()
    record["score"] = -(2**63)
    record["episode_id"] = 2**64 - 1
    record["terminated"] = True
    record["melds"]["kind"] = -1
    data = bytearray(codec.size)
    codec.encode_into(data, 0, record)
    decoded = codec.decode(data)
    assert decoded["score"] == -(2**63) and decoded["episode_id"] == 2**64 - 1
    assert decoded["terminated"] is True
    assert [m["kind"] for m in decoded["melds"]] == [-1] * 4


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        ({"life": 65536}, ValueRangeError, "life"),
        ({"done": -1}, ValueRangeError, "done"),
        ({"reward": 1e39}, ValueRangeError, "reward"),
        ({"reward": "1"}, ValueTypeError, "reward"),
        ({"rank": 1.5}, ValueTypeError, "rank"),
        ({"rank": True}, ValueTypeError, "rank"),
        ({"observation": [0.0] * 611}, ArrayLengthError, "observation"),
        ({"action_mask": np.full(92, 256)}, ValueRangeError, "action_mask[0]"),
        ({"bogus": 1}, UnknownFieldError, "bogus"),
    ],
)
def test_encode_errors_name_the_field(change: dict[str, Any], error: type, field: str) -> None:
    with pytest.raises(error) as info:
        STEP.encode({**step_values(), **change})
    assert info.value.field == field
    assert info.value.struct == "StepResult"


def test_integral_floats_are_accepted_for_integers() -> None:
    assert STEP.encode({**step_values(), "rank": 2.0}) == STEP.encode(step_values())


def test_missing_field() -> None:
    values = step_values()
    del values["money"]
    with pytest.raises(MissingFieldError, match=r"StepResult\.money"):
        STEP.encode(values)


def test_strict_decode_errors() -> None:
    codec = MAHJONG["AgentStep"]
    good = codec.encode_into
    data = bytearray(codec.size)
    good(data, 0, codec.zeros())
    bad_bool = bytearray(data)
    bad_bool[1168 + 3] = 7
    with pytest.raises(InvalidBoolError) as info:
        codec.decode(bad_bool)
    assert info.value.field == "action_mask[3]"
    codec.decode(bad_bool, strict=False)  # lenient decoding reads it anyway
    bad_enum = bytearray(data)
    bad_enum[0] = 9
    with pytest.raises(InvalidEnumError, match="agent"):
        codec.decode(bad_enum)
    bad_nan = bytearray(data)
    bad_nan[8 + 4 * 10 : 8 + 4 * 11] = struct.pack("<I", 0xFFC00000)
    with pytest.raises(NonCanonicalError) as nan_info:
        codec.decode(bad_nan)
    assert nan_info.value.field == "observation[10]"


def test_first_error_in_byte_order_across_nested_structs() -> None:
    multi = PAC["StepMultiResult"]
    data = bytearray(multi.encode({"results": [step_values(i) for i in range(8)]}))
    nan = struct.pack("<I", 0x7FC00001)
    data[2557 * 4 + 2540 : 2557 * 4 + 2544] = nan  # results[4].reward
    data[2557 * 6 + 8 : 2557 * 6 + 12] = nan  # results[6].observation[2]
    with pytest.raises(NonCanonicalError) as info:
        multi.decode(data)
    assert info.value.field == "results[4].reward"


def test_short_buffers() -> None:
    with pytest.raises(BufferSizeError):
        STEP.decode(bytes(STEP.size - 1))
    with pytest.raises(BufferSizeError):
        STEP.encode_into(bytearray(STEP.size), 1, step_values())
    with pytest.raises(BufferSizeError):
        STEP.view(bytes(STEP.size * 2), 0, count=3)


def test_shm_slot_layout_views() -> None:
    slot = SHM["Slot"]
    region = bytearray(64 + 4 * slot.size)
    slots = slot.view(region, 64, count=4)
    slots["observation"][2, 0] = 3.5
    assert struct.unpack_from("<f", region, 64 + 2 * 5120 + 32)[0] == 3.5
    slots["command"][1] = 2
    assert struct.unpack_from("<I", region, 64 + 5120 + 8)[0] == 2
