"""The theory package's root finders (SciPy's ``elementwise.find_root``) against mpmath.

Issue 22, item 5 replaced hand-written root finders by SciPy's vectorised Chandrupatla
iteration. Each float64 root found here is compared with the true root of the *same*
float64 inputs, computed by mpmath at 40 digits: a sign change of the exact equation is
found next to the float64 root and bisected 130 times. The tolerance is not a number that
happened to pass: it is the finder's stopping width, ``4 eps (1 + |x|)``, plus what the
rounding of the float64 equation allows (its rounding noise ``N`` over the slope,
``N / |g'|``, or ``sqrt(2 N / |g''|)`` next to a double root, whichever is smaller).
``N = 8 eps S`` with ``S`` the sum of the magnitudes of the equation's terms: ``Omega``
is correctly rounded to about one ulp (checked below), and the sum takes a few roundings.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.theory.calibration import Calibration
from grpo_companion.theory.roots import bracketed_roots, fixed_points_logit, scan_roots

EPS = float(np.finfo(np.float64).eps)
DPS = 40

CALS = [
    Calibration(),  # the paper: mean_std, eps = 1e-5 inside the root
    Calibration(eps=0.0),  # Omega = 2 cosh(L / 2): unbounded, a root far out
    Calibration(eps=1e-300),  # bounded only beyond |L| ~ 1380: roots near 1e151
    Calibration(eps=1e-4, eps_placement="std"),
    Calibration(eps=0.0, eps_placement="std"),
    Calibration(normalization="mean_only"),  # Omega = 1: root L_ref + 1 / beta
    Calibration(normalization="max_abs"),
]
LOGITS = [-700.0, -300.0, -40.0, -10.0, -3.0, -0.5, 0.0, 0.5, 3.0, 10.0, 40.0, 300.0, 700.0]
BETAS = [1e-12, 1e-6, 1e-3, 0.05, 0.2, 0.5, 1.0, 2.0, 10.0, 1e3, 1e6, 1e12]


def omega_mp(cal: Calibration, x: mpmath.mpf) -> mpmath.mpf:
    """``Omega(L) = w+ + w-`` of the population calibrations above, in mpmath."""
    if cal.normalization == "mean_only":
        return mpmath.mpf(1)
    p = 1 / (1 + mpmath.exp(-x))
    if cal.normalization == "max_abs":
        return 1 / max(p, 1 - p)
    e = mpmath.exp(-abs(x))
    var = e / (1 + e) ** 2
    if cal.eps_placement == "sqrt":
        return 1 / mpmath.sqrt(var + cal.eps)
    return 1 / (mpmath.sqrt(var) + cal.eps)


def nearest_root(g, x0: float, bisections: int = 130) -> mpmath.mpf | None:
    """The exact root of ``g`` nearest to ``x0``: the closest sign change, bisected.

    ``None`` when there is none within ``2**-20 max(1, |x0|)`` (at a double root the exact
    equation of the float64 inputs may just miss zero)."""
    x0 = mpmath.mpf(x0)
    g0 = g(x0)
    if g0 == 0:
        return x0
    d = mpmath.mpf(2) ** -60 * max(1, abs(x0))
    for _ in range(41):
        for a, b in ((x0 - d, x0), (x0, x0 + d)):
            ga, gb = g(a), g(b)
            if mpmath.sign(ga) * mpmath.sign(gb) <= 0:
                for _ in range(bisections):
                    m = (a + b) / 2
                    gm = g(m)
                    if mpmath.sign(gm) == mpmath.sign(ga):
                        a, ga = m, gm
                    else:
                        b = m
                return (a + b) / 2
        d *= 2
    return None


def allowed_error(g, root: mpmath.mpf, size: mpmath.mpf) -> float:
    """Stopping width plus the rounding noise of the float64 equation over its slope."""
    noise = 8 * EPS * size
    d1, d2 = abs(mpmath.diff(g, root)), abs(mpmath.diff(g, root, 2))
    linear = noise / d1 if d1 > 0 else mpmath.inf
    quadratic = mpmath.sqrt(2 * noise / d2) if d2 > 0 else mpmath.inf
    return float(4 * EPS * (1 + abs(root)) + min(linear, quadratic))


def check_fixed_points(cal: Calibration, lr: np.ndarray, beta: np.ndarray, alpha: float,
                       roots: np.ndarray) -> float:
    """Compare every root with mpmath; return the worst error over its allowance."""
    worst = 0.0
    with mpmath.workdps(DPS):
        for lr_i, b_i, row in zip(lr.ravel(), beta.ravel(), roots.reshape(lr.size, -1),
                                  strict=True):
            c = mpmath.mpf(float(1.0 / (alpha * b_i)))  # the float64 input the code uses
            lr_m = mpmath.mpf(float(lr_i))

            def g(x, c=c, lr_m=lr_m):
                return lr_m + c * omega_mp(cal, x) - x

            found = row[~np.isnan(row)]
            exact = [nearest_root(g, x) for x in found]
            for x, ref in zip(found, exact, strict=True):
                if ref is None:  # no exact root nearby: the residual must be rounding noise
                    x_m = mpmath.mpf(float(x))
                    size = abs(lr_m) + c * omega_mp(cal, x_m) + abs(x_m)
                    worst = max(worst, float(abs(g(x_m)) / (8 * EPS * size)))
                    continue
                size = abs(lr_m) + c * omega_mp(cal, ref) + abs(ref)
                err = float(abs(mpmath.mpf(float(x)) - ref))
                worst = max(worst, err / allowed_error(g, ref, size))
    return worst


@pytest.mark.parametrize("cal", CALS, ids=lambda c: f"{c.normalization}-{c.eps}-{c.eps_placement}")
def test_omega_reference_agrees_with_the_calibration(cal):
    """The mpmath Omega is the calibration's: within 2 ulps on logits out to 700."""
    x = np.array([-700.0, -40.0, -3.0, -0.5, 0.0, 1e-9, 0.7, 5.0, 40.0, 300.0, 700.0])
    got = cal.omega_unchecked(x)
    with mpmath.workdps(DPS):
        want = np.array([float(omega_mp(cal, mpmath.mpf(v))) for v in x])
    np.testing.assert_allclose(got, want, rtol=2 * EPS, atol=0)


