#!/usr/bin/env bash
# Builds the docs site into _docs/: a page per notebook in nbs/ (nbdev's processing: show_doc for every
# exported name; rendered by nbdev with Quarto where Quarto is installed, else with nbconvert: tools/docs.py
# says why), then checks that no page is missing. Sets up .venv first if needed (scripts/env.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
PATH="$ROOT/.venv/bin:$PATH" PJRT_DEVICE=CPU .venv/bin/python tools/docs.py
echo "docs: open $ROOT/_docs/index.html"
