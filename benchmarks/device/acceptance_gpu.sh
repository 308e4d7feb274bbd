#!/bin/bash
# The device side of reports/accuracy/acceptance.{json,md}: the full-set run on a GPU, from the repository
# root of the device's copy. The GGUF travels xz-compressed in two parts (one device call carries 64 MiB),
# the first left in $W by an earlier call together with the installed wheels (see the report).
#   W=/tmp/a15 bash .dev/a15/benchmarks/device/acceptance_gpu.sh MAIN_S EXTRA_S
set -o pipefail
W=${W:-/tmp/a15}; MAIN_S=${1:-480}; EXTRA_S=${2:-0}; ROOT=$PWD
GGUF=$W/SmolLM2-135M-Instruct.Q4_1.gguf
unxz_() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'; }
cat "$W/model.xz.part1" .dev/a15-p2/model.xz.part2 | unxz_ > "$GGUF" || exit 1
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $GGUF" | sha256sum -c || exit 1
mkdir -p "$W/data"
for f in .dev/a15/data/*.jsonl.xz; do unxz_ < "$f" > "$W/data/$(basename "$f" .xz)"; done
export PYTHONPATH=$W/site:$ROOT/.dev/a15 PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 TQDM_DISABLE=1
cd .dev/a15 || exit 1
run() {  # run <seconds> <out name> <extra args...>
  local limit=$1 name=$2; shift 2
  timeout "$limit" python3 benchmarks/acceptance_smollm2.py --device cuda --model "$GGUF" \
    --tokens data/tokens.pt --other-check data/model_check_cpu.json --data-dir "$W/data" \
    --first-batch 100 --batch-size 64 --baselines all-nvfp4 --cache-dir "$W/cache" --out "$OUT/$name" "$@" \
    2>&1 | grep -v -E 'it/s\]|s/it\]' | tee "$OUT/log_$name.txt"
  [ -f "$OUT/$name/acceptance.json" ] && rm -f "$OUT/$name/plans_so_far.json"  # at most 8 files come back
}
run "$MAIN_S" full --sizes 5153,1838
left=$((MAIN_S + EXTRA_S - SECONDS))
if [ "$EXTRA_S" -gt 0 ] && [ "$left" -gt 150 ]; then
  run "$left" arc --tasks lambada_openai,piqa,arc_easy --sizes 5153,1838,2376
fi
tar czf "$OUT/cache.tgz" -C "$W" cache
echo "device script done at ${SECONDS}s"
