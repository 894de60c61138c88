#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine (scripts/env.sh), then runs the tests on
# every supported stack, on the CPU XLA device:
#   1. the development stack (.venv: torch/torch_xla 2.9 + fastai 2.8.7, fastcore 1): first the fast tier (`pytest -m fast`:
#      the runtime's pieces in one process, under a minute), then the exported package and README
#      up to date with nbs/, the docstrings short (tools/docstrings.py), the linter (ruff) clean, every pytest test (the README's snippets among them, run as written) and the docs build
#      (a page per notebook)
#   2. Colab's TPU image (.venv-colab: Python 3.13, torch/torch_xla 2.9 + the newest fastai, fastcore 2), fastai_xla
#      installed with the README's command, in one pytest run: every notebook's tests in a Jupyter kernel (run here
#      only: on the newest fastai, where fastai's changes show first; `nbdev_test` runs them on .venv, as a developer
#      does), and the tests marked `fastai_version` (what fastai's or Python's version decides: fastai's training
#      features, pickling, replica processes, a launch from a notebook's kernel; not what torch_xla's alone decides:
#      its torch_xla is .venv's); tests/conftest.py lists them, with why
#   3. Kaggle's TPU image (.venv-kaggle: Python 3.12, torch/torch_xla 2.8 + fastai 2.8.7), fastai_xla installed with
#      the README's command: the tests marked `stacks`, and the demo
#   4. TorchTPU's stack (.venv-torchtpu: torch 2.13, torch-tpu 0.2.0, no torch_xla): what runs without a chip
# Stack 1 also runs the native backend's tests (FASTAI_XLA_BACKEND=native) on two devices apart from the host that stand
# in for TorchTPU's chip: torch_xla's CPU device (FASTAI_XLA_NATIVE_DEVICE=xla, lazy) and the project's eager `tpu` test
# device (FASTAI_XLA_NATIVE_DEVICE=tpu, tests/eager_tpu.py: built with a C++ compiler on the first use); replicas over gloo.
# At the end, a line per stack with its time (set-up included), for the next change to see what it costs.
# `--all` (first argument) also runs the tests marked `slow` (tests/conftest.py's SLOW: the slowest end-to-end runs, each with
# what covers it in the default run), the native backend's whole files and the notebooks with nbdev_test on .venv. The
# default run is CI's; its time, and each stack's, are printed at the end (the goal: at most 35 minutes from a fresh clone,
# set-up included; never past 50). Other arguments go to every pytest run.
set -euo pipefail
ALL=0; if [ "${1:-}" = --all ]; then ALL=1; shift; fi
SLOW_TESTS=$([ $ALL = 1 ] && echo "" || echo " and not slow")
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
times=()
lap() { times+=("$1: $(( (SECONDS - lap_start) / 60 )) min $(( (SECONDS - lap_start) % 60 )) s"); lap_start=$SECONDS; }
start=$SECONDS; lap_start=$SECONDS
# Work that keeps one core busy runs beside other work, its output kept in a log for when it is needed: TorchTPU's
# environment beside .venv's set-up (pip keeps one core busy, and TorchTPU's stack needs nothing of .venv); Colab's and
# Kaggle's (which link .venv's CUDA libraries) while stack 1 runs; at the end, the single processes side by side.
LOGS="$ROOT/.test-logs"; rm -rf "$LOGS"; mkdir -p "$LOGS"
in_background() {   # $1: the name its time line gives, then the command; its log: $LOGS/<name>.log, its pid: $!
    local name=$1; shift
    ( s=$SECONDS; "$@" && echo "$name: $(( (SECONDS - s) / 60 )) min $(( (SECONDS - s) % 60 )) s" ) > "$LOGS/$name.log" 2>&1 &
}
finish() {   # each "pid name" given: wait for it, print its log; stop at the first that failed
    for job in "$@"; do
        read -r pid name <<< "$job"
        if ! wait "$pid"; then cat "$LOGS/$name.log" >&2; echo "fastai_xla: $name failed (above)" >&2; exit 1; fi
        cat "$LOGS/$name.log"; times+=("$(tail -n 1 "$LOGS/$name.log")")   # (its time line, for the summary)
    done
}
setup() { bash -c "source '$ROOT/scripts/env.sh' $1"; }
in_background "torchtpu set-up" setup torchtpu; TORCHTPU_SETUP=$!
source "$ROOT/scripts/env.sh"
lap "set-up (.venv)"
in_background "colab-kaggle set-up" setup colab-kaggle; IMAGES_SETUP=$!
cd "$ROOT"
export PJRT_DEVICE=CPU
stack() { "$1/bin/python" -c 'import sys, torch, torch_xla, fastai; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, torch_xla {torch_xla.__version__}, fastai {fastai.__version__}")'; }

