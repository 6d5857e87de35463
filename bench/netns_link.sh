#!/usr/bin/env bash
# netns_link.sh — the communication features where the network is the limit: two "hosts" on
# this machine (two network namespaces joined by a veth pair, each end shaped to RATE with a
# token bucket, tc tbf), one dtrain rank in each (RANK/WORLD_SIZE/MASTER_ADDR as torchrun sets
# them, the tcp ring), configs/ci-smoke.yaml widened to 2 layers of n_embd 256 (1.7M
# parameters: 6.7 MB of fp32 gradients a step), with and without training.grad_comm_dtype bf16
# and training.zero_stage 1. With PER_HOST 2, two ranks on each host (host names dtrain-host-A
# and -B) and the flat tcp ring against the hierarchical collective (hierarchical_allreduce off
# and auto). Each variant runs REPEAT times, interleaved; the table gives the medians of the
# median step (steps 2..), of the time a step waits for collectives, of the bytes a worker sent
# and of those all workers sent between the hosts.
# Needs root (ip netns), iproute2 (ip, tc) and unshare. Prints a markdown table.
#   sudo bench/netns_link.sh [BUILD_DIR] [RATE] [REPEAT] [STEPS] [PER_HOST]   (default: build 1gbit 2 20 1)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
RATE=${2:-1gbit}
REPEAT=${3:-2}
STEPS=${4:-20}
PER_HOST=${5:-1}
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

if [ "$PER_HOST" = 1 ]; then VARIANTS=("0 fp32 off" "0 bf16 off" "1 fp32 off" "1 bf16 off")
else VARIANTS=("0 fp32 off" "0 fp32 auto" "0 bf16 off" "0 bf16 auto"); fi
W=$((2 * PER_HOST))
port=29710
for k in $(seq 1 "$REPEAT"); do
  for v in "${VARIANTS[@]}"; do
    set -- $v
    port=$((port + 1))
    run="$OUT/z$1-$2-$3-$k"
    echo "netns_link: run $k, zero_stage $1, grad_comm_dtype $2, hierarchical_allreduce $3, $W ranks over $RATE ..." >&2
    common="--config configs/ci-smoke.yaml --quiet --progress never --set run.dir=$run --set training.num_workers=$W \
      --set training.communication_backend=tcp --set data.batch_size_per_worker=4 --set training.max_steps=$STEPS \
      --set training.zero_stage=$1 --set training.grad_comm_dtype=$2 --set training.hierarchical_allreduce=$3 \
      --set model.n_layer=2 --set model.n_head=4 --set model.n_embd=256 --set eval.every_steps=0 \
      --set logging.every_steps=1 --set checkpoint.every_steps=0 --set training.cpu_threads_per_worker=1 \
      --set training.collective_timeout_s=120"
    pids=()
    for r in $(seq $((W - 1)) -1 0); do
      ns=$A; host=A
      [ "$r" -ge "$PER_HOST" ] && ns=$B && host=B
      ip netns exec "$ns" unshare --uts sh -c "hostname dtrain-host-$host && exec env RANK=$r WORLD_SIZE=$W \
        LOCAL_RANK=$((r % PER_HOST)) LOCAL_WORLD_SIZE=$PER_HOST MASTER_ADDR=$IPA MASTER_PORT=$port \
        DTRAIN_RDZV_SECRET=netns-link-bench-secret-0123456789 $BIN $common" >/dev/null 2>"$run.r$r.err" &
      pids+=($!)
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || { cat "$run".r*.err >&2; exit 1; }; done
  done
done

python3 - "$OUT" "$REPEAT" "$RATE" "$PER_HOST" <<'PY'
import json, os, statistics, sys
out, repeat, rate, per_host = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
med = statistics.median
variants = ([(0, "fp32", "off"), (0, "bf16", "off"), (1, "fp32", "off"), (1, "bf16", "off")] if per_host == 1 else
            [(0, "fp32", "off"), (0, "fp32", "auto"), (0, "bf16", "off"), (0, "bf16", "auto")])
print("| ranks | zero_stage | grad_comm_dtype | hierarchical_allreduce | step ms | waiting for collectives, ms/step "
      "| MB sent/step (a worker) | MB/step between hosts (all) | link |")
print("|---:|---:|---|---|---:|---:|---:|---:|---|")
for z, d, h in variants:
    steps, comm, sent, remote = [], [], [], []
    for k in range(1, repeat + 1):
        recs = [json.loads(l) for l in open(os.path.join(out, f"z{z}-{d}-{h}-{k}", "metrics.jsonl"))]
        train = [r for r in recs if r.get("type") == "train"][1:]
        steps.append(med(r["step_ms"] for r in train))
        comm.append(med(r["comm_ms"] for r in train))
        summ = [r for r in recs if r.get("type") == "summary"][0]
        sent.append(summ["sent_bytes_per_step"])
        remote.append(summ.get("remote_bytes_per_step", 0))
    print(f"| {2 * per_host} | {z} | {d} | {h} | {med(steps):.0f} | {med(comm):.1f} | {med(sent) / 1e6:.2f} | "
          f"{med(remote) / 1e6:.2f} | {rate} |")
PY
