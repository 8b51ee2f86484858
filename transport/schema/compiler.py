"""Schema compiler front end: a TOML schema file -> validated layout IR.

Every error is a ``SchemaError`` whose one-line message names the file, the struct and the
field. The file format is documented in ``docs/schema.md``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

from transport.errors import SchemaError
from transport.schema import rules
from transport.schema.ir import (
    BOUNDED_ROLES,
    COLUMNS,
    INTEGER_RANGES,
    MULTI_ROLES,
    ROLES,
    SCALARS,
    SLOT_TEXTS,
    SLOT_WORDS,
    Bound,
    EnumIR,
    EnvIR,
    ErrorSpecIR,
    FieldIR,
    MessageIR,
    SchemaIR,
    ShmIR,
    StructIR,
    ir_from_json,
)

_NAME = rules.NAME_PATTERN
_TYPE = re.compile(r"\A([A-Za-z_][A-Za-z0-9_]*)(?:\[ *(-?[0-9]+(?: *, *-?[0-9]+)*) *\])?\Z")
"""A type: ``f32``, ``f32[612]``, or a multi-dimensional ``f32[2,5,5]`` (row-major). ASCII
digits only (``\\d`` would take ``f32[٨]``), spaces only inside the brackets (``u8[ 3 , 2 ]`` is
``u8[3,2]``), none around the type."""
_LAYOUTS = ("packed", "natural")
_TAILS = ("msgpack", "utf8")
_JS_SAFE = 2**53 - 1
_FLOAT_MAX = {"f32": float.fromhex("0x1.fffffep+127"), "f64": sys.float_info.max}
"""The largest finite value of each float type (a bound beyond it does not fit the field)."""

_SCHEMA_KEYS = {"name", "version", "layout"}
_STRUCT_KEYS = {"layout", "size", "fields", "doc"}
_FIELD_KEYS = {"name", "type", "offset", "role", "doc", "low", "high", "allow_nonfinite"}
_ENUM_KEYS = {"type", "values", "doc"}
_MESSAGE_KEYS = {"id", "body", "tail", "batch", "doc"}
_ENV_KEYS = {"result", "request", "seats", "shm", "max_frames", "stall_requests"}
_PROFILE_KEYS = {"control", "slot", "final"}
_ERROR_KEYS = {"http", "closes"}
_TOP_KEYS = {"schema", "structs", "enums", "messages", "env", "shm_profile", "errors", "http"}
PLACEHOLDERS = ("$result", "$request", "$multi_request", "$multi_result")
"""Message bodies the envelope leaves to each env schema: its [env] structs."""
_METHOD = re.compile(r"\A[a-z][a-z0-9_]{0,63}\Z")

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schema"
"""The project's schema folder: the protocol envelope and the shm layout profiles live here."""
ENVELOPE_FILE = SCHEMA_DIR / "protocol.toml"
"""The protocol envelope merged into every env schema (docs/schema.md, "The env protocol")."""

CACHE_LINE = 64
"""Alignment of the parts of a derived shm slot (and of slot and final-area sizes)."""
ENV_DEFAULTS = {"result": "StepResult", "request": "StepRequest", "seats": 8}
MULTI_REQUEST, MULTI_RESULT = "StepMultiRequest", "StepMultiResult"
SHM_CONTROL, SHM_SLOT, SHM_FINAL = "ShmControl", "ShmSlot", "ShmFinal"
_ACTION_TYPES = ("u8", "u16", "u32", "i8", "i16", "i32")
_FLOAT_ACTION_TYPES = ("f32", "f64")
_INTEGERS = "u8, u16, u32, u64, i8, i16, i32, i64"
_FLAG = (frozenset({"bool", "int"}), False, f"one bool or integer flag (bool, {_INTEGERS})")
_ROLE_TYPES: dict[str, tuple[frozenset[str], bool, str]] = {
    "reward": (frozenset({"int", "float"}), False, f"one float or integer (f32, f64, {_INTEGERS})"),
    "done": _FLAG,
    "terminated": _FLAG,
    "truncated": _FLAG,
    "action_mask": (
        frozenset({"bool", "int"}),
        True,
        f"a bool or integer array, one flag per action (bool[N], or an array of {_INTEGERS})",
    ),
}
"""The element kinds each result role takes, whether it is an array, and the types its refusal
names (docs/schema.md, "Roles"): a reward is one number, an episode flag one bool or integer (on
a float, 0.5 would end the episode), an action mask a bool or integer array. ``observation``,
``action``, ``frames`` and ``events`` are checked elsewhere."""
ERROR_TEXT_SIZE, INFO_SIZE = 1024, 256
_SLOT_TEXT: tuple[tuple[str, str], ...] = tuple(
    zip(SLOT_TEXTS, (f"u8[{ERROR_TEXT_SIZE}]", f"u8[{INFO_SIZE}]"), strict=True)
)
"""The text areas after a derived slot's result: the error text and the server's info map."""


MAX_SCHEMA_FILE_BYTES = 4 << 20
"""The largest schema file read (4 MiB; the project's largest is under 10 KB): a bigger file, or
one that keeps growing (``/dev/zero`` through a link), is refused before it exhausts memory."""


def load_schema(path: str | Path) -> SchemaIR:
    """Parse and validate a schema file, returning its layout IR: TOML, or a compiled IR
    (``.json``, what ``transport-schema inspect --json`` prints; the Node loader takes both)."""
    path = Path(path)
    text = _read(path)
    if path.suffix.lower() == ".json":
        return _ir_of_json(text, path)
    if path.suffix.lower() in _MODULE_SUFFIXES:
        raise SchemaError(
            f"a generated {_MODULE_SUFFIXES[path.suffix.lower()]} module, not a schema file: pass "
            "the .toml it was generated from, or its IR (transport-schema inspect FILE.toml "
            "--json > FILE.json); in code, import the module and pass its SCHEMA",
            file=_short_path(path),
        )
    return compile_schema(text, str(path))


