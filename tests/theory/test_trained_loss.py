"""The PoS recurrence of the trained loss (chapter 8) against independent computations.

Every function of :mod:`grpo_companion.theory.analyses.trained_loss` is checked against
something it does not compute itself: Theorem 2's map and the relaxed
recurrence of :mod:`grpo_companion.theory.analyses.relaxed` for the forward-KL
estimators, a direct scipy maximisation of one iteration's two-outcome
objective for both KLs, the fixed-point equations evaluated with
``Calibration.omega``, and sums written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from grpo_companion import theory
from grpo_companion.theory import Calibration
from grpo_companion.theory.analyses import relaxed
from grpo_companion.theory.analyses import trained_loss as tl

CAL = Calibration(group_size=16)
FORWARD = ("k3_ratio", "k2")
ESTIMATORS = ("k3", "k3_ratio", "k2")
P_PREV = np.array([0.03, 0.2, 0.5, 0.8, 0.97])
P_REF = np.array([0.1, 0.35, 0.5, 0.6, 0.9])


# ------------------------------------------------------------------ one exact step
def _best_pos(p_prev: float, p_ref: float, beta: float, divergence: str) -> float:
    """argmax_p of p w+ - (1 - p) w- - beta D over two-outcome policies, by scipy."""
    w_plus, w_minus = (float(w) for w in CAL.weights(p_prev))

    def negative_objective(p: float) -> float:
        if divergence == "reverse":  # KL(ref || pi)
            kl = p_ref * np.log(p_ref / p) + (1 - p_ref) * np.log((1 - p_ref) / (1 - p))
        else:  # KL(pi || ref)
            kl = p * np.log(p / p_ref) + (1 - p) * np.log((1 - p) / (1 - p_ref))
        return -(p * w_plus - (1 - p) * w_minus - beta * kl)

    best = optimize.minimize_scalar(negative_objective, bounds=(1e-12, 1 - 1e-12),
                                    method="bounded", options={"xatol": 1e-12, "maxiter": 2000})
    assert best.success
    return float(best.x)


def _stationary_pos(p_prev: float, p_ref: float, beta: float) -> float:
    """The zero of the reverse-KL objective's derivative: w+ + w- = beta ((1-r)/(1-p) - r/p)."""
    w_plus, w_minus = (float(w) for w in CAL.weights(p_prev))
    omega = w_plus + w_minus
    return optimize.brentq(lambda p: omega - beta * ((1 - p_ref) / (1 - p) - p_ref / p),
                           1e-15, 1 - 1e-15, xtol=1e-16, rtol=1e-15)


@pytest.mark.parametrize("estimator", FORWARD)
@pytest.mark.parametrize("beta", [0.25, 1.0, 4.0])
def test_forward_step_is_theorem_2s_map(estimator, beta):
    lp, lr = theory.logit(P_PREV), theory.logit(P_REF)
    got = tl.exact_step_logit(lp, lr, beta, estimator=estimator, calibration=CAL)
    np.testing.assert_allclose(got, theory.pos_map_logit(lp, lr, beta, calibration=CAL),
                               rtol=1e-13, atol=1e-13)
    # and written out: L_ref + Omega(p_prev) / beta, Omega = w+ + w- of a group of 16
    w_plus, w_minus = CAL.weights(P_PREV)
    np.testing.assert_allclose(got, lr + (w_plus + w_minus) / beta, rtol=1e-12, atol=1e-12)
    # the calibration keywords give the same calibration
    np.testing.assert_array_equal(got, tl.exact_step_logit(lp, lr, beta, estimator=estimator,
                                                           group_size=16))


@pytest.mark.parametrize("estimator", FORWARD)
def test_forward_step_maximises_the_forward_kl_objective(estimator):
    beta = 0.7
    got = theory.sigmoid(tl.exact_step_logit(theory.logit(P_PREV), theory.logit(P_REF), beta,
                                             estimator=estimator, calibration=CAL))
    direct = [_best_pos(a, r, beta, "forward") for a, r in zip(P_PREV, P_REF, strict=True)]
    np.testing.assert_allclose(got, direct, atol=1e-7, rtol=0)


@pytest.mark.parametrize("beta", [0.2, 1.0, 5.0])
def test_reverse_step_maximises_the_reverse_kl_objective(beta):
    got = theory.sigmoid(tl.exact_step_logit(theory.logit(P_PREV), theory.logit(P_REF), beta,
                                             estimator="k3", calibration=CAL))
    direct = [_best_pos(a, r, beta, "reverse") for a, r in zip(P_PREV, P_REF, strict=True)]
    np.testing.assert_allclose(got, direct, atol=1e-7, rtol=0)
    stationary = [_stationary_pos(a, r, beta) for a, r in zip(P_PREV, P_REF, strict=True)]
    np.testing.assert_allclose(got, stationary, atol=1e-12, rtol=1e-10)
    # not the forward-KL step: the two estimators train different objectives
    forward = theory.sigmoid(tl.exact_step_logit(theory.logit(P_PREV), theory.logit(P_REF), beta,
                                                 estimator="k3_ratio", calibration=CAL))
    assert np.max(np.abs(got - forward)) > 1e-3


def test_the_exact_kl_is_a_forward_kl():
    lp, lr = theory.logit(P_PREV), theory.logit(P_REF)
    np.testing.assert_array_equal(
        tl.exact_step_logit(lp, lr, 0.5, estimator="exact", calibration=CAL),
        tl.exact_step_logit(lp, lr, 0.5, estimator="k2", calibration=CAL))


def test_step_broadcasts_and_keeps_the_shape():
    lp = theory.logit(P_PREV)[:, None]
    lr = theory.logit(P_REF)[None, :]
    beta = np.array([0.5, 2.0])[:, None, None]
    for estimator in ESTIMATORS:
        got = tl.exact_step_logit(lp, lr, beta, estimator=estimator, calibration=CAL)
        assert got.shape == (2, 5, 5)
        one = tl.exact_step_logit(lp[3, 0], lr[0, 2], 2.0, estimator=estimator, calibration=CAL)
        assert got[1, 3, 2] == pytest.approx(float(one), rel=1e-12)


