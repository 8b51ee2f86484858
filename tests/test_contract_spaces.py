"""The backend contract over a space matrix (issue 23): the checks whose outcome depends on the
schema's layout, over env schemas of the spaces real envs have (transport.testing.space_matrix:
Discrete, Box actions, Dict observation, image observation), derived as ``transport-serve --gym``
derives them and served by ``transport-serve --env contract --schema FILE``.

Time-bounded: the layout-dependent checks only (the others do not depend on the schema and run
over every backend in tests/test_contract.py), real server processes shared by the checks of
one (target, schema): Python servers over unix for every row and over shm for the rows that
change the slots most (and two rows in the shm column layout), Node servers over unix. GAPS
declares what fails today (strict xfails): nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from transport.codec import Schema
from transport.testing import (
    Case,
    NotApplicable,
    PoolsByCase,
    contract_cases,
    contract_checks,
    run_check,
    unused_gaps,
)
from transport.testing.space_matrix import COLUMN_ROWS, SPACE_MATRIX, space_schema

from .servers import require_lang

LAYOUT_CHECKS = [name for name, check in contract_checks().items() if check.per_schema]
SHM_ROWS = ["box_action", "image_observation"]
"""Over shm the rows whose layouts change the slots most: array actions, a 28 KB observation."""
NODE_ROWS = ["box_action", "dict_observation", "image_observation"]
"""Node: array actions and the observation layouts (a Dict of three fields with
the GymSpaces enum, a 28 KB image)."""
GAPS: dict[tuple[str, ...], str] = {}
"""(scheme, server language, schema, check) -> why it fails today (strict xfails)."""

CASES = contract_cases([("unix", "python")], list(SPACE_MATRIX), GAPS, checks=LAYOUT_CHECKS)
CASES += contract_cases([("shm", "python")], SHM_ROWS, GAPS, checks=LAYOUT_CHECKS)
CASES += contract_cases([("unix", "node")], NODE_ROWS, GAPS, checks=LAYOUT_CHECKS)
CASES += contract_cases([("shm", "python")], list(COLUMN_ROWS), GAPS, checks=LAYOUT_CHECKS)


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Schema]:
    directory: Path = tmp_path_factory.mktemp("space-matrix")
    return {row: space_schema(row, directory) for row in (*SPACE_MATRIX, *COLUMN_ROWS)}


@pytest.fixture(scope="module")
def pools() -> Iterator[PoolsByCase]:
    holder = PoolsByCase()
    yield holder
    holder.close()


@pytest.mark.parametrize("case", CASES)
def test_contract_over_spaces(case: Case, pools: PoolsByCase, schemas: dict[str, Schema]) -> None:
    require_lang(case.target[1])
    try:
        run_check(case.check, pools.get(case), schemas[case.schema])
    except NotApplicable as exc:
        pytest.skip(f"not applicable: {exc}")


def test_every_gap_names_a_cell() -> None:
    assert unused_gaps(GAPS, CASES) == []
