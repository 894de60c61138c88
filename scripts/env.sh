# Source me: creates (once) and activates the environments fastai_xla is developed and tested in.
#   .venv         torch 2.9.0 + torch_xla 2.9.0, fastai 2.8.7 and nbdev 2 (the newest fastai nbdev 2 can live with)
#   .venv-latest  the same torch/torch_xla, with the newest fastai (2.8.12, fastcore 2.x) on top
# Idempotent: a stamp file records what was installed; a changed spec reinstalls.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
BASE_SPEC="torch==2.9.0 torch_xla==2.9.0 torchvision==0.24.0 fastai==2.8.7 fastcore==1.14.5 nbdev==2.4.14 execnb==0.1.18 scikit-learn pytest nbclient ipykernel"
LATEST_SPEC="fastai==2.8.12"

_stamp_ok() { [ -f "$1/.fastai_xla-stamp" ] && [ "$(cat "$1/.fastai_xla-stamp")" = "$2" ]; }

if ! _stamp_ok "$ROOT/.venv" "$BASE_SPEC"; then
    echo "fastai_xla: creating $ROOT/.venv (torch + torch_xla take a few minutes)..." >&2
    "$PY" -m venv "$ROOT/.venv"
    "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check $BASE_SPEC
    "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$ROOT"
    echo "$BASE_SPEC" > "$ROOT/.venv/.fastai_xla-stamp"
fi

LATEST_STAMP="$BASE_SPEC | $LATEST_SPEC | addsitedir"
if ! _stamp_ok "$ROOT/.venv-latest" "$LATEST_STAMP"; then
    echo "fastai_xla: creating $ROOT/.venv-latest (newest fastai over the same torch/torch_xla)..." >&2
    "$PY" -m venv "$ROOT/.venv-latest"
    SITE_BASE="$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    SITE_LATEST="$("$ROOT/.venv-latest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # the base environment's packages (and its .pth files, such as the editable install of
    # fastai_xla) come after this one's: the newer fastai and fastcore win
    echo "import site; site.addsitedir('$SITE_BASE')" > "$SITE_LATEST/_fastai_xla_base_env.pth"
    "$ROOT/.venv-latest/bin/pip" install -q --disable-pip-version-check $LATEST_SPEC 2>&1 | grep -v "^Not uninstalling\|outside environment\|Can't uninstall" >&2 || true
    "$ROOT/.venv-latest/bin/python" -c "import fastai, fastcore; assert fastai.__version__ == '${LATEST_SPEC#fastai==}', fastai.__version__"
    echo "$LATEST_STAMP" > "$ROOT/.venv-latest/.fastai_xla-stamp"
fi