# ------------------------------------------------------------------ relaxed path
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_fraction_one_repeats_the_exact_step(estimator):
    lr = theory.logit(P_REF)
    path = tl.relaxed_path_logit(lr, 0.8, 6, 1.0, estimator=estimator, calibration=CAL)
    assert path.shape == (7, len(P_REF))
    by_hand = [lr]
    for _ in range(6):
        by_hand.append(tl.exact_step_logit(by_hand[-1], lr, 0.8, estimator=estimator,
                                           calibration=CAL))
    np.testing.assert_allclose(path, np.array(by_hand), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("estimator", FORWARD)
@pytest.mark.parametrize("fraction", [0.03, 0.4, 1.0])
def test_forward_path_is_the_relaxed_recurrence(estimator, fraction):
    beta, n = 0.6, 25
    path = tl.relaxed_path_logit(theory.logit(P_REF), beta, n, fraction, estimator=estimator,
                                 calibration=CAL)
    expected = relaxed.relaxed_iterate(P_REF, P_REF, beta, n, fraction, calibration=CAL)
    np.testing.assert_allclose(theory.sigmoid(path), expected, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(path, theory.logit(expected), rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("estimator", ["k3", "k3_ratio"])
def test_reverse_path_interpolates_by_hand(estimator):
    lr, lam, beta = theory.logit(P_REF), 0.3, 1.5
    path = tl.relaxed_path_logit(lr, beta, 5, lam, estimator=estimator, calibration=CAL)
    current = lr
    for n in range(1, 6):
        exact = tl.exact_step_logit(current, lr, beta, estimator=estimator, calibration=CAL)
        current = (1 - lam) * current + lam * exact
        np.testing.assert_allclose(path[n], current, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("estimator", ["k3", "k3_ratio"])
@pytest.mark.parametrize("beta", [1.0, 3.0])
def test_small_steps_end_at_the_destination(estimator, beta):
    p_ref = np.array([0.05, 0.3, 0.6, 0.9])
    goal = tl.destination(p_ref, beta, estimator=estimator, calibration=CAL)
    slow = tl.relaxed_path_logit(theory.logit(p_ref), beta, 400, 0.1, estimator=estimator,
                                 calibration=CAL)
    np.testing.assert_allclose(theory.sigmoid(slow[-1]), goal, atol=1e-6, rtol=0)
    # small steps move monotonically up from p_ref
    assert np.all(np.diff(slow, axis=0) >= -1e-12)
    # the same fixed point, whatever the fraction (here: a fixed point of the exact step)
    at_goal = tl.exact_step_logit(theory.logit(goal), theory.logit(p_ref), beta,
                                  estimator=estimator, calibration=CAL)
    np.testing.assert_allclose(theory.sigmoid(at_goal), goal, atol=1e-9, rtol=0)
    faster = tl.relaxed_path_logit(theory.logit(p_ref), beta, 120, 0.35, estimator=estimator,
                                   calibration=CAL)
    np.testing.assert_allclose(theory.sigmoid(faster[-1]), goal, atol=1e-6, rtol=0)


# ------------------------------------------------------------------ destination
def _drift(p: np.ndarray, p_ref: float, beta: float, divergence: str) -> np.ndarray:
    """Positive where small steps move up: the fixed-point equation, by hand."""
    omega = CAL.omega(p)
    if divergence == "reverse":  # p (1 - p) Omega(p) - beta (p - p_ref)
        return p * (1 - p) * omega - beta * (p - p_ref)
    return theory.logit(p_ref) + omega / beta - theory.logit(p)  # T(L) - L


@pytest.mark.parametrize("beta", [0.3, 1.0, 3.0])
def test_reverse_destination_is_the_first_root_above_p_ref(beta):
    p_ref = np.array([0.05, 0.3, 0.6, 0.9])
    goal = tl.destination(p_ref, beta, estimator="k3", calibration=CAL)
    assert goal.shape == p_ref.shape
    assert np.all((goal >= p_ref) & (goal < 1))
    residual = goal * (1 - goal) * CAL.omega(goal) - beta * (goal - p_ref)
    np.testing.assert_allclose(residual, 0.0, atol=1e-10)
    for pr, g in zip(p_ref, goal, strict=True):  # no root between p_ref and the destination
        grid = np.linspace(pr, g, 2001)[:-1]
        assert np.all(_drift(grid, pr, beta, "reverse") > 0)


@pytest.mark.parametrize("estimator", FORWARD)
@pytest.mark.parametrize("beta", [0.3, 1.0, 3.0])
def test_forward_destination_is_the_smallest_fixed_point_above_p_ref(estimator, beta):
    p_ref = np.array([0.05, 0.3, 0.6, 0.9])
    goal = tl.destination(p_ref, beta, estimator=estimator, calibration=CAL)
    for pr, g in zip(p_ref, goal, strict=True):
        roots = np.atleast_1d(theory.fixed_points(pr, beta, calibration=CAL))
        assert g == pytest.approx(roots[roots >= pr].min(), abs=1e-14)
        # the Theorem 2 fixed-point equation, by hand
        assert theory.logit(pr) + float(CAL.omega(g)) / beta == pytest.approx(
            theory.logit(g), abs=1e-8)
        grid = np.linspace(pr, g, 2001)[:-1]
        assert np.all(_drift(grid, pr, beta, "forward") > 0)


def test_destination_with_several_fixed_points_stops_at_the_first():
    # the population mean_std calibration: three fixed points for these p_ref (Theorem 3)
    cal, beta = Calibration(), 1.0
    p_ref = np.array([0.01, 0.1, 0.2])
    goal = tl.destination(p_ref, beta, estimator="k2", calibration=cal)
    path = tl.relaxed_path_logit(theory.logit(p_ref), beta, 300, 0.1, estimator="k2",
                                 calibration=cal)
    np.testing.assert_allclose(theory.sigmoid(path[-1]), goal, atol=1e-6, rtol=0)
    for pr, g in zip(p_ref, goal, strict=True):
        roots = np.atleast_1d(theory.fixed_points(pr, beta, calibration=cal))
        assert roots.size == 3 and roots[0] > pr
        assert g == pytest.approx(roots[0], abs=1e-14) and g < 0.7


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_absorbing_references_stay(estimator):
    got = tl.destination([0.0, 1.0, 0.4], 1.0, estimator=estimator, calibration=CAL)
    assert got[0] == 0.0 and got[1] == 1.0 and 0.4 < got[2] < 1.0


# ------------------------------------------------------------------ fitting
@pytest.mark.parametrize("estimator", ["k3", "k3_ratio"])
def test_fit_recovers_the_step_fraction(estimator):
    p_ref = np.linspace(0.05, 0.9, 8)
    beta, lam = 0.5, 0.03
    steps = np.arange(0, 101, 5)
    path = tl.relaxed_path_logit(theory.logit(p_ref), beta, 100, lam, estimator=estimator,
                                 calibration=CAL)
    observed = path[steps]
    assert np.max(np.abs(theory.sigmoid(observed[-1]) - p_ref)) > 0.05  # the runs move
    fitted = tl.fit_step_fraction(observed, steps, beta, estimator=estimator, calibration=CAL)
    assert fitted == pytest.approx(lam, rel=0.02)


def test_fit_uses_the_named_estimator():
    # a forward-KL trajectory fitted as reverse-KL gives a different fraction
    p_ref = np.linspace(0.05, 0.9, 8)
    steps = np.arange(0, 41, 10)
    observed = tl.relaxed_path_logit(theory.logit(p_ref), 0.5, 40, 0.1, estimator="k2",
                                     calibration=CAL)[steps]
    right = tl.fit_step_fraction(observed, steps, 0.5, estimator="k2", calibration=CAL)
    assert right == pytest.approx(0.1, rel=0.02)
    wrong = tl.fit_step_fraction(observed, steps, 0.5, estimator="k3", calibration=CAL)
    assert abs(wrong / 0.1 - 1) > 0.05


# ------------------------------------------------------------------ baselines and distances
def test_common_shift_is_the_mean_logit_change():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(6, 9))
    got = tl.common_shift(logits)
    assert got.shape == (6,)
    by_hand = [sum(logits[n, j] - logits[0, j] for j in range(9)) / 9 for n in range(6)]
    np.testing.assert_allclose(got, by_hand, rtol=1e-13, atol=1e-14)
    assert got[0] == 0.0


def _random_log_softmax(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    x = rng.normal(scale=1.5, size=shape)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _target_policy(ref_log_probs: np.ndarray, correct: np.ndarray,
                   logit_target: np.ndarray) -> np.ndarray:
    """p* on the correct column, (1 - p*) ref / ref_fail_mass on the others, by loops."""
    ref = np.exp(ref_log_probs)
    out = np.empty_like(ref)
    for i in range(ref.shape[0]):
        p_star = 1 / (1 + np.exp(-logit_target[i]))
        fail_mass = sum(ref[i, o] for o in range(ref.shape[1]) if o != correct[i])
        for o in range(ref.shape[1]):
            out[i, o] = p_star if o == correct[i] else (1 - p_star) * ref[i, o] / fail_mass
    return out


def test_one_step_tv_is_half_the_l1_distance():
    rng = np.random.default_rng(11)
    log_pi, log_ref = _random_log_softmax(rng, (4, 7)), _random_log_softmax(rng, (4, 7))
    correct = np.array([0, 3, 6, 3])
    target = np.array([-1.0, 0.3, 2.0, 4.5])
    tv, pos_part = tl.one_step_tv(log_pi, log_ref, correct, target)
    assert tv.shape == pos_part.shape == (4,)
    star = _target_policy(log_ref, correct, target)
    np.testing.assert_allclose(star.sum(axis=1), 1.0, rtol=1e-14)
    pi = np.exp(log_pi)
    by_hand = [0.5 * sum(abs(pi[i, o] - star[i, o]) for o in range(7)) for i in range(4)]
    np.testing.assert_allclose(tv, by_hand, rtol=1e-12, atol=1e-15)
    pos_by_hand = [0.5 * abs(pi[i, correct[i]] - star[i, correct[i]]) for i in range(4)]
    np.testing.assert_allclose(pos_part, pos_by_hand, rtol=1e-12, atol=1e-15)
    assert np.all(pos_part <= tv) and np.all(tv <= 1)


def test_one_step_tv_is_zero_at_the_optimum():
    rng = np.random.default_rng(5)
    log_ref = _random_log_softmax(rng, (4, 7))
    correct = np.array([2, 0, 6, 1])
    target = np.array([0.5, -2.0, 1.0, 3.0])
    star = _target_policy(log_ref, correct, target)
    tv, pos_part = tl.one_step_tv(np.log(star), log_ref, correct, target)
    np.testing.assert_allclose(tv, 0.0, atol=1e-14)
    np.testing.assert_allclose(pos_part, 0.0, atol=1e-15)
    # pi = pi_ref is at distance |p_ref - p*| (the failures differ only in their mass)
    tv_ref, pos_ref = tl.one_step_tv(log_ref, log_ref, correct, target)
    p_ref = np.exp(log_ref[np.arange(4), correct])
    np.testing.assert_allclose(tv_ref, np.abs(p_ref - theory.sigmoid(target)), rtol=1e-12)
    np.testing.assert_allclose(pos_ref, 0.5 * np.abs(p_ref - theory.sigmoid(target)),
                               rtol=1e-12)


def test_one_step_tv_takes_a_negligible_output():
    # log-probability -1e4: an output of probability 0 to double precision
    log_ref = np.log(np.array([[0.5, 0.3, 0.2, 1.0]]))
    log_ref[0, 3] = -1e4
    log_pi = np.log(np.array([[0.6, 0.1, 0.1, 0.2]]))
    tv, pos_part = tl.one_step_tv(log_pi, log_ref, np.array([0]), np.array([0.0]))
    # p* = 0.5; the failures get 0.5 * (0.6, 0.4, 0)
    assert float(tv[0]) == pytest.approx(0.5 * (0.1 + 0.2 + 0.1 + 0.2), abs=1e-15)
    assert float(pos_part[0]) == pytest.approx(0.05, abs=1e-15)


# ------------------------------------------------------------------ bad input
def _callers(estimator: object) -> list:
    lr = theory.logit(P_REF)
    steps = np.arange(3)
    obs = np.tile(lr, (3, 1))
    return [
        lambda: tl.exact_step_logit(lr, lr, 1.0, estimator=estimator),
        lambda: tl.relaxed_path_logit(lr, 1.0, 3, 0.5, estimator=estimator),
        lambda: tl.destination(P_REF, 1.0, estimator=estimator),
        lambda: tl.fit_step_fraction(obs, steps, 1.0, estimator=estimator),
    ]


@pytest.mark.parametrize("estimator", ["k1", "bogus", "K3", None, 3])
def test_estimators_without_a_fixed_point_are_refused(estimator):
    for call in _callers(estimator):
        with pytest.raises(ValueError, match="estimator must be one of"):
            call()


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1, float("nan")])
def test_bad_step_fraction_is_refused(fraction):
    with pytest.raises(ValueError, match="step_fraction"):
        tl.relaxed_path_logit(0.0, 1.0, 3, fraction)


@pytest.mark.parametrize("call", [
    lambda: tl.exact_step_logit(np.nan, 0.0, 1.0),
    lambda: tl.exact_step_logit([0.0, np.nan], 0.0, 1.0),
    lambda: tl.exact_step_logit(0.0, np.nan, 1.0),
    lambda: tl.relaxed_path_logit([0.0, np.nan], 1.0, 3, 0.5),
    lambda: tl.common_shift([[0.0, 1.0], [np.nan, 1.0]]),
    lambda: tl.fit_step_fraction([[0.0, 1.0], [np.nan, 1.0]], [0, 1], 1.0),
    lambda: tl.one_step_tv(np.log([[0.5, 0.5]]), np.log([[0.5, 0.5]]), [0], [np.nan]),
], ids=["logit_p", "logit_p_array", "logit_p_ref", "path", "common_shift", "fit", "tv"])
def test_nan_logits_are_refused(call):
    with pytest.raises(ValueError, match=r"logit_p\b|logit_p_ref|logit_success|logit_target"):
        call()


def test_bad_beta_and_p_ref_are_refused():
    with pytest.raises(ValueError, match="beta"):
        tl.exact_step_logit(0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="beta"):
        tl.relaxed_path_logit(0.0, -1.0, 3, 0.5)
    with pytest.raises(ValueError, match="p_ref"):
        tl.destination(1.5, 1.0)
    with pytest.raises(ValueError, match="n_steps"):
        tl.relaxed_path_logit(0.0, 1.0, 2.5, 0.5)


HALF = np.log([[0.5, 0.5], [0.25, 0.75]])


@pytest.mark.parametrize(("args", "name"), [
    ((HALF, HALF[:1], [0, 1], [0.0, 0.0]), "log_probs"),
    ((HALF[0], HALF[0], [0], [0.0]), "log_probs"),
    ((HALF[:, :1], HALF[:, :1], [0, 0], [0.0, 0.0]), "log_probs"),
    ((-HALF, HALF, [0, 1], [0.0, 0.0]), "log_probs"),
    ((HALF, -HALF, [0, 1], [0.0, 0.0]), "ref_log_probs"),
    ((HALF, HALF, [0, 2], [0.0, 0.0]), "correct"),
    ((HALF, HALF, [-1, 0], [0.0, 0.0]), "correct"),
    ((HALF, HALF, [0.0, 1.0], [0.0, 0.0]), "correct"),
    ((HALF, HALF, [0], [0.0, 0.0]), "correct"),
    ((HALF, HALF, [0, 1], [0.0]), "logit_target"),
])
def test_one_step_tv_refuses_bad_shapes(args, name):
    with pytest.raises(ValueError, match=name):
        tl.one_step_tv(*args)


@pytest.mark.parametrize(("steps", "obs_rows"), [
    ([1, 2, 3], 3), ([0, 2, 1], 3), ([0, 1], 3), ([0.0, 1.0, 2.0], 3), ([[0, 1, 2]], 3),
])
def test_fit_refuses_bad_steps(steps, obs_rows):
    obs = np.zeros((obs_rows, 2))
    with pytest.raises(ValueError, match="steps must be increasing ints starting at 0"):
        tl.fit_step_fraction(obs, steps, 1.0)


@pytest.mark.parametrize("obs", [np.zeros(3), np.zeros((1, 2)), np.zeros((3, 0))])
def test_fit_refuses_bad_trajectories(obs):
    with pytest.raises(ValueError, match="logit_success must have shape"):
        tl.fit_step_fraction(obs, np.arange(len(obs)), 1.0)


def test_common_shift_refuses_bad_shapes():
    for obs in (np.zeros(3), np.zeros((2, 0)), np.zeros((2, 2, 2))):
        with pytest.raises(ValueError, match="logit_success must have shape"):
            tl.common_shift(obs)


# ---------------------------------------------------------------- judge (the pre-stated test)
def _synthetic(lam: float, n_prompts: int, seed: int,
               noise: float) -> tuple[np.ndarray, np.ndarray]:
    cal = Calibration(group_size=16)
    rng = np.random.default_rng(seed)
    l_ref = rng.normal(0.0, 2.0, n_prompts)
    steps = np.arange(0, 101, 10)
    path = tl.relaxed_path_logit(l_ref, 0.1, 100, lam, estimator="k3", calibration=cal)[steps]
    return path + noise * rng.normal(size=path.shape) * (steps[:, None] > 0), steps


def _judge_k3(judged, fit, steps, lam, beta=0.1, margin=0.8):
    cal = Calibration(group_size=16)
    preds = tl.prompt_blind_predictions(judged, steps, fit)
    preds["k3"] = tl.relaxed_path_logit(judged[0], beta, int(steps[-1]), lam, estimator="k3",
                                        calibration=cal)[steps]
    return tl.judge(judged, preds, predictor="k3", baselines=tl.PROMPT_BLIND, margin=margin)


def test_judge_passes_trajectories_that_follow_the_recurrence():
    cal = Calibration(group_size=16)
    fit, steps = _synthetic(0.05, 32, 0, 0.05)
    lam = tl.fit_step_fraction(fit, steps, 0.1, estimator="k3", calibration=cal)
    judged, _ = _synthetic(0.05, 32, 1, 0.05)
    verdict = _judge_k3(judged, fit, steps, lam)
    assert verdict.passed and verdict.ratio < 0.8 and verdict.n_prompts == 32
    assert set(verdict.rmse) == {"k3", *tl.PROMPT_BLIND}
    assert all(verdict.rmse["k3"] < verdict.rmse[b] for b in tl.PROMPT_BLIND)


def test_judge_fails_trajectories_that_do_not():
    """The check can fail: prompts that move by a common logit shift, not by the recurrence."""
    cal = Calibration(group_size=16)
    fit, steps = _synthetic(0.05, 32, 0, 0.0)
    shift = tl.common_shift(fit)
    lam = tl.fit_step_fraction(fit, steps, 0.1, estimator="k3", calibration=cal)
    rng = np.random.default_rng(2)
    l_ref = rng.normal(0.0, 2.0, 32)
    prompt_blind = l_ref[None, :] + shift[:, None]
    verdict = _judge_k3(prompt_blind, fit, steps, lam)
    assert not verdict.passed and verdict.rmse["common shift"] == pytest.approx(0.0, abs=1e-12)
    assert verdict.best_baseline == "common shift"
    frozen = np.broadcast_to(l_ref, prompt_blind.shape)
    verdict = _judge_k3(frozen, fit, steps, lam)
    assert not verdict.passed and verdict.rmse["no change"] == 0.0


def test_judge_fails_prompts_that_all_relax_to_one_level():
    """The audit's case: destinations that do not depend on p_ref lose to the relaxation.

    Every prompt's logit approaches one level at one rate; the recurrence at
    beta = 0.1 predicts destinations that vary little with p_ref too, so only a
    baseline that can express one common level tells the two apart.
    """
    cal = Calibration(group_size=16)
    rng = np.random.default_rng(5)
    steps = np.arange(0, 101, 10)
    l_fit, l_judged = rng.normal(0.0, 2.0, 32), rng.normal(0.0, 2.0, 32)
    fit = tl.relaxation_path_logit(l_fit, steps, 3.0, 0.06)
    judged = tl.relaxation_path_logit(l_judged, steps, 3.0, 0.06)
    lam = tl.fit_step_fraction(fit, steps, 0.1, estimator="k3", calibration=cal)
    verdict = _judge_k3(judged, fit, steps, lam)
    assert not verdict.passed and verdict.best_baseline == "relaxation to a level"
    assert verdict.rmse["relaxation to a level"] < 1e-5


def test_judge_margin_decides():
    cal = Calibration(group_size=16)
    fit, steps = _synthetic(0.05, 16, 0, 0.3)
    lam = tl.fit_step_fraction(fit, steps, 0.1, estimator="k3", calibration=cal)
    strict = _judge_k3(fit, fit, steps, lam, margin=1e-6)
    loose = _judge_k3(fit, fit, steps, lam, margin=10.0)
    assert strict.ratio == loose.ratio and not strict.passed and loose.passed


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(predictions={}), "predictions must be a non-empty dict"),
    (dict(predictor="nope"), "predictor must name one of predictions"),
    (dict(baselines=("nope",)), "baselines must be a non-empty tuple"),
    (dict(baselines=("x",)), "baselines must be a non-empty tuple"),  # the predictor itself
    (dict(baselines=()), "baselines must be a non-empty tuple"),
    (dict(predictions={"x": np.zeros((3, 2)), "a": np.zeros((2, 2))}), r"predictions\['a'\]"),
    (dict(predictions={"x": np.zeros((3, 2)), "a": np.full((3, 2), np.nan)}), r"predictions"),
])
def test_judge_refuses_bad_predictions(kwargs, match):
    call = {"logit_success": np.zeros((3, 2)), "predictor": "x", "baselines": ("a",),
            "predictions": {"x": np.zeros((3, 2)), "a": np.ones((3, 2))}, **kwargs}
    with pytest.raises(ValueError, match=match):
        tl.judge(**call)


