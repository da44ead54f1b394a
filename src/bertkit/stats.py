"""Statistics for studies over seeds: mean, sample std, and Welch's confidence interval of the
difference of two means (pre-trained vs random init), with Student's t distribution computed
here (no SciPy at run time; the tests check every figure against SciPy).

    >>> interval = welch_interval([0.80, 0.82, 0.81], [0.70, 0.74, 0.72])
    >>> round(interval["difference"], 3), interval["low"] > 0
    (0.09, True)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x = {x} is outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (real, > 0) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if (
        t * t < df
    ):  # near the centre: P(|T| < |t|) = I(t^2 / (df + t^2); 1/2, df/2), no cancellation
        inner = 0.5 * incomplete_beta(0.5, df / 2.0, t * t / (df + t * t))
        return 0.5 + inner if t > 0 else 0.5 - inner
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t (bisection on the CDF, to 1e-12)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q = {q} is outside (0, 1)")
    low, high = -1.0, 1.0
    while t_cdf(low, df) > q:
        low *= 2.0
    while t_cdf(high, df) < q:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < q:
            low = middle
        else:
            high = middle
        if high - low < 1e-12:
            break
    return 0.5 * (low + high)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, mean, sample std, min, max."""
    values = list(values)
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def welch_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> dict[str, float]:
    """Mean(a) - mean(b) with its `confidence` interval and two-sided p-value by Welch's
    unequal-variance t test (Welch-Satterthwaite degrees of freedom): the test `scipy.stats.
    ttest_ind(a, b, equal_var=False)` makes. Each side needs at least 2 values."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's interval needs at least 2 values on each side")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    difference = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return {
            "difference": difference,
            "low": difference,
            "high": difference,
            "df": math.inf,
            "p_value": 0.0 if difference else 1.0,
        }
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_ppf(0.5 + confidence / 2.0, df) * se
    t = difference / se
    return {
        "difference": difference,
        "low": difference - half,
        "high": difference + half,
        "df": df,
        "p_value": 2.0 * (1.0 - t_cdf(abs(t), df)),
    }


def compare_to_baseline(
    rows: dict[str, Sequence[float]], baseline: str, confidence: float = 0.95
) -> dict[str, dict]:
    """Per row: its summary and, for every row but the baseline, Welch's interval of
    mean(row) - mean(baseline) (`vs_baseline`; None with fewer than 2 values on a side) and
    whether that interval excludes zero (`significant`)."""
    if baseline not in rows:
        raise ValueError(f"baseline {baseline!r} is not one of the rows {sorted(rows)}")
    out: dict[str, dict] = {}
    for name, values in rows.items():
        entry: dict = {"summary": summary(values)}
        if name != baseline:
            if len(values) >= 2 and len(rows[baseline]) >= 2:
                interval = welch_interval(values, rows[baseline], confidence)
                entry["vs_baseline"] = interval
                entry["significant"] = interval["low"] > 0 or interval["high"] < 0
            else:
                entry["vs_baseline"], entry["significant"] = None, False
        out[name] = entry
    return out


def holm(p_values: dict[str, float], alpha: float = 0.05) -> dict[str, dict[str, float | bool]]:
    """Holm's step-down correction for testing several hypotheses at once (one interval per task
    and row): each p-value's adjusted value (the smallest family-wise level at which it would be
    rejected) and whether it is rejected at `alpha`. Stronger than Bonferroni, with the same
    guarantee: the chance that any true null is rejected stays at most `alpha`.

    >>> result = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    >>> {k: (round(v["adjusted"], 2), v["rejected"]) for k, v in result.items()}
    {'a': (0.03, True), 'b': (0.06, False), 'c': (0.06, False)}
    """
    order = sorted(p_values, key=p_values.__getitem__)
    out: dict[str, dict[str, float | bool]] = {}
    running = 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[name]))
        out[name] = {"p_value": p_values[name], "adjusted": running, "rejected": running <= alpha}
    return {name: out[name] for name in p_values}
