"""Answer or abstain with a guaranteed error rate: distribution-free risk control of any score.

An uncertainty score ranks answers; it does not say which threshold keeps the error rate of the
answers a user acts on below a level α they choose. `calibrate` picks that threshold from a
held-out, labelled calibration set with Learn-then-Test (Angelopoulos, Bates, Candès, Jordan &
Lei 2021, "Learn then Test: calibrating predictive algorithms to achieve risk control"), and
`apply` answers the queries whose score clears it and abstains on the rest.

What is controlled (the selective risk of a threshold λ, for a query drawn like the calibration
queries): R(λ) = P(top-1 wrong | the query is answered at λ), answered meaning score ≤ λ for an
uncertainty (score ≥ λ for a confidence). The guarantee is

    P_calibration( R(λ̂) ≤ α ) ≥ 1 − δ,

over the draw of the calibration set, for the threshold λ̂ that `calibrate` returns. It is a
statement about the error rate among answered future queries in the long run, not about the
realised error of one finite batch, which scatters around R(λ̂) by binomial noise.

Assumption: the calibration queries and the future queries are i.i.d. draws from one
distribution (an infinite exchangeable sequence is enough: by de Finetti it is i.i.d. given a
latent law, and the guarantee holds given that law). Gallery, model and score must be those of
deployment. A shifted query distribution (new concepts, another gallery size) voids it.

The construction (`calibrate`):
1. Learn: a seeded random part of the calibration set (`learn_fraction`), independent of the
   rest, fixes the threshold grid (its distinct scores, most certain first, then +∞ = answer
   everything) and where the walk starts (the most conservative grid point whose test it
   predicts to pass almost surely). Nothing of the test part enters these choices.
2. Test: on the other part, for each grid λ the null H_λ: R(λ) > α gets the exact binomial
   p-value p(λ) = P(Binomial(n_λ, α) ≤ e_λ), n_λ = test-part queries answered at λ, e_λ = the
   wrong ones among them. Valid conditionally on n_λ: given which queries are answered, their
   labels are i.i.d. with error probability R(λ), so e_λ ~ Binomial(n_λ, R(λ)), and under H_λ
   that law is stochastically larger than Binomial(n_λ, α): P(p(λ) ≤ t | n_λ) ≤ t for every t;
   averaging over n_λ keeps it (n_λ = 0 gives p = 1, never rejected).
3. Fixed-sequence testing (`fixed_sequence`): walk the grid from the start towards answering
   more, reject while p(λ) ≤ δ, stop at the first non-rejection. Given the learn part the order
   is fixed, so a false rejection needs the first true null of the order (a fixed hypothesis)
   rejected, which has probability ≤ δ: the family-wise error rate is ≤ δ, and every certified
   λ, the last one λ̂ included, has R(λ) ≤ α with probability ≥ 1 − δ.
When nothing is certified the result says so (`certified=False`) and `apply` abstains on every
query. A calibration set whose test part is too small for any threshold to pass even with zero
errors, (1 − α)^n > δ, is a ValueError. With `thresholds=` a caller-fixed grid (chosen without
the calibration data) replaces step 1 and every calibration query is used for testing.

Exact binomial tails are computed here in log space (`binomial_cdf`, `critical_errors`), so
the module needs numpy only.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["Calibration", "TooFewQueries", "apply", "binomial_cdf", "calibrate", "critical_errors", "fixed_sequence",
           "minimum_test_size"]


class TooFewQueries(ValueError):
    """Fewer calibration queries than any certificate at (alpha, delta) needs (minimum_test_size)."""


DEFAULT_LEARN_FRACTION = 0.25
START_Z = 2.33  # the walk's first test predicted to pass with probability ~0.99 (normal approximation)


# ----------------------------------------------------------------------------------------------
# exact binomial tail
# ----------------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _log_factorials(n: int) -> np.ndarray:
    """ln i! for i = 0..n (math.lgamma per entry: exact to the last bits, unlike a running sum)."""
    return np.array([math.lgamma(i + 1) for i in range(n + 1)], dtype=np.float64)


def _log_cdf(n: int, p: float) -> np.ndarray:
    """log P(Binomial(n, p) ≤ k) for k = 0..n (float64), summed in log space so that tails far
    below the float64 range of a direct product stay exact in relative terms."""
    if p == 0.0:
        return np.zeros(n + 1)
    if p == 1.0:
        out = np.full(n + 1, -np.inf)
        out[-1] = 0.0
        return out
    k = np.arange(n + 1, dtype=np.float64)
    log_fact = _log_factorials(max(n, 1024))  # one table serves every n up to its size
    if log_fact.size <= n:
        log_fact = _log_factorials(n)
    log_choose = log_fact[n] - log_fact[: n + 1] - log_fact[n::-1]
    log_pmf = log_choose + k * math.log(p) + (n - k) * math.log1p(-p)
    # A CDF cannot exceed 1: clip the last ulp that summation may add.
    return np.minimum(np.logaddexp.accumulate(log_pmf), 0.0)


def _probability(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in (0, 1), got {type(value).__name__}")
    value = float(value)
    if not (0.0 < value < 1.0):
        raise ValueError(f"{name} must lie in (0, 1), got {value}")
    return value


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) ≤ k), exact (log-space sum of the pmf C(n, i)·pⁱ·(1 − p)ⁿ⁻ⁱ, i ≤ k).

    k: int (k < 0 gives 0, k ≥ n gives 1); n: int ≥ 0; p: real in [0, 1]. The p-value of the
    selective-risk null R > p with k errors among n answered queries (module docstring, step 2).
    """
    k, n = _count(k, "k"), _count(n, "n")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.0 <= float(p) <= 1.0):
        raise ValueError(f"p must be a real number in [0, 1], got {p!r}")
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(np.exp(_log_cdf(n, float(p))[k]))


