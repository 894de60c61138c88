#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine, then runs every test twice,
# with fastai 2.8.7 (notebook tests through nbdev_test, then pytest) and with the newest
# fastai (notebooks through nbclient, then pytest). Runs on the CPU XLA device.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
export PJRT_DEVICE=CPU
echo "== fastai $(.venv/bin/python -c 'import fastai; print(fastai.__version__)'): notebooks (nbdev_test)"
.venv/bin/nbdev_export
git diff --exit-code -- fastai_xla || { echo "fastai_xla/ is out of date with nbs/: run nbdev_export and commit" >&2; exit 1; }
.venv/bin/nbdev_test --n_workers 2 --timing
echo "== fastai $(.venv/bin/python -c 'import fastai; print(fastai.__version__)'): pytest"
.venv/bin/python -m pytest -m "not notebooks" "$@" tests
echo "== fastai $(.venv-latest/bin/python -c 'import fastai; print(fastai.__version__)'): notebooks and pytest"
.venv-latest/bin/python -m pytest "$@" tests
