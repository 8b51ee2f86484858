"""The Python testee: the conformance protocol of docs/conformance.md served by the Python codec.

Run it as ``python -m transport.conformance.testee [--root DIR] [SCHEMA.toml ...]``. It reads
length-prefixed msgpack requests on stdin and answers each on stdout, in order, until stdin
closes or ``{"op": "exit"}`` arrives. The runner uses it to test itself (``transport-conformance
--testee python``); subclass ``Testee`` and override ``encode`` or ``decode`` to simulate a
drifting implementation.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from transport.codec import Schema
from transport.conformance import wire
from transport.conformance.columns import ColumnRequestError, column_answer
from transport.conformance.paths import default_root, schema_files
from transport.conformance.strategies import generate
from transport.errors import CodecError
from transport.schema import load_schema
from transport.schema.ir import SchemaIR, ir_from_json


class RequestError(Exception):
    """A request the testee cannot serve: answered with ``{"ok": false, "error": ...}``."""


def error_of(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, CodecError):
        return {"code": exc.code, "field": exc.field, "message": str(exc)}
    return {"code": "internal", "field": "", "message": f"{type(exc).__name__}: {exc}"}


class Testee:
    """One testee: the schemas it serves and the codec operations behind each request."""

    lang = "python"

    def __init__(self, paths: Sequence[Path]) -> None:
        self.irs: dict[str, SchemaIR] = {}
        self.codecs: dict[str, Schema] = {}
        for path in paths:
            ir = load_schema(path)
            self.irs[ir.name] = ir
            self.codecs[ir.name] = Schema(ir)

    # -- the codec operations (override these to simulate drift) -----------------------------

    def encode(self, schema: str, struct: str, values: Any) -> bytes:
        ir = self.irs[schema]
        return self.codecs[schema][struct].encode(wire.to_codec(ir, struct, values))

    def decode(self, schema: str, struct: str, data: bytes, strict: bool) -> Any:
        values = self.codecs[schema][struct].decode(data, strict=strict)
        return wire.to_wire(self.irs[schema], struct, values)

    def view(self, schema: str, struct: str, data: bytes, at: int) -> Any:
        """``data`` placed at byte ``at`` of a larger buffer, read through a zero-copy view."""
        codec = self.codecs[schema][struct]
        buffer = bytearray(at + len(data))
        buffer[at:] = data
        return wire.to_wire(self.irs[schema], struct, codec.values_of(codec.view(buffer, at)))

    def generate(self, schema: str, struct: str, count: int, seed: int) -> list[Any]:
        ir = self.irs[schema]
        return [wire.to_wire(ir, struct, v) for v in generate(ir, struct, count, seed)]

    def columns(self, schema: str, slots: Any, requests: Any, results: Any) -> dict[str, Any]:
        """The ``columns`` op: the columns area of a k-slot region holding these records."""
        return column_answer(self.codecs[schema], slots, requests, results)

    def fingerprint(self, schema: str) -> tuple[str, str]:
        """``(computed, declared)``: Python has no generated constant, both come from the IR."""
        value = self.irs[schema].fingerprint_hex
        return value, value

    # -- the protocol ----------------------------------------------------------------------

    def _target(self, request: dict[str, Any]) -> tuple[str, str]:
        schema = request.get("schema")
        if schema not in self.irs:
            raise RequestError(f"unknown schema {schema!r}")
        struct = request.get("struct")
        if struct not in self.irs[schema].structs:
            raise RequestError(f"unknown struct {struct!r} in schema {schema}")
        return schema, struct

    def handle(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise RequestError("a request must be a map")
        op = request.get("op")
        if op == "hello":
            return {"ok": True, "lang": self.lang, "schemas": list(self.irs), "load": True}
        if op == "exit":
            return {"ok": True}
        if op == "load":  # a schema from its IR, served from now on (replaces one of its name)
            text = request.get("ir")
            if not isinstance(text, str):
                raise RequestError("ir must be the IR as JSON text")
            try:
                ir = ir_from_json(json.loads(text))
                codecs = Schema(ir)
            except Exception as exc:  # any malformed IR: answered, not a crash
                raise RequestError(f"cannot load the IR: {type(exc).__name__}: {exc}") from None
            self.irs[ir.name] = ir
            self.codecs[ir.name] = codecs
            return {"ok": True, "schema": ir.name}
        if op == "fingerprint":
            schema = request.get("schema")
            if schema not in self.irs:
                raise RequestError(f"unknown schema {schema!r}")
            computed, declared = self.fingerprint(schema)
            return {"ok": True, "computed": computed, "declared": declared}
        if op == "encode":
            schema, struct = self._target(request)
            results: list[dict[str, Any]] = []
            for value in request.get("values", []):
                try:
                    results.append({"bytes": self.encode(schema, struct, value)})
                except Exception as exc:
                    results.append({"error": error_of(exc)})
            return {"ok": True, "results": results}
        if op in ("decode", "roundtrip"):
            schema, struct = self._target(request)
            strict = bool(request.get("strict", True)) if op == "decode" else True
            results = []
            for data in request.get("buffers", []):
                try:
                    values = self.decode(schema, struct, data, strict)
                    if op == "decode":
                        results.append({"values": values})
                    else:
                        results.append(
                            {"values": values, "bytes": self.encode(schema, struct, values)}
                        )
                except Exception as exc:
                    results.append({"error": error_of(exc)})
            return {"ok": True, "results": results}
        if op == "view":
            schema, struct = self._target(request)
            at = request.get("at", 0)
            if not isinstance(at, int) or at < 0:
                raise RequestError("at must be a non-negative integer")
            results = []
            for data in request.get("buffers", []):
                try:
                    results.append({"values": self.view(schema, struct, data, at)})
                except Exception as exc:
                    results.append({"error": error_of(exc)})
            return {"ok": True, "results": results}
        if op == "columns":  # a column-layout shm region's columns area (docs/shm.md)
            schema = request.get("schema")
            if schema not in self.irs:
                raise RequestError(f"unknown schema {schema!r}")
            try:
                return self.columns(
                    schema, request.get("slots"), request.get("requests"), request.get("results")
                )
            except ColumnRequestError as exc:
                raise RequestError(str(exc)) from None
        if op == "generate":
            schema, struct = self._target(request)
            count, seed = int(request.get("count", 0)), int(request.get("seed", 0))
            results = [
                {"values": v, "bytes": self.encode(schema, struct, v)}
                for v in self.generate(schema, struct, count, seed)
            ]
            return {"ok": True, "results": results}
        raise RequestError(f"unknown op {op!r}")

    def serve(self, stdin: IO[bytes], stdout: IO[bytes]) -> int:
        while True:
            request = wire.read_frame(stdin)
            if request is None:
                return 0
            try:
                response = self.handle(request)
            except RequestError as exc:
                response = {"ok": False, "error": str(exc)}
            except Exception as exc:  # keep serving; the runner reports the failure
                traceback.print_exc(file=sys.stderr)
                response = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            wire.write_frame(stdout, response)
            if isinstance(request, dict) and request.get("op") == "exit":
                return 0


def main(argv: Sequence[str] | None = None, testee_class: type[Testee] = Testee) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transport.conformance.testee",
        description="Serve the conformance testee protocol on stdin/stdout with the Python codec.",
    )
    parser.add_argument(
        "schemas",
        nargs="*",
        type=Path,
        metavar="SCHEMA.toml",
        help="schema files (default: every schema/*.toml under --root)",
    )
    parser.add_argument("--root", type=Path, default=None, help="repository root")
    args = parser.parse_args(argv)
    paths = list(args.schemas) or schema_files(args.root or default_root())
    testee = testee_class(paths)
    return testee.serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