def test_relaxation_fit_recovers_its_constants():
    rng = np.random.default_rng(0)
    steps = np.arange(0, 161, 10)
    l_ref = rng.normal(-0.5, 2.0, 40)
    data = tl.relaxation_path_logit(l_ref, steps, 2.5, 0.04)
    level, rate = tl.fit_relaxation(data, steps)
    # exact data: the least-squares optimum is the truth; Nelder-Mead's xatol is 1e-6
    assert level == pytest.approx(2.5, abs=1e-4) and rate == pytest.approx(0.04, rel=1e-3)
    np.testing.assert_allclose(tl.relaxation_path_logit(l_ref, steps, level, rate)[0], l_ref)


def test_mean_trajectory_is_the_logit_of_the_mean_pos():
    obs = np.array([[0.0, np.log(3.0)], [np.log(1 / 3), 0.0]])  # PoS (0.5, 0.75), (0.25, 0.5)
    np.testing.assert_allclose(tl.mean_trajectory(obs), [np.log(0.625 / 0.375),
                                                          np.log(0.375 / 0.625)])


def test_prompt_blind_predictions_fit_each_group_on_its_own():
    """Two groups of prompts that relax to different levels: each group gets its own."""
    rng = np.random.default_rng(1)
    steps = np.arange(0, 101, 10)
    l_fit, l_judged = rng.normal(0.0, 1.5, 20), rng.normal(0.0, 1.5, 10)
    fit_group, group = np.repeat([0, 1], 10), np.repeat([0, 1], 5)
    level = {0: 3.0, 1: -2.0}
    fit = np.concatenate([tl.relaxation_path_logit(l_fit[fit_group == g], steps, level[g], 0.05)
                          for g in (0, 1)], axis=1)
    judged = np.concatenate([tl.relaxation_path_logit(l_judged[group == g], steps, level[g],
                                                      0.05) for g in (0, 1)], axis=1)
    preds = tl.prompt_blind_predictions(judged, steps, fit, group=group, fit_group=fit_group)
    assert list(preds) == list(tl.PROMPT_BLIND)
    np.testing.assert_allclose(preds["relaxation to a level"], judged, atol=1e-4)
    np.testing.assert_array_equal(preds["no change"], np.broadcast_to(judged[0], judged.shape))
    for g in (0, 1):
        np.testing.assert_allclose(preds["mean trajectory"][:, group == g],
                                   np.repeat(tl.mean_trajectory(fit[:, fit_group == g])[:, None],
                                             5, axis=1))
    pooled = tl.prompt_blind_predictions(judged, steps, fit)  # one group: one level for all
    assert np.abs(pooled["relaxation to a level"] - judged).max() > 0.5
    with pytest.raises(ValueError, match="group labels"):
        tl.prompt_blind_predictions(judged, steps, fit, group=group + 5, fit_group=fit_group)
    with pytest.raises(ValueError, match="fit_group"):
        tl.prompt_blind_predictions(judged, steps, fit, group=group, fit_group=group)