@pytest.mark.parametrize("cal", CALS, ids=lambda c: f"{c.normalization}-{c.eps}-{c.eps_placement}")
def test_fixed_points_match_mpmath_from_logit_700_to_700(cal):
    """Every interior fixed point (Theorem 2) on logits -700..700 and beta 1e-12..1e12."""
    lr, beta = np.meshgrid(LOGITS, BETAS, indexing="ij")
    roots = fixed_points_logit(lr, beta, calibration=cal)
    if np.isfinite(cal.omega_sup):  # bounded Omega: at least one per cell (Theorem 3)
        assert np.isfinite(roots).any(axis=-1).all()
    assert check_fixed_points(cal, lr, beta, 1.0, roots) <= 1.0


def test_two_kl_fixed_points_match_mpmath():
    """Table 1, two-KL row: ``alpha beta`` replaces ``beta``."""
    lr, beta = np.meshgrid([-40.0, -3.0, 0.0, 3.0], [1e-3, 0.3, 2.0, 50.0], indexing="ij")
    roots = fixed_points_logit(lr, beta, alpha=0.25)
    assert check_fixed_points(Calibration(), lr, beta, 0.25, roots) <= 1.0


@pytest.mark.parametrize("cal", CALS[:5], ids=lambda c: f"{c.eps}-{c.eps_placement}")
@pytest.mark.parametrize("tangent", [0.5, 3.0, 10.0, 30.0])
def test_fixed_points_next_to_a_double_root(cal, tangent):
    """Saddle-node cells: ``c = 1 / Omega'(L_t)``, ``L_ref = L_t - c Omega(L_t)`` give a
    double root at ``L_t``; moving ``c`` by a relative ``delta`` (down where ``g`` is
    convex, up where it is concave) splits it in two, about ``sqrt(delta)`` apart. The
    error allowance there is the square-root one."""
    lt = np.array([tangent])
    slope = cal.omega_prime_unchecked(lt)[0]
    lr = float(lt[0] - cal.omega_unchecked(lt)[0] / slope)
    curv = np.sign(cal.omega_prime_unchecked(lt * (1 + 1e-6))[0] - slope)  # sign of g''
    cells_lr, cells_beta = [], []
    for delta in (0.0, 1e-15, 1e-12, 1e-9, 1e-6, 1e-3):
        cells_lr.append(lr)
        cells_beta.append(slope / (1.0 - curv * delta))  # beta = 1 / c
    lr_a, beta_a = np.array(cells_lr), np.array(cells_beta)
    roots = fixed_points_logit(lr_a, beta_a, calibration=cal)
    assert check_fixed_points(cal, lr_a, beta_a, 1.0, roots) <= 1.0
    # away from the tangency both roots of the pair are found, one on each side of L_t
    assert ((roots[-3:] < tangent).any(axis=-1) & (roots[-3:] > tangent).any(axis=-1)).all()


