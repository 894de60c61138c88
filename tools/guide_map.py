"""The guide's "Who imports whom" (nbs/guide.ipynb), generated from the package's imports so that it cannot go stale.

    python tools/guide_map.py           # writes the section into the guide
    python tools/guide_map.py --check   # exits 1, saying so, if the guide's section is not what the package imports

The imports are read from the code (`ast`), a function's imports among them, not from a drawing: `from .core import x`,
`from fastai_xla.core import *` and `import fastai_xla.core` all count. Each module gets a layer, one above the highest
of the modules it imports; a circle has no layers, and is refused (`tests/test_guide_map.py` runs both checks)."""
import ast, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE, GUIDE = ROOT/'fastai_xla', ROOT/'nbs'/'guide.ipynb'
HEADING = '### Who imports whom'

def module_imports(path:Path) -> set:
    "The modules of the package that the module at `path` imports, anywhere in its code."
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == 'fastai_xla': found |= {a.name for a in node.names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or '']
            found |= {n.split('.')[1] for n in names if n.startswith('fastai_xla.')}
    return {m.split('.')[0] for m in found} - {path.stem}

def package_imports() -> dict:
    "Each module of the package (not `__init__` and nbdev's index) -> the modules of the package it imports."
    return {p.stem: module_imports(p) for p in sorted(PACKAGE.glob('*.py')) if not p.stem.startswith('_')}

class ImportCircle(ValueError): pass

def layers(graph:dict) -> dict:
    "Each module's layer: 0 for a module that imports none of the package, else one above its highest import."
    layer, todo = {}, dict(graph)
    while todo:
        ready = {m: deps for m, deps in todo.items() if deps <= set(layer)}
        if not ready: raise ImportCircle('a circle among ' + '; '.join(f'{m} -> {sorted(d - set(layer))}' for m, d in sorted(todo.items())))
        for m, deps in ready.items(): layer[m] = 1 + max((layer[d] for d in deps), default=-1)
        for m in ready: del todo[m]
    return layer

def section(graph:dict) -> str:
    "The guide's markdown cell: how it is made, then a row per module, lowest layer first."
    layer = layers(graph)
    rows = [f"| {layer[m]} | `{m}` | {', '.join(f'`{d}`' for d in sorted(deps, key=lambda d: (layer[d], d))) or '(none)'} |"
            for m, deps in sorted(graph.items(), key=lambda kv: (layer[kv[0]], kv[0]))]
    return '\n'.join([HEADING, '',
        "Each module imports only modules of lower layers than its own, so it can be read after them. The table is made",
        "from the package's code (every import, a function's too) by `tools/guide_map.py`, and a test",
        "(`tests/test_guide_map.py`) fails when the code and the table differ or when the imports form a circle. The",
        "features that `to_xla` uses are imported by it (`distributed`, above them), those of fastai's applications when",
        "the user has loaded fastai's module (`application_features`); they plug into the learner through",
        "`on_xla_learner` (`callback`), which imports none of them. `all` is what `from fastai_xla.all import *` runs.", '',
        '| layer | module | imports, of fastai_xla |', '|---|---|---|', *rows])

def _cell_index(cells) -> int:
    found = [i for i, c in enumerate(cells) if ''.join(c['source']).startswith(HEADING)]
    if len(found) != 1: sys.exit(f'{GUIDE}: {len(found)} markdown cells start with {HEADING!r}; one must')
    return found[0]

def guide_section() -> str:
    cells = json.loads(GUIDE.read_text())['cells']
    return ''.join(cells[_cell_index(cells)]['source'])

def write_section(text:str):
    nb = json.loads(GUIDE.read_text())
    lines = text.split('\n')
    nb['cells'][_cell_index(nb['cells'])]['source'] = [l + '\n' for l in lines[:-1]] + [lines[-1]]
    GUIDE.write_text(json.dumps(nb, indent=1) + '\n')

if __name__ == '__main__':
    text = section(package_imports())
    if '--check' not in sys.argv: write_section(text)
    elif guide_section() != text:
        sys.exit(f"{GUIDE.name}'s {HEADING!r} is not what the package imports: run `python tools/guide_map.py`")
