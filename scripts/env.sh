# Source me: creates (once) the environments fastai_xla is developed and tested in.
#   .venv         Python 3 (3.11 here), torch 2.9.0 + torch_xla 2.9.0, fastai 2.8.7 and nbdev 2 (nbdev 2 needs
#                 fastcore < 2, so this is the newest fastai it can live with), nbconvert for the docs: the
#                 development environment (and transformers, for the test of a Hugging Face model in a Learner)
# and, with `source scripts/env.sh images`, copies of the two TPU images users train on, each with fastai_xla
# installed by the README's command for them (the image's torch stack and fastcore kept):
#   .venv-colab   Colab's TPU image: Python 3.13 (if there is one), torch 2.9.0, torch_xla 2.9.0, torchvision
#                 0.24.0 and the newest fastai (fastcore 2)
#   .venv-kaggle  Kaggle's TPU image: Python 3.12 (if there is one), torch 2.8.0, torch_xla 2.8.0, torchvision
#                 0.23.0, fastcore < 2
#   .venv-torchtpu TorchTPU's stack: torch 2.13.0, torch-tpu 0.2.0, the newest fastai, no torch_xla
# Idempotent: a stamp file records what was installed; a changed spec reinstalls. Every pip is the newest.
# Disk: PyPI's Linux torch wheels bring ~4 GB of CUDA libraries (unused here and on a TPU); .venv takes ~8 GB, each image
# ~3 GB more (they share .venv's identical CUDA libraries as hard links); pip keeps no cache of these wheels.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
# no second copy of 4 GB of wheels in ~/.cache/pip; no byte-compiling of every installed module (minutes of a core for
# torch's thousands): Python compiles what is imported, once, on first import, and keeps the bytecode. Unless
# PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines): then every process would compile torch's, torch_xla's
# and fastai's sources again (seen: `from tests/helpers import *` 31 s instead of 10, the test command 1.7 times as long).
# Whoever sources this file writes bytecode into these environments.
PIP_QUIET=(-q --disable-pip-version-check --no-cache-dir --no-compile)
unset PYTHONDONTWRITEBYTECODE
BASE_SPEC="torch==2.9.0 torch_xla==2.9.0 torchvision==0.24.0 fastai==2.8.7 fastcore==1.14.5 nbdev==2.4.14 execnb==0.1.18 scikit-learn pytest nbclient ipykernel transformers==5.24.0"
TEST_TOOLS="pytest pytest-xdist nbclient ipykernel scikit-learn"

