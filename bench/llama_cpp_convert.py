#!/usr/bin/env python3
"""Converts a DeepSeek-V4 checkpoint in the official format into llama.cpp's
`deepseek4` GGUF, for bench/vs_llama_cpp.sh.

It writes what llama.cpp's own convert_hf_to_gguf.py writes for this
architecture: FP8 e4m3 128x128-block matrices dequantized and requantized to
Q8_0, the FP4 routed experts repacked losslessly into MXFP4 (the same codes
and e8m0 scales, only the nibble order moves), BF16 matrices kept in BF16,
vectors in F32, the MTP block left out. It needs only numpy and llama.cpp's
gguf-py: that converter imports torch's float8 types, which Debian 12's
torch (1.13) does not have, and transformers, which Debian does not package.

Usage: llama_cpp_convert.py GGUF_PY_DIR CHECKPOINT_DIR OUT.gguf
"""
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, sys.argv[1])
import gguf  # noqa: E402
from gguf.utility import SafetensorsLocal  # noqa: E402

checkpoint = Path(sys.argv[2])
out_path = Path(sys.argv[3])
config = json.load(open(checkpoint / "config.json"))

tensors = {}
for shard in sorted(checkpoint.glob("*.safetensors")):
    tensors.update(SafetensorsLocal(shard).tensors)


def e4m3_values():
    values = np.zeros(256, np.float32)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exponent, mantissa = (byte >> 3) & 15, byte & 7
        if exponent == 15 and mantissa == 7:
            values[byte] = np.nan
        elif exponent == 0:
            values[byte] = sign * mantissa / 8 * 2.0**-6
        else:
            values[byte] = sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    return values


E4M3 = e4m3_values()


def stored(name):
    tensor = tensors[name]
    return tensor.mmap_bytes(), tensor.dtype, tensor.shape


def as_float(name):
    data, dtype, shape = stored(name)
    if dtype == "F32":
        return data.view(np.float32).reshape(shape)
    if dtype == "BF16":
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    raise ValueError(f"{name}: {dtype} is not a float type")


def dequantize_fp8(weight_name, scale_name):
    weight, _, shape = stored(weight_name)
    scale, _, scale_shape = stored(scale_name)
    values = E4M3[weight].reshape(shape)
    scales = np.exp2(scale.astype(np.float32) - 127.0).reshape(scale_shape)
    scales = np.repeat(np.repeat(scales, 128, 0)[: shape[0]], 128, 1)[:, : shape[1]]
    return values * scales


def mxfp4_blocks(weight_name, scale_name):
    # Official: byte k of a 32-column block holds element 2k (low nibble) and
    # 2k + 1 (high). ggml's block_mxfp4: the scale byte, then 16 bytes where
    # byte j holds element j (low) and j + 16 (high).
    packed, _, shape = stored(weight_name)
    scale, _, _ = stored(scale_name)
    rows, packed_cols = shape
    blocks = packed_cols * 2 // 32
    pairs = packed.reshape(rows, blocks, 16)
    codes = np.stack((pairs & 15, pairs >> 4), axis=-1).reshape(rows, blocks, 32)
    nibbles = (codes[:, :, :16] | (codes[:, :, 16:] << 4)).astype(np.uint8)
    return np.concatenate((scale.reshape(rows, blocks, 1), nibbles), axis=2).reshape(rows, blocks * 17)


