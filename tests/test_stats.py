"""Study statistics against SciPy on random inputs: Student's t and Welch's interval."""

import numpy as np
import pytest

from bertkit.stats import summary, t_cdf, t_ppf, welch_interval


def test_student_t_against_scipy(scipy_stats):
    rng = np.random.default_rng(0)
    for df in [1.0, 2.5, 4.0, 7.3, 30.0, 500.0]:
        for t in rng.normal(0, 3, 8):
            assert t_cdf(float(t), df) == pytest.approx(scipy_stats.t.cdf(t, df), abs=1e-10)
        for q in (0.005, 0.025, 0.3, 0.5, 0.9, 0.975):
            assert t_ppf(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), abs=1e-8)


def test_welch_interval_against_scipy_on_random_inputs(scipy_stats):
    rng = np.random.default_rng(1)
    for _ in range(25):
        a = rng.normal(rng.uniform(-1, 1), rng.uniform(0.01, 2), int(rng.integers(2, 12)))
        b = rng.normal(rng.uniform(-1, 1), rng.uniform(0.01, 2), int(rng.integers(2, 12)))
        ours = welch_interval(a.tolist(), b.tolist(), confidence=0.95)
        test = scipy_stats.ttest_ind(a, b, equal_var=False)
        low, high = test.confidence_interval(0.95)
        assert ours["difference"] == pytest.approx(a.mean() - b.mean(), abs=1e-12)
        assert (ours["low"], ours["high"]) == pytest.approx((low, high), abs=1e-8)
        assert ours["p_value"] == pytest.approx(test.pvalue, abs=1e-9)
        assert ours["df"] == pytest.approx(test.df, rel=1e-9)


def test_summary_and_errors():
    assert summary([1.0, 2.0, 4.0]) == pytest.approx(
        {"n": 3, "mean": 7 / 3, "std": np.std([1, 2, 4], ddof=1), "min": 1.0, "max": 4.0}
    )
    with pytest.raises(ValueError, match="at least 2"):
        welch_interval([1.0], [1.0, 2.0])
    same = welch_interval([1.0, 1.0], [1.0, 1.0])
    assert same["difference"] == 0.0 and same["p_value"] == 1.0


def test_compare_to_baseline_on_random_study_tables(scipy_stats):
    from bertkit.stats import compare_to_baseline

    rng = np.random.default_rng(2)
    rows = {
        "random": rng.normal(0.6, 0.05, 5).tolist(),
        "pretrained": rng.normal(0.8, 0.05, 5).tolist(),
        "same": rng.normal(0.6, 0.05, 5).tolist(),
        "one": [0.7],
    }
    table = compare_to_baseline(rows, "random")
    assert "vs_baseline" not in table["random"] and table["random"]["summary"]["n"] == 5
    for name in ("pretrained", "same"):
        test = scipy_stats.ttest_ind(rows[name], rows["random"], equal_var=False)
        low, high = test.confidence_interval(0.95)
        got = table[name]["vs_baseline"]
        assert (got["low"], got["high"]) == pytest.approx((low, high), abs=1e-8)
        assert table[name]["significant"] == (low > 0 or high < 0)
    assert table["pretrained"]["significant"] and table["one"]["vs_baseline"] is None
    with pytest.raises(ValueError, match="baseline"):
        compare_to_baseline(rows, "missing")


def test_holm_against_its_definition_on_random_p_values():
    """Holm's adjusted p-values: sorted ascending, (m - i) p_(i), made monotone, capped at 1; a
    hypothesis is rejected iff its adjusted value is at most alpha (and so every smaller one)."""
    import random

    from bertkit.stats import holm

    rng = random.Random(3)
    for _ in range(200):
        m = rng.randint(1, 8)
        p = {f"h{i}": rng.random() ** 3 for i in range(m)}
        result = holm(p)
        ordered = sorted(p.values())
        expected, running = [], 0.0
        for i, value in enumerate(ordered):
            running = max(running, min(1.0, (m - i) * value))
            expected.append(running)
        assert sorted(r["adjusted"] for r in result.values()) == expected
        for name, r in result.items():
            assert r["rejected"] == (r["adjusted"] <= 0.05) and r["p_value"] == p[name]
            assert r["adjusted"] >= p[name]
