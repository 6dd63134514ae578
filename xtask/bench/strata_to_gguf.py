"""Write a Strata container of the OLMoE family as a llama.cpp GGUF file.

Used by `cargo xtask bench --peer llama.cpp` so that both engines run the
same weights at the nearest quantization: Strata's q4 preset (routed experts
q4 in groups of 64, other matrices q8 in groups of 32, norms and routers
f32) becomes Q4_0 experts (the same 0.5625 bytes per weight), Q8_0 for the
other matrices and F32 for the rest. Each matrix is dequantized from the
container (`q * scale`) and quantized again with gguf-py's reference
quantizers, one matrix (or one layer's stacked experts) at a time, streaming
into the output, so memory stays at about one stacked expert tensor in f32.

Synthetic containers carry no tokenizer; a placeholder byte-level BPE
vocabulary of the right size is written: the 256 byte tokens of GPT-2's
byte-level alphabet (so any text tokenizes), then `<t256>`, `<t257>`, ...,
and one merge (llama.cpp refuses a BPE vocabulary without merges). Enough
for llama-bench, which feeds token ids.

usage: python strata_to_gguf.py CONTAINER_DIR OUT.gguf
(with the vendored llama.cpp's gguf-py on PYTHONPATH)
"""

import json
import sys
from pathlib import Path

import numpy as np

import gguf

