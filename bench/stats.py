"""Percentiles and medians."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


def median(values: Sequence[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return float(statistics.median(clean)) if clean else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan
