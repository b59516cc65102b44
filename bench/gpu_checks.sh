#!/usr/bin/env bash
# Every GPU figure BENCHMARKS.md asks for, in one run on a machine with a CUDA GPU, logs and raw results under
# OUTDIR (made if missing):
#   - the GPU tests: the pass's copies to the host, and the pass on the GPU equal to the CPU's;
#   - bench_large: the app's pass ÷ its floor and the peak GPU memory of ViT-B/16 at 224, ViT-L/16 at 384 and
#     DINOv2-L/14 at 518, in float32 and under autocast half (raw JSON, for `bench_large --from-json`);
#   - bench_pass_ops: which operators the pass adds to its floor, with each one's GPU time.
# Usage: bash bench/gpu_checks.sh OUTDIR
set -uo pipefail
out="${1:?usage: bash bench/gpu_checks.sh OUTDIR}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, torch.cuda.get_device_name())" \
  | tee "$out/versions.txt"
python3 -m pytest -q -p no:cacheprovider tests/passes/test_transfers.py \
  "tests/passes/test_pipeline.py::test_the_pass_on_the_gpu_equals_the_cpus" 2>&1 | tee "$out/tests.txt" | tail -3
for half in "" "--half"; do
  python3 -m bench.bench_large --device cuda $half --models vitb_224 vitl_384 dinov2l_518 --designs app \
    --repeats 3 --json "$out/large${half:+_half}.json" 2>&1 | tee "$out/large${half:+_half}.txt" | grep -v "^done:"
done
python3 -m bench.bench_pass_ops --device cuda --models vitb_224 dinov2l_518 --repeats 3 2>&1 | tee "$out/ops.txt"
