"""Clipped GRPO solved exactly (grpo_companion.theory.analyses.clipped), issue 24 item 1.

The expectations were committed before this module existed
(benchmarks/results/beyond_expectations.md, section 1). Checks:

- the tabular round optimum against direct numerical optimisation of the clipped
  objective (SciPy SLSQP on softmax logits, the kinks lifted into smooth
  constraints), and against its own KKT conditions;
- the class-proportional PoS map (a closed form) against the tabular optimum;
- no clipping: the library's unclipped map and policy (Theorem 1 / 2);
- the fixed points of the clipped map, found on the clipped map itself, against
  the library's unclipped fixed points (criterion: 1e-10);
- the per-round caps of the expectations (one of them does not hold: see
  ``test_committed_success_cap_fails_below_one_half``);
- the per-sample surrogate against TRL's own ``GRPOTrainer._compute_loss``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, special

from grpo_companion import theory
from grpo_companion.theory.analyses import clipped
from tests._converged import EPS, ULPS

KAPPAS = (0.1, 0.2, 0.3)


# ------------------------------------------------------------------ helpers
def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 7))
    mask = np.zeros(k, bool)
    mask[rng.choice(k, size=int(rng.integers(1, k)), replace=False)] = True
    ref = rng.dirichlet(np.ones(k))
    old = rng.dirichlet(np.ones(k))
    beta = float(rng.uniform(0.2, 2.0))
    kappa = float(rng.uniform(0.05, 0.4))
    w_plus, w_minus = theory.weights(old[mask].sum())
    return ref, old, mask, beta, kappa, float(w_plus), float(w_minus)


def _direct_optimum(ref, old, mask, beta, kappa, w_plus, w_minus):
    """Maximise the clipped objective with SLSQP; variables: K - 1 softmax logits and one
    auxiliary per output, ``y <= min(pi, (1 + k) pi_old)`` on a success and
    ``y >= max(pi, (1 - k) pi_old)`` on a failure (so ``y`` equals the clipped term at
    the optimum and the problem is smooth)."""
    k = ref.size
    cap = np.where(mask, (1 + kappa) * old, (1 - kappa) * old)
    sign = np.where(mask, 1.0, -1.0)  # success: cap - y >= 0; failure: y - cap >= 0
    weight = np.where(mask, w_plus, -w_minus)
    log_ref = np.log(ref)

    def split(v):
        z = np.concatenate([[0.0], v[:k - 1]])
        return special.softmax(z), v[k - 1:]

    def jac_pi(pi):  # d pi / d z[1:], shape (K, K - 1)
        full = np.diag(pi) - np.outer(pi, pi)
        return full[:, 1:]

    def f(v):
        pi, y = split(v)
        kl = np.sum(pi * (np.log(pi) - log_ref))
        return -(weight @ y - beta * kl)

    def grad(v):
        pi, y = split(v)
        kl = np.sum(pi * (np.log(pi) - log_ref))
        dkl = pi * (np.log(pi) - log_ref - kl)
        return np.concatenate([beta * dkl[1:], -weight])

    def cons(v):
        pi, y = split(v)
        return np.concatenate([sign * (pi - y), sign * (cap - y)])

    def cons_jac(v):
        pi, _ = split(v)
        jp = jac_pi(pi)
        eye = np.eye(k)
        top = np.hstack([sign[:, None] * jp, -sign[:, None] * eye])
        bottom = np.hstack([np.zeros((k, k - 1)), -sign[:, None] * eye])
        return np.vstack([top, bottom])

    z0 = np.log(old) - np.log(old[0])
    y0 = np.where(mask, np.minimum(old, cap), np.maximum(old, cap))
    res = optimize.minimize(f, np.concatenate([z0[1:], y0]), jac=grad, method="SLSQP",
                            constraints=[{"type": "ineq", "fun": cons, "jac": cons_jac}],
                            options={"ftol": 1e-16, "maxiter": 2000})
    pi, y = split(res.x)
    violation = float(max(0.0, -cons(res.x).min()))
    return pi, res, violation


def _kkt_interval(pi, ref, old, mask, beta, kappa, w_plus, w_minus):
    """Each output's allowed range of the multiplier ``lam`` at ``pi`` (module docstring):
    ``s - beta log(pi / pi_ref)`` for ``s`` in the superdifferential of its surrogate term.
    An output at its kink (to a few ulps) gets the whole interval."""
    base = -beta * (np.log(pi) - np.log(ref))
    cap = np.where(mask, (1 + kappa) * old, (1 - kappa) * old)
    at_kink = np.abs(pi - cap) <= ULPS * EPS * cap
    below = pi < cap
    s_lo = np.where(mask, np.where(at_kink, 0.0, np.where(below, w_plus, 0.0)),
                    np.where(at_kink, -w_minus, np.where(below, 0.0, -w_minus)))
    s_hi = np.where(mask, np.where(at_kink, w_plus, np.where(below, w_plus, 0.0)),
                    np.where(at_kink, 0.0, np.where(below, 0.0, -w_minus)))
    return base + s_lo, base + s_hi


# --------------------------------------------------------- the tabular round
@pytest.mark.parametrize("seed", range(8))
def test_round_policy_matches_direct_optimisation(seed):
    case = _random_case(seed)
    ref, old, mask, beta, kappa, w_plus, w_minus = case
    mine = clipped.clipped_round_policy(ref, old, mask, beta, kappa, w_plus, w_minus)
    direct, res, violation = _direct_optimum(*case)
    # status 8 ("positive directional derivative for linesearch"): SLSQP stalled at the
    # rounding floor of J; its convergence is judged below by the objective gap
    assert res.status in (0, 8), res.message
    assert violation <= 1e-12
    j_mine = clipped.clipped_objective(mine, ref, old, mask, beta, kappa, w_plus, w_minus)
    j_direct = clipped.clipped_objective(direct, ref, old, mask, beta, kappa, w_plus, w_minus)
    # the optimiser cannot beat the exact optimum (beyond rounding of J) ...
    assert j_direct <= j_mine + ULPS * EPS * max(1.0, abs(j_mine))
    # ... and J is beta-strongly concave in l1 (Pinsker), so its gap bounds the distance:
    # |pi - pi*|_1 <= sqrt(2 gap / beta); the optimiser's gap is its convergence measure
    gap = max(j_mine - j_direct, 0.0)
    bound = np.sqrt(2 * (gap + ULPS * EPS * max(1.0, abs(j_mine))) / beta)
    assert np.abs(mine - direct).sum() <= bound
    assert np.abs(mine - direct).max() <= 1e-7


@pytest.mark.parametrize("seed", range(20))
def test_round_policy_satisfies_its_kkt_conditions(seed):
    ref, old, mask, beta, kappa, w_plus, w_minus = _random_case(100 + seed)
    pi = clipped.clipped_round_policy(ref, old, mask, beta, kappa, w_plus, w_minus)
    assert abs(pi.sum() - 1.0) <= ULPS * EPS
    lo, hi = _kkt_interval(pi, ref, old, mask, beta, kappa, w_plus, w_minus)
    # one multiplier lies in every output's interval (up to rounding of the logs)
    scale = beta * np.abs(np.log(pi / ref)).max() + w_plus + w_minus
    assert lo.max() <= hi.min() + ULPS * EPS * scale


def test_objective_is_the_expected_surrogate():
    ref, old, mask, beta, kappa, w_plus, w_minus = _random_case(7)
    pi = clipped.clipped_round_policy(ref, old, mask, beta, kappa, w_plus, w_minus)
    adv = np.where(mask, w_plus, -w_minus)
    expected = np.sum(old * clipped.clipped_surrogate(pi / old, adv, kappa))
    expected -= beta * np.sum(pi * np.log(pi / ref))
    got = clipped.clipped_objective(pi, ref, old, mask, beta, kappa, w_plus, w_minus)
    assert abs(got - expected) <= ULPS * EPS * max(1.0, abs(expected))


def test_round_policy_broadcasts_over_a_batch():
    cases = [_random_case(200 + s) for s in range(3)]
    k = 4
    ref = np.stack([np.r_[c[0][:3], 0][:k] / np.r_[c[0][:3], 0][:k].sum() for c in cases])
    old = np.stack([np.full(k, 1 / k)] * 3)
    mask = np.array([1, 0, 1, 0], bool)
    beta, kappa = np.array([0.3, 1.0, 2.0]), np.array([0.1, 0.2, 0.3])
    w_plus, w_minus = np.array([1.0, 2.0, 0.5]), np.array([0.5, 0.1, 3.0])
    batch = clipped.clipped_round_policy(ref, old, mask, beta, kappa, w_plus, w_minus)
    for i in range(3):
        one = clipped.clipped_round_policy(ref[i], old[i], mask, beta[i], kappa[i], w_plus[i],
                                           w_minus[i])
        np.testing.assert_array_equal(batch[i], one)
    assert np.all(batch[:, 3] == 0)  # no reference mass, no mass


# ----------------------------------------------------------- the PoS map
@pytest.mark.parametrize("kappa", KAPPAS)
def test_pos_map_is_the_success_mass_of_the_tabular_optimum(kappa):
    rng = np.random.default_rng(int(kappa * 10))
    for _ in range(30):
        p_ref = float(rng.uniform(0.005, 0.95))
        p_old = float(np.clip(rng.uniform(-0.1, 1.0), 1e-4, 1 - 1e-4))
        beta = float(rng.choice([0.1, 0.5, 1.0, 3.0]))
        ref = np.r_[p_ref * rng.dirichlet(np.ones(2)), (1 - p_ref) * rng.dirichlet(np.ones(3))]
        mask = np.array([1, 1, 0, 0, 0], bool)
        old = np.where(mask, ref * p_old / p_ref, ref * (1 - p_old) / (1 - p_ref))
        w_plus, w_minus = theory.weights(p_old)
        pi = clipped.clipped_round_policy(ref, old, mask, beta, kappa, w_plus, w_minus)
        got_logit = np.log(pi[mask].sum()) - np.log(pi[~mask].sum())
        want = clipped.clipped_pos_map_logit(special.logit(p_old), special.logit(p_ref), beta,
                                             kappa)
        scale = 1 + abs(special.logit(p_ref)) + (w_plus + w_minus) / beta
        assert abs(got_logit - want) <= ULPS * EPS * scale
        # the optimum stays class-proportional: pi / pi_ref constant within each class
        ratio = pi / ref
        assert np.ptp(ratio[mask]) <= ULPS * EPS * ratio[mask].max()
        assert np.ptp(ratio[~mask]) <= ULPS * EPS * ratio[~mask].max()


def test_no_clipping_is_the_unclipped_map_and_policy():
    p = np.concatenate([np.geomspace(1e-12, 0.5, 40), 1 - np.geomspace(1e-12, 0.5, 40)])
    p_ref = np.array([1e-3, 0.01, 0.2, 0.7])[:, None]
    beta = np.array([0.05, 0.5, 2.0])[:, None, None]
    got = clipped.clipped_pos_map(p, p_ref, beta, 1.0, clip_eps_high=np.inf)
    want = theory.pos_map(p, p_ref, beta)
    assert np.abs(got - want).max() <= 1e-12
    lp = special.logit(p)
    got_l = clipped.clipped_pos_map_logit(lp, special.logit(p_ref), beta, 1.0,
                                          clip_eps_high=np.inf)
    # rounding of L_ref + (w+ + w-) / beta against L_ref + Omega / beta
    scale = 1 + np.abs(special.logit(p_ref)) + theory.omega(p) / beta
    want_l = theory.pos_map_logit(lp, special.logit(p_ref), beta)
    assert np.all(np.abs(got_l - want_l) <= ULPS * EPS * scale)
    for seed in range(5):
        ref, old, mask, beta1, _, _, _ = _random_case(300 + seed)
        w_plus, w_minus = theory.weights(old[mask].sum())
        pi = clipped.clipped_round_policy(ref, old, mask, beta1, 1.0, w_plus, w_minus,
                                          clip_eps_high=np.inf)
        np.testing.assert_allclose(pi, theory.optimal_policy(ref, old, mask, beta1),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("kappa", KAPPAS)
def test_clipped_fixed_points_are_the_unclipped_ones(kappa):
    """Expectation 1 of section 1: agreement to 1e-10 on a (p_ref, beta) grid."""
    p_ref = np.array([0.01, 0.1, 0.3, 0.5, 0.8])[:, None]
    beta = np.array([0.2, 0.5, 1.0, 2.0, 5.0])[None, :]
    lr = special.logit(p_ref)
    got = clipped.clipped_fixed_points_logit(lr, beta, kappa)
    want = theory.fixed_points_logit(lr, beta)
    assert got.shape == want.shape  # the same count of fixed points in every cell
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    err = np.abs(got[ok] - want[ok]) / np.maximum(1.0, np.abs(want[ok]))
    assert err.max() <= 1e-10
    # and each unclipped fixed point is one of the clipped map, to rounding
    lr_b, b_b, _ = np.broadcast_arrays(lr[..., None], beta[..., None], want)
    image = clipped.clipped_pos_map_logit(want[ok], lr_b[ok], b_b[ok], kappa)
    assert (np.abs(image - want[ok]) / np.maximum(1.0, np.abs(want[ok]))).max() <= 1e-12
    assert (np.abs(theory.sigmoid(got[ok]) - theory.sigmoid(want[ok]))).max() <= 1e-10


# ------------------------------------------------------------- the caps
def _grid():
    lp = special.logit(np.linspace(0.002, 0.998, 300))
    lr = special.logit(np.array([0.001, 0.01, 0.1, 0.4]))[:, None, None]
    beta = np.array([0.1, 0.5, 2.0])[:, None]
    return lp, lr, beta


@pytest.mark.parametrize("kappa", KAPPAS)
def test_clipped_step_lies_between_start_and_unclipped_target(kappa):
    lp, lr, beta = _grid()
    new = clipped.clipped_pos_map_logit(lp, lr, beta, kappa)
    target = theory.pos_map_logit(lp, lr, beta)
    tol = 1e-12 * np.maximum(1.0, np.abs(target))
    assert np.all(new <= target + tol)
    assert np.all(new >= lr - tol)
    lp_b = np.broadcast_to(lp, new.shape)
    assert np.all(np.sign(new - lp_b) == np.sign(target - lp_b))


@pytest.mark.parametrize("kappa", KAPPAS)
def test_per_round_caps_that_hold(kappa):
    """From ``p_{n-1} >= p_ref``: the failure cap below 1/2, the success cap above 1/2,
    and always ``p_n <= max((1 + k) p_{n-1}, 1 - (1 - k)(1 - p_{n-1}))``."""
    lp, lr, beta = _grid()
    p = special.expit(lp)
    new = special.expit(clipped.clipped_pos_map_logit(lp, lr, beta, kappa))
    p_b = np.broadcast_to(p, new.shape)
    from_ref = np.broadcast_to(lp >= lr, new.shape)
    slack = 1e-12
    low = from_ref & (p_b <= 0.5)
    assert np.all((1 - new)[low] >= ((1 - kappa) * (1 - p_b))[low] - slack)
    high = from_ref & (p_b >= 0.5)
    assert np.all(new[high] <= ((1 + kappa) * p_b)[high] + slack)
    cap = np.maximum((1 + kappa) * p_b, 1 - (1 - kappa) * (1 - p_b))
    assert np.all(new[from_ref] <= cap[from_ref] + slack)


@pytest.mark.xfail(strict=True, reason=(
    "committed expectation (beyond_expectations.md section 1) that both caps hold every "
    "round is false: below p = 1/2 the success mass can pass (1 + k) p_{n-1} while the "
    "failures' term still pushes (see test_committed_success_cap_fails_below_one_half)"))
@pytest.mark.parametrize("kappa", KAPPAS)
def test_committed_per_round_caps(kappa):
    lp, lr, beta = _grid()
    p = special.expit(lp)
    new = special.expit(clipped.clipped_pos_map_logit(lp, lr, beta, kappa))
    p_b = np.broadcast_to(p, new.shape)
    from_ref = np.broadcast_to(lp >= lr, new.shape)
    assert np.all(new[from_ref] <= ((1 + kappa) * p_b)[from_ref] + 1e-12)
    assert np.all((1 - new)[from_ref] >= ((1 - kappa) * (1 - p_b))[from_ref] - 1e-12)


def test_committed_success_cap_fails_below_one_half():
    """At ``p = p_ref = 0.01``, ``beta = 0.5``, ``k = 0.2``: the success term is flat above
    ``1.2 p`` but the failure term's slope ``w-`` still pulls, so the round lands where
    ``beta (L - L_ref) = w-``: ``L_1 = L_ref + w-(p) / beta``, above ``logit(1.2 p)``.
    Independently, the tabular optimum and the direct optimiser agree on it."""
    p, beta, kappa = 0.01, 0.5, 0.2
    w_plus, w_minus = theory.weights(p)
    expected = special.expit(special.logit(p) + w_minus / beta)
    got = clipped.clipped_pos_map(p, p, beta, kappa)
    assert abs(got - expected) <= ULPS * EPS * expected
    assert got > (1 + kappa) * p * 1.01
    ref = np.array([0.004, 0.006, 0.5, 0.49])
    mask = np.array([1, 1, 0, 0], bool)
    direct, res, _ = _direct_optimum(ref, ref, mask, beta, kappa, float(w_plus), float(w_minus))
    assert res.status in (0, 8), res.message
    assert abs(direct[mask].sum() - got) <= 1e-7


# ------------------------------------------------------------------- TRL
def test_surrogate_is_trls_clipped_per_token_loss(tmp_path):
    """TRL's ``GRPOTrainer._compute_loss`` (loss_type "grpo", beta 0, one-token
    completions) is ``-(1/B) sum_i min(r_i A_i, clip(r_i) A_i)``; with every advantage but
    one set to 0 (B = 4, a power of 2) it gives that sample's surrogate exactly."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from grpo_companion.practice.trl_bandit import trl_loss
    from tests.practice import _tiny

    path = _tiny.save_model(tmp_path / "tiny")
    rng = np.random.default_rng(0)
    for eps, eps_high in [(0.2, None), (0.2, 0.28), (0.1, 0.3)]:
        settings = dict(loss_type="grpo", beta=0.0, epsilon=eps, max_completion_length=1)
        if eps_high is not None:
            settings["epsilon_high"] = eps_high
        trainer = _tiny.trainer(path, tmp_path / "out", _tiny.target_reward, **settings)
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
        b = 4
        ratio = np.array([0.5, 0.95, 1.1, 1.6]) * rng.uniform(0.9, 1.1, 4)
        adv = np.array([1.3, -0.7, -2.0, 0.4])
        logp = torch.tensor(np.log(rng.uniform(0.05, 0.9, (b, 1))), dtype=torch.float64)
        old = logp - torch.tensor(np.log(ratio)[:, None], dtype=torch.float64)
        mine = clipped.clipped_surrogate(np.exp((logp - old).numpy()[:, 0]), adv, eps,
                                         clip_eps_high=eps_high)
        for i in range(b):
            one = np.where(np.arange(b) == i, adv, 0.0)
            inputs = {
                "prompt_ids": torch.full((b, 2), 3, dtype=torch.long),
                "prompt_mask": torch.ones(b, 2, dtype=torch.long),
                "completion_ids": torch.full((b, 1), 6, dtype=torch.long),
                "completion_mask": torch.ones(b, 1, dtype=torch.long),
                "advantages": torch.tensor(one, dtype=torch.float64),
                "num_items_in_batch": torch.tensor(b),
                "old_per_token_logps": old,
            }
            theirs = -b * trl_loss(trainer, logp, inputs).item()
            assert abs(theirs - mine[i]) <= 1e-10


