"""A tiny causal LM, a word-level tokenizer and GRPOTrainer builders, all offline.

The model is a one-layer Llama with random weights, saved to a temporary folder
so that ``GRPOTrainer`` can load its reference model from the path as it does
for a Hub model (with ``beta > 0`` it reloads the policy's checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

WORDS = ["<pad>", "<eos>", "<bos>", "say", "reply", "with", "A", "B", "C", "D",
         "add", "+", "=", "0", "1", "2", "3", "4"]
PAD, EOS, BOS = 0, 1, 2


def tokenizer():
    """A word-level tokenizer of :data:`WORDS`, wrapped as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)},
                                      unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", padding_side="left")


def save_model(folder: Path, seed: int = 0, hidden: int = 16) -> str:
    """A random one-layer Llama and the tokenizer saved in ``folder``; returns its path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, pad_token_id=PAD, eos_token_id=EOS,
                         bos_token_id=BOS, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def grpo_config(out: Path, **settings: Any):
    """A CPU ``GRPOConfig`` that reports nowhere and saves nothing; ``settings`` override."""
    from trl import GRPOConfig

    base = dict(output_dir=str(out), per_device_train_batch_size=4, num_generations=4,
                max_completion_length=4, report_to=[], use_cpu=True, bf16=False,
                save_strategy="no", disable_tqdm=True, logging_strategy="no", seed=0,
                dataloader_num_workers=0)
    return GRPOConfig(**{**base, **settings})


def trainer(model_path: str, out: Path, reward_funcs, dataset=None, callbacks=None, **settings):
    """A ``GRPOTrainer`` on the saved tiny model."""
    from datasets import Dataset
    from trl import GRPOTrainer

    if dataset is None:
        dataset = Dataset.from_dict({"prompt": ["say A"] * 4, "target": [1] * 4})
    return GRPOTrainer(model=model_path, reward_funcs=reward_funcs,
                       args=grpo_config(out, **settings), train_dataset=dataset,
                       processing_class=tokenizer(), callbacks=callbacks)


def target_reward(prompts, completions, target, **_):
    """Reward = the dataset's ``target`` column: the test decides every reward."""
    return [float(t) for t in target]