writer = gguf.GGUFWriter(str(out_path), "deepseek4")
layers = config["num_hidden_layers"]
writer.add_block_count(layers)
writer.add_context_length(config["max_position_embeddings"])
writer.add_embedding_length(config["hidden_size"])
writer.add_head_count(config["num_attention_heads"])
writer.add_head_count_kv(config["num_key_value_heads"])
rope = config["rope_scaling"]
writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
writer.add_rope_scaling_factor(rope["factor"])
writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
writer.add_rope_freq_base(config["rope_theta"])
writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
writer.add_expert_count(config["n_routed_experts"])
writer.add_expert_used_count(config["num_experts_per_tok"])
writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SQRTSOFTPLUS)
writer.add_key_length(config["head_dim"])
writer.add_value_length(config["head_dim"])
writer.add_rope_dimension_count(config["qk_rope_head_dim"])
writer.add_q_lora_rank(config["q_lora_rank"])
writer.add_sliding_window(config["sliding_window"])
writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
writer.add_expert_shared_count(config["n_shared_experts"])
writer.add_expert_weights_scale(config["routed_scaling_factor"])
writer.add_expert_weights_norm(config["norm_topk_prob"])
writer.add_swiglu_clamp_exp([config["swiglu_limit"]] * layers)
writer.add_swiglu_clamp_shexp([config["swiglu_limit"]] * layers)
writer.add_indexer_head_count(config["index_n_heads"])
writer.add_indexer_key_length(config["index_head_dim"])
writer.add_indexer_top_k(config["index_topk"])
writer.add_attention_output_group_count(config["o_groups"])
writer.add_attention_output_lora_rank(config["o_lora_rank"])
writer.add_attention_compress_ratios(config["compress_ratios"][:layers])
writer.add_attention_compress_rope_freq_base(config["compress_rope_theta"])
writer.add_hyper_connection_count(config["hc_mult"])
writer.add_hyper_connection_sinkhorn_iterations(config["hc_sinkhorn_iters"])
writer.add_hyper_connection_epsilon(config["hc_eps"])
writer.add_hash_layer_count(config["num_hash_layers"])
writer.add_embedding_length_out(config["hidden_size"] * config["hc_mult"])
writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)

# The byte-level BPE vocabulary, merges and special tokens.
tokenizer = json.load(open(checkpoint / "tokenizer.json"))
vocab = dict(tokenizer["model"]["vocab"])
added = {token["content"]: token for token in tokenizer.get("added_tokens", [])}
for content, token in added.items():
    vocab[content] = token["id"]
by_id = {token_id: text for text, token_id in vocab.items()}
texts, types = [], []
for token_id in range(config["vocab_size"]):
    text = by_id.get(token_id)
    if text is None:
        texts.append(f"[PAD{token_id}]")
        types.append(gguf.TokenType.UNUSED)
        continue
    texts.append(text)
    if text in added:
        types.append(gguf.TokenType.CONTROL if added[text].get("special") else gguf.TokenType.USER_DEFINED)
    else:
        types.append(gguf.TokenType.NORMAL)
writer.add_tokenizer_model("gpt2")
writer.add_tokenizer_pre("deepseek-v3")
writer.add_token_list(texts)
writer.add_token_types(types)
gguf.SpecialVocab(checkpoint, load_merges=True).add_to_gguf(writer)

