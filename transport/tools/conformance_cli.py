"""``transport-conformance``: check that the Python and the TypeScript codecs agree byte for byte.

See docs/conformance.md for the contract and the testee protocol.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import hypothesis  # noqa: F401  (the property-based generator of the conformance cases)
except ImportError:  # pragma: no cover - depends on the installation
    sys.exit("transport-conformance needs hypothesis: pip install 'transport[tools]'")

from transport.codec import Schema
from transport.conformance.golden import write_golden
from transport.conformance.paths import (
    default_root,
    golden_root,
    node_testee,
    project_schemas,
    schema_files,
)
from transport.conformance.process import TesteeError, TesteeProcess, TesteeStartError
from transport.conformance.runner import (
    CHECKS,
    DEFAULT_COUNT,
    DEFAULT_SEED,
    Options,
    Runner,
    SchemaResult,
    _label,
    check_named,
)
from transport.errors import SchemaError
from transport.schema import load_schema
from transport.tools import quiet_on_broken_pipe
from transport.tools.cli_args import ArgumentParser, positive_seconds, schema_path

DESCRIPTION = """\
Check that the Python codec and another language's codec (by default the Node.js testee built
from node_bridge) agree byte for byte on every schema. The runner starts the testee once and
talks to it over stdin/stdout (length-prefixed msgpack frames, docs/conformance.md).

Checks, per schema, in this order:
  fingerprint     Python's fingerprint of the IR equals the one the testee computes from the IR
                  embedded in its generated code and the constant it declares.
  golden          For every committed golden vector (conformance/golden/<schema>/<struct>.<case>
                  .json|.bin|.hex): both sides encode the values to exactly the committed bytes
                  and decode the bytes to exactly the values; the .hex annotation matches the .bin.
  python->LANG    Hypothesis generates --count values per struct, Python encodes them, the testee
                  decodes (strict) and re-encodes: bytes identical, values equal.
                  (--only python-testee, or python->LANG as printed)
  LANG->python    The testee generates --count values per struct (its own generator) and encodes
                  them; Python decodes, compares the values and re-encodes: bytes identical.
                  (--only testee-python, or LANG->python as printed)
  views           What clients read: the testee's zero-copy views over bytes Python encoded, and
                  Python's views over bytes the testee encoded, at aligned and odd offsets in a
                  larger buffer: every field's value equal to the encoded one.
  invalid         Inputs derived from the IR for every struct (short buffers, out-of-range
                  integers, f32 overflow, wrong array lengths, wrong value kinds, missing and
                  unknown fields, bool bytes other than 0/1, undeclared enum values on encode and
                  strict decode, non-canonical NaNs, two errors at once): both sides must report
                  the error code and field path docs/conformance.md prescribes.
  columns         Only for a schema with [env] shm = "columns": the testee lays k generated
                  request and result records into a column region's columns area (k in 1, 3, 8
                  and the seats); region size, column offsets and bytes identical to Python's.

Values are equal when every integer and bool is equal and every float has the same bits at the
field's width (all NaNs are equal; -0.0 differs from 0.0).

Output: one line per schema and check with its counts, then a total line. On a mismatch the
first failing case is printed: schema, struct, check, the field owning the first differing byte
(computed from the IR offsets, e.g. results[3].reward) and a hex diff around it. Use --seed to
replay a run.

