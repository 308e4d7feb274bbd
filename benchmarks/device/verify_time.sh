#!/usr/bin/env bash
# How long `advisor verify` takes on one GPU, per stage, and whether the fast meter gives the classic meter's numbers
# (reports/benchmarks/verify_time.md). Started in the background (setsid) on a one-GPU machine that already holds
# vLLM in /tmp/vsite, the project's wheels in /tmp/site and this code in /tmp/s44/code; writes to /tmp/s44/out,
# one line per step in out/progress. Steps:
#   B  the random BF16 Llama-3.1-8B checkpoint, then `advisor search` with three TPOT objectives and fixed batches
#      16 and 64 (verify_time_8b.yaml, target the GPU here: h200)
#   V  `advisor verify RUN --engine vllm --plan <all-FP8>`: all-BF16, all-FP8 and the recommendation exported and
#      served, timed per stage (verify.json's timings_s)
#   M  benchmarks/device/meter_ab.py: the all-FP8 export metered at batches 16, 64 and 128 in one engine with the
#      fast meter (vllm_load.STEADY_LOAD_METER) and the classic one (MeterConfig()), alternating
#   P  the slow path beside V's fast one (issue 57: speed must not buy different numbers): benchmarks/device/meter_ab.py
#      --around RUN meters the recommendation's found operating batches and the CUDA-graph sizes either side with the
#      classic meter in an engine sized as V's was (about 5 min); writes out/slow_path.json
#   R  `advisor recheck --recommendation RUN --model <the same BF16 checkpoint> --engine vllm`: the CI job's check of
#      a new model version, timed (issue 57's target: at most 5 minutes; after V, all-BF16 is read from V's
#      verify.json and only the recommendation is served; without V both are)
#   Z  benchmarks/device/engine_sizing_ab.py on the all-FP8 export (V's, else the random 8B's, built here): batches 80,
#      136 and 240 in engines sized max_num_seqs 240 and 300 with their own and each other's CUDA graphs (round 3's
#      6-11% between the two sizings); about 10 min alone; ZARMS='A B D A' leaves out C (about 8 min)
#   Q  issue 57's 4B-class case: a random Qwen3-4B-shaped checkpoint, `advisor search` (verify_time_4b.yaml), then
#      `advisor verify RUN --engine vllm --plan <all-FP8>`, timed (issue 57: the plans within 30 minutes of one GPU,
#      at most 4 minutes a plan after the first); writes out/q_*; about 12 min
#   G  benchmarks/device/fp8_gemm_scaling.py: one 8B layer's linears in BF16 and FP8 at 16-4096 tokens a step (1 min)
#   K  benchmarks/device/vllm_moe_kernels.py: vLLM's fused MoE (router, top-k and Triton experts) of published MoE
#      geometries (${KGEOM:-all of its list}) in BF16 and FP8 at 1-2048 tokens a step, time and energy a layer (about
#      2 min a geometry); then its rows go into this copy's step profile of the GPU here (vllm_step_fit.py
#      --moe-kernels, nothing fitted; other geometries kept), so that a later S prices the MoE, and searches its
#      objectives, from it
#   q  step Q's checkpoint and search only (Q then skips them): run beside B on a second GPU
#   w  wait until ${WAIT_FILE:-/tmp/s44/out/progress} holds ${WAIT_FOR:-V rc=}: a second GPU's verify starts only
#      after the first's timed verify has ended, so that V's stages are not shared with another job
#   S  benchmarks/device/engine_true_sweep.py over ${SHAPES:-qwen2.5-7b} (plans ${SPLANS:-all-bf16 all-fp8}): shapes
#      outside the step model's fit served at batches 16-256, about 6.5 min a plan
#      (reports/benchmarks/engine_true.md); SWORK=/dev/shm/et puts the checkpoints in memory: the MoE's BF16 (61 GB)
#      does not fit the disk beside anything else (engine_true_sweep.py's docstring); SBATCHES='16 64' meters only
#      the fixed batches issue 56 names besides the objectives' searches (the MoE's operating batches lie at 1-48)
# Two copies on one host disturb each other's serving, even pinned to disjoint cores (round 8, 2026-11-30: a 4B FP8
# engine served 20-35% slower beside the 8B's verify): time a target alone. Environment variables the engines should
# see are set on the command line (ENGINE_ENV's are defaults only), e.g. VLLM_USE_AOT_COMPILE=0, which leaves
# Inductor's FX-graph cache shared by every engine of the run (vLLM's AOT path gives each plan's hash a cache of its
# own: vllm/compilation/decorators.py), the experiment for issue 57's later engine starts (31-46 s of torch.compile).
# On two GPUs, two copies run, each with CUDA_VISIBLE_DEVICES and VT_OUT of its own (default /tmp/s44/out); each packs
# ${VT_OUT}.tgz. Poll with back-to-back calls that return within 600 s, each copying the small files back: /tmp/s44/out.tgz, packed
# after every step, or mid-step the same two folders by name (a tar of the whole run folder took 7 device minutes on
# 2026-11-29, its 16 GB checkpoint with it):
#   for i in $(seq 1 110); do sleep 5; grep -q DONE /tmp/s44/out/progress && break; done; cat /tmp/s44/out/progress
#   tar czf $OUT/out.tgz -C /tmp/s44 out runs/vt8b/verify_served
set -u
cd /tmp/s44/code
export PYTHONPATH=/tmp/s44/code:/tmp/vsite:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=${VT_OUT:-/tmp/s44/out} ck=/tmp/s44/ck run=/tmp/s44/runs/vt8b
mkdir -p $out
log() { echo "$1 $(date -u +%T)" >> $out/progress; }
pack() {  # out/ and the run's kept servings, no checkpoint: what reports/benchmarks/verify_time_data/roundN holds
  tar czf $out.tgz.part -C /tmp/s44 $(basename $out) $(cd /tmp/s44 && ls -d runs/vt*/verify_served 2>/dev/null) \
    && mv $out.tgz.part $out.tgz
}
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.csv
python3 -c "import vllm; print(vllm.__version__)" > $out/vllm_version.txt 2>&1
advisor() { python3 -c 'from advisor.cli import main; main()' "$@"; }
ran_b=""
for s in ${STEPS:-B V M}; do
  log "$s start"
  case $s in
    B) ran_b=1
       python3 benchmarks/vllm_verify.py checkpoints --checkpoints $ck --plans all-bf16 > $out/b_ck.log 2>&1
       mkdir -p /tmp/s44/base
       for f in $ck/all-bf16/*; do ln -sf $f /tmp/s44/base/; done
       cp ../shared/models/tinystories-656k/tokenizer* /tmp/s44/base/ 2>/dev/null
       cp ../shared/models/tinystories-656k/special_tokens* /tmp/s44/base/ 2>/dev/null
       [ -f $run/summary.json ] || advisor search -r benchmarks/device/verify_time_8b.yaml > $out/b_search.log 2>&1
       echo "search rc=$?" >> $out/progress
       cp $run/summary.json $out/vt8b_summary.json ;;
    V) fp8=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); n = s["baselines"]["all-fp8"]
print(next(t["plan_id"] for t in s["trials"] if t["trial"] == n))' $run/summary.json)
       /usr/bin/time -v -o $out/v_time.txt python3 -c 'from advisor.cli import main; main()' verify $run \
         --engine vllm --plan $fp8 > $out/v_verify.log 2>&1
       echo "verify rc=$?" >> $out/progress
       cp $run/verify.json $out/vt8b_verify.json; cp $run/verify.md $out/vt8b_verify.md
       cp -r $run/verify_served $out/ 2>/dev/null
       for d in $run/engine_checkpoints/*/; do  # each export's own timings (quantize, write, reload)
         cp $d/export.json $out/export_$(basename $d).json 2>/dev/null
       done ;;
    M) fp8=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); n = s["baselines"]["all-fp8"]
