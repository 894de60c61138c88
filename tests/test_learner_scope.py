"""fastai_xla belongs to the learner that asks for it, not to the process.

- Importing `fastai_xla.all` replaces no attribute that fastai, fastcore, fasttransform,
  fastprogress or torch define (their modules and their classes, compared object by object
  in a fresh process before and after the import), the pickling patches aside; it only adds
  names (`to_xla`, `launch`...).
- A CPU learner trained beside an XLA learner in one process gets fastai's results and
  makes fastai's Python calls, exactly: the same losses and the same number of Python calls
  per step as before fastai_xla was imported (a model with an `nn.LSTM`, fastai's flat loss,
  a metric: the classes fastai_xla has XLA versions of).
- Environment variables are read once and checked: a bad value stops `to_tpu_distributed`
  with an error naming the variable.
Each runs in a fresh Python process (what was imported, and the XLA runtime, are per process)."""
import json, os, subprocess, sys, textwrap
from pathlib import Path

ROOT = Path(__file__).parent.parent

def run_py(code, env=None, timeout=600):
    r = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU', **(env or {})}, cwd=ROOT)
    return r

SNAPSHOT = '''
import sys, json, types
import torch, torch.nn, torch.nn.functional, torch.distributed, torch.multiprocessing
import fastcore.all, fastprogress.fastprogress, fasttransform
import fastai.vision.all, fastai.text.all, fastai.tabular.all, fastai.collab, fastai.callback.all
OURS = ('fastai', 'fastcore', 'fasttransform', 'fastprogress', 'torch')
CODE = (types.FunctionType, types.BuiltinFunctionType, type, property, staticmethod, classmethod, types.MethodDescriptorType,
        types.WrapperDescriptorType, types.MethodType)

def snapshot():
    "Every function, class and descriptor of these libraries' loaded modules and of their classes."
    snap = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split('.')[0] not in OURS: continue
        attrs = dict(vars(mod))
        snap[name] = {k: v for k, v in attrs.items() if isinstance(v, CODE)}
        for k, v in attrs.items():
            if isinstance(v, type) and v.__module__ == name:
                snap[f'{name}.{k}'] = {a: x for a, x in vars(v).items() if isinstance(x, CODE) or callable(x)}
    return snap

before = snapshot()
import fastai_xla.all
after = snapshot()
replaced = sorted(f'{place}.{k}' for place, attrs in before.items() for k, v in attrs.items()
                  if place in after and after[place].get(k, v) is not v or place in after and k not in after[place])
added = sorted(f'{place}.{k}' for place, attrs in after.items() if place in before for k in attrs if k not in before[place])
print('RESULT', json.dumps(dict(replaced=replaced, added=added)))
'''

def test_import_replaces_nothing_but_the_pickling_patches():
    r = run_py(SNAPSHOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.split('RESULT ')[-1])
    # the one replacement the library exists for: fastai tensors pickle through the CPU (and `Optimizer` gains
    # `__getstate__`/`__setstate__`, which it did not define: added, not replaced)
    assert res['replaced'] == ['fastai.torch_core.TensorBase.__reduce_ex__'], res['replaced']
    assert {'fastai.learner.Learner.to_xla', 'fastai.learner.Learner.to_tpu_distributed', 'fastai.learner.Learner.launch',
            'fastai.learner.Learner.detach_xla', 'fastai.learner.Learner.xla_report'} <= set(res['added']), res['added']
    assert not [a for a in res['added'] if a.startswith('torch')], res['added']      # nothing added to torch either

CPU_BESIDE_XLA = '''
import sys, json, random
import torch_xla; torch_xla.device()      # the XLA runtime first (autograd's engine must know the device)
import torch, numpy as np
from torch import nn
from sklearn.datasets import load_digits
from fastai.basics import *
from fastai.callback.all import *

class RowsLSTM(nn.Module):
    "Reads an 8x8 digit row by row with an `nn.LSTM`."
    def __init__(self):
        super().__init__()
        self.lstm, self.head = nn.LSTM(8, 32, batch_first=True), nn.Linear(32, 10)
    def forward(self, x): return self.head(self.lstm(x.view(-1, 8, 8))[0][:, -1])

X, y = load_digits(return_X_y=True)
items = [(torch.tensor(X[i], dtype=torch.float32) / 16, torch.tensor(int(y[i]))) for i in range(len(X))]

def learner():
    set_seed(0, reproducible=True)
    dls = DataLoaders(DataLoader(items[:1400], bs=64, shuffle=True, drop_last=True), DataLoader(items[1400:], bs=64))
    dls.train.rng = random.Random(0)
    return Learner(dls, RowsLSTM(), loss_func=CrossEntropyLossFlat(), metrics=accuracy)

def cpu_run():
    "A CPU fit: its losses and metric, and the Python calls it made per training step."
    learn = learner()
    calls = [0]
    def count(frame, event, arg):
        if event in ('call', 'c_call'): calls[0] += 1
    with learn.no_bar(), learn.no_logging():
        sys.setprofile(count)
        try: learn.fit(1, 1e-2)
        finally: sys.setprofile(None)
    return [float(l) for l in learn.recorder.losses] + list(map(float, learn.recorder.values[-1])), calls[0] / len(learn.dls.train)

cpu_run()                                  # (warms fastai's and Python's caches)
before = cpu_run()
from fastai_xla.all import XLALearner
from fastai_xla.text import LSTMLoopsOnXLA
xla = learner().to_xla(seed=0)
with xla.no_bar(): xla.fit(1, 1e-2)
assert isinstance(xla, XLALearner) and isinstance(xla.model.lstm, LSTMLoopsOnXLA)
after = cpu_run()
print('RESULT', json.dumps(dict(before=before, after=after, xla_valid_loss=float(xla.recorder.values[-1][1]))))
'''

