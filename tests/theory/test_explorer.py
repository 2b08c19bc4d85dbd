"""The explorer's precomputed grid (grpo_companion.book.explorer): fixed points, cobwebs and
maps agree with the library's map and with independent computations written out here."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.book.explorer import (
    ExplorerGrid,
    cobweb_xy,
    explorer_figure,
    explorer_grid,
    render_explorer,
    settled_path,
)
from grpo_companion.theory.variants import calibration_named

EPS = float(np.finfo(np.float64).eps)
#: The root finder's stopping width (grpo_companion.theory.roots._XTOL): it stops when its
#: step or its bracket is below XTOL * max(1, |L|).
XTOL = 4.0 * EPS

BETAS = [0.05, 0.2, 0.7, 1.0, 3.0, 20.0, 50.0]
P_REFS = [0.01, 0.05, 0.2, 0.5, 0.9, 0.99]
CALS = ("paper", "trl", "mean_only", "max_abs")


@pytest.fixture(scope="module")
def grid() -> ExplorerGrid:
    return explorer_grid(BETAS, P_REFS, CALS, n_p=41, n_steps=30)


def _logit_ref(grid: ExplorerGrid) -> np.ndarray:
    return np.log(grid.p_refs / (1 - grid.p_refs))


def test_shapes_and_padding(grid: ExplorerGrid) -> None:
    shape = (len(CALS), len(BETAS), len(P_REFS))
    assert grid.map_values.shape == (*shape, 41)
    assert grid.path.shape == (*shape, 31)
    assert grid.fixed_logits.shape[:3] == shape and grid.fixed_logits.shape[3] == 3
    assert grid.multipliers.shape == grid.fixed_logits.shape
    assert np.array_equal(np.isnan(grid.fixed_logits), np.isnan(grid.multipliers))
    n_fixed = np.sum(~np.isnan(grid.fixed_logits), axis=-1)
    # Theorem 2: one or three fixed points (a tangency, with two, is not on this grid)
    assert set(np.unique(n_fixed)) <= {1, 3}
    assert np.any(n_fixed == 3) and np.any(n_fixed == 1)
    # p_0 = p_ref, through the logit and back (a few ulps)
    np.testing.assert_allclose(grid.path[..., 0], np.broadcast_to(grid.p_refs, shape),
                               rtol=4 * EPS, atol=0)


def test_fixed_points_solve_the_map_to_the_root_finders_tolerance(grid: ExplorerGrid) -> None:
    """|T(L*) - L*| in logits is at most the root finder's final step (XTOL max(1, |L*|))
    times |g'(L*)| = |T'(L*) - 1|, plus the rounding of the sum L_ref + Omega / beta."""
    lr = _logit_ref(grid)[None, :, None]
    betas = grid.betas[:, None, None]
    checked = 0
    for c, name in enumerate(CALS):
        cal = calibration_named(name)
        fixed = grid.fixed_logits[c]
        ok = ~np.isnan(fixed)
        image = theory.pos_map_logit(np.where(ok, fixed, 0.0), lr, betas, calibration=cal)
        residual = np.abs(image - fixed)[ok]
        step = XTOL * np.maximum(1.0, np.abs(fixed))
        slope = np.abs(grid.multipliers[c] - 1.0)
        shift = np.broadcast_to(cal.omega_of_logit(np.where(ok, fixed, 0.0)) / betas, fixed.shape)
        rounding = 4 * EPS * (np.abs(np.broadcast_to(lr, fixed.shape)) + np.abs(shift)
                              + np.abs(fixed))
        bound = (2 * step * slope + rounding)[ok]
        assert np.all(residual <= bound), (name, np.max(residual / bound))
        checked += ok.sum()
    assert checked >= len(CALS) * len(BETAS) * len(P_REFS)


def test_each_fixed_point_is_bracketed_by_a_sign_change(grid: ExplorerGrid) -> None:
    """g(L) = T(L) - L changes sign across [L* - w, L* + w]: a true root lies within w."""
    lr = _logit_ref(grid)[None, :, None]
    betas = grid.betas[:, None, None]
    for c, name in enumerate(CALS):
        cal = calibration_named(name)
        fixed = grid.fixed_logits[c]
        ok = ~np.isnan(fixed) & (np.abs(grid.multipliers[c] - 1.0) > 1e-6)
        x = np.where(ok, fixed, 0.0)
        w = 64 * XTOL * np.maximum(1.0, np.abs(x)) / np.maximum(np.abs(grid.multipliers[c]
                                                                       - 1.0), 1e-6)
        w = np.where(ok, np.minimum(w, 1e-6 * np.maximum(1.0, np.abs(x))), 0.0)

        def g(L: np.ndarray, cal=cal) -> np.ndarray:
            return theory.pos_map_logit(L, lr, betas, calibration=cal) - L

        assert np.all((np.sign(g(x - w)) * np.sign(g(x + w)))[ok] <= 0), name


def _omega_paper(logit_p: float, eps: float = 1e-5) -> float:
    """The paper's eq. (4): 1 / sqrt(p (1 - p) + eps), with p (1 - p) from the logit."""
    e = math.exp(-abs(logit_p))
    return 1.0 / math.sqrt(e / (1.0 + e) ** 2 + eps)


