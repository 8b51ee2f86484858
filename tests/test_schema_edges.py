"""Edges of user-written schemas (issue 34): big u64 arrays given as lists, u64 enums in the
conformance suite, TypeScript type words as struct names, enum actions, 63+ dimensions, struct
observations, float bounds and actions beyond f32, enum values past 2**53, StepView attribute
names and the generated module's header."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import transport
from transport import ActionError
from transport.errors import SchemaError, ValueRangeError
from transport.schema import compile_schema
from transport.schema.emit_python import emit_python
from transport.schema.ir import INTEGER_RANGES
from transport.schema.rules import STEP_VIEW_NAMES
from transport.step_view import StepView

from .generated_typescript import TSC, tsc_strict
from .servers import LANGS, ServerProcess, require_lang, unique_url

ROOT = Path(__file__).resolve().parents[1]


def _env_schema(name: str, result: str, request: str, extra: str = "") -> str:
    return (
        f'[schema]\nname = "{name}"\nlayout = "natural"\n[env]\n{extra}\n'
        f"[structs.StepResult]\nfields = [{result}]\n"
        f"[structs.StepRequest]\nfields = [{request}]\n"
    )


_RESULT = (
    '{ name = "reward", type = "f32", role = "reward" }, '
    '{ name = "done", type = "bool", role = "done" }, '
    '{ name = "obs", type = "f32[4]", role = "observation" }'
)
_ACTION = '{ name = "a", type = "u8", role = "action" }'


def _refusal(text: str) -> str:
    with pytest.raises(SchemaError) as info:
        compile_schema(text, "edge.toml")
    message = str(info.value)
    assert "\n" not in message
    return message


# -- 1: u64 / i64 multi-dimensional arrays given as lists ------------------------------------

_MD = """
[schema]
name = "u64md"
[structs.S]
fields = [
  { name = "flat", type = "u64[4]" },
  { name = "md", type = "u64[2,2]" },
  { name = "imd", type = "i64[2,2]" },
]
"""


@pytest.mark.parametrize("nested", [True, False])
def test_big_u64_and_i64_lists_of_a_multidimensional_field_keep_every_bit(nested: bool) -> None:
    codec = transport.Schema(compile_schema(_MD, "u64md.toml"))["S"]
    big = 2**64 - 13
    md = [[big, 5], [big - 1, 2**53 + 1]]
    imd = [[-(2**63), 2**63 - 1], [-(2**53) - 1, 1]]
    values = {
        "flat": [big] * 4,
        "md": md if nested else [v for row in md for v in row],
        "imd": imd if nested else [v for row in imd for v in row],
    }
    got = codec.decode(codec.encode(values), 0)
    assert got["md"].tolist() == md
    assert got["imd"].tolist() == imd
    assert got["flat"].tolist() == [big] * 4


@pytest.mark.parametrize("elem", sorted(INTEGER_RANGES))
@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("end", ["low", "high"])
def test_integers_beyond_the_type_in_lists_are_out_of_range(
    elem: str, nested: bool, end: str
) -> None:
    text = f'[schema]\nname = "r"\n[structs.S]\nfields = [{{ name = "m", type = "{elem}[2,2]" }}]\n'
    codec = transport.Schema(compile_schema(text, "r.toml"))["S"]
    lo, hi = INTEGER_RANGES[elem]
    bad = lo - 1 if end == "low" else hi + 1
    rows = [[1, 0], [bad, 1]]
    value = rows if nested else [v for row in rows for v in row]
    with pytest.raises(ValueRangeError) as info:
        codec.encode({"m": value})
    assert info.value.code == "out_of_range"
    assert info.value.field == "m[2]"


# -- 2: the conformance suite on a u64 enum ----------------------------------------------


def test_conformance_runs_on_a_u64_enum(tmp_path: Path) -> None:
    path = tmp_path / "e64.toml"
    path.write_text(
        '[schema]\nname = "e64"\nversion = 1\n[enums.Huge]\ntype = "u64"\n'
        "values = { A = 0, B = 5 }\n"
        '[structs.S]\nfields = [ { name = "h", type = "Huge" } ]\n',
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "transport.tools.conformance_cli", "--count", "5", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert "e64          invalid" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0, result.stdout + result.stderr


# -- 3: TypeScript type-position words as struct names ------------------------------------

_ALLOWED_CONTEXTUAL = ["satisfies", "abstract", "accessor", "out", "override", "intrinsic", "using"]


def _struct_named(name: str) -> str:
    return (
        f'[schema]\nname = "s_{name}"\n[structs.{name}]\nfields = [{{ name = "x", type = "u8" }}]\n'
        f'[structs.W]\nfields = [{{ name = "y", type = "{name}[2]" }}, '
        f'{{ name = "z", type = "{name}" }}]\n'
    )


def test_a_struct_named_unique_is_refused() -> None:
    message = _refusal(_struct_named("unique"))
    assert message == "edge.toml: struct unique: 'unique' is a TypeScript reserved word"


@pytest.mark.skipif(not TSC.exists(), reason="node_bridge not set up (./dev setup)")
def test_contextual_words_left_allowed_pass_tsc_strict(tmp_path: Path) -> None:
    """The words tsc --strict takes as struct names stay allowed (only those that break are
    reserved)."""
    irs = [compile_schema(_struct_named(word), f"s_{word}.toml") for word in _ALLOWED_CONTEXTUAL]
    assert tsc_strict(tmp_path, irs) == ""


# -- 4, 5, 6, 7, 8, 9: the compiler's refusals ----------------------------------------------


def test_an_enum_action_is_refused() -> None:
    text = _env_schema(
        "r4",
        _RESULT,
        '{ name = "a", type = "E", role = "action" }',
        '[enums.E]\ntype = "i8"\nvalues = { A = -3, B = 5 }\n',
    )
    assert _refusal(text) == (
        "edge.toml: struct StepRequest, field a: the action cannot be an enum (E): declare its "
        "integer type (i8) instead"
    )


@pytest.mark.parametrize("dims", [64, 65])
def test_more_than_63_dimensions_are_refused(dims: int) -> None:
    shape = ",".join(["1"] * dims)
    result = _RESULT.replace('"f32[4]"', f'"u8[{shape}]"')
    assert _refusal(_env_schema("d", result, _ACTION)) == (
        f"edge.toml: struct StepResult, field obs: array has {dims} dimensions (at most 63)"
    )


def test_an_action_of_63_dimensions_is_refused_by_name() -> None:
    shape = ",".join(["1"] * 63)
    action = f'{{ name = "a", type = "f32[{shape}]", role = "action" }}'
    assert _refusal(_env_schema("a63", _RESULT, action)) == (
        "edge.toml: struct StepRequest, field a: an action array has at most 62 dimensions (the "
        "multi-seat request adds one), not 63"
    )


@pytest.mark.parametrize("lang", LANGS)
def test_63_dimensions_serve_two_envs(lang: str, tmp_path: Path) -> None:
    """The limit is the largest that works end to end: a 63-dim observation and a 62-dim
    action, two envs, reset and step."""
    require_lang(lang)
    obs = ",".join(["1"] * 63)
    act = ",".join(["1"] * 62)
    path = tmp_path / "d63.toml"
    path.write_text(
        _env_schema(
            "d63",
            _RESULT.replace('"f32[4]"', f'"u8[{obs}]"'),
            f'{{ name = "a", type = "f32[{act}]", role = "action" }}',
        ),
        encoding="utf-8",
    )
    with (
        ServerProcess(
            unique_url("unix"), env="contract", lang=lang, num_envs=2, extra=["--schema", str(path)]
        ) as server,
        transport.connect(server.url, timeout=20) as client,
    ):
        assert client.reset(seed=1).obs.shape == (2,) + (1,) * 63
        got = client.step(np.zeros((2,) + (1,) * 62, dtype=np.float32))
        assert got.obs.shape == (2,) + (1,) * 63


def test_a_struct_observation_is_refused() -> None:
    result = _RESULT.replace('type = "f32[4]"', 'type = "In"')
    inner = '[structs.In]\nfields = [{ name = "q", type = "u8" }]'
    text = _env_schema("r11", result, _ACTION, inner)
    assert _refusal(text) == (
        "edge.toml: struct StepResult, field obs: role 'observation' takes a scalar type or an "
        "array of one, not the struct In: put its fields in StepResult, each with role "
        "'observation' (a gymnasium Dict space)"
    )


@pytest.mark.parametrize(
    ("field", "shown"),
    [
        ('type = "f32[2]", low = -1e39', "low -1e+39 does not fit f32"),
        ('type = "f32[2]", high = [1.0, 3.5e38]', "high 3.5e+38 does not fit f32"),
        ('type = "f64[2]", high = 10000000000000000000', None),  # fits f64
        ('type = "f32[2]", low = -3.4028234663852886e38', None),  # the f32 minimum itself
    ],
)
def test_float_bounds_must_fit_the_field(field: str, shown: str | None) -> None:
    text = _env_schema("b", _RESULT, f'{{ name = "a", {field}, role = "action" }}')
    if shown is None:
        compile_schema(text, "edge.toml")
        return
    assert f"struct StepRequest, field a: {shown} (finite values of magnitude" in _refusal(text)


def test_an_enum_value_past_2_53_names_javascripts_limit() -> None:
    text = (
        '[schema]\nname = "e"\n[enums.H]\ntype = "u64"\n'
        "values = { A = 0, B = 18446744073709551615 }\n"
        '[structs.S]\nfields = [ { name = "h", type = "H" } ]\n'
    )
    message = _refusal(text)
    assert "does not fit" not in message
    assert "beyond JavaScript's safe integers" in message


def test_step_view_names_are_its_attributes() -> None:
    """The names the compiler refuses are exactly the StepView's own (non-dunder) attributes."""
    assert {n for n in dir(StepView) if not n.startswith("__")} == STEP_VIEW_NAMES


