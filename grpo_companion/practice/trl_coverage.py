"""Which ``trl.GRPOConfig`` settings the theory covers, field by field.

Every field of ``GRPOConfig`` (TRL 1.16.0, with the ``transformers.TrainingArguments``
it inherits) is in exactly one of two tables:

- :data:`RULES`, the fields that change the advantage, the loss, the KL term, the
  reference, the sampling or the pace of a run. Each :class:`FieldRule` says how the
  theory reads the values it covers (``covered``, the mapping) and, through
  ``outside(value, config)``, why a value is outside the theory (``None`` when it is
  covered). Every installed default is covered; most options that the theory does not
  model are covered only at their inert value (``entropy_coef=0``, ...).
  ``sync_ref_model=True`` is covered where the moving-reference recurrence describes it
  (:func:`ref_sync_iterations`).
- :data:`IRRELEVANT`, the fields that change none of these (logging, saving, the Hub,
  evaluation, data loading, devices and precision, the generation engine), each with the
  reason.

The rule for anything else is conservative: a field in neither table (an option of a
newer TRL or transformers) is outside the theory as soon as its value differs from its
declared default, and ``tests/practice/test_bridge_coverage.py`` fails until it is
classified here.

:func:`outside_reasons` lists, for a configuration, one ``"name=value: why"`` per
setting outside the theory; :func:`grpo_companion.practice.trl_bridge.theory_reading`
then predicts nothing and records them (``TheoryReading.reasons``).

What a configuration cannot say: the theory assumes one verifiable 0/1 reward per
completion and single-turn completions. The number of reward functions and any tools
are arguments of ``GRPOTrainer``, not of its config, so they are not checked here
(``reward_weights`` with several weights is).

This module reads attributes only: it imports neither TRL nor transformers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACTS_ON",
    "IRRELEVANT",
    "RULES",
    "FieldRule",
    "classify",
    "coverage_rows",
    "outside_reasons",
    "ref_sync_iterations",
    "steps_per_iteration",
]

#: What a relevant field acts on.
ACTS_ON = ("advantage", "loss", "kl", "reference", "sampling", "pace")

Check = Callable[[Any, Any], "str | None"]


@dataclass(frozen=True)
class FieldRule:
    """A ``GRPOConfig`` field that matters to the theory, and which of its values it covers.

    Attributes
    ----------
    name : str
        The field.
    acts_on : str
        One of :data:`ACTS_ON`.
    covered : str
        How the theory reads the values it covers (the mapping).
    check : callable or None
        ``check(value, config) -> str | None``: why ``value`` is outside the theory,
        ``None`` when it is covered. ``None`` (no check): every value is covered.
    """

    name: str
    acts_on: str
    covered: str
    check: Check | None = None

    @property
    def can_be_outside(self) -> bool:
        """Whether some value of this field is outside the theory."""
        return self.check is not None

    def outside(self, value: Any, config: Any = None) -> str | None:
        """Why ``value`` is outside the theory, or ``None`` when it is covered."""
        return None if self.check is None else self.check(value, config)


def _get(config: Any, name: str, default: Any = None) -> Any:
    return getattr(config, name, default)


def steps_per_iteration(config: Any) -> float:
    """Optimiser steps per GRPO iteration (one generation round of ``GRPOTrainer``).

    ``steps_per_generation x num_iterations`` micro-batches (``steps_per_generation``
    defaults to ``gradient_accumulation_steps``), divided by ``gradient_accumulation_steps``.
    """
    accumulation = int(_get(config, "gradient_accumulation_steps", 1))
    per_generation = _get(config, "steps_per_generation") or accumulation
    return int(per_generation) * int(_get(config, "num_iterations", 1)) / accumulation


def ref_sync_iterations(config: Any) -> int | None:
    """GRPO iterations between two syncs of TRL's reference (``sync_ref_model=True``).

    ``SyncRefModelCallback`` mixes the reference after every optimiser step whose number is
    a multiple of ``ref_model_sync_steps``; that is after every ``m``-th iteration when
    ``ref_model_sync_steps = m x`` :func:`steps_per_iteration`. ``None`` when the reference
    does not sync, or syncs inside an iteration (no whole ``m``).
    """
    if not _get(config, "sync_ref_model", False):
        return None
    try:
        ratio = int(_get(config, "ref_model_sync_steps")) / steps_per_iteration(config)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return int(round(ratio)) if ratio >= 1 and abs(ratio - round(ratio)) < 1e-9 else None


def _sync_ref_model(value: Any, config: Any) -> str | None:
    if not value or not float(_get(config, "beta", 0.0)):
        return None  # no sync, or no KL term: the reference is never read
    if not _get(config, "use_bias_correction_kl", False):
        return ("a moving reference with plain k3 (KL(pi_ref||pi)): the moving-reference "
                "recurrence is derived for KL(pi||pi_ref) (use_bias_correction_kl=True)")
    alpha = _get(config, "ref_model_mixup_alpha")
    if not _number_in_unit_interval(alpha):
        return f"ref_model_mixup_alpha={alpha!r} is not in [0, 1]: not a mix of two policies"
    if ref_sync_iterations(config) is None:
        return (f"the reference is mixed every ref_model_sync_steps="
                f"{_get(config, 'ref_model_sync_steps')!r} optimiser steps, not after a whole "
                f"number of iterations ({steps_per_iteration(config):g} steps each): it moves "
                "inside an iteration")
    return None


def _number_in_unit_interval(value: Any) -> bool:
    try:
        return value is not None and 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        return False


def _unless(inert: Callable[[Any], bool], reason: str) -> Check:
    """A check that covers the values ``inert`` accepts and refuses the rest with ``reason``."""
    return lambda value, config: None if inert(value) else reason


def _is_none(value: Any) -> bool:
    return value is None


def _is_false(value: Any) -> bool:
    return not value


def _number_is(target: float) -> Callable[[Any], bool]:
    def inert(value: Any) -> bool:
        try:
            return value is not None and float(value) == target
        except (TypeError, ValueError):
            return False
    return inert


def _scale_rewards(value: Any, config: Any) -> str | None:
    mode = {True: "group", False: "none"}.get(value, value)
    if mode in ("group", "none"):
        return None
    if mode == "batch":
        return ("scales every advantage by a statistic of the whole batch, which couples the "
                "prompts")
    return "not a scaling this project knows (TRL has 'group', 'batch' and 'none')"


_LOSSES = {
    "cispo": "clips the importance weights themselves (MiniMax-M1), not the ratio times the "
             "advantage: another surrogate than the theory's",
    "sapo": "a smooth temperature gate instead of the clip: another surrogate than the "
            "theory's",
    "luspo": "a sequence-level loss weighted by each sequence's length: another objective than "
             "the theory's",
    "vespo": "Gamma-weighted sequence-level ratios: another surrogate than the theory's",
}


def _loss_type(value: Any, config: Any) -> str | None:
    if value in ("grpo", "bnpo", "dr_grpo", "dapo"):
        return None
    return _LOSSES.get(value, "a loss with no counterpart in this project")


def _reward_weights(value: Any, config: Any) -> str | None:
    if value is None:
        return None
    weights = list(value)
    if len(weights) > 1:
        return ("several reward functions: their weighted sum is not one 0/1 verifier's "
                "reward, which the calibration assumes")
    if len(weights) == 1 and float(weights[0]) == 1.0:
        return None
    return "rescales the 0/1 reward, which the calibration assumes"


def _delta(value: Any, config: Any) -> str | None:
    if value is None or float(value) > 1.0:
        return None
    return ("caps the ratio at delta <= 1, which binds on policy (ratio 1): the first step of "
            "a round is no longer the theory's")


def _generation_kwargs(value: Any, config: Any) -> str | None:
    if not value:
        return None
    return ("extra generate()/SamplingParams options change what is sampled, while the loss's "
            "ratios are those of pi itself: the samples are not pi's")


def _sampler(what: str) -> str:
    return (f"{what} while the loss's ratios and KL are those of pi itself: the samples are not "
            "pi's, so the on-policy recurrence does not apply")


#: Fields that change the advantage, the loss, the KL term, the reference, the sampling or the
#: pace, with what the theory makes of their values.
RULES: tuple[FieldRule, ...] = (
    # ---------------------------------------------------------------- advantage
    FieldRule("num_generations", "advantage",
              "G: the expected weights of groups of G (the calibration's group_size)"),
    FieldRule("scale_rewards", "advantage",
              "'group': CALIBRATIONS['trl'] (std + 1e-4); 'none': CALIBRATIONS['mean_only']",
              _scale_rewards),
    FieldRule("multi_objective_aggregation", "advantage",
              "'sum_then_normalize': one reward per completion, normalised as scale_rewards says",
              _unless(lambda v: v == "sum_then_normalize",
                      "normalises each reward function's reward over the batch, which couples "
                      "the prompts")),
    FieldRule("reward_weights", "advantage",
              "None (or one weight 1): the reward is the verifier's 0/1", _reward_weights),
    # ---------------------------------------------------------------- loss
    FieldRule("loss_type", "loss",
              "grpo, bnpo, dr_grpo, dapo: aggregations of the clipped ratio objective "
              "(rl.losses.aggregate); with equal completion lengths each is the theory's "
              "sequence-level objective up to a constant (grpo weighs a completion 1/length)",
              _loss_type),
    FieldRule("epsilon", "loss",
              "lower clip 1 - epsilon: idle at ratio 1 (a round's first step and the fixed "
              "point), so it caps a round's move, not where the run settles"),
    FieldRule("epsilon_high", "loss",
              "upper clip (None: epsilon): idle at ratio 1, as epsilon"),
    FieldRule("delta", "loss",
              "None, or a cap > 1 on every token's ratio (two-sided clip): idle at ratio 1",
              _delta),
    FieldRule("importance_sampling_level", "loss",
              "'token': per-token ratios, the theory's per-output ratio",
              _unless(lambda v: v == "token",
                      "one ratio per sequence (GSPO): its on-policy gradient weighs a completion "
                      "1/length and the bias-corrected KL is no longer exact")),
    FieldRule("top_entropy_quantile", "loss", "1.0: every token is in the loss",
              _unless(_number_is(1.0), "only the high-entropy tokens carry the advantage")),
    FieldRule("entropy_coef", "loss", "0: no entropy bonus",
              _unless(_number_is(0.0), "an entropy bonus changes the objective, so the fixed "
                                       "point moves")),
    FieldRule("use_adaptive_entropy", "loss", "False: no adaptive entropy bonus",
              _unless(_is_false, "an adaptive entropy bonus changes the objective, so the fixed "
                                 "point moves")),
    FieldRule("entropy_coef_min", "loss", "read only with use_adaptive_entropy=True"),
    FieldRule("entropy_coef_max", "loss", "read only with use_adaptive_entropy=True"),
    FieldRule("entropy_coef_delta", "loss", "read only with use_adaptive_entropy=True"),
    FieldRule("entropy_target", "loss", "read only with use_adaptive_entropy=True"),
    FieldRule("sapo_temperature_neg", "loss", "read only by loss_type='sapo'"),
    FieldRule("sapo_temperature_pos", "loss", "read only by loss_type='sapo'"),
    FieldRule("vespo_k_pos", "loss", "read only by loss_type='vespo'"),
    FieldRule("vespo_lambda_pos", "loss", "read only by loss_type='vespo'"),
    FieldRule("vespo_k_neg", "loss", "read only by loss_type='vespo'"),
    FieldRule("vespo_lambda_neg", "loss", "read only by loss_type='vespo'"),
    FieldRule("mask_truncated_completions", "loss",
              "False: a truncated completion stays in the loss, scored by the verifier",
              _unless(_is_false, "truncated completions leave the loss but not the group's "
                                 "statistics, which reweights the outputs")),
    FieldRule("max_completion_length", "loss",
              "the outputs are the completions up to this length (a truncated one is scored "
              "like any other); dr_grpo's constant"),
    FieldRule("off_policy_mask_threshold", "loss",
              "None, or a mask of negative-advantage sequences far (in KL) from pi_old: idle at "
              "pi = pi_old, so like the clip it changes a round's later steps, not the fixed "
              "point"),
    FieldRule("router_aux_loss_coef", "loss",
              "None (the model config's: none for a dense model) or 0",
              _unless(lambda v: v is None or _number_is(0.0)(v),
                      "adds the mixture-of-experts load-balancing loss to the objective")),
    FieldRule("disable_dropout", "loss",
              "either value: the theory reads the model as its policy pi, without the noise "
              "dropout adds to the loss's log-probabilities"),
    FieldRule("neftune_noise_alpha", "loss", "None: no noise on the embeddings",
              _unless(_is_none, "noisy embeddings in the training forward passes: the loss's "
                                "log-probabilities are not those of the sampled policy")),
    FieldRule("weight_decay", "loss", "0: no pull on the weights",
              _unless(_number_is(0.0), "pulls the weights towards 0, an anchor besides pi_ref, "
                                       "so the fixed point moves")),
    FieldRule("average_tokens_across_devices", "loss",
              "either value: the token count of the aggregation's normaliser, a positive "
              "scale of a batch's update"),
    # ---------------------------------------------------------------- kl
    FieldRule("beta", "kl", "the KL weight beta (0: no KL term, no anchor)"),
    FieldRule("use_bias_correction_kl", "kl",
              "True: k3 times the ratio, KL(pi||pi_ref), Theorem 2's recurrence; False: plain "
              "k3, KL(pi_ref||pi), the reverse-KL step"),
    # ---------------------------------------------------------------- reference
    FieldRule("sync_ref_model", "reference",
              "False: the reference stays pi_ref; True (with beta > 0 and k3_ratio, syncing "
              "after whole iterations): the moving-reference recurrence "
              "(theory.analyses.staged.moving_reference_iterate), the reference's success "
              "logit mixed as a L_n + (1 - a) L_ref", _sync_ref_model),
    FieldRule("ref_model_mixup_alpha", "reference",
              "read only with sync_ref_model=True: the policy's share a of the mixed reference"),
    FieldRule("ref_model_sync_steps", "reference",
              "read only with sync_ref_model=True: optimiser steps between syncs (a whole "
              "number of iterations, see ref_sync_iterations)"),
    # ---------------------------------------------------------------- sampling
    FieldRule("temperature", "sampling",
              "T: sampling and the loss both use logits / T, so the theory describes the "
              "tempered policy (the one the probe samples)"),
    FieldRule("top_p", "sampling", "1.0: no nucleus truncation",
              _unless(_number_is(1.0), _sampler("samples from the nucleus only"))),
    FieldRule("top_k", "sampling", "0 (or None): no top-k truncation",
              _unless(lambda v: v is None or _number_is(0.0)(v),
                      _sampler("samples from the top k tokens only"))),
    FieldRule("min_p", "sampling", "None (or 0): no min-p truncation",
              _unless(lambda v: v is None or _number_is(0.0)(v),
                      _sampler("drops the tokens below min_p"))),
    FieldRule("repetition_penalty", "sampling", "1.0: no repetition penalty",
              _unless(_number_is(1.0), _sampler("penalises repeated tokens when sampling"))),
    FieldRule("generation_kwargs", "sampling", "None or {}: sampling as the options above say",
              _generation_kwargs),
    FieldRule("chat_template_kwargs", "sampling",
              "how a conversation prompt is rendered: the theory's prompt is the rendered one "
              "(the probe renders with the same keywords)"),
    FieldRule("vllm_structured_outputs_regex", "sampling", "None: unconstrained samples",
              _unless(_is_none, _sampler("constrains the samples to a regular expression"))),
    FieldRule("max_tool_calling_iterations", "sampling", "None: single-turn completions",
              _unless(_is_none, "tool-calling rollouts of several turns: not one output per "
                                "prompt as in the theory")),
    FieldRule("use_vllm", "sampling",
              "either value: the same weights sampled by vLLM or by generate(); the theory "
              "reads both as samples of pi (the engines' numerical mismatch is not in it)"),
    FieldRule("vllm_importance_sampling_correction", "sampling",
              "corrects only the numerical mismatch between vLLM's and the trainer's "
              "log-probabilities, which the theory's exact sampling does not have"),
    FieldRule("vllm_importance_sampling_mode", "sampling",
              "as vllm_importance_sampling_correction"),
    FieldRule("vllm_importance_sampling_clip_max", "sampling",
              "as vllm_importance_sampling_correction"),
    FieldRule("vllm_importance_sampling_clip_min", "sampling",
              "as vllm_importance_sampling_correction"),
    FieldRule("vllm_importance_sampling_cap", "sampling",
              "deprecated name of vllm_importance_sampling_clip_max"),
    # ---------------------------------------------------------------- pace
    FieldRule("num_iterations", "pace",
              "mu optimiser passes per generation round: the length of an iteration, not its "
              "fixed point"),
    FieldRule("steps_per_generation", "pace",
              "optimiser steps per generation round (default: gradient_accumulation_steps): the "
              "length of an iteration"),
    FieldRule("generation_batch_size", "pace",
              "the completions of a generation round (sets steps_per_generation)"),
    FieldRule("gradient_accumulation_steps", "pace",
              "micro-batches per optimiser step: the length of an iteration in steps"),
    FieldRule("per_device_train_batch_size", "pace",
              "completions per micro-batch: prompts per step, not where each prompt settles"),
    FieldRule("auto_find_batch_size", "pace", "as per_device_train_batch_size"),
    FieldRule("learning_rate", "pace",
              "the pace of the steps towards each round's maximiser, not where the run settles"),
    FieldRule("lr_scheduler_type", "pace", "as learning_rate"),
    FieldRule("lr_scheduler_kwargs", "pace", "as learning_rate"),
    FieldRule("warmup_steps", "pace", "as learning_rate"),
    FieldRule("optim", "pace", "the optimiser: the pace of the steps, as learning_rate"),
    FieldRule("optim_args", "pace", "as optim"),
    FieldRule("optim_target_modules", "pace", "as optim"),
    FieldRule("adam_beta1", "pace", "as optim"),
    FieldRule("adam_beta2", "pace", "as optim"),
    FieldRule("adam_epsilon", "pace", "as optim"),
    FieldRule("max_grad_norm", "pace", "gradient clipping: a smaller step, as learning_rate"),
    FieldRule("max_steps", "pace", "the length of the run"),
    FieldRule("num_train_epochs", "pace", "the length of the run"),
)

_RULES = {rule.name: rule for rule in RULES}

_ENGINE = "the generation engine and where it runs, not the distribution it samples"
_NUMERICS = "numerics, memory or speed, not the algorithm"
_LOGGING = "logging and reporting only"
_SAVING = "checkpoints and the Hub only"
_EVAL = "evaluation only, not training"
_DATA = "the data pipeline: which prompts come when, not what the update does to a prompt"
_DEVICES = "devices and processes, not the algorithm"
_MODEL = "which model is loaded, not the algorithm (the theory starts from the measured p_ref)"
_RUN = "running the script (what to do, where, from which checkpoint)"

#: Fields that change neither the advantage, the loss, the KL, the reference, the sampling
#: nor the pace, each with why.
IRRELEVANT: dict[str, str] = {
    **dict.fromkeys(("output_dir", "do_train", "do_eval", "do_predict", "resume_from_checkpoint",
                     "local_rank", "debug", "skip_memory_metrics", "seed", "data_seed",
                     "full_determinism"), _RUN),
    **dict.fromkeys(("model_init_kwargs", "trust_remote_code"), _MODEL),
    **dict.fromkeys(("logging_strategy", "logging_steps", "logging_first_step",
                     "log_on_each_node", "logging_nan_inf_filter", "include_num_input_tokens_seen",
                     "log_level", "log_level_replica", "disable_tqdm", "report_to", "run_name",
                     "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
                     "log_completions", "log_multimodal", "num_completions_to_print",
                     "log_unique_prompts", "log_completions_hub_repo"), _LOGGING),
    **dict.fromkeys(("save_only_model", "save_strategy", "save_steps", "save_on_each_node",
                     "save_total_limit", "enable_jit_checkpoint", "push_to_hub", "hub_token",
                     "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push",
                     "hub_revision", "load_best_model_at_end", "metric_for_best_model",
                     "greater_is_better", "ignore_data_skip",
                     "restore_callback_states_from_checkpoint"), _SAVING),
    **dict.fromkeys(("eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size",
                     "prediction_loss_only", "eval_on_start", "eval_do_concat_batches",
                     "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics",
                     "batch_eval_metrics", "bf16_full_eval", "fp16_full_eval",
                     "num_generations_eval"), _EVAL),
    **dict.fromkeys(("dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory",
                     "dataloader_persistent_workers", "dataloader_prefetch_factor",
                     "dataloader_multiprocessing_context", "dataloader_in_order",
                     "remove_unused_columns", "label_names", "train_sampling_strategy",
                     "length_column_name", "shuffle_dataset", "pad_to_multiple_of"), _DATA),
    **dict.fromkeys(("use_cpu", "accelerator_config", "parallelism_config",
                     "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
                     "ddp_static_graph",
                     "ddp_backend", "ddp_timeout", "fsdp", "fsdp_config", "deepspeed",
                     "ds3_gather_for_generation"), _DEVICES),
    **dict.fromkeys(("bf16", "fp16", "tf32", "activation_checkpointing",
                     "activation_checkpointing_kwargs", "gradient_checkpointing",
                     "gradient_checkpointing_kwargs", "torch_compile", "torch_compile_backend",
                     "torch_compile_mode", "use_liger_kernel", "liger_kernel_config", "use_cache",
                     "torch_empty_cache_steps", "cast_lm_head_to_fp32"), _NUMERICS),
    **dict.fromkeys(("cache_implementation", "vllm_mode", "vllm_model_impl",
                     "vllm_enable_sleep_mode", "vllm_server_base_url", "vllm_server_host",
                     "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
                     "vllm_gpu_memory_utilization", "vllm_max_model_length",
                     "vllm_tensor_parallel_size", "use_transformers_continuous_batching",
                     "transformers_continuous_batching_config", "use_transformers_paged"),
                    _ENGINE),
    "label_smoothing_factor": "GRPOTrainer computes its own loss; the label smoother is never "
                              "applied",
}


def classify(name: str) -> str:
    """``"relevant"`` (in :data:`RULES`), ``"irrelevant"`` or ``"unclassified"``."""
    if name in _RULES:
        return "relevant"
    if name in IRRELEVANT:
        return "irrelevant"
    return "unclassified"


def _declared_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _differs(value: Any, default: Any) -> bool:
    try:
        return not bool(value == default)
    except Exception:  # values that do not compare (arrays, ...) count as changed
        return True


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def outside_reasons(config: Any) -> tuple[str, ...]:
    """One ``"name=value: why"`` per setting of ``config`` outside the theory (``()``: none).

    The rules run in the order of :data:`RULES`; a field the configuration does not have
    (a TRL before the option existed) is skipped. For a dataclass configuration, a field
    in neither :data:`RULES` nor :data:`IRRELEVANT` whose value differs from its declared
    default is outside too: nobody has checked what it does.
    """
    reasons = []
    for rule in RULES:
        if rule.check is None or not hasattr(config, rule.name):
            continue
        value = getattr(config, rule.name)
        why = rule.check(value, config)
        if why is not None:
            reasons.append(f"{rule.name}={value!r}: {why}")
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        for field in dataclasses.fields(config):
            if classify(field.name) != "unclassified" or not hasattr(config, field.name):
                continue
            value, default = getattr(config, field.name), _declared_default(field)
            if default is dataclasses.MISSING or (_is_nan(value) and _is_nan(default)):
                continue
            if _differs(value, default):
                reasons.append(f"{field.name}={value!r}: an option this project has not "
                               "classified (a newer TRL?); see grpo_companion.practice."
                               "trl_coverage")
    return tuple(reasons)


def coverage_rows(config: Any) -> list[dict[str, Any]]:
    """One row per field of :data:`RULES` that ``config`` has.

    Each row: ``name``, ``value``, ``acts_on``, ``status`` (``"covered"`` or
    ``"outside"``) and ``text`` (the mapping when covered, the reason when outside).
    """
    rows = []
    for rule in RULES:
        if not hasattr(config, rule.name):
            continue
        value = getattr(config, rule.name)
        why = rule.outside(value, config)
        rows.append({"name": rule.name, "value": value, "acts_on": rule.acts_on,
                     "status": "covered" if why is None else "outside",
                     "text": rule.covered if why is None else why})
    return rows