print(next(t["plan_id"] for t in s["trials"] if t["trial"] == n))' $run/summary.json)
       python3 benchmarks/device/meter_ab.py $run/engine_checkpoints/$fp8 --batches 16 64 128 \
         --out $out/meter_ab.json > $out/m.log 2>&1 ;;
    P) python3 benchmarks/device/meter_ab.py --around $run --out $out/slow_path.json > $out/p.log 2>&1 ;;
    Z) fp8=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); n = s["baselines"]["all-fp8"]
print(next(t["plan_id"] for t in s["trials"] if t["trial"] == n))' $run/summary.json 2>/dev/null)
       zck=$run/engine_checkpoints/$fp8
       if [ -z "$fp8" ] || [ ! -f $zck/config.json ]; then  # without B and V: the random 8B's all-FP8 export
         python3 benchmarks/vllm_verify.py checkpoints --checkpoints $ck --plans all-fp8 > $out/z_ck.log 2>&1
         zck=$ck/all-fp8
       fi
       python3 benchmarks/device/engine_sizing_ab.py $zck --batches 80 136 240 --arms ${ZARMS:-A B C D A} \
         --out $out/engine_sizing_ab.json > $out/z.log 2>&1 ;;
    R) /usr/bin/time -v -o $out/r_time.txt python3 -c 'from advisor.cli import main; main()' recheck \
         --recommendation $run --model /tmp/s44/base --engine vllm -o $run/recheck > $out/r_recheck.log 2>&1
       echo "recheck rc=$?" >> $out/progress
       cp $run/recheck/recheck.json $run/recheck/recheck.md $out/ 2>/dev/null
       for d in $run/recheck/recheck/engine_checkpoints/*/; do
         cp $d/export.json $out/r_export_$(basename $d).json 2>/dev/null
       done ;;
    q|Q) q4=/tmp/s44/runs/vt4b
       if [ ! -f $q4/summary.json ]; then
         python3 benchmarks/vllm_verify.py checkpoints --shape qwen3-4b --checkpoints /tmp/s44/q4ck \
           --plans all-bf16 > $out/q_ck.log 2>&1
         mkdir -p /tmp/s44/q4base
         for f in /tmp/s44/q4ck/all-bf16/*; do ln -sf $f /tmp/s44/q4base/; done
         cp ../shared/models/tinystories-656k/tokenizer* ../shared/models/tinystories-656k/special_tokens* \
           /tmp/s44/q4base/ 2>/dev/null
         advisor search -r benchmarks/device/verify_time_4b.yaml > $out/q_search.log 2>&1
         echo "4B search rc=$?" >> $out/progress
         cp $q4/summary.json $out/vt4b_summary.json
       fi
       [ $s = q ] && { log "$s rc=0"; pack; continue; }
       fp8=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); n = s["baselines"]["all-fp8"]
print(next(t["plan_id"] for t in s["trials"] if t["trial"] == n))' $q4/summary.json)
       /usr/bin/time -v -o $out/q_time.txt python3 -c 'from advisor.cli import main; main()' verify $q4 \
         --engine vllm --plan $fp8 > $out/q_verify.log 2>&1
       echo "4B verify rc=$?" >> $out/progress
       cp $q4/verify.json $out/vt4b_verify.json; cp $q4/verify.md $out/vt4b_verify.md ;;
    w) for i in $(seq 1 720); do grep -q "${WAIT_FOR:-V rc=}" ${WAIT_FILE:-/tmp/s44/out/progress} && break; sleep 5; done ;;
    G) python3 benchmarks/device/fp8_gemm_scaling.py --out $out/fp8_gemm.json > $out/g.log 2>&1 ;;
    K) python3 benchmarks/device/vllm_moe_kernels.py ${KGEOM:+--geometries $KGEOM} --out $out/moe_kernels.json \
         > $out/k.log 2>&1 \
       && python3 benchmarks/engine_true/vllm_step_fit.py --moe-kernels $out/moe_kernels.json --gpu "$(python3 -c \
         'from advisor.energy.prediction import gpu_here; print(gpu_here()[0].value)')" >> $out/k.log 2>&1 ;;
    S) [ -n "$ran_b" ] && rm -rf $ck /tmp/s44/base  # the disk holds 64 GiB: this copy's 8B checkpoints go first
       python3 benchmarks/device/engine_true_sweep.py --shapes ${SHAPES:-qwen2.5-7b} --work ${SWORK:-/tmp/s44/et_$(basename $out)} \
         --plans ${SPLANS:-all-bf16 all-fp8} ${SBATCHES:+--batches $SBATCHES} --out $out/engine_true_sweep.json \
         > $out/s.log 2>&1 ;;
  esac
  log "$s rc=$?"
  pack
done
log DONE
pack
