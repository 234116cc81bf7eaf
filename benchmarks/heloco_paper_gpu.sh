#!/usr/bin/env bash
# The paper regime at the authors' scale on one GPU (issue 3): preset `paper-scale` (TinyGPT
# 8 x d128 with a GPT-2-sized BPE vocabulary, about 15M parameters, 10k local steps, H = 20),
# the severe pace setting [1,15,15,15,15], seven methods, three seeds: 21 cells, run JOBS at a
# time on the one device. Sized for a 10-minute device call (about 1-2 min per cell on an
# H100-class GPU, estimated, never measured). Needs a Python with a CUDA build of torch and
# this package installed (`pip install -e '.[train]'` with a CUDA wheel at hand).
#
#   bash benchmarks/heloco_paper_gpu.sh                 # results -> benchmarks/results/
#   OUT=/some/folder JOBS=8 bash benchmarks/heloco_paper_gpu.sh
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
    --regime paper-scale --device cuda --jobs "${JOBS:-10}" \
    --paces "1,15,15,15,15" \
    --methods sync,async-nesterov,dn-dylu,mla,heloco,heloco-uncorrected,heloco+ab \
    --seeds 0,1,2 \
    --out "$DEST/heloco_paper_gpu" --markdown "$DEST/heloco_paper_gpu.md"
