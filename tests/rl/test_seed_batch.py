"""The batched engine of several seeds against separate run_long runs of each seed.

:func:`grpo_companion.rl.seed_batch.run_seeds_batched` must return, field for field, the
:class:`~grpo_companion.rl.long_run.LongRun` of ``run_long(config.replace(seed=s))`` for
each seed, up to float rounding. Both sides run torch on one thread.

**Float64.** The trainer builds the transformer in float32 whatever ``dtype`` says (the
knob sets the tabular policies' precision), so the float64 comparison patches the
trainer's sequence adapter, for the separate runs and the engine alike, to build the
transformer in the config's ``dtype`` (the one-line change ``model.to(device, dtype)``
in ``SequenceGRPO.build``). In float64 the two computations differ only in the order of
their roundings (the engine groups the attention and the matrix products differently),
each a relative ``2**-53 ~ 1.1e-16``; through the tiny model, four iterations and the
enumeration of every output, that grows to about ``1e-14`` (what we see). ``rtol=1e-9``
leaves five orders of magnitude for other machines' rounding and still catches any
difference of substance: one different sample changes a group's advantage by ``O(1)``
and the policy after the step by ``O(lr)``, far above it. A sample can only differ if one
of ``multinomial``'s draws lands within about ``1e-14`` (relative) of a boundary between
two tokens; with about 10^3 draws that has a chance of order 1e-11, so the discrete fields
(the groups' successes, the sampled held-out PoS) are compared exactly.

**Float32.** The separate float32 run is itself off the float64 run of the same seeds by
float32 rounding: same data, same draws, precision only (checked: the discrete fields
agree). The engine's float32 run may differ from the separate float32 run by rounding of
the same size, so each continuous field must be within ``FLOAT32_FACTOR`` times that
measured float32 error (plus a few float32 ulps of the field's size, for fields whose
float32 error happens to be near zero).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types

import numpy as np
import pytest
import torch

from grpo_companion import theory
from grpo_companion.rl import grpo_tasks, long_run, seed_batch
from grpo_companion.rl.long_run import LongRun
from grpo_companion.rl.trainer import TrainConfig, prepare_run
from grpo_companion.theory.analyses import trained_loss

# test_long_run's TINY (groups of 4 see successes after its pre-training), with per-prompt
# KL weights, and batches smaller than the pool (prompts left out of a batch take the
# recorder's other path)
TINY = TrainConfig.flat(task="sequence", max_operand=19, n_eval_prompts=16, eval_samples=4,
                        sft_steps=200, sft_batch_size=64, sft_lr=1e-2, d_model=16, n_heads=2,
                        n_layers=1, group_size=4, mu=2, iterations=4, prompts_per_iteration=4,
                        grpo_prompts=8, device="cpu", progress=False, lr=1e-3, kl="k3",
                        loss_type="dr_grpo", grpo_beta_multipliers=(1.0, 3.0))
SEEDS = (2, 0, 1)  # not sorted: the results follow the order of the seeds
RECORD_EVERY = 3
#: Fields that come from counting or indexing: equal, or the runs are not the same runs.
DISCRETE = ("trained", "held_out", "operands_trained", "operands_held", "steps",
            "group_successes", "sampled_held", "beta_trained", "n_outputs")
CONTINUOUS = ("logit_trained", "logit_held", "entropy_trained", "entropy_held", "delta",
              "delta_pos", "target_logit", "orbit_tv", "orbit_logit", "clip_fraction")
TIMES = ("train_seconds", "record_seconds")
FLOAT32_FACTOR = 10.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _build_in_dtype(config, device, dtype):
    task, model, tracked = _ORIGINAL_BUILD(config, device, dtype)
    return task, model.to(dtype=dtype), tracked


_ORIGINAL_BUILD = grpo_tasks.SequenceGRPO.build


@pytest.fixture(scope="module")
def float64_runs():
    """Separate and batched runs of SEEDS, the transformer in float64."""
    config = TINY.replace(dtype="float64")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo_tasks.SequenceGRPO, "build", staticmethod(_build_in_dtype))
        separate = [long_run.run_long(config.replace(seed=s),
                                      record_every=RECORD_EVERY) for s in SEEDS]
        batched = seed_batch.run_seeds_batched(config, list(SEEDS), record_every=RECORD_EVERY)
    assert separate[0].logit_trained.dtype == np.float64
    return separate, batched


@pytest.fixture(scope="module")
def float32_runs():
    separate = [long_run.run_long(TINY.replace(seed=s), record_every=RECORD_EVERY)
                for s in SEEDS]
    return separate, seed_batch.run_seeds_batched(TINY, list(SEEDS), record_every=RECORD_EVERY)


def test_every_field_of_long_run_is_compared():
    names = {f.name for f in dataclasses.fields(LongRun)}
    assert names == {*DISCRETE, *CONTINUOUS, *TIMES, "config", "sft_loss"}


def _assert_same_run(separate: LongRun, batched: LongRun, *, rtol: float,
                     atol: dict[str, float] | float) -> None:
    assert batched.config == separate.config
    assert batched.sft_loss == separate.sft_loss  # pre-training is the trainer's, per seed
    for name in DISCRETE:
        np.testing.assert_array_equal(getattr(batched, name), getattr(separate, name),
                                      err_msg=name)
    for name in CONTINUOUS:
        a, b = getattr(separate, name), getattr(batched, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_array_equal(np.isnan(b), np.isnan(a), err_msg=name)
        tol = atol[name] if isinstance(atol, dict) else atol
        np.testing.assert_allclose(b, a, rtol=rtol, atol=tol, err_msg=name)
    for name in TIMES:
        assert 0 < getattr(batched, name) < math.inf


def test_batched_equals_separate_runs_in_float64(float64_runs):
    separate, batched = float64_runs
    assert [r.config.run.seed for r in batched] == list(SEEDS)
    for a, b in zip(separate, batched, strict=True):
        _assert_same_run(a, b, rtol=1e-9, atol=1e-12)
    # the runs learn and differ between seeds, so that equal numbers mean something
    assert not np.array_equal(batched[0].logit_trained[-1], batched[0].logit_trained[0])
    assert not np.array_equal(batched[0].trained, batched[1].trained)
    assert np.isnan(batched[0].delta).any() and np.isfinite(batched[0].delta).any()
    assert 0 < np.nansum(batched[0].group_successes) < np.sum(
        np.isfinite(batched[0].group_successes)) * TINY.grpo.group_size


def test_batched_equals_separate_runs_in_float32(float32_runs, float64_runs):
    separate, batched = float32_runs
    reference = float64_runs[0]
    for a, b, exact in zip(separate, batched, reference, strict=True):
        assert a.logit_trained.dtype == np.float64  # the enumeration is float64 in both
        for name in DISCRETE:  # float32 changed the rounding only, not a single draw
            np.testing.assert_array_equal(getattr(a, name), getattr(exact, name),
                                          err_msg=name)
        scale = {name: float(np.nanmax(np.abs(getattr(a, name)))) for name in CONTINUOUS}
        error = {name: float(np.nanmax(np.abs(getattr(a, name) - getattr(exact, name))))
                 for name in CONTINUOUS}
        ulps = 4 * float(np.finfo(np.float32).eps)
        atol = {name: FLOAT32_FACTOR * error[name] + ulps * scale[name] for name in CONTINUOUS}
        _assert_same_run(a, b, rtol=0.0, atol=atol)


def test_workers_train_parts_of_the_seeds_as_batches_of_their_own(float32_runs):
    """``workers=2``: two spawned processes, each one batch; the same runs, in seed order."""
    config = TINY.replace(iterations=2)
    together = seed_batch.run_seeds_batched(config, np.array([2, 0]), record_every=2)
    apart = seed_batch.run_seeds_batched(config, [2, 0], record_every=2, workers=2)
    assert [r.config.run.seed for r in apart] == [2, 0]
    for a, b in zip(together, apart, strict=True):  # batches of one seed round differently
        _assert_same_run(a, b, rtol=1e-4, atol=1e-5)
    # and the first iterations are those of the longer float32 runs (same draws)
    np.testing.assert_array_equal(together[0].group_successes,
                                  float32_runs[0][0].group_successes[:2])


def test_the_self_check_catches_a_forward_pass_that_is_not_the_models():
    config = TINY.replace(sft_steps=0)
    runs = [prepare_run(config.replace(seed=s)).run_state for s in (0, 1)]
    stack = seed_batch.StackedTransformer(runs[0].policy)
    params = {name: torch.stack([dict(r.policy.named_parameters())[name].detach()
                                 for r in runs]) for name, _ in runs[0].policy.named_parameters()}
    seed_batch._self_check(stack, runs, params)  # the same weights: passes
    # a slightly different head (a bias shift that is not the same for every token, which
    # log_softmax would ignore)
    params["head.bias"] = params["head.bias"] + 1e-3 * torch.arange(params["head.bias"].shape[1])
    with pytest.raises(RuntimeError, match="no longer computes TinyCausalTransformer"):
        seed_batch._self_check(stack, runs, params)


@pytest.mark.parametrize("seeds", [[], [0, 0], [0, 1.5], [True], "01", 3, [0, None]],
                         ids=["empty", "repeated", "float", "bool", "str", "int", "none"])
def test_bad_seeds_are_refused(seeds):
    with pytest.raises(ValueError, match="seeds must be a non-empty list of distinct ints"):
        seed_batch.run_seeds_batched(TINY, seeds)


def test_a_seed_out_of_the_configs_range_is_refused():
    with pytest.raises(ValueError, match="seed must be"):
        seed_batch.run_seeds_batched(TINY, [0, 2**63])


@pytest.mark.parametrize(("config", "message"), [
    (TrainConfig.flat(progress=False), "config must be a sampled task='sequence' run"),
    (TINY.replace(grpo_prompts=None, grpo_beta_multipliers=None),
     "config must be a sampled task='sequence' run"),
    (TINY.replace(optimizer="sgd"), "optimizer must be 'adam'"),
    (TINY.replace(optimizer="lbfgs"), "optimizer must be 'adam'"),
    (TINY.replace(ref_reset_every=2), "ref_reset_every must be None"),
    ("not a config", "config must be a TrainConfig"),
], ids=["bandit", "no_pool", "sgd", "lbfgs", "ref_reset", "type"])
def test_unsupported_runs_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        seed_batch.run_seeds_batched(config, [0, 1])


@pytest.mark.parametrize("name", ["record_every", "workers", "threads"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_bad_counts_are_refused(name, value):
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1"):
        seed_batch.run_seeds_batched(TINY, [0, 1], **{name: value})


def test_a_batched_run_repeats_bit_for_bit(float32_runs):
    """Chapter 8's determinism on a CPU: the same batch of seeds, the same numbers."""
    again = seed_batch.run_seeds_batched(TINY, list(SEEDS), record_every=RECORD_EVERY)
    for a, b in zip(float32_runs[1], again, strict=True):
        for name in (*DISCRETE, *CONTINUOUS):
            np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)


