"""The [env] table: the env and shm IR sections, derived shm layouts and the pac_shm profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transport.errors import SchemaError
from transport.generated import pac_env, tetris
from transport.schema import compile_schema, ir_from_json, load_schema
from transport.schema.diagram import shm_diagram
from transport.schema.ir import SchemaIR

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "schema"

GRID = """
[schema]
name = "grid"
layout = "natural"

[structs.StepResult]
fields = [
  { name = "observation", type = "f32[50]", role = "observation" },
  { name = "reward",      type = "f64",     role = "reward" },
  { name = "terminated",  type = "bool",    role = "terminated" },
  { name = "truncated",   type = "bool",    role = "truncated" },
]

[structs.StepRequest]
fields = [{ name = "action", type = "u8", role = "action" }]

[env]
"""

SLOT_WORDS = {
    "sem_action_ready": (0, "u32"),
    "sem_result_ready": (4, "u32"),
    "command": (8, "SlotCommand"),
    "status": (12, "u16"),
    "has_seed": (14, "u8"),
    "seed": (16, "u64"),
    "error_len": (24, "u16"),
    "info_len": (26, "u16"),
}
CONTROL = {
    "magic": 0,
    "version": 4,
    "num_envs": 8,
    "obs_size": 12,
    "act_size": 16,
    "slot_size": 20,
    "fingerprint": 24,
    "owner_pid": 32,
    "state": 36,
    "owner_start_time": 40,
    "client_start_time": 48,
    "doorbell": 56,
    "client_pid": 60,
}


def fields_of(ir: SchemaIR, struct: str) -> dict[str, tuple[int, str]]:
    return {f.name: (f.offset, f.type) for f in ir.structs[struct].fields}


def test_derived_layout_is_cache_line_aligned() -> None:
    ir = compile_schema(GRID)
    assert ir.env is not None and ir.shm is not None
    assert ir.env.to_json() == {
        "result": "StepResult",
        "request": "StepRequest",
        "multi_request": "StepMultiRequest",
        "multi_result": "StepMultiResult",
        "seats": 8,
    }
    shm = ir.shm
    assert (shm.profile, shm.control, shm.slot, shm.final) == (
        "derived",
        "ShmControl",
        "ShmSlot",
        "ShmFinal",
    )
    slot = fields_of(ir, "ShmSlot")
    assert {name: slot[name] for name in SLOT_WORDS} == SLOT_WORDS
    # request at the second cache line, result at the next boundary after it (the result is
    # 50*4 + 8 + 2 = 210 -> 216 bytes with f64 alignment), then the texts at the next boundary
    assert ir.structs["StepResult"].size == 216
    assert slot["request"] == (64, "StepRequest")
    assert slot["result"] == (128, "StepResult")
    assert slot["error_text"] == (384, "u8[1024]")
    assert slot["info"] == (1408, "u8[256]")
    assert ir.structs["ShmSlot"].size == 1664
    assert ir.structs["ShmSlot"].size % 64 == 0
    assert shm.request_offsets == {"action": 64}
    assert shm.result_offsets == {
        "observation": 128,
        "reward": 328,
        "terminated": 336,
        "truncated": 337,
    }
    final = fields_of(ir, "ShmFinal")
    assert final == {"final_seq": (0, "u32"), "result": (64, "StepResult")}
    assert ir.structs["ShmFinal"].size == 320
    assert shm.final_result_offsets == {k: v - 64 for k, v in shm.result_offsets.items()}
    assert {f: o for f, (o, _) in fields_of(ir, "ShmControl").items()} == CONTROL
    assert ir.structs["ShmControl"].size == 64
    # futex words and every result field stay naturally aligned inside the slot
    for name, offset in shm.result_offsets.items():
        f = ir.structs["StepResult"].field(name)
        assert offset % f.elem_size == 0, name


def test_derived_multi_structs_and_envelope_enums() -> None:
    ir = compile_schema(GRID.replace("[env]", "[env]\nseats = 4"))
    multi_request = ir.structs["StepMultiRequest"]
    assert [(f.name, f.type, f.role) for f in multi_request.fields] == [
        ("actions", "u8[4]", "action")
    ]
    assert ir.structs["StepMultiResult"].size == 4 * 216
    assert ir.enums["SlotCommand"].values == {
        "STEP": 0,
        "RESET": 1,
        "SHUTDOWN": 2,
        "HELLO": 3,
        "OBSERVE": 4,
        "STEP_MULTI": 5,
    }
    assert ir.enums["RegionState"].values == {"CREATING": 0, "READY": 1, "CLOSED": 2}
    assert ir.enums["AutoReset"].values == {"DISABLED": 0, "NEXT_STEP": 1, "SAME_STEP": 2}


def test_a_schema_without_env_has_neither_section_and_keeps_its_fingerprint() -> None:
    ir = load_schema(SCHEMAS / "pac_shm.toml")
    assert ir.env is None and ir.shm is None
    assert "env" not in ir.to_json() and "shm" not in ir.to_json()


def test_env_and_shm_round_trip_through_json_and_the_fingerprint_covers_them() -> None:
    for ir in (compile_schema(GRID), load_schema(SCHEMAS / "pac_env.toml")):
        data = json.loads(json.dumps(ir.to_json()))
        back = ir_from_json(data)
        assert back.env == ir.env and back.shm == ir.shm
        assert back.fingerprint == ir.fingerprint
        data["shm"]["result_offsets"]["reward"] += 4
        with pytest.raises(ValueError, match="hashes to"):
            ir_from_json(data)
    assert compile_schema(GRID).fingerprint != compile_schema(GRID + "seats = 4").fingerprint


def test_generated_modules_carry_env_shm_and_the_diagram() -> None:
    assert pac_env.SCHEMA.ir.env is not None
    assert pac_env.SCHEMA.ir.shm is not None
    assert pac_env.SCHEMA.ir.shm.profile == "pac_shm"
    assert pac_env.SHM_SLOT_SIZE == 5120
    assert pac_env.SHM_RESULT_OFFSETS["observation"] == 32
    assert tetris.SCHEMA.ir.shm is not None
    assert tetris.SHM_REQUEST_OFFSETS == tetris.SCHEMA.ir.shm.request_offsets
    source = Path(tetris.__file__).read_text()
    for line in shm_diagram(tetris.SCHEMA.ir):
        assert f"# {line}".rstrip() in source


def test_pac_env_profile_is_appendix_b_byte_for_byte() -> None:
    ir = load_schema(SCHEMAS / "pac_env.toml")
    assert ir.shm is not None and ir.shm.profile == "pac_shm"
    assert ir.structs["ShmControl"].size == 64
    assert ir.structs["ShmSlot"].size == 5120
    assert ir.structs["ShmFinal"].size == 2576
    assert {f: o for f, (o, _) in fields_of(ir, "ShmControl").items()} == CONTROL
    # Appendix B's slot: control words, the action, then the result fields at fixed offsets
    slot = {f: o for f, (o, _) in fields_of(ir, "ShmSlot").items()}
    appendix_b = {
        "sem_action_ready": 0,
        "sem_result_ready": 4,
        "command": 8,
        "action": 12,
        "reward": 16,
        "done": 20,
        "rank": 21,
        "life": 22,
        "money": 24,
        "stage": 26,
        "board_size": 28,
        "level": 29,
        "synergy_count": 30,
        "items_held": 31,
        "observation": 32,
        "action_mask": 2480,
    }
    assert {name: slot[name] for name in appendix_b} == appendix_b
    assert ir.shm.request_offsets == {"action": 12}
    result_offsets = {k: v for k, v in appendix_b.items() if k not in SLOT_WORDS}
    del result_offsets["action"]
    assert {k: ir.shm.result_offsets[k] for k in result_offsets} == result_offsets
    assert ir.shm.result_offsets["actions_this_turn"] == 2572
    assert ir.shm.final_result_offsets == ir.shm.result_offsets
    # the profile's structs, copied: the same layout as pac_shm.toml's
    profile = load_schema(SCHEMAS / "pac_shm.toml")
    assert ir.structs["ShmSlot"].to_json() == profile.structs["Slot"].to_json()
    assert ir.structs["ShmFinal"].to_json() == profile.structs["FinalArea"].to_json()
    assert ir.structs["ShmControl"].to_json() == profile.structs["ControlBlock"].to_json()


def test_tetris_and_mahjong_get_derived_layouts() -> None:
    for name in ("tetris", "mahjong_env"):
        ir = load_schema(SCHEMAS / f"{name}.toml")
        assert ir.shm is not None and ir.shm.profile == "derived"
        assert ir.structs["ShmSlot"].size % 64 == 0
        assert ir.structs["ShmFinal"].size % 64 == 0
        assert all(o % 64 == 0 for o in (ir.structs["ShmSlot"].field("request").offset,))
        assert ir.structs["ShmSlot"].field("result").offset % 64 == 0


BAD_ENVS = [
    (GRID + 'result = "Nope"', "[env] result = 'Nope' is not a struct of this schema"),
    (GRID + "seats = 0", "[env] seats must be an integer 1..1024, not 0"),
    (GRID + "colour = 1", "unknown key 'colour' in [env]"),
    (
        GRID.replace(', role = "action"', ""),
        'struct StepRequest: the [env] request struct needs a field with role "action"',
    ),
    (
        GRID.replace('type = "u8", role = "action"', 'type = "u64", role = "action"'),
        "struct StepRequest, field action: the action must be one 8-32 bit integer",
    ),
    (
        GRID.replace('type = "u8", role = "action"', 'type = "i32[2]", role = "action"'),
        "(MultiDiscrete) needs high",  # an int array action is MultiDiscrete now
    ),
    (
        GRID + '[structs.StepMultiRequest]\nfields = [{ name = "actions", type = "u8[4]" }]',
        "struct StepMultiRequest: must have one field of type u8[8] ([env] seats = 8)",
    ),
    (
        GRID + '[structs.ShmSlot]\nfields = [{ name = "x", type = "u8" }]',
        "struct ShmSlot: is reserved",
    ),
    (
        GRID + '[enums.SlotCommand]\ntype = "u8"\nvalues = { A = 0 }',
        "enum SlotCommand is declared by the protocol envelope",
    ),
    (
        GRID + '[structs.ShmControl]\nfields = [{ name = "x", type = "u8" }]',
        "struct ShmControl: declared by the protocol envelope",
    ),
    (GRID + 'shm = "no_such_profile"', "[env] shm = 'no_such_profile': no layout profile"),
    (
        GRID + 'shm = "pac_shm"',
        "struct StepRequest, field action: [env] shm = 'pac_shm': u8 here, i32 in its Slot",
    ),
    (
        GRID.replace('"u8", role', '"i32", role') + 'shm = "pac_shm"',
        "struct StepResult, field observation: [env] shm = 'pac_shm': f32[50] here, f32[612]",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_ENVS)
def test_bad_env_fails_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(text + "\n")
    (tmp_path / "pac_shm.toml").write_text((SCHEMAS / "pac_shm.toml").read_text())
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_profile_must_declare_its_structs(tmp_path: Path) -> None:
    profile = (SCHEMAS / "pac_shm.toml").read_text().replace('slot = "Slot"', 'slot = "Slott"')
    (tmp_path / "p.toml").write_text(profile)
    with pytest.raises(SchemaError, match=r"\[shm_profile\] slot must name a struct"):
        load_schema(tmp_path / "p.toml")
