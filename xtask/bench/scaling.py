#!/usr/bin/env python3
"""Tokens/s of one decode stream with a model's routed experts spread over
M machines (docs/BENCHMARKS.md, "Expert workers: what more machines buy").

The model, per token (one stream, decode):

    t_token = t_dense + L_moe * t_layer
    t_dense = dense_bytes / (eta_dram * dram)            on the coordinator
    t_layer = max_j(n_j) * expert_bytes / (eta * bw)      M = 1
    t_layer = o(msg) + out/rate + max_j(n_j) * expert_bytes / (eta * bw)
              + back/rate                                 M > 1

n_j: the routed experts of the token that machine j holds (expert e on
machine e mod M; max_j taken over random top-k routings, as the synthetic
routers give); bw: DRAM (resident) or the drive (streaming, every routed
expert read: no cache hits); out = (M-1) hidden rows of f32, back = the
remote experts' output rows (k (M-1)/M of them), both on the coordinator's
link; o(msg): Zenoh's measured round trip less its wire time, fitted
linearly in the message's bytes (docs/DISTRIBUTED.md's table). The
coordinator holds shard 0 itself (a worker beside it).

Standard library only: python3 xtask/bench/scaling.py
"""

import random

KIB = 1024
GB = 1e9

# This machine's measured limits and ratios (docs/BENCHMARKS.md,
# 2026-11-30): DRAM read on 2 threads, O_DIRECT read of the expert files,
# resident decode at 0.87 of the DRAM bound, streaming `--io direct` at
# 0.8 of the drive's (0.42-1.11 over the days measured).
DRAM_BYTES_PER_S = 30.4 * GB
DRIVE_BYTES_PER_S = 1.29 * GB
ETA_DRAM = 0.87
ETA_DRIVE = 0.8

# Zenoh peer/queryable medians (docs/DISTRIBUTED.md, measured beside seven
# builds): (request KiB, reply KiB, median s) per link rate in bit/s.
ZENOH_ROUND_TRIPS = {
    1e9: [(8, 32, 928e-6), (24, 96, 1996e-6), (24, 192, 4324e-6)],
    10e9: [(8, 32, 465e-6), (24, 96, 763e-6), (24, 192, 1614e-6)],
}

# Shapes: hidden width, MoE layers, routed experts per layer, experts per
# token, bytes of one routed expert, dense bytes one token reads.
Q4_BYTES_PER_PARAM = 18 / 32  # 32 4-bit weights and an f16 scale
MXFP4_BYTES_PER_PARAM = 17 / 32  # 32 4-bit weights and an 8-bit scale
SHAPES = {
    # GLM-5.x (744B): 78 layers, the first 3 dense, 256 experts of
    # 3 x 6144 x 2048, top 8; ~17.4B dense parameters a token reads.
    "GLM-5.x": dict(
        hidden=6144,
        moe_layers=75,
        experts=256,
        top_k=8,
        expert_bytes=3 * 6144 * 2048 * Q4_BYTES_PER_PARAM,
        dense_bytes=17.4e9 * Q4_BYTES_PER_PARAM,
    ),
    # Kimi-K3 (2.8T; its config is not public, docs/kimi_k3.md): Kimi K2's
    # layer shapes (hidden 7168, experts 3 x 7168 x 2048, top 8, ~0.17B
    # dense parameters a layer) over 93 layers, 92 of them MoE, with 688
    # MXFP4 experts each, which makes 2.8T.
    "Kimi-K3": dict(
        hidden=7168,
        moe_layers=92,
        experts=688,
        top_k=8,
        expert_bytes=3 * 7168 * 2048 * MXFP4_BYTES_PER_PARAM,
        dense_bytes=17e9 * Q4_BYTES_PER_PARAM,
    ),
}
MACHINES = [1, 2, 4, 8]
LINKS = {"1 GbE": 1e9, "10 GbE": 10e9}


def overhead_fit(rate):
    """o(bytes) = a + b * bytes: least squares over the measured rows, each
    less its wire time at `rate`."""
    points = [((req + rep) * KIB, median - (req + rep) * KIB * 8 / rate) for req, rep, median in ZENOH_ROUND_TRIPS[rate]]
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return lambda message_bytes: mean_y + slope * (message_bytes - mean_x)


def mean_max_share(experts, top_k, machines, draws=20000):
    """The mean over random routings of the most routed experts one machine
    holds (expert e on machine e mod machines)."""
    rng = random.Random(1)
    total = 0
    for _ in range(draws):
        counts = [0] * machines
        for expert in rng.sample(range(experts), top_k):
            counts[expert % machines] += 1
        total += max(counts)
    return total / draws


def token_seconds(shape, machines, expert_bytes_per_s, rate):
    """(seconds a token, the network's share of them)."""
    row_bytes = 4 * shape["hidden"]
    t_dense = shape["dense_bytes"] / (ETA_DRAM * DRAM_BYTES_PER_S)
    busiest = mean_max_share(shape["experts"], shape["top_k"], machines)
    t_experts = busiest * shape["expert_bytes"] / expert_bytes_per_s
    t_network = 0.0
    if machines > 1:
        out_bytes = (machines - 1) * row_bytes
        back_bytes = shape["top_k"] * (machines - 1) / machines * row_bytes
        message_bytes = row_bytes + shape["top_k"] / machines * row_bytes
        t_network = overhead_fit(rate)(message_bytes) + (out_bytes + back_bytes) * 8 / rate
    total = t_dense + shape["moe_layers"] * (t_network + t_experts)
    return total, shape["moe_layers"] * t_network / total


def main():
    modes = {
        "RAM-resident": ETA_DRAM * DRAM_BYTES_PER_S,
        "streaming": ETA_DRIVE * DRIVE_BYTES_PER_S,
    }
    print("| model | experts | link | " + " | ".join(f"{m} machine{'s' if m > 1 else ''}" for m in MACHINES) + " |")
    print("|---|---|---|" + "---|" * len(MACHINES))
    for name, shape in SHAPES.items():
        expert_gb = shape["moe_layers"] * shape["experts"] * shape["expert_bytes"] / GB
        for mode, expert_bytes_per_s in modes.items():
            for link, rate in LINKS.items():
                cells = []
                for machines in MACHINES:
                    seconds, network_share = token_seconds(shape, machines, expert_bytes_per_s, rate)
                    cell = f"{1 / seconds:.3g}"
                    if machines > 1:
                        cell += f" ({network_share:.0%} net)"
                    cells.append(cell)
                experts = f"{mode}, {expert_gb:.0f} GB"
                print(f"| {name} | {experts} | {link} | " + " | ".join(cells) + " |")
    check = dict(hidden=2048, top_k=8)
    for link, rate in LINKS.items():
        # The check: both workers remote, the coordinator computing none.
        row_bytes = 4 * check["hidden"]
        out_bytes, back_bytes = 2 * row_bytes, check["top_k"] * row_bytes
        message_bytes = row_bytes + check["top_k"] / 2 * row_bytes
        t_network = overhead_fit(rate)(message_bytes) + (out_bytes + back_bytes) * 8 / rate
        print(f"check, Qwen3-30B-A3B shape, 2 remote workers, {link}: {t_network * 1e3:.2f} ms a MoE layer")


if __name__ == "__main__":
    main()
