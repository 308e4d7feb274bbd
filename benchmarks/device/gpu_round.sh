#!/usr/bin/env bash
# One GPU round, started in the background (setsid) on a one-GPU machine that already holds vLLM in /tmp/vsite,
# the project's wheels in /tmp/site and this code in /tmp/s44/code. Everything it writes goes to /tmp/s44/out
# (short calls copy it back). Steps, each logged in out/progress:
#   A  benchmarks/vllm_verify.py eightb: 8B exports served by vLLM at batch 1/16/64 beside the built-in runtime
#   A2 the same for all-BF16 and all-FP8 at batch 64 with vLLM capturing CUDA graphs up to 1024 tokens
#   L  vLLM's FP8 GEMM kernel: vLLM's own (CUTLASS on Hopper) against cuBLASLt (linear_backend torch, what the
#      advisor serves with on Hopper; torch._scaled_mm, the runtime's FP8 GEMM) for all-FP8 and mixed at batch
#      1/16/64, all-BF16 at 64, beside the built-in runtime; the export's CUDA-graph bound in both. 24 min on an
#      H100 with the exports (2026-11-28; it ran then as three calls, with vLLM's own kernel the serving default)
#   B  advisor search on the random BF16 8B checkpoint with TPOT objectives (op8b.yaml); skipped where its
#      summary.json is there (the BF16 checkpoint is built first where step A did not: vllm_verify.py checkpoints)
#   C  advisor verify RUN --engine vllm --plan <all-FP8 id>: all-BF16, all-FP8 and the recommendation exported
#      (reused where exported before) and served, each TPOT objective searched as measured; then
#      vllm_verify.py operating-collect RUN/verify.json RUN/summary.json -> out/operating_points_8b.{json,md}
#   D  benchmarks/large_models.py identical (8B): packed bank against folded
#   E  benchmarks/large_models.py search (Qwen2.5-14B shape), the front measured here where H100 runs it natively
#   E2 the same search with the GPU memory capped at 24 GiB: layers beyond it stream from CPU memory
#   F  benchmarks/large_models.py search (Qwen3-30B-A3B shape) on one H200 (kind nvidia-h200, needs_h200)
# A, A2 and C need vLLM in /tmp/vsite; B, D, E, E2 and F need only the wheels and ../shared.
# Time, measured 2026-11-27 (reports/benchmarks/operating_points_8b.md): setup (wheels, ../shared, four vLLM parts)
# ~1.5 min; B 3.3 min (BF16 checkpoint 1 min, search 143 s); C with VERIFY_WORKERS=2 on an nvidia-h100-x2 machine
# 17.9 min (exports of 3 plans ~2.5 min; all-BF16 then the recommendation on GPU 0, all-FP8 on GPU 1, one engine a
# plan, 7-7.5 min a plan with its batch searches; scoring 0.5 min). On one GPU C takes ~25 min: setup + B + C do
# not fit a session's 30 device minutes there, so take the 2-GPU kind (status lists it) or carry kept servings
# over: each plan's serving is kept in RUN/verify_served as it finishes, and every poll should copy
# /tmp/s44/runs/op8b/verify_served/*.json to $OUT; a later session carries them in (into /tmp/s44/served_in
# before C): verify reads back those whose job is the same (same plan, checkpoint path, tokens, operating
# batches, meter, vLLM and GPU), and serves the rest.
# Steps B and C write to /tmp/s44/runs/op8b: a cut-off C resumes its exports and its finished servings. Disk in C:
# the BF16 checkpoint (16 GB) and verify's exports (BF16 16 GB, FP8 ~9 GB, a mixed recommendation ~9-16 GB).
# D, E and E2 on one H100, 2026-11-27 (reports/benchmarks/large_models.md): D 3.2 min (its own 8B checkpoint, 58 s of
# ModelOpt's first FP8 extension build), E 10.8 min (14B checkpoint, search 6.7 min, the baselines measured), E2 25 min
# (checkpoint 1 min, search 23.9 min: run it alone, first; a machine is held 30 min at most). F on an H200: the
# checkpoint in /dev/shm 1.5 min, the search 8.9 min (2026-11-27, after 5c2afdc; its baselines measured after it
# with `large_models.py measure --summary`, 2.4 min). A one-GPU machine counted half its held time or all of it:
# the device tool's lease says which.
# Run: STEPS='B C' VERIFY_WORKERS=2 bash benchmarks/device/gpu_round.sh (B and C ran so on 2026-11-27) with setsid
# in the background, and poll out/progress with back-to-back calls that each return within 600 s (the machine goes
# back 30 s after a call ends: no pause between polls), e.g.
#   for i in $(seq 1 104); do sleep 5; grep -q DONE /tmp/s44/out/progress && break; done; cat /tmp/s44/out/progress
#   tar czf $OUT/round.tgz -C /tmp/s44 out runs/op8b/verify_served 2>/dev/null  # one file: $OUT returns 8 at most
set -u
cd /tmp/s44/code
export PYTHONPATH=/tmp/s44/code:/tmp/vsite:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=/tmp/s44/out ck=/tmp/s44/ck run=/tmp/s44/runs/op8b
mkdir -p $out
log() { echo "$1 $(date -u +%T)" >> $out/progress; }
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.csv
advisor() { python3 -c 'from advisor.cli import main; main()' "$@"; }
steps=${STEPS:-A A2 B C D E E2}
for s in $steps; do
  log "$s start"
  case $s in
    A) python3 benchmarks/vllm_verify.py eightb --out $out/vllm_8b.json --checkpoints $ck > $out/a.log 2>&1 ;;
    A2) python3 benchmarks/vllm_verify.py eightb --skip-runtime --plans all-bf16 all-fp8 --batches 64 \
          --llm-options '{"compilation_config": {"max_cudagraph_capture_size": 1024}}' \
          --out $out/vllm_8b_capture1024.json --checkpoints $ck > $out/a2.log 2>&1 ;;
    L) ev() { python3 benchmarks/vllm_verify.py eightb --checkpoints $ck "$@"; }
       cutlass='{"linear_backend": "auto"}'  # vLLM's own choice: CUTLASS on Hopper
       ev --plans all-bf16 all-fp8 --batches 64 --llm-options "$cutlass" --out $out/lb_default.json > $out/l1.log 2>&1
       ev --skip-runtime --plans all-fp8 --batches 1 16 64 --out $out/lb_torch.json > $out/l2.log 2>&1
       ev --skip-runtime --plans mixed --batches 64 --out $out/lb_torch_mixed.json > $out/l3.log 2>&1
       ev --skip-runtime --plans all-fp8 --batches 1 16 --llm-options "$cutlass" --out $out/lb_default_small.json \
         > $out/l4.log 2>&1
       ev --plans mixed --batches 64 --llm-options "$cutlass" --out $out/lb_default_mixed.json > $out/l5.log 2>&1
       ev --plans mixed --batches 1 16 --out $out/lb_torch_mixed_small.json > $out/l6.log 2>&1
       python3 benchmarks/vllm_verify.py backend-collect --default $out/lb_default*.json --torch $out/lb_torch*.json \
         --gpu-csv $out/gpu.csv --date "$(date -u +%F)" --command "STEPS=L bash benchmarks/device/gpu_round.sh" \
         > $out/l7.log 2>&1
       cp reports/benchmarks/vllm_verify.json reports/benchmarks/vllm_verify.md $out/ ;;  # the block added to this copy
    B) python3 benchmarks/vllm_verify.py checkpoints --checkpoints $ck --plans all-bf16 > $out/b_ck.log 2>&1
       mkdir -p /tmp/s44/base
       for f in $ck/all-bf16/*; do ln -sf $f /tmp/s44/base/; done
       cp ../shared/models/tinystories-656k/tokenizer* /tmp/s44/base/ 2>/dev/null
       cp ../shared/models/tinystories-656k/special_tokens* /tmp/s44/base/ 2>/dev/null
       [ -f $run/summary.json ] || advisor search -r benchmarks/device/op8b.yaml > $out/b_search.log 2>&1
       echo "search rc=$?" >> $out/progress
       cp $run/summary.json $out/op8b_summary.json; cp $run/report.md $out/op8b_report.md ;;
    C) rm -rf $ck/all-fp8 $ck/mixed  # step A's; only all-BF16 (the model the run reads) stays: the disk holds 64 GiB
       fp8=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); n = s["baselines"]["all-fp8"]
print(next(t["plan_id"] for t in s["trials"] if t["trial"] == n))' $run/summary.json)
       mkdir -p $run/verify_served  # servings an earlier session kept (its polls copied them back; carried in)
       cp /tmp/s44/served_in/*.json $run/verify_served/ 2>/dev/null
       advisor verify $run --engine vllm --plan $fp8 --workers ${VERIFY_WORKERS:-1} > $out/c_verify.log 2>&1
       echo "verify rc=$?" >> $out/progress
       cp $run/verify.json $out/op8b_verify.json; cp $run/verify.md $out/op8b_verify.md
       python3 benchmarks/vllm_verify.py operating-collect $run/verify.json $run/summary.json \
         --gpu-csv $out/gpu.csv --out $out/operating_points_8b > $out/c.log 2>&1 ;;
    D) mkdir -p /tmp/s44/lm  # the 8B of step B where it is on disk; else large_models.py makes one
       [ -d /tmp/s44/base ] && ln -sfn /tmp/s44/base /tmp/s44/lm/llama-3.1-8b
       python3 benchmarks/large_models.py identical --shape llama-3.1-8b --work /tmp/s44/lm --out $out/lm \
         > $out/d.log 2>&1 ;;
    E) rm -rf $ck $run/engine_checkpoints /tmp/s44/lm/llama-3.1-8b /tmp/s44/base  # the disk holds 64 GiB
       python3 benchmarks/large_models.py search --shape qwen2.5-14b --trials 12 --measure-here --work /tmp/s44/lm \
         --out $out/lm > $out/e.log 2>&1 ;;
    E2) python3 benchmarks/large_models.py search --shape qwen2.5-14b --trials 12 --gpu-memory 24 \
          --work /tmp/s44/lm --out $out/lm > $out/e2.log 2>&1 ;;
    F) mkdir -p /dev/shm/lm  # 57 GiB of weights: the H200's disk is 64 GiB, its tmpfs half of its 128 GiB of memory
       python3 benchmarks/large_models.py search --shape qwen3-30b-a3b --trials 8 --work /dev/shm/lm --out $out/lm \
         > $out/f.log 2>&1 ;;
  esac
  log "$s rc=$?"
done
python3 -c "import vllm; print(vllm.__version__)" > $out/vllm_version.txt 2>&1
log DONE