@lru_cache(maxsize=32)
def _critical_table(n_max: int, alpha: float, delta: float) -> np.ndarray:
    table = np.empty(n_max + 1, dtype=np.int64)
    for n in range(n_max + 1):
        # The CDF grows with k: the certifiable error counts are a prefix 0..c(n).
        table[n] = int(np.count_nonzero(np.exp(_log_cdf(n, alpha)) <= delta)) - 1
    table.setflags(write=False)
    return table


def critical_errors(n_max: int, alpha: float, delta: float) -> np.ndarray:
    """c(n) = max{k : P(Binomial(n, α) ≤ k) ≤ δ} for n = 0..n_max, −1 where even k = 0 fails.

    A threshold answering n test queries with e errors is certified (p-value ≤ δ) exactly when
    e ≤ c(n); c is nondecreasing in n. Returns a read-only (n_max + 1,) int64 array (cached).
    """
    n_max = _count(n_max, "n_max")
    if n_max < 0:
        raise ValueError(f"n_max must be >= 0, got {n_max}")
    return _critical_table(n_max, _probability(alpha, "alpha"), _probability(delta, "delta"))


def minimum_test_size(alpha: float, delta: float) -> int:
    """The fewest answered queries that can certify a threshold: the least n with
    (1 − α)ⁿ ≤ δ (zero errors among them), i.e. ⌈ln δ / ln(1 − α)⌉ up to rounding at the edge."""
    alpha, delta = _probability(alpha, "alpha"), _probability(delta, "delta")
    n = max(1, math.ceil(math.log(delta) / math.log1p(-alpha)) - 1)
    while math.exp(n * math.log1p(-alpha)) > delta:
        n += 1
    return n


def fixed_sequence(p_values, delta: float) -> int:
    """How many hypotheses fixed-sequence testing rejects: the length of the longest prefix of
    `p_values` (ordered as tested, (G,) reals in [0, 1]) whose every entry is ≤ δ. The walk stops
    at the first p-value above δ; nothing after it is rejected, however small its p-value."""
    p = np.asarray(p_values, dtype=np.float64).ravel()
    delta = _probability(delta, "delta")
    above = np.flatnonzero(~(p <= delta))  # NaN counts as "not rejected"
    return int(above[0]) if above.size else int(p.size)


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def _as_numpy(a, name: str) -> np.ndarray:
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # a torch.Tensor, without importing torch here
        a = a.detach().cpu().numpy()
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per query), got shape {a.shape}")
    return a


def _scores(a, name: str) -> np.ndarray:
    a = _as_numpy(a, name)
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise TypeError(f"{name} must hold real numbers, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return a


def _correct(a, n: int) -> np.ndarray:
    a = _as_numpy(a, "correct")
    if a.dtype != np.bool_:
        if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)) or \
                not np.isin(a, (0, 1)).all():
            raise ValueError("correct must be bool (or 0/1): True where the query's top-1 is right")
        a = a != 0
    if a.shape[0] != n:
        raise ValueError(f"correct has {a.shape[0]} entries but scores has {n}: one flag per query")
    return a


def _direction(higher_is_uncertain) -> bool:
    if not isinstance(higher_is_uncertain, bool):
        raise TypeError("higher_is_uncertain must be True (an uncertainty: u, dissonance, −confidence) or False "
                        f"(a confidence: a belief, a similarity, a softmax probability), got {higher_is_uncertain!r}")
    return higher_is_uncertain


