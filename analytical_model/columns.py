"""Reading operator shapes from a *column mapping*: column name -> one value per row.

A mapping may be a dict of numpy arrays or lists (the prediction path builds those) or a pandas DataFrame (the
CSV tools); nothing here imports pandas. Errors name the column and the row.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

import numpy as np

#: column name -> one value per row (numpy array, list or pandas Series); a pandas DataFrame is one
Columns = Mapping[str, Any]



def _plain(value):
    """A numpy scalar as the Python value, so that messages read 7.5, not np.float64(7.5)."""
    return value.item() if isinstance(value, np.generic) else value


def column_values(columns: Columns, column: str) -> np.ndarray:
    values = columns[column]
    to_numpy = getattr(values, "to_numpy", None)
    return to_numpy() if to_numpy is not None else np.asarray(values)


def _as_number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def int_column(columns: Columns, column: str) -> np.ndarray:
    """int64 values; numbers written as text are accepted, non-integers are an error naming the row."""
    raw = column_values(columns, column)
    if raw.dtype.kind in "iu":
        return raw.astype(np.int64)
    if raw.dtype.kind in "fb":
        values = raw.astype(np.float64)
    else:
        values = np.fromiter((_as_number(v) for v in raw), dtype=np.float64, count=len(raw))
    bad = ~np.isfinite(values) | (values != np.floor(values))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"column {column!r} must hold integers; row {row + 1} has {_plain(raw[row])!r}")
    return values.astype(np.int64)


def bool_column(columns: Columns, column: str, label: Callable[[int], str] | None = None) -> np.ndarray:
    """Booleans from bools, 0/1 or true/false text; an error names its row by ``label(position)`` where given."""
    raw = column_values(columns, column)
    if raw.dtype == bool:
        return raw
    text = np.char.lower(np.char.strip(raw.astype(str)))
    truthy, falsy = np.isin(text, ["1", "1.0", "true", "yes"]), np.isin(text, ["0", "0.0", "false", "no"])
    bad = ~(truthy | falsy)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        where = label(row) if label is not None else f"row {row + 1}"
        raise ValueError(f"column {column!r} must be 0/1 or true/false; {where} has {_plain(raw[row])!r}")
    return truthy


def present(columns: Columns, column: str) -> np.ndarray:
    """True where the row has a value (not None, NaN or missing), like pandas' notna."""
    raw = column_values(columns, column)
    if raw.dtype.kind == "f":
        return ~np.isnan(raw)
    if raw.dtype.kind != "O":
        return np.ones(len(raw), dtype=bool)
    return np.fromiter((v is not None and type(v).__name__ != "NAType" and not (isinstance(v, float) and math.isnan(v))
                        for v in raw), dtype=bool, count=len(raw))


def take(columns: Columns, names, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The rows ``rows`` (indices or a mask) of the columns ``names``."""
    return {name: column_values(columns, name)[rows] for name in names}


def parse_length_list(value, column: str) -> list[int]:
    """Parse "[a,b,...]" (or a list) into positive ints; errors name the column."""
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
    else:
        try:
            items = json.loads(str(value))
        except json.JSONDecodeError:
            raise ValueError(f"{column} must be a list like [a,b], got {value!r}") from None
        if not isinstance(items, list):
            items = [items]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise ValueError(f"{column} entries must be integers, got {item!r}")
    return [int(v) for v in items]


def length_lists(columns: Columns, column: str) -> list:
    """Per row a tuple/list of ints; workload shapes arrive as tuples and are used as they are."""
    return [v if type(v) is tuple else parse_length_list(v, column) for v in columns[column]]
