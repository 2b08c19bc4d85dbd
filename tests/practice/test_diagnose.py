"""practice.diagnose against independent computations, and its refusals of bad input."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from grpo_companion import theory
from grpo_companion.practice import diagnose as dg
from grpo_companion.practice.trl_bridge import predict_path


def test_zero_variance_prob_is_the_binomial_mass_at_both_ends():
    p = np.linspace(0.0, 1.0, 41)
    for g in (2, 3, 8, 64):
        pmf = stats.binom.pmf(np.arange(g + 1), g, p[:, None])
        np.testing.assert_allclose(dg.zero_variance_prob(p, g), pmf[:, 0] + pmf[:, -1],
                                   rtol=1e-12, atol=0)
    assert dg.zero_variance_prob([0.0, 1.0], 8).tolist() == [1.0, 1.0]
    assert dg.zero_variance_share([0.5, 0.0], 2) == pytest.approx((0.5 + 1.0) / 2)


def test_the_standard_error_matches_monte_carlo():
    p = np.array([0.9, 0.5, 0.2, 0.05])
    g, n = 8, 200_000
    rng = np.random.default_rng(0)
    k = rng.binomial(g, p, size=(n, p.size))
    share = ((k == 0) | (k == g)).mean(1)
    se = dg.zero_variance_se(p, g)
    # the sample standard deviation of n draws has relative error about 1/sqrt(2n) = 0.16 %
    assert share.std(ddof=1) == pytest.approx(se, rel=5 / math.sqrt(2 * n))
    assert share.mean() == pytest.approx(dg.zero_variance_share(p, g), abs=5 * se / math.sqrt(n))


def _fixed_point(p_ref: float, beta: float, group: int) -> float:
    """Theorem 2's interior fixed point by Brent's method, independently of the library."""
    cal = dataclasses.replace(theory.CALIBRATIONS["trl"], group_size=group)
    l_ref = math.log(p_ref / (1 - p_ref))
    root = optimize.brentq(lambda x: l_ref + float(cal.omega_of_logit(x)) / beta - x,
                           l_ref, l_ref + 60, xtol=1e-13)
    return 1 / (1 + math.exp(-root))


def test_limits_are_the_fixed_points_of_theorem_2():
    p_ref = [0.05, 0.3, 0.7]
    result = dg.diagnose({"beta": 1.0}, p_ref)
    assert result.predicts and result.regime == ["fixed_point"] * 3
    expected = [_fixed_point(p, 1.0, 8) for p in p_ref]
    np.testing.assert_allclose(result.limit, expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.zero_variance_limit,
                               dg.zero_variance_prob(expected, 8), atol=1e-8)


def test_beta_zero_settles_at_one_and_zero_is_absorbing():
    result = dg.diagnose({}, [0.0, 0.2, 1.0])  # TRL's defaults: beta = 0
    assert result.limit.tolist() == [0.0, 1.0, 1.0]
    assert result.stuck.tolist() == [True, False, True]
    assert "absorbing" in result.why_stuck[0] and "nothing to learn" in result.why_stuck[2]


def test_iterations_mark_ninety_percent_of_the_way():
    p_ref = np.array([0.02, 0.3, 0.6])
    result = dg.diagnose({"beta": 0.5}, p_ref)
    path = predict_path(p_ref, 50, result.reading)
    for i, n in enumerate(result.iterations.astype(int)):
        gap0 = abs(p_ref[i] - result.limit[i])
        assert abs(path[n, i] - result.limit[i]) <= 0.1 * gap0
        if n > 0:
            assert abs(path[n - 1, i] - result.limit[i]) > 0.1 * gap0


def test_a_rare_prompt_is_stuck_with_few_rounds_and_free_with_many():
    z = float(dg.zero_variance_prob(1e-3, 8))
    few, many = dg.diagnose({}, [1e-3], rounds=10), dg.diagnose({}, [1e-3], rounds=1000)
    assert z ** 10 >= 0.5 and few.stuck[0] and "uniform" in few.why_stuck[0]
    assert z ** 1000 < 0.5 and not many.stuck[0]
    assert dg.diagnose({"max_steps": 50}, [0.3]).rounds == 50


@pytest.mark.parametrize("changes, name", [({"scale_rewards": "batch"}, "scale_rewards"),
                                           ({"entropy_coef": 0.01}, "entropy_coef"),
                                           ({"sync_ref_model": True, "num_iterations": 2,
                                             "ref_model_sync_steps": 3}, "sync_ref_model")])
def test_settings_outside_the_theory_are_refused_with_a_reason(changes, name):
    result = dg.diagnose({"beta": 0.1, **changes}, [0.1, 0.5])
    assert not result.predicts
    assert any(reason.startswith(name) for reason in result.uncovered)
    assert np.isnan(result.limit).all() and result.regime == ["none", "none"]
    assert result.zero_variance_share_ref == pytest.approx(dg.zero_variance_share([0.1, 0.5], 8))
    assert name in result.table()


def test_a_grpo_config_reads_as_its_dict(tmp_path):
    from trl import GRPOConfig

    config = GRPOConfig(output_dir=str(tmp_path), beta=0.3, num_generations=4, use_cpu=True,
                        bf16=False, report_to=[], max_steps=40)
    a = dg.diagnose(config, [0.2, 0.6])
    b = dg.diagnose({"beta": 0.3, "num_generations": 4, "max_steps": 40}, [0.2, 0.6])
    np.testing.assert_array_equal(a.limit, b.limit)
    assert a.rounds == b.rounds == 40


@pytest.mark.parametrize("config, words", [
    ({"betta": 1.0}, "did you mean beta"),
    ({"num_generations": 1}, "num_generations must be an int >= 2"),
    ({"beta": -1.0}, "beta must be a finite number >= 0"),
    ({"beta": float("nan")}, "beta must be a finite number >= 0"),
    ({"scale_rewards": "std"}, "scale_rewards must be"),
    ({"num_iterations": 0}, "num_iterations must be an int >= 1"),
    (3, "config must be a trl.GRPOConfig"),
])
def test_bad_configs_are_refused(config, words):
    with pytest.raises(ValueError, match=words):
        dg.diagnose(config, [0.5])


def test_bad_config_files_are_refused(tmp_path):
    (tmp_path / "bad.json").write_text("{beta: 1")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not valid JSON"):
        dg.read_config(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="JSON object"):
        dg.read_config(tmp_path / "list.json")
    with pytest.raises(ValueError, match="is not a file"):
        dg.read_config(tmp_path / "missing.json")
    (tmp_path / "ok.json").write_text(json.dumps({"beta": 0.2}))
    assert dg.read_config(tmp_path / "ok.json").beta == 0.2


@pytest.mark.parametrize("p_ref, words", [
    ([], "at least one"), ([0.2, 1.5], "1.5"), ([0.2, float("nan")], "index 1"),
    ([[0.1, 0.2]], "1-D"), ("x", "is not a file"),
])
def test_bad_rates_are_refused(p_ref, words):
    with pytest.raises(ValueError, match=words):
        dg.read_p_ref(p_ref)


@pytest.mark.parametrize("text, expected", [
    ("prompt,p_ref\na,0.1\nb,0.5\n", [0.1, 0.5]),
    ("0.25\n0.75\n", [0.25, 0.75]),
    ("success\n0.3\n\n0.4\n", [0.3, 0.4]),
])
def test_rates_are_read_from_csv(tmp_path, text, expected):
    path = tmp_path / "p.csv"
    path.write_text(text)
    assert dg.read_p_ref(path).tolist() == expected


@pytest.mark.parametrize("text, words", [
    ("p_ref\n0.1\nabc\n", "row 3: 'abc' is not a number"),
    ("p_ref\n0.1\n2\n", "row 3: 2.0 is not a probability"),
    ("", "holds no rows"),
    ("p_ref\n", "no rates"),
    ("a,b\n0.1,0.2\n", "none is named p_ref"),
])
def test_bad_csv_files_are_refused(tmp_path, text, words):
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=words):
        dg.read_p_ref(path)


def test_group_size_needed_is_the_smallest_that_reaches_the_target():
    p_ref, target, n = [0.01, 0.05, 0.1], [0.1, 0.28, 0.4], 10
    for p, y in zip(p_ref, target, strict=True):
        g = int(dg.group_size_needed([p], y, n, {"beta": 1.0}, max_group_size=64)[0])
        assert g >= 2

        def reaches(size, p=p, y=y):
            settings = dg.diagnose({"beta": 1.0, "num_generations": size}, [p]).reading
            return predict_path([p], n, settings)[-1, 0] >= y

        assert reaches(g) and (g == 2 or not reaches(g - 1))
    assert dg.group_size_needed([0.01], 0.9, 10, {"beta": 1.0}, max_group_size=16)[0] == 0
    with pytest.raises(ValueError, match="target"):
        dg.group_size_needed([0.1], 1.5, 10)


def test_the_figure_draws():
    fig = dg.diagnose({"beta": 1.0}, [0.0, 0.1, 0.5]).figure()
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) >= 2


@pytest.fixture(scope="module")
def bandit(tmp_path_factory):
    import torch

    from grpo_companion.practice.trl_bandit import TRLBandit

    from . import _tiny

    folder = tmp_path_factory.mktemp("tiny")
    tok = _tiny.tokenizer()
    return TRLBandit(_tiny.save_model(folder), tok, torch.tensor([tok("say A")["input_ids"]]),
                     folder / "out", beta=1.0, num_generations=4)


def test_the_zero_variance_share_is_trls_metric_in_expectation(bandit):
    """TRL's own frac_reward_zero_std of a group with k successes, averaged over k."""
    g = bandit.group_size
    metric = []
    for k in range(g + 1):
        bandit.advantages([int(i < k) for i in range(g)])
        metric.append(bandit.trainer._metrics["train"]["frac_reward_zero_std"][-1])
    assert metric == [1.0] + [0.0] * (g - 1) + [1.0]
    for p in (0.03, 0.4, 0.95):
        expected = float(np.dot(stats.binom.pmf(np.arange(g + 1), g, p), metric))
        assert dg.zero_variance_share([p], g) == pytest.approx(expected, rel=1e-12)


def test_the_limits_are_where_trls_expected_gradient_vanishes(bandit):
    p_ref = [0.1, 0.45, 0.8]
    result = dg.diagnose({"beta": 1.0, "num_generations": bandit.group_size}, p_ref)
    table = bandit.table()
    for p, limit in zip(p_ref, result.limit, strict=True):
        assert bandit.fixed_point(p, table) == pytest.approx(limit, abs=1e-9)
