"""The toy that chapters 11 and 12 train with TRL's real ``GRPOTrainer``: one-digit additions.

:func:`build` makes, offline and in a few seconds of CPU:

- four (by default) prompts ``ab+cd=`` of the addition task of
  :func:`grpo_companion.rl.tasks.make_arithmetic_task`, as text in a word-level
  ``tokenizers`` vocabulary of the task's fifteen tokens;
- a two-layer ``transformers`` Llama with random weights, trained by supervised
  learning (:func:`grpo_companion.rl.tasks.pretrain_reference`) on imperfect answers
  with the task's own error model, so that each prompt starts at its own
  intermediate probability of success;
- the verifier, as ``verify(prompt, completion)`` and as a TRL reward function;
- :meth:`AdditionToy.exact_pos`: each prompt's probability of success, computed
  exactly (the probability of the correct digits followed by the end token; at
  most three answer tokens), rather than sampled;
- :meth:`AdditionToy.grpo_trainer`: TRL's ``GRPOTrainer`` on the toy, set up for a CPU.

The reference model and tokenizer are saved in ``folder``, from which
``GRPOTrainer(model=str(toy.model_dir), ...)`` loads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_companion.rl import tasks

__all__ = ["DEFAULT_PAIRS", "AdditionToy", "build"]

#: The operand pairs of the default prompts: units sums 10, 12, 13 and 14, so each
#: starts at its own PoS under the task's carry-forgetting error model.
DEFAULT_PAIRS: tuple[tuple[int, int], ...] = ((3, 7), (4, 8), (6, 7), (7, 7))


class _Logits(torch.nn.Module):
    """``model(tokens) -> logits``, the interface of ``tasks.pretrain_reference``."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=tokens).logits


@dataclass
class AdditionToy:
    """The prompts, tokenizer, reference model and verifier of :func:`build`.

    Attributes
    ----------
    prompts : list of str
        The prompts as text, e.g. ``"<bos> 0 3 + 0 7 ="``.
    pairs : tuple of (int, int)
        Their operands.
    prompt_ids, answers, answer_mask : torch.Tensor
        Token ids of the prompts, of the correct answers (digits, end token, padding)
        and the mask of the answer tokens that count (up to the end token included).
    tokenizer
        A ``transformers.PreTrainedTokenizerFast`` (left padding).
    model : transformers.LlamaForCausalLM
        The reference policy.
    model_dir : Path
        Where the model and tokenizer are saved.
    p_ref : numpy.ndarray
        :meth:`exact_pos` of the reference at temperature 1.
    sft_losses : list of float
        The supervised losses of the reference's pre-training.
    data_pos : numpy.ndarray
        The share of correct answers in the pre-training data, per prompt.
    """

    prompts: list[str]
    pairs: tuple[tuple[int, int], ...]
    prompt_ids: torch.Tensor
    answers: torch.Tensor
    answer_mask: torch.Tensor
    tokenizer: Any
    model: Any
    model_dir: Path
    p_ref: np.ndarray
    sft_losses: list[float]
    data_pos: np.ndarray

    def verify(self, prompt: str, completion: str) -> int:
        """The verifiable reward: 1 when the completion's digits spell the sum, else 0."""
        a, b = self.pairs[self.prompts.index(prompt)]
        return int(completion.replace(" ", "") == str(a + b))

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
        """:meth:`verify` as a TRL reward function."""
        return [float(self.verify(p, c)) for p, c in zip(prompts, completions, strict=True)]

    def exact_pos(self, lm: Any, temperature: float = 1.0) -> np.ndarray:
        """P(correct digits, then the end token | prompt) at ``temperature``, per prompt.

        ``lm`` is any causal LM with this toy's vocabulary (``lm(input_ids=...).logits``),
        e.g. the trainer's model during a run. Computed in float64 from one forward pass.
        """
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        device = next(lm.parameters()).device
        tokens = torch.cat([self.prompt_ids, self.answers], 1).to(device)
        with torch.no_grad():
            logits = lm(input_ids=tokens).logits.double().cpu() / temperature
        logp = torch.log_softmax(logits, -1)[:, tasks.PROMPT_LENGTH - 1:-1]
        chosen = logp.gather(-1, self.answers[..., None])[..., 0]
        return (chosen * self.answer_mask).sum(1).exp().numpy()

    def grpo_trainer(self, out_dir: str | Path, *, max_steps: int, learning_rate: float = 1e-3,
                     seed: int = 0, callbacks: Sequence[Any] = (), **settings: Any) -> Any:
        """A TRL ``GRPOTrainer`` on this toy, from the saved reference, ready to ``train()``.

        Every step takes one group of ``num_generations`` (TRL's default unless in
        ``settings``) per prompt; the completions are as long as the longest answer.
        What a CPU toy needs is set here: ``use_cpu``, no gradient checkpointing, nothing
        saved, reported or logged, no progress bar or printer; ``settings`` are further
        ``GRPOConfig`` fields (``beta``, ``use_bias_correction_kl``, ...), ``callbacks``
        TRL callbacks (a :class:`~grpo_companion.practice.trl_callback.PoSProbeCallback`).
        """
        import transformers
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        from grpo_companion.practice.trl_facts import grpo_defaults

        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        group = int(settings.pop("num_generations",
                                 grpo_defaults(["num_generations"])["num_generations"]))
        args = GRPOConfig(
            output_dir=str(out_dir), per_device_train_batch_size=len(self.prompts) * group,
            num_generations=group, max_completion_length=self.answers.shape[1],
            learning_rate=learning_rate, max_steps=max_steps, gradient_checkpointing=False,
            use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0, seed=seed, **settings)
        trainer = GRPOTrainer(model=str(self.model_dir), reward_funcs=self.reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": self.prompts}),
                              processing_class=self.tokenizer, callbacks=list(callbacks))
        trainer.remove_callback(transformers.PrinterCallback)
        return trainer


