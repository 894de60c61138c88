"""Rewrite each `from .module import *` of the package (its notebooks' `from fastai_xla.module import *`) as the names used.
A one-off helper of the change that removed star imports (issue 70); kept to show how the import lists were made."""
import json, re, subprocess, sys, importlib, collections
from pathlib import Path

ROOT = Path(__file__).parent.parent

def used_from_stars(path) -> set:
    "Names `path` uses that come from its star imports (ruff's F405)."
    out = subprocess.run([str(ROOT/'.venv/bin/ruff'), 'check', str(path), '--select', 'F405', '--output-format', 'json',
                          '--no-cache', '--isolated'], capture_output=True, text=True).stdout
    return {re.search(r'`([^`]+)`', e['message']).group(1) for e in json.loads(out or '[]')}

def star_sources(text) -> list:
    return re.findall(r'^from (?:fastai_xla|)\.?(\w+) import \*', text, re.M)

def plan(path, text) -> dict:
    "module -> names to import from it, for each star import of `text` (a later star import wins, as in Python)."
    names, stars, res = used_from_stars(path), star_sources(text), collections.defaultdict(list)
    for n in sorted(names):
        src = next((m for m in reversed(stars) if n in getattr(importlib.import_module(f'fastai_xla.{m}'), '__all__', ())), None)
        if src is None: sys.exit(f'{path}: {n} is in no star-imported module')
        res[src].append(n)
    return {m: res.get(m, []) for m in stars}


def wrap(module, names, width=125) -> str:
    line = f"from fastai_xla.{module} import {', '.join(names)}"
    if len(line) <= width: return line
    body, cur = [], '    '
    for n in names:
        if len(cur) + len(n) + 2 > width: body.append(cur.rstrip()); cur = '    '
        cur += n + ', '
    body.append(cur.rstrip().rstrip(','))
    return f"from fastai_xla.{module} import (\n" + '\n'.join(body) + ")"

def rewrite_notebook(pct:Path):
    "Rewrite the star imports of the notebook (as a percent-format file) `pct`'s exported cells; names only its tests use go to a cell of their own after."
    text = pct.read_text()
    module = re.search(r'^#\| default_exp (\S+)', text, re.M).group(1)
    package = plan(ROOT/'fastai_xla'/(module.replace('.', '/') + '.py'), (ROOT/'fastai_xla'/(module + '.py')).read_text())
    cells = text.split('\n# %%')
    whole = plan_restricted(pct, text, set(package))
    extra = {m: [n for n in whole.get(m, []) if n not in package[m]] for m in package}
    for i, c in enumerate(cells):
        if not c.startswith('\n#| export'): continue
        if not re.search(r'^from fastai_xla\.\w+ import \*', c, re.M): continue
        def repl(m):
            names = package.get(m.group(1))
            if names is None: return m.group(0)
            return wrap(m.group(1), names) if names else f'#DROP {m.group(0)}'
        cells[i] = re.sub(r'^from fastai_xla\.(\w+) import \*.*$', repl, c, flags=re.M)
        tests = [wrap(m, ns) for m, ns in extra.items() if ns]
        if tests: cells.insert(i + 1, '\n' + '\n'.join(tests) + '\n')
        break
    pct.write_text('\n# %%'.join(cells))

def plan_restricted(path, text, modules) -> dict:
    names, stars, res = used_from_stars(path), star_sources(text), collections.defaultdict(list)
    stars = [m for m in stars if m in modules]
    for n in sorted(names):
        src = next((m for m in reversed(stars) if n in getattr(importlib.import_module(f'fastai_xla.{m}'), '__all__', ())), None)
        if src is not None: res[src].append(n)
    return res

if __name__ == '__main__':
    for p in map(Path, sys.argv[1:]):
        if p.suffix == '.py' and p.parent.name == 'fastai_xla': print(p, json.dumps(plan(p, p.read_text())))
        else: rewrite_notebook(p)
