"""A TRL ``TrainerCallback`` that tracks each probe prompt's PoS against the theory.

Attach :class:`PoSProbeCallback` to any ``trl.GRPOTrainer`` (``callbacks=[...]``).
At the start of training and every ``every`` optimiser steps it samples
``n_samples`` completions of each probe prompt with the model's own
``generate`` (batched, under ``torch.no_grad``, in eval mode, training mode
restored afterwards), scores them with your verifier ``reward(prompt,
completion) -> 0 or 1`` and records the fraction verified: the measured
probability of success (PoS).

Next to each measurement it records what :mod:`grpo_companion.theory` predicts
for the run's own settings, read from the trainer's ``args``
(:func:`grpo_companion.practice.trl_bridge.theory_reading`):

- ``p_ref``: the PoS measured at the first measurement (step 0, the reference
  policy, which is what TRL's reference model is when ``beta > 0``); pass
  ``p_ref=`` for a resumed run. A measured 0 only says that ``p_ref`` is below
  about ``3 / n_samples``, but the theory reads it as exactly 0, which never
  moves (the paper observes such prompts staying put, App. A); pass ``p_ref=``
  when you know better.
- ``predicted_pos``: the PoS after ``theory_iteration`` GRPO iterations of the
  paper's recurrence (Theorem 2, with the finite-group calibration of the run's
  ``scale_rewards`` and ``num_generations``), where one iteration is one TRL
  generation round (sample with ``pi_old``, then ``num_iterations`` passes).
  The recurrence assumes each iteration solves its objective exactly; a real
  run takes a few small steps per round and moves more slowly, so compare
  shapes and limits, not paces.
- ``predicted_limit`` and ``regime``: where the iteration settles (fixed point,
  saturation at 1, absorption at 0) or that it does not (2-cycle, irregular:
  limit NaN).
- ``predicted_zero_std`` (one value per step, repeated on its rows): the expected share
  of groups whose rewards are all equal, ``mean_i (p_i^G + (1 - p_i)^G)`` over the
  probe prompts' measured PoS (:func:`grpo_companion.practice.diagnose.zero_variance_share`),
  and ``logged_zero_std``: TRL's ``frac_reward_zero_std`` logged at the next step,
  whose groups this policy sampled (NaN until TRL logs it, or when it logs at no such
  step; log every step, ``logging_steps=1``, to fill every row). The two agree when
  the probe prompts are the training prompts, one group each per step (chapter 12).

With ``use_bias_correction_kl=False`` the estimator follows ``KL(pi_ref ||
pi)`` instead, and the reverse-KL analogue is used. With ``beta = 0`` there is
no KL term: the predicted PoS is 1 from the first iteration on for every
``p_ref > 0`` (0 stays 0), with no division by ``beta``. With
``scale_rewards="batch"``, or any other setting outside the theory
(:mod:`grpo_companion.practice.trl_coverage`: an entropy bonus, a moving
reference, several rewards, another loss, ...), there is no per-prompt
prediction: the PoS is still measured, the predicted columns are empty (NaN),
the regime is ``"none"``, and the JSON record (``theory.note`` and
``theory.reasons``), the plot's title and a warning of the
``grpo_companion.practice.trl_callback`` logger say why ("no per-prompt
prediction: <reasons>").

The predicted path is kept between measurements and stepped on from the last one
(:class:`~grpo_companion.practice.trl_bridge.PredictedPath`), so a run of N
iterations costs N steps of the recurrence in all, with the same numbers as
:func:`~grpo_companion.practice.trl_bridge.predict_path` from ``p_ref``.

Files (``out_dir``), rewritten atomically (temporary file, then ``os.replace``)
at each measurement by the main process only (``state.is_world_process_zero``):

- ``pos_probe.csv``: one row per (step, prompt): ``step, prompt, measured_pos,
  n, predicted_pos, theory_iteration, predicted_limit, regime, p_ref,
  predicted_zero_std, logged_zero_std``;
- ``pos_probe.png``: measured (with +-1 standard error) and predicted PoS
  against the step, one panel per prompt (matplotlib, Agg canvas);
- ``pos_probe.json``: the theory's reading, the prompts and the predicted limits.

An existing file at any of these paths is never replaced unless
``overwrite=True``: the check runs when the callback is made and again before
the first write. The arguments are checked when the callback is made, so that a
mistake stops the script before training rather than at the first measurement:
``prompts`` must be a list of non-empty prompts (a single string is refused, not
probed character by character), ``out_dir`` must be a folder that can be written
(or created), and the three file names must be distinct file names.

Devices. Generation runs on the model's device, with nothing specific to CUDA.
Under ``accelerate launch`` every process samples ``ceil(n_samples / world)``
completions per prompt (so each makes the same number of ``generate`` calls,
which sharded models need) and the counts are summed with
``torch.distributed.all_reduce``; ``n`` records the total. Sampling uses its own
seed inside ``torch.random.fork_rng``, so it does not move the training RNG.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import re
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from grpo_companion.files import write_atomically
from grpo_companion.practice.diagnose import zero_variance_share
from grpo_companion.practice.trl_bridge import (
    PredictedPath,
    TheoryReading,
    iteration_of_step,
    predict_limits,
    theory_reading,
)

__all__ = ["CSV_COLUMNS", "FIGURE_COLUMNS", "FIGURE_MIN_POINTS", "PoSProbeCallback", "prompt_label"]

#: Columns of the CSV, in order.
CSV_COLUMNS = ("step", "prompt", "measured_pos", "n", "predicted_pos", "theory_iteration",
               "predicted_limit", "regime", "p_ref", "predicted_zero_std", "logged_zero_std")

Verifier = Callable[[Any, str], Any]

logger = logging.getLogger(__name__)


def _distributed() -> tuple[int, int]:
    """``(world_size, rank)``; ``(1, 0)`` outside a process group."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _own_rng(device: torch.device) -> Any:
    """Fork the CPU RNG and those of every device of ``device``'s type (restored on exit).

    Written against ``torch.<type>`` (``device_count``, ``get_rng_state``), so it is
    the same code for CUDA, XPU or MPS; a type without such a module keeps only the
    CPU fork.
    """
    module = getattr(torch, device.type, None)
    if device.type == "cpu" or module is None or not hasattr(module, "get_rng_state"):
        return torch.random.fork_rng(devices=[])
    count = module.device_count() if hasattr(module, "device_count") else 1
    return torch.random.fork_rng(devices=list(range(count)), device_type=device.type)


