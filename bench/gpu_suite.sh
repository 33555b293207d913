#!/usr/bin/env bash
# Every GPU figure issue 14 asks for, in one go, for the short time a GPU machine is lent:
#
#   bash bench/gpu_suite.sh OUT                 # on the GPU machine, repo root, `make venv` done
#   DEVICE=cpu QUICK=1 bash bench/gpu_suite.sh /tmp/gpu-suite   # the same plumbing, small, on a CPU
#
# Writes OUT/*.txt (each bench's table and JSON), OUT/util.csv (nvidia-smi samples, 1 s, during the
# snake training run) and OUT/summary.txt. Steps, in order of value per minute of GPU time:
#   1. the CUDA tests (tests/test_trainer_gpu.py)
#   2. env steps/s, eager vs compiled, 4k..1M snake envs (bench/bench_envs.py --compile)
#   3. PPO end-to-end steps/s on snake, fp32 vs bf16, eager vs compiled (bench/bench_ppo.py)
#   4. CartPole time to solve on the GPU, 3 seeds (wall_s from process start, THRUST_DONE)
#   5. snake on the GPU: a large-batch run (SNAKE_GPU_ARGS) with utilisation sampled, then 100
#      greedy episodes of its model
set -euo pipefail
out=${1:?usage: bench/gpu_suite.sh OUTDIR}
mkdir -p "$out"
PY=${PY:-.venv/bin/python}
DEV=${DEVICE:-cuda}
if [ -n "${QUICK:-}" ]; then
  ENV_COUNTS=256,1024; PPO_COUNTS=256; SOLVE_SEEDS="1"; STEPS=50
  SNAKE_GPU_ARGS=${SNAKE_GPU_ARGS:-"--num-envs 256 --total-steps 100000"}
else
  ENV_COUNTS=4096,65536,262144,1048576; PPO_COUNTS=16384,65536,262144; SOLVE_SEEDS="1 2 3"; STEPS=200
  # A first guess at a GPU preset (never run yet): many envs, wide network, big minibatches.
  SNAKE_GPU_ARGS=${SNAKE_GPU_ARGS:-"--num-envs 65536 --hidden 256 --num-minibatches 8 --total-steps 400000000 --precision bf16 --compile"}
fi
say() { echo "== $*" | tee -a "$out/summary.txt"; }

say "$(date -u +%FT%TZ) device=$DEV quick=${QUICK:-0} commit=$(git rev-parse --short HEAD)"
if command -v nvidia-smi >/dev/null; then nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true; fi

if [ "$DEV" = cuda ]; then
  say "1. CUDA tests"
  "$PY" -m pytest -q -p no:cacheprovider tests/test_trainer_gpu.py 2>&1 | tee "$out/cuda-tests.txt" | tail -2
fi

say "2. env steps/s (eager vs compiled)"
"$PY" bench/bench_envs.py --device "$DEV" --compile --counts "$ENV_COUNTS" --snake-counts "$ENV_COUNTS" \
  --steps "$STEPS" --json > "$out/envs.txt" 2>&1
grep -v '^{' "$out/envs.txt" | tee -a "$out/summary.txt"

say "3. PPO steps/s on snake"
for prec in fp32 bf16; do
  for comp in "" --compile; do
    "$PY" bench/bench_ppo.py --seeds 0 --sb3-seeds 0 --device "$DEV" --throughput-env snake \
      --counts "$PPO_COUNTS" --threads 1 --precision "$prec" $comp > "$out/ppo-$prec${comp}.txt" 2>&1
    echo "-- $prec ${comp:-eager}" | tee -a "$out/summary.txt"
    tail -4 "$out/ppo-$prec${comp}.txt" | tee -a "$out/summary.txt"
  done
done

say "4. CartPole solved, wall time from process start"
for seed in $SOLVE_SEEDS; do
  "$PY" -m trainer.train --env cartpole --device "$DEV" --seed "$seed" --run-dir "$out/cartpole-$seed" \
    > "$out/cartpole-$seed.txt" 2>&1
  grep '^THRUST_DONE' "$out/cartpole-$seed.txt" | tee -a "$out/summary.txt"
done

say "5. snake on $DEV: $SNAKE_GPU_ARGS"
sampler=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$out/util.csv" &
  sampler=$!
fi
# shellcheck disable=SC2086  # SNAKE_GPU_ARGS is a list of flags
"$PY" -m trainer.train --env snake --device "$DEV" $SNAKE_GPU_ARGS --log-interval 5 \
  --run-dir "$out/snake" --export "$out/snake/model.onnx" > "$out/snake.txt" 2>&1 || true
[ -n "$sampler" ] && kill "$sampler"
grep '^THRUST_DONE' "$out/snake.txt" | tee -a "$out/summary.txt"
if [ -f "$out/snake/model.onnx" ]; then
  "$PY" -m trainer.eval "$out/snake/model.onnx" --episodes 100 --json | tail -1 | tee -a "$out/summary.txt"
fi
say "done $(date -u +%FT%TZ)"