def test_kernel_reference_learns_a_smooth_function_of_p_ref_and_beta():
    """Trajectories that are a smooth function of (L_ref, log beta): the kernel reference
    predicts held prompts much better than the best prompt-blind baseline."""
    cal = Calibration(group_size=16)
    rng = np.random.default_rng(3)
    steps = np.arange(0, 81, 10)
    betas = np.array([0.1, 0.3, 1.0, 3.0])

    def make(n):
        l_ref, b = rng.normal(-0.5, 1.5, n), betas[rng.integers(0, 4, n)]
        return tl.relaxed_path_logit(l_ref, b, 80, 0.05, estimator="k3",
                                     calibration=cal)[steps], b

    fit, fit_b = make(200)
    judged, b = make(40)
    got = tl.kernel_reference(judged[0], b, fit, fit_b)
    assert got.shape == judged.shape
    np.testing.assert_array_equal(got[0], judged[0])
    err = np.sqrt(np.mean((theory.sigmoid(got[1:]) - theory.sigmoid(judged[1:])) ** 2))
    blind = tl.prompt_blind_predictions(judged, steps, fit)
    best = min(np.sqrt(np.mean((theory.sigmoid(v[1:]) - theory.sigmoid(judged[1:])) ** 2))
               for v in blind.values())
    assert err < 0.3 * best
    with pytest.raises(ValueError, match="fit_beta"):
        tl.kernel_reference(judged[0], b, fit, fit_b[:3])


