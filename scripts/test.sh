#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine (scripts/env.sh), then runs the tests on
# every supported stack, on the CPU XLA device:
#   1. torch/torch_xla 2.9 + fastai 2.8.7 (fastcore 1): the notebooks' tests (nbdev_test), then pytest (with the
#      README's snippets, run as written)
#   2. torch/torch_xla 2.9 + the newest fastai (fastcore 2): the notebooks (nbclient), then the tests of what depends
#      on fastai's version (not the README's snippets, the end-to-end text tests, SPMD, device, packaging, checkpoints)
#   3. Kaggle's TPU image stack, torch/torch_xla 2.8 + fastai 2.8.7 on Python 3.12, fastai_xla installed with the
#      README's Kaggle command: the device, single-device, replica, checkpoint, launch, packaging, text, applications
#      and import tests, and the demo
# At the end, a line per stack with its time (set-up included), for the next change to see what it costs.
# Extra arguments go to every pytest run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
times=()
lap() { times+=("$1: $(( (SECONDS - lap_start) / 60 )) min $(( (SECONDS - lap_start) % 60 )) s"); lap_start=$SECONDS; }
lap_start=$SECONDS
source "$ROOT/scripts/env.sh" kaggle
lap "set-up (environments)"
cd "$ROOT"
export PJRT_DEVICE=CPU
stack() { "$1/bin/python" -c 'import sys, torch, torch_xla, fastai; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, torch_xla {torch_xla.__version__}, fastai {fastai.__version__}")'; }
start=$SECONDS
echo "== 1. $(stack .venv): notebooks (nbdev_test)"
.venv/bin/nbdev_export
git diff --exit-code -- fastai_xla || { echo "fastai_xla/ is out of date with nbs/: run nbdev_export and commit" >&2; exit 1; }
# each notebook in a process of its own (nbdev_test's workers run several in one process, and a notebook's export cells
# patch its own `to_xla` onto fastai's Learner: a later notebook there would use the first one's copy), two at a time
ls nbs/*.ipynb | xargs -P 2 -I{} .venv/bin/nbdev_test --path {} --timing
lap "stack 1 notebooks"
echo "== 1. $(stack .venv): pytest"
.venv/bin/python -m pytest -m "not notebooks" "$@" tests
lap "stack 1 pytest"
# the newest fastai: what depends on fastai's version (the notebooks, learners, data, metrics, callbacks, launch's
# pickling, the import check), not what only torch_xla or the machine decides (device, SPMD, packaging, checkpoint files)
echo "== 2. $(stack .venv-latest): notebooks and pytest"
.venv-latest/bin/python -m pytest -m "not readme and not text" "$@" tests/test_notebooks.py tests/test_learner_scope.py \
    tests/test_single_device.py tests/test_applications.py tests/test_fastai_features.py tests/test_launch.py \
    tests/test_replicas.py tests/test_notebook_launch.py
lap "stack 2"
echo "== 3. $(stack .venv-kaggle): pytest"
.venv-kaggle/bin/python -m pytest -m "not notebooks" "$@" tests/test_device.py tests/test_single_device.py \
    tests/test_replicas.py tests/test_checkpoint.py tests/test_launch.py tests/test_packaging.py tests/test_text.py \
    tests/test_applications.py tests/test_learner_scope.py
echo "== 3. $(stack .venv-kaggle): the demo"
.venv-kaggle/bin/python examples/train_digits.py --epochs 3
lap "stack 3"
printf '%s\n' "${times[@]}"
echo "== all stacks passed in $(( (SECONDS - start) / 60 )) min (set-up not counted)"
