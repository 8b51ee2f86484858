"""The contract's space matrix: env schemas of the spaces real envs have, to run the checks over.

The built-in contract schemas (pac_env, tetris, mahjong_env) have a flat observation and a
Discrete action. Real envs have more (issue 23): this module derives, with
``transport.gym_schema`` (what ``transport-serve --gym`` serves), one schema per row of the
matrix, written to a file so a ``transport-serve --env contract --schema FILE`` process of
either language can serve it:

- ``discrete``: a float vector observation, ``Discrete(16)`` (a u8 action, no mask);
- ``box_action``: a float64 vector observation, ``Box(0, 15, (3,), float32)`` actions (the
  checks send arrays filled with the integer they pick: ``ContractEnv`` reads the first
  element, and the bounds make 16 and -1 INVALID_ACTION as act_n and -1 are for a Discrete);
- ``dict_observation``: a Dict of a vector, a uint8 grid and a Discrete (three fields, and the
  GymSpaces description enum), ``Discrete(16)``;
- ``image_observation``: a frame-stacked 84x84 uint8 image, Atari's ``Discrete(6)`` widened to
  16 (the contract env's action count without a mask);
- ``box_action_columns``, ``dict_observation_columns``: those rows with ``[env] shm =
  "columns"`` (the shm column layout: docs/shm.md).
"""

from __future__ import annotations

import os
from typing import Any

from transport.codec import Schema

SPACE_MATRIX = ("discrete", "box_action", "dict_observation", "image_observation")
"""The rows of the matrix, in the order the suite runs them."""
COLUMN_ROWS = ("box_action_columns", "dict_observation_columns")
"""Rows of the matrix again with ``[env] shm = "columns"`` (the shm column layout, issue 25):
array actions in the request column (the HELLO mode in its first element), several
observation fields as several columns. Only shm serves them differently."""
COLUMNS_SUFFIX = "_columns"

ACT_N = 16
"""The Discrete actions' n: the contract env's action count on a schema without a mask."""


def space_pair(name: str) -> tuple[Any, Any]:
    """(observation_space, action_space) of the matrix row ``name``."""
    import numpy as np
    from gymnasium import spaces

    name = name.removesuffix(COLUMNS_SUFFIX)
    if name == "discrete":
        return spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(ACT_N)
    if name == "box_action":
        vector = spaces.Box(-np.inf, np.inf, (6,), np.float64)
        return vector, spaces.Box(0.0, float(ACT_N - 1), (3,), np.float32)
    if name == "dict_observation":
        observation = spaces.Dict(
            {
                "position": spaces.Box(-np.inf, np.inf, (3,), np.float32),
                "grid": spaces.Box(0, 255, (2, 5, 5), np.uint8),
                "room": spaces.Discrete(7),
            }
        )
        return observation, spaces.Discrete(ACT_N)
    if name == "image_observation":
        return spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(ACT_N)
    raise ValueError(f"unknown row {name!r} of the space matrix (rows: {', '.join(SPACE_MATRIX)})")


def space_schema(name: str, directory: str | os.PathLike[str]) -> Schema:
    """The schema of row ``name``, written as ``space_NAME.toml`` in ``directory`` and loaded
    from there (servers of either language are given that file)."""
    from transport import load_schema
    from transport.gym_schema import schema_toml

    path = os.path.join(os.fspath(directory), f"space_{name}.toml")
    text = schema_toml(*space_pair(name), name=f"space_{name}")
    if name.endswith(COLUMNS_SUFFIX):  # the same env, its shm region in columns
        text = text.replace("\n[env]\n", '\n[env]\nshm = "columns"\n', 1)
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)
    schema = load_schema(path)
    if name.endswith(COLUMNS_SUFFIX) and (schema.ir.shm is None or not schema.ir.shm.columns):
        raise ValueError(f"row {name}: the derived schema has no [env] table to set shm in")
    return schema