# ------------------------------------------------------------ custom normalisations
def positive_only_gains(succ, fail, n, cal, ops):
    """The paper's whitening with the failures' weight set to 0: ``w- = 0``, successes only.

    Module-level, so that spawned workers import it from this module (pytest puts this
    directory on ``sys.path``, and spawned processes inherit it).
    """
    var = succ * fail if n is None else succ * fail * n / (n - cal.ddof)
    scale = ops.sqrt(var + cal.eps) if cal.eps_placement == "sqrt" else ops.sqrt(var) + cal.eps
    return fail / scale, 0 * succ


@pytest.fixture(scope="module")
def positive_only():
    name = "positive_only_whitening"
    theory.register_normalization(name, positive_only_gains, summary="whitening, w- = 0",
                                  uses_eps=True, uses_ddof=True)
    yield name
    theory.unregister_normalization(name)


def test_workers_register_the_parents_custom_normalisation(positive_only):
    """workers=2 trains with a normalisation registered here only, as workers=1 does.

    It is w- = 0: the recorder's exact step (and its orbit) must take it as it is.
    """
    config = TINY.replace(iterations=2, normalization=positive_only)
    together = seed_batch.run_seeds_batched(config, [2, 0], record_every=2)
    apart = seed_batch.run_seeds_batched(config, [2, 0], record_every=2, workers=2)
    assert [r.config.run.seed for r in apart] == [2, 0]
    for a, b in zip(together, apart, strict=True):  # batches of one seed round differently
        _assert_same_run(a, b, rtol=1e-4, atol=1e-5)
    # iteration 1's divergence step by hand (pi_prev = pi_ref), with w- = 0 at G = 4
    run = together[0]
    cal = theory.Calibration(normalization=positive_only, group_size=TINY.grpo.group_size)
    assert float(cal.weights(0.3)[1]) == 0.0  # w- = 0
    cols = np.isfinite(run.target_logit[0])
    assert cols.sum() == TINY.grpo.prompts_per_iteration
    lr = run.logit_trained[0, cols]
    goal = trained_loss.exact_step_logit(lr, lr, run.beta_trained[cols], estimator="k3",
                                         calibration=cal)
    np.testing.assert_allclose(run.target_logit[0, cols], goal, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(run.orbit_logit[0, cols], goal, rtol=1e-12, atol=1e-12)
    for name in ("delta", "delta_pos", "orbit_tv", "target_logit", "orbit_logit"):
        values = getattr(run, name)
        assert np.all(np.isfinite(values[np.isfinite(run.delta)])), name
    assert np.all(np.isfinite(run.orbit_logit))
    # and the step is not GRPO's (the failures' weight matters)
    grpo = trained_loss.exact_step_logit(
        lr, lr, run.beta_trained[cols], estimator="k3",
        calibration=theory.Calibration(group_size=TINY.grpo.group_size))
    assert np.abs(goal - grpo).max() > 1e-3


def _whitened(succ, fail, n, cal, ops):
    return fail / ops.sqrt(succ * fail + cal.eps), succ / ops.sqrt(succ * fail + cal.eps)


@pytest.mark.parametrize("train", [
    lambda c: seed_batch.run_seeds_batched(c, [0, 1], workers=2),
    lambda c: long_run.run_seeds(c, [0, 1], workers=2),
], ids=["run_seeds_batched", "run_seeds"])
def test_a_normalisation_workers_cannot_import_is_refused_by_name(train):
    """A local function (as in a notebook) cannot be pickled by reference: ValueError."""

    def local_gains(succ, fail, n, cal, ops):
        return _whitened(succ, fail, n, cal, ops)

    theory.register_normalization("local_whitening", local_gains, summary="local",
                                  uses_eps=True)
    try:
        config = TINY.replace(normalization="local_whitening")
        with pytest.raises(ValueError, match="'local_whitening' cannot be sent to worker "
                           "processes.*use workers=1, or define the gains in an importable "
                           "module"):
            train(config)
    finally:
        theory.unregister_normalization("local_whitening")


def test_gains_defined_in_a_main_without_a_file_are_refused(monkeypatch):
    """A notebook's (or ``python -c``'s) ``__main__``: it pickles, but workers lack it."""

    def notebook_gains(succ, fail, n, cal, ops):
        return _whitened(succ, fail, n, cal, ops)

    notebook_gains.__module__, notebook_gains.__qualname__ = "__main__", "notebook_gains"
    main = types.ModuleType("__main__")  # no __file__, as in Jupyter
    main.notebook_gains = notebook_gains
    theory.register_normalization("notebook_whitening", notebook_gains, summary="notebook",
                                  uses_eps=True)
    try:
        config = TINY.replace(normalization="notebook_whitening")
        monkeypatch.setitem(sys.modules, "__main__", main)
        with pytest.raises(ValueError, match="'notebook_whitening' cannot be sent.*"
                           "notebook_gains is defined in __main__"):
            seed_batch.run_seeds_batched(config, [0, 1], workers=2)
    finally:
        theory.unregister_normalization("notebook_whitening")


def test_a_worker_keeps_a_normalisation_it_has_and_registers_a_shipped_one(positive_only):
    """What a worker does with the shipped definition (here, in this process)."""
    builtin = long_run._shipped_normalization(TINY)
    long_run._receive_normalization(builtin)  # mean_std is there already: left as it is
    assert theory.NORMALIZATIONS["mean_std"].gains.__module__ == (
        "grpo_companion.theory.normalizations")
    shipped = long_run._shipped_normalization(TINY.replace(normalization=positive_only))
    entry = theory.NORMALIZATIONS.pop(positive_only)  # as in a fresh process
    try:
        long_run._receive_normalization(shipped)
        assert theory.NORMALIZATIONS[positive_only] == entry
        assert theory.NORMALIZATIONS[positive_only].gains is positive_only_gains
    finally:
        theory.NORMALIZATIONS[positive_only] = entry
    # gains that the worker cannot find (a notebook's function): named, with the remedy
    missing = b"\x80\x02cgrpo_companion.rl.long_run\nno_such_gains\nq\x00."
    with pytest.raises(ValueError, match="could not load the normalisation 'gone'.*workers=1"):
        long_run._receive_normalization(("gone", missing))
