"""Reference side of tests/transformers.rs (needs torch + transformers 5.x).

make OUT            tiny random olmoe / qwen3_moe / mixtral models saved with
                    save_pretrained twice (published per-expert names, and
                    save_original_format=False: fused 3-D experts), reference
                    logits (float32 .npy) and token ids (int64 .npy).
check OUT FAM DIR TOL
                    load DIR with AutoModelForCausalLM.from_pretrained, compare
                    its logits with OUT/FAM/ref.npy (max abs diff <= TOL), and
                    check OUT/FAM/rust.npy (written by strata's npy writer)
                    equals the reference.
"""

import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, MixtralConfig, OlmoeConfig, Qwen3MoeConfig

IDS = [1, 5, 9, 3, 7, 2, 8, 4, 11, 6]


def configs():
    common = dict(vocab_size=48, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  num_experts_per_tok=2, initializer_range=0.2, max_position_embeddings=128)
    return {
        "olmoe": OlmoeConfig(intermediate_size=24, num_hidden_layers=2, num_experts=4,
                             clip_qkv=3.0, norm_topk_prob=True, eos_token_id=2, **common),
        "qwen3_moe": Qwen3MoeConfig(intermediate_size=40, moe_intermediate_size=20, num_hidden_layers=3,
                                    num_experts=4, head_dim=12, mlp_only_layers=[1], attention_bias=True,
                                    tie_word_embeddings=True, norm_topk_prob=True, **common),
        "mixtral": MixtralConfig(intermediate_size=24, num_hidden_layers=2, num_local_experts=4,
                                 rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                 **common),
    }


def logits(model):
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float().numpy()


def make(out):
    np.save(f"{out}/ids.npy", np.array(IDS, dtype=np.int64))
    for i, (fam, cfg) in enumerate(configs().items()):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        model.save_pretrained(f"{out}/{fam}/hf")
        model.save_pretrained(f"{out}/{fam}/hf-fused", save_original_format=False)
        np.save(f"{out}/{fam}/ref.npy", logits(model))


def check(out, fam, export_dir, tol):
    ref = np.load(f"{out}/{fam}/ref.npy")
    rust = np.load(f"{out}/{fam}/rust.npy")
    assert rust.dtype == np.float32 and np.array_equal(rust, ref), "npy writer mismatch"
    model = AutoModelForCausalLM.from_pretrained(export_dir).eval()
    got = logits(model)
    diff = float(np.abs(got - ref).max())
    print(f"{fam} {export_dir}: max |logits diff| = {diff:.3g} (scale {float(np.abs(ref).max()):.3g}, tol {tol})")
    if not diff <= tol:
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
