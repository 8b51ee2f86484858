"""Hostile schemas (issue 17 item 4): every one is refused by ``inspect`` and ``compile`` alike
with one line naming the file, the item and the rule, exit status 2, and no traceback."""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from transport.errors import SchemaError
from transport.schema import compile_schema
from transport.schema.emit_python import emit_python
from transport.schema.rules import check_field_name, check_member_name, check_type_name
from transport.tools.schema_cli import main

from .generated_typescript import TSC, tsc_strict


def _schema(struct: str = "Foo", field: str = "x", typ: str = "u32", extra: str = "") -> str:
    return (
        '[schema]\nname = "hostile"\n\n'
        f'[structs."{struct}"]\nfields = [{{ name = "{field}", type = "{typ}" }}]\n{extra}'
    )


def _deep(depth: int) -> str:
    parts = ['[schema]\nname = "deep"\n']
    for i in range(depth):
        parts.append(f'[structs.S{i}]\nfields = [{{ name = "x", type = "S{i + 1}" }}]\n')
    parts.append(f'[structs.S{depth}]\nfields = [{{ name = "x", type = "u8" }}]\n')
    return "\n".join(parts)


_ENV = """[schema]
name = "hostile"
[structs.StepRequest]
fields = [{{ name = "action", type = "u8", role = "action" }}]
[structs.StepResult]
fields = [{{ name = "x", type = "u8" }}]
[env]
shm = "{shm}"
"""

_PROTOCOL = (Path(__file__).resolve().parents[1] / "schema" / "protocol.toml").read_text(
    encoding="utf-8"
)

