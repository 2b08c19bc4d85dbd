"""Orbit tails, cobweb staircases and labelled regime maps against hand-written maps."""

import math

import numpy as np
import pytest

from grpo_companion.theory.analyses import bifurcation as bf


def _step(lp, lr, beta, eps, alpha=1.0):
    """Reference / two-KL logit map written out by hand; p(1-p) = e/(1+e)^2, e = exp(-|L|)."""
    e = math.exp(-abs(lp))
    z = 1 / (beta * math.sqrt(e / (1 + e) ** 2 + eps))
    return alpha * lr + (1 - alpha) * lp + z


def _sig(z):
    return 1 / (1 + math.exp(-z)) if z > -700 else 0.0


def _h(p, p_ref, beta, eps, alpha=1.0):
    lp = math.log(p / (1 - p))
    return _sig(_step(lp, math.log(p_ref / (1 - p_ref)), beta, eps, alpha))


def _orbit(p0, p_ref, beta, eps, n, alpha=1.0):
    lr = math.log(p_ref / (1 - p_ref))
    logits = [math.log(p0 / (1 - p0))]
    for _ in range(n):
        logits.append(_step(logits[-1], lr, beta, eps, alpha))
    return np.array([_sig(z) for z in logits])


@pytest.mark.parametrize(("p_ref", "beta"), [(0.2, 1.0), (0.5, 5.0), (1e-3, 5.0), (0.3, 0.8)])
def test_orbit_tail_matches_hand_iteration(p_ref, beta):
    tail = bf.orbit_tail(p_ref, p_ref, beta, 40, 10, eps=1e-5)
    hand = _orbit(p_ref, p_ref, beta, 1e-5, 40)
    assert tail.shape == (10,)
    np.testing.assert_allclose(tail, hand[-10:], rtol=1e-9, atol=1e-12)


def test_orbit_tail_broadcasts_and_checks_sizes():
    betas = np.array([0.5, 1.0, 5.0])
    tail = bf.orbit_tail(0.2, 0.2, betas, 30, 5, eps=1e-5)
    assert tail.shape == (5, 3)
    for j, b in enumerate(betas):
        np.testing.assert_allclose(tail[:, j], _orbit(0.2, 0.2, b, 1e-5, 30)[-5:],
                                   rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError):
        bf.orbit_tail(0.2, 0.2, 1.0, 5, 6)
    with pytest.raises(ValueError):
        bf.orbit_tail(0.2, 0.2, 1.0, 5, 0)


def test_cobweb_vertices_alternate_between_graph_and_diagonal():
    x, y = bf.cobweb_path(0.1, 0.2, 1.0, 6, eps=1e-5)
    hand = _orbit(0.1, 0.2, 1.0, 1e-5, 6)
    assert x.shape == y.shape == (13,)
    np.testing.assert_allclose(x[0::2], hand, rtol=1e-12)  # on the diagonal
    np.testing.assert_allclose(y[0::2], hand, rtol=1e-12)
    for k in range(6):  # (p_k, p_{k+1}) lies on the graph of h
        assert x[2 * k + 1] == pytest.approx(hand[k], rel=1e-12)
        assert y[2 * k + 1] == pytest.approx(_h(hand[k], 0.2, 1.0, 1e-5), rel=1e-9)


def test_regime_map_known_cells():
    L = bf.Label
    p_ref = np.array([0.2, 1e-3, 0.2, 1e-4, 0.0])
    beta = np.array([1.0, 5.0, 0.01, 5.0, 1.0])
    m = bf.regime_map(p_ref, beta, eps=1e-5)
    assert list(m.label) == [L.INTERIOR, L.CYCLE_2, L.SATURATED, L.SATURATED, L.ABSORBED]
    assert m.limits[0, 0] == pytest.approx(0.6813, abs=5e-5)
    assert list(m.n_fixed_points[:4]) == [3, 3, 1, 3]
    assert m.n_fixed_points[4] == 0
    # the same cell started at 0.1 (the paper's Figure 5) is chaotic
    chaos = bf.regime_map(1e-4, 5.0, p0=0.1, eps=1e-5)
    assert int(chaos.label) == L.CHAOTIC and float(chaos.lyapunov) > 0.1
    fr = m.fractions()
    assert sum(fr.values()) == pytest.approx(1.0)
    assert fr["absorbed"] == pytest.approx(0.2)


def test_regime_map_agrees_with_hand_iteration_on_a_small_grid():
    p_refs = np.array([0.01, 0.1, 0.3, 0.6])
    betas = np.array([0.3, 1.0, 2.0, 6.0])
    m = bf.regime_map(p_refs[:, None], betas[None, :], eps=1e-3, n_transient=2000,
                      n_measure=200)
    for i, pr in enumerate(p_refs):
        for j, b in enumerate(betas):
            orbit = _orbit(pr, pr, b, 1e-3, 2200)
            last = orbit[-4:]
            label = m.label[i, j]
            if abs(last[-1] - last[-2]) < 1e-10:
                expect = bf.Label.SATURATED if 1 - last[-1] < 1e-4 else bf.Label.INTERIOR
                assert label == expect, (pr, b)
            elif abs(last[-1] - last[-3]) < 1e-10:
                assert label == bf.Label.CYCLE_2, (pr, b)
    # fixed-point counts agree with sign changes of h(L) - L on a dense logit grid
    for i, pr in enumerate(p_refs):
        lr = math.log(pr / (1 - pr))
        for j, b in enumerate(betas):
            grid = np.linspace(lr, lr + 1 / (b * math.sqrt(1e-3)) + 1, 200_001)
            e = np.exp(-np.abs(grid))
            g = lr + 1 / (b * np.sqrt(e / (1 + e) ** 2 + 1e-3)) - grid
            assert m.n_fixed_points[i, j] == np.sum(np.sign(g[1:]) != np.sign(g[:-1]))
