"""The schema compiler: seed layouts come out exactly, and bad schemas fail with one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from transport.errors import SchemaError
from transport.schema import compile_schema, load_schema

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "schema"


def offsets(schema: str, struct: str) -> dict[str, tuple[int, int]]:
    ir = load_schema(SCHEMAS / f"{schema}.toml")
    return {f.name: (f.offset, f.size) for f in ir.structs[struct].fields}


def test_pac_env_matches_seed_appendix_a() -> None:
    ir = load_schema(SCHEMAS / "pac_env.toml")
    assert ir.structs["FrameHeader"].size == 9
    assert offsets("pac_env", "FrameHeader") == {
        "msg_type": (0, 1),
        "msg_id": (1, 4),
        "body_len": (5, 4),
    }
    assert ir.structs["StepResult"].size == 2557
    assert offsets("pac_env", "StepResult") == {
        "observation": (0, 2448),
        "action_mask": (2448, 92),
        "reward": (2540, 4),
        "done": (2544, 1),
        "rank": (2545, 1),
        "life": (2546, 2),
        "money": (2548, 2),
        "stage": (2550, 2),
        "board_size": (2552, 1),
        "level": (2553, 1),
        "synergy_count": (2554, 1),
        "items_held": (2555, 1),
        "actions_this_turn": (2556, 1),
    }
    assert ir.structs["StepMultiRequest"].size == 32
    assert ir.structs["StepMultiResult"].size == 20456
    assert ir.structs["SpacesResult"].size == 8
    assert ir.structs["Hello"].size == 12
    assert offsets("pac_env", "Hello") == {
        "protocol_version": (0, 2),
        "flags": (2, 2),
        "fingerprint": (4, 8),
    }
    ids = {m.name: m.id for m in ir.messages.values()}
    assert [ids[n] for n in ("RESET_REQ", "SPACES_RESP", "HELLO_REQ", "HELLO_RESP", "ERROR")] == [
        0x01,
        0x0C,
        0x0D,
        0x0E,
        0x0F,
    ]
    assert sorted(ids.values()) == list(range(0x01, 0x19))  # Appendix A, then 0x10-0x18


def test_pac_shm_matches_seed_appendix_b() -> None:
    ir = load_schema(SCHEMAS / "pac_shm.toml")
    assert ir.structs["ControlBlock"].size == 64
    control = offsets("pac_shm", "ControlBlock")
    for name, offset in {
        "magic": 0,
        "version": 4,
        "num_envs": 8,
        "obs_size": 12,
        "act_size": 16,
        "slot_size": 20,
    }.items():
        assert control[name] == (offset, 4)
    assert ir.structs["Slot"].size == 5120
    slot = offsets("pac_shm", "Slot")
    appendix_b = {
        "sem_action_ready": (0, 4),
        "sem_result_ready": (4, 4),
        "command": (8, 4),
        "action": (12, 4),
        "reward": (16, 4),
        "done": (20, 1),
        "rank": (21, 1),
        "life": (22, 2),
        "money": (24, 2),
        "stage": (26, 2),
        "board_size": (28, 1),
        "level": (29, 1),
        "synergy_count": (30, 1),
        "items_held": (31, 1),
        "observation": (32, 2448),
        "action_mask": (2480, 92),
    }
    assert {name: slot[name] for name in appendix_b} == appendix_b
    # whatever the transport adds lives in the appendix's padding, after byte 2572
    assert all(offset >= 2572 for name, (offset, _) in slot.items() if name not in appendix_b)


def test_mahjong_natural_alignment() -> None:
    ir = load_schema(SCHEMAS / "mahjong_env.toml")
    step = ir.structs["AgentStep"]
    assert step.align == 8
    assert step.size % 8 == 0
    assert step.field("observation").count == 290
    assert step.field("action_mask").count == 104
    assert ir.structs["ActionRequest"].field("action").offset == 2  # one padding byte
    assert ir.structs["ScoreUpdate"].size == 32  # trailing padding after 30 bytes
    assert {f.role for f in step.fields if f.role} >= {
        "observation",
        "action_mask",
        "reward",
        "terminated",
        "truncated",
    }


def test_fingerprint_ignores_comments_and_whitespace_but_not_layout() -> None:
    base = """
