"""trained_loss.predictor_paths (chapter 8's predictions, moved from the chapter): each entry
against the function it names called on its own, and the relaxed recurrence against the
recurrence L_n = (1 - lam) L_{n-1} + lam logit T(p_{n-1}) iterated here."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, logit

from grpo_companion.theory import Calibration
from grpo_companion.theory.analyses import trained_loss as tl

CAL = Calibration(group_size=16)
STEPS = np.array([0, 2, 5, 9])


def _trajectories(l_ref, beta, lam):
    """Relaxed forward-KL paths iterated by hand, perturbed a little: the 'measured' logits."""
    rows, cur = [l_ref], l_ref
    for _ in range(1, STEPS[-1] + 1):
        cur = (1 - lam) * cur + lam * tl.exact_step_logit(cur, l_ref, beta, calibration=CAL)
        rows.append(cur)
    path = np.array(rows)[STEPS]
    return path + 0.01 * np.sin(np.arange(path.size)).reshape(path.shape)


def _setup():
    l_fit = logit(np.linspace(0.05, 0.8, 10))
    b_fit = np.where(np.arange(10) % 2, 0.1, 0.3)
    l_judged = logit(np.array([0.1, 0.4, 0.6]))
    b_judged = np.array([0.1, 0.3, 0.1])
    fit = _trajectories(l_fit, b_fit, 0.3)
    judged = _trajectories(l_judged, b_judged, 0.3)
    group = (b_judged == 0.3).astype(int)
    fit_group = (b_fit == 0.3).astype(int)
    return judged, b_judged, fit, b_fit, group, fit_group


def test_predictor_paths_is_each_predictor_on_its_own():
    judged, b, fit, fit_b, group, fit_group = _setup()
    recurrences = {"k3 recurrence": ("k3", "divergence", 0.3),
                   "forward-KL recurrence": ("k3_ratio", "divergence", 0.25)}
    got = tl.predictor_paths(judged, b, STEPS, recurrences, fit, fit_b, group=group,
                             fit_group=fit_group, calibration=CAL)
    assert list(got) == [*recurrences, *tl.PROMPT_BLIND, "kernel reference"]
    for name, (est, step, lam) in recurrences.items():
        want = tl.relaxed_path_logit(judged[0], b, 20, lam, estimator=est, step=step,
                                     calibration=CAL)[STEPS]  # a longer path, the same prefix
        np.testing.assert_array_equal(got[name], want)
    blind = tl.prompt_blind_predictions(judged, STEPS, fit, group=group, fit_group=fit_group)
    for name in tl.PROMPT_BLIND:
        np.testing.assert_array_equal(got[name], blind[name])
    np.testing.assert_array_equal(got["kernel reference"],
                                  tl.kernel_reference(judged[0], b, fit, fit_b))


def test_the_forward_kl_recurrence_is_the_relaxed_map_iterated_here():
    judged, b, fit, fit_b, group, fit_group = _setup()
    got = tl.predictor_paths(judged, b, STEPS, {"r": ("k3_ratio", "divergence", 0.3)}, fit,
                             fit_b, group=group, fit_group=fit_group, calibration=CAL)["r"]
    smooth = _trajectories(judged[0], b, 0.3) - 0.01 * np.sin(
        np.arange(judged.size)).reshape(judged.shape)
    np.testing.assert_allclose(expit(got), expit(smooth), atol=1e-12)


@pytest.mark.parametrize("recurrences, match", [
    ({}, "recurrences"), ([("k3", "divergence", 0.3)], "recurrences"),
    ({"no change": ("k3", "divergence", 0.3)}, "recurrences"),
    ({"r": ("k3", 0.3)}, "recurrences"), ({"r": ("k9", "divergence", 0.3)}, "estimator"),
    ({"r": ("k3", "divergence", 1.5)}, "step_fraction")])
def test_predictor_paths_refuses_bad_recurrences(recurrences, match):
    judged, b, fit, fit_b, group, fit_group = _setup()
    with pytest.raises(ValueError, match=match):
        tl.predictor_paths(judged, b, STEPS, recurrences, fit, fit_b, group=group,
                           fit_group=fit_group, calibration=CAL)


def _destination_scan(level, beta, lo, hi, n=4001):
    """Where the destination crosses level on a fine grid of log10 p_ref (to one grid step)."""
    grid = np.linspace(lo, hi, n)
    d = tl.destination(10.0 ** grid, beta, estimator="k3_ratio", calibration=CAL) - level
    i = int(np.flatnonzero(np.sign(d[:-1]) != np.sign(d[1:]))[0])
    return grid[i], grid[i + 1]


@pytest.mark.parametrize("level", [0.5, 1 - 1e-6])
def test_destination_crossing_against_a_grid_scan(level):
    beta = 0.1
    lo, hi = _destination_scan(level, beta, -15.0, -3.0)
    got = tl.destination_crossing(level, beta, (-15.0, -3.0), calibration=CAL)
    assert lo - 1e-9 <= got <= hi + 1e-9
    below, above = (float(tl.destination(10.0 ** (got + s), beta, calibration=CAL)) - level
                    for s in (-1e-6, 1e-6))
    assert below < 0 < above


@pytest.mark.parametrize("kwargs, name", [({"level": 1.5}, "level"), ({"beta": 0.0}, "beta"),
                                          ({"beta": [0.1, 0.2]}, "beta"),
                                          ({"log10_bracket": (-3.0, -15.0)}, "log10_bracket"),
                                          ({"log10_bracket": (-3.0, -1.0)}, "log10_bracket"),
                                          ({"xtol": 0.0}, "xtol")])
def test_destination_crossing_refuses_bad_input(kwargs, name):
    args = {"level": 0.5, "beta": 0.1, "log10_bracket": (-15.0, -3.0), **kwargs}
    with pytest.raises(ValueError, match=name):
        tl.destination_crossing(**args, calibration=CAL)
