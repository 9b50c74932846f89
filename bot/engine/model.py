"""Writes the tiny Llama model directory the local engine serves with dummy weights.

No weights can be downloaded here, so the engine runs `--load-format dummy` on a model whose
shape we choose: small enough for a 2-core CPU, large enough to behave like a real model
(paged KV cache, chunked prefill, preemption). The tokenizer is byte-level with no merges, so
one ASCII character is exactly one token: prompts of an exact token length can be sent as text.
"""

from __future__ import annotations

import json
from pathlib import Path

SERVED_MODEL_NAME = "tiny-llama"
VOCAB_SIZE = 320
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")

# head_dim 64: the CPU attention kernels crash on head_dim 16.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 259,
}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer_json() -> str:
    """Return a byte-level BPE tokenizer (no merges) serialised as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    byte_to_char = _gpt2_byte_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    # Fill the vocabulary up to VOCAB_SIZE so that every id the dummy model can sample decodes.
    filler = [f"<extra_{i}>" for i in range(VOCAB_SIZE - 256 - len(SPECIAL_TOKENS))]
    tokenizer.add_tokens(filler)
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    return tokenizer.to_str()


def _gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def write_model_dir(path: Path) -> Path:
    """Create (or refresh) the tiny model directory at ``path`` and return it."""
    path.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": json.dumps(CONFIG, indent=2),
        "generation_config.json": json.dumps(
            {"bos_token_id": CONFIG["bos_token_id"], "eos_token_id": CONFIG["eos_token_id"]}
        ),
        "tokenizer.json": build_tokenizer_json(),
        "tokenizer_config.json": json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "model_max_length": CONFIG["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        ),
    }
    for name, text in files.items():
        target = path / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    return path