# ------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(("call", "name"), [
    (lambda: clipped.clipped_pos_map(0.3, 0.1, 0.5, 0.0), "clip_eps"),
    (lambda: clipped.clipped_pos_map(0.3, 0.1, 0.5, 1.5), "clip_eps"),
    (lambda: clipped.clipped_pos_map(0.3, 0.1, 0.5, 0.2, clip_eps_high=-1), "clip_eps_high"),
    (lambda: clipped.clipped_pos_map(1.3, 0.1, 0.5, 0.2), "p"),
    (lambda: clipped.clipped_pos_map(0.3, -0.1, 0.5, 0.2), "p_ref"),
    (lambda: clipped.clipped_pos_map(0.3, 0.1, 0.0, 0.2), "beta"),
    (lambda: clipped.clipped_pos_map_logit(np.nan, 0.1, 0.5, 0.2), "logit_p"),
    (lambda: clipped.clipped_round_policy([0.5, 0.5], [0.5, 0.6], [1, 0], 1, 0.2, 1, 1),
     "pi_prev"),
    (lambda: clipped.clipped_round_policy([0.5, 0.5], [0.5, 0.5], [1, 2], 1, 0.2, 1, 1),
     "success_mask"),
    (lambda: clipped.clipped_round_policy([0.5, 0.5], [0.5, 0.5], [1, 0], 1, 0.2, -1, 1),
     "w_plus"),
    (lambda: clipped.clipped_round_policy([0.5, 0.5], [0.5, 0.5], [1, 0], 1, 0.2, 1, np.inf),
     "w_minus"),
    (lambda: clipped.clipped_surrogate(-1.0, 1.0, 0.2), "ratio"),
    (lambda: clipped.clipped_fixed_points(0.0, 0.5, 0.2), "p_ref"),
    (lambda: clipped.clipped_fixed_points(0.1, 0.5, 0.2, n_grid=2), "n_grid"),
    (lambda: clipped.clipped_iterate_logit(0.0, 0.0, 0.5, 0.2, -1), "n_steps"),
    (lambda: clipped.expected_clipped_training(0.0, 2.0, 0.2, 5, 10), "p_ref"),
    (lambda: clipped.expected_clipped_training(1.0, 2.0, 0.2, 5, 10), "p_ref"),
    (lambda: clipped.expected_clipped_training(0.1, 0.0, 0.2, 5, 10), "beta"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.0, 5, 10), "clip_eps"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, clip_eps_high=0),
     "clip_eps_high"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, -1, 10), "n_iterations"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 0), "mu"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 1.5), "mu"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, lr=0), "lr"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, lr=np.inf), "lr"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, adam_betas=(0.9, 1.0)),
     "adam_betas"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, adam_betas=(0.9,)),
     "adam_betas"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, adam_eps=-1e-8),
     "adam_eps"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, n_prompts=0),
     "n_prompts"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, keep_path=1),
     "keep_path"),
    (lambda: clipped.expected_clipped_training(0.1, 2.0, 0.2, 5, 10, group_size=1),
     "group_size"),
])
def test_bad_inputs_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()