def _tokenizer(names: dict[int, str]) -> Any:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in names.items()}, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins the tokens with spaces
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        padding_side="left")


def build(folder: str | Path, *, pairs: Sequence[tuple[int, int]] = DEFAULT_PAIRS,
          seed: int = 0, sft_steps: int = 300) -> AdditionToy:
    """Make the toy, train its reference and save it in ``folder`` (created if needed).

    Parameters
    ----------
    folder
        Where the reference model and its tokenizer are saved.
    pairs
        Operand pairs ``(a, b)``, each in ``0..9``, all different.
    seed
        Seeds the model's random weights and the pre-training batches.
    sft_steps
        Supervised steps of the reference's pre-training (batch 64, Adam, lr 1e-2).
    """
    import transformers

    pairs = tuple((int(a), int(b)) for a, b in pairs)
    if not pairs or len(set(pairs)) != len(pairs) or not all(
            0 <= x <= 9 for pair in pairs for x in pair):
        raise ValueError(f"pairs must be distinct pairs of one-digit operands (0..9), got {pairs}")
    if isinstance(sft_steps, bool) or not isinstance(sft_steps, int) or sft_steps < 1:
        raise ValueError(f"sft_steps must be an int >= 1, got {sft_steps!r}")
    task = tasks.make_arithmetic_task(max_operand=9, n_eval_prompts=1, seed=seed)
    names = {**{d: str(d) for d in tasks.DIGITS}, tasks.PLUS: "+", tasks.EQUALS: "=",
             tasks.EOS: "<eos>", tasks.BOS: "<bos>", tasks.PAD: "<pad>"}
    idx = np.array([np.flatnonzero((task.operands == pair).all(1))[0] for pair in pairs])
    prompt_ids = task.prompts(torch.as_tensor(idx))
    prompts = [" ".join(names[int(t)] for t in row) for row in prompt_ids]
    tokenizer = _tokenizer(names)
    if tokenizer(prompts[0])["input_ids"] != prompt_ids[0].tolist():
        raise RuntimeError("the toy's tokenizer does not give the task's own token ids")

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=tasks.VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
        pad_token_id=tasks.PAD, eos_token_id=tasks.EOS, bos_token_id=tasks.BOS,
        tie_word_embeddings=False))
    sft_losses = tasks.pretrain_reference(
        dataclasses.replace(task, train_idx=idx), _Logits(model), steps=sft_steps,
        batch_size=64, lr=1e-2, generator=torch.Generator().manual_seed(seed))

    answers = torch.as_tensor(task.answer_tokens(task.operands[idx].sum(axis=1)))
    is_eos = (answers == tasks.EOS).long()
    answer_mask = torch.cumsum(is_eos, 1) - is_eos == 0
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    toy = AdditionToy(prompts=prompts, pairs=pairs, prompt_ids=prompt_ids, answers=answers,
                      answer_mask=answer_mask, tokenizer=tokenizer, model=model,
                      model_dir=folder, p_ref=np.empty(0), sft_losses=list(sft_losses),
                      data_pos=1 - task.error_rate(idx))
    toy.p_ref = toy.exact_pos(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return toy
