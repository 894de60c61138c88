#!/usr/bin/env bash
# The native backend (TorchTPU's path) on an NVIDIA GPU, the one device apart from the host that a machine without a TPU
# may have: `cuda` stands in for TorchTPU's chip (FASTAI_XLA_NATIVE_DEVICE=cuda; replicas share the card over gloo).
# Run on a GPU machine whose Python has a CUDA torch, fastai and fastai_xla installed (no torch_xla needed), from this
# checkout's root:   bash scripts/native_gpu.sh [pytest's arguments]
# It prints the versions and the card, then runs, each with its time:
#   1. the self-check (`python -m fastai_xla.check`): every way of running, on the card;
#   2. the native tests (tests/conftest.py's NATIVE_TESTS, as scripts/test.sh runs them on its two stand-in devices),
#      each against fastai's own path on the same machine (which is fastai's CUDA path there);
#   3. benchmarks/native_device.py: the README's vision recipe and a tabular learner, on the native backend against
#      fastai's own (CUDA) path, the same seeds and epochs, and with `compile=True` (torch.compile, inductor on CUDA);
#   4. `fsdp=True` on the card: one replica (nccl refuses two ranks on one GPU) sharded by FSDP2 over nccl, trained as
#      replicated, its torch.distributed.checkpoint saves at once and in the background, export and detach_xla.
# Left out where spaCy is not installed: the text classifier (fastai's default tokenizer needs it).
set -uo pipefail
export FASTAI_XLA_BACKEND=native FASTAI_XLA_NATIVE_DEVICE=cuda PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"$PY" - <<'VERSIONS'
import sys, torch, fastai, fastcore, importlib.metadata as m
print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, fastai {fastai.__version__}, fastcore {fastcore.__version__}, "
      f"fastai_xla {m.version('fastai_xla')}; {torch.cuda.get_device_name(0)}")
VERSIONS
failed=()
step() {   # $1: its name, then the command
    local name=$1 s=$SECONDS; shift
    echo "== $name"
    "$@" || failed+=("$name")
    echo "== $name: $(( SECONDS - s )) s"
}
NATIVE_FILES="tests/test_single_device.py tests/test_replicas.py tests/test_checkpoint.py tests/test_launch.py
    tests/test_applications.py tests/test_preemption.py tests/test_text.py"
text=(); "$PY" -c 'import spacy' 2>/dev/null || text=(-k 'not test_classifier_learns_like_eager')
step "1. the self-check" "$PY" -m fastai_xla.check
step "2. the native tests" "$PY" -m pytest -n 4 --dist loadfile -m native "${text[@]}" "$@" $NATIVE_FILES
step "3. benchmarks/native_device.py" "$PY" benchmarks/native_device.py --epochs 3 --compile
step "4. fsdp=True on the card" env FASTAI_XLA_FSDP_DEVICE=cuda "$PY" -m pytest -q tests/test_fsdp.py -k one_replica
if [ ${#failed[@]} -gt 0 ]; then echo "failed: ${failed[*]}"; exit 1; fi
echo "all passed"
