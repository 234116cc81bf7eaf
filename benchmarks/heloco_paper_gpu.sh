#!/usr/bin/env bash
# The paper regime at the authors' scale on one GPU (issue 3): preset `paper-scale` (TinyGPT
# 8 x d128 with a GPT-2-sized BPE vocabulary, about 15M parameters, 10k local steps, H = 20),
# the severe pace setting [1,15,15,15,15], seven methods, three seeds: 21 cells. Batched
# (issue 15): JOBS processes share the device, each simulating BATCH cells side by side with
# the rounds of all their workers in one batched kernel (up to 11 x 5 = 55 models at once;
# about 25 GB of device memory per process, estimated). On a GPU the batched kernels are not
# guaranteed bit-identical to one round at a time (cuBLAS may pick other algorithms for
# batched shapes); on the CPU they are. Never run on a GPU here (none was lent); timings are
# not measured. Needs a Python with a CUDA build of torch and this package installed
# (`pip install -e '.[train]'` with a CUDA wheel at hand).
#
#   bash benchmarks/heloco_paper_gpu.sh                 # results -> benchmarks/results/
#   OUT=/some/folder JOBS=1 BATCH=21 bash benchmarks/heloco_paper_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "heloco_paper_gpu: error: no CUDA device visible to torch in $PY; this run needs a GPU" >&2
    exit 2
fi
DEST=${OUT:-benchmarks/results}
"$PY" benchmarks/heloco_paper.py \
    --regime paper-scale --device cuda --jobs "${JOBS:-2}" --batch-cells "${BATCH:-11}" \
    --paces "1,15,15,15,15" \
    --methods sync,async-nesterov,dn-dylu,mla,heloco,heloco-uncorrected,heloco+ab \
    --seeds 0,1,2 \
    --out "$DEST/heloco_paper_gpu" --markdown "$DEST/heloco_paper_gpu.md"