def _scan_roots(l_ref: float, beta: float, n: int = 400_001) -> list[float]:
    """Fixed points of L -> L_ref + Omega(L) / beta by sign changes of the difference on a
    uniform logit grid over [L_ref, L_ref + max Omega / beta + 1] (Theorem 3's range)."""
    hi = l_ref + (1 / math.sqrt(1e-5)) / beta + 1.0  # sup Omega = 1 / sqrt(eps)
    L = np.linspace(l_ref, hi, n)
    e = np.exp(-np.abs(L))
    g = l_ref + 1.0 / np.sqrt(e / (1.0 + e) ** 2 + 1e-5) / beta - L
    change = np.flatnonzero(np.sign(g[:-1]) * np.sign(g[1:]) < 0)
    return [(L[k], L[k + 1]) for k in change]


def test_paper_fixed_points_match_a_brute_force_scan(grid: ExplorerGrid) -> None:
    c = CALS.index("paper")
    for i, beta in enumerate(BETAS):
        for j, p_ref in enumerate(P_REFS):
            cells = _scan_roots(math.log(p_ref / (1 - p_ref)), beta)
            fixed = grid.fixed_logits[c, i, j]
            fixed = fixed[~np.isnan(fixed)]
            assert len(cells) == fixed.size, (beta, p_ref, cells, fixed)
            for (lo, hi), root in zip(cells, fixed, strict=True):
                assert lo <= root <= hi, (beta, p_ref, lo, hi, root)


def test_paper_cobweb_matches_the_scalar_recurrence_written_out(grid: ExplorerGrid) -> None:
    """Theorem 2 with floats: p_n = 1 / (1 + (1 - p_ref) / p_ref exp(-Omega(p_{n-1}) / beta))."""
    c = CALS.index("paper")
    for i, beta in enumerate(BETAS):
        for j, p_ref in enumerate(P_REFS):
            p, path = p_ref, [p_ref]
            for _ in range(grid.n_steps):
                omega = 1.0 / math.sqrt(p * (1.0 - p) + 1e-5)
                p = 1.0 / (1.0 + (1.0 - p_ref) / p_ref * math.exp(-omega / beta))
                path.append(p)
            np.testing.assert_allclose(grid.path[c, i, j], path, rtol=1e-9, atol=1e-12)


def test_mean_only_map_is_flat_at_the_one_step_value(grid: ExplorerGrid) -> None:
    c = CALS.index("mean_only")
    want = 1.0 / (1.0 + (1 - grid.p_refs[None, :]) / grid.p_refs[None, :]
                  * np.exp(-1.0 / grid.betas[:, None]))
    np.testing.assert_allclose(grid.map_values[c], want[..., None] * np.ones(41), rtol=1e-12)
    np.testing.assert_allclose(grid.fixed[c][..., 0], want, rtol=1e-12)
    assert np.all(grid.stable[c][..., 0])


def test_cobweb_follows_the_map(grid: ExplorerGrid) -> None:
    for c, name in enumerate(CALS):
        cal = calibration_named(name)
        path = grid.path[c]
        step = theory.pos_map(path[..., :-1], grid.p_refs[None, :, None],
                              grid.betas[:, None, None], calibration=cal)
        np.testing.assert_allclose(path[..., 1:], step, rtol=1e-12, atol=0)
    x, y = cobweb_xy(path)
    assert x.shape[-1] == y.shape[-1] == 2 * grid.n_steps + 1
    # vertical moves reach the map, horizontal moves reach the diagonal
    np.testing.assert_array_equal(x[..., 0::2], y[..., 0::2])  # on the diagonal
    np.testing.assert_array_equal(x[..., 1::2], path[..., :-1])
    np.testing.assert_array_equal(y[..., 1::2], path[..., 1:])


def test_stability_agrees_with_a_finite_difference_slope(grid: ExplorerGrid) -> None:
    """Lemma 1's multiplier against a central difference of the library's logit map."""
    lr = _logit_ref(grid)[None, :, None]
    betas = grid.betas[:, None, None]
    for c, name in enumerate(CALS):
        cal = calibration_named(name)
        fixed = grid.fixed_logits[c]
        ok = ~np.isnan(fixed) & (np.abs(fixed) < 30)
        x = np.where(ok, fixed, 0.0)
        h = 1e-5
        fd = (theory.pos_map_logit(x + h, lr, betas, calibration=cal)
              - theory.pos_map_logit(x - h, lr, betas, calibration=cal)) / (2 * h)
        np.testing.assert_allclose(fd[ok], grid.multipliers[c][ok], rtol=1e-5, atol=1e-7)
        clear = ok & (np.abs(np.abs(fd) - 1) > 1e-3)
        assert np.array_equal((np.abs(fd) < 1)[clear], grid.stable[c][clear]), name


