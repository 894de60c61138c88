"""The guide's map of the house ("How it works") names every notebook in `nbs/`, and no notebook that is gone: a module
added or removed without the map fails here, so the map a newcomer reads cannot go stale."""
import json, re
from pathlib import Path

NBS = Path(__file__).parent.parent/'nbs'

def test_the_guides_map_names_every_module_notebook():
    guide = ''.join(''.join(c['source']) for c in json.loads((NBS/'guide.ipynb').read_text())['cells'])
    section = guide.split('## How it works', 1)[1].split('\n## ', 1)[0]
    mapped = set(re.findall(r'^\| \[(\w+)\]\(\1\.ipynb\) \|', section, re.M))
    notebooks = {p.stem for p in NBS.glob('[0-9]*.ipynb')}
    assert mapped == notebooks, dict(missing=sorted(notebooks - mapped), gone=sorted(mapped - notebooks))

PACKAGE = NBS.parent/'fastai_xla'

def package_imports() -> dict:
    "Each module of the package -> the modules of the package it imports, anywhere in its code (a function's import too)."
    import ast
    graph = {}
    for p in PACKAGE.glob('*.py'):
        if p.stem.startswith('_'): continue
        found = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module} if node.module else {a.name for a in node.names}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or '']
                found |= {n.split('.')[1] for n in names if n.startswith('fastai_xla.')}
                if isinstance(node, ast.ImportFrom) and node.module == 'fastai_xla': found |= {a.name for a in node.names}
        graph[p.stem] = {m.split('.')[0] for m in found} - {p.stem}
    return graph

def test_the_modules_import_only_downwards():
    "The package's imports, a function's among them, form no circle: every module can be read after the ones it imports."
    graph, order = package_imports(), []
    todo = dict(graph)
    while todo:
        ready = [m for m, deps in todo.items() if deps <= set(order)]
        assert ready, f'a circle among {sorted(todo)}: ' + '; '.join(f'{m} -> {sorted(d - set(order))}' for m, d in sorted(todo.items()))
        order += sorted(ready)
        for m in ready: del todo[m]

# A module naming itself (the check of `__spec__`, the command a new interpreter runs) is not a link.
def test_no_module_names_another_in_a_string():
    "Links the import graph cannot see: a string naming another module of the package (`'fastai_xla.text'`)."
    named = {}
    for p in PACKAGE.glob('*.py'):
        if p.stem.startswith('_'): continue
        found = set(re.findall(r"""['"]fastai_xla\.(\w+)""", p.read_text())) - {p.stem}
        if found: named[p.stem] = found
    assert named == {}, named