@pytest.mark.parametrize("name", sorted(STEP_VIEW_NAMES))
def test_step_view_attribute_names_are_refused_in_the_result(name: str) -> None:
    result = _RESULT + f', {{ name = "{name}", type = "u8" }}'
    assert _refusal(_env_schema("sv", result, _ACTION)) == (
        f"edge.toml: struct StepResult, field {name}: {name!r} is an attribute of the client's "
        "step result (StepView): rename the field of the [env] result struct"
    )
    # outside the [env] result struct the name is free
    request = _ACTION + f', {{ name = "{name}", type = "u8" }}'
    compile_schema(_env_schema("sv", _RESULT, request), "edge.toml")


# -- 7: the client refuses a value its f32 action field cannot hold -----------------------


@pytest.mark.parametrize("lang", LANGS)
def test_a_box_action_beyond_f32_is_an_action_error(lang: str) -> None:
    with (
        ServerProcess(unique_url("unix"), env="reach", lang=lang) as server,
        transport.connect(server.url, timeout=20) as client,
    ):
        client.reset(seed=1)
        for given, value in (([-3.5e38, 0.0], "-3.5e+38"), (np.array([0.0, 1e39]), "1e+39")):
            with pytest.raises(ActionError) as info:
                client.step(given)
            text = str(info.value)
            range_text = "-3.4028234663852886e+38..3.4028234663852886e+38"
            assert f"{value} is outside {range_text}" in text, text
            assert "the f32 action field cannot hold it" in text
        # a value that rounds to the largest f32 is sent (the server judges it against the
        # Box, as the Node client does: Math.fround)
        with pytest.raises(transport.RemoteError) as judged:
            client.step([3.4028235e38, 0.0])
        assert "cannot hold it" not in str(judged.value)
        # the client still works, and in-range float64 and float32 actions step
        client.step(np.array([0.5, -0.25]))
        client.step(np.array([0.5, -0.25], dtype=np.float32))
        client.step([1.0, -1.0])


# -- 10: the generated module names the file it came from ---------------------------------


def test_generated_python_names_its_schema_file(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.toml"
    path.write_text(
        '[schema]\nname = "s_np"\n[structs.S]\nfields = [{ name = "x", type = "u8" }]\n',
        encoding="utf-8",
    )
    text = emit_python(transport.load_schema(path).ir)
    assert "\nfrom elsewhere.toml. Do not edit" in text
    assert "schema/s_np.toml" not in text
    ours = emit_python(transport.load_schema(ROOT / "schema" / "gridworld.toml").ir)
    assert "\nfrom schema/gridworld.toml. Do not edit" in ours
