#!/usr/bin/env bash
# netns_link.sh — the communication features where the network is the limit: two "hosts" on
# this machine (two network namespaces joined by a veth pair, each end shaped to RATE with a
# token bucket, tc tbf), one dtrain rank in each (RANK/WORLD_SIZE/MASTER_ADDR as torchrun sets
# them, the tcp ring), configs/ci-smoke.yaml widened to 2 layers of n_embd 256 (1.7M
# parameters: 6.7 MB of fp32 gradients a step), with and without training.grad_comm_dtype bf16
# and training.zero_stage 1. Each variant runs REPEAT times, interleaved; the table gives the
# medians of the median step (steps 2..) and of the time a step waits for collectives.
# Needs root (ip netns), iproute2 (ip, tc). Prints a markdown table.
#   sudo bench/netns_link.sh [BUILD_DIR] [RATE] [REPEAT] [STEPS]    (default: build 1gbit 2 20)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
RATE=${2:-1gbit}
REPEAT=${3:-2}
STEPS=${4:-20}
BIN="$(pwd)/$BUILD/dtrain"
[ "$(id -u)" = 0 ] || { echo "netns_link: needs root (ip netns)" >&2; exit 2; }
id=$(( $$ % 200 + 20 ))
A=dtbenchA$id B=dtbenchB$id VA=dtba$id VB=dtbb$id IPA=10.232.$id.1 IPB=10.232.$id.2
OUT=$(mktemp -d /tmp/netns-link.XXXXXX)
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$A"; ip link set "$VB" netns "$B"
ip -n "$A" addr add "$IPA/24" dev "$VA"; ip -n "$B" addr add "$IPB/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up; ip -n "$B" link set "$VB" up
tc -n "$A" qdisc add dev "$VA" root tbf rate "$RATE" burst 256kb latency 400ms
tc -n "$B" qdisc add dev "$VB" root tbf rate "$RATE" burst 256kb latency 400ms

VARIANTS=("0 fp32" "0 bf16" "1 fp32" "1 bf16")
port=29710
for k in $(seq 1 "$REPEAT"); do
  for v in "${VARIANTS[@]}"; do
    set -- $v
    port=$((port + 1))
    run="$OUT/z$1-$2-$k"
    echo "netns_link: run $k, zero_stage $1, grad_comm_dtype $2 over $RATE ..." >&2
    common=(--config configs/ci-smoke.yaml --quiet --progress never --set run.dir="$run" --set training.num_workers=2
            --set training.communication_backend=tcp --set data.batch_size_per_worker=4 --set training.max_steps="$STEPS"
            --set training.zero_stage="$1" --set training.grad_comm_dtype="$2" --set model.n_layer=2 --set model.n_head=4
            --set model.n_embd=256 --set eval.every_steps=0 --set logging.every_steps=1 --set checkpoint.every_steps=0
            --set training.cpu_threads_per_worker=1 --set training.collective_timeout_s=120)
    ip netns exec "$B" env RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR="$IPA" MASTER_PORT=$port \
      DTRAIN_RDZV_SECRET=netns-link-bench-secret-0123456789 "$BIN" "${common[@]}" >/dev/null 2>"$run.r1.err" &
    b=$!
    ip netns exec "$A" env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR="$IPA" MASTER_PORT=$port \
      DTRAIN_RDZV_SECRET=netns-link-bench-secret-0123456789 "$BIN" "${common[@]}" >/dev/null 2>"$run.r0.err" \
      || { cat "$run.r0.err" >&2; exit 1; }
    wait $b || { cat "$run.r1.err" >&2; exit 1; }
  done
done

python3 - "$OUT" "$REPEAT" "$RATE" <<'PY'
import json, os, statistics, sys
out, repeat, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
med = statistics.median
print(f"| zero_stage | grad_comm_dtype | step ms | waiting for collectives, ms/step | MB sent/step | link |")
print("|---:|---|---:|---:|---:|---|")
for z, d in ((0, "fp32"), (0, "bf16"), (1, "fp32"), (1, "bf16")):
    steps, comm, sent = [], [], []
    for k in range(1, repeat + 1):
        recs = [json.loads(l) for l in open(os.path.join(out, f"z{z}-{d}-{k}", "metrics.jsonl"))]
        train = [r for r in recs if r.get("type") == "train"][1:]
        steps.append(med(r["step_ms"] for r in train))
        comm.append(med(r["comm_ms"] for r in train))
        sent.append([r for r in recs if r.get("type") == "summary"][0]["sent_bytes_per_step"])
    print(f"| {z} | {d} | {med(steps):.0f} | {med(comm):.1f} | {med(sent) / 1e6:.2f} | {rate} |")
PY
