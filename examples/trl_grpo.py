"""TRL's GRPOTrainer with rankscope: one experiment per job, its completions ranked by reward.

    torchrun --standalone --nproc_per_node=2 examples/trl_grpo.py

A tiny causal LM and word-level tokenizer are built here (no download), so it runs anywhere on CPU;
put your own model, tokenizer, reward functions and prompts in their place. ``rankscope.trl.instrument``
records the trainer's logged metrics at its global steps, each step's completions as the sample
table ``grpo/completions`` (the 2 best and 2 worst across both processes, with rank and trace),
and the generate / score / train phases of each step as spans and duration metrics. The
experiment's embedded sink prints the global view of each step.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

import rankscope as rs
import rankscope.trl

WORDS = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "sky", "sea"]
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(SPECIAL) + len(WORDS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config)


def blue_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """1 per "blue" in the completion: a reward the tiny policy can move."""
    return [float(c.split().count("blue")) for c in completions]


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [-0.1 * len(c.split()) for c in completions]


def make_trainer(steps: int, output_dir: str) -> GRPOTrainer:
    torch.manual_seed(0)
    prompts = Dataset.from_dict({"prompt": [" ".join(WORDS[i : i + 3]) for i in range(8)]})
    config = GRPOConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        logging_steps=1,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        log_completions=False,
        seed=0,
    )
    return GRPOTrainer(
        model=tiny_model(),
        processing_class=tiny_tokenizer(),
        reward_funcs=[blue_reward, length_reward],
        args=config,
        train_dataset=prompts,
    )


def main(steps: int = 3) -> None:
    rs.init(experiment="grpo-example", role="trainer", backends={"console": {"logging_mode": "global_reduce"}})
    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(steps, out)
        rankscope.trl.instrument(trainer, k=2)
        trainer.train()
    rs.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