[schema]
name = "t"
[structs.A]
fields = [{ name = "x", type = "u32" }, { name = "y", type = "f32[2]" }]
"""
    spaced = "# a comment\n" + base.replace("= ", "=   ") + "\n\n# trailing\n"
    assert compile_schema(base).fingerprint == compile_schema(spaced).fingerprint
    for variant in (
        base.replace('"u32"', '"i32"'),
        base.replace("f32[2]", "f32[3]"),
        base.replace('name = "y"', 'name = "z"'),
        base.replace('type = "u32" }', 'type = "u32", offset = 4 }'),
    ):
        assert compile_schema(variant).fingerprint != compile_schema(base).fingerprint
    assert len(compile_schema(base).fingerprint_hex) == 16


BAD_SCHEMAS = [
    (
        'fields = [{ name = "x", type = "u33" }]',
        "struct S, field x: unknown type 'u33'",
    ),
    (
        'fields = [{ name = "x", type = "u32" }, { name = "y", type = "u8", offset = 2 }]',
        "struct S, field y: explicit offset 2 overlaps field x (bytes 0..3)",
    ),
    (
        'layout = "natural"\nfields = [{ name = "x", type = "u8" },'
        ' { name = "y", type = "u32", offset = 2 }]',
        "struct S, field y: explicit offset 2 is not a multiple of its alignment 4",
    ),
    (
        'size = 3\nfields = [{ name = "x", type = "u32" }]',
        "struct S, field x: size 3 is too small: the fields end at byte 4",
    ),
    (
        'fields = [{ name = "x", type = "u8" }, { name = "x", type = "u8" }]',
        "struct S, field x: duplicate field name",
    ),
    (
        'fields = [{ name = "x", type = "u8[0]" }]',
        "struct S, field x: array count must be at least 1, not 0",
    ),
    (
        'fields = [{ name = "x", type = "u8", ofset = 3 }]',
        "struct S, field x: unknown key 'ofset'",
    ),
    (
        'fields = [{ name = "x", type = "u8", role = "obs" }]',
        "struct S, field x: unknown role 'obs'",
    ),
    (
        'fields = [{ name = "x", type = "S" }]',
        "struct S: struct contains itself (S -> S)",
    ),
]


@pytest.mark.parametrize(("struct_body", "expected"), BAD_SCHEMAS)
def test_bad_schema_fails_with_one_line_naming_file_struct_field(
    tmp_path: Path, struct_body: str, expected: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'[schema]\nname = "bad"\n[structs.S]\n{struct_body}\n')
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_duplicate_message_ids_and_unknown_bodies(tmp_path: Path) -> None:
    head = '[schema]\nname = "m"\n[structs.S]\nfields = [{ name = "x", type = "u8" }]\n'
    path = tmp_path / "m.toml"
    path.write_text(head + "[messages]\nA = { id = 1 }\nB = { id = 1 }\n")
    with pytest.raises(SchemaError, match="message B: id 0x01 is already used by A"):
        load_schema(path)
    path.write_text(head + '[messages]\nA = { id = 1, body = "Nope" }\n')
    with pytest.raises(SchemaError, match="body 'Nope' is not a struct"):
        load_schema(path)


def test_enum_errors(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    tail = '[structs.S]\nfields = [{ name = "x", type = "E" }]\n'
    path.write_text(
        '[schema]\nname = "e"\n[enums.E]\ntype = "u8"\nvalues = { A = 1, B = 1 }\n' + tail
    )
    with pytest.raises(SchemaError, match="values A and B are both 1"):
        load_schema(path)
    path.write_text('[schema]\nname = "e"\n[enums.E]\ntype = "u8"\nvalues = { A = 256 }\n' + tail)
    with pytest.raises(SchemaError, match="value A = 256 does not fit u8"):
        load_schema(path)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[schema\nname=")
    with pytest.raises(SchemaError, match=r"broken\.toml: invalid TOML"):
        load_schema(path)