def _atomic_write(path: Path, write: Callable[[Any], None], *, binary: bool = False) -> None:
    """Write one of the callback's files atomically (text unless ``binary``)."""
    write_atomically(path, write, prefix=f".{path.name}.", suffix=".tmp", text=not binary)


def _as_success(value: Any, prompt_index: int) -> int:
    """A verifier's answer as 0 or 1; anything else is an error."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, float, np.integer, np.floating)) and value in (0, 1):
        return int(value)
    raise ValueError(f"reward(prompt, completion) must return 0 or 1 (a verifiable reward); got "
                     f"{value!r} for prompt {prompt_index}")


def _check_prompts(prompts: Any) -> list[Any]:
    """``prompts`` as a list, each a non-empty string or a non-empty conversation."""
    if isinstance(prompts, (str, bytes)):
        raise ValueError(f"prompts must be a list of probe prompts, not a single string "
                         f"({prompts!r}); pass [{prompts!r}] to probe one prompt")
    if isinstance(prompts, Mapping) or not isinstance(prompts, Iterable):
        raise ValueError(f"prompts must be a list of probe prompts (strings or conversations), "
                         f"got {type(prompts).__name__}")
    out = list(prompts)
    if not out:
        raise ValueError("prompts must hold at least one probe prompt")
    for i, prompt in enumerate(out):
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError(f"prompts[{i}] is empty: {prompt!r}")
            continue
        if isinstance(prompt, (list, tuple)):
            if not prompt:
                raise ValueError(f"prompts[{i}] is an empty conversation")
            for message in prompt:
                if not (isinstance(message, Mapping) and "role" in message
                        and "content" in message):
                    raise ValueError(f"prompts[{i}] must be a conversation of {{'role', "
                                     f"'content'}} messages, got the message {message!r}")
            content = prompt[-1]["content"]
            if isinstance(content, str) and not content.strip():
                raise ValueError(f"prompts[{i}] ends with an empty message: {prompt[-1]!r}")
            continue
        raise ValueError(f"prompts[{i}] must be a string or a conversation (a list of "
                         f"{{'role', 'content'}} messages), got {prompt!r}")
    return out


def _check_out_dir(out: Path) -> None:
    """``out`` is, or can be made as, a folder this process can write in (nothing is made)."""
    existing = out
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == out else f"is inside {existing}, which is a file"
        raise ValueError(f"out_dir {str(out)!r} {where}; pass a folder")
    try:  # a real write: permissions, ACLs and read-only file systems all show here
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".pos_probe_write_check.")
    except OSError as err:
        below = "" if existing == out else f" (it would be made in {str(existing)!r})"
        raise ValueError(f"out_dir {str(out)!r} is not writable{below}: {err}") from err
    os.close(fd)
    os.unlink(probe)


def _check_names(out: Path, names: dict[str, str]) -> None:
    """Each of ``names`` names a file, and no two name the same path."""
    seen: dict[str, str] = {}
    for arg, name in names.items():
        if (not isinstance(name, str) or not name.strip() or name.endswith(("/", os.sep))
                or Path(name).name in ("", ".", "..")):
            raise ValueError(f"{arg} must be a file name, got {name!r}")
        path = os.path.normcase(os.path.normpath(os.path.join(str(out), name)))
        if path in seen:
            raise ValueError(f"{seen[path]} and {arg} name the same file ({name!r}): the last "
                             "write would replace the other; give them different names")
        seen[path] = arg


#: Most panels in a row of :meth:`PoSProbeCallback.figure`.
FIGURE_COLUMNS = 2

#: Smallest font (points) of :meth:`PoSProbeCallback.figure`.
FIGURE_MIN_POINTS = 9


def prompt_label(prompt: Any) -> str:
    """A probe prompt as a panel title: its text without special tokens.

    Tokens in angle brackets (``<bos>``, ``<|im_start|>``) are dropped and white space
    is collapsed (``"<bos> 0 3 + 0 7 ="`` becomes ``"0 3 + 0 7 ="``); a conversation is
    represented by its last message. Pass ``prompt_labels`` to
    :meth:`PoSProbeCallback.figure` to write prompts as a reader would (``"03 + 07 ="``).
    """
    if not isinstance(prompt, str):
        prompt = str(prompt[-1].get("content", "")) if prompt else ""
    return " ".join(re.sub(r"<\|?[^<>\s]*\|?>", " ", prompt).split())


class PoSProbeCallback(TrainerCallback):
    """Measure each probe prompt's PoS every ``every`` steps and record the theory's prediction.

    Parameters
    ----------
    prompts
        A list of probe prompts, in the format of the training set: non-empty
        strings, or conversations (non-empty lists of ``{"role", "content"}``
        messages, rendered with the tokenizer's chat template, the generation
        prompt and the run's ``chat_template_kwargs``). A single string is refused
        (``ValueError``), as is an empty prompt.
    reward
        Verifier ``reward(prompt, completion) -> 0/1`` (``prompt`` as given,
        ``completion`` the decoded text without special tokens).
    out_dir
        Folder of the CSV, plot and JSON record; ``None`` writes no files and
        keeps the measurements in ``rows`` only (for a notebook, which
        shows :meth:`figure` itself). It must be a folder this process can
        write in, or one it can create (made at the first write, by the main
        process only); a file, or a folder that refuses writes, is a
        ``ValueError`` when the callback is made.
    every
        Measure every ``every`` optimiser steps (and at the start and the end).
    n_samples
        Completions per prompt and measurement.
    batch_size
        Sequences per ``generate`` call.
    tokenizer
        Default: the trainer's ``processing_class``.
    p_ref
        Reference PoS per prompt; default: the first measurement.
    steps_per_iteration
        Optimiser steps per GRPO iteration; default from ``args`` (see
        :func:`~grpo_companion.practice.trl_bridge.iteration_of_step`).
    generation_kwargs
        Extra ``generate`` keywords. By default sampling follows the run's
        ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``,
        ``generation_kwargs`` and ``max_completion_length``.
    seed
        Seed of the probe sampling.
    overwrite
        Replace existing files at the output paths.
    csv_name, plot_name, record_name
        File names of the CSV, the plot and the JSON record in ``out_dir``; three
        different files (``ValueError`` otherwise).
    """

    def __init__(
        self,
        prompts: Sequence[Any],
        reward: Verifier,
        out_dir: str | os.PathLike[str] | None,
        *,
        every: int = 50,
        n_samples: int = 50,
        batch_size: int = 64,
        tokenizer: Any = None,
        p_ref: Sequence[float] | None = None,
        steps_per_iteration: float | None = None,
        generation_kwargs: dict[str, Any] | None = None,
        seed: int = 0,
        overwrite: bool = False,
        csv_name: str = "pos_probe.csv",
        plot_name: str = "pos_probe.png",
        record_name: str = "pos_probe.json",
    ) -> None:
        self.prompts = _check_prompts(prompts)
        if not callable(reward):
            raise ValueError(f"reward must be callable as reward(prompt, completion), "
                             f"got {reward!r}")
        for name, value in (("every", every), ("n_samples", n_samples), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if p_ref is not None:
            p_ref = np.asarray(p_ref, dtype=np.float64)
            if p_ref.shape != (len(self.prompts),) or not np.all((p_ref >= 0) & (p_ref <= 1)):
                raise ValueError(f"p_ref must hold one probability per prompt "
                                 f"({len(self.prompts)}), got {p_ref!r}")
        if steps_per_iteration is not None and not steps_per_iteration > 0:
            raise ValueError(f"steps_per_iteration must be > 0, got {steps_per_iteration!r}")
        self.reward = reward
        self.every, self.n_samples, self.batch_size = every, n_samples, batch_size
        self.tokenizer = tokenizer
        self.p_ref: np.ndarray | None = p_ref
        self.steps_per_iteration = steps_per_iteration
        self.generation_kwargs = dict(generation_kwargs or {})
        self.seed = int(seed)
        self.overwrite = bool(overwrite)
        self.writes_files = out_dir is not None
        out = Path(out_dir if out_dir is not None else ".")
        _check_names(out, {"csv_name": csv_name, "plot_name": plot_name,
                           "record_name": record_name})
        if self.writes_files:
            _check_out_dir(out)
        self.csv_path, self.plot_path = out / csv_name, out / plot_name
        self.record_path = out / record_name
        self.rows: list[dict[str, Any]] = []
        self.reading: TheoryReading | None = None
        self.limits: np.ndarray | None = None
        self.regimes: list[str] | None = None
        self._path: PredictedPath | None = None
        self._claimed: set[Path] = set()
        self._last_step: int | None = None
        self._check_outputs()

    # ----------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        if not hasattr(args, "num_generations"):
            raise TypeError("PoSProbeCallback reads GRPO settings: attach it to a trl.GRPOTrainer")
        reading = theory_reading(args)
        if self.steps_per_iteration is not None:
            reading = dataclasses.replace(reading,
                                           steps_per_iteration=float(self.steps_per_iteration))
        self.reading = reading
        self._path = None
        if state.is_world_process_zero:
            self._check_outputs()
            if not reading.predicts:
                logger.warning("PoSProbeCallback measures the PoS but makes %s",
                               reading.note)
        self._measure(args, state, kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 and state.global_step != self._last_step:
            self._measure(args, state, kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        if state.global_step != self._last_step:
            self._measure(args, state, kwargs)
        elif state.is_world_process_zero and self.writes_files and self.rows:
            self._write()  # the last logged_zero_std arrived after the last measurement

    def on_log(self, args, state, control, logs=None, **kwargs):
        value = (logs or {}).get("frac_reward_zero_std")
        if value is None:
            return
        sampled_by = int(state.global_step) - 1  # this step's groups came from that policy
        for row in self.rows:
            if row["step"] == sampled_by:
                row["logged_zero_std"] = float(value)

    # ------------------------------------------------------------ measuring
    def _check_outputs(self) -> None:
        if self.overwrite or not self.writes_files:
            return
        for path in (self.csv_path, self.plot_path, self.record_path):
            if path not in self._claimed and path.exists():
                raise FileExistsError(f"{path} exists; pass overwrite=True to replace it, or "
                                      "choose another out_dir")

    def _encode(self, tokenizer: Any, prompt: Any, args: Any = None) -> list[int]:
        if isinstance(prompt, str):
            return list(tokenizer(text=prompt)["input_ids"])
        extra = dict(getattr(args, "chat_template_kwargs", None) or {})  # as the trainer renders
        rendered = tokenizer.apply_chat_template(conversation=[prompt], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True, **extra)
        ids = rendered["input_ids"]
        return list(ids[0] if ids and isinstance(ids[0], (list, tuple)) else ids)

    def _sampling(self, args: Any, tokenizer: Any) -> dict[str, Any]:
        options = {
            "do_sample": True,
            "max_new_tokens": int(args.max_completion_length),
            "temperature": float(getattr(args, "temperature", 1.0)),
            "top_p": float(getattr(args, "top_p", 1.0)),
            "top_k": int(getattr(args, "top_k", 0) or 0),  # 0: no top-k filter, as in TRL
            "min_p": getattr(args, "min_p", None),
            "repetition_penalty": float(getattr(args, "repetition_penalty", 1.0)),
            "pad_token_id": (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                             else tokenizer.eos_token_id),
            "eos_token_id": tokenizer.eos_token_id,
        }
        if not getattr(args, "use_vllm", False):  # with vLLM they are vLLM's sampling options
            options.update(getattr(args, "generation_kwargs", None) or {})
        options.update(self.generation_kwargs)
        return options

    def _count_successes(self, model: Any, tokenizer: Any, args: Any,
                         step: int) -> tuple[np.ndarray, int]:
        world, rank = _distributed()
        per_rank = math.ceil(self.n_samples / world)
        encoded = [self._encode(tokenizer, p, args) for p in self.prompts]
        jobs = [i for i in range(len(self.prompts)) for _ in range(per_rank)]
        device = next(model.parameters()).device
        options = self._sampling(args, tokenizer)
        pad = options["pad_token_id"]
        counts = torch.zeros(len(self.prompts), dtype=torch.long)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), _own_rng(device):
                torch.manual_seed((self.seed * 1_000_003 + step * 9_973 + rank) % (2**63 - 1))
                for start in range(0, len(jobs), self.batch_size):
                    batch = jobs[start:start + self.batch_size]
                    width = max(len(encoded[i]) for i in batch)
                    ids = torch.full((len(batch), width), pad, dtype=torch.long)
                    mask = torch.zeros((len(batch), width), dtype=torch.long)
                    for row, i in enumerate(batch):  # left padding, for decoder-only generation
                        ids[row, width - len(encoded[i]):] = torch.tensor(encoded[i])
                        mask[row, width - len(encoded[i]):] = 1
                    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                         **options)
                    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
                    for i, text in zip(batch, texts, strict=True):
                        counts[i] += _as_success(self.reward(self.prompts[i], text), i)
        finally:
            model.train(was_training)
        if world > 1:
            reduced = counts.to(device)
            torch.distributed.all_reduce(reduced)
            counts = reduced.cpu()
        return counts.numpy().astype(np.float64), per_rank * world

    def _measure(self, args: Any, state: Any, kwargs: dict[str, Any]) -> None:
        model = kwargs.get("model")
        tokenizer = self.tokenizer or kwargs.get("processing_class")
        if model is None or tokenizer is None:
            raise ValueError("PoSProbeCallback needs the model and a tokenizer (pass tokenizer=)")
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
        assert self.reading is not None
        step = int(state.global_step)
        counts, n = self._count_successes(model, tokenizer, args, step)
        measured = counts / n
        if self.p_ref is None:
            self.p_ref = measured.copy()
        if self.limits is None:
            self.limits, self.regimes = predict_limits(self.p_ref, self.reading)
        iteration = iteration_of_step(step, self.reading)
        if self._path is None:
            self._path = PredictedPath(self.p_ref, self.reading)
        predicted = self._path.at(iteration)
        assert self.regimes is not None
        zero_std = zero_variance_share(measured, int(args.num_generations))
        for i in range(len(self.prompts)):
            self.rows.append({
                "step": step, "prompt": i, "measured_pos": float(measured[i]), "n": n,
                "predicted_pos": float(predicted[i]), "theory_iteration": iteration,
                "predicted_limit": float(self.limits[i]), "regime": self.regimes[i],
                "p_ref": float(self.p_ref[i]), "predicted_zero_std": zero_std,
                "logged_zero_std": math.nan,
            })
        self._last_step = step
        if state.is_world_process_zero and self.writes_files:
            self._write()

    # --------------------------------------------------------------- output
    def _claim(self, path: Path) -> None:
        if path not in self._claimed:
            if path.exists() and not self.overwrite:
                raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
            self._claimed.add(path)

    def _write(self) -> None:
        for path in (self.csv_path, self.plot_path, self.record_path):
            self._claim(path)

        def rows(f: Any) -> None:
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v)
                                 for k, v in row.items()})

        _atomic_write(self.csv_path, rows)
        assert self.reading is not None and self.p_ref is not None and self.limits is not None
        record = {
            "theory": self.reading.record(),
            "prompts": [p if isinstance(p, str) else list(p) for p in self.prompts],
            "p_ref": self.p_ref.tolist(),
            "predicted_limit": [None if math.isnan(x) else x for x in self.limits.tolist()],
            "regime": self.regimes,
            "n_samples": self.n_samples,
            "every": self.every,
        }
        _atomic_write(self.record_path, lambda f: json.dump(record, f, indent=2, default=str))
        figure = self.figure()
        _atomic_write(self.plot_path, lambda f: figure.savefig(f, format="png", dpi=100),
                      binary=True)

    def figure(self, prompt_labels: Sequence[str] | None = None) -> Any:
        """The measured-versus-predicted figure of the rows so far (Agg canvas, no pyplot).

        One panel per probe prompt, at most :data:`FIGURE_COLUMNS` to a row, titled with
        the prompt as a reader would write it, and one legend for all panels below
        them. Its text is at least :data:`FIGURE_MIN_POINTS` points, so that, shown at
        a book's text width (about 800 CSS pixels), it reads at 9 pixels or more.

        Parameters
        ----------
        prompt_labels
            Panel titles, one per probe prompt (e.g. ``"03 + 07 ="``); default: each
            prompt as :func:`prompt_label` writes it.

        Raises
        ------
        ValueError
            If ``prompt_labels`` does not hold one string per probe prompt.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        count = len(self.prompts)
        if prompt_labels is None:
            labels = [prompt_label(p) for p in self.prompts]
        else:
            labels = list(prompt_labels) if not isinstance(prompt_labels, str) else []
            if len(labels) != count or not all(isinstance(t, str) for t in labels):
                raise ValueError(f"prompt_labels must hold one string per probe prompt "
                                 f"({count}), got {prompt_labels!r}")
        cols = min(FIGURE_COLUMNS, count)
        lines = math.ceil(count / cols)
        size = FIGURE_MIN_POINTS
        fig = Figure(figsize=(3.6 * cols + 0.6, 2.7 * lines + 1.3), layout="constrained")
        FigureCanvasAgg(fig)
        axes = np.atleast_1d(fig.subplots(lines, cols, squeeze=False, sharex=True,
                                          sharey=True)).ravel()
        for i, ax in enumerate(axes):
            if i >= count:
                ax.set_axis_off()
                continue
            mine = [r for r in self.rows if r["prompt"] == i]
            steps = np.array([r["step"] for r in mine])
            pos = np.array([r["measured_pos"] for r in mine])
            n = np.array([r["n"] for r in mine], dtype=np.float64)
            ax.errorbar(steps, pos, yerr=np.sqrt(pos * (1 - pos) / n), fmt="o-", ms=3,
                        color="C0", label="measured PoS (\u00b11 s.e.)")
            predicted = np.array([r["predicted_pos"] for r in mine])
            if np.isfinite(predicted).any():
                ax.plot(steps, predicted, "--", drawstyle="steps-post", color="C1",
                        label="recurrence")
            limit = mine[-1]["predicted_limit"] if mine else math.nan
            if math.isfinite(limit):
                ax.axhline(limit, ls=":", color="C2", label="its limit")
            ax.set_title(textwrap.shorten(labels[i], 32, placeholder="..."), fontsize=size + 1)
            ax.set_ylim(-0.03, 1.03)
            ax.tick_params(labelsize=size)
            if i >= count - cols:  # the lowest panel of its column
                ax.set_xlabel("optimiser step", fontsize=size)
            if i % cols == 0:
                ax.set_ylabel("PoS", fontsize=size)
        handles: dict[str, Any] = {}
        for ax in axes[:count]:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, handle)
        order = [k for k in ("measured PoS (\u00b11 s.e.)", "recurrence", "its limit")
                 if k in handles]
        if order:
            fig.legend([handles[k] for k in order], order, loc="outside lower center",
                       ncol=len(order), fontsize=size)
        if self.reading is not None:
            fig.suptitle(textwrap.fill(self.reading.note, 26 * cols + 10), fontsize=size)
        return fig
