"""Calibrated abstention (evidential_ops.risk_control): exact binomial tails, fixed-sequence testing,
the certified set against a brute-force enumeration, and the guarantee checked empirically on
synthetic scores whose error rates are known in closed form."""

import math

import numpy as np
import pytest
import torch

from evidential_ops import risk_control as rc

ALPHA, DELTA = 0.1, 0.1


def _binomial_noise_floor(trials: int, rate: float = 1 - DELTA) -> float:
    """The lowest success fraction a procedure with success probability `rate` shows over
    `trials` independent runs, 3.5 binomial standard deviations down."""
    return rate - 3.5 * math.sqrt(rate * (1 - rate) / trials)


# ----------------------------------------------------------------------------------------------
# exact binomial tail
# ----------------------------------------------------------------------------------------------
def test_binomial_cdf_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for n in (1, 2, 7, 50, 333, 1250, 3000):
        for p in (1e-4, 0.05, 0.1, 0.37, 0.9):
            for k in sorted({0, 1, n // 10, n // 3, n // 2, n - 1}):
                ours, theirs = rc.binomial_cdf(k, n, p), float(stats.binom.cdf(k, n, p))
                assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-300), (k, n, p)


def test_binomial_cdf_edges():
    assert rc.binomial_cdf(-1, 10, 0.3) == 0.0
    assert rc.binomial_cdf(10, 10, 0.3) == 1.0
    assert rc.binomial_cdf(0, 0, 0.3) == 1.0
    assert rc.binomial_cdf(3, 10, 0.0) == 1.0
    assert rc.binomial_cdf(9, 10, 1.0) == 0.0
    assert rc.binomial_cdf(0, 5, 0.5) == pytest.approx(1 / 32)
    with pytest.raises(ValueError, match="p must"):
        rc.binomial_cdf(1, 10, 1.5)
    with pytest.raises(ValueError, match="n must"):
        rc.binomial_cdf(1, -1, 0.5)
    with pytest.raises(TypeError, match="k must"):
        rc.binomial_cdf(1.0, 10, 0.5)


def test_critical_errors_is_the_largest_certifiable_count():
    stats = pytest.importorskip("scipy.stats")
    for alpha, delta in ((0.1, 0.1), (0.05, 0.01), (0.3, 0.2)):
        table = rc.critical_errors(400, alpha, delta)
        for n in range(401):
            passing = [k for k in range(n + 1) if stats.binom.cdf(k, n, alpha) <= delta]
            assert table[n] == (max(passing) if passing else -1), (n, alpha, delta)
        assert (np.diff(table) >= 0).all()
        n_min = rc.minimum_test_size(alpha, delta)
        assert table[n_min] == 0 and table[n_min - 1] == -1


# ----------------------------------------------------------------------------------------------
# fixed-sequence testing
# ----------------------------------------------------------------------------------------------
def test_fixed_sequence_stops_at_the_first_non_rejection():
    assert rc.fixed_sequence([0.01, 0.02, 0.5, 0.001, 0.0], 0.1) == 2
    assert rc.fixed_sequence([0.2, 0.0, 0.0], 0.1) == 0
    assert rc.fixed_sequence([0.1, 0.05], 0.1) == 2  # p ≤ δ rejects, equality included
    assert rc.fixed_sequence([], 0.1) == 0
    assert rc.fixed_sequence([0.01, float("nan"), 0.01], 0.1) == 1


def _brute_force(scores, correct, grid, alpha, delta, uncertain=True):
    """Every grid threshold counted query by query, its p-value from scipy, and the prefix of
    the walk that fixed-sequence testing rejects, with no vectorised shortcut."""
    stats = pytest.importorskip("scipy.stats")
    answered, errors, p_values = [], [], []
    for lam in grid:
        mask = [(s <= lam) if uncertain else (s >= lam) for s in scores]
        n = sum(mask)
        e = sum(1 for m, c in zip(mask, correct) if m and not c)
        answered.append(n)
        errors.append(e)
        p_values.append(float(stats.binom.cdf(e, n, alpha)) if n else 1.0)
    certified = 0
    for p in p_values:
        if p > delta:
            break
        certified += 1
    return answered, errors, p_values, certified


@pytest.mark.parametrize("uncertain", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_certified_set_matches_brute_force_with_a_fixed_grid(seed, uncertain):
    rng = np.random.default_rng(seed)
    n = 300
    s = rng.random(n)
    correct = rng.random(n) >= 0.01 + 0.3 * s  # errors grow with the uncertainty
    grid = np.linspace(0.0, 1.0, 41)
    if not uncertain:
        s, grid = -s, -grid
    cal = rc.calibrate(s, correct, ALPHA, DELTA, higher_is_uncertain=uncertain, thresholds=grid)
    walked = sorted(grid) if uncertain else sorted(grid, reverse=True)  # most conservative first
    answered, errors, p_values, certified = _brute_force(s, correct, walked, ALPHA, DELTA, uncertain)
    np.testing.assert_array_equal(cal.grid, walked)
    np.testing.assert_array_equal(cal.grid_answered, answered)
    np.testing.assert_array_equal(cal.grid_errors, errors)
    assert cal.n_certified == certified
    assert cal.certified == (certified > 0)
    if certified:
        assert cal.threshold == walked[certified - 1]
        assert cal.p_value == pytest.approx(p_values[certified - 1], rel=1e-9)
        assert cal.answered == answered[certified - 1] and cal.errors == errors[certified - 1]
        np.testing.assert_array_equal(cal.answers(s), (s <= cal.threshold) if uncertain else (s >= cal.threshold))


@pytest.mark.parametrize("seed", range(6))
def test_certified_set_matches_brute_force_with_the_learned_grid(seed):
    rng = np.random.default_rng(100 + seed)
    n = 400
    s = np.round(rng.random(n), 2)  # ties: 101 distinct values
    correct = rng.random(n) >= 0.02 + 0.25 * s
    cal = rc.calibrate(s, correct, ALPHA, DELTA, higher_is_uncertain=True, seed=seed)
    # The documented split: a seeded permutation, the first round(f·n) queries learn.
    order = np.random.default_rng(seed).permutation(n)
    n_learn = round(rc.DEFAULT_LEARN_FRACTION * n)
    assert (cal.n_learn, cal.n_test) == (n_learn, n - n_learn)
    learn, test = order[:n_learn], order[n_learn:]
    # The grid is the learn part's distinct scores and +inf, from the chosen start on.
    full_grid = list(np.unique(s[learn])) + [np.inf]
    assert list(cal.grid) == full_grid[len(full_grid) - cal.grid.size:]
    answered, errors, p_values, certified = _brute_force(s[test], correct[test], cal.grid, ALPHA, DELTA)
    np.testing.assert_array_equal(cal.grid_answered, answered)
    np.testing.assert_array_equal(cal.grid_errors, errors)
    assert cal.n_certified == certified


# ----------------------------------------------------------------------------------------------
# the guarantee, empirically
# ----------------------------------------------------------------------------------------------
def _draw(rng, n, error_at, discrete=False):
    """n queries with uncertainty s ~ U(0, 1) (rounded to 0.05 when discrete) and a wrong top-1
    with probability error_at(s)."""
    s = rng.random(n)
    if discrete:
        s = np.round(s * 20) / 20
    return s, rng.random(n) >= error_at(s)


def _selective_risk(error_at, threshold, discrete=False):
    """R(λ) = P(wrong | s ≤ λ) in closed form (numerically exact integration on a fine grid)."""
    if discrete:
        values = np.arange(21) / 20
        weights = np.where((values == 0) | (values == 1), 0.5, 1.0)  # round(20·U)/20 puts half-mass at the ends
        keep = values <= threshold
        return float((weights[keep] * error_at(values[keep])).sum() / weights[keep].sum())
    top = min(threshold, 1.0)
    t = np.linspace(0.0, top, 20001)
    return float(np.trapezoid(error_at(t), t) / top)


CASES = {
    "informative": (lambda s: 0.02 + 0.5 * s ** 2, False),
    "informative, tied scores": (lambda s: 0.02 + 0.5 * s ** 2, True),
    # Every threshold is a true null (risk 0.12 > α everywhere): any certification is a failure.
    "uninformative, just above alpha": (lambda s: np.full_like(s, 0.12), False),
    # The most certain queries are the worst: the walk must not certify the bad start.
    "inverted": (lambda s: 0.3 - 0.28 * s, False),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n", [250, 1250])
def test_guarantee_holds_over_many_calibration_sets(case, n):
    error_at, discrete = CASES[case]
    rng = np.random.default_rng(hash((case, n)) % 2**32)
    trials = 400
    held = 0
    for trial in range(trials):
        s, correct = _draw(rng, n, error_at, discrete)
        cal = rc.calibrate(s, correct, ALPHA, DELTA, higher_is_uncertain=True, seed=trial)
        held += (not cal.certified) or _selective_risk(error_at, cal.threshold, discrete) <= ALPHA
    assert held / trials >= _binomial_noise_floor(trials), (case, n, held / trials)


def test_guarantee_with_a_fixed_grid_and_a_confidence():
    error_at = CASES["informative"][0]
    rng = np.random.default_rng(7)
    trials, held, answered = 400, 0, []
    # Confidences −s. The grid starts where ~150 queries are answered: a walk from a threshold that
    # answers almost nothing would stop there (the price of a fixed grid; the learned one avoids it).
    grid = -np.linspace(0.3, 1, 36)
    for _ in range(trials):
        s, correct = _draw(rng, 500, error_at)
        cal = rc.calibrate(-s, correct, ALPHA, DELTA, higher_is_uncertain=False, thresholds=grid)
        held += (not cal.certified) or _selective_risk(error_at, -cal.threshold) <= ALPHA
        answered.append(0.0 if not cal.certified else min(1.0, -cal.threshold))
    assert held / trials >= _binomial_noise_floor(trials)
    assert np.mean(answered) > 0.3  # it does answer: the best certifiable coverage is ~0.69


def test_within_a_fixed_pool_the_pool_risk_is_what_is_guaranteed():
    """Random halves of one finite query set (the pipelines' experiment): the selective risk of
    λ̂ over the whole set, the population the halves are drawn from, is ≤ α in ≥ 1 − δ of the
    splits. The realised error of the other half alone is not guaranteed (it scatters, and the
    two halves err in opposite directions) and is not asserted."""
    rng = np.random.default_rng(11)
    s, correct = _draw(rng, 1500, CASES["informative"][0])
    trials, held = 300, 0
    for trial in range(trials):
        calibration = rng.permutation(1500)[:750]
        cal = rc.calibrate(s[calibration], correct[calibration], ALPHA, DELTA, higher_is_uncertain=True, seed=trial)
        answered = rc.apply(s, cal)
        held += (not answered.any()) or (~correct[answered]).mean() <= ALPHA
    assert held / trials >= _binomial_noise_floor(trials)


def test_confidence_is_the_mirror_of_its_uncertainty():
    rng = np.random.default_rng(3)
    s, correct = _draw(rng, 600, CASES["informative"][0])
    as_uncertainty = rc.calibrate(s, correct, ALPHA, DELTA, higher_is_uncertain=True)
    as_confidence = rc.calibrate(-s, correct, ALPHA, DELTA, higher_is_uncertain=False)
    assert as_uncertainty.certified and as_confidence.certified
    assert as_confidence.threshold == -as_uncertainty.threshold
    np.testing.assert_array_equal(as_uncertainty.answers(s), as_confidence.answers(-s))


# ----------------------------------------------------------------------------------------------
# bad input and the abstain-on-everything result
# ----------------------------------------------------------------------------------------------
def test_nothing_certifiable_abstains_on_everything_explicitly():
    rng = np.random.default_rng(0)
    s = rng.random(200)
    correct = rng.random(200) < 0.5  # half wrong everywhere
    cal = rc.calibrate(s, correct, ALPHA, DELTA, higher_is_uncertain=True)
    assert not cal.certified and cal.threshold is None
    assert not rc.apply(s, cal).any()
    assert cal.summary()["rule"] == "abstain on every query"


def test_torch_inputs_and_answer_everything():
    s = torch.linspace(0, 1, 300)
    cal = rc.calibrate(s, torch.ones(300, dtype=torch.bool), ALPHA, DELTA, higher_is_uncertain=True)
    assert cal.certified and cal.threshold == math.inf  # no error anywhere: answer every query
    assert rc.apply(s, cal).all()
    assert cal.summary()["threshold"] is None and cal.summary()["answers_everything"]


@pytest.mark.parametrize("name,value,error", [
    ("alpha", 0.0, ValueError), ("alpha", 1.0, ValueError), ("alpha", -0.1, ValueError), ("alpha", True, TypeError),
    ("alpha", "0.1", TypeError), ("delta", 0.0, ValueError), ("delta", 1.5, ValueError),
    ("learn_fraction", 1.0, ValueError),
])
def test_bad_levels_name_the_argument(name, value, error):
    s, correct = np.linspace(0, 1, 200), np.ones(200, dtype=bool)
    kwargs = {"alpha": ALPHA, "delta": DELTA, name: value}
    with pytest.raises(error, match=name):
        rc.calibrate(s, correct, kwargs.pop("alpha"), kwargs.pop("delta"), higher_is_uncertain=True, **kwargs)


def test_bad_data_is_refused():
    s, correct = np.linspace(0, 1, 200), np.ones(200, dtype=bool)
    with pytest.raises(ValueError, match="correct has 199 entries but scores has 200"):
        rc.calibrate(s, correct[:-1], ALPHA, DELTA, higher_is_uncertain=True)
    with pytest.raises(ValueError, match="NaN"):
        rc.calibrate(np.full(200, np.nan), correct, ALPHA, DELTA, higher_is_uncertain=True)
    with pytest.raises(ValueError, match="correct must be bool"):
        rc.calibrate(s, np.full(200, 2), ALPHA, DELTA, higher_is_uncertain=True)
    with pytest.raises(TypeError, match="higher_is_uncertain"):
        rc.calibrate(s, correct, ALPHA, DELTA, higher_is_uncertain=1)
    with pytest.raises(TypeError):
        rc.calibrate(s, correct, ALPHA, DELTA)  # the direction is required, never guessed
    with pytest.raises(ValueError, match="1-D"):
        rc.calibrate(s.reshape(20, 10), correct, ALPHA, DELTA, higher_is_uncertain=True)
    with pytest.raises(TypeError, match="Calibration"):
        rc.apply(s, 0.5)


def test_too_small_a_calibration_set_is_an_error_not_a_silent_threshold():
    n_min = rc.minimum_test_size(ALPHA, DELTA)  # 22 at α = δ = 0.1
    assert n_min == 22
    ok = np.ones(100, dtype=bool)
    with pytest.raises(ValueError, match=r"too few .* needs >= 22"):
        rc.calibrate(np.linspace(0, 1, 28), ok[:28], ALPHA, DELTA, higher_is_uncertain=True)  # 21 test queries
    with pytest.raises(ValueError, match="too few"):
        rc.calibrate(np.linspace(0, 1, 21), ok[:21], ALPHA, DELTA, higher_is_uncertain=True, thresholds=[0.5, 1.0])
    assert rc.calibrate(np.linspace(0, 1, 22), ok[:22], ALPHA, DELTA, higher_is_uncertain=True,
                        thresholds=[1.0]).certified


def test_calibrate_stops_at_the_first_failed_threshold_even_if_a_later_one_passes():
    # Threshold 1: 30 answered, 0 wrong (passes: c(30) = 0). Threshold 2: 40 answered, 3 wrong
    # (fails: c(40) = 1). Threshold 3: 300 answered, 15 wrong (would pass alone: c(300) >= 15).
    scores = np.concatenate([np.full(30, 1.0), np.full(10, 2.0), np.full(260, 3.0)])
    correct = np.ones(300, dtype=bool)
    correct[30:33] = False
    correct[40:52] = False
    table = rc.critical_errors(300, ALPHA, DELTA)
    assert (table[30], table[40]) == (0, 1) and table[300] >= 15
    cal = rc.calibrate(scores, correct, ALPHA, DELTA, higher_is_uncertain=True, thresholds=[1.0, 2.0, 3.0])
    assert list(cal.grid_answered) == [30, 40, 300] and list(cal.grid_errors) == [0, 3, 15]
    assert cal.n_certified == 1 and cal.threshold == 1.0 and cal.answered == 30
