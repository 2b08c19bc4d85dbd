"""An anchor is data: (weight, target) pairs, mixed in one place (``theory.variants.mix_targets``).

Checks the pairs themselves (construction, validation, equality, the derived ``alpha``), the
one mixing rule, that each consumer (the loss, Lemma 2's geometric anchor, the logit
recurrence, the symbolic map) gives the numbers of the mix written out here, and that a
third target needs only a new name in ``ANCHOR_TARGETS`` for the anchor and the loss.
"""

import math

import numpy as np
import pytest
import sympy as sp
import torch

from grpo_companion import symbolic, theory
from grpo_companion.rl import losses
from grpo_companion.theory import variants
from grpo_companion.theory.variants import ANCHOR_TARGETS, Anchor, mix_targets, share_pairs

D = torch.float64


# --- the pairs ---------------------------------------------------------------------------


@pytest.mark.parametrize(("anchor", "pairs", "alpha", "kind"), [
    (Anchor.reference(), ((1.0, "reference"),), 1.0, "reference"),
    (Anchor.mirror(), ((1.0, "prev"),), 0.0, "mirror"),
    (Anchor.two_kl(0.3), ((0.3, "reference"), (1 - 0.3, "prev")), 0.3, "two_kl"),
    (Anchor(), ((1.0, "reference"),), 1.0, "reference"),
    (Anchor(0.0), ((1.0, "prev"),), 0.0, "mirror"),
    (Anchor(((0.75, "prev"), (0.25, "reference"))), ((0.25, "reference"),
                                                          (0.75, "prev")), 0.25, "two_kl"),
    (Anchor([(0.5, "reference"), (0.25, "reference"), (0.25, "prev")]),
     ((0.75, "reference"), (0.25, "prev")), 0.75, "two_kl"),
])
def test_an_anchor_is_its_pairs(anchor, pairs, alpha, kind):
    assert anchor.pairs == pairs
    assert anchor.alpha == alpha and anchor.kind == kind
    assert {t for _, t in anchor.pairs} <= set(ANCHOR_TARGETS)


def test_equal_pairs_are_equal_anchors_however_written():
    assert Anchor(1.0) == Anchor.reference() and Anchor(0.0) == Anchor.mirror()
    assert Anchor(0.4) == Anchor.two_kl(0.4) == Anchor(((0.4, "reference"), (0.6, "prev")))
    assert hash(Anchor(0.0)) == hash(Anchor.mirror())
    assert theory.Variant("trl", Anchor(0.0)) == theory.Variant("trl", Anchor.mirror())


def test_alpha_is_read_only():
    with pytest.raises(AttributeError):
        Anchor.two_kl(0.3).alpha = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(("pairs", "named"), [
    (1.5, "alpha"), (-0.1, "alpha"), (math.nan, "alpha"), ("reference", "pairs"),
    (None, "pairs"), ([(1.0, "elsewhere")], "pairs"), ([(0.4, "reference")], "pairs"),
    ([(-0.5, "reference"), (1.5, "prev")], "pairs"), ([], "pairs"),
    ([(1.0, "reference", "extra")], "pairs"),
])
def test_bad_pairs_are_refused_naming_the_parameter(pairs, named):
    with pytest.raises(ValueError, match=named):
        Anchor(pairs)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 1.2])
def test_two_kl_needs_a_share_strictly_inside(alpha):
    with pytest.raises(ValueError, match="alpha"):
        Anchor.two_kl(alpha)


# --- the one mixing rule -------------------------------------------------------------------


def test_mix_is_the_weighted_sum_in_target_order():
    x, y = np.array([1.0, -2.0]), np.array([4.0, 8.0])
    np.testing.assert_array_equal(Anchor(0.25).mix({"reference": x, "prev": y}),
                                  0.25 * x + 0.75 * y)
    np.testing.assert_array_equal(mix_targets(share_pairs(np.array([0.0, 1.0])),
                                              {"reference": x, "prev": y}), [4.0, -2.0])
    a = sp.Symbol("a")
    assert mix_targets(share_pairs(a), {"reference": sp.Symbol("r"), "prev": 1}) == (
        a * sp.Symbol("r") + 1 - a)


def test_a_lazy_mix_computes_only_the_targets_it_uses():
    def unused():
        raise AssertionError("a target with weight 0 was computed")

    assert Anchor.mirror().mix({"reference": unused, "prev": lambda: 2.0}, lazy=True) == 2.0
    assert Anchor.reference().mix({"reference": lambda: 3.0, "prev": unused},
                                  lazy=True, start=10.0) == 13.0


