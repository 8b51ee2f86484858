"""The protocol envelope (schema/protocol.toml): declared once, merged into every env schema, and
the only source of transport/protocol.py's constants."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from transport import protocol
from transport.errors import (
    EnvError,
    FingerprintMismatchError,
    RemoteError,
    SchemaError,
    VersionMismatchError,
)
from transport.generated import mahjong_env, pac_env, tetris
from transport.generated import protocol as envelope
from transport.schema import load_schema

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "schema"
ENVELOPE_STRUCTS = ("FrameHeader", "Hello", "ErrorHead", "HealthResult", "SpacesResult")

OWN = """
[schema]
name = "own"

[structs.StepResult]
fields = [{ name = "observation", type = "f32[3]", role = "observation" }]

[structs.StepRequest]
fields = [{ name = "action", type = "i32", role = "action" }]

[env]
"""


def test_envelope_tables_are_the_protocol_of_docs_protocol_md() -> None:
    ir = load_schema(SCHEMAS / "protocol.toml")
    assert ir.errors is not None and ir.http is not None
    assert {n: e.http for n, e in ir.errors.items()} == {
        "BAD_FRAME": 400,
        "UNKNOWN_MESSAGE": 404,
        "BAD_BODY_SIZE": 400,
        "BODY_TOO_LARGE": 413,
        "HELLO_REQUIRED": 400,
        "VERSION_MISMATCH": 409,
        "FINGERPRINT_MISMATCH": 409,
        "INVALID_ACTION": 422,
        "MASKED_ACTION": 422,
        "ENV_ERROR": 500,
        "BAD_BATCH": 422,
        "NOT_RESET": 422,
        "INTERNAL": 500,
        "ASYNC_STATE": 409,
    }
    assert {n for n, e in ir.errors.items() if e.closes} == {
        "BAD_FRAME",
        "UNKNOWN_MESSAGE",
        "BODY_TOO_LARGE",
        "VERSION_MISMATCH",
        "FINGERPRINT_MISMATCH",
    }
    assert ir.http == {
        "hello": "HELLO_REQ",
        "reset": "RESET_REQ",
        "reset_seed": "RESET_SEED_REQ",
        "reset_seeds": "RESET_SEEDS_REQ",
        "step": "STEP_REQ",
        "step_multi": "STEP_MULTI_REQ",
        "step_batch": "STEP_BATCH_REQ",
        "observe": "OBSERVE_REQ",
        "health": "HEALTH_REQ",
        "spaces": "SPACES_REQ",
        "send": "SEND_REQ",
        "recv": "RECV_REQ",
        "async_reset": "ASYNC_RESET_REQ",
    }
    ids = {name: m.id for name, m in ir.messages.items()}
    assert ids["OBSERVE_REQ"] == 0x07 and ids["OBSERVE_RESP"] == 0x08
    assert sorted(ids.values()) == list(range(0x01, 0x19))
    assert ir.messages["STEP_RESP"].body == "$result"


def test_protocol_module_takes_every_constant_from_the_generated_envelope() -> None:
    assert protocol.ErrorCode is envelope.ErrorCode
    assert protocol.AutoReset is envelope.AutoReset
    assert protocol.SlotCommand is envelope.SlotCommand
    assert protocol.SlotCommand.STEP_MULTI == 5 and protocol.RegionState.READY == 1
    assert protocol.CLOSING_ERRORS == envelope.CLOSING_ERRORS
    assert protocol.HTTP_STATUS[protocol.ErrorCode.BODY_TOO_LARGE] == 413
    assert protocol.HTTP_ROUTES["observe"] == "OBSERVE_REQ"
    assert (protocol.HEADER.format, protocol.HEADER_SIZE) == ("<BII", 9)
    assert protocol.HELLO.format == "<HHQ" and protocol.HELLO.size == envelope.Hello.size == 12
    assert protocol.ERROR_HEAD.format == "<HH"
    assert set(protocol.MessageIds.__dataclass_fields__) == set(envelope.SCHEMA.ir.messages)
    assert protocol.MESSAGE_IDS.OBSERVE_RESP == 0x08


def test_every_env_schema_has_the_envelope_merged_in() -> None:
    for module in (pac_env, tetris, mahjong_env):
        ir = module.SCHEMA.ir
        for name in ENVELOPE_STRUCTS:
            assert ir.structs[name].to_json() == envelope.SCHEMA.ir.structs[name].to_json()
        for name in ("ErrorCode", "AutoReset", "SlotCommand", "RegionState"):
            assert ir.enums[name] == envelope.SCHEMA.ir.enums[name]
        assert protocol.MessageIds.from_schema(ir) == protocol.MESSAGE_IDS
        assert ir.env is not None
        assert ir.messages["STEP_RESP"].body == ir.env.result
        assert ir.messages["STEP_BATCH_REQ"].body == ir.env.request
        assert ir.messages["STEP_MULTI_RESP"].body == ir.env.multi_result
    # mahjong's seeded reset is the envelope's; its own reset-with-options got another name
    assert [f.name for f in mahjong_env.ResetRequest.ir.fields] == ["seed"]
    assert [f.name for f in mahjong_env.ResetOptions.ir.fields] == ["seed", "options"]
    assert mahjong_env.SCHEMA.ir.messages["SCORE_RESP"].id == 0x20


def test_pac_env_still_declares_appendix_a_byte_for_byte() -> None:
    ir = pac_env.SCHEMA.ir
    sizes = {n: ir.structs[n].size for n in ("StepResult", "FrameHeader", "StepRequest")}
    assert sizes == {"StepResult": 2557, "FrameHeader": 9, "StepRequest": 4}
    assert ir.structs["StepMultiRequest"].size == 32
    assert ir.structs["StepMultiResult"].size == 20456
    assert [(f.name, f.type, f.offset) for f in ir.structs["StepMultiRequest"].fields] == [
        ("actions", "i32[8]", 0)
    ]
    assert ir.structs["SpacesResult"].size == 8


def test_error_from_code_is_the_one_mapping() -> None:
    assert isinstance(protocol.error_from_code(6, "x"), VersionMismatchError)
    assert isinstance(protocol.error_from_code(7, "x"), FingerprintMismatchError)
    env = protocol.error_from_code(10, "env 3: boom")
    assert isinstance(env, EnvError) and env.env_id == 3
    other = protocol.error_from_code(99, "?")
    assert isinstance(other, RemoteError) and other.name == "UNKNOWN"
    decoded = protocol.decode_error(protocol.encode_error(9, "masked"))
    assert isinstance(decoded, RemoteError) and (decoded.code, decoded.text) == (9, "masked")


BAD = [
    (
        OWN + '[structs.Hello]\nfields = [{ name = "x", type = "u8" }]\n',
        "struct Hello: declared by the protocol envelope",
    ),
    (
        OWN + "[messages]\nSTEP_REQ = { id = 0x30 }\n",
        "message STEP_REQ: declared by the protocol envelope",
    ),
    (
        OWN + "[messages]\nMINE = { id = 0x03 }\n",
        "message MINE: id 0x03 is used by the envelope's STEP_REQ",
    ),
    (
        OWN + "[errors]\nBAD_FRAME = { http = 400 }\n",
        "[errors] and [http] belong to the protocol envelope only",
    ),
    (
        OWN.replace("[env]", "") + '[messages]\nX = { id = 1, body = "$result" }\n',
        "message X: body '$result' is not a struct of this schema",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_a_user_schema_declares_only_its_own(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "own.toml"
    path.write_text(text)
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_envelope_table_errors(tmp_path: Path) -> None:
    text = (SCHEMAS / "protocol.toml").read_text()
    path = tmp_path / "p.toml"
    path.write_text(text.replace("INTERNAL             = { http = 500 }", ""))
    with pytest.raises(SchemaError, match=r"\[errors\] INTERNAL: every ErrorCode needs"):
        load_schema(path)
    path.write_text(text.replace('spaces     = "SPACES_REQ"', 'spaces     = "SPACE_REQ"'))
    with pytest.raises(SchemaError, match=r"\[http\] spaces: 'SPACE_REQ' is not a message"):
        load_schema(path)
    path.write_text(text.replace("{ http = 422 }", "{ http = 422, closes = 1 }", 1))
    with pytest.raises(SchemaError, match="closes must be true or false"):
        load_schema(path)


def test_a_minimal_user_schema_gets_the_whole_protocol() -> None:
    from transport.schema import compile_schema

    ir = compile_schema(OWN)
    assert protocol.MessageIds.from_schema(ir) == protocol.MESSAGE_IDS
    assert ir.structs["StepMultiResult"].size == 8 * 12
    assert ir.shm is not None and ir.shm.profile == "derived"


def test_without_the_schema_folder_the_generated_envelope_stands_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from transport.schema import compiler

    monkeypatch.setattr(compiler, "ENVELOPE_FILE", tmp_path / "missing.toml")
    for name in ("tetris", "mahjong_env", "gridworld"):
        module = importlib.import_module(f"transport.generated.{name}")
        assert load_schema(SCHEMAS / f"{name}.toml").fingerprint == module.FINGERPRINT, name
