#!/usr/bin/env bash
# One GPU round, started in the background (setsid) on a one-GPU machine that already holds vLLM in /tmp/vsite,
# the project's wheels in /tmp/site and this code in /tmp/s44/code. Everything it writes goes to /tmp/s44/out
# (short calls copy it back). Steps, each logged in out/progress:
#   A  benchmarks/vllm_verify.py eightb: 8B exports served by vLLM at batch 1/16/64 beside the built-in runtime
#   A2 the same for all-BF16 and all-FP8 at batch 64 with vLLM capturing CUDA graphs up to 1024 tokens
#   B  advisor search on the 8B checkpoint with TPOT objectives (op8b.yaml), its recommendation exported
#   C  benchmarks/vllm_verify.py operating: every plan at its operating batches, served by vLLM
#   D  benchmarks/large_models.py identical (8B): packed bank against folded
#   E  benchmarks/large_models.py search (Qwen2.5-14B shape)
set -u
cd /tmp/s44/code
export PYTHONPATH=/tmp/s44/code:/tmp/vsite:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=/tmp/s44/out ck=/tmp/s44/ck
mkdir -p $out
log() { echo "$1 $(date -u +%T)" >> $out/progress; }
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.csv
advisor() { python3 -c 'from advisor.cli import main; main()' "$@"; }
steps=${STEPS:-A A2 B C D E}
for s in $steps; do
  log "$s start"
  case $s in
    A) python3 benchmarks/vllm_verify.py eightb --out $out/vllm_8b.json --checkpoints $ck > $out/a.log 2>&1 ;;
    A2) python3 benchmarks/vllm_verify.py eightb --skip-runtime --plans all-bf16 all-fp8 --batches 64 \
          --llm-options '{"compilation_config": {"max_cudagraph_capture_size": 1024}}' \
          --out $out/vllm_8b_capture1024.json --checkpoints $ck > $out/a2.log 2>&1 ;;
    B) mkdir -p /tmp/s44/base
       for f in $ck/all-bf16/*; do ln -sf $f /tmp/s44/base/; done
       cp ../shared/models/tinystories-656k/tokenizer* /tmp/s44/base/ 2>/dev/null
       cp ../shared/models/tinystories-656k/special_tokens* /tmp/s44/base/ 2>/dev/null
       advisor search -r benchmarks/device/op8b.yaml > $out/b_search.log 2>&1
       echo "search rc=$?" >> $out/progress
       cp /tmp/s44/runs/op8b/summary.json $out/op8b_summary.json; cp /tmp/s44/runs/op8b/report.md $out/op8b_report.md
       advisor export /tmp/s44/runs/op8b --out /tmp/s44/rec --no-smoke-test > $out/b_export.log 2>&1 ;;
    C) python3 benchmarks/vllm_verify.py operating --checkpoints $ck --run /tmp/s44/runs/op8b \
         --rec-checkpoint /tmp/s44/rec --out $out/operating_points_8b > $out/c.log 2>&1 ;;
    D) mkdir -p /tmp/s44/lm && ln -sfn /tmp/s44/base /tmp/s44/lm/llama-3.1-8b  # the same shape, already on disk
       python3 benchmarks/large_models.py identical --shape llama-3.1-8b --work /tmp/s44/lm --out $out/lm \
         > $out/d.log 2>&1 ;;
    E) rm -rf $ck /tmp/s44/rec /tmp/s44/lm/llama-3.1-8b /tmp/s44/base  # the disk holds 64 GiB
       python3 benchmarks/large_models.py search --shape qwen2.5-14b --trials 12 --work /tmp/s44/lm --out $out/lm \
         > $out/e.log 2>&1 ;;
  esac
  log "$s rc=$?"
done
python3 -c "import vllm; print(vllm.__version__)" > $out/vllm_version.txt 2>&1
log DONE