def test_a_missing_target_is_named():
    with pytest.raises(ValueError, match="'prev' missing"):
        Anchor(0.5).mix({"reference": 1.0})


def test_weight_of_an_unknown_target_is_refused():
    assert Anchor.reference().weight("prev") == 0.0
    with pytest.raises(ValueError, match="target"):
        Anchor.reference().weight("initial")


# --- the consumers read the pairs ------------------------------------------------------------


def test_the_loss_penalty_is_the_mix_of_the_kls():
    g = torch.Generator().manual_seed(1)
    cur, ref, prev = (torch.log_softmax(torch.randn(3, 6, generator=g, dtype=D), 1)
                      for _ in range(3))
    anchor = Anchor(((0.35, "reference"), (0.65, "prev")))
    got = losses.anchor_penalty(anchor, {"reference": lambda: losses.tabular_kl(cur, ref),
                                         "prev": lambda: losses.tabular_kl(cur, prev)},
                                torch.zeros(3, dtype=D))
    want = 0.35 * losses.tabular_kl(cur, ref) + 0.65 * losses.tabular_kl(cur, prev)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0.0)


def test_lemma2_geometric_anchor_is_the_mix_of_log_probabilities():
    rng = np.random.default_rng(2)
    ref, prev = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    anchor = Anchor.two_kl(0.3)
    log_mix = anchor.mix({"reference": np.log(ref), "prev": np.log(prev)})
    np.testing.assert_allclose(theory.geometric_anchor(ref, prev, anchor.alpha),
                               np.exp(log_mix) / np.exp(log_mix).sum(), rtol=1e-14)


def test_the_logit_recurrence_anchor_term_is_the_mix_of_logits():
    lp, lr, beta = np.array([-1.0, 0.5, 2.0]), np.array([0.3, -0.7, 1.1]), 2.0
    for anchor in (Anchor.reference(), Anchor.mirror(), Anchor.two_kl(0.6)):
        omega = theory.Calibration().omega_of_logit(lp)
        want = anchor.mix({"reference": lr, "prev": lp}) + omega / beta
        np.testing.assert_allclose(theory.pos_map_logit(lp, lr, beta, alpha=anchor.alpha),
                                   want, rtol=1e-14)
        # d/dL_{n-1} of the anchor term is the previous target's weight
        slope = theory.pos_map_logit_derivative(lp, beta, alpha=anchor.alpha)
        np.testing.assert_allclose(
            slope - theory.Calibration().omega_prime_of_logit(lp) / beta,
            anchor.weight("prev"), atol=1e-14)


@pytest.mark.parametrize("kind", ["reference", "mirror", "two_kl"])
def test_the_symbolic_map_reads_the_pairs(kind):
    pairs = symbolic.policy.anchor_pairs(kind)
    target_logits = {"reference": symbolic.logit(symbolic.p_ref),
                     "prev": symbolic.logit(symbolic.p)}
    rhs = symbolic.pos_map("mean_std", "sqrt", kind).logit_form.rhs
    omega = symbolic.calibration_weights("mean_std", "sqrt").omega
    assert sp.simplify(rhs - mix_targets(pairs, target_logits) - omega / symbolic.beta) == 0


# --- a third target --------------------------------------------------------------------------


def test_a_third_target_is_one_new_name(monkeypatch):
    """With a target added to ANCHOR_TARGETS the anchor validates and mixes it, and the loss
    sums its KL term: the consumers only supply that target's KL (or log-probabilities)."""
    monkeypatch.setattr(variants, "ANCHOR_TARGETS", (*ANCHOR_TARGETS, "initial"))
    anchor = Anchor(((0.5, "reference"), (0.3, "prev"), (0.2, "initial")))
    assert anchor.weight("initial") == 0.2
    g = torch.Generator().manual_seed(3)
    cur, ref, prev, init = (torch.log_softmax(torch.randn(2, 4, generator=g, dtype=D), 1)
                            for _ in range(4))
    kls = {"reference": lambda: losses.tabular_kl(cur, ref),
           "prev": lambda: losses.tabular_kl(cur, prev),
           "initial": lambda: losses.tabular_kl(cur, init)}
    got = losses.anchor_penalty(anchor, kls, torch.zeros(2, dtype=D))
    want = sum(w * losses.tabular_kl(cur, q) for w, q in ((0.5, ref), (0.3, prev), (0.2, init)))
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0.0)
    with pytest.raises(ValueError, match="initial"):
        losses.anchor_penalty(anchor, {k: kls[k] for k in ("reference", "prev")},
                              torch.zeros(2, dtype=D))