# ------------------------------------------- mu Adam steps on the expected objective
def _torch_expected_training(p_ref, beta, kappa, kappa_high, n_iter, mu, group_size, lr):
    """Independent reference: two softmax logits per prompt, PyTorch's own Adam, and the
    expected clipped objective written as the ``pi_old``-weighted PPO minimum with
    advantages ``+w+_G`` (success) and ``-w-_G`` (failure), its gradient by autograd; the
    loss is the mean over the prompts, as the trainer's."""
    torch = pytest.importorskip("torch")
    cal = theory.Calibration(eps=1e-5, group_size=group_size)
    ref = torch.tensor(np.stack([p_ref, 1 - p_ref], -1), dtype=torch.float64)
    z = torch.nn.Parameter(torch.log(ref).clone())
    opt = torch.optim.Adam([z], lr=lr)
    path = [np.asarray(p_ref, float)]
    for _ in range(n_iter):
        with torch.no_grad():
            old = torch.softmax(z, -1).clone()
        w_plus, w_minus = cal.weights(old[:, 0].numpy())
        adv = torch.tensor(np.stack([w_plus, -w_minus], -1))
        for _ in range(mu):
            pi = torch.softmax(z, -1)
            ratio = pi / old
            surr = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - kappa, 1 + kappa_high) * adv)
            kl = (pi * (torch.log(pi) - torch.log(ref))).sum(-1)
            loss = -((old * surr).sum(-1) - beta * kl).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        path.append(torch.softmax(z, -1)[:, 0].detach().numpy().copy())
    return np.stack(path)


