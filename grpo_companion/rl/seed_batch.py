"""Several seeds of chapter 8's long run, trained as one batched computation.

:func:`run_seeds_batched` returns what ``[run_long(config.replace(seed=s)) for s in seeds]``
returns (:func:`grpo_companion.rl.long_run.run_long`, torch on one thread), up to float
rounding, but the GRPO iterations of all seeds are one computation: the transformers'
parameters are stacked with a leading seed dimension ``S`` and every forward pass, backward
pass and Adam step is taken once for all seeds.

Why the numbers are those of the separate runs:

- **Everything random is drawn as the separate run draws it.** Each seed has its own
  trainer state (:func:`~grpo_companion.rl.trainer.prepare_run`), hence its own
  ``torch.Generator`` seeded with the seed. Per iteration the prompts are chosen by the
  trainer's own code on that generator, and at each token of the sampling the next-token
  distribution of every seed is computed in one batched pass, then drawn by
  ``torch.multinomial`` on that seed's ``(rows, vocabulary)`` probabilities with that
  seed's generator, seed after seed: the same call, on the same shape, in the same order
  as in ``TinyCausalTransformer.sample_with_logprobs``. How many random numbers
  ``multinomial`` takes depends on the shape only, so each generator stays in step with
  the separate run's, and a token differs only if a draw falls within rounding of a
  boundary between two tokens (see ``tests/rl/test_seed_batch.py``). The held-out sampled
  evaluation at iteration 0 and the last (``sampled_held``) is the trainer's own
  (``SequenceGRPO.evaluate`` of :mod:`grpo_companion.rl.grpo_tasks`, with its per-iteration
  generator), run per seed.
- **The loss is the trainer's.** The per-token loss is
  :func:`~grpo_companion.rl.losses.per_token_loss` on the rows of all seeds at once (it
  acts token by token, with the per-row ``beta`` of ``state.prompt_beta``), reduced per
  seed by :func:`~grpo_companion.rl.losses.aggregate`, which is what the trainer's
  :func:`~grpo_companion.rl.losses.grpo_loss` computes; the advantages are
  :func:`~grpo_companion.rl.losses.group_advantages` of each seed's rewards. The sum of the
  seeds' losses is differentiated: seed ``s``'s parameters enter seed ``s``'s loss only, so
  each slice of the gradient is that seed's own gradient. Adam is elementwise, so one
  ``torch.optim.Adam`` over the stacked tensors (with the trainer's hyperparameters) is one
  Adam per seed.
- **The forward pass is the model's.**
  :class:`~grpo_companion.rl.stacked.StackedTransformer` computes
  ``TinyCausalTransformer``'s forward pass (pre-LayerNorm blocks, causal attention by
  ``scaled_dot_product_attention``, GELU MLP, final LayerNorm and head) with stacked
  weights. It groups the work differently (a group's rows share its prompt's keys and
  values; a row's completion tokens attend to them through one mask), which changes the
  rounding only. Every call checks it against the model's own ``token_logprobs`` and
  ``output_log_probs`` on each seed before training (``RuntimeError`` if they disagree),
  so an edited model cannot silently diverge from it. (``torch.func.vmap`` of the model's
  own methods over stacked parameters was tried first: torch 2.13 has no batching rule
  for CPU ``scaled_dot_product_attention`` and falls back to a loop over the seeds, which
  made it slower than the separate runs.)
- **The recording is long_run's.** Each seed has its own ``long_run._Recorder``; the
  exact enumerations it asks of the current policy after an iteration (the batch's
  prompts, and at a recorded iteration the trained and held-out sets) are computed for
  all seeds in one batched enumeration and handed to it; anything else it asks (pi_ref,
  the previous policy of a prompt that was not in the last batch) it computes itself on
  that seed's module, which holds a copy of that seed's slice of the parameters.

Supervised pre-training stays per seed (the trainer's ``pretrain``, on one thread: the
reference policies are bit for bit those of the separate runs); with the chapter's
configuration it takes about 15 s per seed.

Time. ``train_seconds`` and ``record_seconds`` of each :class:`LongRun` are shares of the
batch: the recorder's own time for that seed plus an equal share of the batched
enumerations is ``record_seconds``; an equal share of the rest of the batch's wall time
(from the end of the last seed's set-up, after its pre-training and the record of
iteration 0, to the end) is ``train_seconds``. Their sums over the seeds are the batch's
wall time.

Cores. The batch runs on one torch thread by default (``threads`` raises it for the
GRPO iterations; on a machine shared with other work, two threads were several times
slower than one). ``workers=k`` trains ``k`` parts of the seeds as ``k`` batches in spawned
processes, which also spreads the per-seed pre-training over the cores
(``benchmarks/bench_seeds.py`` compares the ways).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch

from grpo_companion.rl import losses
from grpo_companion.rl.long_run import (
    LongRun,
    _receive_normalization,
    _Recorder,
    _shipped_normalization,
    check_count,
    exact_success,
    torch_threads,
)
from grpo_companion.rl.stacked import StackedTransformer
from grpo_companion.rl.trainer import TrainConfig, TrainingFault, prepare_run

__all__ = ["run_seeds_batched"]

#: How far the batched forward pass may be from the model's own, in units of the float
#: type's epsilon times the size of the log-probabilities (rounding only).
_SELF_CHECK_ULPS = 256


class _Enumerated:
    """Stands in for a policy in ``long_run.exact_success``: its enumeration, computed already."""

    def __init__(self, log_probs: torch.Tensor, outputs: list[tuple[int, ...]]) -> None:
        self.log_probs, self.outputs = log_probs, outputs

    def parameters(self) -> Iterator[torch.Tensor]:
        yield self.log_probs

    def output_log_probs(self, prompts: torch.Tensor, **_: Any) -> tuple[
            torch.Tensor, list[tuple[int, ...]]]:
        return self.log_probs, self.outputs


class _SeedRecorder(_Recorder):
    """long_run's recorder of one seed; enumerations of ``state.policy`` handed in are used.

    ``ready`` maps a tuple of prompt indices to their enumeration ``(prompts, outputs)``
    under the current policy (the engine's batched one); any other enumeration the
    recorder asks for is computed as in :func:`~grpo_companion.rl.long_run.run_long`.
    """

    def __init__(self, state: Any, trained: np.ndarray, record_every: int) -> None:
        super().__init__(state, trained, record_every)
        self.ready: dict[tuple[int, ...], torch.Tensor] = {}
        self.outputs: list[tuple[int, ...]] = []

    def _exact(self, policy: torch.nn.Module, idx: np.ndarray) -> tuple[
            np.ndarray, np.ndarray, np.ndarray]:
        log_probs = self.ready.get(tuple(int(i) for i in idx)) if policy is self.state.policy \
            else None
        if log_probs is None:
            return super()._exact(policy, idx)
        return exact_success(_Enumerated(log_probs, self.outputs), self.task, idx, self.temp)


def _check_request(config: Any, seeds: Any, record_every: Any, workers: Any,
                   threads: Any) -> list[int]:
    """The supported case only; ``ValueError`` naming the parameter otherwise."""
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
    if config.task != "sequence" or config.exact or config.sequence.grpo_prompts is None:
        raise ValueError("config must be a sampled task='sequence' run with grpo_prompts set "
                         f"(the batched engine trains chapter 8's long run), got "
                         f"task={config.task!r}, exact={config.exact!r}, "
                         f"grpo_prompts={config.sequence.grpo_prompts!r}")
    if config.optim.optimizer != "adam":
        raise ValueError(f"optimizer must be 'adam' for the batched engine (Adam is elementwise, "
                         f"so one Adam on stacked parameters is one per seed), got "
                         f"{config.optim.optimizer!r}")
    if config.grpo.kl not in losses.KL_ESTIMATORS:
        raise ValueError(f"kl must be one of {losses.KL_ESTIMATORS} for the batched engine, "
                         f"got {config.grpo.kl!r}")
    if config.grpo.ref_reset_every is not None:
        raise ValueError(f"ref_reset_every must be None for the batched engine (pi_ref stays "
                         f"fixed), got {config.grpo.ref_reset_every!r}")
    check_count("record_every", record_every)
    check_count("workers", workers)
    check_count("threads", threads)
    if isinstance(seeds, np.ndarray) and seeds.ndim == 1:
        seeds = seeds.tolist()
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence) or not seeds:
        raise ValueError(f"seeds must be a non-empty list of distinct ints, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int | np.integer):
            raise ValueError(f"seeds must be a non-empty list of distinct ints, got the "
                             f"element {s!r} in {seeds!r}")
    values = [int(s) for s in seeds]
    if len(set(values)) != len(values):
        twice = sorted({s for s in values if values.count(s) > 1})
        raise ValueError(f"seeds must be a non-empty list of distinct ints, got {twice} more "
                         "than once")
    for s in values:  # the config's own range check, naming the seed
        config.replace(seed=s)
    return values


def _generators(runs: Sequence[Any]) -> list[torch.Generator]:
    """Each seed's training generator (the trainer's ``state.generator``)."""
    return [state.generator for state in runs]


def _held_success(state: Any) -> np.ndarray:
    """The trainer's sampled held-out PoS of ``state.policy`` at ``state.iteration``."""
    with torch.no_grad():
        metrics = state.grpo_task.evaluate(state.policy, state.ref_policy, state.policy,
                                           state.iteration)
    return metrics["success_prob"].double().cpu().numpy()


