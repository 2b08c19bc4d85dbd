"""The interactive explorer of the PoS map: a precomputed grid shown as one Plotly figure.

The reader picks a calibration (a dropdown), the KL weight ``beta`` and the reference
success probability ``p_ref`` (two sliders) and sees, for the reference anchor, the map
``p_n = T(p_{n-1}) = sigmoid(L_ref + Omega(p_{n-1}) / beta)`` of Theorem 2 (paper, eq. 8),
its cobweb from ``p_0 = p_ref`` and its fixed points, marked stable or unstable by
Lemma 1's multiplier ``T'(p*) = Omega'(L*) / beta``.

Everything is computed beforehand by the library (:func:`explorer_grid`, vectorised over
the ``beta x p_ref`` grid of each calibration): :func:`~grpo_companion.theory.pos_map`,
:func:`~grpo_companion.theory.iterate`, :func:`~grpo_companion.theory.fixed_points_logit`
and :func:`~grpo_companion.theory.pos_map_logit_derivative`. :func:`render_explorer`
turns the grid into one Plotly figure whose frames hold every state; a few lines of
JavaScript pick the frame named by the three controls, so the page needs no server and
no Python. The page loads Plotly's JavaScript from the book's own ``_static`` folder
(:data:`PLOTLY_JS`, staged by :func:`grpo_companion.book.pipeline.stage_plotly`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.theory import (
    fixed_points_logit,
    iterate,
    logit,
    pos_map,
    pos_map_logit_derivative,
    sigmoid,
)
from grpo_companion.theory.variants import CALIBRATIONS, calibration_named
from grpo_companion.validation import as_float_array, check_count

__all__ = [
    "DIV_ID",
    "PLOTLY_JS",
    "ExplorerGrid",
    "calibration_label",
    "cobweb_xy",
    "settled_path",
    "explorer_figure",
    "explorer_grid",
    "plotly_script_tag",
    "render_explorer",
]

#: Where the book serves Plotly's JavaScript, relative to the HTML root.
PLOTLY_JS = "_static/plotly/plotly.min.js"

#: The ``id`` of the explorer's ``<div>`` (the browser test looks for it).
DIV_ID = "grpo-pos-explorer"

#: Indices of the traces that every frame replaces (the diagonal, trace 0, never changes).
_FRAME_TRACES = [1, 2, 3, 4, 5]


@dataclass(frozen=True)
class ExplorerGrid:
    """The explorer's data: every state the reader can select, computed beforehand.

    Axes of the arrays: calibration, ``beta``, ``p_ref``, then the axis named below.

    Attributes
    ----------
    calibrations : tuple of str
        Names in ``grpo_companion.theory.CALIBRATIONS``.
    betas, p_refs : ndarray
        The slider values, increasing.
    p : ndarray
        Where the map is drawn, in [0, 1].
    map_values : ndarray
        ``T(p)``, last axis ``p``.
    path : ndarray
        ``p_0 = p_ref, p_1, ..., p_N``, last axis the iteration.
    fixed_logits : ndarray
        Logits of every fixed point, increasing, padded with NaN.
    multipliers : ndarray
        ``T'(p*)`` at each fixed point (NaN for padding).
    """

    calibrations: tuple[str, ...]
    betas: np.ndarray
    p_refs: np.ndarray
    p: np.ndarray
    map_values: np.ndarray
    path: np.ndarray
    fixed_logits: np.ndarray
    multipliers: np.ndarray

    @cached_property
    def fixed(self) -> np.ndarray:
        """Fixed points as probabilities (NaN for padding)."""
        return special.expit(self.fixed_logits)

    @cached_property
    def stable(self) -> np.ndarray:
        """Lemma 1: a fixed point attracts nearby starts when ``|T'(p*)| < 1``."""
        with np.errstate(invalid="ignore"):
            return np.abs(self.multipliers) < 1.0

    @property
    def n_steps(self) -> int:
        """Iterations ``N`` of each cobweb."""
        return self.path.shape[-1] - 1

    @property
    def n_states(self) -> int:
        """Selectable states: calibrations x betas x p_refs."""
        return len(self.calibrations) * self.betas.size * self.p_refs.size