def test_fixed_points_of_a_200_grid_are_those_of_each_cell():
    """Vectorised over a (p_ref, beta) grid the roots are those of one cell at a time."""
    lr, beta = np.meshgrid(np.linspace(-6, 2, 9), np.geomspace(0.05, 20, 7), indexing="ij")
    grid = theory.fixed_points_logit(lr, beta)
    for i, j in np.ndindex(lr.shape):
        one = theory.fixed_points_logit(lr[i, j], beta[i, j])
        np.testing.assert_array_equal(grid[i, j][~np.isnan(grid[i, j])], one)


def test_bracketed_roots_keeps_exact_ends_and_accepts_value_slope_pairs():
    """An end where the function is 0 is returned as it is; a (value, slope) pair (the
    form ``theory.regimes`` passes) is read for its value."""
    shift = np.array([1.0, 2.0, 3.0])

    def f(x, i):
        return x - shift[i], np.ones_like(x)

    a, b = np.array([0.0, 2.0, 0.0]), np.array([4.0, 5.0, 3.0])
    got = bracketed_roots(f, a, b, a - shift, b - shift)
    assert got.tolist() == [1.0, 2.0, 3.0]
    assert bracketed_roots(f, np.empty(0), np.empty(0)).shape == (0,)


def test_scan_roots_reaches_the_sign_change_of_the_exact_function():
    """Roots of ``x**3 - k`` (cube roots, correctly rounded by mpmath) and of ``exp(x) - k``
    near 700, to the stopping width of four epsilons."""
    k = np.array([2.0, 3.0, 1e-300, 1e300])

    def g(x, cells):
        return x**3 - k[cells]

    out = scan_roots(g, np.full(4, -1.0), np.array([2.0, 2.0, 1.0, 1e101]), 65)
    with mpmath.workdps(DPS):
        want = [float(mpmath.cbrt(mpmath.mpf(v))) for v in k]
    np.testing.assert_allclose(out[:, 0], want, rtol=8 * EPS, atol=0)
    e = np.array([1e300, 5.0])
    out = scan_roots(lambda x, cells: np.exp(x) - e[cells], np.zeros(2), np.full(2, 708.0), 65)
    with mpmath.workdps(DPS):
        want = [float(mpmath.log(mpmath.mpf(v))) for v in e]
    np.testing.assert_allclose(out[:, 0], want, rtol=8 * EPS, atol=0)


def _reverse_kl_gaps_mp(ref: np.ndarray, adv: np.ndarray, beta: float) -> list:
    """``lam - A`` for ``lam > max A`` with ``sum beta ref / (lam - A) = 1``, by bisection
    in mpmath on ``u = lam - max A`` (``lam`` itself would round to ``max A``)."""
    ref_m = [mpmath.mpf(float(r)) for r in ref]
    adv_m = [mpmath.mpf(float(a)) for a in adv]
    b = mpmath.mpf(float(beta))
    top = max(a for a, r in zip(adv_m, ref_m, strict=True) if r > 0)

    def h(u):
        return sum(b * r / (u + (top - a)) for a, r in zip(adv_m, ref_m, strict=True) if r > 0) - 1

    lo, hi = b * mpmath.mpf(2) ** -1200, 2 * b  # h(lo) > 0 > h(hi)
    for _ in range(400):  # geometric midpoints: the root may be 1e-600 (beta = ref = 1e-300)
        m = mpmath.sqrt(lo * hi)
        if h(m) > 0:
            lo = m
        else:
            hi = m
    u = (lo + hi) / 2
    return [u + (top - a) for a in adv_m]


@pytest.mark.parametrize("beta", [1e-300, 1e-12, 1e-3, 1.0, 1e3, 1e12, 1e300])
def test_reverse_kl_policy_normaliser_matches_mpmath(beta):
    """``pi = beta pi_ref / (lam - A)`` against mpmath, each probability to 16 ulps of
    itself: the gaps ``lam - A`` are solved for directly (to 4 eps), so no digits are lost
    to ``lam`` rounding onto ``max A``, and ``pi`` takes a few more roundings."""
    from grpo_companion.theory.kl_estimators import reverse_kl_policy

    cases = [
        (np.array([0.2, 0.3, 0.5]), np.array([1.0, -1.0, 0.0])),
        (np.array([1e-300, 0.5, 0.5 - 1e-300]), np.array([5.0, 0.0, 0.0])),  # tiny top mass
        (np.array([0.25, 0.25, 0.5]), np.array([1.0, 1.0 - 1e-15, -700.0])),  # near tie
        (np.array([0.0, 0.4, 0.6]), np.array([100.0, 3.0, 2.0])),  # top off the support
        (np.array([1.0, 0.0]), np.array([0.0, 1.0])),  # a single outcome
    ]
    for ref, adv in cases:
        pi = reverse_kl_policy(ref, adv, beta)
        with mpmath.workdps(DPS):
            gaps = _reverse_kl_gaps_mp(ref, adv, beta)
            want = np.array([float(beta * mpmath.mpf(float(r)) / gap) if r > 0 else 0.0
                             for r, gap in zip(ref, gaps, strict=True)])
        assert np.all(np.abs(pi - want) <= 16 * EPS * want), (ref, adv, pi, want)


