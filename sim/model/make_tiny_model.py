"""SIMULATION: make the tiny random-weight Qwen3 model that the simulated cluster serves.

Runs INSIDE the vllm-sim image (so the tokenizer and weights come from that image's
tokenizers, transformers and torch) and writes a plain save_pretrained folder:

    python make_tiny_model.py /out

Deterministic: a fixed corpus, a fixed seed, float32. Stands in for a real checkpoint
(e.g. Qwen3.5-122B on real Sparks); it has the real architecture family and a real chat
template, but its weights are random, so its answers are gibberish by design.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    trainers,
)
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SEED = 1234
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The DGX Spark is a small computer with one GB10 chip and unified memory.",
    "Two Spark nodes are linked by a ConnectX-7 cable and run one Ray cluster.",
    "vLLM serves a language model with tensor parallelism across both nodes.",
    "Hello! How can I help you today? Please tell me what you need.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Ray schedules one worker per GPU and the model shards follow the workers.",
    "A simulated cluster runs the same commands on containers instead of machines.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Punctuation: , . ; : ! ? ( ) [ ] { }",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on CORPUS, with a ChatML-style chat template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    """A random-weight Qwen3 (hidden 128, 2 layers, 6 heads of 64) with a fixed seed.

    Sized to split over 1, 2 or 3 ranks (TP=3 on a 3-node sim, `bench --nodes 3`): the
    heads, the KV heads and the MLP's width divide by 2 and by 3, and so does the
    vocabulary (vLLM pads it to a multiple of 64, then divides it by the TP size)."""
    vocab = -(-len(tokenizer) // 192) * 192  # round up: a multiple of 64 that 2 and 3 divide
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=6,
        head_dim=64,  # the CPU attention kernel rejects small head sizes such as 16
        max_position_embeddings=2048,
        initializer_range=0.1,  # peaked logits: greedy tokens stable across TP sizes
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    return model


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: make_tiny_model.py OUTPUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    model = build_model(tokenizer)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    print(f"SIMULATION tiny model written to {out}: {sorted(p.name for p in out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
