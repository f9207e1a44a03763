"""How benchmarks/plan_peers.py names things: file-safe keys, budgets and learning rates as record keys and words."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable


def slug(text: str) -> str:
    """``text`` as a file-name-safe key (letters, digits and dots; every other run one dash), at most 60 characters."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:60]


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def budget_text(budget: str) -> str:
    """A budget key in words: ``"1"`` -> ``1 epoch``, ``"3"`` -> ``3 epochs``, ``"2 steps"`` as it is."""
    return budget if budget.endswith(" steps") else f"{budget} epoch{'s' * (budget != '1')}"


def ordered(budgets: Iterable[str]) -> list[str]:
    """Budget keys from the shortest to the longest (``"1"``, ``"3"``; ``"2 steps"``)."""
    return sorted(budgets, key=lambda b: float(b.split()[0]))


def longest(after: dict[str, float]) -> str:
    return ordered(after)[-1]


def rate_key(lr: float) -> str:
    """A learning rate as a record key: ``0.0003`` -> ``"0.0003"`` (JSON keys are strings)."""
    return f"{lr:g}"


def rate_text(lr: float) -> str:
    """A learning rate in the tables: ``0.0003`` -> ``3e-4``, ``0.00025`` -> ``2.5e-4``."""
    mantissa, exponent = f"{lr:.3e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
