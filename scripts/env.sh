# Source me: creates (once) the environments fastai_xla is developed and tested in.
#   .venv         Python 3, torch 2.9.0 + torch_xla 2.9.0, fastai 2.8.7 and nbdev 2 (nbdev 2 needs fastcore < 2,
#                 so this is the newest fastai it can live with): the development environment
#   .venv-latest  the same torch/torch_xla, then fastai_xla with the newest fastai (`pip install -e . -U fastai`)
# and, with `source scripts/env.sh kaggle`, also
#   .venv-kaggle  Python 3.12 (if there is one), the stack of Kaggle's TPU image (torch 2.8.0, torch_xla 2.8.0,
#                 torchvision 0.23.0, fastcore < 2), then fastai_xla installed with the README's Kaggle command
# Idempotent: a stamp file records what was installed; a changed spec reinstalls. Every pip is the newest.
# Disk: PyPI's Linux torch wheels bring ~4 GB of CUDA libraries (unused here and on a TPU); .venv takes ~8 GB, .venv-kaggle
# ~4 GB more (it shares .venv's identical CUDA libraries as hard links); pip keeps no cache of these wheels.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
PIP_QUIET=(-q --disable-pip-version-check --no-cache-dir)   # no second copy of 4 GB of wheels in ~/.cache/pip
BASE_SPEC="torch==2.9.0 torch_xla==2.9.0 torchvision==0.24.0 fastai==2.8.7 fastcore==1.14.5 nbdev==2.4.14 execnb==0.1.18 scikit-learn pytest nbclient ipykernel"
KAGGLE_IMAGE="torch==2.8.0 torch_xla==2.8.0 torchvision==0.23.0 fastcore<2"   # what the image brings (mid 2026)
TEST_TOOLS="pytest nbclient ipykernel scikit-learn"

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

if ! _stamp_ok "$ROOT/.venv" "$BASE_SPEC"; then
    _need_disk 12 "creating $ROOT/.venv (torch + torch_xla)"
    echo "fastai_xla: creating $ROOT/.venv (torch + torch_xla take a few minutes)..." >&2
    _new_venv "$PY" "$ROOT/.venv"
    "$ROOT/.venv/bin/pip" install "${PIP_QUIET[@]}" $BASE_SPEC 2>&1 | _quiet_pip
    "$ROOT/.venv/bin/pip" install "${PIP_QUIET[@]}" --no-deps -e "$ROOT" 2>&1 | _quiet_pip
    echo "$BASE_SPEC" > "$ROOT/.venv/.fastai_xla-stamp"
fi

LATEST_STAMP="$BASE_SPEC | pip install -e . -U fastai | addsitedir"
if ! _stamp_ok "$ROOT/.venv-latest" "$LATEST_STAMP"; then
    echo "fastai_xla: creating $ROOT/.venv-latest (newest fastai over the same torch/torch_xla)..." >&2
    _new_venv "$PY" "$ROOT/.venv-latest"
    SITE_BASE="$(_site "$ROOT/.venv")"
    SITE_LATEST="$(_site "$ROOT/.venv-latest")"
    # the base environment's packages come after this one's (no second 5 GB torch): what pip installs here wins
    echo "import site; site.addsitedir('$SITE_BASE')" > "$SITE_LATEST/_fastai_xla_base_env.pth"
    # (fastai named with -U: the base's fastai 2.8.7 would satisfy fastai_xla's requirement and stay)
    "$ROOT/.venv-latest/bin/pip" install "${PIP_QUIET[@]}" -e "$ROOT" -U fastai $TEST_TOOLS 2>&1 | _quiet_pip
    "$ROOT/.venv-latest/bin/python" -c "import fastai, fastcore; assert fastcore.__version__ >= '2', (fastai.__version__, fastcore.__version__)"
    echo "$LATEST_STAMP" > "$ROOT/.venv-latest/.fastai_xla-stamp"
fi

# the README's install command for machines whose image brings torch_xla (Kaggle), with this checkout as the source
kaggle_install() {   # $1: the environment's pip, $2: what to install
    "$1" list --format=freeze | grep -iE '^(torch|torchvision|torch[-_]xla|libtpu)==' > "$ROOT/.venv-kaggle/keep.txt"
    "$1" install "${PIP_QUIET[@]}" -c "$ROOT/.venv-kaggle/keep.txt" 'fastcore<2' "$2"
}

if [ "${1:-}" = kaggle ]; then
    PY312="$PY"   # Python 3.12 if there is one (on PATH, or one of pyenv's), else the default Python
    for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
        if "$candidate" -c 'import venv, ensurepip, ssl' 2>/dev/null; then PY312="$candidate"; break; fi
    done
    [ "$PY312" != "$PY" ] || echo "fastai_xla: no Python 3.12 here, the Kaggle-like leg uses $("$PY" --version)" >&2
    KAGGLE_STAMP="$("$PY312" --version) | $KAGGLE_IMAGE | shared CUDA libraries | kaggle_install | $TEST_TOOLS"
    if ! _stamp_ok "$ROOT/.venv-kaggle" "$KAGGLE_STAMP"; then
        _need_disk 7 "creating $ROOT/.venv-kaggle (torch + torch_xla 2.8)"
        echo "fastai_xla: creating $ROOT/.venv-kaggle ($("$PY312" --version), Kaggle's TPU stack: $KAGGLE_IMAGE)..." >&2
        _new_venv "$PY312" "$ROOT/.venv-kaggle"
        _share_cuda_libs "$(_site "$ROOT/.venv")" "$(_site "$ROOT/.venv-kaggle")"
        "$ROOT/.venv-kaggle/bin/pip" install "${PIP_QUIET[@]}" $KAGGLE_IMAGE 2>&1 | _quiet_pip
        "$ROOT/.venv-kaggle/bin/pip" list --format=freeze > "$ROOT/.venv-kaggle/image.txt"
        kaggle_install "$ROOT/.venv-kaggle/bin/pip" "$ROOT" 2>&1 | _quiet_pip
        # installing fastai_xla must leave the image's torch stack as it was
        "$ROOT/.venv-kaggle/bin/pip" list --format=freeze > "$ROOT/.venv-kaggle/after.txt"
        if ! diff <(grep -iE '^(torch|torchvision|torch[-_]xla)==' "$ROOT/.venv-kaggle/image.txt") \
                  <(grep -iE '^(torch|torchvision|torch[-_]xla)==' "$ROOT/.venv-kaggle/after.txt") >&2; then
            echo "fastai_xla: the Kaggle install command changed the image's torch stack (above)" >&2; exit 1
        fi
        "$ROOT/.venv-kaggle/bin/pip" install "${PIP_QUIET[@]}" $TEST_TOOLS 2>&1 | _quiet_pip
        echo "$KAGGLE_STAMP" > "$ROOT/.venv-kaggle/.fastai_xla-stamp"
    fi
    # a regular (not editable) install, as on Kaggle: refresh it from this checkout (a few seconds)
    "$ROOT/.venv-kaggle/bin/pip" install "${PIP_QUIET[@]}" --no-deps --force-reinstall "$ROOT" 2>&1 | _quiet_pip
fi