def _round_slope_mp(lq, lp: float, lr: float, beta: float, omega: float, estimator: str):
    """``dJ/dq`` of one round's objective (``round_step_logit``) and the sum of the
    magnitudes of its terms, in mpmath; ``lq`` the logit of ``q``."""
    def sig(z):
        return 1 / (1 + mpmath.exp(-z))

    lp, lr = mpmath.mpf(lp), mpmath.mpf(lr)
    p, r, q = sig(lp), sig(lr), sig(lq)
    pc, rc, qc = sig(-lp), sig(-lr), sig(-lq)  # 1 - p, 1 - r, 1 - q without cancellation
    b, om = mpmath.mpf(beta), mpmath.mpf(omega)
    # the float64 code takes 1 - p as 1 - expit(L_old) (relative error eps p / (1 - p)) and
    # exp of differences of logs of size log(1 + exp(abs(L))) ~ abs(L): both enter its noise
    logs = [abs(mpmath.log(v)) for v in (r, rc, q, qc)]
    if estimator == "k3":
        t1, t2 = p * (1 - r / q) / q, pc * (1 - rc / qc) / qc
        size = om + b * (p * (1 + r / q * (1 + logs[0] + logs[2])) / q
                         + pc * (1 + rc / qc * (1 + logs[1] + logs[3])) / qc
                         + abs(t2) * p / pc)
    else:
        t1 = p * (mpmath.log(q) - mpmath.log(r)) / q
        t2 = pc * (mpmath.log(qc) - mpmath.log(rc)) / qc
        size = om + b * (abs(t1) + abs(t2) + p * (logs[0] + logs[2]) / q
                         + pc * (logs[1] + logs[3]) / qc + abs(t2) * p / pc)
    return om - b * (t1 - t2), size


@pytest.mark.parametrize("estimator", ["k3", "k2"])
def test_round_step_root_matches_mpmath(estimator):
    """``trained_loss.round_step_logit``'s root of ``dJ/dq`` (found by ``find_root`` in the
    grid cell that brackets it) against the nearest exact root: within the stopping width
    ``2 eps abs(x)`` plus the rounding noise of the float64 slope over its derivative."""
    from grpo_companion.theory.analyses import trained_loss as tl

    cal = Calibration()
    rng = np.random.default_rng(7)
    lp = np.concatenate([rng.uniform(-12, 12, 40), [-300.0, 300.0, 650.0, 3.0]])
    lr = np.concatenate([rng.uniform(-12, 12, 40), [-300.0, 600.0, -650.0, 3.0]])
    beta = np.concatenate([10 ** rng.uniform(-3, 3, 40), [1e-3, 1.0, 10.0, 1.0]])
    got = tl.round_step_logit(lp, lr, beta, estimator=estimator, calibration=cal)
    omega = cal.omega_of_logit(lp)
    worst = 0.0
    with mpmath.workdps(DPS):
        for x, lp_i, lr_i, b_i, om_i in zip(got, lp, lr, beta, omega, strict=True):
            if abs(x) >= 700.0:  # clipped to the logit cap: not a root
                continue

            def f(z, lp_i=lp_i, lr_i=lr_i, b_i=b_i, om_i=om_i):
                return _round_slope_mp(z, lp_i, lr_i, b_i, om_i, estimator)[0]

            ref = nearest_root(f, float(x))
            if ref is None:
                assert x == lp_i  # F(L_old) = 0: the old policy is kept
                continue
            size = _round_slope_mp(ref, lp_i, lr_i, b_i, om_i, estimator)[1]
            slope = abs(mpmath.diff(f, ref))
            allowed = float(2 * EPS * abs(ref) + 16 * EPS * size / slope)
            worst = max(worst, float(abs(mpmath.mpf(float(x)) - ref)) / allowed)
    assert worst <= 1.0
