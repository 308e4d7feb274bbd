set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,uuid --format=csv | tee $OUT/gpu.txt
df -h /tmp | tail -1
time python3 .dev/s8b/make_llama8b.py /tmp/llama8b .gpu_carry/tinystories-656k 2>&1 | tee $OUT/build.log
ls -la /tmp/llama8b | tee -a $OUT/build.log
