"""pytest glue: the contract's checks as parametrized cases, with declared gaps as strict xfails.

    from transport.testing import contract_cases
    CASES = contract_cases(targets=[("mybackend", "python")], schemas=["pac_env"], gaps={})

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_contract(case): ...

A gap is keyed ``(*target, schema, check)``; ``"*"`` in a key matches anything. A gapped case
runs as ``xfail(strict=True)``: when the gap closes, the run fails until the entry is removed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transport.testing.checks import Check, contract_checks
from transport.testing.servers import ServerPool, serve_process_factory

Gaps = Mapping[tuple[str, ...], str]
"""Declared gaps: ``(*target, schema, check) -> reason``."""


@dataclass(frozen=True)
class Case:
    """One cell of the matrix: a target (e.g. scheme and server language), a schema, a check."""

    target: tuple[str, ...]
    schema: str
    check: Check

    def __str__(self) -> str:
        return "-".join([*self.target, self.schema, self.check.name])

    @property
    def key(self) -> tuple[str, ...]:
        return (*self.target, self.schema, self.check.name)


def _matches(pattern: tuple[str, ...], key: tuple[str, ...]) -> bool:
    return len(pattern) == len(key) and all(
        p in ("*", k) for p, k in zip(pattern, key, strict=True)
    )


def gap_reason(gaps: Gaps, key: tuple[str, ...]) -> str | None:
    """The declared reason for ``key`` (exact entries first, then ``"*"`` patterns)."""
    if key in gaps:
        return gaps[key]
    for pattern, reason in gaps.items():
        if _matches(pattern, key):
            return reason
    return None


def contract_cases(
    targets: Sequence[tuple[str, ...]],
    schemas: Sequence[str],
    gaps: Gaps,
    *,
    checks: Sequence[str] | None = None,
) -> list[Any]:
    """``pytest.param`` per (target, schema, check): layout-dependent checks for every schema,
    the others for the first; gapped cells marked ``xfail(strict=True, reason=...)``."""
    import pytest

    chosen = contract_checks()
    if checks is not None:
        chosen = {name: chosen[name] for name in checks}
    params = []
    for target in targets:  # target, then schema: one (target, schema)'s servers at a time
        for schema in schemas:
            for check in chosen.values():
                if not check.per_schema and schema != schemas[0]:
                    continue
                case = Case(tuple(target), schema, check)
                reason = gap_reason(gaps, case.key)
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                params.append(pytest.param(case, id=str(case), marks=marks))
    return params


def unused_gaps(gaps: Gaps, cases: Sequence[Any]) -> list[tuple[str, ...]]:
    """Gap entries that match no case (a typo, or a cell that no longer exists)."""
    keys = [param.values[0].key for param in cases]
    return [pattern for pattern in gaps if not any(_matches(pattern, key) for key in keys)]


class PoolsByCase:
    """One ServerPool per (target, schema) at a time: cases arrive grouped, so the previous
    group's servers are stopped (and checked for leftovers) when the next group starts."""

    def __init__(self) -> None:
        self.key: tuple[str, ...] | None = None
        self.pool: ServerPool | None = None

    def get(self, case: Case) -> ServerPool:
        key = (*case.target, case.schema)
        if key != self.key:
            self.close()
            self.key = key
            self.pool = ServerPool(serve_process_factory(*case.target))
        assert self.pool is not None
        return self.pool

    def close(self) -> None:
        """Stop the current group's servers; an AssertionError naming what they left behind."""
        if self.pool is not None:
            problems = self.pool.close()
            self.pool = None
            assert not problems, "; ".join(problems)
