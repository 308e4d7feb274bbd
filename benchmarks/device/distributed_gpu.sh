#!/bin/bash
# The device side of reports/benchmarks/distributed_gpu.{json,md}: `advisor search --energy measured` timed
# with the worker counts given, one run after another, from the repository root of the device's copy
# (wheels in .whl/, ../shared from the carried folder). Each run is one `run` of distributed_gpu.py;
# model, per-model profiles and runs stay in $W between calls on one machine. Runs: WORKERS:LABEL ...
#   bash benchmarks/device/distributed_gpu.sh 2:warmup          # first call on a machine (both GPUs warm)
#   bash benchmarks/device/distributed_gpu.sh 1:warm            # then one call per run (10 minutes each)
set -o pipefail
W=${W:-/tmp/q41}; TRIALS=${TRIALS:-6}; mkdir -p "$W" "$OUT"
if [ ! -f "$W/wheels-installed" ]; then  # once per machine
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch "$W/wheels-installed" || exit 3
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1 NCCL_NVLS_ENABLE=0
nvidia-smi > "$OUT/nvidia-smi.txt"
for spec in ${@:-2:warmup}; do
  timeout "${RUN_S:-560}" python3 benchmarks/device/distributed_gpu.py run --workers "${spec%%:*}" \
    --label "${spec##*:}" --trials "$TRIALS" --work "$W" --out "$OUT" || echo "run $spec failed ($?)"
done
echo "device script done at ${SECONDS}s"
