"""Convert between nbdev notebooks and percent-format text, for editing notebooks as plain text.

    python tools/nbpct.py to-pct nbs/00_core.ipynb /tmp/00_core.py     # (or > /tmp/00_core.py) edit the text...
    python tools/nbpct.py to-nb /tmp/00_core.py nbs/00_core.ipynb     # ...and write it back

A cell starts at a line `# %%` (code) or `# %% [markdown]` (markdown: each line starts with `# `).
Outputs are not kept: the notebooks in `nbs/` are stored without outputs."""
import hashlib, json, sys
from pathlib import Path

def _cell(kind, lines):
    while lines and not lines[-1].strip(): lines.pop()
    if kind == 'markdown': lines = [l[2:] if l.startswith('# ') else l.lstrip('#') for l in lines]
    src = [l + '\n' for l in lines]
    if src: src[-1] = src[-1].rstrip('\n')
    cell = dict(cell_type=kind, metadata={}, source=src)
    if kind == 'code': cell.update(execution_count=None, outputs=[])
    return cell

def _with_ids(cells):
    "Stable cell ids (nbdev writes them into the exported modules): a hash of the cell's source."
    seen = set()
    for c in cells:
        base = hashlib.sha1(''.join(c['source']).encode()).hexdigest()[:8]
        cid, i = base, 0
        while cid in seen: i += 1; cid = f'{base}{i}'
        seen.add(cid); c['id'] = cid
    return cells

def pct_to_nb(text):
    cells, kind, lines = [], None, []
    for line in text.splitlines():
        if line.startswith('# %%'):
            if kind: cells.append(_cell(kind, lines))
            kind, lines = ('markdown' if '[markdown]' in line else 'code'), []
        elif kind: lines.append(line)
    if kind: cells.append(_cell(kind, lines))
    meta = dict(kernelspec=dict(display_name='python3', language='python', name='python3'))
    return dict(cells=_with_ids(cells), metadata=meta, nbformat=4, nbformat_minor=5)

def nb_to_pct(nb):
    out = []
    for c in nb['cells']:
        src = ''.join(c['source']).splitlines()
        if c['cell_type'] == 'markdown': out += ['# %% [markdown]'] + [('# ' + l) if l else '#' for l in src]
        else: out += ['# %%'] + src
        out.append('')
    return '\n'.join(out)

if __name__ == '__main__':
    cmd, src = sys.argv[1], Path(sys.argv[2])
    if cmd == 'to-pct':
        text = nb_to_pct(json.loads(src.read_text()))
        if len(sys.argv) > 3: Path(sys.argv[3]).write_text(text + '\n')   # (a stale copy must never be edited by mistake)
        else: print(text)
    elif cmd == 'to-nb':
        Path(sys.argv[3]).write_text(json.dumps(pct_to_nb(src.read_text()), indent=1) + '\n')
    else: sys.exit(__doc__)