CASES: list[tuple[str, str | bytes, str]] = [
    ("non-utf8", b'[schema]\nname = "h\xff"\n', "not UTF-8"),
    ("bad-toml", "[schema\nname=", "invalid TOML"),
    ("deep-toml", "a = " + "[" * 5000 + "]" * 5000, "invalid TOML"),
    ("5000-digit-count", _schema(typ="u8[" + "9" * 5000 + "]"), "more than 10 digits"),
    ("count-2^31", _schema(typ="u8[2147483648]"), "array count must be at most"),
    ("product-2^31", _schema(typ="u8[65536,65536]"), "elements (at most"),
    ("size-cap", _schema(typ="u8[1000000000]"), "holds at most"),
    (
        "offset-2^31",
        _schema(extra="").replace('type = "u32"', 'type = "u32", offset = 2147483648'),
        "offset must be 0..2147483647",
    ),
    (
        "offset-huge",
        _schema().replace('type = "u32"', 'type = "u32", offset = 9999999999999999'),
        "offset must be",
    ),
    ("size-2^31", _schema(extra="size = 4294967296\n"), "size must be at most"),
    (
        "version-huge",
        _schema().replace("[schema]\n", "[schema]\nversion = 9999999999999\n"),
        "version",
    ),
    ("deep-nesting", _deep(400), "nest more than"),
    ("long-struct", _schema(struct="S" * 5000), "characters long"),
    ("long-schema", _schema().replace('"hostile"', '"' + "h" * 300 + '"'), "characters long"),
    ("name-newline", _schema(struct="Foo\\n"), "invalid name"),
    ("field-newline", _schema(field="x\\n"), "invalid name"),
    ("schema-newline", _schema().replace('"hostile"', '"hostile\\n"'), "invalid name"),
    ("struct-None", _schema(struct="None"), "Python keyword"),
    ("struct-class", _schema(struct="class"), "Python keyword"),
    ("struct-match", _schema(struct="match"), "Python keyword"),
    ("struct-IR", _schema(struct="IR"), "generated modules"),
    ("struct-SCHEMA", _schema(struct="SCHEMA"), "generated modules"),
    ("struct-MsgType", _schema(struct="MsgType"), "generated modules"),
    ("struct-Final", _schema(struct="Final"), "generated modules"),
    ("struct-DataView", _schema(struct="DataView"), "generated modules"),
    ("struct-frozenset", _schema(struct="frozenset"), "builtin"),
    ("struct-interface", _schema(struct="interface"), "TypeScript reserved"),
    ("struct-enum-ts", _schema(struct="enum"), "TypeScript reserved"),
    ("field-constructor", _schema(field="constructor"), "Object.prototype"),
    ("field-proto", _schema(field="__proto__"), "Object.prototype"),
    ("field-toString", _schema(field="toString"), "Object.prototype"),
    ("struct-dunder", _schema(struct="__Foo"), "may not start with __"),
    (
        "clash-FooCodec",
        _schema(extra='[structs.FooCodec]\nfields = [{ name = "y", type = "u8" }]\n'),
        "clashes with the generated name FooCodec",
    ),
    (
        "clash-FooView",
        _schema(extra='[structs.FooView]\nfields = [{ name = "y", type = "u8" }]\n'),
        "clashes with the generated name FooView",
    ),
    (
        "clash-FooInput-enum",
        _schema(extra='[enums.FooInput]\ntype = "u8"\nvalues = { A = 0 }\n'),
        "clashes with the generated name FooInput",
    ),
    (
        "enum-value-None",
        _schema(extra='[enums.E]\ntype = "u8"\nvalues = { None = 0 }\n'),
        "Python keyword",
    ),
    (
        "enum-value-sunder",
        _schema(extra='[enums.E]\ntype = "u8"\nvalues = { _missing_ = 0 }\n'),
        "may not start with _",
    ),
    (
        "enum-value-proto",
        _schema(extra='[enums.E]\ntype = "u8"\nvalues = { constructor = 0 }\n'),
        "Object.prototype",
    ),
    ("message-class", _schema(extra='[messages.class]\nid = 1\nbody = "Foo"\n'), "Python keyword"),
    ("schema-index", _schema().replace('"hostile"', '"index"'), "reserved for a file"),
    ("schema-init", _schema().replace('"hostile"', '"__init__"'), "may not start with __"),
    ("schema-protocol", _schema().replace('"hostile"', '"protocol"'), "reserved for a file"),
    ("schema-Index", _schema().replace('"hostile"', '"Index"'), "reserved for a file"),
    ("schema-SCHEMAS", _schema().replace('"hostile"', '"SCHEMAS"'), "TypeScript reserved"),
    ("profile-self", _ENV.format(shm="hostile"), "is an env schema, not a layout profile"),
    ("profile-long", _ENV.format(shm="p" * 300), "characters long"),
    ("profile-newline", _ENV.format(shm="pac_shm\\n"), "must name a layout profile"),
    ("message-mro", _schema(extra='[messages.mro]\nid = 1\nbody = "Foo"\n'), "Python enum"),
    ("errors-outside-envelope", _schema(extra='[errors]\n[http]\n"step\\n" = "Foo"\n'), "[errors]"),
    (
        "http-method-newline",
        _PROTOCOL.replace("[http]\n", '[http]\n"step\\n" = "Hello"\n'),
        "a method is lower_case",
    ),
    (
        "errors-key-newline",
        _PROTOCOL.replace("[errors]\n", '[errors]\n"X\\n" = { http = 400 }\n'),
        "not a value of enum ErrorCode",
    ),
    (
        "env-message-newline",
        _ENV.format(shm="x").replace('shm = "x"', "") + '[messages."Foo\\n"]\nid = 200\n',
        "invalid name",
    ),
    ("struct-u8", _schema(struct="u8"), "scalar type"),
    ("enum-f32", _schema(extra='[enums.f32]\ntype = "u8"\nvalues = { A = 0 }\n'), "scalar type"),
    ("schema-def", _schema().replace('"hostile"', '"def"'), "Python keyword"),
]