_stamp_ok() { [ -f "$1/.fastai_xla-stamp" ] && [ "$(cat "$1/.fastai_xla-stamp")" = "$2" ]; }
_new_venv() {   # a new virtual environment at $2 from the interpreter $1, with the newest pip
    rm -rf "$2"
    "$1" -m venv "$2"
    "$2/bin/pip" install "${PIP_QUIET[@]}" -U pip
}
_need_disk() {   # $1: GB that the next step needs free where the environments live; stop early and say so
    local free_gb=$(( $(df -Pk "$ROOT" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
    if [ "$free_gb" -lt "$1" ]; then
        echo "fastai_xla: $2 needs about $1 GB free on $(df -P "$ROOT" | awk 'NR==2 {print $6}'), there are $free_gb GB." >&2
        echo "  Free some space (an old .venv* of another checkout, ~/.cache/pip) and run the command again." >&2
        exit 1
    fi
}
# torch 2.8 pins (almost) the same CUDA libraries as torch 2.9, and those wheels are the same files for every Python:
# link .venv's into a new environment (no second 4 GB); pip replaces the few whose versions differ.
_share_cuda_libs() {   # $1: the site-packages to take them from, $2: the new site-packages
    [ -d "$1/nvidia" ] || return 0
    if ! { cp -al "$1/nvidia" "$2/" && cp -al "$1"/nvidia_*.dist-info "$2/"; } 2>/dev/null; then
        rm -rf "$2/nvidia" "$2"/nvidia_*.dist-info   # another filesystem: pip installs its own copies
    fi
}
_site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
_quiet_pip() { grep -v "is ignored: it is neither\|^Not uninstalling\|outside environment\|Can't uninstall" >&2 || true; }
# setuptools' "Editable installation" notice (a box of stars) on `pip install -e`: about folders named as the package
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation"
_pip() {   # $1: the environment, the rest: pip install's arguments; pip is quiet, so a line every 30 s says it works
    local venv="$1" start=$SECONDS ticker rc=0; shift
    ( while sleep 30; do echo "  ... $(du -sm "$venv" 2>/dev/null | cut -f1) MB in $(basename "$venv") after $(( SECONDS - start )) s" >&2; done ) &
    ticker=$!
    "$venv/bin/pip" install "${PIP_QUIET[@]}" "$@" 2>&1 | _quiet_pip || rc=$?
    kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
    return "$rc"
}

dev_env() {   # .venv
    if ! _stamp_ok "$ROOT/.venv" "$BASE_SPEC"; then
        _need_disk 12 "creating $ROOT/.venv (torch + torch_xla)"
        echo "fastai_xla: creating $ROOT/.venv (torch + torch_xla take a few minutes)..." >&2
        _new_venv "$PY" "$ROOT/.venv"
        _pip "$ROOT/.venv" $BASE_SPEC
        _pip "$ROOT/.venv" --no-deps -e "$ROOT"
        echo "$BASE_SPEC" > "$ROOT/.venv/.fastai_xla-stamp"
    fi

    # added since .venv's spec: the docs' renderer where Quarto is missing (nbconvert), tests two at a time (pytest-xdist),
    # timm's models for benchmarks/architectures.py, the linter (ruff, pinned: a new release may add findings), ninja for
    # torch's C++ extension builder (the eager `tpu` test device, tests/eager_tpu.py; it also needs a C++ compiler, g++),
    # the loggers fastai offers that users keep for long runs (TensorBoard's and Weights & Biases', offline in the tests)
    DEV_EXTRAS="nbconvert pytest-xdist timm ruff==0.8.6 ninja tensorboard wandb"
    if [ "$(cat "$ROOT/.venv/.extras-stamp" 2>/dev/null)" != "$DEV_EXTRAS" ]; then
        _pip "$ROOT/.venv" $DEV_EXTRAS
        echo "$DEV_EXTRAS" > "$ROOT/.venv/.extras-stamp"
    fi
}

# the README's install command for the TPU images (they bring torch_xla), with this checkout as the source
image_install() {   # $1: the environment, $2: what to install
    "$1/bin/pip" list --format=freeze | grep -iE '^(torch|torchvision|torch[-_]xla|torch[-_]tpu|libtpu|fastcore)==' > "$1/keep.txt"
    "$1/bin/pip" install "${PIP_QUIET[@]}" -c "$1/keep.txt" "$2"
}
_python() {   # $1: a version (3.13): that Python if there is one (on PATH, or one of pyenv's), else the default one
    local candidate
    for candidate in "python$1" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1"*/bin/"python$1"; do
        if "$candidate" -c 'import venv, ensurepip, ssl' 2>/dev/null; then echo "$candidate"; return; fi
    done
    echo "fastai_xla: no Python $1 here, its image's environment uses $("$PY" --version)" >&2
    echo "$PY"
}
image_env() {   # $1: the environment's name (colab, kaggle), $2: its Python's version, $3: what its image brings
    local venv="$ROOT/.venv-$1" py stamp
    py="$(_python "$2")"
    stamp="$("$py" --version) | $3 | shared CUDA libraries | image_install | $TEST_TOOLS"
    if ! _stamp_ok "$venv" "$stamp"; then
        _need_disk 5 "creating $venv"
        echo "fastai_xla: creating $venv ($("$py" --version), $1's TPU image: $3)..." >&2
        _new_venv "$py" "$venv"
        _share_cuda_libs "$(_site "$ROOT/.venv")" "$(_site "$venv")"
        _pip "$venv" $3
        "$venv/bin/pip" list --format=freeze > "$venv/image.txt"
        image_install "$venv" "$ROOT" 2>&1 | _quiet_pip
        # installing fastai_xla must leave the image's torch stack as it was
        "$venv/bin/pip" list --format=freeze > "$venv/after.txt"
        if ! diff <(grep -iE '^(torch|torchvision|torch[-_]xla|fastcore)==' "$venv/image.txt") \
                  <(grep -iE '^(torch|torchvision|torch[-_]xla|fastcore)==' "$venv/after.txt") >&2; then
            echo "fastai_xla: the README's install command changed $1's torch stack (above)" >&2; exit 1
        fi
        _pip "$venv" $TEST_TOOLS
        echo "$stamp" > "$venv/.fastai_xla-stamp"
    fi
    # a regular (not editable) install, as on the image: refresh it from this checkout (a few seconds)
    "$venv/bin/pip" install "${PIP_QUIET[@]}" --no-deps --force-reinstall "$ROOT" 2>&1 | _quiet_pip
}

COLAB_IMAGE="torch==2.9.0 torch_xla==2.9.0 torchvision==0.24.0 fastai tensorboard"   # Colab's TPU image (2026-08, which has TensorBoard), fastai the newest
KAGGLE_IMAGE="torch==2.8.0 torch_xla==2.8.0 torchvision==0.23.0 fastcore<2"   # Kaggle's TPU image (mid 2026)
# TorchTPU's stack, the native backend's TPU device: torch 2.13 + torch-tpu 0.2.0 (and its libtpu) + fastai, no torch_xla;
# fastai_xla installed with the README's command for it. Without a TPU chip only what needs none is tested there
# (tests/test_torchtpu.py). ~2.5 GB with the CPU build of torch (where pip finds one), ~6 GB with PyPI's CUDA build.
TORCHTPU_STACK="torch==2.13.0 torch-tpu==0.2.0"
torchtpu_env() {
    local venv="$ROOT/.venv-torchtpu" stamp
    stamp="$("$PY" --version) | $TORCHTPU_STACK | README, torch kept | pytest"
    if ! _stamp_ok "$venv" "$stamp"; then
        _need_disk 4 "creating $venv"
        echo "fastai_xla: creating $venv ($("$PY" --version), TorchTPU: $TORCHTPU_STACK)..." >&2
        _new_venv "$PY" "$venv"
        _pip "$venv" $TORCHTPU_STACK
        image_install "$venv" "$ROOT" 2>&1 | _quiet_pip      # the README's two lines: the image's torch and torch-tpu kept
        _pip "$venv" pytest scikit-learn
        if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("torch").split("+")[0] != "2.13.0")'; then
            echo "fastai_xla: installing fastai_xla changed TorchTPU's torch" >&2; exit 1
        fi
        echo "$stamp" > "$venv/.fastai_xla-stamp"
    fi
    "$venv/bin/pip" install "${PIP_QUIET[@]}" --no-deps --force-reinstall "$ROOT" 2>&1 | _quiet_pip
}

# `images`: .venv and the three image stacks; `colab-kaggle` or `torchtpu`: those alone (.venv must exist for colab and
# kaggle, which link its CUDA libraries; TorchTPU's needs nothing of it: scripts/test.sh makes it while .venv's pip runs,
# on the core pip leaves idle); anything else (no argument, the arguments of the script that sources this one): .venv
case "${1:-}" in
    images) dev_env; image_env colab 3.13 "$COLAB_IMAGE"; image_env kaggle 3.12 "$KAGGLE_IMAGE"; torchtpu_env ;;
    colab-kaggle) image_env colab 3.13 "$COLAB_IMAGE"; image_env kaggle 3.12 "$KAGGLE_IMAGE" ;;
    torchtpu) torchtpu_env ;;
    *) dev_env ;;
esac
