"""Statistics over seeds: a metric's mean ± sample standard deviation and n, and whether two
settings are separable by Welch's t-test.

The one copy of these statistics: `experiments.results` (the recorded rows of docs/results.md)
and the sweep's summaries (`experiments.sweep_summary`, `experiments.sweep_advice`) use it.

Separable means: Welch's unequal-variance t-test (Welch 1947) rejects equal means at the
two-sided level `ALPHA` = 0.05, i.e.

    t  = (m1 - m2) / sqrt(s1^2 / n1 + s2^2 / n2)
    df = (s1^2 / n1 + s2^2 / n2)^2 / ((s1^2 / n1)^2 / (n1 - 1) + (s2^2 / n2)^2 / (n2 - 1))
    p  = P(|T_df| >= |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2)   (Student's t, two-sided)

with I the regularized incomplete beta function, written here (`_incomplete_beta`) so the
sweep needs no SciPy. It needs two seeds or more on both sides; with one it cannot tell.
"""

import dataclasses
import math
import statistics
from collections.abc import Sequence

ALPHA = 0.05  # two-sided significance level of `separable`


@dataclasses.dataclass(frozen=True)
class Spread:
    """A metric over seeds: mean, sample standard deviation (n - 1; 0.0 for one value), n."""

    mean: float
    std: float
    n: int

    @property
    def sem(self) -> float:
        """The standard error of the mean, std / sqrt(n)."""
        return self.std / math.sqrt(self.n)


def spread(values: Sequence[float]) -> Spread:
    """Mean, sample standard deviation (0.0 for one value) and count of `values`.

    Raises:
        ValueError: for no values.
    """
    if not values:
        raise ValueError("spread of no values: nothing to average")
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return Spread(mean=statistics.fmean(values), std=std, n=len(values))


@dataclasses.dataclass(frozen=True)
class Welch:
    """Welch's t-test of two spreads: the statistic, its degrees of freedom, two-sided p."""

    t: float
    df: float
    p: float

    @property
    def separable(self) -> bool:
        """Whether p < `ALPHA`."""
        return self.p < ALPHA


def welch(a: Spread, b: Spread) -> Welch | None:
    """Welch's t-test of equal means (formulas in the module docstring); None unless both
    sides have two values or more. Two spreads without variance: p = 0 when the means
    differ, 1 when they are equal."""
    if a.n < 2 or b.n < 2:
        return None
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    if va + vb == 0.0:
        same = a.mean == b.mean
        t = 0.0 if same else math.copysign(math.inf, a.mean - b.mean)
        return Welch(t=t, df=math.inf, p=float(same))
    t = (a.mean - b.mean) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    return Welch(t=t, df=df, p=student_t_two_sided_p(t, df))


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` > 0 degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return _incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for 0 <= x <= 1 and a, b > 0: its
    continued fraction, on the side of x where that converges fast (I_x(a, b) = 1 -
    I_{1-x}(b, a))."""
    if x <= 0.0 or x >= 1.0:
        return min(max(x, 0.0), 1.0)
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    log_front = a * math.log(x) + b * math.log1p(-x) - math.log(a) - _log_beta(a, b)
    return math.exp(log_front) * _beta_fraction(x, a, b)


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_fraction(x: float, a: float, b: float, steps: int = 300, tol: float = 1e-15) -> float:
    """1 / F, F = 1 + d1 / (1 + d2 / (1 + ...)) with d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m))
    and d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)), evaluated forwards
    (modified Lentz): F is the product of C_k D_k with C_k = 1 + d_k / C_{k-1} and
    D_k = 1 / (1 + d_k D_{k-1}); zeros are nudged to `tiny` so no step divides by zero."""
    tiny = 1e-300
    value, c, d = 1.0, 1.0, 0.0
    for k in range(1, 2 * steps + 1):
        m = k // 2
        if k % 2:
            term = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            term = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + term * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + term / c
        c = c if abs(c) > tiny else tiny
        value *= c * d
        if abs(c * d - 1.0) < tol:
            break
    return 1.0 / value