def _self_check(stack: StackedTransformer, runs: Sequence[Any],
                params: dict[str, torch.Tensor]) -> None:
    """The batched passes against the model's own methods on each seed (rounding only)."""
    task, config = runs[0].task, runs[0].config
    device = runs[0].device
    idx = torch.stack([torch.as_tensor(state.task.eval_idx[:2], device=device) for state in runs])
    prompts = torch.stack([state.task.prompts(i) for state, i in zip(runs, idx, strict=True)])
    t, group = task.max_new_tokens, 3
    completions = (torch.arange(2 * group * t, device=device).view(2 * group, t) * 7 + 3) % (
        stack.vocab)
    completions = completions.expand(len(runs), -1, -1)
    with torch.no_grad():
        batched = stack.token_logprobs(params, prompts, completions, group, config.grpo.temperature)
        enumerated, outputs = stack.output_log_probs(params, prompts, t, config.grpo.temperature)
        for s, state in enumerate(runs):
            own = state.policy.token_logprobs(prompts[s], completions[s], group,
                                            temperature=config.grpo.temperature)
            own_enum, own_outputs = state.policy.output_log_probs(
                prompts[s], max_new_tokens=t, temperature=config.grpo.temperature)
            eps = torch.finfo(own.dtype).eps
            gaps = {"token_logprobs": float((batched[s] - own).abs().max()),
                    "output_log_probs": float((enumerated[s] - own_enum).abs().max())}
            sizes = {"token_logprobs": float(own.abs().max()),
                     "output_log_probs": float(own_enum.abs().max())}
            wrong = any(gaps[k] > _SELF_CHECK_ULPS * eps * (1.0 + sizes[k]) for k in gaps)
            if own_outputs != outputs or wrong:
                raise RuntimeError(
                    "the batched forward pass of grpo_companion.rl.seed_batch no longer "
                    f"computes TinyCausalTransformer's (seed {state.config.run.seed}: largest "
                    f"differences {gaps}, outputs in the same order: {own_outputs == outputs}); "
                    "update rl.stacked.StackedTransformer to the model")


