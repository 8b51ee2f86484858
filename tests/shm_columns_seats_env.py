"""A 1-env server's env with ``step_batch`` over the image_columns schema (for
tests/test_shm_columns.py): the contract env, one seat after the other, so STEP_MULTI steps the
seats of one env and the shm region has one slot (one entry of every column) per seat."""

from __future__ import annotations

from typing import Any

import numpy as np

from transport.generated import image_columns
from transport.testing.contract_env import ContractEnv


class SeatsEnv(ContractEnv):
    """``transport-serve ... --env tests.shm_columns_seats_env:SeatsEnv --schema
    schema/image_columns.toml``: ``step_batch`` steps the contract env once per seat."""

    def __init__(self) -> None:
        super().__init__(image_columns.SCHEMA)

    def step_batch(self, actions: Any) -> list[np.ndarray]:
        return [np.array(self.step(int(a)), copy=True) for a in actions]