def test_round_step_path_has_the_divergence_paths_destination():
    """The relaxed recurrence of the solved round goes elsewhere in one step, not in the end."""
    cal = Calibration(group_size=16)
    l_ref = theory.logit(np.array([0.05, 0.3, 0.7]))
    div = tl.relaxed_path_logit(l_ref, 1.0, 600, 0.1, estimator="k3", calibration=cal)
    rnd = tl.relaxed_path_logit(l_ref, 1.0, 600, 0.1, estimator="k3", step="round",
                                calibration=cal)
    assert np.abs(div[1] - rnd[1]).min() > 1e-3  # the first steps differ
    dest = theory.logit(tl.destination(theory.sigmoid(l_ref), 1.0, estimator="k3",
                                       calibration=cal))
    np.testing.assert_allclose(rnd[-1], dest, atol=1e-6)
    np.testing.assert_allclose(div[-1], dest, atol=1e-6)
    np.testing.assert_allclose(rnd[1], 0.9 * l_ref + 0.1 * tl.round_step_logit(
        l_ref, l_ref, 1.0, estimator="k3", calibration=cal), rtol=1e-12)
    with pytest.raises(ValueError, match="step must be one of"):
        tl.relaxed_path_logit(l_ref, 1.0, 3, 0.1, step="exact")


