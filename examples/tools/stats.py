"""Small statistics helpers."""

import statistics


def summarize(values: list[float]) -> dict:
    """Returns count, mean, median, stdev (0 for fewer than two values), min and max."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("summarize() needs at least one value")
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }
