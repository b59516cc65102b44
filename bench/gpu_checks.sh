#!/usr/bin/env bash
# Every GPU figure BENCHMARKS.md asks for, in one run on a machine with a CUDA GPU, within a time budget
# (GPU_CHECKS_BUDGET seconds, default 390: each part stops at its own limit or at what is left of the budget, and
# is skipped when too little is left; one that fails or stops leaves the others running). At most eight files
# go to OUTDIR (made if missing):
#   log.txt            everything printed, the raw results included (bench_large's "raw:" lines survive a cut);
#   large.json         bench_large, the app's pass ("app": no spill, as on ZeroGPU) in float32: pass ÷ floor (the
#                      floor timed with CUDA events too), peak GPU memory of the pass and its baseline, every
#                      redraw on the host; ViT-B/16 at 224, ViT-L/16 at 384, DINOv2-L/14 at 518, DeiT-Ti/16 at 224;
#   large_half.json    the same three large models under autocast float16 (no redraws: the store is the same);
#   large_served.json  DINOv2-L/14 with the app's spill folder ("app_spill"), as a server with its own GPU runs it;
#   extras.json        bench.gpu_extras: the pass's syncs and host calls by site, redraws on the host and on the
#                      device, the copy of Q/K to the host four ways and the pass with two of them;
#   first_view.json    bench_first_view_api: the first view through the library calls and, when the wheels of
#                      bench/gpu_wheels.sh came along in .whl/, through the served app's API (gradio_client);
#   pass_ops_cuda.csv  bench_pass_ops: the operators the pass adds to its floor, with their GPU time;
#   summary.md         bench.gpu_tables: the BENCHMARKS tables and the goals, also printed last.
# The GPU tests (the pass's copies to the host, through page-locked memory too; the pass on the GPU equal to the
# CPU's) run after the first part.
# GPU_CHECKS_DRY=1 runs the same steps on the CPU with DeiT-Ti and ViT-B/16 and one repeat: a check of the script.
# GPU_CHECKS_PARTS="large extras ..." runs only the parts named (large gpu-tests extras large-half large-served
# wheels first-view pass-ops), e.g. to measure again after a change on a machine still warm.
# Usage: bash bench/gpu_checks.sh OUTDIR
set -uo pipefail
out="${1:?usage: bash bench/gpu_checks.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/log.txt"
: >"$log"
budget="${GPU_CHECKS_BUDGET:-390}"
begun=$SECONDS
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
BENCH_RESULTS="$(mktemp -d)"  # the benches' CSV tables: not this checkout's bench/results
export BENCH_RESULTS

if [[ "${GPU_CHECKS_DRY:-0}" == 1 ]]; then
  device=cpu repeats=1 all=(deit_ti_224) large=(deit_ti_224) spilled=deit_ti_224
  extras=(deit_ti_224 vitb_224) views=(deit_ti_224) ops=(deit_ti_224) ops_csv=pass_ops.csv
else
  device=cuda repeats=5 all=(vitb_224 vitl_384 dinov2l_518 deit_ti_224) large=(vitb_224 vitl_384 dinov2l_518)
  spilled=dinov2l_518 extras=(dinov2l_518 vitb_224 vitl_384) views=(deit_ti_224 dinov2l_518)
  ops=(vitb_224 dinov2l_518) ops_csv=pass_ops_cuda.csv
fi

part() {  # part NAME LIMIT COMMAND...: run it for at most LIMIT seconds and what is left of the budget
  local name=$1 limit=$2 left
  shift 2
  [[ -z "${GPU_CHECKS_PARTS:-}" || " $GPU_CHECKS_PARTS " == *" $name "* ]] || return 1
  left=$((budget - (SECONDS - begun) - 20))  # 20 s kept for the summary
  ((left < limit)) && limit=$left
  if ((limit < 15)); then
    echo "== $name: skipped, $((budget - (SECONDS - begun))) s of the budget left" | tee -a "$log"
    return 1
  fi
  echo "== $name: at most ${limit} s, from ${SECONDS} s" | tee -a "$log"
  local from=$SECONDS status
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  status=$?
  echo "== $name: exit $status after $((SECONDS - from)) s$( ((status == 124)) && echo ' (stopped at its limit)')" \
    | tee -a "$log"
  ((status == 0)) || tail -n 12 "$log" | grep -v '^== ' | sed 's/^/   | /'
  return $status
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import os, sys, torch, timm; print('python', sys.version.split()[0], 'torch', torch.__version__,
'timm', timm.__version__, 'torch threads', torch.get_num_threads(), 'cores', os.cpu_count())"; } 2>&1 | tee -a "$log"

part large 150 python3 -m bench.bench_large --device "$device" --models "${all[@]}" --repeats "$repeats" \
  --designs app --json "$out/large.json"
part gpu-tests 75 python3 -m pytest -q -p no:cacheprovider tests/passes/test_transfers.py \
  tests/passes/test_host_copy.py "tests/passes/test_pipeline.py::test_the_pass_on_the_gpu_equals_the_cpus"
part extras 120 python3 -m bench.gpu_extras --device "$device" --models "${extras[@]}" --repeats "$repeats" \
  --json "$out/extras.json"
part large-half 90 python3 -m bench.bench_large --device "$device" --models "${large[@]}" --repeats "$repeats" \
  --designs app --half --no-redraws --json "$out/large_half.json"
part large-served 60 python3 -m bench.bench_large --device "$device" --models "$spilled" --repeats "$repeats" \
  --designs app_spill --json "$out/large_served.json"
api=()
if [[ $device == cuda ]] && compgen -G ".whl/*.whl" >/dev/null; then  # Gradio for the device's Python
  part wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_checks_site .whl/*.whl && api=(--api)
elif python3 -c "import gradio, gradio_client" 2>/dev/null; then
  api=(--api)
fi
PYTHONPATH="/tmp/gpu_checks_site${PYTHONPATH:+:$PYTHONPATH}" part first-view 100 python3 -m bench.bench_first_view_api \
  --device "$device" --models "${views[@]}" --repeats "$repeats" "${api[@]}" --json "$out/first_view.json"
part pass-ops 60 python3 -m bench.bench_pass_ops --device "$device" --models "${ops[@]}" --repeats 3
cp "$BENCH_RESULTS/$ops_csv" "$out/pass_ops_cuda.csv" 2>/dev/null
echo "== all parts done at ${SECONDS} s" | tee -a "$log"
python3 -m bench.gpu_tables "$out" 2>&1 | tee -a "$log"
