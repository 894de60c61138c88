#!/usr/bin/env bash
# The main job: sets everything up on a fresh machine, then trains a fastai vision learner on
# scikit-learn's digits on the best XLA device here (a TPU if there is one, else the CPU XLA device).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
exec "$ROOT/.venv/bin/python" "$ROOT/examples/train_digits.py" "$@"
