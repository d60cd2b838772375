"""What a runner hands to the measurement loop: the prepared launch, the "cannot run here" signal, and the
``kernel`` cell written into the CSV. Pure Python (no torch), shared by :mod:`.runners` and :mod:`.session`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Callable


class Unsupported(Exception):
    """This row cannot run on the selected backend (not an error: the row is skipped and reported)."""


@dataclass
class Prepared:
    fn: Callable[[], object]
    backend: str           # implementation label written into ``kernel``
    dtype: str
    elementwise: bool = False   # rmsnorm / siluandmul: the kernel cell says fused or eager
    fused: bool | None = None   # known fused (True) / eager (False), or None: count the kernels the profiler sees
    keep: list = field(default_factory=list)  # tensors the closure needs (kept alive until measured)


def parse_lengths(text: str) -> list[int]:
    values = ast.literal_eval(text) if isinstance(text, str) else text
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, int) for v in values):
        raise ValueError(f"bad length list {text!r}")
    return [int(v) for v in values]


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, the one-line form in which the profiler reports a failure."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def short_kernel_name(name: str, limit: int = 160) -> str:
    """Drop the ``void `` prefix and the argument list of a demangled kernel name; keep template arguments."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            text = text[:i]
            break
    return text if len(text) <= limit else text[: limit - 1] + "…"


def kernel_label(prepared: Prepared, names: list[str] | None) -> str:
    """The ``kernel`` cell: backend, fused/eager for element-wise ops, and the GPU kernels that ran."""
    label = prepared.backend
    if prepared.elementwise:
        fused = prepared.fused
        if fused is None and names:
            fused = len(names) == 1
        if fused is None:
            label += " [fused or eager: unknown, no profiler]"
        elif fused:
            label += " [fused]"
        else:
            label += f" [eager, {len(names)} kernels]" if names else " [eager]"
    if names:
        unique = list(dict.fromkeys(short_kernel_name(n) for n in names))
        label += ": " + " | ".join(unique)
    return label