@pytest.mark.parametrize(("kappa", "kappa_high", "group_size"),
                         [(0.2, 0.2, 4), (0.2, 0.2, 16), (0.1, 0.3, 8), (1.0, np.inf, 4)])
def test_expected_training_is_torch_adam_on_the_expected_objective(kappa, kappa_high,
                                                                   group_size):
    p_ref = np.array([0.02, 0.05, 0.3, 0.6])
    want = _torch_expected_training(p_ref, 2.0, kappa, kappa_high, 12, 10, group_size, 0.1)
    got = clipped.expected_clipped_training(p_ref, 2.0, kappa, 12, 10, clip_eps_high=kappa_high,
                                            n_prompts=p_ref.size, group_size=group_size)
    assert got.shape == (13, 4)
    # same updates, rounded differently (autograd's softmax chain against the closed form)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_expected_training_gradient_is_the_objectives():
    """The gradient the function steps along, read off a single SGD-like Adam step
    (beta1 = beta2 = 0, eps = 0: the step is lr sign(-dJ/dL) in each logit, 2 lr in L),
    has the sign of the central difference of :func:`clipped_objective` in L."""
    rng = np.random.default_rng(5)
    p_ref = rng.uniform(0.02, 0.9, 50)
    beta = rng.uniform(0.2, 3.0, 50)
    lr = 1e-3
    new = clipped.expected_clipped_training(p_ref, beta, 0.2, 1, 1, lr=lr, adam_betas=(0, 0),
                                            adam_eps=0.0, keep_path=False, group_size=8)
    step = special.logit(new) - special.logit(p_ref)
    w_plus, w_minus = theory.weights(p_ref, group_size=8)
    h = 1e-6

    def j(lx):
        x = special.expit(lx)
        pi = np.stack([x, 1 - x], -1)
        old = np.stack([p_ref, 1 - p_ref], -1)
        return clipped.clipped_objective(pi, old, old, [1, 0], beta, 0.2, w_plus, w_minus)

    lp = special.logit(p_ref)
    slope = (j(lp + h) - j(lp - h)) / (2 * h)
    np.testing.assert_allclose(step, 2 * lr * np.sign(slope), rtol=1e-9)