def test_per_prompt_beta_is_each_prompts_own_recurrence():
    cal = Calibration(group_size=16)
    l_ref = np.array([-2.0, 0.0, 1.0])
    betas = np.array([0.1, 1.0, 3.0])
    both = tl.relaxed_path_logit(l_ref, betas, 20, 0.2, estimator="k3", calibration=cal)
    for j in range(3):
        alone = tl.relaxed_path_logit(l_ref[j], float(betas[j]), 20, 0.2, estimator="k3",
                                      calibration=cal)
        # the same arithmetic, vectorised: equal up to the rounding of a few ulp
        np.testing.assert_allclose(both[:, j], alone, rtol=1e-13, atol=1e-14)
    with pytest.raises(ValueError, match="beta"):
        tl.relaxed_path_logit(l_ref, betas[:2], 20, 0.2)


def test_fit_with_per_prompt_beta_recovers_the_step_fraction():
    cal = Calibration(group_size=16)
    rng = np.random.default_rng(4)
    l_ref, betas = rng.normal(0.0, 1.5, 24), np.resize([0.1, 0.3, 1.0, 3.0], 24)
    steps = np.arange(0, 61, 6)
    data = tl.relaxed_path_logit(l_ref, betas, 60, 0.07, estimator="k3",
                                 calibration=cal)[steps]
    got = tl.fit_step_fraction(data, steps, betas, estimator="k3", calibration=cal)
    assert got == pytest.approx(0.07, rel=2e-3)  # minimize_scalar's xatol 1e-3 in log
    wrong = tl.fit_step_fraction(data, steps, 0.1, estimator="k3", calibration=cal)
    assert abs(wrong - 0.07) > 0.01  # one beta for all fits other data


