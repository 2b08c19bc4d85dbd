"""practice.log_answers.expected_gradient_flow (chapter 12, section 7) against an independent
loop: scipy's softmax and entropy, and the expected gradient re-derived here from the
binomial law of the number of successes (beta0_drift written out) and the forward-KL term."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

from grpo_companion.practice import log_answers
from grpo_companion.theory import Calibration
from grpo_companion.theory.finite_group import group_table

P_OUTPUTS = np.array([0.3, 0.1, 0.4, 0.2])
CORRECT = np.array([True, True, False, False])


def _flow_by_hand(theta_ref, correct, cal, beta, n, eta):
    g = cal.group_size
    plus, _ = group_table(cal, g)
    k = np.arange(1, g)  # groups with a success and a failure
    theta = theta_ref.copy()
    log_ref = np.log(special.softmax(theta_ref))
    out = []
    for _ in range(n + 1):
        pi = special.softmax(theta)
        p = pi[correct].sum()
        q = pi[correct] / p
        out.append((pi[0] / pi[1], stats.entropy(q), p))
        drift = np.sum(stats.binom.pmf(k, g, p) * k / g * np.asarray(plus)[k])
        ascent = np.where(correct, drift * pi / p, -drift * pi / (1 - p))
        log_ratio = np.log(pi) - log_ref
        ascent -= beta * pi * (log_ratio - np.sum(pi * log_ratio))
        theta = theta + eta * ascent
    return tuple(np.array(col) for col in zip(*out, strict=True))


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_flow_matches_an_independent_loop(beta):
    cal = Calibration(group_size=8)
    theta_ref = np.log(P_OUTPUTS)
    got = log_answers.expected_gradient_flow(theta_ref, CORRECT, cal, beta, n_steps=200,
                                             eta=0.1)
    want = _flow_by_hand(theta_ref, CORRECT, cal, beta, 200, 0.1)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (201,)
        np.testing.assert_allclose(g, w, rtol=1e-9)
    ratio, entropy, pos = got
    assert ratio[0] == pytest.approx(3.0) and pos[0] == pytest.approx(0.4)
    assert ratio[-1] > ratio[0] and entropy[-1] < entropy[0]  # rank bias: the likelier gains


@pytest.mark.parametrize("kwargs, name", [({"n_steps": -1}, "n_steps"), ({"eta": 0.0}, "eta"),
                                          ({"beta": -1.0}, "beta"), ({"pair": (0, 9)}, "pair"),
                                          ({"pair": (0,)}, "pair")])
def test_flow_refuses_bad_input(kwargs, name):
    args = {"beta": 0.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        log_answers.expected_gradient_flow(np.log(P_OUTPUTS), CORRECT, Calibration(group_size=4),
                                           **args)
