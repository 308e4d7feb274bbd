#!/usr/bin/env bash
# The device side of reports/benchmarks/large_models_multi_gpu.{json,md} (issue 41): a Llama-3.1-70B shape over
# the GPUs of one node (nvidia-h100-x4), searched, then its all-BF16 and all-FP8 plans served by vLLM with tensor
# parallelism over the same GPUs beside the prediction for that count. Run from the repository root of the
# device's copy; vLLM in /tmp/vsite (../shared/tools/device-vllm.sh: its parts in back-to-back calls) and the
# project's wheels in /tmp/site (device-wheels.sh). One call is at most 10 minutes, so the work runs in the
# background and later calls poll it:
#   bash benchmarks/device/large_models_multi_gpu.sh start   # copy the code to /tmp/mg, start the steps (setsid)
#   bash benchmarks/device/large_models_multi_gpu.sh poll    # progress, and the partial report copied into $OUT
# Steps (STEPS="checkpoint plan search export serve"), each logged in /tmp/mg/out/progress with its exit code;
# the report is rewritten after each. TRIALS trims the search's budget (default 8); the model is never trimmed.
set -u
M=/tmp/mg; code=$M/code; out=$M/out
case "${1:-poll}" in
  start)
    mkdir -p "$code" "$out" "$M/shared/models"
    tar --exclude=.git --exclude=.vllm --exclude=.whl -cf - . | tar -xf - -C "$code"
    cp -r ../shared/models/tinystories-656k "$M/shared/models/"  # the tokenizer the checkpoint carries
    setsid nohup bash "$code/benchmarks/device/large_models_multi_gpu.sh" run > "$out/run.log" 2>&1 < /dev/null &
    echo "started pid $! at $(date -u +%T)" | tee -a "$out/progress" ;;
  run)
    cd "$code" || exit 3
    export PYTHONPATH=$code:/tmp/vsite:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    export NCCL_NVLS_ENABLE=0  # NVLink multicast off in every process (the device notes)
    nvidia-smi --query-gpu=name,driver_version,power.limit,memory.total --format=csv > "$out/gpu.csv"
    gpus=$(nvidia-smi -L | wc -l)
    mem=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) / 1024 ))
    kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -qi h200 && echo h200 || echo h100)
    for s in ${STEPS:-checkpoint plan search export serve}; do
      echo "$s start $(date -u +%T)" >> "$out/progress"
      python3 benchmarks/device/large_models_multi_gpu.py "$s" --gpus "$gpus" --gpu-memory "$mem" \
        --serve-target "$kind" --trials "${TRIALS:-8}" --work "$M/work" --out "$out" > "$out/$s.log" 2>&1
      rc=$?
      echo "$s rc=$rc $(date -u +%T)" >> "$out/progress"
      [ "$rc" -eq 0 ] || break
    done
    python3 -c "import vllm; print(vllm.__version__)" > "$out/vllm_version.txt" 2>&1
    echo "DONE $(date -u +%T)" >> "$out/progress" ;;
  poll)
    cat "$out/progress" 2>/dev/null
    last=$(tail -1 "$out/progress" 2>/dev/null | cut -d' ' -f1)
    [ -f "$out/$last.log" ] && tail -5 "$out/$last.log"
    df -h /tmp | tail -1; free -g | head -2
    nvidia-smi --query-gpu=index,memory.used,power.draw,temperature.gpu --format=csv,noheader
    mkdir -p "${OUT:-/tmp/mg/copy}" && cp -r "$out/." "${OUT:-/tmp/mg/copy}/" ;;
  *) echo "usage: $0 start|poll" >&2; exit 2 ;;
esac
