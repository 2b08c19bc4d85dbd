#!/usr/bin/env bash
# GPU check: chapter 8 at GPU sizes and the bandit trainer at GPU sizes, with timings.
#
# Usage (from the repository root, after `make book` or `make test` has built .venv):
#   bash benchmarks/gpu_check.sh              # on a CUDA machine; refuses without CUDA
#   bash benchmarks/gpu_check.sh --device cpu --quick   # smoke test of this script on a CPU
#
# Prints the device, the seconds of each part and the chapter's headline numbers, as JSON
# lines, and writes the executed chapter to $OUT (or a temporary folder). Budget: 5 minutes
# on one CUDA GPU. Exit status 2 when no CUDA device is visible (and --device cpu not given).
set -euo pipefail
cd "$(dirname "$0")/.."
device=cuda
quick=false
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --quick) quick=true; shift ;;
    *) echo "gpu_check.sh: unknown option $1 (use --device cpu|cuda, --quick)" >&2; exit 2 ;;
  esac
done
py=.venv/bin/python
if [ ! -x "$py" ]; then py=python3; fi
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
"$py" - "$device" <<'PY'
import json, sys, torch
device = sys.argv[1]
if device.startswith("cuda") and not torch.cuda.is_available():
    print("gpu_check.sh: no CUDA device is visible to torch "
          f"{torch.__version__}; run on a CUDA machine, or pass --device cpu", file=sys.stderr)
    sys.exit(2)
name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
print(json.dumps({"part": "device", "device": device, "name": name,
                  "torch": torch.__version__, "cuda": torch.version.cuda}))
PY
start=$(date +%s.%N)
"$py" -m grpo_companion run-chapter chapters/08_tiny_lm.md "$out/08_tiny_lm.ipynb" \
  -p device "$device" -p quick "$quick" > "$out/chapter.log" 2>&1 \
  || { tail -20 "$out/chapter.log" >&2; exit 1; }
end=$(date +%s.%N)
"$py" - "$out/08_tiny_lm.ipynb" "$start" "$end" <<'PY'
import ast, json, sys
import nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
glued = {}
for cell in nb.cells:
    for output in cell.get("outputs", []):
        scrap = output.get("metadata", {}).get("scrapbook", {})
        key = scrap.get("mime_prefix", "") + "text/plain"
        if scrap.get("name", "").startswith("ch08_") and key in output.get("data", {}):
            try:
                glued[scrap["name"]] = ast.literal_eval(output["data"][key])
            except (ValueError, SyntaxError):
                glued[scrap["name"]] = output["data"][key]
keep = ("ch08_device", "ch08_n_trained", "ch08_n_held", "ch08_iterations", "ch08_seeds",
        "ch08_train_s_per_iter", "ch08_elapsed", "ch08_pass_trained", "ch08_pass_held",
        "ch08_gain_held", "ch08_gain_held_se")
print(json.dumps({"part": "chapter 8", "seconds": round(float(sys.argv[3]) - float(sys.argv[2]), 1),
                  **{k: glued.get(k) for k in keep}}))
PY
"$py" - "$device" "$quick" <<'PY'
import json, sys, time
from grpo_companion.rl import TrainConfig, train
device, quick = sys.argv[1], sys.argv[2] == "true"
n_prompts = 512 if quick else 8192
config = TrainConfig(task="bandit", device=device, progress=False, n_prompts=n_prompts,
                     n_outputs=64, group_size=16, mu=4, iterations=10 if quick else 50,
                     beta=0.1, lr=0.1, eval_every=10)
started = time.perf_counter()
train(config)
seconds = time.perf_counter() - started
print(json.dumps({"part": "bandit", "prompts": n_prompts, "outputs": 64, "group_size": 16,
                  "iterations": config.iterations, "seconds": round(seconds, 2),
                  "iterations_per_s": round(config.iterations / seconds, 2)}))
PY
