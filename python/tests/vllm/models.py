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
    raise ValueError("model kind %r: llama, llama-bench, gemma2, deepseek_v2, deepseek_v4, "
                     "jamba or granitemoehybrid" % kind)


def _deepseek_v4_config(layers):
    """A tiny DeepSeek-V4 (shared/VLLM.md, "DeepSeek-V4 on CPU"), as the config.json vLLM's
    DeepseekV4Config reads. Sizes the CPU kernels fix: head_dim 512 (448 NoPE + 64 RoPE),
    index_head_dim 128, 64 routed experts (the CPU hash top-k takes 64, 128, 256 or 384).
    Layers: 0 sliding-window only, 1 C4A (compressor of ratio 4 and the lightning indexer),
    2 C128A; layer 0 routes by token hash (tid2eid), the others by score. The yarn table is
    kept small (max_position_embeddings 4096) so the rotary caches stay small."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": VOCAB, "hidden_size": 256, "num_hidden_layers": layers,
        "num_attention_heads": 16, "num_key_value_heads": 1, "head_dim": 512,
        "qk_rope_head_dim": 64, "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 2,
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "n_routed_experts": 64, "n_shared_experts": 1, "num_experts_per_tok": 6,
        "moe_intermediate_size": 64, "num_hash_layers": 1, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "hidden_act": "silu",
        "compress_ratios": ([0, 4, 128] + [0] * layers)[:layers], "sliding_window": 128,
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 1024, "beta_fast": 32,
                         "beta_slow": 1},
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
        "torch_dtype": "bfloat16",
    }


def _deepseek_v4_weights(c):
    """Random weights of config `c` in DeepSeek's checkpoint names (what vLLM's
    DeepseekV4ForCausalLM.load_weights maps: wq_a and wkv fused, w1/w3 stacked, experts
    per index, gate.bias the score-correction bias), drawn from the current torch seed:
    matrices bf16 normal(0, 0.2); norms 1; the fp32 tensors DeepSeek keeps fp32 (attention
    sinks, compressor position biases, the hyper-connection mixers and their scales and
    bases, the router's correction bias) around their neutral values; tid2eid a random
    choice of distinct experts per token. The hyper-connection mixers are drawn wide too
    (std 0.2): at 0.02 the streams' mixing hardly depends on the input, and seed 0 answered
    two of six prompts with 2-token cycles."""
    import torch

    bf16, fp32 = torch.bfloat16, torch.float32
    h, hd = c["hidden_size"], c["head_dim"]
    heads, ql, ol, groups = (c["num_attention_heads"], c["q_lora_rank"], c["o_lora_rank"],
                             c["o_groups"])
    hc, experts, inter = c["hc_mult"], c["n_routed_experts"], c["moe_intermediate_size"]
    mix = (2 + hc) * hc
    w = {}

    def mat(name, *shape):
        w[name] = torch.empty(shape, dtype=fp32).normal_(0.0, 0.2).to(bf16)

    def ones(name, n):
        w[name] = torch.ones(n, dtype=bf16)

    def f32(name, std, *shape, mean=0.0):
        w[name] = torch.empty(shape, dtype=fp32).normal_(mean, std)

    def compressor(prefix, ratio, dim):
        coff = 2 if ratio == 4 else 1  # ratio 4 overlaps its windows: twice the width
        f32(prefix + "ape", 0.2, ratio, coff * dim)
        mat(prefix + "wkv.weight", coff * dim, h)
        mat(prefix + "wgate.weight", coff * dim, h)
        ones(prefix + "norm.weight", dim)

    mat("embed.weight", c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = "layers.%d." % i
        ones(p + "attn_norm.weight", h)
        ones(p + "ffn_norm.weight", h)
        for part in ("attn", "ffn"):
            f32(p + "hc_%s_fn" % part, 0.2, mix, hc * h)
            f32(p + "hc_%s_base" % part, 0.2, mix)
            f32(p + "hc_%s_scale" % part, 0.1, 3, mean=1.0)
        a = p + "attn."
        f32(a + "attn_sink", 1.0, heads)
        mat(a + "wq_a.weight", ql, h)
        ones(a + "q_norm.weight", ql)
        mat(a + "wq_b.weight", heads * hd, ql)
        mat(a + "wkv.weight", hd, h)
        ones(a + "kv_norm.weight", hd)
        mat(a + "wo_a.weight", groups * ol, heads * hd // groups)
        mat(a + "wo_b.weight", h, groups * ol)
        ratio = c["compress_ratios"][i]
        if ratio > 1:
            compressor(a + "compressor.", ratio, hd)
        if ratio == 4:  # C4A: the lightning indexer, with its own compressor
            ih, idim = c["index_n_heads"], c["index_head_dim"]
            mat(a + "indexer.wq_b.weight", ih * idim, ql)
            mat(a + "indexer.weights_proj.weight", ih, h)
            compressor(a + "indexer.compressor.", ratio, idim)
        f = p + "ffn."
        mat(f + "gate.weight", experts, h)
        if i < c["num_hash_layers"]:
            k = c["num_experts_per_tok"]
            w[f + "gate.tid2eid"] = torch.rand(c["vocab_size"], experts).argsort(
                dim=1)[:, :k].to(torch.int32).contiguous()
        else:
            f32(f + "gate.bias", 0.1, experts)
        for e in range(experts):
            mat(f + "experts.%d.w1.weight" % e, inter, h)
            mat(f + "experts.%d.w2.weight" % e, h, inter)
            mat(f + "experts.%d.w3.weight" % e, inter, h)
        shared = inter * c["n_shared_experts"]
        mat(f + "shared_experts.w1.weight", shared, h)
        mat(f + "shared_experts.w2.weight", h, shared)
        mat(f + "shared_experts.w3.weight", shared, h)
    ones("norm.weight", h)
    f32("hc_head_fn", 0.2, hc, hc * h)
    f32("hc_head_base", 0.2, hc)
    f32("hc_head_scale", 0.1, 1, mean=1.0)
    mat("head.weight", c["vocab_size"], h)
    return w


def _make_deepseek_v4(path, seed, layers):
    import torch
    from safetensors.torch import save_file

    config = _deepseek_v4_config(layers)
    # "weights": the version of _deepseek_v4_weights' recipe, so that a model drawn by an
    # older one is made again (the config's hash does not see it)
    made = {"kind": "deepseek_v4", "seed": seed, "layers": layers, "weights": 2,
            "config": hashlib.sha256(json.dumps(config, sort_keys=True).encode()
                                     ).hexdigest()[:16]}
    if os.path.exists(os.path.join(path, "kvx-model.json")):
        with open(os.path.join(path, "kvx-model.json")) as f:
            if json.load(f) == made:
                return path
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(seed)
    save_file(_deepseek_v4_weights(config), os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    _tokenizer(path)
    with open(os.path.join(path, "kvx-model.json"), "w") as f:
        json.dump(made, f)
    return path


def deepseek_v4_missing():
    """Why vLLM 0.32's CPU wheel cannot run DeepSeek-V4 on this CPU, or None when it can: its
    V4 kernels (flash_mla_with_kvcache_cpu, convert_weight_packed, the fused V4 inserts) are
    only in the build it loads where the CPU has AVX512 with bf16 (vllm/_C; vllm/platforms/
    cpu.py import_kernels), not in _C_AVX512 or _C_AVX2: elsewhere the engine dies loading its
    weights ("'_C' object has no attribute 'convert_weight_packed'")."""
    if os.uname().machine != "x86_64":
        return None
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f
                      if line.startswith("flags")), [])
    if "avx512_bf16" in flags:
        return None
    return ("vLLM 0.32's CPU wheel has DeepSeek-V4's kernels only in its AVX512-BF16 build; "
            "this CPU has no avx512_bf16")


def make(kind, path, seed=0, layers=None):
    """Writes model `kind` with weights from `seed` to `path` (once); returns path."""
    if kind == "deepseek_v4":  # not a transformers model: config and weights by hand
        return _make_deepseek_v4(path, seed, layers or 3)
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
