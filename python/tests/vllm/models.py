"""Tiny random-weight models for the vLLM end-to-end tests, made locally (no downloads).

make(kind, path, seed) writes a Hugging Face model directory vLLM's CPU build loads: a
word-level tokenizer over a fixed vocabulary and random weights drawn from `seed`. Two calls
with the same kind and another seed give a model of the same config and shapes whose KV cache
differs: the negative control that proves D used P's KV. Weights are drawn wide so greedy
output is not one repeated token (shared/VLLM.md)."""

import hashlib
import json
import os
import sys

VOCAB = 512
WORDS = ["w%d" % i for i in range(VOCAB - 4)]


def _tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for word in WORDS:
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(path)


def _config(kind, layers):
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                  pad_token_id=3, dtype="bfloat16")
    if kind == "llama":
        return transformers.LlamaConfig(**common, tie_word_embeddings=False)
    if kind == "llama-bench":
        # bench/vllm_pd.sh: 16 KB of KV per token (8 layers, 8 KV heads of 64, bf16), so that
        # a 2,048-token prompt moves 32 MB
        return transformers.LlamaConfig(**dict(common, hidden_size=512, intermediate_size=1024,
                                               num_attention_heads=8, num_key_value_heads=8,
                                               head_dim=64), tie_word_embeddings=False)
    if kind == "gemma2":
        # alternating full and sliding-window layers: two KV cache groups in vLLM
        return transformers.Gemma2Config(**common, sliding_window=64, tie_word_embeddings=True,
                                         final_logit_softcapping=None,
                                         attn_logit_softcapping=None,
                                         query_pre_attn_scalar=32)
    if kind == "deepseek_v2":
        # multi-head latent attention: one latent row per token, kv_lora_rank + rope dims =
        # 576 (DeepSeek-V2/V3's, the only row vLLM's CPU MLA kernel takes); every layer dense
        return transformers.DeepseekV2Config(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
            moe_intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=32,
            qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=1, first_k_dense_replace=layers,
            max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=3,
            dtype="bfloat16", tie_word_embeddings=False)
    if kind == "jamba":
        # a mamba (v1) hybrid: layer 0 mamba, layer 1 attention. vLLM 0.32's CPU build fails
        # its first step (mamba_mixer.py: conv1d.weight.size(2) of a 2-d weight)
        return transformers.JambaConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2,
            attn_layer_offset=1, num_experts=1, expert_layer_period=1, expert_layer_offset=0,
            mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8,
            max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=3,
            dtype="bfloat16", tie_word_embeddings=False, use_mamba_kernels=False)
    if kind == "granitemoehybrid":
        # a mamba2 hybrid: layer 0 mamba2, layer 1 attention, no routed experts
        return transformers.GraniteMoeHybridConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, layer_types=["mamba", "attention"],
            num_local_experts=0, shared_intermediate_size=256, mamba_n_heads=8,
            mamba_n_groups=1, mamba_d_state=16, mamba_d_head=32, mamba_d_conv=4,
            mamba_expand=2, mamba_chunk_size=32, position_embedding_type="rope",
            max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=3,
            dtype="bfloat16", tie_word_embeddings=False)
    raise ValueError("model kind %r: llama, llama-bench, gemma2, deepseek_v2, jamba or "
                     "granitemoehybrid" % kind)


def make(kind, path, seed=0, layers=None):
    """Writes model `kind` with weights from `seed` to `path` (once); returns path."""
    import torch
    import transformers

    layers = layers or (8 if kind == "llama-bench" else 2)
    config = _config(kind, layers)
    # a model made before its kind's config changed is made again
    made = {"kind": kind, "seed": seed, "layers": layers,
            "config": hashlib.sha256(config.to_json_string().encode()).hexdigest()[:16]}
    if os.path.exists(os.path.join(path, "kvx-model.json")):
        with open(os.path.join(path, "kvx-model.json")) as f:
            if json.load(f) == made:
                return path
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                continue
            std = 0.02 if (kind == "gemma2" and "embed" in name) else (0.3 if kind == "gemma2" else 0.2)
            p.normal_(0.0, std)
    model.save_pretrained(path)
    _tokenizer(path)
    with open(os.path.join(path, "kvx-model.json"), "w") as f:
        json.dump(made, f)
    return path


def prompts(lengths, seed=1):
    """One prompt per length (in words = tokens), deterministic."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(n)) for n in lengths]


if __name__ == "__main__":
    make(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)


def prompts_ids(lengths, seed=1):
    """One prompt of token ids per length, deterministic, no special tokens."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB) for _ in range(n)] for n in lengths]