def test_signal_delayed_path_holds_until_the_first_signal():
    cal = Calibration(group_size=16)
    l_ref = theory.logit(np.array([1e-4, 1e-4, 1e-4]))
    first = np.array([1, 5, 99])
    got = tl.signal_delayed_path_logit(l_ref, 0.1, 20, 0.1, first, estimator="k3",
                                       calibration=cal)
    free = tl.relaxed_path_logit(l_ref, 0.1, 20, 0.1, estimator="k3", calibration=cal)
    np.testing.assert_array_equal(got[:, 0], free[:, 0])  # a signal at once: the recurrence
    np.testing.assert_array_equal(got[:5, 1], np.full(5, l_ref[1]))
    np.testing.assert_array_equal(got[5:, 1], free[1:17, 1])  # iteration 5 is its first step
    np.testing.assert_array_equal(got[:, 2], np.full(21, l_ref[2]))  # never: stays
    for bad in ([0, 1, 2], [1.5, 2, 3], [np.nan, 1, 1], [1, 2]):
        with pytest.raises(ValueError, match="first_signal"):
            tl.signal_delayed_path_logit(l_ref, 0.1, 20, 0.1, bad)


def test_split_prompts_is_a_seeded_partition_into_halves():
    fit, judge_half = tl.split_prompts(11, seed=4)
    assert len(fit) == 5 and len(judge_half) == 6
    np.testing.assert_array_equal(np.sort(np.concatenate([fit, judge_half])), np.arange(11))
    np.testing.assert_array_equal(tl.split_prompts(11, seed=4)[0], fit)
    assert not np.array_equal(tl.split_prompts(11, seed=5)[0], fit)
    with pytest.raises(ValueError, match="n_prompts"):
        tl.split_prompts(1)


# ------------------------------------------------------------ one round of the sampled loss
def _round_reference(p_old: float, p_ref: float, beta: float, estimator: str,
                     cal: Calibration = CAL) -> tuple[float, float]:
    """argmax over the success logit of the round objective, written from the estimators.

    ``J(q) = E_{o ~ pi_old}[ratio A - beta k(o)]`` over the two outcomes, with
    ``k`` as ``rl.losses.kl_penalty`` defines it (``d = log pi_ref - log pi``):
    the maximum that ascent from ``q = p_old`` reaches is located by walking a
    dense grid of ``q`` from ``p_old`` in the direction in which ``J`` rises,
    to the first grid point where it falls; then ``dJ/dq`` (differentiated by
    hand in probability space) is solved by ``brentq`` in the cells on each
    side. Returns the logit and its error bound (the final bracket, mapped to
    logits).
    """
    w_plus, w_minus = (float(w) for w in cal.weights(p_old))
    q_ref = np.array([p_ref, 1 - p_ref])
    q_old = np.array([p_old, 1 - p_old])
    adv = np.array([w_plus, -w_minus])

    def objective(q1: float) -> float:
        q = np.array([q1, 1 - q1])
        d = np.log(q_ref) - np.log(q)
        k = {"k3": np.exp(d) - d - 1, "k2": d ** 2 / 2,
             "k3_ratio": q / q_old * (np.exp(d) - d - 1)}[estimator]
        return float(np.sum(q_old * (q / q_old * adv - beta * k)))

    def slope(q1: float) -> float:  # dJ/dq1, with dq0/dq1 = -1 for the failure
        q = np.array([q1, 1 - q1])
        dk = {"k3": -q_ref / q ** 2 + 1 / q, "k2": np.log(q / q_ref) / q,
              "k3_ratio": np.log(q / q_ref) / q_old}[estimator]
        per = adv - beta * q_old * dk
        return float(per[0] - per[1])

    grid = 1 / (1 + np.exp(-np.linspace(-25, 25, 20001)))
    i = int(np.argmin(np.abs(grid - p_old)))
    step = 1 if objective(grid[i + 1]) > objective(grid[i]) else -1
    while objective(grid[i + step]) > objective(grid[i]):
        i += step
    root, info = optimize.brentq(slope, grid[i - 1], grid[i + 1], xtol=1e-300, rtol=1e-15,
                                 full_output=True)
    assert info.converged
    # brentq's answer is within xtol + rtol |root| of a sign change of the slope
    error = (1e-15 * root) / (root * (1 - root))
    return float(np.log(root) - np.log1p(-root)), float(error)


@pytest.mark.parametrize("estimator", ["k3", "k2", "k3_ratio"])
@pytest.mark.parametrize(("p_old", "p_ref", "beta"), [
    (0.3, 0.3, 1.0), (0.3, 0.3, 0.1), (0.6, 0.2, 0.3), (0.05, 0.3, 2.0), (0.9, 0.5, 0.25),
    (0.5, 1e-4, 0.3)])
def test_round_step_maximises_the_round_objective(estimator, p_old, p_ref, beta):
    got = float(tl.round_step_logit(theory.logit(p_old), theory.logit(p_ref), beta,
                                    estimator=estimator, calibration=CAL))
    want, half_width = _round_reference(p_old, p_ref, beta, estimator)
    # brentq's bracket bounds the reference; ours is bisected to float64 resolution too, and the
    # slope's own rounding (cancellation of terms of size Omega) adds a few ulps of the logit
    assert abs(got - want) <= 4 * half_width + 64 * np.spacing(max(1.0, abs(want)))


