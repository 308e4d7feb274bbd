# Device run: copy make_llama8b.py, llama8b.yaml and this file into .dev/s8b/, then `bash .dev/s8b/run.sh`
# with carry [".whl", ".gpu_carry", ".dev"] (one call: build the checkpoint, then the search).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,uuid,temperature.gpu --format=csv | tee $OUT/gpu.txt
{ time python3 .dev/s8b/make_llama8b.py /tmp/llama8b .gpu_carry/tinystories-656k ; } 2>&1 | tee $OUT/build.log
R=$PWD; mkdir -p /tmp/s8b && cp .dev/s8b/llama8b.yaml /tmp/s8b/ && cd /tmp/s8b && export ADVISOR_PROFILE_DIR=/tmp/s8b/prof
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; } > times.txt
s=$(date +%s)
timeout 545 python3 -c "from advisor.cli import main; import sys; sys.argv=['advisor','search','-r','llama8b.yaml','--out','runs']; main()" > search_out.txt 2> search_err.txt
echo "rc=$? wall_s=$(( $(date +%s) - s ))" >> times.txt
date -u +%FT%TZ >> times.txt
cat times.txt; grep -v "^trial" search_err.txt | tail -40; tail -25 search_out.txt
cp times.txt search_out.txt search_err.txt $OUT/; cp runs/llama8b/summary.json runs/llama8b/report.md $OUT/ 2>/dev/null; true