def test_expected_training_clip_is_idle_with_one_step():
    """mu = 1: the only step is taken at ratio 1, so clipping changes nothing (bitwise)."""
    p_ref = np.array([0.05, 0.3, 0.6])
    a = clipped.expected_clipped_training(p_ref, 2.0, 0.2, 60, 1, n_prompts=24, group_size=4)
    b = clipped.expected_clipped_training(p_ref, 2.0, 1.0, 60, 1, clip_eps_high=np.inf,
                                          n_prompts=24, group_size=4)
    np.testing.assert_array_equal(a, b)


def test_expected_training_settles_at_the_finite_group_fixed_point():
    """G = 4 and 16, beta = 2: clipped and unclipped mu = 10 training rest at the unclipped
    finite-group fixed point (the only rest points; module docstring)."""
    for g in (4, 16):
        cal = theory.Calibration(eps=1e-5, group_size=g)
        fp = theory.fixed_points(0.05, 2.0, calibration=cal)[0]
        path = clipped.expected_clipped_training(0.05, 2.0, np.array([0.2, 1.0]), 300, 10,
                                                 clip_eps_high=np.array([0.2, np.inf]),
                                                 n_prompts=24, calibration=cal)
        assert np.abs(path[-40:] - fp).max() <= 1e-6


def test_expected_training_keeps_oscillating_at_large_groups():
    """G = 64: the mu = 10 Adam iteration has no stable rest point; it swings around the
    fixed point, less with the clip, whose time average then sits below the unclipped one
    (benchmarks/results/clipped_mu10.md)."""
    path = clipped.expected_clipped_training(0.05, 2.0, np.array([1.0, 0.2]), 1500, 10,
                                             clip_eps_high=np.array([np.inf, 0.2]),
                                             n_prompts=24, group_size=64)
    tail = path[500:]
    swing = tail.max(0) - tail.min(0)
    assert swing[0] > 0.1 and 0.01 < swing[1] < swing[0]
    shift = tail[:, 1].mean() - tail[:, 0].mean()
    assert -0.007 < shift < -0.003


