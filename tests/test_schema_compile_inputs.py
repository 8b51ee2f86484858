"""What ``transport-schema`` makes of its inputs (exploration items 8, 9, 11): one file named twice
is compiled once, two schemas of one name are refused with the case hint only when the names
differ in case, a type takes ASCII digits and no stray spaces, and an [env] whose derived
STEP_MULTI body is too big says so in words of seats."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from transport.errors import SchemaError
from transport.schema import compile_schema
from transport.tools.schema_cli import main

from .servers import ROOT

GRIDWORLD = (ROOT / "schema" / "gridworld.toml").read_text()


def named(name: str) -> str:
    text = GRIDWORLD.replace('name = "gridworld"', f'name = "{name}"', 1)
    assert text != GRIDWORLD
    return text


def compile_cli(tmp_path: Path, *files: Path | str) -> int:
    out = ["--python-out", str(tmp_path / "py"), "--ts-out", str(tmp_path / "ts")]
    return main(["compile", *map(str, files), *out])


def test_one_file_named_twice_is_compiled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "v1.toml").write_text(named("myenv"))
    monkeypatch.chdir(tmp_path)
    assert compile_cli(tmp_path, "s/v1.toml", "./s/v1.toml", "s/../s/v1.toml") == 0
    assert sorted(p.name for p in (tmp_path / "py").iterdir()) == ["__init__.py", "myenv.py"]


def test_two_schemas_of_one_name_are_refused_without_a_case_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for file in ("v1", "v2"):
        (tmp_path / f"{file}.toml").write_text(named("myenv"))
    assert compile_cli(tmp_path, tmp_path / "v1.toml", tmp_path / "v2.toml") != 0
    err = capsys.readouterr().err
    assert f"v2.toml: schema name 'myenv' is also used by {tmp_path / 'v1.toml'}" in err
    assert "give one of them another [schema] name" in err
    assert "case" not in err


def test_names_that_differ_in_case_only_get_the_case_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.toml").write_text(named("myenv"))
    (tmp_path / "b.toml").write_text(named("MyEnv"))
    assert compile_cli(tmp_path, tmp_path / "a.toml", tmp_path / "b.toml") != 0
    assert "schema names may not differ in case only" in capsys.readouterr().err


def test_a_copy_of_a_file_is_another_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(ROOT / "schema" / "gridworld.toml", tmp_path / "copy.toml")
    assert compile_cli(tmp_path, ROOT / "schema" / "gridworld.toml", tmp_path / "copy.toml") != 0
    assert "schema name 'gridworld' is also used by" in capsys.readouterr().err


ONE_FIELD = '[schema]\nname = "t"\n[structs.S]\nfields = [{{ name = "x", type = "{}" }}]\n'


@pytest.mark.parametrize(
    "type_text", ["f32[\u0668]", "f32[\uff18]", "f32[\u09ee]", " f64", "f64 ", "f32 [8]"]
)
def test_a_type_takes_ascii_digits_and_no_stray_spaces(type_text: str) -> None:
    with pytest.raises(SchemaError, match=r"cannot parse type .*ASCII digits, no spaces around"):
        compile_schema(ONE_FIELD.format(type_text), "t.toml")


def test_spaces_inside_the_brackets_stay_normalised() -> None:
    assert compile_schema(ONE_FIELD.format("u8[ 3 , 2 ]")).structs["S"].field("x").type == "u8[3,2]"
    assert compile_schema(ONE_FIELD.format("f32[8]")).structs["S"].field("x").count == 8


def test_a_derived_step_multi_body_too_big_is_told_in_seats() -> None:
    text = GRIDWORLD.replace('type = "f32[2,5,5]"', 'type = "f32[20000000]"', 1)
    assert text != GRIDWORLD
    with pytest.raises(SchemaError) as caught:
        compile_schema(text, "big.toml")
    message = str(caught.value)
    assert message.startswith("big.toml: struct StepMultiResult: the derived STEP_MULTI body"), (
        message
    )
    assert "[env] seats x StepResult of 80000096 bytes: 8 x 80000096 = 640000768 bytes" in message
    assert "over the 268435456-byte limit of a struct: set [env] seats to at most 3" in message
    # with seats that fit, it compiles
    fits = text.replace("[env]\n", "[env]\nseats = 3\n", 1)
    assert compile_schema(fits, "big.toml").env is not None
