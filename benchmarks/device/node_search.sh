#!/usr/bin/env bash
# The device side of reports/benchmarks/node_search.{json,md} (issue 58): one `advisor search` of a random-weight
# Llama-3.1-8B shape on 1, 2 and 4 GPUs of one host (nvidia-h200-x4), one node of N ranks each. Run from the
# repository root of the device's copy: `../shared/tools/device-wheels.sh` here first puts the wheels the GPU image
# lacks into .whl/ (carry it), and `start` installs them into /tmp/site. The machine: nvidia-h200-x4 (4 GPUs; the
# 1- and 2-GPU runs use the first GPUs of the same host). One call is at most 10 minutes, so the work runs in the
# background and later calls poll it (the checkpoint and three searches: 10-15 minutes, estimated from the 8B's
# 252 s on one H100):
#   bash benchmarks/device/node_search.sh start   # copy the code to /tmp/ns, start the steps (setsid)
#   bash benchmarks/device/node_search.sh poll    # progress, and the partial report copied into $OUT
# Steps (STEPS="checkpoint plan search"), each logged in /tmp/ns/out/progress with its exit code; the report is
# rewritten after each search. COUNTS picks the GPU counts (default "1 2 4"), TRIALS the budget (default 8).
set -u
M=/tmp/ns; code=$M/code; out=$M/out
case "${1:-poll}" in
  start)
    if [ ! -f /tmp/site/.node-search ] && ls .whl/*.whl > /dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && touch /tmp/site/.node-search || exit 3
    fi
    mkdir -p "$code" "$out" "$M/shared/models"
    tar --exclude=.git --exclude=.whl -cf - . | tar -xf - -C "$code"
    cp -r ../shared/models/tinystories-656k "$M/shared/models/"  # the tokenizer the checkpoint carries
    setsid nohup bash "$code/benchmarks/device/node_search.sh" run > "$out/run.log" 2>&1 < /dev/null &
    echo "started pid $! at $(date -u +%T)" | tee -a "$out/progress" ;;
  run)
    cd "$code" || exit 3
    export PYTHONPATH=$code:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    export NCCL_NVLS_ENABLE=0  # NVLink multicast off in every process (the device notes; the node sets it too)
    nvidia-smi > "$out/nvidia-smi.txt"
    for s in ${STEPS:-checkpoint plan search}; do
      echo "$s start $(date -u +%T)" >> "$out/progress"
      python3 benchmarks/device/node_search.py "$s" --counts ${COUNTS:-1 2 4} --trials "${TRIALS:-8}" \
        --tokenizer "$M/shared/models/tinystories-656k" --work "$M/work" --out "$out" > "$out/$s.log" 2>&1
      rc=$?
      echo "$s rc=$rc $(date -u +%T)" >> "$out/progress"
      [ "$rc" -eq 0 ] || break
    done
    echo "DONE $(date -u +%T)" >> "$out/progress" ;;
  poll)
    cat "$out/progress" 2>/dev/null
    last=$(tail -1 "$out/progress" 2>/dev/null | cut -d' ' -f1)
    [ -f "$out/$last.log" ] && tail -5 "$out/$last.log"
    ls "$M/work"/*.log 2>/dev/null | tail -1 | xargs -r tail -3
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
    mkdir -p "${OUT:-/tmp/ns/copy}" && cp -r "$out/." "${OUT:-/tmp/ns/copy}/" ;;
  *) echo "usage: $0 start|poll" >&2; exit 2 ;;
esac