ROOT_TENSORS = {
    "embed.weight": "TOKEN_EMBD", "norm.weight": "OUTPUT_NORM", "head.weight": "OUTPUT",
    "hc_head_fn": "HC_HEAD_FN", "hc_head_base": "HC_HEAD_BASE", "hc_head_scale": "HC_HEAD_SCALE",
}
LAYER_TENSORS = {
    "hc_attn_fn": "HC_ATTN_FN", "hc_attn_base": "HC_ATTN_BASE", "hc_attn_scale": "HC_ATTN_SCALE",
    "hc_ffn_fn": "HC_FFN_FN", "hc_ffn_base": "HC_FFN_BASE", "hc_ffn_scale": "HC_FFN_SCALE",
    "attn.attn_sink": "ATTN_SINKS", "attn.wq_a.weight": "ATTN_Q_A", "attn.wq_b.weight": "ATTN_Q_B",
    "attn.q_norm.weight": "ATTN_Q_A_NORM", "attn.wkv.weight": "ATTN_KV", "attn.kv_norm.weight": "ATTN_KV_NORM",
    "attn.wo_a.weight": "ATTN_OUT_A", "attn.wo_b.weight": "ATTN_OUT_B",
    "attn.compressor.ape": "ATTN_COMPRESSOR_APE", "attn.compressor.wkv.weight": "ATTN_COMPRESSOR_WKV",
    "attn.compressor.wgate.weight": "ATTN_COMPRESSOR_WGATE", "attn.compressor.norm.weight": "ATTN_COMPRESSOR_NORM",
    "attn.indexer.wq_b.weight": "INDEXER_ATTN_Q_B", "attn.indexer.weights_proj.weight": "INDEXER_PROJ",
    "attn.indexer.compressor.ape": "INDEXER_COMPRESSOR_APE",
    "attn.indexer.compressor.wkv.weight": "INDEXER_COMPRESSOR_WKV",
    "attn.indexer.compressor.wgate.weight": "INDEXER_COMPRESSOR_WGATE",
    "attn.indexer.compressor.norm.weight": "INDEXER_COMPRESSOR_NORM",
    "attn_norm.weight": "ATTN_NORM", "ffn_norm.weight": "FFN_NORM", "ffn.gate.weight": "FFN_GATE_INP",
    "ffn.gate.bias": "FFN_EXP_PROBS_B",
    "ffn.shared_experts.w1.weight": "FFN_GATE_SHEXP", "ffn.shared_experts.w2.weight": "FFN_DOWN_SHEXP",
    "ffn.shared_experts.w3.weight": "FFN_UP_SHEXP",
}


def gguf_name(kind, layer, suffix=".weight"):
    return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]].format(bid=layer) + suffix


def add(name, kind, layer, suffix=".weight"):
    data, dtype, shape = stored(name)
    target = gguf_name(kind, layer, suffix)
    if dtype == "F8_E4M3":
        values = dequantize_fp8(name, name.removesuffix(".weight") + ".scale")
        writer.add_tensor(target, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    elif dtype == "BF16" and len(shape) >= 2:
        writer.add_tensor(target, data.view(np.uint16).reshape(shape).copy(), raw_dtype=gguf.GGMLQuantizationType.BF16)
    elif dtype in ("F32", "BF16"):
        writer.add_tensor(target, np.ascontiguousarray(as_float(name)))
    else:
        raise ValueError(f"{name}: unexpected dtype {dtype}")


INTEGER_TYPES = {"I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8}
for name in sorted(tensors):
    if name.endswith(".scale") or name.startswith("mtp."):
        continue
    if name in ROOT_TENSORS:
        add(name, ROOT_TENSORS[name], None)
        continue
    match = re.match(r"layers\.(\d+)\.(.+)$", name)
    if match is None:
        raise ValueError(f"unexpected tensor {name}")
    layer, rest = int(match.group(1)), match.group(2)
    if rest.startswith("ffn.experts."):
        continue  # below, stacked per layer
    if rest == "ffn.gate.tid2eid":
        data, dtype, shape = stored(name)
        table = data.view(INTEGER_TYPES[dtype]).reshape(shape).astype(np.int32)
        writer.add_tensor(gguf_name("FFN_GATE_TID2EID", layer), table)
        continue
    if rest == "ffn.gate.bias" and layer < config["num_hash_layers"]:
        continue  # hash layers route by token id; llama.cpp does not load it
    add(name, LAYER_TENSORS[rest], layer, ".bias" if rest == "ffn.gate.bias" else ".weight")

for layer in range(layers):
    for projection, kind in (("w1", "FFN_GATE_EXP"), ("w2", "FFN_DOWN_EXP"), ("w3", "FFN_UP_EXP")):
        prefix = f"layers.{layer}.ffn.experts"
        stacked = np.stack([
            mxfp4_blocks(f"{prefix}.{expert}.{projection}.weight", f"{prefix}.{expert}.{projection}.scale")
            for expert in range(config["n_routed_experts"])
        ])
        writer.add_tensor(gguf_name(kind, layer), stacked, raw_dtype=gguf.GGMLQuantizationType.MXFP4)

writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file(progress=False)
writer.close()
print(f"wrote {out_path}")