@pytest.mark.slow
def test_expected_training_is_the_large_group_limit_of_sampled_training():
    """The trainer's sampled runs (chapter 7's bandit, p_ref = 0.05, beta = 2, Adam with
    mu = 10, lr 0.1): without clipping and with G = 4096 their mean PoS over 72 prompts
    follows the expected training for the first iterations, within 4 standard errors (six
    comparisons). With the clip at kappa = 0.2 and G = 4 the limit (mean of the last 40 of
    100 iterations) lies far below the expected training's: the clip's effect there comes
    from the sampling noise."""
    torch = pytest.importorskip("torch")

    from grpo_companion.rl import TrainConfig, train

    torch.set_num_threads(1)
    base = TrainConfig.flat(n_prompts=24, n_outputs=2, n_success=1, p_ref=(0.05,), iterations=6,
                            beta=2.0, eps=1e-5, kl="exact", dtype="float64", progress=False, mu=10,
                            optimizer="adam", clip_eps_low=None, group_size=4096)
    runs = [train(base.replace(seed=s)).metrics["success_prob"] for s in range(3)]
    pos = np.concatenate(runs, axis=1)
    want = clipped.expected_clipped_training(0.05, 2.0, 1.0, 6, 10, clip_eps_high=np.inf,
                                             n_prompts=24, group_size=4096)
    se = pos.std(1, ddof=1) / np.sqrt(pos.shape[1])
    assert np.all(np.abs(pos.mean(1) - want)[1:] <= 4 * se[1:])

    small = base.replace(iterations=100, group_size=4, clip_eps_low=0.2)
    tails = np.concatenate([train(small.replace(seed=s)).metrics["success_prob"]
                            [-40:].mean(0) for s in range(2)])
    expected = clipped.expected_clipped_training(0.05, 2.0, 0.2, 100, 10, n_prompts=24,
                                                 group_size=4)[-40:].mean()
    se_tail = tails.std(ddof=1) / np.sqrt(tails.size)
    assert tails.mean() < expected - 10 * se_tail
