"""The conformance runner: every check of docs/conformance.md against one testee process."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, TextIO

from transport.codec import Schema
from transport.conformance import wire
from transport.conformance.columns import column_answer, column_slots
from transport.conformance.golden import (
    LARGE_ELEMENTS,
    GoldenCase,
    annotate,
    case_names,
    hex_title,
    load_golden,
)
from transport.conformance.invalid import InvalidCase, invalid_cases
from transport.conformance.layout import field_at, leaves
from transport.conformance.process import TesteeError, TesteeProcess
from transport.conformance.strategies import generate
from transport.conformance.testee import error_of
from transport.schema import load_schema
from transport.schema.ir import SchemaIR, StructIR, shm_columns

CHECKS = (
    "fingerprint",
    "golden",
    "python-testee",
    "testee-python",
    "views",
    "invalid",
    "columns",
)
"""Check names, in the order they run (``--only`` takes these)."""
DEFAULT_COUNT = 2000
DEFAULT_SEED = 20240611
MAX_DETAILS = 20
"""Failures kept in full per schema (all are counted)."""
_BATCH_BYTES = 2_000_000
ELEMENT_BUDGET = 2_000_000
"""The most scalar elements a frame-sized struct's messages hold, per check and direction."""
MIN_LARGE_COUNT = 2


@dataclass
class Failure:
    schema: str
    check: str  # one of CHECKS
    struct: str
    case: str  # golden case, invalid case or "message #N (seed S)"
    side: str  # which side is wrong, when one can tell: "python", the testee's lang, or "?"
    summary: str
    field: str = ""
    details: list[str] = dc_field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "check": self.check,
            "struct": self.struct,
            "case": self.case,
            "side": self.side,
            "summary": self.summary,
            "field": self.field,
            "details": self.details,
        }

    def render(self, direction: str) -> str:
        head = [
            f"FAIL {self.schema} {self.struct} {direction}: {self.summary}",
            f"  case:  {self.case}",
        ]
        if self.field:
            head.append(f"  field: {self.field}")
        if self.side and self.side != "?":
            head.append(f"  wrong: {self.side}")
        return "\n".join(head + ["  " + line for line in self.details])


@dataclass
class Count:
    ok: int = 0
    failed: int = 0
    structs: dict[str, list[int]] = dc_field(default_factory=dict)

    def add(self, struct: str, ok: bool, n: int = 1) -> None:
        slot = self.structs.setdefault(struct, [0, 0])
        if ok:
            self.ok += n
            slot[0] += n
        else:
            self.failed += n
            slot[1] += n

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failed": self.failed,
            "structs": {k: {"ok": v[0], "failed": v[1]} for k, v in self.structs.items()},
        }


@dataclass
class SchemaResult:
    name: str
    file: str
    fingerprint: str
    testee_fingerprint: dict[str, str] = dc_field(default_factory=dict)
    checks: dict[str, Count] = dc_field(default_factory=dict)
    failures: list[Failure] = dc_field(default_factory=list)
    failure_count: int = 0

    def fail(self, failure: Failure) -> None:
        self.failure_count += 1
        if len(self.failures) < MAX_DETAILS:
            self.failures.append(failure)

    def to_json(self, lang: str) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "fingerprint": self.fingerprint,
            "testee_fingerprint": self.testee_fingerprint,
            "checks": {_label(k, lang): v.to_json() for k, v in self.checks.items()},
            "failure_count": self.failure_count,
            "failures": [f.to_json() for f in self.failures],
        }


def _label(check: str, lang: str) -> str:
    if check == "python-testee":
        return f"python->{lang}"
    if check == "testee-python":
        return f"{lang}->python"
    return check


def check_named(name: str) -> str | None:
    """The check a name means: one of CHECKS, or a label as printed (``python->node``,
    ``node->python``, any testee language); None for no check."""
    if name in CHECKS:
        return name
    source, arrow, target = name.partition("->")
    if arrow and source and target and "python" in (source, target) and source != target:
        return "python-testee" if source == "python" else "testee-python"
    return None


# -- byte and value diffs ----------------------------------------------------------------------


