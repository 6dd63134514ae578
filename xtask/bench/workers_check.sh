#!/bin/bash
# The scaling model's check (docs/BENCHMARKS.md, "Expert workers: what more
# machines buy"): decode tokens/s of MODEL alone and with its experts on two
# `strata worker`s, each in a network namespace of its own joined to this
# one by a veth pair paced by `tbf` at RATE both ways. Root only.
#
#   xtask/bench/workers_check.sh STRATA MODEL RATE NEW_TOKENS REPS
#   e.g. xtask/bench/workers_check.sh target/debug/strata /tmp/q30 1gbit 24 2
set -euo pipefail
strata=$(realpath "$1") model=$2 rate=$3 new_tokens=$4 reps=$5
export STRATA_WORKER_KEY=${STRATA_WORKER_KEY:-workers-check-key-0123456789}
logs=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for i in 0 1; do ip netns del "wchk$i" 2>/dev/null || true; done
    rm -rf "$logs"
}
trap cleanup EXIT
addrs=()
for i in 0 1; do
    ns=wchk$i outer=wchk${i}o inner=wchk${i}i subnet=10.88.$((i + 1))
    ip netns add "$ns"
    ip link add "$outer" type veth peer name "$inner"
    ip link set "$inner" netns "$ns"
    ip addr add "$subnet.254/24" dev "$outer"
    ip link set "$outer" up
    ip -n "$ns" addr add "$subnet.1/24" dev "$inner"
    ip -n "$ns" link set "$inner" up
    ip -n "$ns" link set lo up
    # Without segmentation offloads tbf paces packet by packet, as a NIC does.
    ethtool -K "$outer" tso off gso off gro off >/dev/null 2>&1 || true
    ip netns exec "$ns" ethtool -K "$inner" tso off gso off gro off >/dev/null 2>&1 || true
    tc qdisc replace dev "$outer" root tbf rate "$rate" burst 15000 latency 50ms
    tc -n "$ns" qdisc replace dev "$inner" root tbf rate "$rate" burst 15000 latency 50ms
    ip netns exec "$ns" "$strata" worker "$model" --listen "$subnet.1:7447" --shard "$i/2" --threads 1 \
        2>"$logs/worker$i" &
    pids+=($!)
    addrs+=("$subnet.1:7447")
done
for i in 0 1; do
    until grep -q "strata: worker:" "$logs/worker$i"; do
        kill -0 "${pids[$i]}" || { cat "$logs/worker$i"; exit 1; }
        sleep 0.2
    done
done
# One run's decode tokens/s, median step and median wait on the workers
# (`stall_ms`) a step, and a digest of its tokens (they must not change).
decode() {
    "$strata" generate "$model" --tokens 1,5,9 --max-new-tokens "$new_tokens" --ignore-eos --temperature 0 \
        --json --threads 2 "$@" 2>/dev/null | tail -1 | python3 -c '
import json, statistics, sys, zlib
run = json.loads(sys.stdin.read())
stats = run["stats"]
steps = stats["per_token"][1:]
step_ms = statistics.median(step["ms"] for step in steps)
wait_ms = statistics.median(step["stall_ms"] for step in steps)
digest = zlib.crc32(str(run["tokens"]).encode())
print("%.2f tok/s, step %.0f ms, waiting %.1f ms, tokens %08x" % (stats["decode_tokens_per_s"], step_ms, wait_ms, digest))'
}
workers=$(IFS=,; echo "${addrs[*]}")
for rep in $(seq "$reps"); do
    echo "alone $rep: $(decode)"
    echo "workers $rep: $(decode --workers "$workers")"
done