def _increasing(name: str, value: ArrayLike, low: float, high: float, valid: str) -> np.ndarray:
    """A non-empty, strictly increasing 1-D array with ``low < x < high``."""
    x = as_float_array(name, value, valid)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array ({valid}), got shape {x.shape}")
    if not np.all((x > low) & (x < high)):
        raise ValueError(f"{name} must be {valid}, got {x!r}")
    if np.any(np.diff(x) <= 0):
        raise ValueError(f"{name} must be strictly increasing (slider order), got {x!r}")
    return x


def _calibration_names(calibrations: Sequence[str]) -> tuple[str, ...]:
    if isinstance(calibrations, str) or not len(calibrations):
        raise ValueError("calibrations must be a non-empty sequence of names from "
                         f"{tuple(CALIBRATIONS)}, got {calibrations!r}")
    names = tuple(calibrations)
    for name in names:
        calibration_named(name)  # raises ValueError naming the valid choices
    if len(set(names)) != len(names):
        raise ValueError(f"calibrations must not repeat a name, got {names!r}")
    return names


def explorer_grid(
    betas: ArrayLike,
    p_refs: ArrayLike,
    calibrations: Sequence[str] = ("paper", "mean_only"),
    *,
    n_p: int = 101,
    n_steps: int = 25,
) -> ExplorerGrid:
    """Precompute the explorer: map, cobweb and fixed points for every selectable state.

    Reference anchor (``alpha = 1``, Theorem 2, eq. 8): ``L_n = L_ref + Omega(p_{n-1}) / beta``.
    One library call per calibration covers the whole ``beta x p_ref`` grid.

    Parameters
    ----------
    betas : array_like
        KL weights, ``> 0``, finite, strictly increasing (the slider's steps).
    p_refs : array_like
        Reference success probabilities in (0, 1), strictly increasing.
    calibrations : sequence of str
        Names in ``grpo_companion.theory.CALIBRATIONS``, without repeats.
    n_p : int
        Points of the uniform grid on [0, 1] where ``T`` is drawn, ``>= 2``.
    n_steps : int
        Iterations of each cobweb, ``>= 1``.

    Returns
    -------
    ExplorerGrid

    Raises
    ------
    ValueError
        Naming the argument and its valid range.
    """
    b = _increasing("betas", betas, 0.0, np.inf, "> 0 and finite")
    r = _increasing("p_refs", p_refs, 0.0, 1.0, "in (0, 1)")
    names = _calibration_names(calibrations)
    n_p = check_count("n_p", n_p, 2)
    n_steps = check_count("n_steps", n_steps, 1)
    p = np.linspace(0.0, 1.0, n_p)
    beta_col, lr_row = b[:, None], logit(r)[None, :]
    maps, paths, roots, slopes = [], [], [], []
    for name in names:
        cal = calibration_named(name)
        maps.append(pos_map(p, r[None, :, None], b[:, None, None], calibration=cal))
        paths.append(np.moveaxis(iterate(r[None, :], r[None, :], beta_col, n_steps,
                                         calibration=cal), 0, -1))
        fixed = fixed_points_logit(lr_row, beta_col, calibration=cal)
        slope = pos_map_logit_derivative(np.nan_to_num(fixed), b[:, None, None],
                                         calibration=cal)
        roots.append(fixed)
        slopes.append(np.where(np.isnan(fixed), np.nan, slope))
    width = max(f.shape[-1] for f in roots)

    def pad(a: np.ndarray) -> np.ndarray:
        return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])],
                      constant_values=np.nan)

    return ExplorerGrid(names, b, r, p, np.stack(maps), np.stack(paths),
                        np.stack([pad(f) for f in roots]), np.stack([pad(s) for s in slopes]))


def settled_path(path: np.ndarray, tol: float = 1e-5) -> np.ndarray:
    """``p_0, ..., p_n`` up to the first step that moves by less than ``tol`` (all if none).

    Later steps of a converging cobweb are drawn on top of each other; dropping them keeps
    the page small. A path that keeps moving (a period-2 orbit) is kept whole.
    """
    still = np.flatnonzero(np.abs(np.diff(path)) < tol)
    return path if still.size == 0 else path[: still[0] + 2]


