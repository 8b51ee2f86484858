"""Cross-language conformance suite: the runner, the Python testee, golden vectors.

``transport-conformance`` (``transport.tools.conformance_cli``) is the entry point; the contract
it checks is docs/conformance.md.
"""

from transport.conformance.golden import GoldenCase, load_golden, write_golden
from transport.conformance.invalid import InvalidCase, invalid_cases
from transport.conformance.process import TesteeError, TesteeProcess, TesteeStartError
from transport.conformance.runner import CHECKS, Failure, Options, Runner, SchemaResult
from transport.conformance.strategies import batch_strategy, generate, struct_strategy

__all__ = [
    "CHECKS",
    "Failure",
    "GoldenCase",
    "InvalidCase",
    "Options",
    "Runner",
    "SchemaResult",
    "TesteeError",
    "TesteeProcess",
    "TesteeStartError",
    "batch_strategy",
    "generate",
    "invalid_cases",
    "load_golden",
    "struct_strategy",
    "write_golden",
]