def test_a_cpu_learner_beside_an_xla_learner_runs_fastais_code():
    r = run_py(CPU_BESIDE_XLA)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.split('RESULT ')[-1])
    (values_before, calls_before), (values_after, calls_after) = res['before'], res['after']
    assert values_after == values_before                    # fastai's results, to the bit
    assert calls_after == calls_before, (calls_before, calls_after)   # fastai's Python calls per step, exactly
    assert res['xla_valid_loss'] < 2.0, res                   # (the XLA learner beside it learned: chance is 2.30)

def test_a_bad_environment_variable_is_named():
    code = '''
        from fastai.basics import *
        from fastai_xla.all import *
        from fastai_xla.demo import digits_dls
        learn = Learner(digits_dls(), nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
        learn.to_tpu_distributed()
    '''
    r = run_py(code, env=dict(FASTAI_XLA_TIMEOUT='abc'))
    assert r.returncode != 0
    assert "FASTAI_XLA_TIMEOUT='abc' is not a number" in r.stderr, r.stderr[-2000:]

IMPORTED = '''
import json, hashlib, torch
{imports}
from fastai.basics import *
from sklearn.datasets import load_digits
X, y = load_digits(return_X_y=True)
X = torch.tensor(X, dtype=torch.float32) + 1000.               # features at mean 1000: torch_xla's own batch norm is 6% off or NaN
items = [(X[i], torch.tensor(int(y[i]))) for i in range(len(X))]
set_seed(0, reproducible=True)
dls = DataLoaders(DataLoader(items[:1400], bs=64, shuffle=True, drop_last=True), DataLoader(items[1400:], bs=64))
model = nn.Sequential(nn.BatchNorm1d(64), nn.Linear(64, 32), nn.ReLU(), nn.BatchNorm1d(32), nn.Linear(32, 10))
learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(), metrics=accuracy).to_tpu_distributed(seed=0)
with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)
digest = hashlib.sha256(b''.join(p.detach().cpu().numpy().tobytes() for p in learn.model.state_dict().values())).hexdigest()
print('RESULT', json.dumps(dict(modules=[[c.__name__ for c in type(m).__mro__][:2] for m in learn.model],
                                callbacks=sorted(type(c).__name__ for c in learn.cbs), values=[float(v) for v in learn.recorder.values[-1]],
                                digest=digest, learner=[c.__name__ for c in type(learn).__mro__])))
'''

def test_what_a_learner_gets_does_not_depend_on_what_was_imported():
    "Only `fastai_xla.distributed` imported (where `to_tpu_distributed` lives), or `fastai_xla.all`: the same XLA versions (the exact batch norms of 13_models at mean 1000), callbacks and learner mixins, and the same weights to the bit."
    runs = {}
    for imports in ('from fastai_xla.distributed import *', 'from fastai_xla.all import *'):
        r = run_py(IMPORTED.format(imports=imports))
        assert r.returncode == 0, r.stderr[-3000:]
        runs[imports] = json.loads(r.stdout.split('RESULT ')[-1])
    only, every = runs.values()
    assert only == every, (only, every)
    assert only['modules'][0] == ['BatchNorm1d', 'BatchNormOnXLA'] and only['modules'][3][1] == 'BatchNormOnXLA', only['modules']
    assert {'XLADiagnostics', 'TPUCallback'} <= set(only['callbacks']) and 'XLACheckpoints' in only['learner'], only
    assert all(v == v for v in only['values']) and only['values'][0] < 1.0, only['values']   # no NaN; it learned (train loss; chance 2.3)
