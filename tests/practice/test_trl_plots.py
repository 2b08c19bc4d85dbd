"""``practice.trl_plots``: each figure draws what it is given (TRL's side from TRLBandit)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from grpo_companion.practice import trl_plots  # noqa: E402
from grpo_companion.practice import trl_questions as tq  # noqa: E402
from grpo_companion.practice.trl_bandit import TRLBandit  # noqa: E402
from grpo_companion.practice.trl_bridge import (  # noqa: E402
    predict_limits,
    theory_reading,
)

from . import _tiny  # noqa: E402


@pytest.fixture(scope="module")
def bandits(tmp_path_factory):
    model = _tiny.save_model(tmp_path_factory.mktemp("tiny-llama"))
    tok = _tiny.tokenizer()
    ids = tok("say A")["input_ids"]
    out = tmp_path_factory.mktemp("out")
    return {name: TRLBandit(model, tok, ids, out, num_generations=4, **s) for name, s in
            {"k3_ratio": dict(beta=1.0), "beta0": dict(beta=0.0),
             "batch": dict(beta=1.0, scale_rewards="batch", per_device_train_batch_size=8),
             "higher": dict(beta=1.0, epsilon_high=0.28)}.items()}


def test_drift_and_rounds_figures(bandits):
    grid = np.array([0.2, 0.6])
    comps = {k: tq.compare_drift(bandits[k], 0.3, grid) for k in ("k3_ratio", "beta0")}
    fig = trl_plots.drift_figure(comps, {k: bandits[k].trainer.args for k in comps}, 0.3)
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), comps["k3_ratio"].measured)
    assert len(ax.get_legend().get_texts()) == 2
    plt.close(fig)
    rounds = {"higher": tq.compare_round(bandits["higher"], 0.3, (1, 2))}
    paths = {"solved": bandits["higher"].rounds(0.3, 2)}
    fig = trl_plots.rounds_figure(rounds, paths, paths["solved"], 0.5)
    assert len(fig.axes) == 2 and fig.axes[0].lines[1].get_ydata()[0] == rounds["higher"].solved
    plt.close(fig)


def test_batch_and_settle_figures(bandits):
    q = np.array([0.0, 1.0])
    fp = [tq.batch_fixed_point(0.3, x, bandits["batch"].trainer.args) for x in q]
    fig = trl_plots.batch_figure(0.3, bandits["batch"].trainer.args,
                                 bandits["k3_ratio"].trainer.args, q, fp, n_dense=5)
    np.testing.assert_array_equal(fig.axes[1].lines[0].get_ydata(), fp)
    plt.close(fig)

    class Probe:
        reading = theory_reading(bandits["k3_ratio"].trainer.args)

    fig = trl_plots.settle_figure({"run": Probe()}, {"run": ([0.5], [0.01])}, [0.3])
    limits = predict_limits(np.linspace(0.01, 0.99, 99), Probe.reading)[0]
    np.testing.assert_array_equal(fig.axes[0].lines[1].get_ydata(), limits)
    plt.close(fig)
    with pytest.raises(ValueError, match="settled"):
        trl_plots.settle_figure({"run": Probe()}, {}, [0.3])
    with pytest.raises(ValueError, match="colors"):
        trl_plots.settle_figure({"run": Probe()}, {"run": ([0.5], [0.01])}, [0.3], colors={})


def test_options_table_has_a_row_per_option(bandits, tmp_path_factory):
    grid = np.array([0.2, 0.6])
    drift = {k: tq.compare_drift(bandits[k], 0.3, grid) for k in ("k3_ratio", "beta0")}
    batch = tq.compare_batch(bandits["batch"], 0.3, [0.0, 1.0], n_batches=1)
    lengths = {"k3_ratio": tq.compare_lengths(bandits["k3_ratio"], 0.3, (1, 1))}
    rounds = {"higher": tq.compare_round(bandits["higher"], 0.3, (1,))}
    solved = bandits["k3_ratio"].rounds(0.3, 1)
    table = trl_plots.options_table(drift, batch, lengths, rounds,
                                    {"rounds solved, no clip": solved}, solved)
    lines = table.splitlines()
    assert len(lines) == 2 + 2 + 1 + 2 + 2
    assert f"{drift['k3_ratio'].theory_fp:.4f}" in lines[2]
    assert "no zero" in lines[3] and "'batch'" in lines[4]
    with pytest.raises(ValueError, match="paths"):
        trl_plots.options_table(drift, batch, lengths, rounds, {}, solved)
