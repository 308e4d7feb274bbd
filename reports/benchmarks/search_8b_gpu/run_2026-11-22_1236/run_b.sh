set -o pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ls /tmp/llama8b >/dev/null || { echo "model gone: machine was recycled"; exit 3; }
mkdir -p /tmp/s8b && cp .dev/s8b/llama8b.yaml /tmp/s8b/ && cd /tmp/s8b && export ADVISOR_PROFILE_DIR=/tmp/s8b/prof
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; } > times.txt
s=$(date +%s)
timeout 550 python3 -c "from advisor.cli import main; import sys; sys.argv=['advisor','search','-r','llama8b.yaml','--out','runs']; main()" > search_out.txt 2> search_err.txt
echo "rc=$? wall_s=$(( $(date +%s) - s ))" >> times.txt
date -u +%FT%TZ >> times.txt
cat times.txt; grep -v "^trial" search_err.txt | tail -40; tail -25 search_out.txt
cp times.txt search_out.txt search_err.txt $OUT/; cp runs/llama8b/summary.json runs/llama8b/report.md $OUT/ 2>/dev/null; true