_MODULE_SUFFIXES = {
    ".py": "Python",
    ".js": "JavaScript",
    ".cjs": "JavaScript",
    ".mjs": "JavaScript",
    ".ts": "TypeScript",
}
"""What ``transport-schema compile`` writes: code, which ``load_schema`` does not run."""


def _ir_of_json(text: str, path: Path) -> SchemaIR:
    """A compiled IR file, refused unless it loads and hashes to the fingerprint it names."""
    where = _short_path(path)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SchemaError(f"not JSON: {exc}", file=where) from None
    except RecursionError:
        raise SchemaError("not JSON: nested too deeply", file=where) from None
    try:
        return ir_from_json(data, require_fingerprint=True)
    except ValueError as exc:  # the IR's rules (transport/schema/ir.py), one line
        raise SchemaError(str(exc), file=where) from None


def _kind(mode: int) -> str:
    """What a non-regular file is, in the words of the refusal."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _check_stat(info: os.stat_result, path: Path) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _kind(info.st_mode)
        what = kind if kind.startswith("not ") else f"not a regular file ({kind})"
        raise SchemaError(f"cannot read schema: {what}", file=_short_path(path))
    if info.st_size > MAX_SCHEMA_FILE_BYTES:
        raise SchemaError(
            f"cannot read schema: {info.st_size} bytes, over the {MAX_SCHEMA_FILE_BYTES}-byte "
            "limit of a schema file",
            file=_short_path(path),
        )


def check_schema_file(path: Path) -> None:
    """Refuse, without opening it, what is not a readable schema file: a missing path, a
    directory, a FIFO, a device, a socket, or a file over ``MAX_SCHEMA_FILE_BYTES``."""
    try:
        info = os.stat(path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SchemaError(f"cannot read schema: {reason}", file=_short_path(path)) from exc
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise SchemaError(f"cannot read schema: {exc}", file=_short_path(path)) from exc
    _check_stat(info, path)


def _read(path: Path) -> str:
    """A schema file's text; an unreadable, non-regular, oversized or non-UTF-8 file is a
    SchemaError. Opened non-blocking, so a FIFO without a writer cannot hang the caller; the
    type and size are checked on the open file, and at most the cap plus one byte is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SchemaError(f"cannot read schema: {reason}", file=_short_path(path)) from exc
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise SchemaError(f"cannot read schema: {exc}", file=_short_path(path)) from exc
    try:
        _check_stat(os.fstat(fd), path)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SCHEMA_FILE_BYTES:
            chunk = os.read(fd, MAX_SCHEMA_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SchemaError(f"cannot read schema: {reason}", file=_short_path(path)) from exc
    finally:
        os.close(fd)
    if size > MAX_SCHEMA_FILE_BYTES:
        raise SchemaError(
            f"cannot read schema: over the {MAX_SCHEMA_FILE_BYTES}-byte limit of a schema file",
            file=_short_path(path),
        )
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(
            f"not UTF-8 text (byte {exc.start}: {exc.reason})", file=str(path)
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as read_text


def _short_path(path: Path) -> str:
    text = repr(str(path))[1:-1]
    return text if len(text) <= 200 else text[:100] + "..." + text[-40:]


def _parse(text: str, file: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SchemaError(f"invalid TOML: {exc}", file=file) from exc
    except RecursionError as exc:
        raise SchemaError("invalid TOML: nested too deeply", file=file) from exc


def compile_schema(text: str, file: str = "<schema>") -> SchemaIR:
    """Compile schema source text; ``file`` is only used in error messages."""
    doc = _parse(text, file)
    try:
        return _Compiler(doc, file).run()
    except RecursionError as exc:  # a safety net: the rules bound every nesting
        raise SchemaError("the schema nests too deeply", file=file) from exc


class _Compiler:
    def __init__(self, doc: dict[str, Any], file: str) -> None:
        self.doc = doc
        self.file = file
        self.enums: dict[str, EnumIR] = {}
        self.raw_structs: dict[str, dict[str, Any]] = {}
        self.structs: dict[str, StructIR] = {}
        self.in_progress: list[str] = []
        self.default_layout = "packed"

    def error(self, message: str, struct: str = "", field: str = "") -> SchemaError:
        return SchemaError(message, file=self.file, struct=struct, field=field)

    def run(self) -> SchemaIR:
        if (k := _unknown_key(self.doc, _TOP_KEYS)) is not None:
            raise self.error(f"unknown top-level table {k!r}")
        head = self._table(self.doc.get("schema"), "[schema]")
        if (k := _unknown_key(head, _SCHEMA_KEYS)) is not None:
            raise self.error(f"unknown key {k!r} in [schema]")
        name = head.get("name")
        if (rule := rules.check_schema_name(name, envelope="errors" in self.doc)) is not None:
            raise self.error(f"[schema] name {_shown(name)}: {rule}")
        assert isinstance(name, str)  # check_schema_name refuses anything else
        version = head.get("version", 1)
        if rules.check_number(version, "version") is not None:
            raise self.error("[schema] version must be a non-negative integer")
        layout = head.get("layout", "packed")
        if layout not in _LAYOUTS:
            raise self.error(f"[schema] layout must be one of {', '.join(_LAYOUTS)}")
        self.default_layout = layout

        raw_env = self.doc.get("env")
        envelope = _envelope() if raw_env is not None else None

        for enum_name, body in self._table(self.doc.get("enums", {}), "[enums]").items():
            self.enums[enum_name] = self._enum(enum_name, body)
        self.raw_structs = self._table(self.doc.get("structs", {}), "[structs]")
        if envelope is not None:
            self._merge_envelope(*envelope)
        for struct_name in self.raw_structs:
            if struct_name in self.enums:
                raise self.error("name is used by an enum too", struct=struct_name)
            self._struct(struct_name)
        if not self.structs:
            raise self.error("the schema declares no structs")
        self._check_profile_table()
        env: EnvIR | None = None
        shm: ShmIR | None = None
        is_envelope = "errors" in self.doc
        raw_messages = self._table(self.doc.get("messages", {}), "[messages]")
        bodies: dict[str, str] = {}
        if envelope is not None:
            if is_envelope or "http" in self.doc:
                raise self.error("[errors] and [http] belong to the protocol envelope only")
            env, shm = self._env(raw_env)
            bodies = {
                "$result": env.result,
                "$request": env.request,
                "$multi_request": env.multi_request,
                "$multi_result": env.multi_result,
            }
            raw_messages = self._merge_envelope_messages(envelope[0], raw_messages)
        messages = self._messages(raw_messages, bodies, placeholders=is_envelope)
        errors, http = self._envelope_tables(messages) if is_envelope else (None, None)
        if not is_envelope and "http" in self.doc:
            raise self.error("[http] needs an [errors] table: both belong to the protocol envelope")
        ordered = {n: self.structs[n] for n in self.raw_structs}  # declared, merged, derived
        self._check_generated_names(ordered)
        return SchemaIR(
            name,
            version,
            ordered,
            self.enums,
            messages,
            source=self.file,
            env=env,
            shm=shm,
            errors=errors,
            http=http,
        )

    def _check_generated_names(self, structs: dict[str, StructIR]) -> None:
        """No struct or enum name equals a name the TypeScript emitter derives from another."""
        taken = {**{n: "enum" for n in self.enums}, **{n: "struct" for n in structs}}
        for owner, suffixes in (("struct", rules.STRUCT_SUFFIXES), ("enum", rules.ENUM_SUFFIXES)):
            for name in (n for n, kind in taken.items() if kind == owner):
                for suffix in suffixes:
                    if (derived := name + suffix) in taken:
                        raise self.error(
                            f"{taken[derived]} {derived} clashes with the generated name "
                            f"{derived} of {owner} {name}"
                        )

    # -- the env protocol ---------------------------------------------------------------------

    def _merge_envelope(self, raw: dict[str, Any], envelope: SchemaIR) -> None:
        """Add the envelope's enums and structs to this schema; a user may not redeclare them."""
        where = f"the protocol envelope ({ENVELOPE_FILE.name})"
        for name, enum in envelope.enums.items():
            if name in self.enums:
                raise self.error(f"enum {name} is declared by {where}: remove it from this schema")
            self.enums[name] = enum
        for name, struct in envelope.structs.items():
            if name in self.raw_structs:
                raise self.error(f"declared by {where}: remove it from this schema", struct=name)
            body = dict(raw["structs"][name])
            body["layout"] = struct.layout  # the envelope's default layout, not this schema's
            self.raw_structs[name] = body

    def _merge_envelope_messages(
        self, envelope: dict[str, Any], own: dict[str, Any]
    ) -> dict[str, Any]:
        """The envelope's messages, then this schema's own (new names and ids only)."""
        merged: dict[str, Any] = dict(self._table(envelope.get("messages", {}), "[messages]"))
        ids = {body["id"]: name for name, body in merged.items()}
        for name, body in own.items():
            if name in merged:
                raise self.error(
                    f"message {_shown(name)}: declared by the protocol envelope "
                    f"({ENVELOPE_FILE.name}): remove it from this schema"
                )
            mid = body.get("id") if isinstance(body, dict) else None
            if mid in ids:
                raise self.error(
                    f"message {_shown(name)}: id {mid:#04x} is used by the envelope's {ids[mid]}"
                )
            merged[name] = body
        return merged

    def _envelope_tables(
        self, messages: dict[str, MessageIR]
    ) -> tuple[dict[str, ErrorSpecIR], dict[str, str]]:
        """The envelope's [errors] (one entry per ErrorCode) and [http] (method -> request)."""
        codes = self.enums.get("ErrorCode")
        if codes is None:
            raise self.error("[errors] needs an enum ErrorCode")
        table = self._table(self.doc.get("errors"), "[errors]")
        errors: dict[str, ErrorSpecIR] = {}
        for code in codes.values:
            spec = table.get(code)
            where = f"[errors] {code}"
            if not isinstance(spec, dict):
                raise self.error(f"{where}: every ErrorCode needs {{ http = STATUS }}")
            if (k := _unknown_key(spec, _ERROR_KEYS)) is not None:
                raise self.error(f"{where}: unknown key {k!r}")
            status, closes = spec.get("http"), spec.get("closes", False)
            if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
                raise self.error(f"{where}: http must be an HTTP status 100..599")
            if not isinstance(closes, bool):
                raise self.error(f"{where}: closes must be true or false")
            errors[code] = ErrorSpecIR(code, status, closes)
        if (k := _unknown_key(table, set(codes.values))) is not None:
            raise self.error(f"[errors] {_shown(k)}: not a value of enum ErrorCode")
        http: dict[str, str] = {}
        for method, message in self._table(self.doc.get("http", {}), "[http]").items():
            if not _METHOD.match(method):
                raise self.error(f"[http] {_shown(method)}: a method is lower_case")
            if message not in messages:
                raise self.error(f"[http] {method}: {message!r} is not a message of this schema")
            http[method] = message
        return errors, http

    def _env(self, raw: Any) -> tuple[EnvIR, ShmIR]:
        """Check the [env] table, derive the multi-seat structs and the shm layout."""
        table = self._table(raw, "[env]")
        if (k := _unknown_key(table, _ENV_KEYS)) is not None:
            raise self.error(f"unknown key {k!r} in [env]")
        for reserved in (SHM_SLOT, SHM_FINAL):
            if reserved in self.structs:
                raise self.error(
                    "is reserved for the shm layout the compiler derives", struct=reserved
                )
        names: dict[str, str] = {}
        for key in ("result", "request"):
            value = table.get(key, ENV_DEFAULTS[key])
            if not isinstance(value, str) or value not in self.structs:
                raise self.error(f"[env] {key} = {value!r} is not a struct of this schema")
            names[key] = value
        seats = table.get("seats", ENV_DEFAULTS["seats"])
        if not isinstance(seats, int) or isinstance(seats, bool) or not 1 <= seats <= 1024:
            raise self.error(f"[env] seats must be an integer 1..1024, not {seats!r}")
        result, request = self.structs[names["result"]], self.structs[names["request"]]
        if result.name == request.name:
            raise self.error("[env] result and request must be different structs")
        for f in result.fields:
            if f.name in rules.STEP_VIEW_NAMES:
                raise self.error(
                    f"{f.name!r} is an attribute of the client's step result (StepView): rename "
                    "the field of the [env] result struct",
                    result.name,
                    f.name,
                )
        action = request.role("action")
        if action is None:
            raise self.error(
                'the [env] request struct needs a field with role "action"', struct=request.name
            )
        self._check_action(request, action)
        dims = ",".join(str(d) for d in (seats, *action.dims))
        multi_request = self._multi(
            MULTI_REQUEST, "actions", f"{action.elem}[{dims}]", "action", seats, action.size
        )
        multi_result = self._multi(
            MULTI_RESULT, "results", f"{result.name}[{seats}]", None, seats, result.size
        )
        max_frames, stall_requests = self._decision_runs(table, result)
        env = EnvIR(
            result.name,
            request.name,
            multi_request,
            multi_result,
            seats,
            max_frames,
            stall_requests,
        )

        profile = table.get("shm")
        control = self.structs[SHM_CONTROL]
        if profile is None:
            shm = self._derived_shm(request, result)
        elif profile == COLUMNS:  # a reserved built-in layout, never a file lookup
            shm = self._columns_shm(result)
        elif isinstance(profile, str) and _NAME.match(profile):
            shm = self._profile_shm(profile, request, result, control)
        else:
            raise self.error(
                f'[env] shm must name a layout profile schema or be "{COLUMNS}", not {profile!r}'
            )
        return env, shm

    def _check_action(self, request: StructIR, action: FieldIR) -> None:
        """The action kinds a server carries: one 8-32 bit integer (Discrete), an array of them
        with a declared ``high`` (MultiDiscrete), or an f32/f64 array (Box). Not an enum: the
        servers would not agree on its space (its members, or its type's whole range)."""
        if action.kind == "enum":
            raise self.error(
                f"the action cannot be an enum ({action.type}): declare its integer type "
                f"({self.enums[action.elem].type}) instead",
                request.name,
                action.name,
            )
        scalar = action.elem
        if len(action.dims) >= rules.MAX_DIMS:  # the multi-seat request adds the seat axis
            raise self.error(
                f"an action array has at most {rules.MAX_DIMS - 1} dimensions (the multi-seat "
                f"request adds one), not {len(action.dims)}",
                request.name,
                action.name,
            )
        if not action.is_array:
            if scalar not in _ACTION_TYPES:
                raise self.error(
                    f"the action must be one 8-32 bit integer ({', '.join(_ACTION_TYPES)}), an "
                    f"integer array with high (MultiDiscrete) or an f32/f64 array (Box), not "
                    f"{action.type}",
                    request.name,
                    action.name,
                )
            if action.low is not None or action.high is not None:
                raise self.error(
                    "a Discrete action (one integer) takes its range from the env's spaces(): "
                    "declare no low/high",
                    request.name,
                    action.name,
                )
            return
        if action.kind == "int" and scalar in _ACTION_TYPES:
            if action.high is None:
                raise self.error(
                    "an integer array action (MultiDiscrete) needs high = N or [N1, N2, ...] "
                    "(inclusive; low defaults to 0)",
                    request.name,
                    action.name,
                )
            return
        if action.kind == "float" and scalar in _FLOAT_ACTION_TYPES:
            return
        raise self.error(
            f"an array action must be of {', '.join(_ACTION_TYPES)} (MultiDiscrete) or "
            f"{', '.join(_FLOAT_ACTION_TYPES)} (Box), not {action.type}",
            request.name,
            action.name,
        )

    def _check_role_type(
        self, struct: str, fname: str, role: str, kind: str, is_array: bool, type_str: str
    ) -> None:
        """A field's type fits its role (``_ROLE_TYPES``): a reward is one number, an episode
        flag one bool or integer, an action mask a bool or integer array."""
        rule = _ROLE_TYPES.get(role)
        if rule is None:
            return
        kinds, array, takes = rule
        if kind not in kinds or is_array != array:
            raise self.error(f"role {role!r} takes {takes}, not {type_str}", struct, fname)

    def _bound(
        self,
        raw: dict[str, Any],
        key: str,
        struct: str,
        fname: str,
        role: str | None,
        elem: str,
        kind: str,
        count: int,
    ) -> Bound | None:
        """A field's ``low`` / ``high``: a finite number, or one per element; integers for an
        integer field, inside its type's range."""
        value = raw.get(key)
        if value is None:
            return None
        if role not in BOUNDED_ROLES or kind not in ("int", "float"):
            raise self.error(
                f"{key} applies to an integer or float field with role 'observation' or "
                "'action' only",
                struct,
                fname,
            )
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(values) != count:
            raise self.error(
                f"{key} has {len(values)} values; the field has {count} elements",
                struct,
                fname,
            )
        texts: list[str] = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise self.error(f"{key} must be a number or a list of numbers", struct, fname)
            if kind == "int":
                if not isinstance(v, int):
                    raise self.error(f"{key} of an integer field must be integers", struct, fname)
                lo, hi = INTEGER_RANGES[elem]
                if not lo <= v <= hi:
                    raise self.error(f"{key} {v} does not fit {elem}", struct, fname)
                texts.append(str(v))
            else:
                if isinstance(v, float) and not math.isfinite(v):
                    raise self.error(
                        f"{key} must be finite (omit it for an unbounded field)", struct, fname
                    )
                if abs(v) > _FLOAT_MAX[elem]:  # an int compares exactly, however large
                    shown = v if isinstance(v, float) else rules.short_number(v)
                    raise self.error(
                        f"{key} {shown} does not fit {elem} (finite values of magnitude at "
                        f"most {_FLOAT_MAX[elem]!r})",
                        struct,
                        fname,
                    )
                texts.append(repr(float(v)))
        return tuple(texts) if isinstance(value, list) else texts[0]

    def _decision_runs(self, table: dict[str, Any], result: StructIR) -> tuple[int | None, ...]:
        """[env] max_frames / stall_requests (decision-boundary runs): positive integers, and
        the result struct then needs a u32 field with role "frames"."""
        values: list[int | None] = []
        for key in ("max_frames", "stall_requests"):
            value = table.get(key)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**32
            ):
                raise self.error(f"[env] {key} must be an integer 1..2**32-1, not {value!r}")
            values.append(value)
        frames = result.role("frames")
        if any(v is not None for v in values) and frames is None:
            raise self.error(
                '[env] max_frames / stall_requests need a result field with role "frames"',
                struct=result.name,
            )
        if frames is not None and (frames.elem != "u32" or frames.is_array):
            raise self.error('role "frames" needs type u32', result.name, frames.name)
        events = result.role("events")
        if events is not None and (not events.is_array or events.kind != "int"):
            raise self.error('role "events" needs an integer array', result.name, events.name)
        return values[0], values[1]

    def _multi(
        self, name: str, field: str, type_str: str, role: str | None, seats: int, per_seat: int
    ) -> str:
        """A multi-seat struct: checked when the schema declares it, else derived (``seats`` x
        ``per_seat`` bytes, refused in words that say so when over a struct's limit)."""
        if name not in self.structs:
            if seats * per_seat > rules.MAX_STRUCT_SIZE:
                per = type_str.split("[", 1)[0]
                what = (
                    f"{per} of {per_seat} bytes"
                    if per in self.structs
                    else f"action of {per_seat} bytes"
                )
                raise self.error(
                    f"the derived STEP_MULTI body ([env] seats x {what}: {seats} x {per_seat} = "
                    f"{seats * per_seat} bytes) is over the {rules.MAX_STRUCT_SIZE}-byte limit "
                    f"of a struct: set [env] seats to at most {rules.MAX_STRUCT_SIZE // per_seat}, "
                    f"or make the {'result' if per in self.structs else 'action'} smaller",
                    struct=name,
                )
            fields: dict[str, Any] = {"name": field, "type": type_str}
            if role is not None:
                fields["role"] = role
            self.raw_structs[name] = {"fields": [fields]}
            self._struct(name)
            return name
        declared = self.structs[name]
        if len(declared.fields) != 1 or declared.fields[0].type != type_str:
            found = ", ".join(f"{f.name}: {f.type}" for f in declared.fields)
            raise self.error(
                f"must have one field of type {type_str} ([env] seats = {seats}), not {found}",
                struct=name,
            )
        if role is not None and declared.fields[0].role != role:
            raise self.error(f"needs role {role!r}", name, declared.fields[0].name)
        return name

    def _derived_shm(self, request: StructIR, result: StructIR) -> ShmIR:
        """The derived layout: control words in the first cache line, then the request, the
        result and the text areas, each at a cache-line boundary."""
        words = [{"name": n, "type": t} for n, t in SLOT_WORDS]
        request_at = CACHE_LINE
        result_at = _round_up(request_at + request.size, CACHE_LINE)
        text_at = _round_up(result_at + result.size, CACHE_LINE)
        texts: list[dict[str, Any]] = [{"name": n, "type": t} for n, t in _SLOT_TEXT]
        texts[0]["offset"] = text_at
        text_end = text_at + ERROR_TEXT_SIZE + INFO_SIZE
        self.raw_structs[SHM_SLOT] = {
            "layout": "natural",
            "size": _round_up(text_end, CACHE_LINE),
            "fields": [
                *words,
                {"name": "request", "type": request.name, "offset": request_at},
                {"name": "result", "type": result.name, "offset": result_at},
                *texts,
            ],
        }
        final_result_at = self._derived_final(result)
        return ShmIR(
            "derived",
            SHM_CONTROL,
            SHM_SLOT,
            SHM_FINAL,
            {f.name: request_at + f.offset for f in request.fields},
            {f.name: result_at + f.offset for f in result.fields},
            {f.name: final_result_at + f.offset for f in result.fields},
        )

    def _derived_final(self, result: StructIR) -> int:
        """The derived final area (``final_seq`` u32, the result at the second cache line) and
        the slot just laid out become structs; returns the result's offset in the final area."""
        final_result_at = CACHE_LINE
        self.raw_structs[SHM_FINAL] = {
            "layout": "natural",
            "size": _round_up(final_result_at + result.size, CACHE_LINE),
            "fields": [
                {"name": "final_seq", "type": "u32"},
                {"name": "result", "type": result.name, "offset": final_result_at},
            ],
        }
        self._struct(SHM_SLOT)
        self._struct(SHM_FINAL)
        return final_result_at

    def _columns_shm(self, result: StructIR) -> ShmIR:
        """The column layout (``[env] shm = "columns"``): a slot of control words and text areas
        only (the derived slot's words, error text at 64, info after it), the derived final
        area; the request and result fields live in columns after the final areas
        (``shm_columns``), so the slot offset maps are empty."""
        words = [{"name": n, "type": t} for n, t in SLOT_WORDS]
        texts: list[dict[str, Any]] = [{"name": n, "type": t} for n, t in _SLOT_TEXT]
        texts[0]["offset"] = CACHE_LINE
        self.raw_structs[SHM_SLOT] = {
            "layout": "natural",
            "size": _round_up(CACHE_LINE + ERROR_TEXT_SIZE + INFO_SIZE, CACHE_LINE),
            "fields": [*words, *texts],
        }
        final_result_at = self._derived_final(result)
        return ShmIR(
            COLUMNS,
            SHM_CONTROL,
            SHM_SLOT,
            SHM_FINAL,
            {},
            {},
            {f.name: final_result_at + f.offset for f in result.fields},
            COLUMNS,
        )

    def _profile_shm(
        self, profile: str, request: StructIR, result: StructIR, control: StructIR
    ) -> ShmIR:
        """An explicit layout profile (a schema file beside this one with a [shm_profile]
        table): its structs become ShmControl/ShmSlot/ShmFinal, the request and result fields
        are found in its slot (and final area) by name and type."""
        where = (
            f"[env] shm = {profile!r}" if len(profile) <= 80 else f"[env] shm = {_shown(profile)}"
        )
        if (rule := rules.check_name(profile)) is not None:
            raise self.error(f"{where}: {rule}")
        candidates = [_schema_dir(self.file) / f"{profile}.toml", SCHEMA_DIR / f"{profile}.toml"]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            raise self.error(f"{where}: no layout profile {candidates[0]}")
        pdoc = _parse(_read(path), str(path))
        if "env" in pdoc:
            raise self.error(f"{where}: {path.name} is an env schema, not a layout profile")
        pir = _Compiler(pdoc, str(path)).run()
        names = pdoc.get("shm_profile")
        if not isinstance(names, dict):
            raise self.error(f"{where}: {path} has no [shm_profile] table")
        p_control = pir.structs[names["control"]]
        p_slot = pir.structs[names["slot"]]
        p_final = pir.structs[names["final"]]
        if p_control.to_json() != control.to_json():
            raise self.error(
                f"{where}: its control block {p_control.name} differs from the envelope's "
                f"{SHM_CONTROL} (field names, types and offsets must be the same)"
            )
        self._check_slot_words(where, p_slot)
        if not p_final.fields or (p_final.fields[0].name, p_final.fields[0].type) != (
            "final_seq",
            "u32",
        ):
            raise self.error(f"{where}: the final area must start with final_seq: u32")
        request_offsets = self._carried(where, p_slot, request)
        result_offsets = self._carried(where, p_slot, result)
        final_offsets = self._carried(where, p_final, result)
        for name, p_struct in ((SHM_SLOT, p_slot), (SHM_FINAL, p_final)):
            self.raw_structs[name] = _raw_struct(p_struct)
            self._struct(name)
        return ShmIR(
            profile,
            SHM_CONTROL,
            SHM_SLOT,
            SHM_FINAL,
            request_offsets,
            result_offsets,
            final_offsets,
        )

    def _check_slot_words(self, where: str, slot: StructIR) -> None:
        by_name = {f.name: f for f in slot.fields}
        for name, type_str in (*SLOT_WORDS, *_SLOT_TEXT):
            f = by_name.get(name)
            want = type_str.split("[")[0]
            if f is None or f.elem != want or f.is_array != ("[" in type_str):
                raise self.error(
                    f"{where}: its slot {slot.name} needs a field {name} of type {type_str}"
                )

    def _carried(self, where: str, host: StructIR, struct: StructIR) -> dict[str, int]:
        """Offsets in ``host`` of every field of ``struct`` (same name, same type)."""
        by_name = {f.name: f for f in host.fields}
        out: dict[str, int] = {}
        for f in struct.fields:
            found = by_name.get(f.name)
            if found is None:
                raise self.error(
                    f"{where}: its {host.name} has no field {f.name}", struct.name, f.name
                )
            if found.type != f.type or found.kind != f.kind:
                raise self.error(
                    f"{where}: {f.type} here, {found.type} in its {host.name}",
                    struct.name,
                    f.name,
                )
            out[f.name] = found.offset
        return out

    def _check_profile_table(self) -> None:
        """``[shm_profile]`` marks a schema as a layout profile: it names its three structs."""
        table = self.doc.get("shm_profile")
        if table is None:
            return
        table = self._table(table, "[shm_profile]")
        for key in sorted(_PROFILE_KEYS):
            if table.get(key) not in self.structs:
                raise self.error(f"[shm_profile] {key} must name a struct of this schema")
        if (k := _unknown_key(table, _PROFILE_KEYS)) is not None:
            raise self.error(f"unknown key {k!r} in [shm_profile]")

    def _table(self, value: Any, what: str) -> dict[str, Any]:
        if value is None:
            raise self.error(f"missing {what} table")
        if not isinstance(value, dict):
            raise self.error(f"{what} must be a table")
        return value

    def _enum(self, name: str, body: Any) -> EnumIR:
        where = f"enum {_shown(name)}"
        if (rule := rules.check_type_name(name)) is not None:
            raise self.error(f"{where}: {rule}")
        if not isinstance(body, dict):
            raise self.error(f"{where}: must be a table")
        if (k := _unknown_key(body, _ENUM_KEYS)) is not None:
            raise self.error(f"{where}: unknown key {k!r}")
        base = body.get("type")
        if base not in INTEGER_RANGES:
            raise self.error(f"{where}: type must be an integer scalar, not {base!r}")
        values = body.get("values")
        if not isinstance(values, dict) or not values:
            raise self.error(f"{where}: values must be a non-empty table NAME = integer")
        lo, hi = INTEGER_RANGES[base]
        seen: dict[int, str] = {}
        for key, value in values.items():
            if (rule := rules.check_member_name(key)) is not None:
                raise self.error(f"{where}, value {_shown(key)}: {rule}")
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.error(f"{where}: value {key} must be an integer")
            if not lo <= value <= hi:
                raise self.error(f"{where}: value {key} = {value} does not fit {base}")
            if abs(value) > _JS_SAFE:
                raise self.error(
                    f"{where}: value {key} = {value} is beyond JavaScript's safe integers "
                    f"(-(2**53-1)..2**53-1): TypeScript enum values are numbers"
                )
            if value in seen:
                raise self.error(f"{where}: values {seen[value]} and {key} are both {value}")
            seen[value] = key
        return EnumIR(name, base, dict(values))

    def _struct(self, name: str) -> StructIR:
        if name in self.structs:
            return self.structs[name]
        if name in self.in_progress:
            cycle = " -> ".join([*self.in_progress[self.in_progress.index(name) :], name])
            raise self.error(f"struct contains itself ({cycle})", struct=name)
        if (rule := rules.check_type_name(name)) is not None:
            raise self.error(rule, struct=_shown(name))
        if len(self.in_progress) >= rules.MAX_DEPTH:
            raise self.error(
                f"structs nest more than {rules.MAX_DEPTH} deep ({self.in_progress[0]} -> ...)",
                struct=name,
            )
        body = self.raw_structs[name]
        if not isinstance(body, dict):
            raise self.error("must be a table", struct=name)
        if (k := _unknown_key(body, _STRUCT_KEYS)) is not None:
            raise self.error(f"unknown key {k!r}", struct=name)
        layout = body.get("layout", self.default_layout)
        if layout not in _LAYOUTS:
            raise self.error(f"layout must be one of {', '.join(_LAYOUTS)}", struct=name)
        raw_fields = body.get("fields")
        if not isinstance(raw_fields, list) or not raw_fields:
            raise self.error("fields must be a non-empty array of tables", struct=name)

        self.in_progress.append(name)
        fields: list[FieldIR] = []
        end = 0
        align = 1
        names: set[str] = set()
        roles: set[str] = set()
        for index, raw in enumerate(raw_fields):
            if not isinstance(raw, dict):
                raise self.error(f"field #{index} must be a table", struct=name)
            fname = raw.get("name")
            if not isinstance(fname, str):
                raise self.error(f"field #{index} needs a name", struct=name)
            if (rule := rules.check_field_name(fname)) is not None:
                raise self.error(rule, name, _shown(fname))
            if (k := _unknown_key(raw, _FIELD_KEYS)) is not None:
                raise self.error(f"unknown key {k!r}", name, fname)
            if fname in names:
                raise self.error("duplicate field name", name, fname)
            names.add(fname)
            elem, kind, elem_size, elem_align, count, is_array, type_str, shape = self._field_type(
                name, fname, raw.get("type")
            )
            field_align = 1 if layout == "packed" else elem_align
            offset = raw.get("offset")
            if offset is None:
                offset = _round_up(end, field_align)
            else:
                if (rule := rules.check_number(offset, "offset")) is not None:
                    raise self.error(rule, name, fname)
                if offset < end:
                    prev = fields[-1]
                    raise self.error(
                        f"explicit offset {offset} overlaps field {prev.name} "
                        f"(bytes {prev.offset}..{prev.offset + prev.size - 1})",
                        name,
                        fname,
                    )
                if offset % field_align:
                    raise self.error(
                        f"explicit offset {offset} is not a multiple of its alignment "
                        f"{field_align} (natural layout)",
                        name,
                        fname,
                    )
            role = raw.get("role")
            if role is not None:
                if role not in ROLES:
                    raise self.error(
                        f"unknown role {role!r} (one of {', '.join(ROLES)})", name, fname
                    )
                if role in roles and role not in MULTI_ROLES:
                    raise self.error(f"role {role!r} is already taken", name, fname)
                roles.add(role)
                self._check_role_type(name, fname, role, kind, is_array, type_str)
                if role == "observation" and kind == "struct":
                    raise self.error(
                        f"role 'observation' takes a scalar type or an array of one, not the "
                        f"struct {type_str}: put its fields in {name}, each with role "
                        "'observation' (a gymnasium Dict space)",
                        name,
                        fname,
                    )
            low = self._bound(raw, "low", name, fname, role, elem, kind, count)
            high = self._bound(raw, "high", name, fname, role, elem, kind, count)
            if low is not None and high is not None:
                if isinstance(low, str) and isinstance(high, str):  # one each: one comparison
                    if float(low) > float(high):
                        raise self.error(f"low {low} > high {high} (element 0)", name, fname)
                else:
                    lows, highs = _expand(low, count), _expand(high, count)
                    for i, (lo, hi) in enumerate(zip(lows, highs, strict=True)):
                        if float(lo) > float(hi):
                            raise self.error(f"low {lo} > high {hi} (element {i})", name, fname)
            nonfinite = raw.get("allow_nonfinite", False)
            if not isinstance(nonfinite, bool):
                raise self.error("allow_nonfinite must be true or false", name, fname)
            if nonfinite and (role != "action" or kind != "float"):
                raise self.error(
                    "allow_nonfinite applies to a float field with role 'action' only",
                    name,
                    fname,
                )
            size = elem_size * count
            fields.append(
                FieldIR(
                    fname,
                    type_str,
                    elem,
                    kind,
                    offset,
                    size,
                    count,
                    is_array,
                    elem_size,
                    role,
                    shape,
                    low,
                    high,
                    nonfinite,
                )
            )
            end = offset + size
            if end > rules.MAX_STRUCT_SIZE:
                raise self.error(
                    f"the field ends at byte {end}: a struct holds at most "
                    f"{rules.MAX_STRUCT_SIZE} bytes",
                    name,
                    fname,
                )
            align = max(align, field_align)
        self.in_progress.pop()

        explicit = body.get("size")
        if explicit is None:
            total = _round_up(end, align)
        else:
            if not isinstance(explicit, int) or isinstance(explicit, bool):
                raise self.error("size must be an integer", struct=name)
            if explicit > rules.MAX_STRUCT_SIZE:
                raise self.error(f"size must be at most {rules.MAX_STRUCT_SIZE} bytes", struct=name)
            if explicit < end:
                raise self.error(
                    f"size {explicit} is too small: the fields end at byte {end}",
                    name,
                    fields[-1].name,
                )
            if explicit % align:
                raise self.error(
                    f"size {explicit} is not a multiple of the struct alignment {align}",
                    struct=name,
                )
            total = explicit
        ir = StructIR(name, total, align, layout, tuple(fields))
        self.structs[name] = ir
        return ir

    def _field_type(
        self, struct: str, fname: str, raw: Any
    ) -> tuple[str, str, int, int, int, bool, str, tuple[int, ...] | None]:
        if not isinstance(raw, str):
            raise self.error('type must be a string such as "f32" or "f32[612]"', struct, fname)
        match = _TYPE.match(raw)
        if not match:
            raise self.error(
                f"cannot parse type {raw!r} (a type name, then [N] or [N,M,...] for an array: "
                "ASCII digits, no spaces around the type)",
                struct,
                fname,
            )
        elem, count_text = match.group(1), match.group(2)
        is_array = count_text is not None
        texts = count_text.split(",") if count_text is not None else ["1"]
        for d_text in texts:
            if len(d_text.strip().lstrip("-")) > rules.MAX_DIGITS:
                raise self.error(
                    f"array count has more than {rules.MAX_DIGITS} digits", struct, fname
                )
        if len(texts) > rules.MAX_DIMS:
            raise self.error(
                f"array has {len(texts)} dimensions (at most {rules.MAX_DIMS})", struct, fname
            )
        dims = [int(d) for d in texts]
        for d in dims:
            if d < 1:
                raise self.error(f"array count must be at least 1, not {d}", struct, fname)
            if d > rules.MAX_NUMBER:
                raise self.error(
                    f"array count must be at most {rules.MAX_NUMBER}, not {d}", struct, fname
                )
        count = math.prod(dims)
        if count > rules.MAX_NUMBER:
            raise self.error(
                f"array has {count} elements (at most {rules.MAX_NUMBER})", struct, fname
            )
        shape = tuple(dims) if len(dims) > 1 else None
        if elem in SCALARS:
            size = SCALARS[elem]
            kind = "bool" if elem == "bool" else "float" if elem[0] == "f" else "int"
            elem_align = size
        elif elem in self.enums:
            size = SCALARS[self.enums[elem].type]
            kind, elem_align = "enum", size
        elif elem in self.raw_structs:
            if shape is not None:
                raise self.error(
                    f"{raw!r}: an array of structs has one dimension (nest a struct for more)",
                    struct,
                    fname,
                )
            sub = self._struct(elem)
            size, kind, elem_align = sub.size, "struct", sub.align
        else:
            raise self.error(f"unknown type {elem!r}", struct, fname)
        type_str = f"{elem}[{','.join(map(str, dims))}]" if is_array else elem
        return elem, kind, size, elem_align, count, is_array, type_str, shape

    def _messages(
        self, raw: dict[str, Any], bodies: dict[str, str], *, placeholders: bool
    ) -> dict[str, MessageIR]:
        """``bodies`` replaces the envelope's placeholder bodies ("$result", ...); with
        ``placeholders`` (compiling the envelope itself) they are kept as written."""
        out: dict[str, MessageIR] = {}
        ids: dict[int, str] = {}
        for name, body in raw.items():
            where = f"message {_shown(name)}"
            if (rule := rules.check_member_name(name)) is not None:
                raise self.error(f"{where}: {rule}")
            if not isinstance(body, dict):
                raise self.error(f"{where}: must be a table with id and body")
            if (k := _unknown_key(body, _MESSAGE_KEYS)) is not None:
                raise self.error(f"{where}: unknown key {k!r}")
            mid = body.get("id")
            if not isinstance(mid, int) or isinstance(mid, bool) or not 0 <= mid <= 255:
                raise self.error(f"{where}: id must be an integer 0..255 (the u8 msg_type)")
            if mid in ids:
                raise self.error(f"{where}: id {mid:#04x} is already used by {ids[mid]}")
            ids[mid] = name
            struct = body.get("body")
            if isinstance(struct, str):
                struct = bodies.get(struct, struct)
            is_placeholder = placeholders and struct in PLACEHOLDERS
            if struct is not None and struct not in self.structs and not is_placeholder:
                raise self.error(f"{where}: body {struct!r} is not a struct of this schema")
            tail = body.get("tail")
            if tail not in (None, *_TAILS):
                raise self.error(f"{where}: tail must be one of {', '.join(_TAILS)}")
            batch = body.get("batch", False)
            if not isinstance(batch, bool):
                raise self.error(f"{where}: batch must be true or false")
            if batch and struct is None:
                raise self.error(f"{where}: a batch message needs a body struct")
            out[name] = MessageIR(name, mid, struct, tail, batch)
        return out


def _compile_file(path: Path) -> tuple[dict[str, Any], SchemaIR]:
    """A schema file's TOML document and its IR."""
    doc = _parse(_read(path), str(path))
    return doc, _Compiler(doc, str(path)).run()


def _envelope() -> tuple[dict[str, Any], SchemaIR]:
    """The protocol envelope: its TOML document and its IR. Without the project's schema folder
    (an installed package) the IR embedded in ``transport.generated.protocol`` stands in."""
    if not ENVELOPE_FILE.is_file():
        from transport.generated import protocol  # generated from ENVELOPE_FILE

        ir = ir_from_json(protocol.IR)
        doc: dict[str, Any] = {
            "structs": {n: _raw_struct(s) for n, s in ir.structs.items()},
            "messages": {n: m.to_json() for n, m in ir.messages.items()},
        }
        return doc, ir
    doc, ir = _compile_file(ENVELOPE_FILE)
    if "env" in doc:
        raise SchemaError("the protocol envelope cannot have an [env] table", file=ir.source)
    return doc, ir


def _schema_dir(file: str) -> Path:
    """Where layout profiles are looked up first: beside the schema file (then the project's
    schema folder)."""
    path = Path(file)
    return path.parent if path.is_file() else SCHEMA_DIR


def _raw_struct(struct: StructIR) -> dict[str, Any]:
    """A compiled struct as a [structs] table again, every offset and the size pinned."""
    fields: list[dict[str, Any]] = []
    for f in struct.fields:
        raw: dict[str, Any] = {"name": f.name, "type": f.type, "offset": f.offset}
        if f.role is not None:
            raw["role"] = f.role
        fields.append(raw)
    return {"layout": struct.layout, "size": struct.size, "fields": fields}


def _shown(name: object) -> str:
    """A name for a one-line message: escaped (no newline) and cut short."""
    text = name if isinstance(name, str) else repr(name)
    text = text if rules.NAME_PATTERN.match(text) else repr(text)
    return text if len(text) <= 80 else text[:60] + "..." + f" ({len(text)} characters)"


def _unknown_key(table: dict[str, Any], allowed: set[str]) -> str | None:
    for key in table:
        if key not in allowed:
            return key
    return None


def _expand(bound: Bound, count: int) -> tuple[str, ...]:
    """A bound with one text per element."""
    return (bound,) * count if isinstance(bound, str) else bound


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align
