"""Sampled GRPO (Algorithm 1) on the bandit against the finite-group recurrence.

What is exact: with K = 2 outputs (one success, one failure), the exact KL
penalty and the inner problem solved to convergence, the sampled objective of
one prompt is maximised by logit p_n = logit p_anchor + (A_S - A_F) / beta,
where A_S, A_F are the importance-weighted advantage sums of the success and
the failure output. This is linear in the advantages, and by exchangeability
E[A_S - A_F | p_{n-1}] = w+_G(p_{n-1}) + w-_G(p_{n-1}), the exact expected
weights of a group of G (``theory`` with ``group_size=G``). Hence

    E[logit p_n | p_{n-1}] = logit of theory.pos_map(p_{n-1}, ..., group_size=G)

at every step, and E[logit p_1] = logit theory.iterate(...)[1] at step one.
(The unconditional mean after several steps differs from theory.iterate by a
Jensen term, so later steps are checked conditionally.) The standard error of
each mean is the sample standard deviation over the many prompts that share
one p_ref, divided by sqrt(count); each check allows 4 standard errors: six checks per
run at a family-wise false-alarm rate of 1e-3 need Phi^-1(1 - 1e-3 / 12) = 3.8 each.
"""

import numpy as np
import pytest
from scipy.special import logit

from grpo_companion import theory
from grpo_companion.rl.trainer import TrainConfig, train


@pytest.mark.slow
@pytest.mark.parametrize(("alpha", "calibration"), [
    (1.0, {"eps": 1e-5, "eps_placement": "sqrt", "ddof": 0}),   # the paper's eq. (4)
    (0.0, {"eps": 1e-4, "eps_placement": "std", "ddof": 1}),    # TRL's advantages, mirror
])
def test_sampled_bandit_matches_finite_group_recurrence(alpha, calibration):
    group, beta, values = 32, 2.0, (0.2, 0.5)
    config = TrainConfig.flat(n_prompts=2000, n_outputs=2, n_success=1, p_ref=values,
                              group_size=group, beta=beta, alpha=alpha, kl="exact",
                              clip_eps_low=None, optimizer="lbfgs", mu=1, dtype="float64",
                              iterations=3, progress=False, seed=1, **calibration)
    result = train(config)
    cal = theory.Calibration(normalization="mean_std", group_size=group, **calibration)
    pos = result.success_prob
    for value in values:
        rows = result.p_ref == value
        count = rows.sum()
        step1 = logit(pos[1, rows])
        predicted = logit(theory.iterate(value, value, beta, 1, alpha=alpha,
                                         calibration=cal)[1])
        se = step1.std(ddof=1) / np.sqrt(count)
        assert abs(step1.mean() - predicted) < 4 * se, (value, step1.mean(), predicted, se)
        for n in range(2, config.run.iterations + 1):
            anchor = value if alpha == 1.0 else pos[n - 1, rows]
            one_step = theory.pos_map(pos[n - 1, rows], anchor, beta, alpha=1.0,
                                      calibration=cal)
            gap = logit(pos[n, rows]) - logit(one_step)
            se = gap.std(ddof=1) / np.sqrt(count)
            assert abs(gap.mean()) < 4 * se, (value, n, gap.mean(), se)
            assert se < 0.05  # the check is informative: a tight interval


def test_sampled_large_group_tracks_population_recurrence():
    # Looser sanity check on a typical TRL-like run: Adam, clipping, k3 in the loss.
    config = TrainConfig.flat(n_prompts=64, n_outputs=8, iterations=5, mu=4, progress=False,
                              p_ref_zero_fraction=0.2, group_size=16)
    result = train(config)
    zero = result.p_ref == 0
    assert np.all(result.success_prob[:, zero] < 1e-30)  # no success ever sampled
    assert result.success_prob[-1, ~zero].mean() > result.p_ref[~zero].mean()
    clip = result.metrics["clip_fraction"][1:]
    assert np.all((clip >= 0) & (clip <= 1))
