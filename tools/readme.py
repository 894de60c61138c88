"""README.md is exported from nbs/index.ipynb, the docs site's home page (as nbdev does).

    python tools/readme.py           # writes README.md
    python tools/readme.py --check   # exits 1, saying so, if README.md is not the export of nbs/index.ipynb

nbdev's own `nbdev_readme` renders the notebook with Quarto, which a machine that reaches only PyPI cannot
install (see scripts/docs.sh); this writes the notebook's markdown cells as they are and its code cells as
python blocks. Links in the notebook are relative to nbs/ (where the docs pages are): in the README, a link to
a notebook gets `nbs/` in front and a link to `../x` becomes `x`."""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEX, README = ROOT/'nbs'/'index.ipynb', ROOT/'README.md'

def readme_link(target:str) -> str:
    "A link of the notebook (relative to nbs/) as the README (at the top of the repository) needs it."
    if re.match(r'^[a-z]+:|^#|^/', target): return target
    if target.startswith('../'): return target[3:]
    return 'nbs/' + target

def cell_text(cell) -> str:
    src = ''.join(cell['source']).strip('\n')
    if cell['cell_type'] == 'code': return f'```python\n{src}\n```' if src and not src.startswith('#| hide') else ''
    return re.sub(r'\]\(([^)\s]+)\)', lambda m: f']({readme_link(m.group(1))})', src)

def readme() -> str:
    cells = json.loads(INDEX.read_text())['cells']
    return '\n\n'.join(t for t in map(cell_text, cells) if t) + '\n'

if __name__ == '__main__':
    if '--check' in sys.argv:
        if README.read_text() != readme():
            sys.exit('README.md is not the export of nbs/index.ipynb: edit the notebook, then run `python tools/readme.py`')
    else: README.write_text(readme())