def _check_finite(runs: Sequence[Any], params: dict[str, torch.Tensor],
                  step_losses: torch.Tensor, n: int) -> None:
    """The separate runs' divergence check (``trainer._check_finite``), per seed."""
    for s, state in enumerate(runs):
        bad = [name for name, p in params.items() if not bool(torch.isfinite(p[s]).all())]
        if not bool(torch.isfinite(step_losses[:, s]).all()):
            bad.append("loss")
        if bad:
            raise TrainingFault(f"training diverged at iteration {n} of seed "
                                f"{state.config.run.seed}: "
                                f"{', '.join(bad)} became inf or NaN (lower --lr or raise "
                                "--beta)")


def _train_batched(config: TrainConfig, seeds: list[int], record_every: int,
                   threads: int) -> list[LongRun]:
    """The batched engine in this process (see :func:`run_seeds_batched`)."""
    configs = [config.replace(seed=s, eval_every=config.run.iterations, progress=False)
               for s in seeds]
    runs, recorders, held = [], [], []
    for cfg in configs:  # each seed's trainer state, pi_ref and iteration 0, as run_long
        state = prepare_run(cfg).run_state
        trained = state.task.grpo_pool(cfg.sequence.grpo_prompts, cfg.run.seed)
        recorder = _SeedRecorder(state, trained, record_every)
        state.pretrain()
        held.append([_held_success(state)])
        recorder.start()
        runs.append(state)
        recorders.append(recorder)
    started = time.perf_counter()
    enum_seconds = 0.0
    first = runs[0]
    device, temp, group = first.device, config.grpo.temperature, config.grpo.group_size
    t = first.task.max_new_tokens
    stack = StackedTransformer(first.policy)
    names = [name for name, _ in first.policy.named_parameters()]
    params = {name: torch.stack([dict(r.policy.named_parameters())[name].detach()
                                 for r in runs]).clone().requires_grad_(True) for name in names}
    ref = {name: torch.stack([dict(r.ref_policy.named_parameters())[name].detach()
                              for r in runs]) for name in names}
    hyper = {k: v for k, v in first.optimizer.param_groups[0].items() if k != "params"}
    optimizer = torch.optim.Adam(list(params.values()), **hyper)
    needs_ref = config.grpo.beta > 0 and config.grpo.alpha > 0
    generators = _generators(runs)
    trained = torch.stack([torch.as_tensor(r.trained, device=device) for r in recorders])
    held_out = torch.stack([torch.as_tensor(r.task.eval_idx, device=device) for r in runs])
    clip_fraction = np.zeros((len(runs), config.run.iterations))
    seeds_n = len(runs)
    _self_check(stack, runs, params)
    with torch_threads(threads):
        for n in range(1, config.run.iterations + 1):
            for state in runs:
                state.iteration = n
            chosen = [state.grpo_task.choose_prompts(state.generator) for state in runs]
            prompts = torch.stack([state.task.prompts(c) for state, c in zip(runs, chosen,
                                                                         strict=True)])
            # views of the parameters without autograd: they follow the Adam steps in place
            detached = {k: v.detach() for k, v in params.items()}
            with torch.no_grad():  # lines 5-8 of Algorithm 1, every seed at once
                completions, mask = stack.sample(detached, prompts, group, generators, t, temp)
                advantages, betas = [], []
                for s, state in enumerate(runs):
                    rewards = state.task.reward(chosen[s], completions[s], mask[s], group).to(
                        state.dtype)
                    state.chosen, state.rewards = chosen[s], rewards.view(len(chosen[s]), group)
                    try:
                        advantages.append(losses.group_advantages(
                            state.rewards, dataclasses.replace(state.calibration,
                                                             group_size=None)).view(-1))
                    except ValueError as err:
                        raise state.weights_fault(str(err)) from None
                    if state.prompt_beta is not None:
                        betas.append(state.prompt_beta[chosen[s]].repeat_interleave(group))
                advantage = torch.cat(advantages)
                beta: float | torch.Tensor = torch.cat(betas) if betas else config.grpo.beta
                ref_logp = (stack.token_logprobs(ref, prompts, completions, group, temp)
                            .flatten(0, 1) if needs_ref else None)
            mask_f = mask.to(params["position"].dtype)
            clipped_tokens = torch.zeros_like(mask_f)
            prev = None
            step_losses = []
            for _ in range(config.grpo.mu):  # lines 9-11: mu Adam steps, every seed at once
                logp = stack.token_logprobs(params, prompts, completions, group, temp)
                if prev is None:  # the first loss of the iteration: the policy is still pi_old
                    prev = logp.detach()
                per_token, clipped = losses.per_token_loss(
                    logp.flatten(0, 1), prev.flatten(0, 1), ref_logp, advantage,
                    clip_eps_low=config.grpo.clip_eps_low, clip_eps_high=config.grpo.clip_eps_high,
                    beta=beta, kl=config.grpo.kl, alpha=config.grpo.alpha)
                per_token = per_token.view(logp.shape)
                seed_losses = torch.stack([
                    losses.aggregate(per_token[s], mask_f[s], loss_type=config.grpo.loss_type,
                                     max_completion_length=t) for s in range(seeds_n)])
                optimizer.zero_grad()
                seed_losses.sum().backward()
                optimizer.step()
                step_losses.append(seed_losses.detach())
                clipped_tokens += clipped.view(logp.shape).to(mask_f.dtype) * mask_f
            clip_fraction[:, n - 1] = (clipped_tokens.sum((1, 2)) / (
                mask_f.sum((1, 2)) * config.grpo.mu)).cpu().numpy()
            _check_finite(runs, params, torch.stack(step_losses), n)
            with torch.no_grad():
                for s, state in enumerate(runs):  # each seed's module holds its slice
                    for name, p in state.policy.named_parameters():
                        p.copy_(params[name][s])
                enum_started = time.perf_counter()
                # the enumerations the recorders will ask of the new policy: the batch's
                # prompts and, at a recorded iteration, the pool and the held-out set (the
                # batch is then rows of the pool's enumeration)
                if n % record_every == 0 or n == config.run.iterations:
                    wanted = [trained, held_out]
                else:
                    wanted = [torch.stack(chosen)]
                for idx in wanted:
                    idx_prompts = torch.stack([r.task.prompts(i) for r, i in zip(
                        runs, idx, strict=True)])
                    log_probs, outputs = stack.output_log_probs(detached, idx_prompts, t, temp)
                    log_probs = log_probs.cpu()
                    for s, recorder in enumerate(recorders):
                        recorder.outputs = outputs
                        recorder.ready[tuple(idx[s].tolist())] = log_probs[s]
                        if idx is trained:
                            row = {int(q): j for j, q in enumerate(recorder.trained)}
                            picked = [row[int(q)] for q in chosen[s]]
                            recorder.ready[tuple(chosen[s].tolist())] = log_probs[s][picked]
                enum_seconds += time.perf_counter() - enum_started
            for recorder in recorders:
                recorder.after_iteration(n)
                recorder.ready.clear()
    for state, rows in zip(runs, held, strict=True):  # the trainer's evaluation of the last one
        rows.append(_held_success(state))
    total = time.perf_counter() - started
    recorded = sum(r.seconds for r in recorders) + enum_seconds
    train_share = (total - recorded) / seeds_n
    steps = np.array(sorted({0, *range(record_every, config.run.iterations + 1, record_every),
                             config.run.iterations}))
    results = []
    for s, (cfg, state, recorder) in enumerate(zip(configs, runs, recorders, strict=True)):
        task = state.task
        results.append(LongRun(
            config=cfg, trained=recorder.trained, held_out=task.eval_idx,
            operands_trained=task.operands[recorder.trained],
            operands_held=task.operands[task.eval_idx], steps=steps,
            logit_trained=np.array(recorder.trained_rows),
            logit_held=np.array(recorder.held_rows),
            entropy_trained=np.array(recorder.trained_entropy),
            entropy_held=np.array(recorder.held_entropy), delta=recorder.delta,
            delta_pos=recorder.delta_pos, target_logit=recorder.target,
            orbit_tv=recorder.orbit_tv, orbit_logit=recorder.orbit,
            beta_trained=recorder.beta, group_successes=recorder.successes,
            sampled_held=np.stack(held[s]),
            clip_fraction=clip_fraction[s], n_outputs=int(recorder.ref_lp.shape[1]),
            sft_loss=float(state.sft_losses[-1]) if state.sft_losses else np.nan,
            train_seconds=train_share,
            record_seconds=recorder.seconds + enum_seconds / seeds_n))
    return results


