"""eval_every: the per-prompt metrics of iteration 0, every eval_every-th and the last only.

Evaluation draws from its own random generator, so skipping it changes
nothing else: the evaluated rows equal those of a run that evaluates every
iteration, and every iteration still has its row in ``iterations.csv``.
"""

import csv

import numpy as np
import pytest

from grpo_companion.rl import trainer
from grpo_companion.rl.trainer import TrainConfig, train

SEQUENCE = {"task": "sequence", "max_operand": 9, "n_eval_prompts": 8, "eval_samples": 3,
            "sft_steps": 5, "sft_batch_size": 16, "iterations": 7, "mu": 1,
            "prompts_per_iteration": 4, "group_size": 4, "d_model": 8, "n_heads": 2,
            "progress": False}
BANDIT = {"n_prompts": 12, "n_outputs": 6, "iterations": 7, "mu": 2, "group_size": 8,
          "progress": False}


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_schedule_and_defaults():
    assert TrainConfig.flat(iterations=7, eval_every=3).eval_iterations == (0, 3, 6, 7)
    assert TrainConfig.flat(iterations=6, eval_every=3).eval_iterations == (0, 3, 6)
    assert TrainConfig.flat(iterations=6, eval_every=10).eval_iterations == (0, 6)
    assert TrainConfig.flat(iterations=5).eval_iterations == tuple(range(6))  # bandit: every one
    sequence = TrainConfig.flat(task="sequence")
    assert sequence.run.eval_every is None
    assert sequence.evaluation_interval == trainer.SEQUENCE_EVAL_EVERY
    for iterations in (1, 6, 7, 100):
        for every in (1, 3, 7, 200):
            config = TrainConfig.flat(iterations=iterations, eval_every=every)
            assert config.n_evaluations == len(config.eval_iterations)
            assert config.eval_iterations == tuple(
                n for n in range(iterations + 1) if config.evaluated(n))
    with pytest.raises(ValueError, match="eval_every"):
        TrainConfig.flat(eval_every=0)


@pytest.mark.parametrize("settings", [SEQUENCE, BANDIT], ids=["sequence", "bandit"])
def test_evaluated_rows_equal_those_of_an_every_iteration_run(tmp_path, settings):
    every = train(TrainConfig.flat(**settings, eval_every=1))
    config = TrainConfig.flat(**settings, eval_every=3)
    sparse = train(config, out_dir=tmp_path)
    keep = [0, 3, 6, 7]
    np.testing.assert_array_equal(sparse.eval_iterations, keep)
    for name, values in every.metrics.items():
        assert sparse.metrics[name].shape == (4, len(sparse.prompt_ids))
        np.testing.assert_array_equal(sparse.metrics[name], values[keep], err_msg=name)
    assert sparse.iteration_rows == every.iteration_rows  # training is untouched
    np.testing.assert_array_equal(sparse.p_ref, every.p_ref)
    rows = _rows(tmp_path / "metrics.csv")
    assert sorted({int(r["iteration"]) for r in rows}) == keep
    assert len(rows) == len(keep) * len(sparse.prompt_ids)
    assert [int(r["iteration"]) for r in _rows(tmp_path / "iterations.csv")] == list(range(1, 8))
    assert len(sparse.rows()) == len(rows)


class Stop(Exception):
    pass


@pytest.mark.parametrize(("settings", "cut"), [(SEQUENCE, 4), (BANDIT, 3)],
                         ids=["sequence-between-evaluations", "bandit-at-an-evaluation"])
def test_resume_with_eval_every_gives_the_same_results(tmp_path, settings, cut):
    config = TrainConfig.flat(**settings, eval_every=3, checkpoint_every=2)
    full = train(config, out_dir=tmp_path / "full")

    def stop(n):
        if n == cut:
            raise Stop

    with pytest.raises(Stop):
        train(config, out_dir=tmp_path / "cut", callback=stop)
    resumed = train(config, out_dir=tmp_path / "cut", resume=True)
    np.testing.assert_array_equal(resumed.eval_iterations, full.eval_iterations)
    for name, values in full.metrics.items():
        np.testing.assert_array_equal(resumed.metrics[name], values)
    for name in ("metrics.csv", "iterations.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    # a finished run resumed again reads its metrics from the final checkpoint
    again = train(config, out_dir=tmp_path / "full", resume=True)
    np.testing.assert_array_equal(again.success_prob, full.success_prob)


def test_resume_refuses_a_different_eval_every(tmp_path):
    config = TrainConfig.flat(**BANDIT, eval_every=3)
    train(config, out_dir=tmp_path)
    with pytest.raises(ValueError, match="eval_every"):
        train(config.replace(eval_every=2), out_dir=tmp_path, resume=True)


def test_skipped_iterations_do_not_evaluate(monkeypatch):
    calls = []
    evaluate = trainer._evaluate

    def spy(run, old, clip):
        calls.append(run.iteration)
        return evaluate(run, old, clip)

    monkeypatch.setattr(trainer, "_evaluate", spy)
    result = train(TrainConfig.flat(**SEQUENCE))  # the default for the sequence task
    assert calls == [0, 7] == list(result.eval_iterations)
    assert result.success_prob.shape == (2, 8)