def test_settled_path_cuts_only_after_the_cobweb_stops_moving() -> None:
    path = np.array([0.2, 0.5, 0.6, 0.6 + 1e-7, 0.6 + 1e-7])
    np.testing.assert_array_equal(settled_path(path), path[:4])
    moving = np.array([0.2, 0.8, 0.2, 0.8])
    np.testing.assert_array_equal(settled_path(moving), moving)


def test_figure_holds_one_frame_per_state(grid: ExplorerGrid) -> None:
    fig = explorer_figure(grid, start=(1, 2, 3))
    assert len(fig.data) == 6
    assert len(fig.frames) == grid.n_states
    frame = {f.name: f for f in fig.frames}["3-4-5"]
    assert list(frame.traces) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(np.asarray(frame.data[1].y, dtype=float),
                               grid.map_values[3, 4, 5], rtol=1e-6, atol=1e-7)
    x, y = cobweb_xy(settled_path(grid.path[3, 4, 5]))
    np.testing.assert_allclose(np.asarray(frame.data[2].x, dtype=float), x, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(frame.data[2].y, dtype=float), y, rtol=1e-6)
    n_stable = int(np.sum(grid.stable[3, 4, 5]))
    assert len(frame.data[3].x) == n_stable
    assert len(frame.data[4].x) == int(np.sum(~np.isnan(grid.fixed_logits[3, 4, 5]))) - n_stable
    # the first state shown is the start's
    np.testing.assert_allclose(np.asarray(fig.data[2].y, dtype=float), grid.map_values[1, 2, 3],
                               rtol=1e-6, atol=1e-7)
    assert [s.active for s in fig.layout.sliders] == [2, 3]
    assert fig.layout.updatemenus[0].active == 1
    assert [len(s.steps) for s in fig.layout.sliders] == [len(BETAS), len(P_REFS)]
    assert len(fig.layout.updatemenus[0].buttons) == len(CALS)


def test_rendered_div_loads_no_plotly_and_wires_the_controls(grid: ExplorerGrid) -> None:
    html = render_explorer(grid)
    assert html.lstrip().startswith("<div")
    assert "plotly.min.js" not in html and "cdn" not in html.lower()
    assert "plotly_sliderchange" in html and "plotly_buttonclicked" in html


@pytest.mark.parametrize("kwargs, name", [
    ({"betas": [0.0, 1.0]}, "betas"),
    ({"betas": [-1.0]}, "betas"),
    ({"betas": [1.0, np.inf]}, "betas"),
    ({"betas": [2.0, 1.0]}, "betas"),
    ({"betas": [1.0, 1.0]}, "betas"),
    ({"betas": []}, "betas"),
    ({"betas": [[1.0, 2.0]]}, "betas"),
    ({"betas": "1"}, "betas"),
    ({"p_refs": [0.0, 0.5]}, "p_refs"),
    ({"p_refs": [0.5, 1.0]}, "p_refs"),
    ({"p_refs": [0.5, 0.2]}, "p_refs"),
    ({"p_refs": [np.nan]}, "p_refs"),
    ({"calibrations": ("paper", "nope")}, "calibration"),
    ({"calibrations": ()}, "calibrations"),
    ({"calibrations": "paper"}, "calibrations"),
    ({"calibrations": ("paper", "paper")}, "calibrations"),
    ({"n_p": 1}, "n_p"),
    ({"n_p": 10.0}, "n_p"),
    ({"n_steps": 0}, "n_steps"),
])
def test_bad_grid_arguments_raise(kwargs: dict, name: str) -> None:
    args = {"betas": [0.5, 1.0], "p_refs": [0.2, 0.5], **kwargs}
    with pytest.raises(ValueError, match=name):
        explorer_grid(**args)


@pytest.mark.parametrize("start", [(0, 0), (0, 0, 2), (-1, 0, 0), (0, 0.0, 0)])
def test_bad_start_raises(start: tuple) -> None:
    small = explorer_grid([1.0], [0.2, 0.5], ("paper",), n_p=5, n_steps=2)
    with pytest.raises(ValueError, match="start"):
        explorer_figure(small, start=start)


def test_stage_plotly_copies_the_pinned_bundle_once(tmp_path) -> None:
    """The book's copy of Plotly's JavaScript (pipeline.stage_plotly): the wheel's file, byte
    for byte, where the explorer page loads it; a partial copy (no marker) is replaced."""
    import plotly

    from grpo_companion.book.explorer import PLOTLY_JS
    from grpo_companion.book.pipeline import stage_plotly

    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    stage_plotly(tmp_path)
    copy = tmp_path / PLOTLY_JS
    assert copy.read_bytes() == src.read_bytes()
    stamp = copy.stat().st_mtime_ns
    stage_plotly(tmp_path)  # up to date: left alone
    assert copy.stat().st_mtime_ns == stamp
    (copy.parent / ".source").unlink()  # as a killed copy would leave it
    copy.write_bytes(b"partial")
    stage_plotly(tmp_path)
    assert copy.read_bytes() == src.read_bytes()
    assert not list((tmp_path / "_static").glob(".plotly.tmp-*"))
