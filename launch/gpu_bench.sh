#!/usr/bin/env bash
# The accelerator benchmark, prepared for one NVIDIA H200 (budget: < 8 minutes).
#
#   launch/gpu_bench.sh [--quick] [--no-torch] [--no-tests] [--dry-run]
#
# Runs, in this order, each under its own time limit (a failing or timed-out part is
# recorded and the rest still run):
#   tests     the attention-backend tests on the device (cuDNN / Triton kernels vs the
#             xla oracle; they are skipped on CPU)                         ~1 min
#   train     bench train: Qwen2.5-1.5B shape, seq 4096, batch 8 (2 micro-batches), bf16 compute
#             with fp32 params, remat=full, attention=auto (cuDNN), next to transformers + PyTorch
#             (sdpa, autocast bf16, gradient checkpointing) unless --no-torch      ~2 min
#   sampler   bench sampler: Qwen2.5-0.5B shape, bf16, batches 64 and 256, prompt 128,
#             128 new tokens, vs transformers generate                     ~1.5 min
#   mismatch  bench mismatch: Qwen2.5-0.5B shape, bf16, trainer attention xla and auto ~1 min
#   step      bench step: one GRPO step on the Qwen2.5-0.5B shape, time split  ~2 min
# then prints a summary against the issue's targets (MFU >= 45% at 790 TFLOP/s; decode
# >= 60% of the 4.3 TB/s roofline and >= 20x transformers at batch 256; bf16 logprob
# mismatch max <= 2e-2, mean <= 1e-3), computed from the JSON files.
#
# Output: JSON + a log per part under $OUT (the device tool's output folder) if set, else
# bench_results/ (bench_results/quick/ with --quick).
#
#   --quick     everything on tiny shapes on the CPU (JAX_PLATFORMS=cpu), a few minutes at most;
#               what tests/bench checks
#   --no-torch  skip the transformers + PyTorch side of bench train
#   --no-tests  skip the device tests
#   --dry-run   print the commands, run nothing
set -uo pipefail

QUICK=0
TORCH=1
TESTS=1
DRY=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --no-torch) TORCH=0 ;;
    --no-tests) TESTS=0 ;;
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bench.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if [ "$QUICK" = 1 ]; then
  DEST="${OUT:-bench_results/quick}"
  export JAX_PLATFORMS=cpu
else
  DEST="${OUT:-bench_results}"
fi
STATUS="$DEST/status.txt"
if [ "$DRY" = 0 ]; then
  mkdir -p "$DEST"
  : > "$STATUS"
fi

if [ "$DRY" = 0 ] && ! "$PY" -c "import torch" 2>/dev/null; then
  echo "torch is not importable: no transformers comparison"
  TORCH=0
fi

# part NAME TIMEOUT_S COMMAND...: run (or print) one part; its output goes to NAME.log.
part() {
  local name="$1" limit="$2"
  shift 2
  if [ "$DRY" = 1 ]; then
    echo "$*"
    return 0
  fi
  echo "=== $name (limit ${limit}s): $*"
  local start rc
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$DEST/$name.log"
  rc=${PIPESTATUS[0]}
  echo "$name rc=$rc seconds=$(( $(date +%s) - start ))" | tee -a "$STATUS"
}

if [ "$QUICK" = 1 ]; then
  TRAIN=(--model tiny --batch 8 --seq-len 32 --dtype float32 --steps 1 --warmup 0 --torch-threads 1)
  SAMPLER=(--preset tiny --batch-sizes 2 --prompt-len 8 --new-tokens 4 --dtype float32 --repeats 1
           --share-n 2 --share-prompts 1 --share-prompt-len 16 --rl-prompts 2 --rl-n 2 --rl-concurrency 2
           --rl-max-tokens 8 --no-hf)
  MISMATCH=(--model tiny --dtypes bfloat16 --attention auto --prompts 2 --n 2 --prompt-len 8 --new-tokens 8)
  STEP=(--model tiny --prompts 4 --n 2 --response-length 8 --max-prompt-length 48 --dtype float32 --steps 1)
  LIMITS=(120 120 120 180)
