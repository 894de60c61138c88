"""The notebook form, in a real Jupyter kernel (nbclient + ipykernel): a learner built in one
cell, a training function defined in another, `learn.launch(train, nprocs=2,
transport='gloo')` on 2 replica processes, then the learner that came back used in the
next cells. The test reads the executed notebook: exactly one epoch table, rendered as
HTML by fastprogress (fastai's usual notebook table), no text copy of it, and cells after
the launch that see the trained weights."""
import re, sys
import nbformat
from nbclient import NotebookClient

CELLS = [
    '''import os; os.environ['PJRT_DEVICE'] = 'CPU'
from fastai_xla.all import *
from fastai_xla.demo import digits_dls
from fastai.vision.all import *
dls = digits_dls(bs=32)
learn = Learner(dls, nn.Sequential(Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)), metrics=accuracy)''',
    '''def train(learn):
    learn.fit_one_cycle(2, 1e-2)''',
    '''learn.launch(train, nprocs=2, transport='gloo')''',
    '''acc = learn.recorder.values[-1][2]
preds, targs = learn.get_preds()
print('ACC', acc, (preds.argmax(1) == targs).float().mean().item(), len(preds))''',
    '''learn.export(EXPORT); print('EXPORTED', load_learner(EXPORT).predict(dls.valid_ds.items[0])[0])''',
]

def test_notebook_launch_renders_one_html_table_and_returns_the_learner(tmp_path):
    export = tmp_path/'export.pkl'
    cells = [CELLS[0].replace("os.environ['PJRT_DEVICE'] = 'CPU'", f"os.environ['PJRT_DEVICE'] = 'CPU'; EXPORT = {str(export)!r}")] + CELLS[1:]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"import sys; assert sys.executable == {sys.executable!r}"))
    NotebookClient(nb, timeout=900, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells for o in c.outputs]
    html = [o['data']['text/html'] for o in outputs if 'text/html' in o.get('data', {})]
    tables = [h for h in html if '<table' in h and 'train_loss' in h]
    assert len(tables) == 1, html
    assert len(re.findall(r'<tr>\s*<td>\d+</td>', tables[0])) == 2             # two epoch rows
    texts = ''.join(o.get('text', '') + o.get('data', {}).get('text/plain', '') for o in outputs)
    assert not re.search(r'epoch\s+train_loss', texts)                         # no second, text copy
    acc, cpu_acc, n = re.search(r'ACC ([0-9.]+) ([0-9.]+) (\d+)', texts).groups()
    assert float(acc) > 0.85 and abs(float(acc) - float(cpu_acc)) < 1e-6 and n == '359'
    assert 'EXPORTED' in texts and export.exists()
