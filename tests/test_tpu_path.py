"""The code a TPU runs, run here as far as a CPU allows.

1. torch_xla's in-graph collectives, executed: torch_xla's own switch `XLA_ALWAYS_ALLREDUCE=1` makes its collectives trace
   and run with one replica, on any device. A one-replica `to_tpu_distributed()` run then goes through every call an
   eight-core TPU run makes on torch_xla's transport (`XLACollectives`): the gradients' all-reduce in every training step,
   the metric and loss reductions at each phase's end, `get_preds`' gathers, the weight and buffer broadcasts, the run's
   agreement and its barriers (`xm.rendezvous`), and the preemption vote (the meeting store, opened as for several
   replicas). What one replica cannot show: that the replicas' copies of the graph agree with each other (they are one
   here), and the interconnect itself. `xm.rendezvous` is not an op of a graph: it is executed (its answer checked), not
   counted.
2. Replicas as threads of one process (TPU v2/v3: Kaggle's v3-8, Colab's v2-8): 2 processes x 2 threads = 4 replicas over
   gloo, each thread its own run, group and store connection (`ReplicaProcesses(threads=2)`). torch_xla's own collectives
   cannot run between CPU threads (they deadlock, README): these threads talk through gloo.
3. Eight replicas, the count of a v3-8 or v5e-8, on this 2-core machine: `learn.launch(nprocs=8)` and a script's `spawn`.
"""
import json, os, re, subprocess, sys, textwrap, time
from pathlib import Path
import pytest
from helpers import *

TESTS = Path(__file__).parent

def run_py(code, env=None, timeout=900, cwd=None):
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, 'PJRT_DEVICE': 'CPU', **(env or {})}, cwd=cwd)

def result(r):
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.split('RESULT ')[-1].splitlines()[0])

ALWAYS_ALLREDUCE = '''
import sys, json, re, torch
sys.path.insert(0, {tests!r})
from unittest import mock
from helpers import *
from fastai_xla.backend_xla import XLACollectives

# a spy on torch_xla's transport: every call counted, then made for real (nothing replaced but the counting)
calls = {{}}
def spy(name):
    real = getattr(XLACollectives, name)
    def counted(self, *args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return real(self, *args, **kwargs)
    return counted
NAMES = ['reduce_gradients', 'all_reduce_sum', 'all_gather', 'broadcast_', 'broadcast_object', 'barrier']
patches = [mock.patch.object(XLACollectives, n, spy(n)) for n in NAMES]
for p in patches: p.start()

hlos, ops = {{}}, {{}}
class Graphs(Callback):
    "The HLO of a steady training step and of a validation step (before the step boundary cuts them), and the ops traced per epoch."
    order = 54
    def before_epoch(self): self.ops0 = current_backend().counters.op_counts()
    def after_batch(self):
        if self.epoch == 1 and self.iter == 2:
            mets = [m.total.t for m in self.recorder._valid_mets if hasattr(getattr(m, 'total', None), 't')]
            ts = (list(self.model.parameters()) + [s for st in self.opt.state.values() for s in st.values()
                  if isinstance(s, torch.Tensor) and s.device.type == 'xla']) if self.training else [self.learn.pred] + mets
            hlos['train' if self.training else 'valid'] = current_backend().counters.graph_hlo(ts)
    def after_epoch(self):
        o = current_backend().counters.op_counts()
        ops[self.epoch] = {{k: v - self.ops0.get(k, 0) for k, v in o.items() if v != self.ops0.get(k, 0)}}

set_seed(0, reproducible=True)
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
learn = Learner(digits_dls(), model, loss_func=CrossEntropyLossFlat(), metrics=[accuracy, F1Score(average='macro')], path={path!r},
                opt_func=partial(SGD, mom=0.9))   # (SGD: Adam's division by a tiny second moment would magnify float32's last bits)
rank0_first(lambda: None)                                  # a barrier before the learner is a replica, as a script's first download
learn.to_tpu_distributed(seed=0)
run = learn.xla_run
start = learn.load_resume('run', missing_ok=True)          # a broadcast of whether there is one
with learn.no_bar(): learn.fit(2, 1e-2, start_epoch=start, cbs=[Graphs(), ResumeCallback('run', check_every=5)])
preds, targs = learn.get_preds()
learn.save('final'); learn.load('final')
n_train = len(learn.dls.train)
train_ar = re.findall(r'all-reduce\\((.*)', hlos['train'])
print('RESULT', json.dumps(dict(
    together=run.together, count=run.count, collectives=type(run.collectives).__name__, calls=calls,
    steps=2 * n_train, votes=run.votes, meetings=run.meetings,
    train_all_reduces=len(re.findall(r' all-reduce\\(', hlos['train'])), valid_all_reduces=len(re.findall(r'all-reduce', hlos['valid'])),
    train_all_reduce_line=[l.strip() for l in hlos['train'].splitlines() if ' all-reduce(' in l][:1],
    ops=ops, epochs=learn.xla_diagnostics.epochs, n_preds=len(preds),
    weights=[p.detach().cpu().flatten().tolist() for p in learn.model.parameters()],
    values=[[float(v) for v in vs] for vs in learn.recorder.values])))
'''