else
  # 2 micro-batches of 4 rows: torch's full [rows, T, vocab] logits must fit next to JAX.
  TRAIN=(--model qwen2.5-1.5b --batch 8 --micro-batches 2 --seq-len 4096 --dtype bfloat16 --param-dtype float32
         --remat full --attention auto --steps 5 --warmup 1 --peak-flops 7.9e14)
  SAMPLER=(--preset qwen2.5-0.5b --batch-sizes 64,256 --prompt-len 128 --new-tokens 128 --dtype bfloat16
           --repeats 2)
  MISMATCH=(--model qwen2.5-0.5b --dtypes bfloat16 --attention xla,auto --prompts 32 --n 4 --prompt-len 128
            --new-tokens 128)
  STEP=(--model qwen2.5-0.5b --prompts 16 --n 8 --response-length 128 --max-prompt-length 64 --dtype bfloat16
        --param-dtype float32 --remat full --attention auto --steps 3)
  LIMITS=(200 150 150 200)
fi
if [ "$TORCH" = 1 ]; then
  TRAIN+=(--torch)
else
  SAMPLER+=(--no-hf)
fi

if [ "$TESTS" = 1 ] && [ "$QUICK" = 0 ]; then
  # tests/conftest.py defaults JAX_PLATFORMS to cpu: point it at the GPU.
  part tests 150 env JAX_PLATFORMS=cuda "$PY" -m pytest -q tests/models/test_attention_backends.py
fi
# Both systems share the GPU in bench train --torch: JAX takes 45% up front, torch the rest.
MEM=()
[ "$TORCH" = 1 ] && [ "$QUICK" = 0 ] && MEM=(env "XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.45}")
part train "${LIMITS[0]}" "${MEM[@]}" "$PY" -m rljax.cli bench train "${TRAIN[@]}" --out "$DEST/train.json"
part sampler "${LIMITS[1]}" "$PY" -m rljax.cli bench sampler "${SAMPLER[@]}" --out "$DEST/sampler.json"
part mismatch "${LIMITS[2]}" "$PY" -m rljax.cli bench mismatch "${MISMATCH[@]}" --out "$DEST/mismatch.json"
part step "${LIMITS[3]}" "$PY" -m rljax.cli bench step "${STEP[@]}" --out "$DEST/step.json"

[ "$DRY" = 1 ] && exit 0

echo "=== summary ($DEST)"
"$PY" - "$DEST" "$QUICK" <<'EOF'
import json, os, sys

dest, quick = sys.argv[1], sys.argv[2] == "1"
if quick:
    print("  (--quick: tiny shapes on the CPU; the numbers check the plumbing, not the targets)")


def load(name):
    path = os.path.join(dest, f"{name}.json")
    return json.load(open(path))["rows"] if os.path.exists(path) else None


def check(label, value, target, higher=True):
    if value is None:
        print(f"  {label:<44} not measured")
        return
    ok = value >= target if higher else value <= target
    verdict = "n/a in --quick" if quick else ("yes" if ok else "NO")
    print(f"  {label:<44} {value:.4g}  (target {'>=' if higher else '<='} {target:g}: {verdict})")


train = load("train") or []
rl = next((r for r in train if r.get("system") == "rljax"), {})
tr = next((r for r in train if r.get("system") == "torch"), {})
check("train MFU (actor update)", rl.get("mfu"), 0.45)
if tr.get("ratio"):
    print(f"  {'train speed-up over transformers':<44} {tr['ratio']:.3g}x")
sampler = load("sampler") or []
big = max(sampler, key=lambda r: r.get("batch", 0), default={})
check(f"decode roofline fraction (batch {big.get('batch')})", big.get("roofline_frac"), 0.60)
check(f"decode speed-up over transformers (batch {big.get('batch')})", big.get("ratio"), 20.0)
for r in load("mismatch") or []:
    check(f"mismatch max ({r['dtype']}, {r['attention']})", r["max_abs"], 2e-2, higher=False)
    check(f"mismatch mean ({r['dtype']}, {r['attention']})", r["mean_abs"], 1e-3, higher=False)
steps = load("step") or []
if steps:
    last = steps[-1]
    split = ", ".join(f"{k}={last[k]:.3g}s" for k in ("gen", "old_log_prob", "ref", "update_actor", "step")
                      if last.get(k) is not None)
    print(f"  {'GRPO step (last)':<44} {split}")
EOF
cat "$STATUS"
! grep -qv "rc=0 " "$STATUS"