FORMAT_F32, FORMAT_BF16, FORMAT_Q8, FORMAT_Q4 = 0, 1, 2, 3


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def dequantize(raw: memoryview, fmt: int, shape: list[int], scales: memoryview, group: int) -> np.ndarray:
    """One stored matrix as f32 `[rows, cols]` (docs/FORMAT.md, "Storage formats")."""
    rows, cols = shape if len(shape) == 2 else (1, shape[0])
    if fmt == FORMAT_F32:
        return np.frombuffer(raw, dtype="<f4").reshape(rows, cols).copy()
    if fmt == FORMAT_BF16:
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(rows, cols)
    s = np.frombuffer(scales, dtype="<f4").reshape(rows, -1)
    if fmt == FORMAT_Q8:
        q = np.frombuffer(raw, dtype=np.int8).reshape(rows, cols).astype(np.float32)
    elif fmt == FORMAT_Q4:
        packed = np.frombuffer(raw, dtype=np.uint8).reshape(rows, (cols + 1) // 2)
        q = np.empty((rows, packed.shape[1] * 2), dtype=np.float32)
        q[:, 0::2] = (packed & 0x0F).astype(np.float32) - 8.0
        q[:, 1::2] = (packed >> 4).astype(np.float32) - 8.0
        q = q[:, :cols]
    else:
        raise ValueError(f"unknown format ordinal {fmt}")
    return q * np.repeat(s, group, axis=1)[:, :cols]


def main() -> None:
    container, out = Path(sys.argv[1]), Path(sys.argv[2])
    manifest = json.loads((container / "manifest.json").read_text())
    spec = manifest["spec"]
    if spec["family"] != "olmoe":
        raise SystemExit(f"only the olmoe family is supported, not {spec['family']}")
    dense = np.memmap(container / "dense.bin", dtype=np.uint8, mode="r")
    tensors = {t["name"]: t for t in manifest["tensors"]}

    def dense_f32(name: str) -> np.ndarray:
        t = tensors[name]
        raw = memoryview(dense[t["offset_bytes"] : t["offset_bytes"] + t["length_bytes"]])
        sc = memoryview(dense[t["scale_offset_bytes"] : t["scale_offset_bytes"] + t["scale_length_bytes"]])
        return dequantize(raw, t["format"], t["shape"], sc, t["group"] or 1)

    layers = {e["layer"]: e for e in manifest["expert_layers"]}

    def experts_f32(layer: int, proj: str) -> np.ndarray:
        """`[n_expert, rows, cols]` for gate, up or down of one layer."""
        e = layers[layer]
        c = next(c for c in e["components"] if c["proj"] == proj)
        records = np.memmap(container / e["file"], dtype=np.uint8, mode="r")
        out = []
        for x in range(e["num_experts"]):
            base = x * e["record_bytes"]
            raw = memoryview(records[base + c["offset_bytes"] : base + c["offset_bytes"] + c["length_bytes"]])
            sc = memoryview(
                records[base + c["scale_offset_bytes"] : base + c["scale_offset_bytes"] + c["scale_length_bytes"]]
            )
            out.append(dequantize(raw, c["format"], c["shape"], sc, c["group"] or 1))
        return np.stack(out)

    q4, q8, f32 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    # (gguf name, numpy shape, type, producer), in file order.
    plan: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, object]] = []

    def add(name, shape, qtype, produce):
        plan.append((name, tuple(shape), qtype, produce))

    hidden, vocab = spec["hidden_size"], spec["vocab_size"]
    add("token_embd.weight", (vocab, hidden), q8, lambda: dense_f32("model.embed_tokens.weight"))
    for layer in range(spec["num_layers"]):
        p = f"model.layers.{layer}."
        b = f"blk.{layer}."
        for src, dst, qt in [
            ("input_layernorm.weight", "attn_norm.weight", f32),
            ("self_attn.q_proj.weight", "attn_q.weight", q8),
            ("self_attn.k_proj.weight", "attn_k.weight", q8),
            ("self_attn.v_proj.weight", "attn_v.weight", q8),
            ("self_attn.o_proj.weight", "attn_output.weight", q8),
            ("self_attn.q_norm.weight", "attn_q_norm.weight", f32),
            ("self_attn.k_norm.weight", "attn_k_norm.weight", f32),
            ("post_attention_layernorm.weight", "ffn_norm.weight", f32),
            ("mlp.gate.weight", "ffn_gate_inp.weight", f32),
        ]:
            shape = tensors[p + src]["shape"]
            if qt is f32 and len(shape) == 2 and shape[0] == 1:
                shape = [shape[1]]
            add(b + dst, shape, qt, lambda name=p + src, shape=shape: dense_f32(name).reshape(shape))
        e = layers[layer]
        for proj in ["gate", "up", "down"]:
            c = next(c for c in e["components"] if c["proj"] == proj)
            add(f"{b}ffn_{proj}_exps.weight", (e["num_experts"], *c["shape"]), q4,
                lambda layer=layer, proj=proj: experts_f32(layer, proj))
    add("output_norm.weight", (hidden,), f32, lambda: dense_f32("model.norm.weight").reshape(-1))
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    add("output.weight", (vocab, hidden), q8, lambda: dense_f32(head))

    w = gguf.GGUFWriter(out, "olmoe")
    w.add_block_count(spec["num_layers"])
    w.add_context_length(min(spec["max_position_embeddings"], 4096))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(spec["moe"]["intermediate_size"])
    w.add_head_count(spec["num_heads"])
    w.add_head_count_kv(spec["num_kv_heads"])
    w.add_rope_freq_base(spec["rope"]["theta"])
    w.add_layer_norm_rms_eps(spec["rms_norm_eps"])
    w.add_expert_count(spec["moe"]["num_experts"])
    w.add_expert_used_count(spec["moe"]["top_k"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    tokens = byte_tokens() + [f"<t{i}>" for i in range(256, vocab)]
    w.add_token_list(tokens[:vocab])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges([f"{tokens[ord('t')]} {tokens[ord('h')]}"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    for name, shape, qtype, _ in plan:
        byte_shape = shape if qtype is f32 else gguf.quant_shape_to_byte_shape(shape, qtype)
        dtype = np.float32 if qtype is f32 else np.uint8
        nbytes = int(np.prod(byte_shape)) * (4 if qtype is f32 else 1)
        w.add_tensor_info(name, byte_shape, np.dtype(dtype), nbytes, raw_dtype=None if qtype is f32 else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, qtype, produce in plan:
        data = produce().reshape(shape).astype(np.float32)
        w.write_tensor_data(gguf.quants.quantize(data, qtype))
        print(f"{name} {shape} {qtype.name}", file=sys.stderr)
    w.close()


if __name__ == "__main__":
    main()
