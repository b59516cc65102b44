#!/usr/bin/env bash
# Every GPU figure BENCHMARKS.md asks for, in one run on a machine with a CUDA GPU; the log and the raw results
# go to OUTDIR (made if missing), at most six files:
#   log.txt            everything printed, each worker's raw result included (kept if the run is cut short);
#   large.json, large_half.json
#                      bench_large's raw results for `bench_large --from-json`: the app's pass ÷ its floor and
#                      the peak GPU memory of the pass and of its baseline, for DeiT-Ti/16 and ViT-B/16 at 224,
#                      ViT-L/16 at 384 and DINOv2-L/14 at 518, in float32 and under autocast half;
#   large_compact.json the same in float32 for the library's default pass (AttnLRP and LeGrad in it);
#   pass_ops_cuda.csv  bench_pass_ops: which operators the pass adds to its floor, with each one's GPU time.
# The GPU tests (the pass's copies to the host; the pass on the GPU equal to the CPU's) run after the first table.
# Usage: bash bench/gpu_checks.sh OUTDIR
set -uo pipefail
out="${1:?usage: bash bench/gpu_checks.sh OUTDIR}"
mkdir -p "$out"
log="$out/log.txt"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
quiet() { tee -a "$log" | grep -v -e '^done:' -e '^raw:'; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)"; } 2>&1 | quiet
large() {  # bench_large for all four models, the rest of the arguments passed on
  python3 -m bench.bench_large --device cuda --models deit_ti_224 vitb_224 vitl_384 dinov2l_518 --repeats 7 "$@" \
    2>&1 | quiet
}
large --designs app --json "$out/large.json"
python3 -m pytest -q -p no:cacheprovider tests/passes/test_transfers.py \
  "tests/passes/test_pipeline.py::test_the_pass_on_the_gpu_equals_the_cpus" 2>&1 | tee -a "$log" | tail -3
large --designs app --half --json "$out/large_half.json"
python3 -m bench.bench_pass_ops --device cuda --models vitb_224 dinov2l_518 --repeats 5 2>&1 | quiet
cp bench/results/pass_ops_cuda.csv "$out/" 2>/dev/null
large --designs compact --json "$out/large_compact.json"
