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