def first_diff_offset(a: bytes, b: bytes) -> int | None:
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def hex_diff(
    expected: bytes, got: bytes, offset: int, labels: tuple[str, str], rows: int = 1
) -> list[str]:
    """Rows of 16 bytes around ``offset`` from both sides, ``^^`` under each differing byte."""
    width = max(len(labels[0]), len(labels[1]))
    first = max(0, offset // 16 - rows)
    last = (max(len(expected), len(got)) - 1) // 16
    lines = []
    for row in range(first, min(last, offset // 16 + rows) + 1):
        start = row * 16
        a, b = expected[start : start + 16], got[start : start + 16]
        lines.append(f"{start:>8}  {labels[0]:<{width}}  {a.hex(' ')}")
        lines.append(f"{'':>8}  {labels[1]:<{width}}  {b.hex(' ')}")
        marks = "".join(
            "   " if i < len(a) and i < len(b) and a[i] == b[i] else "^^ "
            for i in range(max(len(a), len(b)))
        )
        if marks.strip():
            lines.append(f"{'':>8}  {'':<{width}}  {marks.rstrip()}")
    return lines


def bytes_failure_details(
    schema: SchemaIR, struct: StructIR, expected: bytes, got: bytes, labels: tuple[str, str]
) -> tuple[str, list[str]]:
    offset = first_diff_offset(expected, got)
    assert offset is not None
    where = field_at(schema, struct, offset)
    lines = []
    if len(expected) != len(got):
        lines.append(f"lengths differ: {labels[0]} {len(expected)}, {labels[1]} {len(got)} bytes")
    lines.append(f"first differing byte: offset {offset} of {struct.size}, field {where}")
    lines += hex_diff(expected, got, offset, labels)
    return where, lines


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('code')} at {error.get('field')!r} ({error.get('message', '')})"
    return repr(error)


def _stale_golden(ir: SchemaIR, struct: StructIR, case: GoldenCase, fingerprint: str) -> Failure:
    """The failure of a golden case written for another fingerprint (a changed schema)."""
    details = [
        "if the schema change is intentional, run "
        "`transport-conformance --write-golden` and review the diff"
    ]
    if len(case.data) != struct.size:
        name = case.path.with_suffix(".bin").name
        details.insert(0, f"{name} has {len(case.data)} bytes, the struct {struct.size}")
    elif case.values is None:
        details.insert(0, f"{case.path.name}'s values do not fit the struct's fields")
    summary = f"golden vector written for fingerprint {case.fingerprint}, schema is {fingerprint}"
    return Failure(ir.name, "golden", struct.name, case.name, "?", summary, "", details)


def _unfit_golden(
    ir: SchemaIR, struct: StructIR, case: GoldenCase, fingerprint: str
) -> Failure | None:
    """Why a golden case cannot be checked against this layout at all (its .bin has another
    size, or its values other fields), or None: checking it would only misread its bytes."""
    if len(case.data) == struct.size and case.values is not None:
        return None
    if case.fingerprint != fingerprint:
        return _stale_golden(ir, struct, case, fingerprint)
    name = case.path.with_suffix(".bin").name
    summary = f"{name} has {len(case.data)} bytes, the struct {struct.size}"
    return Failure(ir.name, "golden", struct.name, case.name, "?", summary)


def _seed_for(seed: int, *parts: object) -> int:
    key = "/".join(str(p) for p in (seed, *parts)).encode()
    return zlib.crc32(key) & 0x7FFFFFFF


def _view_offset(batch: int) -> int:
    """Where a view is placed: a cache line in (aligned, as in shm slots) for even batches, an
    odd byte for odd ones (typed arrays cannot map there: the views' copying path)."""
    return 64 if batch % 2 == 0 else 65


def batch_size(struct: StructIR) -> int:
    return max(1, min(1000, _BATCH_BYTES // (struct.size * 4)))


# -- the runner --------------------------------------------------------------------------------


@dataclass
class Options:
    schema_paths: list[Path]
    golden_root: Path
    count: int = DEFAULT_COUNT
    seed: int = DEFAULT_SEED
    checks: tuple[str, ...] = CHECKS
    verbose: bool = False
    project_schemas: dict[str, Path] | None = None
    """The project's schemas (``schema/*.toml`` of the root), by declared name. When given, a
    file outside that folder is a user's schema: always handed to the testee as IR (even when
    the testee was built with a project schema of the same name), and its golden vectors are
    read from ``golden_root`` only when ``golden_given`` or when no project schema has its
    name (there they are the project's, of another layout). None: every file is the project's."""
    golden_given: bool = False
    """``golden_root`` was chosen by the user (``--golden-dir``): it holds user's schemas too."""


@dataclass
class _PythonBatches:
    """Python-encoded messages of one struct sent to the testee in batches (``answers``)."""

    runner: Runner
    ir: SchemaIR
    struct: StructIR
    op: str
    seed: int
    values: list[Any]
    buffers: list[bytes]

    def answers(
        self, at: Callable[[int], int] | None = None
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """(message index, the testee's result for it); ``at``: the ``at`` of each batch."""
        size = batch_size(self.struct)
        requests = (
            (
                i,
                {
                    "op": self.op,
                    "schema": self.ir.name,
                    "struct": self.struct.name,
                    "buffers": self.buffers[i : i + size],
                    **({} if at is None else {"at": at(i // size)}),
                },
            )
            for i in range(0, len(self.buffers), size)
        )
        for start, answer in self.runner.testee.pipeline(requests):
            results = self.runner._results(answer, len(self.buffers[start : start + size]))
            for j, r in enumerate(results):
                yield start + j, r


class Runner:
    """Runs the checks of every schema against a started testee; results in ``self.results``."""

    def __init__(
        self, options: Options, testee: TesteeProcess, emit: Callable[[str], None] | None = None
    ) -> None:
        self.options = options
        self.testee = testee
        self.lang = testee.lang
        self.emit = emit or (lambda line: None)
        self.results: list[SchemaResult] = []
        self.loaded: set[str] = set()
        """Schemas the testee was not built with and loaded from their IR at run time."""
        self.users: set[str] = set()
        """Schemas of a user's file (outside the project's schema/ folder)."""
        self.load_refused: dict[str, str] = {}
        """A user's schema the testee would not load, though it serves one of that name."""

    def _load(self, ir: SchemaIR) -> bool:
        """Hand a schema the testee was not built with to it as IR (``{"op": "load"}``): a
        user's schema is checked in both languages with no code generation or build step."""
        answer = self.testee.request({"op": "load", "ir": json.dumps(ir.to_json())})
        if isinstance(answer, dict) and answer.get("ok") and answer.get("schema") == ir.name:
            if ir.name not in self.testee.schemas:
                self.testee.schemas.append(ir.name)
            return True
        if ir.name in self.testee.schemas:
            self.load_refused[ir.name] = repr(answer)[:200]
        return False

    def is_users(self, path: Path) -> bool:
        """A file outside the project's schema/ folder (``Options.project_schemas``)."""
        project = self.options.project_schemas
        return project is not None and path.resolve() not in project.values()

    def golden_dir(self, ir: SchemaIR) -> Path | None:
        """Where ``ir``'s golden vectors are, None where it has none to read: a user's schema
        named like a project schema does not read the project's vectors (another layout)."""
        project = self.options.project_schemas or {}
        if ir.name in self.users and not self.options.golden_given and ir.name in project:
            return None
        return self.options.golden_root / ir.name

    def count_for(self, ir: SchemaIR, struct: StructIR) -> int:
        """Messages per direction for ``struct``: ``--count``, fewer for a frame-sized struct
        (more than LARGE_ELEMENTS scalar elements, an image schema's): count x LARGE_ELEMENTS /
        elements, at most ELEMENT_BUDGET elements in all, at least MIN_LARGE_COUNT. Every
        schema with smaller structs is checked with the full count."""
        elements = sum(leaf.field.count for leaf in leaves(ir, struct))
        count = self.options.count
        if elements <= LARGE_ELEMENTS:
            return count
        scaled = min(count * LARGE_ELEMENTS // elements, ELEMENT_BUDGET // elements)
        return max(min(count, MIN_LARGE_COUNT), scaled)

    def line(self, schema: str, check: str, detail: str, count: Count | None) -> None:
        if count is None:
            status = ""
        elif count.failed:
            status = f"{count.ok} ok, {count.failed} FAILED"
        else:
            status = f"{count.ok} ok"
        label = _label(check, self.lang)
        width = max(14, len(_label("python-testee", self.lang)) + 1)
        self.emit(f"{schema:<12} {label:<{width}} {detail:<30} {status}".rstrip())

    def run(self) -> list[SchemaResult]:
        for path in self.options.schema_paths:
            ir = load_schema(path)
            result = SchemaResult(ir.name, str(path), ir.fingerprint_hex)
            self.results.append(result)
            codecs = Schema(ir)
            users = self.is_users(path)
            if users:
                self.users.add(ir.name)
            # a user's file is always loaded: a testee built with a project schema of the same
            # name would otherwise be checked in its place
            if (users or ir.name not in self.testee.schemas) and self._load(ir):
                self.loaded.add(ir.name)
            if ir.name not in self.testee.schemas:
                count = Count()
                count.add("", False)
                result.checks["fingerprint"] = count
                result.fail(
                    Failure(
                        ir.name,
                        "fingerprint",
                        "",
                        "hello",
                        self.lang,
                        f"the testee does not serve schema {ir.name} "
                        f"(it serves: {', '.join(self.testee.schemas) or 'nothing'})",
                        details=["regenerate and rebuild the testee's codecs for this schema"],
                    )
                )
                self.line(ir.name, "fingerprint", "schema not served by the testee", count)
                continue
            for check in self.options.checks:
                getattr(self, "check_" + check.replace("-", "_"))(ir, codecs, result)
        return self.results

    # -- 1. fingerprint -------------------------------------------------------------------------

    def check_fingerprint(self, ir: SchemaIR, codecs: Schema, result: SchemaResult) -> None:
        count = result.checks.setdefault("fingerprint", Count())
        answer = self.testee.request({"op": "fingerprint", "schema": ir.name})
        py = ir.fingerprint_hex

        def fail(text: str, details: list[str], side: str = self.lang) -> None:
            result.fail(
                Failure(ir.name, "fingerprint", "", "fingerprint", side, text, details=details)
            )

        if not isinstance(answer, dict) or not answer.get("ok"):
            count.add("", False)
            fail(f"the testee refused: {answer!r}", [])
        else:
            computed, declared = str(answer.get("computed")), str(answer.get("declared"))
            result.testee_fingerprint = {"computed": computed, "declared": declared}
            ok = computed == declared == py
            count.add("", ok)
            if not ok and ir.name in self.load_refused:
                fail(
                    f"the testee checks its own schema {ir.name}, not this file's",
                    [
                        f"python (from the IR of {result.file}): {py}",
                        f"{self.lang} (its own {ir.name}):   {computed}",
                        'the testee refused to load this file\'s IR ({"op": "load"}): '
                        f"{self.load_refused[ir.name]}",
                        "rename the schema ([schema] name) or use a testee that loads IR "
                        "(the Node testee of node_bridge/dist/conformance/testee.js does)",
                    ],
                )
            elif not ok:
                fail(
                    "fingerprints differ",
                    [
                        f"python (from the IR):       {py}",
                        f"{self.lang} computed from its IR: {computed}",
                        f"{self.lang} declared constant:    {declared}",
                        "regenerate the generated modules (transport-schema compile) "
                        "and rebuild the testee",
                    ],
                    self.lang if computed == py else "?",
                )
        self.line(ir.name, "fingerprint", py, count)

    # -- 2. golden vectors ----------------------------------------------------------------------

    def check_golden(self, ir: SchemaIR, codecs: Schema, result: SchemaResult) -> None:
        where = self.golden_dir(ir)
        if where is None:
            # a user's schema named like a project schema: the vectors there are the project's
            self.line(ir.name, "golden", "none in --golden-dir (not given) (skipped)", None)
            return
        if (ir.name in self.loaded or ir.name in self.users) and not where.is_dir():
            self.line(ir.name, "golden", f"none in {where} (skipped)", None)
            return
        count = result.checks.setdefault("golden", Count())
        fingerprint = ir.fingerprint_hex  # once: each computation hashes the layout's JSON
        try:
            cases = load_golden(ir, self.options.golden_root)
        except ValueError as exc:
            count.add("", False)
            result.fail(
                Failure(ir.name, "golden", "", "load", "?", f"malformed golden file: {exc}")
            )
            self.line(ir.name, "golden", "unreadable golden vectors", count)
            return
        missing = [s for s in ir.structs if not any(c.struct == s for c in cases)]
        for absent in missing:
            count.add(absent, False)
            result.fail(
                Failure(
                    ir.name,
                    "golden",
                    absent,
                    "-",
                    "?",
                    f"no golden vectors for {absent} in {where}",
                    details=[
                        "write them with `transport-conformance --write-golden` "
                        "and review the files before committing them"
                    ],
                )
            )
        for struct_name in ir.structs:
            mine = [c for c in cases if c.struct == struct_name]
            if not mine:
                continue
            struct = ir.structs[struct_name]
            codec = codecs[struct_name]
            expected_cases = case_names(ir, struct)
            usable: list[GoldenCase] = []
            for case in mine:
                unfit = _unfit_golden(ir, struct, case, fingerprint)
                if unfit is None:
                    usable.append(case)
                else:
                    count.add(struct_name, False)
                    result.fail(unfit)
            wire_values = [wire.to_wire(ir, struct, c.values) for c in usable]
            enc_results: list[dict[str, Any]] = []
            dec_results: list[dict[str, Any]] = []
            if usable:
                enc = self.testee.request(
                    {
                        "op": "encode",
                        "schema": ir.name,
                        "struct": struct_name,
                        "values": wire_values,
                    }
                )
                dec = self.testee.request(
                    {
                        "op": "decode",
                        "schema": ir.name,
                        "struct": struct_name,
                        "buffers": [c.data for c in usable],
                        "strict": True,
                    }
                )
                enc_results = self._results(enc, len(usable))
                dec_results = self._results(dec, len(usable))
            for i, case in enumerate(usable):
                problems: list[Failure] = []

                def fail(
                    side: str,
                    summary: str,
                    fld: str = "",
                    details: Sequence[str] = (),
                    case_name: str = case.name,
                    problems: list[Failure] = problems,
                    struct_name: str = struct_name,
                ) -> None:
                    problems.append(
                        Failure(
                            ir.name,
                            "golden",
                            struct_name,
                            case_name,
                            side,
                            summary,
                            fld,
                            list(details),
                        )
                    )

                if case.fingerprint != fingerprint:
                    stale = _stale_golden(ir, struct, case, fingerprint)
                    fail(stale.side, stale.summary, details=stale.details)
                expected_hex = annotate(ir, struct, case.data, hex_title(case), fingerprint)
                if case.hex_text != expected_hex:
                    fail(
                        "?",
                        f"{case.path.with_suffix('.hex').name} does not annotate the .bin "
                        "(stale or edited by hand): rerun --write-golden",
                    )
                # Python side
                try:
                    # numeric lists as arrays: the same values, checked vectorised
                    got = codec.encode(wire.to_codec(ir, struct, case.values))
                    if got != case.data:
                        fld, details = bytes_failure_details(
                            ir, struct, case.data, got, ("golden", "python")
                        )
                        fail(
                            "python",
                            "python encodes other bytes than the golden vector",
                            fld,
                            details,
                        )
                except Exception as exc:
                    fail("python", f"python cannot encode the golden values: {exc}")
                try:
                    decoded = wire.to_wire(ir, struct, codec.decode(case.data, strict=True))
                    diff = wire.first_difference(ir, struct, wire_values[i], decoded)
                    if diff:
                        fail(
                            "python",
                            "python decodes the golden bytes to other values",
                            diff[0],
                            [f"golden: {diff[1]}", f"python: {diff[2]}"],
                        )
                except Exception as exc:
                    fail("python", f"python cannot decode the golden bytes: {exc}")
                # testee side
                r = enc_results[i]
                if "bytes" not in r:
                    fail(
                        self.lang,
                        f"{self.lang} cannot encode the golden values: "
                        f"{_error_text(r.get('error'))}",
                    )
                elif r["bytes"] != case.data:
                    fld, details = bytes_failure_details(
                        ir, struct, case.data, r["bytes"], ("golden", self.lang)
                    )
                    fail(
                        self.lang,
                        f"{self.lang} encodes other bytes than the golden vector",
                        fld,
                        details,
                    )
                r = dec_results[i]
                if "values" not in r:
                    fail(
                        self.lang,
                        f"{self.lang} cannot decode the golden bytes: "
                        f"{_error_text(r.get('error'))}",
                    )
                else:
                    theirs = wire.from_wire(ir, struct, r["values"])
                    diff = wire.first_difference(ir, struct, wire_values[i], theirs)
                    if diff:
                        fail(
                            self.lang,
                            f"{self.lang} decodes the golden bytes to other values",
                            diff[0],
                            [f"golden: {diff[1]}", f"{self.lang}: {diff[2]}"],
                        )
                count.add(struct_name, not problems)
                if problems:
                    result.fail(problems[0])
            for case_name in expected_cases:
                if not any(c.case == case_name for c in mine):
                    count.add(struct_name, False)
                    result.fail(
                        Failure(
                            ir.name,
                            "golden",
                            struct_name,
                            f"{struct_name}.{case_name}",
                            "?",
                            "golden case missing: rerun --write-golden and review the diff",
                        )
                    )
        detail = f"{len(ir.structs)} structs, {len(cases)} cases"
        self.line(ir.name, "golden", detail, count)

    def _results(self, answer: Any, n: int) -> list[dict[str, Any]]:
        """The ``results`` of a batch answer, padded with errors when the testee refused it."""
        if (
            isinstance(answer, dict)
            and answer.get("ok")
            and isinstance(answer.get("results"), list)
        ):
            results = [r if isinstance(r, dict) else {"error": r} for r in answer["results"]]
            if len(results) == n:
                return results
            problem = f"{len(results)} results for {n} inputs"
        else:
            problem = f"request refused: {answer!r}"[:300]
        return [{"error": {"code": "(protocol)", "field": "", "message": problem}}] * n

    # -- 3. python -> testee ---------------------------------------------------------------------

    def check_python_testee(self, ir: SchemaIR, codecs: Schema, result: SchemaResult) -> None:
        count = result.checks.setdefault("python-testee", Count())
        for struct_name, struct in ir.structs.items():
            batch = self._python_batches(ir, codecs, struct, "roundtrip", "python")
            for k, r in batch.answers():
                failure = self._compare_roundtrip(ir, struct, batch.values[k], batch.buffers[k], r)
                count.add(struct_name, failure is None)
                if failure:
                    total = self.count_for(ir, struct)
                    failure.case = f"message #{k} of {total} (seed {batch.seed})"
                    result.fail(failure)
        self.line(ir.name, "python-testee", self._struct_counts(ir, count), count)

    def _python_batches(
        self, ir: SchemaIR, codecs: Schema, struct: StructIR, op: str, purpose: str
    ) -> _PythonBatches:
        """Python's random values of ``struct`` (seeded by ``purpose``), their encodings, and
        the testee's answers to ``op`` over them in batches."""
        seed = _seed_for(self.options.seed, ir.name, struct.name, purpose)
        values = generate(ir, struct, self.count_for(ir, struct), seed)
        buffers = [codecs[struct.name].encode(v) for v in values]
        return _PythonBatches(self, ir, struct, op, seed, values, buffers)

    def _generated(
        self, ir: SchemaIR, struct: StructIR, purpose: str
    ) -> Iterator[tuple[int, dict[str, Any], list[dict[str, Any]]]]:
        """The testee's own random values of ``struct`` and their bytes, in batches:
        (batch number, the generate request, its results)."""
        size = batch_size(struct)
        total = self.count_for(ir, struct)
        chunks = [(i, min(size, total - i)) for i in range(0, total, size)]
        requests: Iterator[tuple[dict[str, Any], dict[str, Any]]] = (
            (req, req)
            for req in (
                {
                    "op": "generate",
                    "schema": ir.name,
                    "struct": struct.name,
                    "count": n,
                    "seed": _seed_for(self.options.seed, ir.name, struct.name, purpose, i),
                }
                for i, n in chunks
            )
        )
        for number, (request, answer) in enumerate(self.testee.pipeline(requests)):
            yield number, request, self._results(answer, int(request["count"]))

    def _compare_roundtrip(
        self, ir: SchemaIR, struct: StructIR, values: Any, data: bytes, r: dict[str, Any]
    ) -> Failure | None:
        lang = self.lang
        if "error" in r or "bytes" not in r or "values" not in r:
            return Failure(
                ir.name,
                "python-testee",
                struct.name,
                "",
                lang,
                f"{lang} rejects bytes python encoded: {_error_text(r.get('error'))}",
            )
        if r["bytes"] != data:
            fld, details = bytes_failure_details(ir, struct, data, r["bytes"], ("python", lang))
            return Failure(
                ir.name,
                "python-testee",
                struct.name,
                "",
                "?",
                f"{lang} re-encodes to other bytes",
                fld,
                details,
            )
        diff = wire.first_difference(ir, struct, values, r["values"])
        if diff:
            return Failure(
                ir.name,
                "python-testee",
                struct.name,
                "",
                lang,
                f"{lang} decodes to other values",
                diff[0],
                [f"python: {diff[1]}", f"{lang}: {diff[2]}"],
            )
        return None

    # -- 4. testee -> python ---------------------------------------------------------------------

    def check_testee_python(self, ir: SchemaIR, codecs: Schema, result: SchemaResult) -> None:
        count = result.checks.setdefault("testee-python", Count())
        for struct_name, struct in ir.structs.items():
            for _, request, results in self._generated(ir, struct, "testee"):
                for j, r in enumerate(results):
                    failure = self._compare_generated(ir, codecs, struct, r)
                    count.add(struct_name, failure is None)
                    if failure:
                        failure.case = (
                            f"message #{j} of generate(count={request['count']}, "
                            f"seed={request['seed']})"
                        )
                        result.fail(failure)
        self.line(ir.name, "testee-python", self._struct_counts(ir, count), count)

    def _compare_generated(
        self, ir: SchemaIR, codecs: Schema, struct: StructIR, r: dict[str, Any]
    ) -> Failure | None:
        lang = self.lang
        check = "testee-python"
        if "error" in r or not isinstance(r.get("bytes"), bytes) or "values" not in r:
            return Failure(
                ir.name,
                check,
                struct.name,
                "",
                lang,
                f"{lang} failed to generate: {_error_text(r.get('error'))}",
            )
        data: bytes = r["bytes"]
        codec = codecs[struct.name]
        try:
            decoded = codec.decode(data, strict=True)
        except Exception as exc:
            return Failure(
                ir.name,
                check,
                struct.name,
                "",
                "?",
                f"python rejects bytes {lang} encoded: {_error_text(error_of(exc))}",
                getattr(exc, "field", ""),
            )
        diff = wire.first_difference(ir, struct, r["values"], decoded)
        if diff:
            return Failure(
                ir.name,
                check,
                struct.name,
                "",
                "?",
                f"python decodes {lang}'s bytes to other values than {lang} encoded",
                diff[0],
                [f"{lang}: {diff[1]}", f"python: {diff[2]}"],
            )
        try:
            again = codec.encode(wire.to_codec(ir, struct, r["values"]))
        except Exception as exc:
            return Failure(
                ir.name,
                check,
                struct.name,
                "",
                "?",
                f"python rejects values {lang} encoded: {_error_text(error_of(exc))}",
                getattr(exc, "field", ""),
            )
        for label, got in (
            ("python encoding of the same values", again),
            ("python re-encoding of its decode", codec.encode(decoded)),
        ):
            if got != data:
                fld, details = bytes_failure_details(ir, struct, data, got, (lang, "python"))
                return Failure(
                    ir.name,
                    check,
                    struct.name,
                    "",
                    "?",
                    f"{label} differs from {lang}'s bytes",
                    fld,
                    details,
                )
        return None

    # -- 5. zero-copy views -----------------------------------------------------------------------

    def check_views(self, ir: SchemaIR, codecs: Schema, result: SchemaResult) -> None:
        """What clients read: the testee's zero-copy views (a Node client's ``...View`` getters)
        over bytes Python encoded, and Python's views over bytes the testee encoded, each placed
        at an offset in a larger buffer (aligned and odd offsets alternate, as slots and frames
        place them). ``decode`` agreeing proves nothing about the views: they are separate code."""
        count = result.checks.setdefault("views", Count())
        for struct_name, struct in ir.structs.items():
            codec = codecs[struct_name]
            batch = self._python_batches(ir, codecs, struct, "view", "views")
            for k, r in batch.answers(at=_view_offset):
                mismatch = self._compare_view(ir, struct, batch.values[k], r, self.lang)
                count.add(struct_name, mismatch is None)
                if mismatch:
                    total = self.count_for(ir, struct)
                    mismatch.case = f"message #{k} of {total} (seed {batch.seed})"
                    result.fail(mismatch)
            for number, request, results in self._generated(ir, struct, "views"):
                at = _view_offset(number)
                for j, r in enumerate(results):
                    if "error" in r or not isinstance(r.get("bytes"), bytes):
                        failure: Failure | None = Failure(
                            ir.name,
                            "views",
                            struct.name,
                            "",
                            self.lang,
                            f"{self.lang} failed to generate: {_error_text(r.get('error'))}",
                        )
                    elif len(r["bytes"]) != struct.size:
                        failure = Failure(
                            ir.name,
                            "views",
                            struct.name,
                            "",
                            self.lang,
                            f"{self.lang} encoded {len(r['bytes'])} bytes, "
                            f"the struct has {struct.size}",
                        )
                    else:
                        buffer = bytearray(at + len(r["bytes"]))
                        buffer[at:] = r["bytes"]
                        try:
                            seen = {"values": codec.values_of(codec.view(buffer, at))}
                        except Exception as exc:
                            seen = {"error": error_of(exc)}
                        failure = self._compare_view(ir, struct, r["values"], seen, "python")
                    count.add(struct_name, failure is None)
                    if failure:
                        failure.case = (
                            f"message #{j} of generate(count={request['count']}, "
                            f"seed={request['seed']}), view at offset {at}"
                        )
                        result.fail(failure)
        self.line(ir.name, "views", self._struct_counts(ir, count), count)

    def _compare_view(
        self, ir: SchemaIR, struct: StructIR, values: Any, r: dict[str, Any], reader: str
    ) -> Failure | None:
        """``values`` (what was encoded) against what ``reader``'s view showed."""
        writer = "python" if reader != "python" else self.lang
        if "error" in r or "values" not in r:
            return Failure(
                ir.name,
                "views",
                struct.name,
                "",
                reader,
                f"{reader}'s view cannot read what {writer} encoded: {_error_text(r.get('error'))}",
            )
        diff = wire.first_difference(ir, struct, values, r["values"])
        if diff:
            return Failure(
                ir.name,
                "views",
                struct.name,
                "",
                reader,
                f"{reader}'s zero-copy view reads other values than {writer} encoded",
                diff[0],
                [f"{writer} encoded: {diff[1]}", f"{reader}'s view: {diff[2]}"],
            )
        return None

    # -- 5. invalid input -----------------------------------------------------------------------

    def check_invalid(self, ir: SchemaIR, codecs: Schema, result: SchemaResult) -> None:
        count = result.checks.setdefault("invalid", Count())
        total = 0
        for struct_name, struct in ir.structs.items():
            cases = invalid_cases(ir, codecs, struct)
            total += len(cases)
            encodes = [c for c in cases if c.op == "encode"]
            decodes = [c for c in cases if c.op == "decode"]
            answers: dict[int, dict[str, Any]] = {}
            if encodes:
                enc = self.testee.request(
                    {
                        "op": "encode",
                        "schema": ir.name,
                        "struct": struct_name,
                        "values": [c.payload for c in encodes],
                    }
                )
                for c, r in zip(encodes, self._results(enc, len(encodes)), strict=True):
                    answers[id(c)] = r
            if decodes:
                dec = self.testee.request(
                    {
                        "op": "decode",
                        "schema": ir.name,
                        "struct": struct_name,
                        "buffers": [c.payload for c in decodes],
                        "strict": True,
                    }
                )
                for c, r in zip(decodes, self._results(dec, len(decodes)), strict=True):
                    answers[id(c)] = r
            for case in cases:
                failure = self._compare_invalid(ir, codecs, struct, case, answers[id(case)])
                count.add(struct_name, failure is None)
                if failure:
                    result.fail(failure)
        self.line(ir.name, "invalid", f"{len(ir.structs)} structs, {total} cases", count)

    def _compare_invalid(
        self, ir: SchemaIR, codecs: Schema, struct: StructIR, case: InvalidCase, r: dict[str, Any]
    ) -> Failure | None:
        codec = codecs[struct.name]
        try:
            if case.op == "encode":
                codec.encode(wire.to_codec(ir, struct, case.payload))
            else:
                codec.decode(case.payload, strict=True)
            py: tuple[str, str] | None = None
        except Exception as exc:
            err = error_of(exc)
            py = (str(err["code"]), str(err["field"]))
        error = r.get("error")
        theirs = (
            (str(error.get("code")), str(error.get("field"))) if isinstance(error, dict) else None
        )
        expected = (case.code, case.field)
        if py == expected and theirs == expected:
            return None
        wrong = [side for side, got in (("python", py), (self.lang, theirs)) if got != expected]

        def show(got: tuple[str, str] | None) -> str:
            return "accepted it" if got is None else f"{got[0]} at {got[1]!r}"

        return Failure(
            ir.name,
            "invalid",
            struct.name,
            f"{case.op}: {case.name}",
            " and ".join(wrong),
            f"{' and '.join(wrong)} answer{'s' if len(wrong) == 1 else ''} differently "
            "from docs/conformance.md",
            case.field,
            [
                f"expected: {case.code} at {case.field!r}",
                f"python:   {show(py)}",
                f"{self.lang + ':':<9} {show(theirs)}"
                + (f"  ({error.get('message')})" if isinstance(error, dict) else ""),
            ],
        )

    # -- 7. the shm column layout ---------------------------------------------------------------

    def check_columns(self, ir: SchemaIR, codecs: Schema, result: SchemaResult) -> None:
        """A schema whose IR has ``shm.layout`` "columns" (others: nothing to check): the
        testee lays k generated request and result records into a column region's columns area
        (k in 1, 3, 8 and the seats); its answer must equal Python's byte for byte."""
        env, shm = ir.env, ir.shm
        if env is None or shm is None or not shm.columns:
            return
        count = result.checks.setdefault("columns", Count())
        sizes = column_slots(env.seats)
        for k in sizes:
            seed = _seed_for(self.options.seed, ir.name, "columns", k)
            requests = [codecs[env.request].encode(v) for v in generate(ir, env.request, k, seed)]
            results = [codecs[env.result].encode(v) for v in generate(ir, env.result, k, seed + 1)]
            expected = column_answer(codecs, k, requests, results)
            answer = self.testee.request(
                {
                    "op": "columns",
                    "schema": ir.name,
                    "slots": k,
                    "requests": requests,
                    "results": results,
                }
            )
            failure = self._compare_columns(ir, codecs, k, expected, answer)
            count.add(f"k={k}", failure is None)
            if failure is not None:
                failure.case = f"{k} slots (seed {seed})"
                result.fail(failure)
        self.line(ir.name, "columns", f"k in {', '.join(map(str, sizes))}", count)

    def _compare_columns(
        self, ir: SchemaIR, codecs: Schema, k: int, expected: dict[str, Any], answer: Any
    ) -> Failure | None:
        def fail(summary: str, details: list[str], field: str = "") -> Failure:
            return Failure(ir.name, "columns", "", "", self.lang, summary, field, details)

        if not isinstance(answer, dict) or not answer.get("ok"):
            return fail(f"the testee refused the columns op: {answer!r}"[:300], [])
        for key in ("region_size", "offsets"):
            if answer.get(key) != expected[key]:
                return fail(
                    f"{key} differs",
                    [f"python: {expected[key]!r}", f"{self.lang}: {answer.get(key)!r}"],
                )
        area = answer.get("area")
        if not isinstance(area, bytes):
            return fail("the answer has no area bytes", [])
        at = first_diff_offset(expected["area"], area)
        if at is None:
            return None
        offset = at + min(expected["offsets"].values())  # the region offset of that byte
        owner, env_index = "(padding)", -1
        for column in shm_columns(ir, k)[0]:
            if column.start <= offset < column.end(k):
                owner = column.key
                env_index = (offset - column.start) // column.field.size
        return fail(
            f"the columns area differs at region byte {offset} ({owner}, env {env_index})",
            [
                f"python: {len(expected['area'])} bytes",
                f"{self.lang}: {len(area)} bytes",
            ],
            owner,
        )

    @staticmethod
    def _struct_counts(ir: SchemaIR, count: Count) -> str:
        n = len(ir.structs)
        sizes = {v[0] + v[1] for v in count.structs.values()}
        per = f" x {sizes.pop()}" if len(sizes) == 1 else ""
        return f"{n} structs{per}"


def run(
    options: Options, testee: TesteeProcess, out: TextIO | None = None
) -> tuple[list[SchemaResult], float]:
    started = time.perf_counter()
    runner = Runner(options, testee, (lambda s: print(s, file=out, flush=True)) if out else None)
    try:
        results = runner.run()
    except TesteeError:
        raise
    return results, time.perf_counter() - started