def _worker(args: tuple[TrainConfig, list[int], int, int, tuple[str, bytes]]) -> list[LongRun]:
    config, seeds, record_every, threads, normalization = args
    torch.set_num_threads(1)
    _receive_normalization(normalization)  # before anything reads config.grpo.normalization
    return _train_batched(config, seeds, record_every, threads)


def run_seeds_batched(config: TrainConfig, seeds: Sequence[int], *, record_every: int = 10,
                      workers: int = 1, threads: int = 1) -> list[LongRun]:
    """:func:`~grpo_companion.rl.long_run.run_long` of each seed, the seeds trained as one batch.

    Returns, in the order of ``seeds``, the :class:`~grpo_companion.rl.long_run.LongRun`
    that ``run_long(config.replace(seed=s), record_every=record_every)``
    returns with torch on one thread, up to float rounding (see the module docstring for
    why, and for what ``train_seconds`` and ``record_seconds`` are here).

    Parameters
    ----------
    config
        A sampled ``task="sequence"`` run with ``grpo_prompts`` set (as ``run_long``
        needs), ``optimizer="adam"``, a per-token ``kl`` estimator and no
        ``ref_reset_every``; on CPU or CUDA. Its ``seed`` is ignored.
    seeds
        Distinct ints, each a valid ``seed`` of ``config``.
    record_every
        As in ``run_long``.
    workers
        ``1``: one batch in this process. ``k > 1``: the seeds are split into ``k``
        contiguous parts, each trained as one batch in a spawned process (on two CPU
        cores, two half batches use both cores better than one batch on two threads).
        A normalisation registered in this process
        (:func:`~grpo_companion.theory.register_normalization`) is sent to each worker
        and registered there before it trains; this needs its definition to pickle by
        reference (``gains`` a module-level function of an importable module, or of the
        script being run).
    threads
        Torch threads of the batched GRPO iterations (in each worker). The per-seed parts
        (pre-training, the trainer's evaluation, the recorder's own enumerations) always
        run on one thread, as in ``run_seeds``.

    Raises
    ------
    ValueError
        For an unsupported configuration (naming the parameter and what is supported),
        for ``seeds`` that are empty, repeated or not ints, and with ``workers > 1`` for
        a normalisation that workers cannot register (its gains defined in a notebook, a
        lambda or a closure: the message names it and says to use ``workers=1`` or to
        define the gains in an importable module).
    TrainingFault
        If a seed's run diverges (its parameters or loss become inf or NaN).
    """
    values = _check_request(config, seeds, record_every, workers, threads)
    if workers == 1 or len(values) == 1:
        with torch_threads(1):
            return _train_batched(config, values, record_every, threads)
    parts = [list(part) for part in np.array_split(np.array(values, dtype=object),
                                                   min(workers, len(values)))]
    shipped = _shipped_normalization(config)
    jobs = [(config, [int(s) for s in part], record_every, threads, shipped) for part in parts]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=len(jobs), mp_context=context) as pool:
        return [state for part in pool.map(_worker, jobs) for state in part]