def cobweb_xy(path: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the cobweb of ``p_0, ..., p_N`` (last axis), starting on the diagonal.

    ``(p_0, p_0), (p_0, p_1), (p_1, p_1), (p_1, p_2), ..., (p_N, p_N)``: up or down to the
    map, across to the diagonal. Returns ``x`` and ``y``, each with ``2 N + 1`` points.
    """
    path = np.asarray(path, dtype=np.float64)
    x = np.repeat(path, 2, axis=-1)[..., :-1]
    y = np.concatenate([path[..., :1], np.repeat(path[..., 1:], 2, axis=-1)], axis=-1)
    return x, y


def calibration_label(name: str) -> str:
    """A short menu label for a named calibration: its name and what sets its ``Omega``."""
    cal = calibration_named(name)
    if cal.normalization != "mean_std":
        return f"{name}: {cal.normalization.replace('_', '-')}"
    where = "in √" if cal.eps_placement == "sqrt" else "on std"
    return f"{name}: mean-std, ε = {cal.eps:g} {where}"


def _format_fixed(logit_p: float) -> str:
    """A fixed point for a legend: ``1 − 3.2e-09`` when it is closer to 1 than 0.9995."""
    if logit_p > np.log(1999.0):
        return f"1 − {float(sigmoid(-logit_p)):.2g}"
    return f"{float(sigmoid(logit_p)):.3f}"


def _state(grid: ExplorerGrid, c: int, i: int, j: int) -> list[dict]:
    """The five changing traces of state (calibration c, beta i, p_ref j), float32 data."""
    f32 = np.float32
    x, y = cobweb_xy(settled_path(grid.path[c, i, j]))
    fixed, logits = grid.fixed[c, i, j], grid.fixed_logits[c, i, j]
    stable = grid.stable[c, i, j]
    kinds = []
    for keep, word in ((stable, "stable"), (~stable & ~np.isnan(logits), "unstable")):
        values = ", ".join(_format_fixed(v) for v in logits[keep]) or "none"
        kinds.append({"x": fixed[keep].astype(f32), "y": fixed[keep].astype(f32),
                      "name": f"{word} fixed points: {values}"})
    r = grid.p_refs[j]
    return [
        {"x": [r, r], "y": [0.0, 1.0], "name": f"p<sub>ref</sub> = {r:g}"},
        {"y": grid.map_values[c, i, j].astype(f32)},
        {"x": x.astype(f32), "y": y.astype(f32)},
        *kinds,
    ]


def _frame_name(c: int, i: int, j: int) -> str:
    return f"{c}-{i}-{j}"


def _steps(values: np.ndarray) -> list[dict]:
    # "skip": a step only moves the slider; the page's script shows the matching frame
    return [{"method": "skip", "label": f"{v:g}", "value": f"{v:g}"} for v in values]


def explorer_figure(grid: ExplorerGrid, start: tuple[int, int, int] = (0, 0, 0)):
    """The explorer as a Plotly figure: one frame per state, a dropdown and two sliders.

    Parameters
    ----------
    grid : ExplorerGrid
        From :func:`explorer_grid`.
    start : tuple of int
        Indices (calibration, beta, p_ref) shown first.

    Returns
    -------
    plotly.graph_objects.Figure
        Traces: 0 the diagonal, 1 the line ``p = p_ref``, 2 the map, 3 the cobweb,
        4 the stable and 5 the unstable fixed points. Frame ``"c-i-j"`` holds traces 1-5
        of calibration ``c``, ``betas[i]`` and ``p_refs[j]``. The controls' steps do
        nothing by themselves (method ``"skip"``); :func:`render_explorer` adds the script
        that shows the frame they select.
    """
    import plotly.graph_objects as go

    shape = (len(grid.calibrations), grid.betas.size, grid.p_refs.size)
    indices = len(start) == 3 and all(isinstance(k, int | np.integer) for k in start)
    if not indices or not all(0 <= k < n for k, n in zip(start, shape, strict=True)):
        raise ValueError(f"start must be three indices below {shape}, got {start!r}")
    c0, i0, j0 = (int(k) for k in start)
    first = _state(grid, c0, i0, j0)
    line = {"mode": "lines", "hoverinfo": "skip"}
    traces = [
        go.Scatter(x=[0.0, 1.0], y=[0.0, 1.0], name="diagonal p<sub>n</sub> = p<sub>n−1</sub>",
                   line={"color": "#888888", "dash": "dot", "width": 1}, **line),
        go.Scatter(line={"color": "#2ca02c", "dash": "dash", "width": 1.5}, **line,
                   **first[0]),
        go.Scatter(x=grid.p.astype(np.float32), name="map T(p)", mode="lines",
                   line={"color": "#1f77b4", "width": 2.5},
                   hovertemplate="p = %{x:.3f}<br>T(p) = %{y:.4f}<extra></extra>", **first[1]),
        go.Scatter(name="cobweb from p<sub>0</sub> = p<sub>ref</sub>", mode="lines+markers",
                   line={"color": "#d62728", "width": 1.2}, marker={"size": 3},
                   hovertemplate="(%{x:.4f}, %{y:.4f})<extra>cobweb</extra>", **first[2]),
        go.Scatter(mode="markers", marker={"size": 12, "color": "#111111"},
                   hovertemplate="p* = %{x:.6f}<extra>stable</extra>", **first[3]),
        go.Scatter(mode="markers", hovertemplate="p* = %{x:.6f}<extra>unstable</extra>",
                   marker={"size": 12, "color": "white", "line": {"color": "#111111",
                                                                  "width": 2}}, **first[4]),
    ]
    frames = [go.Frame(name=_frame_name(c, i, j), data=_state(grid, c, i, j),
                       traces=_FRAME_TRACES)
              for c in range(shape[0]) for i in range(shape[1]) for j in range(shape[2])]
    sliders = [
        {"active": i0, "steps": _steps(grid.betas), "y": -0.12, "len": 1.0, "x": 0.0,
         "pad": {"t": 10, "b": 0}, "currentvalue": {"prefix": "β (KL weight) = "}},
        {"active": j0, "steps": _steps(grid.p_refs), "y": -0.36, "len": 1.0, "x": 0.0,
         "pad": {"t": 10, "b": 0}, "currentvalue": {"prefix": "p<sub>ref</sub> = "}},
    ]
    menu = {"type": "dropdown", "active": c0, "x": 0.0, "xanchor": "left", "y": 1.02,
            "yanchor": "bottom", "showactive": True,
            "buttons": [{"method": "skip", "label": calibration_label(name)}
                        for name in grid.calibrations]}
    axis = {"range": [-0.02, 1.02], "zeroline": False, "constrain": "domain"}
    layout = go.Layout(
        height=760, margin={"l": 55, "r": 15, "t": 60, "b": 10},
        xaxis={**axis, "title": {"text": "p<sub>n−1</sub>"}},
        yaxis={**axis, "title": {"text": "p<sub>n</sub> = T(p<sub>n−1</sub>)"}},
        legend={"orientation": "h", "x": 0.0, "y": -0.6, "yanchor": "top"},
        sliders=sliders, updatemenus=[menu], template="plotly_white",
        font={"size": 13},
    )
    return go.Figure(data=traces, layout=layout, frames=frames)


#: Shows the frame that the dropdown and the two sliders select (``{plot_id}`` is filled in
#: by :func:`plotly.io.to_html`). Reads the controls' ``active`` indices from the layout.
_CONTROLLER = """
var gd = document.getElementById('{plot_id}');
function showSelected() {
  var c = gd.layout.updatemenus[0].active;
  var b = gd.layout.sliders[0].active, r = gd.layout.sliders[1].active;
  return Plotly.animate(gd, [c + '-' + b + '-' + r], {mode: 'immediate',
    frame: {duration: 0, redraw: true}, transition: {duration: 0}});
}
gd.on('plotly_sliderchange', showSelected);
gd.on('plotly_buttonclicked', showSelected);
gd.dataset.explorerReady = 'true';
"""


def render_explorer(grid: ExplorerGrid, start: tuple[int, int, int] = (0, 0, 0)) -> str:
    """The explorer as an HTML ``<div>`` (with its inline script), for a static page.

    Plotly's JavaScript is not included: the page must load it first, from the book's
    own copy (:func:`plotly_script_tag`). Data are float32, base64-encoded by Plotly.
    """
    import plotly.io as pio

    return pio.to_html(explorer_figure(grid, start), include_plotlyjs=False, full_html=False,
                       div_id=DIV_ID, auto_play=False, post_script=_CONTROLLER,
                       config={"displaylogo": False, "responsive": True,
                               "modeBarButtonsToRemove": ["select2d", "lasso2d"]})


def plotly_script_tag(depth: int) -> str:
    """``<script>`` loading the book's copy of Plotly from a page ``depth`` folders down."""
    depth = check_count("depth", depth, 0)
    return f'<script src="{"../" * depth}{PLOTLY_JS}"></script>'
