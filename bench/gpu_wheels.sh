#!/usr/bin/env bash
# The wheels `bench/gpu_checks.sh` installs on a GPU machine without network to serve the app there: Gradio and
# what it needs beyond a PyTorch image (CPython 3.12, Linux x86-64), at the versions the app is tested with.
# Downloaded into .whl/ (git ignores it); about 37 MB, carried with the checkout to that machine.
# Usage: bash bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  gradio==6.31.0 gradio_client==2.7.2 hf-gradio==0.4.1 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
  pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing_extensions==4.16.0 \
  orjson==3.13.0 brotli==1.2.1 groovy==0.1.2 pydub==0.25.1 python-multipart==0.0.34 pytz==2026.6 \
  safehttpx==0.1.7 semantic-version==2.10.0 tomlkit==0.14.0 opentelemetry-api==1.45.2
du -sh .whl
