"""Long GRPO runs on the addition task, with every prompt's exact PoS (chapter 8).

The trainer estimates success rates from samples; the outputs of the addition
task are short (at most ``max_new_tokens`` tokens), so the policy's whole
output distribution can be enumerated instead
(:meth:`~grpo_companion.rl.policies.TinyCausalTransformer.output_log_probs`).
:func:`run_long` trains one configuration and records, without sampling noise:

- the success logit of every **trained** prompt (the fixed set GRPO draws its
  batches from, ``config.sequence.grpo_prompts``) and every **held-out** prompt, at
  iteration 0 and every ``record_every`` iterations, and at the same iterations the
  Shannon entropy of each of these prompts' output distributions
  (:func:`exact_entropy`, from the same enumeration);
- at every iteration ``n`` and for every prompt of that iteration's batch, the
  total variation between the network's new policy and the tabular policy that
  the divergence step (:func:`grpo_companion.theory.analyses.trained_loss.exact_step_logit`,
  with the loss's KL estimator and its calibration at the group size) reaches
  from the network's previous policy
  (:func:`grpo_companion.theory.analyses.trained_loss.one_step_tv`). For plain k3 that
  step is the reverse-KL step: it has the trained loss's fixed points and
  on-policy gradient, but it is not the optimum of one round of that loss
  (:func:`~grpo_companion.theory.analyses.trained_loss.round_step_logit`). This is a
  one-step distance;
- at every iteration, for every trained prompt in the batch, the paper's distance
  ``D_n = TV(pi~_n, pi_n)`` to the exact orbit ``pi_n`` of the same step started
  at ``pi_ref`` (Assumption 1 of Theorem 10 bounds its growth,
  ``D_n <= D_{n-1} + delta_n``);
- at every iteration, how many of each trained prompt's ``G`` samples succeeded: a group
  without a success (or without a failure) has zero advantage, so such an iteration gives
  the prompt no signal of its own.

:func:`run_seeds` runs several seeds, in worker processes when asked. A normalisation
registered in this process (:func:`~grpo_companion.theory.register_normalization`) is
registered again in each worker before it trains, when its definition can be pickled by
reference (its ``gains`` a module-level function of an importable module).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import multiprocessing
import pickle
import pickletools
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grpo_companion.rl.tasks import EOS, ArithmeticTask
from grpo_companion.rl.train_config import (
    GRPOConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SequenceConfig,
)
from grpo_companion.rl.trainer import TrainConfig, prepare_run
from grpo_companion.theory import NORMALIZATIONS, register_normalization
from grpo_companion.theory.analyses import trained_loss

__all__ = ["CHAPTER8_CONFIG", "LongRun", "correct_columns", "exact_entropy", "exact_success",
           "run_long", "run_seeds"]

#: Chapter 8's run on a CPU in full mode: the tiny transformer pre-trained to forget carries,
#: then GRPO with the paper's clip, mu and G, Dr. GRPO's loss, plain k3, and four KL weights
#: (beta times 1, 3, 10, 30) spread over 64 trained prompts. Chapter 8 replaces what its
#: parameters set; chapter 14 and ``benchmarks/`` start from it too.
CHAPTER8_CONFIG = TrainConfig(
    task="sequence",
    run=RunConfig(iterations=120, device="cpu", progress=False),
    grpo=GRPOConfig(beta=0.1, clip_eps_low=0.2, mu=10, group_size=16, kl="k3",
                    loss_type="dr_grpo", temperature=1.0, prompts_per_iteration=64),
    optim=OptimConfig(optimizer="adam", lr=2e-4),
    sequence=SequenceConfig(max_operand=49, n_eval_prompts=64, eval_samples=50,
                            grpo_prompts=64, grpo_beta_multipliers=(1.0, 3.0, 10.0, 30.0)),
    model=ModelConfig(d_model=32, n_layers=2, n_heads=4, sft_steps=600),
)

#: Largest ``|log sum p|`` accepted of an enumeration: its probabilities must sum to 1 (they
#: do to about 1e-15 in float64; a larger gap means outputs were left out or counted twice).
_SUM_TOLERANCE = 1e-9


@dataclass
class LongRun:
    """What :func:`run_long` records (see the module docstring).

    Attributes
    ----------
    trained, held_out : prompt indices (into ``task.operands``) of the two sets.
    operands : ``(a, b)`` of each trained and each held-out prompt, in that order.
    steps : the recorded iterations (0, ``record_every``, ..., ``iterations``).
    logit_trained, logit_held : exact success logits ``(len(steps), prompts)``.
    entropy_trained, entropy_held : ``(len(steps), prompts)`` the exact Shannon entropy, in
        nats, of each prompt's whole output distribution at the recorded iterations
        (:func:`exact_entropy` of the enumeration that gives the logits).
    delta, delta_pos : ``(iterations, len(trained))`` one-step distance to the divergence
        step and its PoS part; NaN where the prompt was not in that iteration's batch.
    target_logit : ``(iterations, len(trained))`` the divergence step's success logit.
    beta_trained : ``(len(trained),)`` each trained prompt's KL weight (``config.grpo.beta``, times
        its ``config.sequence.grpo_beta_multipliers`` entry when set).
    orbit_tv : ``(iterations, len(trained))`` the paper's ``D_n``: total variation from the
        network's policy after iteration ``n`` to the exact orbit's ``pi_n`` (the divergence
        step iterated from ``pi_ref``, whose success logit is ``orbit_logit``); NaN where the
        prompt was not in that iteration's batch.
    group_successes : ``(iterations, len(trained))`` successes among the prompt's
        ``group_size`` samples at iteration ``n``; NaN where it was not in that batch.
    clip_fraction : ``(iterations,)`` the share of sampled tokens whose ratio was clipped, over
        the ``mu`` steps of each iteration (the trainer's ``iterations.csv`` column).
    n_outputs : how many distinct outputs a policy can produce (all enumerated).
    sampled_held : ``(2, len(held_out))`` the trainer's own sampled estimate of the held-out
        PoS (``config.sequence.eval_samples`` samples each) at iteration 0 and at the last one.
    train_seconds : wall time of the GRPO iterations (pre-training and recording excluded).
    """

    config: TrainConfig
    trained: np.ndarray
    held_out: np.ndarray
    operands_trained: np.ndarray
    operands_held: np.ndarray
    steps: np.ndarray
    logit_trained: np.ndarray
    logit_held: np.ndarray
    entropy_trained: np.ndarray
    entropy_held: np.ndarray
    delta: np.ndarray
    delta_pos: np.ndarray
    target_logit: np.ndarray
    orbit_tv: np.ndarray
    orbit_logit: np.ndarray
    beta_trained: np.ndarray
    group_successes: np.ndarray
    sampled_held: np.ndarray
    clip_fraction: np.ndarray
    n_outputs: int
    sft_loss: float
    train_seconds: float
    record_seconds: float


def check_count(name: str, value: Any) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Torch's intra-op thread count inside the block (then the caller's again)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def correct_columns(task: ArithmeticTask, idx: np.ndarray,
                    outputs: list[tuple[int, ...]]) -> np.ndarray:
    """The column of each prompt's one correct output (its sum's digits, then EOS)."""
    column = {o: i for i, o in enumerate(outputs)}
    sums = task.operands[np.asarray(idx)].sum(axis=1)
    return np.array([column[(*(int(c) for c in str(int(s))), EOS)] for s in sums])


def exact_success(policy: torch.nn.Module, task: ArithmeticTask, idx: np.ndarray,
                  temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log_probs, correct, success_logit)`` of the prompts ``idx``, by enumeration.

    The success logit ``log p - log(1 - p)`` takes ``log(1 - p)`` as the
    log-sum of the failures' probabilities, so it stays exact near ``p = 1``.
    """
    device = next(policy.parameters()).device
    log_probs, outputs = policy.output_log_probs(
        task.prompts(torch.as_tensor(idx, device=device)), max_new_tokens=task.max_new_tokens,
        temperature=temperature)
    lp = log_probs.cpu().numpy()
    col = correct_columns(task, idx, outputs)
    rows = np.arange(len(idx))
    fail = lp.copy()
    fail[rows, col] = -np.inf
    return lp, col, lp[rows, col] - np.logaddexp.reduce(fail, axis=1)