# ----------------------------------------------------------------------------------------------
# calibration
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """A calibrated abstention rule and the evidence behind it.

    Rule: answer a query when its score is at most `threshold` (higher_is_uncertain=True) or at
    least `threshold` (False); abstain on everything when `certified` is False (threshold None).
    Guarantee (module docstring): with probability ≥ 1 − delta over the calibration set, the
    error rate among answered queries drawn like the calibration queries is ≤ alpha.

    grid: the thresholds walked, in score units, in the order tested; grid_answered,
    grid_errors: (G,) test-part queries answered at each and the wrong ones among them;
    n_certified: the rejected prefix of the walk; p_value: that of the chosen threshold.
    """

    alpha: float
    delta: float
    higher_is_uncertain: bool
    threshold: float | None
    certified: bool
    n_calibration: int
    n_learn: int
    n_test: int
    answered: int
    errors: int
    p_value: float
    grid: np.ndarray
    grid_answered: np.ndarray
    grid_errors: np.ndarray
    n_certified: int

    def answers(self, scores) -> np.ndarray:
        """(N,) bool, True where the query is answered (see `apply`)."""
        return apply(scores, self)

    def summary(self) -> dict:
        """The JSON-able figures (no grid arrays; an infinite threshold, answer every query, is
        None with answers_everything True)."""
        everything = self.certified and math.isinf(self.threshold)
        return {"alpha": self.alpha, "delta": self.delta, "higher_is_uncertain": self.higher_is_uncertain,
                "threshold": None if everything else self.threshold, "answers_everything": everything,
                "certified": self.certified, "n_calibration": self.n_calibration,
                "n_learn": self.n_learn, "n_test": self.n_test, "answered": self.answered, "errors": self.errors,
                "p_value": self.p_value, "grid_size": int(self.grid.size), "n_certified": self.n_certified,
                "rule": ("abstain on every query" if not self.certified else "answer every query" if everything
                         else f"answer when score {'<=' if self.higher_is_uncertain else '>='} {self.threshold:.6g}")}


def _start_index(learn_answered: np.ndarray, learn_errors: np.ndarray, n_learn: int, n_test: int,
                 critical: np.ndarray) -> int:
    """Where the walk starts: the most conservative grid point whose test the learn part predicts
    to pass with probability ≥ Φ(START_Z) (normal approximation of P(Binomial(ñ, r̂) ≤ c(ñ)) with
    the projected test count ñ and the smoothed learn risk r̂ = (e + 1)/(m + 2)), else the point
    predicted likeliest to pass. Only the learn part enters, so validity does not depend on
    this choice, only the power: start too early and a handful of answers stop the walk, too
    late and the certifiable thresholds before the start are lost."""
    projected = np.clip(np.rint(learn_answered * (n_test / n_learn)).astype(np.int64), 0, critical.size - 1)
    risk = (learn_errors + 1.0) / (learn_answered + 2.0)
    spread = np.sqrt(np.maximum(projected, 1) * risk * (1.0 - risk))
    z = (critical[projected] + 0.5 - projected * risk) / spread
    z[critical[projected] < 0] = -np.inf
    # The most conservative point predicted to pass almost surely: the walk then goes on from
    # there as far as the data allow. Starting at the single likeliest point instead jumps deep
    # on a noisy learn estimate and loses everything when that one test fails.
    sure = np.flatnonzero(z >= START_Z)
    return int(sure[0]) if sure.size else int(np.argmax(z))


def _counts_at(sorted_scores: np.ndarray, cumulative_errors: np.ndarray, thresholds: np.ndarray):
    """Queries with score ≤ λ and the wrong ones among them, for each λ (scores sorted ascending,
    cumulative_errors[i] = errors among the i most certain)."""
    answered = np.searchsorted(sorted_scores, thresholds, side="right")
    return answered.astype(np.int64), cumulative_errors[answered]


