#!/usr/bin/env bash
# One lent GPU's quarter hour, as one prepared command (about 6 minutes on an H200): the kernel table, where a real
# step's time goes (experiments.kernels.gpu_step), and the collector's rows of the same plans. Every part is cut by
# its own timeout so that one hung part keeps the others; what comes back is under $OUT (at most 8 files).
#   bash experiments/kernels/gpu_session.sh          # in the repository root on the GPU machine; OUT defaults to /tmp/out
# The collector needs pydantic there: wheels in .whl/ (see the device README) are installed first when present.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
} 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 500 > "$OUT/smi.csv" 2>&1 &
smi=$!
day=$(date +%Y%m%d)
sweep=collect/sweeps/gpu-h200-playbook.yaml
echo "== kernel table $(date +%T)"
timeout 230 python3 -m collect kernels --out "$OUT/h200-sxm-$day.json" --device cuda --budget-s 200 2>&1 | tail -12
echo "== gpu_step $(date +%T)"
timeout 170 python3 -m torch.distributed.run --nproc_per_node 1 -m experiments.kernels.gpu_step --sweep $sweep \
  --out "$OUT/gpu_step.json" --sustained 2>&1 | grep -v -e USDT -e "^\[W" | tail -12
echo "== sweep $(date +%T)"
timeout 170 python3 -m torch.distributed.run --nproc_per_node 1 -m collect sweep $sweep 2>&1 | tail -15
cp data/runs/gpu-h200-playbook-v1.parquet "$OUT/" 2>/dev/null || cp data/runs/gpu-h200-playbook-v1.journal.jsonl "$OUT/"
fingerprint=$(ls -t data/hardware/*.json | head -1)
cp "$fingerprint" "$OUT/"
kill $smi
echo "== done $(date +%T): $(ls "$OUT" | tr '\n' ' ')"