def exact_entropy(log_probs: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats of each row of ``log_probs`` (an enumeration of all outputs).

    ``log_probs`` is ``(prompts, outputs)``, the log-probabilities of every output of each
    prompt, as :func:`exact_success` returns them. Each row must sum to 1 in probability
    (``ValueError`` naming the worst row otherwise, for example when outputs are missing).
    The sum is taken in log space (log-sum-exp), and outputs of probability 0 (log-probability
    ``-inf``) add nothing.
    """
    lp = np.asarray(log_probs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape[1] == 0 or np.isnan(lp).any():
        raise ValueError("log_probs must be a (prompts, outputs) array of log-probabilities "
                         f"without NaN, got shape {lp.shape}")
    log_total = np.logaddexp.reduce(lp, axis=1)
    worst = int(np.argmax(np.abs(log_total))) if len(lp) else 0
    if len(lp) and not abs(log_total[worst]) <= _SUM_TOLERANCE:
        raise ValueError(f"the outputs' probabilities of row {worst} sum to "
                         f"{float(np.exp(log_total[worst])):.12g}, not 1: the enumeration is "
                         "not of every output")
    centred = lp - log_total[:, None]  # the rows normalised exactly, in log space
    p = np.exp(centred)
    # -sum p log p, where an output of probability 0 adds 0 (not 0 * -inf)
    plogp = np.multiply(p, centred, out=np.zeros_like(p), where=p > 0)
    return -plogp.sum(axis=1)


def _shipped_normalization(config: TrainConfig) -> tuple[str, bytes]:
    """The config's normalisation: its name and its definition pickled for spawned workers.

    ``ValueError`` if the definition cannot be pickled by reference.

    Built-ins are shipped too: the worker finds them registered already and keeps its own.
    """
    definition = config.calibration.definition
    advice = (f"the normalisation {definition.name!r} cannot be sent to worker processes "
              "(they re-register it from a pickle of its definition, which refers to its "
              "gains function by module and name): use workers=1, or define the gains in an "
              "importable module and register it from there")
    try:
        data = pickle.dumps(definition, protocol=2)
    except Exception as err:  # noqa: BLE001 - any pickling failure has the same remedy
        raise ValueError(f"{advice} ({type(err).__name__}: {err})") from err
    if getattr(sys.modules.get("__main__"), "__file__", None) is None:
        # a notebook, python -c or a REPL: spawned workers do not have its __main__
        in_main = sorted({str(arg).split(" ", 1)[1] for op, arg, _ in pickletools.genops(data)
                          if op.name == "GLOBAL" and str(arg).split(" ", 1)[0] == "__main__"})
        if in_main:
            raise ValueError(f"{advice} ({', '.join(in_main)} is defined in __main__, which "
                             "has no file a worker could import)")
    return definition.name, data


def _receive_normalization(shipped: tuple[str, bytes]) -> None:
    """In a worker: register the shipped normalisation unless the same one is registered."""
    name, data = shipped
    try:
        definition = pickle.loads(data)
    except Exception as err:  # noqa: BLE001 - the gains could not be found in this process
        raise ValueError(
            f"a worker process could not load the normalisation {name!r} "
            f"({type(err).__name__}: {err}): use workers=1, or define the gains in an "
            "importable module and register it from there") from err
    if NORMALIZATIONS.get(definition.name) != definition:
        register_normalization(definition.name, definition.gains, summary=definition.summary,
                               uses_eps=definition.uses_eps, uses_ddof=definition.uses_ddof,
                               kernels=definition.kernels, replace=True)


class _Recorder:
    """The exact measurements of one run, taken from the trainer's callback."""

    def __init__(self, state: Any, trained: np.ndarray, record_every: int) -> None:
        self.state, self.trained, self.record_every = state, trained, record_every
        config = state.config
        self.task, self.temp = state.task, config.grpo.temperature
        self.kl = config.grpo.kl
        # each trained prompt's KL weight (config.sequence.grpo_beta_multipliers: one per prompt)
        self.beta = (np.full(len(trained), config.grpo.beta) if state.prompt_beta is None
                     else state.prompt_beta[torch.as_tensor(trained)].cpu().numpy())
        self.cal = dataclasses.replace(config.calibration, group_size=config.grpo.group_size)
        self.position = {int(q): i for i, q in enumerate(trained)}
        n_iter, k = config.run.iterations, len(trained)
        self.delta, self.delta_pos, self.target, self.orbit_tv, self.successes = (
            np.full((n_iter, k), np.nan) for _ in range(5))
        self.orbit = np.full((n_iter, k), np.nan)
        self.trained_rows: list[np.ndarray] = []
        self.held_rows: list[np.ndarray] = []
        self.trained_entropy: list[np.ndarray] = []
        self.held_entropy: list[np.ndarray] = []
        # the last exact success logit of each trained prompt, and the iteration it is of
        self.cache_logit, self.cache_iter = np.zeros(k), np.full(k, -1)
        self.seconds, self.started = 0.0, 0.0

    def _exact(self, policy: torch.nn.Module, idx: np.ndarray) -> tuple[
            np.ndarray, np.ndarray, np.ndarray]:
        return exact_success(policy, self.task, idx, self.temp)

    def record(self) -> None:
        started = time.perf_counter()
        for idx, logits, entropies in ((self.trained, self.trained_rows, self.trained_entropy),
                                       (self.task.eval_idx, self.held_rows, self.held_entropy)):
            lp, _, logit = self._exact(self.state.policy, idx)
            logits.append(logit)
            entropies.append(exact_entropy(lp))
        self.seconds += time.perf_counter() - started

    def start(self) -> None:
        """After pre-training: pi_ref's distributions, and the record of iteration 0."""
        self.prev = copy.deepcopy(self.state.policy)
        self.ref_lp, _, self.ref_logit = self._exact(self.state.ref_policy, self.trained)
        self.cache_logit[:], self.cache_iter[:] = self.ref_logit, 0
        # the exact orbit pi_n of the divergence step from pi_ref (Theorem 10's pi_n)
        orbit = self.ref_logit
        for n in range(len(self.orbit)):
            orbit = trained_loss.exact_step_logit(orbit, self.ref_logit, self.beta,
                                                  estimator=self.kl, calibration=self.cal)
            self.orbit[n] = orbit
        self.record()
        self.seconds, self.started = 0.0, time.perf_counter()

    def after_iteration(self, n: int) -> None:
        """delta_n of every prompt of iteration n's batch, and the record every record_every."""
        started = time.perf_counter()
        chosen = self.state.chosen.cpu().numpy()
        cols = np.array([self.position[int(q)] for q in chosen])
        # pi_{n-1} on this batch: cached where the last iteration enumerated the prompt (always,
        # when every trained prompt is in every batch), else from the kept copy of pi_{n-1}
        logit_prev = self.cache_logit[cols].copy()
        stale = self.cache_iter[cols] != n - 1
        if stale.any():
            logit_prev[stale] = self._exact(self.prev, chosen[stale])[2]
        lp_new, col, logit_new = self._exact(self.state.policy, chosen)
        self.cache_logit[cols], self.cache_iter[cols] = logit_new, n
        goal = trained_loss.exact_step_logit(logit_prev, self.ref_logit[cols], self.beta[cols],
                                             estimator=self.kl, calibration=self.cal)
        tv, pos_part = trained_loss.one_step_tv(lp_new, self.ref_lp[cols], col, goal)
        self.delta[n - 1, cols], self.delta_pos[n - 1, cols] = tv, pos_part
        self.target[n - 1, cols] = goal
        self.successes[n - 1, cols] = self.state.rewards.sum(1).cpu().numpy()
        self.orbit_tv[n - 1, cols] = trained_loss.one_step_tv(
            lp_new, self.ref_lp[cols], col, self.orbit[n - 1, cols])[0]
        self.prev = copy.deepcopy(self.state.policy)  # a copy of a tiny model: about 1 ms
        self.seconds += time.perf_counter() - started
        if n % self.record_every == 0 or n == self.state.config.run.iterations:
            self.record()


def run_long(config: TrainConfig, *, record_every: int = 10) -> LongRun:
    """Train ``config`` (the sequence task) and record exact PoS and one-step distances."""
    if config.task != "sequence" or config.sequence.grpo_prompts is None or config.exact:
        raise ValueError("config must be a sampled task='sequence' run with grpo_prompts set, "
                         f"got task={config.task!r}, "
                         f"grpo_prompts={config.sequence.grpo_prompts!r}, "
                         f"exact={config.exact!r}")
    check_count("record_every", record_every)
    config = config.replace(eval_every=config.run.iterations, progress=False)
    prep = prepare_run(config)
    state = prep.run_state
    task = state.task
    trained = task.grpo_pool(config.sequence.grpo_prompts, config.run.seed)
    recorder = _Recorder(state, trained, record_every)
    result = prep.run(recorder.after_iteration, on_start=recorder.start)
    total = time.perf_counter() - recorder.started
    n_iter = config.run.iterations
    steps = np.array(sorted({0, *range(record_every, n_iter + 1, record_every), n_iter}))
    return LongRun(
        config=config, trained=trained, held_out=task.eval_idx,
        operands_trained=task.operands[trained], operands_held=task.operands[task.eval_idx],
        steps=steps, logit_trained=np.array(recorder.trained_rows),
        logit_held=np.array(recorder.held_rows),
        entropy_trained=np.array(recorder.trained_entropy),
        entropy_held=np.array(recorder.held_entropy), delta=recorder.delta,
        delta_pos=recorder.delta_pos, target_logit=recorder.target,
        orbit_tv=recorder.orbit_tv, orbit_logit=recorder.orbit,
        beta_trained=recorder.beta, group_successes=recorder.successes,
        sampled_held=result.success_prob,
        clip_fraction=np.array([row["clip_fraction"] for row in result.iteration_rows]),
        n_outputs=int(recorder.ref_lp.shape[1]),
        sft_loss=float(state.sft_losses[-1]) if state.sft_losses else np.nan,
        train_seconds=total - recorder.seconds, record_seconds=recorder.seconds)


def _one(args: tuple[TrainConfig, int, tuple[str, bytes]]) -> LongRun:
    config, record_every, normalization = args
    torch.set_num_threads(1)
    _receive_normalization(normalization)
    return run_long(config, record_every=record_every)


def run_seeds(config: TrainConfig, seeds: list[int], *, record_every: int = 10,
              workers: int = 1) -> list[LongRun]:
    """:func:`run_long` for each seed (``workers > 1``: in that many spawned processes).

    Every run uses one torch thread, in the workers and in-process alike, so
    that on a CPU the results are bitwise the same whatever ``workers``. The workers
    register ``config``'s normalisation as this process has it registered; one whose
    gains cannot be pickled by reference (a function defined in a notebook, a lambda, a
    closure) raises ``ValueError`` with ``workers > 1``.
    """
    check_count("workers", workers)
    configs = [config.replace(seed=s) for s in seeds]
    if workers == 1 or len(configs) == 1:
        with torch_threads(1):  # as in the workers, so that the numbers do not depend on workers
            return [run_long(c, record_every=record_every) for c in configs]
    shipped = _shipped_normalization(config)
    jobs = [(c, record_every, shipped) for c in configs]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        return list(pool.map(_one, jobs))
