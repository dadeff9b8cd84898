#!/usr/bin/env bash
# vllm_pd.sh [--runs N] [--lengths 256,512,1024,2048] [--json FILE]: the same vLLM P/D workload
# with vLLM's NixlConnector and with kvx's KvxConnector in one run, on vLLM's CPU build in the
# project's .venv-vllm (made here if missing), and a table of D's time to first token, the KV
# transfer time and P's time until the blocks are freed, with kvx's ratio to NIXL
# (bench/vllm_pd.py says what each figure measures). A benchmark: it asserts nothing.
# --model deepseek_v4: the tiny DeepSeek-V4 (six KV cache groups in one packed row) instead of
# the 8-layer Llama. vllm_pd.sh --first-load [--sizes 64M,1G,8G] [--loaded] [--model
# llama-bench]: what D's first request from a new P costs as the cache grows
# (bench/vllm_first_load.py; DeepSeek-V4 by default, which needs a CPU with avx512_bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps --vllm >&2
make build >&2
export PYTHONPATH=$PWD/build/python KVX_BINARY_DIR=$PWD/build UCX_NET_DEVICES=lo \
  VLLM_HOST_IP=127.0.0.1 KVX_VLLM_WORK=${KVX_VLLM_WORK:-$PWD/build/vllm-bench}
if [[ ${1:-} == --first-load ]]; then
  shift
  exec .venv-vllm/bin/python bench/vllm_first_load.py "$@"
fi
exec .venv-vllm/bin/python bench/vllm_pd.py "$@"
