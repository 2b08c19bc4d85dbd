"""What a run needs of the machine: its device, and memory for its largest arrays.

:func:`check_machine` is asked when a run is prepared
(:func:`~grpo_companion.rl.trainer.prepare_run`), never when a
:class:`~grpo_companion.rl.train_config.TrainConfig` is built, so that a configuration
can be made and compared on any machine.
"""

from __future__ import annotations

import torch

from grpo_companion.host import memory_limit_bytes
from grpo_companion.rl.tasks import VOCAB_SIZE
from grpo_companion.rl.train_config import METRICS, TrainConfig, parse_device
from grpo_companion.theory.finite_group import group_table

#: Bytes of one row of ``iterations.csv`` kept in memory (a dict of four Python numbers,
#: measured with tracemalloc on CPython 3.11: 296).
_ITERATION_ROW_BYTES = 296
#: Bytes per prompt and group member of the exact finite-group weights (the binomial
#: weights of every cell, as ``theory.finite_group`` counts them).
_EXACT_GROUP_BYTES = 32


def check_machine(config: TrainConfig) -> None:
    """Refuse a run this machine cannot hold: ``ValueError`` naming the field.

    The checks that depend on the machine rather than on the configuration: the device
    exists, ``exact_group_size``'s weights fit the host's memory, the run's largest
    arrays (:func:`estimate_memory`) fit the device's, and the normalisation's gains are
    finite for the run's group (its advantage table is built).
    :func:`~grpo_companion.rl.trainer.prepare_run` (so :func:`~grpo_companion.rl.trainer.train`
    and the command line) calls it before anything is written; building or ``replace()``-ing
    a :class:`TrainConfig` does not, so that a configuration can be made, compared and saved
    on any machine without a device or memory probe.
    """
    device = resolve_device(config.run.device)
    if config.grpo.exact_group_size is not None:
        # the weights are numpy arrays (host memory), built every exact iteration; the
        # calibration alone holds a few arrays of exact_group_size values
        per_member = (_EXACT_GROUP_BYTES * config.bandit.n_prompts if config.exact else 0) + 64
        host = memory_limit_bytes()
        largest = int(host // per_member) - 1
        if config.grpo.exact_group_size > largest:
            raise ValueError(
                f"exact_group_size must be None or an int in [2, {largest}] on this machine "
                f"(its weights need about {per_member} bytes per group member"
                f"{' with n_prompts=' + str(config.bandit.n_prompts) if config.exact else ''}"
                ", and it "
                f"has {host / 2**30:.3g} GiB of memory), got {config.grpo.exact_group_size!r}")
    need, what = estimate_memory(config)
    have = _device_memory(device)
    if need > have:
        raise ValueError(
            f"this configuration needs about {need / 2**30:.3g} GiB ({what}), more than "
            f"the {have / 2**30:.3g} GiB of memory of {device}; make it smaller")
    # the normalisation's gains must be finite for the group the run uses (registration tries
    # a few group sizes only): refused here, before anything is written, not in iteration 1
    size = config.grpo.exact_group_size if config.exact else config.grpo.group_size
    if size is not None:
        group_table(config.calibration, size)


def _device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return memory_limit_bytes()


def estimate_memory(config: TrainConfig) -> tuple[float, str]:
    """A lower estimate of the peak memory of a run, in bytes, and what dominates it.

    Counts the largest tensors of each phase (a few float arrays per sampled
    output or policy entry, transformer activations per token, the exact
    finite-group weights), the metric history and the rows of ``iterations.csv``
    kept in memory; real use is higher by a modest factor. Used to
    refuse, before anything is allocated, runs that cannot fit.
    """
    item = 8 if config.exact or config.run.dtype == "float64" else 4
    tracked = config.bandit.n_prompts if config.task == "bandit" else config.sequence.n_eval_prompts
    history = 8.0 * config.n_evaluations * tracked * (len(METRICS) + 1)
    parts = {"the metric history": history,
             "the rows of iterations.csv (one per iteration)":
                 float(_ITERATION_ROW_BYTES) * config.run.iterations}
    if config.task == "bandit":
        table = float(config.bandit.n_prompts) * config.bandit.n_outputs
        parts["the tabular policies"] = table * 8 * 8
        if config.exact and config.grpo.exact_group_size is not None:
            parts["the exact finite-group weights (exact_group_size x n_prompts)"] = (
                float(_EXACT_GROUP_BYTES) * (config.grpo.exact_group_size + 1)
                * config.bandit.n_prompts)
        if not config.exact:
            batch = config.grpo.prompts_per_iteration or config.bandit.n_prompts
            rows = float(batch) * config.grpo.group_size
            parts[f"{rows:.3g} sampled outputs per iteration (group_size x prompts)"] = (
                rows * (3 * 8 + 10 * item) + 4 * batch * config.bandit.n_outputs * item)
    else:
        n_pairs = (config.sequence.max_operand + 1) ** 2
        batch = config.grpo.prompts_per_iteration or min(
            64, config.sequence.grpo_prompts or n_pairs - config.sequence.n_eval_prompts)
        length = 7 + len(str(2 * config.sequence.max_operand)) + 1
        d, layers, vocab = config.model.d_model, config.model.n_layers, VOCAB_SIZE
        params = layers * 12.0 * d * d + (vocab + length) * d + d * vocab
        parts["the transformer's parameters and optimiser state"] = params * 4 * 5
        # activations per sequence: ~12 d-wide tensors per layer (qkv, attention, MLP 4d,
        # norms) plus heads x length x length attention weights, and the logits
        per_row = length * (layers * (12.0 * d + config.model.n_heads * length) + 2 * vocab) * 4
        train_rows = float(batch) * config.grpo.group_size
        parts[f"{train_rows:.3g} sampled sequences per iteration (group_size x prompts)"] = (
            train_rows * per_row * 2)  # activations kept for the backward pass
        eval_rows = float(config.sequence.n_eval_prompts) * config.sequence.eval_samples
        parts[f"{eval_rows:.3g} evaluation sequences (n_eval_prompts x eval_samples)"] = (
            eval_rows * per_row)
        parts[f"{config.model.sft_batch_size} pre-training sequences per step"] = (
            float(config.model.sft_batch_size) * per_row * 2)
    what = max(parts, key=parts.__getitem__)
    return float(sum(parts.values())), f"mostly {what}"



def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> CUDA if available, else CPU; otherwise check the request."""
    resolved = parse_device(device)
    if resolved is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device must be 'auto' or 'cpu' on this machine (no CUDA), "
                         f"got {device!r}")
    return resolved
