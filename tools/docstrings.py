"""The package's docstrings at fastai's pace: one line each, their median at most 70 characters, none over 200.

    python tools/docstrings.py           # prints the median, the count over 200 and the longest
    python tools/docstrings.py --check   # exits 1, naming them, where a docstring breaks a limit

A docstring says what a thing is or does; the why goes in the notebook's prose (nbs/), the how in the code."""
import ast, statistics, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEDIAN, LONGEST = 70, 200

def docstrings(package:Path=ROOT/'fastai_xla'):
    "`(where, text)` of every docstring of the package's modules, classes and functions (`_modidx.py` is nbdev's index)."
    for p in sorted(package.glob('*.py')):
        if p.name == '_modidx.py': continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and (d := ast.get_docstring(n)):
                yield f"{p.name}:{getattr(n, 'name', '<module>')}", d

def problems(found:list) -> list:
    "What breaks a limit, said for the one who fixes it."
    lengths = [len(d) for _, d in found]
    median = statistics.median(lengths)
    out = [f'{w}: {len(d)} characters (at most {LONGEST})' for w, d in found if len(d) > LONGEST]
    out += [f'{w}: {d.count(chr(10)) + 1} lines (one)' for w, d in found if '\n' in d]
    if median > MEDIAN: out.append(f'the median docstring is {median:.0f} characters (at most {MEDIAN})')
    return out

if __name__ == '__main__':
    found = list(docstrings())
    bad = problems(found)
    longest = sorted(found, key=lambda f: -len(f[1]))[:5]
    print(f'{len(found)} docstrings, median {statistics.median(len(d) for _, d in found):.0f} characters; longest: '
          + ', '.join(f'{w} ({len(d)})' for w, d in longest))
    if '--check' in sys.argv and bad:
        sys.exit('Docstrings past the limits (one line, median <= 70, none over 200): shorten them in nbs/, then nbdev_export:\n  '
                 + '\n  '.join(bad))