Exit status: 0 when everything matches, 1 on any mismatch, 2 on a usage error or a testee that
cannot start.
"""

EPILOG = """\
examples:
  transport-conformance                          every schema/*.toml, the Node testee
  transport-conformance --count 10000 --seed 7 schema/pac_env.toml
  transport-conformance --json                   one JSON document, for CI
  transport-conformance --testee "node path/to/testee.js"
  transport-conformance --testee python          the Python testee (tests the runner itself)
  transport-conformance --write-golden           rewrite the golden vectors from the Python
                                                 encoder: only for an intentional schema change,
                                                 and review the diff before committing it

The Node testee is node_bridge/dist/conformance/testee.js; build it with
  cd node_bridge && npm ci && npm run build
"""


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="transport-conformance",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files",
        nargs="*",
        type=schema_path,
        metavar="FILE",
        help="schema files to check (default: every schema/*.toml under --root)",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="repository root holding schema/, conformance/golden/ and node_bridge/ "
        "(default: the directory above the installed transport package, else the "
        "current directory)",
    )
    p.add_argument(
        "--count",
        type=int,
        default=DEFAULT_COUNT,
        metavar="N",
        help=f"random messages per struct and direction (default {DEFAULT_COUNT})",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        metavar="N",
        help=f"seed of the random messages; a run replays exactly with the same seed "
        f"and --count (default {DEFAULT_SEED})",
    )
    p.add_argument(
        "--testee",
        metavar="CMD",
        type=_testee_spec,
        default=None,
        help="command that runs the testee, shell-split "
        "(default: node ROOT/node_bridge/dist/conformance/testee.js); "
        "'python' runs the Python testee (python -m transport.conformance.testee)",
    )
    p.add_argument(
        "--only",
        metavar="CHECK[,CHECK]",
        type=_checks,
        default=None,
        help=f"run only these checks: {', '.join(CHECKS)}, or the printed python->LANG and "
        "LANG->python (default: all)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (per schema: fingerprint, counts per check, "
        "failures) instead of the text summary",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="give up when the testee does not answer a request within this time (default 120)",
    )
    p.add_argument(
        "--golden-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="golden vectors directory (default ROOT/conformance/golden; a schema file outside "
        "ROOT/schema/ named like a project schema reads and writes golden vectors only here)",
    )
    p.add_argument(
        "--write-golden",
        action="store_true",
        help="write the golden vectors of the selected schemas from the Python "
        "encoder and exit; only for intentional schema changes: review the diff",
    )
    return p


def _testee_argv(spec: str | None, root: Path, schemas: list[Path]) -> list[str]:
    if spec is None:
        return ["node", str(node_testee(root))]
    if spec.strip() == "python":
        return [sys.executable, "-m", "transport.conformance.testee", *[str(p) for p in schemas]]
    return shlex.split(spec)


def _testee_spec(text: str) -> str:
    """The --testee command: shell-split at parse time, so bad quoting is a usage error."""
    try:
        words = shlex.split(text)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if not words:
        raise argparse.ArgumentTypeError("an empty command")
    return text


def _checks(text: str) -> tuple[str, ...]:
    """--only CHECK[,CHECK]: at least one check, each a known one, in the runner's order."""
    named = [c.strip() for c in text.split(",") if c.strip()]
    if not named:
        raise argparse.ArgumentTypeError(f"names no check; choose from {', '.join(CHECKS)}")
    unknown = [c for c in named if check_named(c) is None]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown check {unknown[0]!r}; choose from {', '.join(CHECKS)} "
            "(python->LANG and LANG->python name python-testee and testee-python)"
        )
    chosen = {check_named(c) for c in named}
    return tuple(c for c in CHECKS if c in chosen)


def _print_first_failure(results: list[SchemaResult], lang: str) -> None:
    for result in results:
        if result.failures:
            first = result.failures[0]
            print()
            print(first.render(_label(first.check, lang)))
            others = sum(r.failure_count for r in results) - 1
            if others:
                print(
                    f"  ({others} more failure{'s' if others > 1 else ''}; --json lists "
                    f"up to 20 per schema)"
                )
            return


@quiet_on_broken_pipe
def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    root: Path = (args.root or default_root()).resolve()
    paths: list[Path] = [p.resolve() for p in args.files] or schema_files(root)
    if not paths:
        parser.error(f"no schema files under {root / 'schema'} (pass FILE or --root)")
    if args.count < 0:
        parser.error("--count must be at least 0")
    checks: tuple[str, ...] = CHECKS if args.only is None else args.only
    golden = (args.golden_dir or golden_root(root)).resolve()
    try:
        irs = [load_schema(p) for p in paths]
    except SchemaError as exc:
        print(f"transport-conformance: error: {exc}", file=sys.stderr)
        return 2

    first: dict[str, Path] = {}
    for path, ir in zip(paths, irs, strict=True):
        if ir.name in first and first[ir.name] != path:
            print(
                f"transport-conformance: error: {first[ir.name]} and {path} both declare schema "
                f"{ir.name}: check them in separate runs",
                file=sys.stderr,
            )
            return 2
        first[ir.name] = path
    project = project_schemas(root)
    if args.write_golden and args.golden_dir is None:
        for path, ir in zip(paths, irs, strict=True):
            theirs = project.get(ir.name)
            if theirs is not None and theirs != path:
                print(
                    f"transport-conformance: error: {path} declares schema {ir.name}, the name "
                    f"of the project's {theirs}: --write-golden would overwrite that schema's "
                    f"golden vectors in {golden / ir.name}; pass --golden-dir DIR",
                    file=sys.stderr,
                )
                return 2

    if args.write_golden:
        for ir in irs:
            n = len(write_golden(ir, Schema(ir), golden))
            print(f"{ir.name:<12} wrote {n} files to {golden / ir.name}")
        print(
            "review the diff (git diff conformance/golden) before committing: golden vectors "
            "change only with an intentional schema change"
        )
        return 0

    argv_testee = _testee_argv(args.testee, root, paths)
    if args.testee is None and not node_testee(root).exists():
        print(
            f"transport-conformance: the Node testee is not built ({node_testee(root)} is "
            "missing).\nBuild it with:  cd node_bridge && npm ci && npm run build\n"
            "or pass --testee CMD (--testee python runs the Python testee).",
            file=sys.stderr,
        )
        return 2
    options = Options(
        paths,
        golden,
        args.count,
        args.seed,
        checks,
        project_schemas=project,
        golden_given=args.golden_dir is not None,
    )
    started = time.perf_counter()
    try:
        testee = TesteeProcess(argv_testee, timeout=args.timeout, cwd=str(root))
    except TesteeStartError as exc:
        hint = (
            "Build the Node testee with:  cd node_bridge && npm ci && npm run build"
            if args.testee is None
            else "Check the --testee command."
        )
        print(f"transport-conformance: the testee did not start: {exc}\n{hint}", file=sys.stderr)
        return 2
    text = not args.json
    if text:
        print(f"testee: {' '.join(argv_testee)} (lang {testee.lang})")
        print(
            f"seed {args.seed}, {args.count} messages per struct and direction "
            f"(replay: --seed {args.seed} --count {args.count})"
        )
    runner = Runner(options, testee, print if text else None)
    aborted = ""
    try:
        runner.run()
    except TesteeError as exc:
        aborted = str(exc)
    finally:
        testee.close()
    elapsed = time.perf_counter() - started
    results = runner.results
    ok = sum(c.ok for r in results for c in r.checks.values())
    failed = sum(c.failed for r in results for c in r.checks.values())
    passed = not failed and not aborted and all(not r.failure_count for r in results)
    if args.json:
        doc: dict[str, Any] = {
            "ok": passed,
            "seed": args.seed,
            "count": args.count,
            "testee": {"command": argv_testee, "lang": testee.lang},
            "checks": [_label(c, testee.lang) for c in checks],
            "elapsed_seconds": round(elapsed, 3),
            "totals": {"ok": ok, "failed": failed},
            "aborted": aborted or None,
            "schemas": [r.to_json(testee.lang) for r in results],
        }
        print(json.dumps(doc, indent=2))
    else:
        verdict = "OK" if passed else "FAILED"
        print(
            f"{'total':<12} {len(results)} schema{'s' if len(results) != 1 else ''}, "
            f"{ok} ok, {failed} failed in {elapsed:.1f} s: {verdict}"
        )
        if aborted:
            print(f"\nthe run stopped: the testee failed: {aborted}")
        _print_first_failure(results, testee.lang)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