@pytest.mark.parametrize(
    ("source", "rule"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_refused_by_inspect_and_compile(
    source: str | bytes, rule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hostile.toml"
    if isinstance(source, bytes):
        path.write_bytes(source)
    else:
        path.write_text(source, encoding="utf-8")
    out = tmp_path / "out"
    runs = (
        ["inspect", str(path)],
        ["compile", str(path), "--python-out", str(out / "py"), "--ts-out", str(out / "ts")],
    )
    for argv in runs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        lines = err.splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"transport-schema: error: {path}: "), err
        assert rule in lines[0], err
        assert "Traceback" not in err
    assert not out.exists()  # compile wrote nothing


def test_unreadable_and_long_file_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in (tmp_path / "missing.toml", tmp_path / ("x" * 5000 + ".toml"), tmp_path):
        for argv in (["inspect", str(path)], ["compile", str(path), "--python-out", str(tmp_path)]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert len(err.splitlines()) == 1 and "cannot read schema" in err, err


def test_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(_schema(), encoding="utf-8")
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    argv = ["compile", str(path), "--python-out", str(blocker / "py"), "--ts-out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err


_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789"
_NEAR_MISSES = (
    "Type String_ Class None_ toJSON then length prototype name value fields path dv at rt_ "
    "self cls default_ undefined_ Infinity_ Input View Codec Layout Obj Foo FooView2 ir_ IR_ "
    "Schema_ SCHEMA_ MsgType_ Final_ Any_ toString_ constructor_ proto_ hasOwnProperty2 E e _x "
    "x_ a1 Z9 readAt writeAt viewAt checkAt validateAt size message MessageId_ Values"
).split()
"""Names near the rules' edges: the ones the rules accept must give working code."""


def _random_name(rng: random.Random, check: Callable[[str], str | None]) -> str:
    while True:
        if rng.random() < 0.5:
            name = rng.choice(_NEAR_MISSES)
        else:
            first = rng.choice(_ALPHABET[:53])
            name = first + "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 12)))
        if check(name) is None:
            return name


def _random_schema(rng: random.Random, seed: int) -> str:
    outer, inner, enum = (_random_name(rng, check_type_name) for _ in range(3))
    fields = list(dict.fromkeys(_random_name(rng, check_field_name) for _ in range(5)))
    values = list(dict.fromkeys(_random_name(rng, check_member_name) for _ in range(3)))
    message = _random_name(rng, check_member_name)
    text = f'[schema]\nname = "fuzz{seed}"\n\n[enums.{enum}]\ntype = "u8"\nvalues = {{ '
    text += ", ".join(f"{v} = {i}" for i, v in enumerate(values)) + " }\n\n"
    types = ["u32", enum, "f32[3]", "bool", "i16[2,3]"]
    text += f"[structs.{inner}]\nfields = [\n"
    text += "".join(
        f'  {{ name = "{f}", type = "{t}" }},\n' for f, t in zip(fields, types, strict=False)
    )
    text += "]\n\n"
    text += f'[structs.{outer}]\nfields = [{{ name = "{fields[0]}", type = "{inner}[2]" }}]\n'
    text += f'\n[messages.{message}]\nid = 7\nbody = "{outer}"\n'
    return text


def _valid_random_schema(seed: int) -> str:
    """A random schema of names the rules accept (drawn again while the compiler refuses the
    combination, e.g. two structs with one name)."""
    rng = random.Random(seed)
    while True:
        text = _random_schema(rng, seed)
        try:
            compile_schema(text, f"fuzz{seed}.toml")
        except SchemaError:
            continue
        return text


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_valid_names_import(seed: int, tmp_path: Path) -> None:
    ir = compile_schema(_valid_random_schema(seed), f"fuzz{seed}.toml")
    module = tmp_path / f"fuzz{seed}.py"
    module.write_text(emit_python(ir), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"fuzz{seed}", module)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    assert mod.FINGERPRINT_HEX == ir.fingerprint_hex


@pytest.mark.skipif(not TSC.exists(), reason="node_bridge not set up (./dev setup)")
def test_random_valid_names_pass_tsc_strict(tmp_path: Path) -> None:
    """The TypeScript the same random schemas give type-checks under the project's --strict."""
    irs = [compile_schema(_valid_random_schema(seed), f"fuzz{seed}.toml") for seed in SEEDS]
    assert tsc_strict(tmp_path, irs, timeout=120) == ""


def test_stray_typescript_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """index.ts lists every module in --ts-out: a file there that cannot be one is refused."""
    path = tmp_path / "ok.toml"
    path.write_text(_schema(), encoding="utf-8")
    ts_out = tmp_path / "ts"
    ts_out.mkdir()
    (ts_out / "not-a-name.ts").write_text("", encoding="utf-8")
    argv = ["compile", str(path), "--python-out", str(tmp_path / "py"), "--ts-out", str(ts_out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "not-a-name.ts" in err, err


def test_schema_names_differing_in_case_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``Foo`` and ``foo`` would be one file on a case-insensitive file system."""
    paths = []
    for name in ("hostile", "Hostile"):
        path = tmp_path / f"{name}.toml"
        path.write_text(_schema().replace('"hostile"', f'"{name}"'), encoding="utf-8")
        paths.append(str(path))
    argv = ["compile", *paths, "--python-out", str(tmp_path / "py"), "--ts-out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "differ in case only" in err, err


@pytest.mark.parametrize("case", ["non-utf8", "5000-digit-count", "deep-nesting", "deep-toml"])
def test_the_command_shows_no_traceback(case: str, tmp_path: Path) -> None:
    """The installed command, as a user runs it: one line on stderr, exit 2."""
    source = next(c[1] for c in CASES if c[0] == case)
    path = tmp_path / "hostile.toml"
    if isinstance(source, bytes):
        path.write_bytes(source)
    else:
        path.write_text(source, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "transport.tools.schema_cli", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