DEV=$(stack .venv)   # (each stack's versions read once: a Python process importing torch, torch_xla and fastai, ~10 s)
echo "== 1. $DEV: the fast tier, the runtime's pieces in this process (tests/test_runtime_units.py: under a minute)"
.venv/bin/python -m pytest -m fast "$@" tests/test_runtime_units.py
lap "stack 1 fast tier"
echo "== 1. $DEV: the package and README up to date with nbs/"
.venv/bin/nbdev_export
git diff --exit-code -- fastai_xla || { echo "fastai_xla/ is out of date with nbs/: run nbdev_export and commit" >&2; exit 1; }
.venv/bin/python tools/readme.py --check
.venv/bin/python tools/docstrings.py --check   # one line each, median <= 70 characters, none over 200
.venv/bin/python tools/docs.py --check-cells   # no cell the docs build would refuse (the site itself is built at the end)
.venv/bin/ruff check .   # pyflakes' rules (pyproject.toml): no unused import or variable, no undefined name, no redefinition
if [ $ALL = 1 ]; then   # (--all: the notebooks' tests on this stack too, each in a process of its own, two at a time)
    ls nbs/*.ipynb | xargs -P 2 -I{} .venv/bin/nbdev_test --path {} --timing
fi
echo "== 1. $DEV: pytest"
# two at a time, a file per worker (a file's shared fixtures made once): most tests wait on replica processes
.venv/bin/python -m pytest -n 2 --dist loadfile -m "not notebooks and not fast$SLOW_TESTS" --durations=15 "$@" tests   # (the slowest 15: where its time goes)
lap "stack 1 pytest"
NATIVE_FILES="tests/test_single_device.py tests/test_replicas.py tests/test_checkpoint.py tests/test_launch.py tests/test_applications.py
    tests/test_readme.py tests/test_preemption.py tests/test_text.py tests/test_eager_tpu.py"
echo "== 1. $DEV: pytest again on the native backend, on two devices apart from the host that stand in for TorchTPU's"
echo "   chip (FASTAI_XLA_BACKEND=native; replicas over gloo): torch_xla's CPU device (FASTAI_XLA_NATIVE_DEVICE=xla, lazy),"
echo "   then the eager \`tpu\` test device (FASTAI_XLA_NATIVE_DEVICE=tpu: tests/eager_tpu.py, built here on the first use)"
# (tests/conftest.py's NATIVE_TESTS on both, and its ON_THE_EAGER_STAND_IN on the `tpu` one; with --all, the whole files, and the selection again on the host)
for device in xla tpu; do
    FASTAI_XLA_BACKEND=native FASTAI_XLA_NATIVE_DEVICE=$device .venv/bin/python -m pytest -n 2 --dist loadfile \
        -m "$([ $ALL = 1 ] && echo "not notebooks" || echo native)" "$@" $NATIVE_FILES
done
if [ $ALL = 1 ]; then
    FASTAI_XLA_BACKEND=native FASTAI_XLA_NATIVE_DEVICE=cpu .venv/bin/python -m pytest -n 2 --dist loadfile -m native "$@" $NATIVE_FILES
fi
lap "stack 1 native backend"
echo "== the image stacks' environments (made in the background during stack 1)"
finish "$TORCHTPU_SETUP torchtpu set-up" "$IMAGES_SETUP colab-kaggle set-up"
lap "waiting for the image stacks' set-up"
echo "== 2. $(stack .venv-colab): the notebooks in a Jupyter kernel, and pytest: what fastai's or Python's version decides"
# one run, two at a time: each notebook a unit of work, each test file one (tests/conftest.py's xdist groups)
.venv-colab/bin/python -m pytest -n 2 --dist loadgroup -m "notebooks or (fastai_version$SLOW_TESTS)" --durations=10 "$@" tests
lap "stack 2 (Colab)"

KAGGLE=$(stack .venv-kaggle)
echo "== 3. $KAGGLE: pytest, what differs between the stacks"
.venv-kaggle/bin/python -m pytest -n 2 --dist loadfile -m "stacks$SLOW_TESTS" "$@" tests
lap "stack 3 (Kaggle) pytest"

# three single processes, side by side on the two cores: the demo on Kaggle's stack, TorchTPU's stack, the docs site
echo "== side by side: 3. $KAGGLE: the demo; 4. TorchTPU without a chip; 1. the docs site"
torchtpu_stack() {
    echo "== 4. $(.venv-torchtpu/bin/python -c 'import sys, torch, importlib.metadata as m, fastai; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, torch-tpu {m.version(\"torch_tpu\")}, fastai {fastai.__version__}")' 2>/dev/null): TorchTPU without a chip"
    PYTHONWARNINGS=ignore .venv-torchtpu/bin/python -m pytest "$@" tests/test_torchtpu.py
}
in_background "stack 3 (Kaggle) demo" .venv-kaggle/bin/python examples/train_digits.py --epochs 3; DEMO=$!
in_background "stack 4 (TorchTPU)" torchtpu_stack "$@"; TORCHTPU=$!
in_background "stack 1 docs" env PATH="$ROOT/.venv/bin:$PATH" .venv/bin/python tools/docs.py; DOCS=$!
finish "$DEMO stack 3 (Kaggle) demo" "$TORCHTPU stack 4 (TorchTPU)" "$DOCS stack 1 docs"
lap "the demo, TorchTPU's stack and the docs, side by side"
printf '%s\n' "${times[@]}"
echo "== all stacks passed in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s, set-up included"
