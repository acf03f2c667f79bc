#!/bin/bash
# The device run, from inside .gpusnap (HEAD + this session's collector fixes): fingerprint + sweep under torchrun,
# then the new data/runs and data/hardware files into $OUT/gpu-data.tgz. Usage: OUT=... bash gpu_run.sh
set -u
SWEEP=${SWEEP:-collect/sweeps/gpu-single.yaml}
PY=${PY:-python3}
BUDGET=${BUDGET:-330}   # seconds for the sweep (and its fallback) in all
start=$(date +%s)
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
date -u
nvidia-smi 2>&1 | head -20
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
if [ -d ../.whl ] && [ -z "${NOWHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../.whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
export PYTHONUNBUFFERED=1
$PY -c "import torch, pydantic, pandas, pyarrow; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'pydantic', pydantic.VERSION, 'pandas', pandas.__version__, 'pyarrow', pyarrow.__version__); print(torch.cuda.get_device_properties(0) if torch.cuda.is_available() else 'no cuda')"
NAME=$($PY -c "import yaml,sys; print(yaml.safe_load(open('$SWEEP'))['name'])")
touch /tmp/marker; sleep 1
left=$((BUDGET - ($(date +%s) - start)))
echo "== sweep $NAME ($left s)"
timeout -k 10 $left $PY -m torch.distributed.run --nproc_per_node 1 -m collect sweep "$SWEEP"; echo "sweep rc=$?"
rows=$(cat data/runs/$NAME.journal.jsonl 2>/dev/null | wc -l)
if [ ! -f data/runs/$NAME.parquet ] && [ "$rows" = 0 ]; then
  # nothing measured: most likely the fingerprint's block profile failed; measure the plans without it
  sed 's/^name: .*/&-noblocks/' "$SWEEP" > /tmp/noblocks.yaml; echo "profile_blocks: false" >> /tmp/noblocks.yaml
  NAME=$NAME-noblocks
  left=$((BUDGET - ($(date +%s) - start)))
  echo "== fallback sweep $NAME ($left s)"
  [ $left -gt 30 ] && { timeout -k 10 $left $PY -m torch.distributed.run --nproc_per_node 1 -m collect sweep /tmp/noblocks.yaml; echo "fallback rc=$?"; }
fi
ls -la data/runs/ | grep "$NAME"; find data/hardware -newer /tmp/marker -type f
tar czf "$OUT/gpu-data.tgz" $(ls data/runs/$NAME.parquet data/runs/$NAME.journal.jsonl data/runs/$NAME.sweep.json 2>/dev/null) $(find data/hardware -newer /tmp/marker -type f)
tar tzf "$OUT/gpu-data.tgz"
$PY gpu_summary.py "$NAME" 2>&1 | tee "$OUT/summary.txt"
echo "total $(( $(date +%s) - start )) s"