def calibrate(scores, correct, alpha: float, delta: float, *, higher_is_uncertain: bool, thresholds=None,
              learn_fraction: float = DEFAULT_LEARN_FRACTION, seed: int = 0) -> Calibration:
    """The threshold that keeps the error rate among answered queries ≤ α with probability
    ≥ 1 − δ (Learn-then-Test with exact binomial p-values and fixed-sequence testing; the
    construction, its proof and its assumptions are in the module docstring).

    scores: (N,) real, one per calibration query: any per-query score (u, −top belief,
    dissonance, FUME's uncertainty, DUQ's readings, the top-1 similarity, a softmax confidence).
    correct: (N,) bool, the query's top-1 is right. alpha: the error rate to guarantee, in (0, 1).
    delta: the allowed probability that the guarantee fails, in (0, 1). higher_is_uncertain:
    required, True when a higher score means less sure (answer when score ≤ threshold), False for
    a confidence (answer when score ≥ threshold). thresholds: optional grid fixed without looking
    at the calibration data; then every query tests (no learn part), and the walk starts at its
    most conservative point, so a grid should start where enough queries are answered (a
    threshold answering fewer than `minimum_test_size` stops the walk at once). learn_fraction, seed: the
    share of queries that fixes the grid and the start, and the seed of that random split.

    Returns a `Calibration` (certified=False and threshold None: abstain on everything). Raises
    TypeError/ValueError naming the argument for bad input, and ValueError when the part used for
    testing has fewer than `minimum_test_size(alpha, delta)` queries (no threshold could pass).
    """
    alpha, delta = _probability(alpha, "alpha"), _probability(delta, "delta")
    uncertain = _direction(higher_is_uncertain)
    s = _scores(scores, "scores")
    ok = _correct(correct, s.shape[0])
    if not uncertain:  # one code path: an uncertainty, answered when ≤ λ
        s = -s
    n = s.shape[0]
    n_needed = minimum_test_size(alpha, delta)
    if thresholds is None:
        learn_fraction = _probability(learn_fraction, "learn_fraction")
        seed = _count(seed, "seed")
        n_learn = int(round(learn_fraction * n))
        if n_learn < 1 or n - n_learn < n_needed:
            raise TooFewQueries(
                f"scores: {n} calibration queries are too few at alpha={alpha}, delta={delta}: the test part "
                f"({n - n_learn} after learn_fraction={learn_fraction}) needs >= {n_needed} queries, since even "
                f"zero errors among fewer cannot be certified ((1 - alpha)^n > delta); the learn part needs >= 1")
        order = np.random.default_rng(seed).permutation(n)
        learn, test = order[:n_learn], order[n_learn:]
        learn_sorted = np.sort(s[learn], kind="stable")
        grid = np.append(np.unique(learn_sorted), np.inf)
    else:
        grid = _as_numpy(np.asarray(thresholds) if not hasattr(thresholds, "detach") else thresholds, "thresholds")
        grid = grid.astype(np.float64)
        if grid.size == 0 or np.isnan(grid).any():
            raise ValueError("thresholds must be a non-empty 1-D grid without NaN")
        grid = np.unique(grid if uncertain else -grid)  # most conservative first
        if n < n_needed:
            raise TooFewQueries(f"scores: {n} calibration queries are too few at alpha={alpha}, delta={delta}: "
                             f"certifying any threshold needs >= {n_needed} (zero errors among fewer cannot pass)")
        n_learn, learn, test = 0, None, np.arange(n)
    n_test = test.size
    order_test = np.argsort(s[test], kind="stable")
    test_sorted = s[test][order_test]
    test_errors = np.concatenate([[0], np.cumsum(~ok[test][order_test])]).astype(np.int64)
    critical = critical_errors(n_test, alpha, delta)
    if learn is not None:
        learn_order = np.argsort(s[learn], kind="stable")
        learn_errors = np.concatenate([[0], np.cumsum(~ok[learn][learn_order])]).astype(np.int64)
        learn_answered, learn_wrong = _counts_at(s[learn][learn_order], learn_errors, grid)
        grid = grid[_start_index(learn_answered, learn_wrong, n_learn, n_test, critical):]
    answered, errors = _counts_at(test_sorted, test_errors, grid)
    passed = errors <= critical[answered]
    failed = np.flatnonzero(~passed)
    n_certified = int(failed[0]) if failed.size else int(grid.size)
    grid_out = grid if uncertain else -grid
    if n_certified == 0:
        return Calibration(alpha, delta, uncertain, None, False, n, n_learn, n_test, 0, 0, 1.0, grid_out,
                           answered, errors, 0)
    last = n_certified - 1
    threshold = float(grid[last]) if uncertain else float(-grid[last])
    p_value = binomial_cdf(int(errors[last]), int(answered[last]), alpha)
    return Calibration(alpha, delta, uncertain, threshold, True, n, n_learn, n_test, int(answered[last]),
                       int(errors[last]), p_value, grid_out, answered, errors, n_certified)


def apply(scores, calibration: Calibration) -> np.ndarray:
    """Answer or abstain: (N,) bool, True where the query is answered, i.e. its score is at most
    the calibrated threshold (higher_is_uncertain) or at least it (a confidence); all False when
    the calibration certified nothing. scores: (N,) real, the same score as calibrated."""
    if not isinstance(calibration, Calibration):
        raise TypeError(f"calibration must be a Calibration from calibrate(), got {type(calibration).__name__}")
    s = _scores(scores, "scores")
    if not calibration.certified:
        return np.zeros(s.shape[0], dtype=bool)
    if calibration.higher_is_uncertain:
        return s <= calibration.threshold
    return s >= calibration.threshold