def test_round_step_of_plain_k3_is_not_the_reverse_kl_step():
    """One round of plain k3 stops short of the reverse-KL step (the old chapter's claim)."""
    trl = Calibration(normalization="mean_std", eps=1e-4, eps_placement="std", ddof=1,
                      group_size=8)
    lr = theory.logit(0.3)
    round_pos = theory.sigmoid(tl.round_step_logit(lr, lr, 1.0, estimator="k3", calibration=trl))
    reverse_pos = theory.sigmoid(tl.exact_step_logit(lr, lr, 1.0, estimator="k3",
                                                     calibration=trl))
    want, _ = _round_reference(0.3, 0.3, 1.0, "k3", trl)
    assert float(round_pos) == pytest.approx(float(theory.sigmoid(want)), abs=1e-9)
    assert float(reverse_pos) - float(round_pos) > 0.05  # 0.69 against 0.62


def test_round_step_of_k2_is_not_theorem_2s_step():
    """k2's expected gradient is the forward KL's at pi_old, but one round is not the Gibbs tilt.

    (The module once called the Gibbs tilt k2's one-step optimum.) Reference: the round's
    stationarity solved by brentq in probability space (_round_reference).
    """
    lr, lp = theory.logit(0.3), theory.logit(0.6)
    got = tl.round_step_logit(lp, lr, 1.0, estimator="k2", calibration=CAL)
    gibbs = tl.exact_step_logit(lp, lr, 1.0, estimator="k2", calibration=CAL)
    want, _ = _round_reference(0.6, 0.3, 1.0, "k2", CAL)
    assert float(got) == pytest.approx(float(want), abs=1e-9)
    assert abs(float(theory.sigmoid(got)) - float(theory.sigmoid(gibbs))) > 0.01


@pytest.mark.parametrize("estimator", ["k3", "k2"])
def test_round_step_has_the_fixed_points_of_its_divergence(estimator):
    """At a fixed point of the divergence step, the round stays there (q = p)."""
    p_ref = np.array([0.05, 0.3, 0.7])
    star = tl.destination(p_ref, 0.4, estimator=estimator, calibration=CAL)
    got = tl.round_step_logit(theory.logit(star), theory.logit(p_ref), 0.4,
                              estimator=estimator, calibration=CAL)
    np.testing.assert_allclose(got, theory.logit(star), atol=1e-7)


def test_round_step_climbs_from_pi_old_not_to_a_farther_maximum():
    """p_ref 0.05, beta 1, pi_old at the fixed point 0.53: a second maximum near q = 0.066."""
    r, b = 0.05, 1.0
    star = float(tl.destination(r, b, estimator="k3", calibration=CAL))
    grid = np.linspace(-6.0, 4.0, 4001)

    def objective(lq: np.ndarray) -> np.ndarray:  # J(q) by hand, up to a constant
        q, p = theory.sigmoid(lq), star
        omega = float(CAL.omega(p))
        return q * omega - b * (p * (r / q + np.log(q)) + (1 - p) * ((1 - r) / (1 - q)
                                                                    + np.log(1 - q)))

    values = objective(grid)
    far = theory.sigmoid(grid[np.argmax(values)])
    assert far < 0.1 and values.max() > objective(theory.logit(star))  # the farther maximum
    got = tl.round_step_logit(theory.logit(star), theory.logit(r), b, estimator="k3",
                              calibration=CAL)
    assert float(theory.sigmoid(got)) == pytest.approx(star, abs=1e-9)  # a fixed point stays


def test_round_step_of_k3_ratio_is_theorem_2():
    lp, lr = theory.logit(P_PREV), theory.logit(P_REF)
    np.testing.assert_allclose(
        tl.round_step_logit(lp, lr, 0.5, estimator="k3_ratio", calibration=CAL),
        theory.pos_map_logit(lp, lr, 0.5, calibration=CAL), rtol=1e-13, atol=1e-13)


def test_round_step_broadcasts_and_refuses_k1():
    out = tl.round_step_logit(np.zeros((2, 3)), theory.logit(P_REF[:3]), 0.5, estimator="k3",
                              calibration=CAL)
    assert out.shape == (2, 3) and np.all(np.isfinite(out))
    assert np.shape(tl.round_step_logit(0.0, 0.0, 0.5, estimator="k3", calibration=CAL)) == ()
    with pytest.raises(ValueError, match="estimator must be one of"):
        tl.round_step_logit(0.0, 0.0, 0.5, estimator="k1", calibration=CAL)


def test_forward_destinations_are_not_all_near_1_at_chapter_8s_settings():
    """Below p_ref ~ 4e-9 (beta 0.1, G 16, the trainer's calibration) a lower fixed point
    catches the prompt; chapter 8 once said every p_ref > 0 ends within 1e-6 of 1.

    Reference: sign changes of L_ref + Omega(sigmoid(L)) / beta - L on a grid of 20001
    logits, each refined by brentq (xtol 1e-12), written here from the calibration alone.
    """
    cal = Calibration(normalization="mean_std", eps=1e-5, eps_placement="sqrt", ddof=0,
                      group_size=16)
    beta = 0.1

    def roots(p_ref):
        lr = float(theory.logit(p_ref))
        def g(L):
            return lr + cal.omega(theory.sigmoid(L)) / beta - L
        grid = np.linspace(-30.0, 40.0, 20001)
        vals = g(grid)
        where = np.nonzero(np.sign(vals[:-1]) != np.sign(vals[1:]))[0]
        return [optimize.brentq(lambda x: float(g(x)), grid[i], grid[i + 1], xtol=1e-12)
                for i in where]

    low = roots(1e-9)
    assert len(low) == 3
    dest = tl.destination(np.array([1e-9, 1e-8]), beta, estimator="k3_ratio", calibration=cal)
    assert float(dest[0]) == pytest.approx(float(theory.sigmoid(low[0])), abs=1e-9)
    assert 0.3 < dest[0] < 0.4  # the old claim: within 1e-6 of 1
    high = roots(1e-8)
    assert len(high) == 1 and dest[1] == pytest.approx(float(theory.sigmoid(high[0])), abs=1e-9)
    assert 1 - dest[1] < 1e-6
