"""transport-schema: inspect a schema's layout and compile it to Python and TypeScript."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from transport.errors import SchemaError
from transport.schema import SchemaIR, load_schema
from transport.schema.diagram import shm_diagram
from transport.schema.emit_python import emit_python, emit_python_package_init
from transport.schema.emit_typescript import (
    emit_typescript,
    emit_typescript_index,
    runtime_import_for,
)
from transport.schema.rules import check_schema_name
from transport.tools import quiet_on_broken_pipe
from transport.tools.cli_args import ArgumentParser

_DESCRIPTION = """\
Inspect and compile declarative transport schemas (TOML; see docs/schema.md).

  transport-schema inspect schema/pac_env.toml           human-readable layout table
  transport-schema inspect schema/pac_env.toml --json    the layout IR as JSON
  transport-schema compile schema/*.toml                 regenerate Python and TypeScript
  transport-schema compile schema/*.toml --check         exit 1 if generated code is stale
  transport-schema from-gym CartPole-v1                  the schema of a gymnasium env's spaces
  transport-schema from-gym CartPole-v1 --json           ... as the layout IR (JSON)

Exit status: 0 on success, 1 on stale generated code (--check), 2 on an invalid schema, an
unwritable output, an output file it did not generate (never overwritten) or a usage error
(one line on stderr, never a traceback). compile writes every file or none.
"""

DEFAULT_PYTHON_OUT = Path("transport/generated")
DEFAULT_TS_OUT = Path("node_bridge/src/generated")


@quiet_on_broken_pipe
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="transport-schema",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = sub.add_parser(
        "inspect",
        help="print a schema's layout (sizes, offsets, fingerprint)",
        description="Print the validated layout of a schema: every struct's size and alignment, "
        "every field's offset, size, count and role, the enums, the messages and the 64-bit "
        "fingerprint (16 hex digits).",
    )
    inspect.add_argument("file", type=Path, help="schema file (TOML)")
    inspect.add_argument("--json", action="store_true", help="print the layout IR as JSON")

    compile_ = sub.add_parser(
        "compile",
        help="emit the Python and TypeScript modules of schemas",
        description="Compile schemas to a Python module (NumPy codecs) and a TypeScript module "
        "(DataView codecs) each, named after the schema. The TypeScript index.ts lists every "
        "module in the TypeScript output directory. Every file is written, or none (a failure "
        "leaves the folders as they were); a file there that transport-schema did not "
        "generate (a hand-written __init__.py or index.ts) is never overwritten.",
    )
    # the files are checked by the loader (load_schema): a FIFO, a device or an oversized file
    # is refused before anything is read, in the words of every other schema error
    compile_.add_argument("files", type=Path, nargs="+", help="schema files (TOML)")
    compile_.add_argument(
        "--python-out",
        type=Path,
        default=DEFAULT_PYTHON_OUT,
        help="directory of the Python modules (default: %(default)s)",
    )
    compile_.add_argument(
        "--ts-out",
        type=Path,
        default=DEFAULT_TS_OUT,
        help="directory of the TypeScript modules (default: %(default)s)",
    )
    compile_.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and list the files that differ from what would be written",
    )
    compile_.add_argument("--json", action="store_true", help="print the result as JSON")

    from_gym = sub.add_parser(
        "from-gym",
        help="print the schema (TOML) derived from a gymnasium env's spaces",
        description="Print the env schema transport-serve --gym ENV_ID serves: derived from "
        "the env's observation_space and action_space (the same spaces give the same text and "
        "fingerprint), to commit and implement the same env elsewhere (TypeScript).",
    )
    from_gym.add_argument("env_id", help="a gymnasium env id (gymnasium.make)")
    from_gym.add_argument(
        "--gym-kwargs", default=None, metavar="JSON", help="keyword arguments of gymnasium.make"
    )
    from_gym.add_argument(
        "--shm-layout",
        choices=("slots", "columns"),
        default="slots",
        help="the shm region's layout: per-env slots (default) or columns (docs/shm.md)",
    )
    from_gym.add_argument(
        "--json",
        action="store_true",
        help="print the layout IR as JSON (what inspect --json prints of the TOML; the Node "
        "server loads it as --schema)",
    )

    args = parser.parse_args(argv)
    if args.command == "from-gym":
        return _from_gym(parser, args.env_id, args.gym_kwargs, args.shm_layout, args.json)
    try:
        if args.command == "inspect":
            return _inspect(args.file, args.json)
        return _compile(args.files, args.python_out, args.ts_out, args.check, args.json)
    except SchemaError as exc:
        print(f"transport-schema: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # quiet_on_broken_pipe: the exit status a shell gives `cat`
    except OSError as exc:  # an unwritable output directory or file
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"transport-schema: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


def _from_gym(
    parser: argparse.ArgumentParser,
    env_id: str,
    kwargs_text: str | None,
    shm_layout: str,
    as_json: bool,
) -> int:
    """Print the derived schema of a gymnasium env, as TOML or as the IR's JSON (one line on
    stderr, exit 2, when the env cannot be made or a space cannot be carried)."""
    kwargs: object = {}
    if kwargs_text is not None:
        try:
            kwargs = json.loads(kwargs_text)
        except ValueError as exc:
            parser.error(f"--gym-kwargs is not JSON: {exc}")
        if not isinstance(kwargs, dict):
            parser.error(f"--gym-kwargs must be a JSON object, not {kwargs_text!r}")
    try:
        from transport.gym_serve import gym_schema, gym_schema_toml
    except ImportError as exc:
        print(f"transport-schema: error: from-gym needs gymnasium ({exc})", file=sys.stderr)
        return 2
    if os.getcwd() not in sys.path:  # an id "module:Env-v0" imports module from here
        sys.path.insert(0, os.getcwd())
    try:
        if as_json:
            ir = gym_schema(env_id, kwargs, shm_layout).ir  # type: ignore[arg-type]
            text = json.dumps(ir.to_json(), indent=2) + "\n"
        else:
            text = gym_schema_toml(env_id, kwargs, shm_layout)  # type: ignore[arg-type]
    except SchemaError as exc:
        print(f"transport-schema: error: {env_id}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # gymnasium.make: an unknown id, bad kwargs
        text = " ".join(str(exc).split())
        print(f"transport-schema: error: {env_id}: {type(exc).__name__}: {text}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _inspect(file: Path, as_json: bool) -> int:
    ir = load_schema(file)
    if as_json:
        print(json.dumps(ir.to_json(), indent=2))
        return 0
    print(f"schema {ir.name} version {ir.version}  fingerprint {ir.fingerprint_hex}")
    for struct in ir.structs.values():
        print(f"\nstruct {struct.name}  size {struct.size}  align {struct.align}  {struct.layout}")
        print(f"  {'offset':>7} {'size':>6}  {'field':<20} {'type':<16} role")
        end = 0
        for f in struct.fields:
            if f.offset > end:
                print(f"  {end:>7} {f.offset - end:>6}  {'(padding)':<20}")
            print(f"  {f.offset:>7} {f.size:>6}  {f.name:<20} {f.type:<16} {f.role or ''}")
            end = f.offset + f.size
        if struct.size > end:
            print(f"  {end:>7} {struct.size - end:>6}  {'(padding)':<20}")
    for enum in ir.enums.values():
        values = ", ".join(f"{k}={v}" for k, v in enum.values.items())
        print(f"\nenum {enum.name}: {enum.type}  {values}")
    if ir.messages:
        print("\nmessages")
        for m in ir.messages.values():
            tail = f" + {m.tail} tail" if m.tail else ""
            print(f"  0x{m.id:02X} {m.name:<18} {m.body or '(empty)'}{tail}")
    if ir.env is not None:
        env = ir.env
        print(
            f"\nenv: result {env.result}, request {env.request}, {env.seats} seats "
            f"(multi: {env.multi_request}, {env.multi_result})"
        )
    if ir.shm is not None:
        print()
        print("\n".join(shm_diagram(ir)))
    return 0


def compile_command(files: list[Path], python_out: Path, ts_out: Path) -> str:
    """The command that rewrites what ``--check`` found stale: the same files and output
    folders (a default folder is left out), shell-quoted."""
    words = ["transport-schema", "compile", *(str(f) for f in files)]
    if python_out != DEFAULT_PYTHON_OUT:
        words += ["--python-out", str(python_out)]
    if ts_out != DEFAULT_TS_OUT:
        words += ["--ts-out", str(ts_out)]
    return shlex.join(words)


def generated_files(schemas: list[SchemaIR], python_out: Path, ts_out: Path) -> dict[Path, str]:
    """Every file ``compile`` writes, with its content."""
    out: dict[Path, str] = {python_out / "__init__.py": emit_python_package_init()}
    runtime = runtime_import_for(ts_out)  # the package by name outside node_bridge itself
    for ir in schemas:
        out[python_out / f"{ir.name}.py"] = emit_python(ir)
        out[ts_out / f"{ir.name}.ts"] = emit_typescript(ir, runtime)
    names = {ir.name for ir in schemas}
    if ts_out.is_dir():
        for path in sorted(ts_out.glob("*.ts")):
            if path.name == "index.ts" or path.stem in names:
                continue
            if check_schema_name(path.stem, envelope=path.stem == "protocol") is not None:
                raise SchemaError(
                    "index.ts would list every module here, and this file's name cannot be "
                    "a schema module's: move it out of the generated folder",
                    file=str(path),
                )
            names.add(path.stem)
    out[ts_out / "index.ts"] = emit_typescript_index(sorted(names), runtime)
    return out


GENERATED_MARK = "transport-schema compile"
"""What the first line of every file ``compile`` writes says; a file without it is not ours."""


def is_generated(path: Path) -> bool:
    """Whether the file at ``path`` was written by ``compile`` (its first line names the tool)."""
    try:
        with path.open("rb") as file:
            first = file.readline(512)
    except OSError:
        return False
    return GENERATED_MARK.encode() in first


SHARED_FILES = ("__init__.py", "index.ts")
"""The files of an output folder that are not named after a schema: a user's package may have
its own (a hand-written ``__init__.py``), so one without the generated mark is never replaced.
A schema's own module (``NAME.py``, ``NAME.ts``) is the compiler's to rewrite."""


def _refuse_foreign(files_out: dict[Path, str]) -> None:
    """Refuse, before writing anything, to replace a shared file ``compile`` did not generate."""
    for path in files_out:
        if path.name not in SHARED_FILES:
            continue
        if (path.exists() or path.is_symlink()) and not (path.is_file() and is_generated(path)):
            raise SchemaError(
                "exists and was not generated by transport-schema compile: refusing to "
                "overwrite it (move it away, or choose another output folder)",
                file=str(path),
            )


def write_all_or_nothing(files: dict[Path, str]) -> None:
    """Write every file or none: each is staged beside its target, then renamed over it; a
    failure removes the staged files and the folders made for them, and puts back any target
    already replaced."""
    made_dirs: list[Path] = []
    staged: dict[Path, Path] = {}
    try:
        for path, text in files.items():
            for parent in reversed([path.parent, *path.parent.parents]):
                if not parent.exists():
                    parent.mkdir()
                    made_dirs.append(parent)
            temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            staged[path] = temp
            try:
                temp.write_text(text, encoding="utf-8")
            except OSError as exc:  # name the target, not the staged file
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
        replaced: list[tuple[Path, bytes | None]] = []
        try:
            for path, temp in staged.items():
                before = path.read_bytes() if path.is_file() else None
                os.replace(temp, path)
                replaced.append((path, before))
        except OSError:
            for path, before in reversed(replaced):
                if before is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(before)
            raise
    except OSError:
        for temp in staged.values():
            temp.unlink(missing_ok=True)
        for folder in reversed(made_dirs):
            try:
                folder.rmdir()
            except OSError:
                pass
        raise


def _distinct(files: list[Path]) -> list[Path]:
    """``files`` without repeats of one file (a glob and an explicit path naming it twice, or
    ``a.toml`` and ``./a.toml``): each is compiled once, in first-seen order."""
    out: list[Path] = []
    seen: set[tuple[int, int] | str] = set()
    for file in files:
        try:
            info = file.stat()
            key: tuple[int, int] | str = (info.st_dev, info.st_ino)
        except (OSError, ValueError):
            key = str(file)  # load_schema says why it cannot be read
        if key not in seen:
            seen.add(key)
            out.append(file)
    return out


def _compile(files: list[Path], python_out: Path, ts_out: Path, check: bool, as_json: bool) -> int:
    files = _distinct(files)
    schemas = [load_schema(f) for f in files]
    seen: dict[str, tuple[str, Path]] = {}
    for ir, file in zip(schemas, files, strict=True):
        key = ir.name.lower()  # one file name on a case-insensitive file system
        if key in seen:
            name, other = seen[key]
            hint = (
                "schema names may not differ in case only: they name the generated files"
                if name != ir.name
                else "each schema names its generated files: give one of them another [schema] name"
            )
            raise SchemaError(
                f"schema name {ir.name!r} is also used by {other} ({hint})", file=str(file)
            )
        seen[key] = (ir.name, file)
    files_out = generated_files(schemas, python_out, ts_out)
    _refuse_foreign(files_out)
    stale = [
        path
        for path, text in files_out.items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]
    if not check:
        write_all_or_nothing({path: files_out[path] for path in stale})
    if as_json:
        key = "stale" if check else "written"
        print(
            json.dumps(
                {
                    key: [str(p) for p in stale],
                    "fingerprints": {ir.name: ir.fingerprint_hex for ir in schemas},
                }
            )
        )
    elif check and stale:
        for path in stale:
            print(f"stale: {path}", file=sys.stderr)
        print(f"run: {compile_command(files, python_out, ts_out)}", file=sys.stderr)
    elif not check:
        for path in stale:
            print(f"wrote {path}")
        print(f"{len(files_out) - len(stale)} file(s) already up to date")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
