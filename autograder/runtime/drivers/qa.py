"""Drivers of stage 08_qa_span: how the grader exercises your ``squad_em_f1``.

``squad_em_f1(prediction, ground_truths)`` takes strings and returns two floats, so one
call cannot be compared as a tensor: the grader calls it once per (prediction,
ground_truths) pair of a case and stacks the answers into a float64 array (N, 2) of
(em, f1) rows. Nothing here computes a score.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from autograder.runtime.drivers import require


def _number(value: Any, what: str, k: int) -> float:
    if isinstance(value, bool | np.bool_):
        return float(value)
    if isinstance(value, numbers.Real) and not isinstance(value, np.ndarray):
        return float(value)
    raise ValueError(
        f"squad_em_f1 returned {type(value).__name__} as `{what}` for pair {k}; expected a Python float "
        "(use float(...) on a tensor or array)"
    )


def em_f1_table(ns: dict[str, Any], data: dict[str, Any], device: str) -> np.ndarray:
    """``squad_em_f1(prediction, ground_truths)`` on each pair of ``data["args"][0]``.

    Returns a float64 array (N, 2): row k holds (em, f1) of pair k.
    """
    squad_em_f1 = require(ns, "squad_em_f1")
    rows = []
    for k, (prediction, ground_truths) in enumerate(data["args"][0]):
        result = squad_em_f1(prediction, list(ground_truths))
        if not isinstance(result, tuple | list) or len(result) != 2:
            raise ValueError(
                f"squad_em_f1 returned {type(result).__name__} for pair {k}; expected a tuple (em, f1)"
            )
        rows.append((_number(result[0], "em", k), _number(result[1], "f1", k)))
    return np.array(rows, dtype=np.float64).reshape(len(rows), 2)
