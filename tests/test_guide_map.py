"""The guide's map of the house ("How it works") names every notebook in `nbs/`, and no notebook that is gone; its "Who
imports whom" is the package's imports today, without a circle: the map a newcomer reads cannot go stale."""
import json, re, sys
import pytest
from pathlib import Path

NBS = Path(__file__).parent.parent/'nbs'

def test_the_guides_map_names_every_module_notebook():
    guide = ''.join(''.join(c['source']) for c in json.loads((NBS/'guide.ipynb').read_text())['cells'])
    section = guide.split('## How it works', 1)[1].split('\n## ', 1)[0]
    mapped = set(re.findall(r'^\| \[(\w+)\]\(\1\.ipynb\) \|', section, re.M))
    notebooks = {p.stem for p in NBS.glob('[0-9]*.ipynb')}
    assert mapped == notebooks, dict(missing=sorted(notebooks - mapped), gone=sorted(mapped - notebooks))

PACKAGE = NBS.parent/'fastai_xla'
sys.path.insert(0, str(NBS.parent/'tools'))
from guide_map import package_imports, layers, section, guide_section, ImportCircle  # noqa: E402

def test_the_modules_import_only_downwards():
    "The package's imports, a function's among them, form no circle: every module can be read after the ones it imports."
    layer = layers(package_imports())
    assert layer['settings'] < layer['core'] < layer['callback'] < layer['distributed'] < layer['launch']

def test_a_circle_is_found():
    "The check that guards the house, on a graph with a circle three modules long (and on one without)."
    test_layers = layers({'a': set(), 'b': {'a'}, 'c': {'b'}})
    assert test_layers == {'a': 0, 'b': 1, 'c': 2}
    with pytest.raises(ImportCircle, match=r"b -> \['c'\]"): layers({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': set()})

def test_the_guide_says_what_each_module_imports():
    "The guide's 'Who imports whom' is the table `tools/guide_map.py` makes from the code today."
    assert guide_section() == section(package_imports()), 'the guide is stale: run `python tools/guide_map.py`'

# A module naming itself (the check of `__spec__`, the command a new interpreter runs) is not a link.
def test_no_module_names_another_in_a_string():
    "Links the import graph cannot see: a string naming another module of the package (`'fastai_xla.text'`)."
    named = {}
    for p in PACKAGE.glob('*.py'):
        if p.stem.startswith('_'): continue
        found = set(re.findall(r"""['"]fastai_xla\.(\w+)""", p.read_text())) - {p.stem}
        if found: named[p.stem] = found
    assert named == {}, named