@pytest.fixture(scope='module')
def always_allreduce(tmp_path_factory):
    "The same 3-epoch one-replica fit with torch_xla's collectives forced on (`XLA_ALWAYS_ALLREDUCE=1`), and without."
    res = {}
    for on in ('1', '0'):
        path = tmp_path_factory.mktemp(f'always{on}')
        res[on] = result(run_py(ALWAYS_ALLREDUCE.format(tests=str(TESTS), path=str(path)), env={'XLA_ALWAYS_ALLREDUCE': on}))
    return res

def test_every_collective_of_torch_xlas_transport_runs_with_one_replica(always_allreduce):
    on, off = always_allreduce['1'], always_allreduce['0']
    assert on['together'] and on['count'] == 1 and on['collectives'] == 'XLACollectives', on
    assert not off['together'] and off['calls'] == {}, off                  # without the switch: one replica, nothing to say
    calls = on['calls']
    assert calls.get('reduce_gradients', 0) == on['steps'], calls           # every training step, once
    for name in ('all_reduce_sum', 'all_gather', 'broadcast_', 'broadcast_object', 'barrier'): assert calls.get(name, 0) >= 1, (name, calls)
    assert on['votes'] >= on['steps'] // 5 and on['meetings'] > 0, on      # the preemption vote and the meetings, through the store

def test_the_training_step_holds_one_all_reduce_and_validation_none(always_allreduce):
    "torch_xla coalesces the gradients of one dtype (and its token) into one all-reduce in the step's graph; validation steps reduce nothing."
    on = always_allreduce['1']
    assert on['train_all_reduces'] == 1, on['train_all_reduce_line']
    line = on['train_all_reduce_line'][0]
    assert 'f32[32,64]' in line and 'f32[10]' in line and 'to_apply' in line, line     # every gradient, summed
    assert on['valid_all_reduces'] == 0
    # traced per epoch: the step's all-reduce per training step, plus the phase-end reductions
    steps = on['steps'] // 2
    for epoch in ('0', '1'): assert on['ops'][epoch].get('xla::AllReduceInPlace', 0) >= steps, on['ops'][epoch]

def test_the_same_run_with_and_without_the_collectives(always_allreduce):
    "The same weights (1e-5 of the largest), the same metrics; no compile after epoch 1 and no extra device read with the collectives on."
    on, off = always_allreduce['1'], always_allreduce['0']
    scale = max(abs(x) for w in off['weights'] for x in w)
    for a, b in zip(on['weights'], off['weights']):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5 * scale, (max(abs(x - y) for x, y in zip(a, b)), scale)
    for a, b in zip(on['values'], off['values']): assert a[:4] == pytest.approx(b[:4], rel=1e-5)
    fit1 = lambda r: [e for e in r['epochs'] if e['fit'] == 1]
    assert [e['compiles'] for e in fit1(on)[1:]] == [0] == [e['compiles'] for e in fit1(off)[1:]], (fit1(on), fit1(off))
    assert [e['to_host'] for e in fit1(on)] == [e['to_host'] for e in fit1(off)], (fit1(on), fit1(off))
    assert on['n_preds'] == off['n_preds'] == 359
