"""A tiny Llama-shaped model directory built locally: a word-level tokenizer
from the `tokenizers` package and a config.json. No weights (the scheduler is
a stand-in) and nothing fetched from a hub."""

import json
import os
import sys

WORDS = ["the", "a", "weights", "token", "pause", "update", "continue", "lock",
         "worker", "scheduler", "request", "hello", "world", "one", "two", "three"]


def build(path: str) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    os.makedirs(path, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {word: index for index, word in enumerate(specials + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 4096}, f)
    with open(os.path.join(path, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": len(vocab), "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
            "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "float32", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        }, f)
    return path


if __name__ == "__main__":
    print(build(sys.argv[1]))
