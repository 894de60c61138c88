"""Run every notebook in nbs/ in a real Jupyter kernel, as nbdev_test does: all code cells
in order, skipping cells marked `#| eval: false`. scripts/test.sh runs this with the newest
fastai, where nbdev 2 itself cannot be installed (it needs fastcore < 2): there the docs' cells (nbdev's `show_doc`,
which renders a method's documentation for the site and tests nothing) are left out."""
import importlib.util, re, sys
from pathlib import Path
import nbformat, pytest
from nbclient import NotebookClient

NBS = sorted(p for p in (Path(__file__).parent.parent/'nbs').glob('[0-9]*.ipynb'))
_no_eval = re.compile(r'^\s*#\s*\|\s*eval\s*:\s*false', re.M)
_docs_cell = re.compile(r'^\s*(from nbdev\.showdoc import show_doc|show_doc\(.*\))\s*$')

def runs_here(cell) -> bool:
    "Whether this environment runs `cell`: a code cell not marked `eval: false`, and no docs cell where nbdev is missing."
    if cell.cell_type != 'code' or _no_eval.search(cell.source): return False
    return importlib.util.find_spec('nbdev') is not None or not _docs_cell.match(cell.source)

@pytest.mark.notebooks
@pytest.mark.parametrize('path', NBS, ids=[p.stem for p in NBS])
def test_notebook(path):
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if runs_here(c)]
    # the kernel must be this interpreter (so the notebooks run with this environment's fastai)
    check = f"import sys, fastai; assert sys.executable == {sys.executable!r}, sys.executable; print(fastai.__version__)"
    nb.cells.insert(0, nbformat.v4.new_code_cell(check))
    NotebookClient(nb, timeout=900, kernel_name='python3', resources={'metadata': {'path': str(path.parent)}}).execute()
