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
   gloo, each thread its own run, group and store connection (`ElasticLauncher(threads=2)`, on torch's elastic agent). torch_xla's own collectives
   cannot run between CPU threads (they deadlock, README): these threads talk through gloo.
3. Eight replicas, the count of a v3-8 or v5e-8, on this 2-core machine: `learn.launch(nprocs=8)` and a script's `spawn` (with `--all`).
4. torchrun on a TPU host: the chips and ports torch_xla's own set-up (`configure_topology`, which every torchrun replica runs
   through `start_agent_replica`) gives each process of v3-8, v4-8, v5e-8 and v6e-8 hosts, computed under its metadata
   overrides without a TPU (the runtime itself, which opens each process's chip, is not started).
"""
import json, os, subprocess, sys, textwrap, time
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
    runs_collectives=run.runs_collectives, count=run.count, collectives=type(run.collectives).__name__, calls=calls,
    steps=2 * n_train, votes=run.meetings.voted, meetings=run.meetings.met,
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
    assert on['runs_collectives'] and on['count'] == 1 and on['collectives'] == 'XLACollectives', on
    assert not off['runs_collectives'] and off['calls'] == {}, off                  # without the switch: one replica, nothing to say
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

THREADS = '''
import sys, json, os, time, signal, hashlib, threading
sys.path.insert(0, {tests!r})
from helpers import *
from test_replicas import indexed_learner, RecordItems
from fastai_xla.agent import ElasticLauncher, ReplicasFailed
MODE, OUT = {mode!r}, Path({out!r})

class Trouble(Callback):
    "In epoch 1, batch 3: replica 3 raises (MODE fail), or replica 2 sends its own process SIGTERM (MODE preempt), once."
    def before_batch(self):
        if not self.training or (self.epoch, self.iter) != (1, 3): return
        r = replica_ordinal()
        if MODE == 'fail' and r == 3:
            (OUT/'raised').write_text(repr(time.time())); raise ValueError('replica 3 breaks on purpose')
        if MODE == 'preempt' and r == 2 and not (OUT/'signalled').exists():
            (OUT/'signalled').write_text(repr(time.time())); os.kill(os.getpid(), signal.SIGTERM)

BUILD = threading.Lock()
def train(rank):
    # threads of one process share its random generators: each seeds and builds its model alone, or the master's weights
    # (which every replica takes) would depend on how the threads' draws interleaved
    with BUILD: learn = indexed_learner(bs=32, path=OUT)
    learn.to_tpu_distributed(seed=0)
    rec = RecordItems()
    learn.fit(2, 1e-2, start_epoch=learn.load_resume('run', missing_ok=True), cbs=[rec, Trouble(), ResumeCallback('run', check_every=2)])
    valid = learn.validate()
    preds, targs = learn.get_preds()
    learn.save('final'); learn.load('final')
    run = learn.xla_run
    beats = [run.meetings.store.add(f'alive/{{r}}', 0) for r in range(run.count)]
    (OUT/f'replica-{{run.ordinal}}.json').write_text(json.dumps(dict(
        rank=run.ordinal, count=run.count, local=run.local_ordinal, pid=os.getpid(), device=str(run.device), seen=rec.seen,
        valid=[float(v) for v in valid], n_preds=len(preds), beats=beats, watchdog=getattr(run.supervisor, 'watchdog', None) is not None,
        weights=hashlib.sha256(b''.join(p.detach().cpu().numpy().tobytes() for p in learn.model.parameters())).hexdigest(),
        params=[p.detach().cpu().flatten().tolist() for p in learn.model.parameters()])))

t = time.time()
try: ElasticLauncher(current_settings(transport='gloo'), threads=2).run(train, nprocs=2, start_method='fork')   # (as `spawn` runs it)
except ReplicasFailed as e: print('FAILED', json.dumps(e.statuses)); print('SAID', json.dumps(str(e)))
print('ENDED', time.time())
'''

def run_threads(tmp_path, mode, **env):
    tmp_path.mkdir(exist_ok=True)
    r = run_py(THREADS.format(tests=str(TESTS), mode=mode, out=str(tmp_path)), env={'FASTAI_XLA_FAULT_GRACE': '2', **env}, timeout=600)
    assert 'ENDED' in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
    reports = {json.loads(p.read_text())['rank']: json.loads(p.read_text()) for p in tmp_path.glob('replica-*.json')}
    failed = json.loads(r.stdout.split('FAILED ')[1].splitlines()[0]) if 'FAILED ' in r.stdout else None
    return r, reports, failed, float(r.stdout.split('ENDED ')[1].split()[0])

@pytest.fixture(scope='module')
def threads(tmp_path_factory):
    "4 replicas as 2 processes x 2 threads (a TPU v3-8's shape, halved), gloo between them: fit, validate, get_preds, save/load."
    out = tmp_path_factory.mktemp('threads')
    r, reports, failed, _ = run_threads(out, 'none')
    assert failed is None and len(reports) == 4, r.stderr[-4000:]
    return out, r, reports

def test_replicas_as_threads_are_replicas_of_their_own(threads):
    out, r, reports = threads
    assert sorted(reports) == [0, 1, 2, 3] and all(x['count'] == 4 for x in reports.values())
    assert len({x['pid'] for x in reports.values()}) == 2                                 # 2 processes ...
    assert sorted(x['local'] for x in reports.values()) == [0, 1, 2, 3]                   # ... of one host
    assert sorted(x['device'] for x in reports.values()) == ['xla:0', 'xla:0', 'xla:1', 'xla:1']   # a device per thread
    for x in reports.values(): assert all(b == 0 for b in x['beats']), x['beats']         # torch's agent watches: no heartbeat of ours
    assert not any(x['watchdog'] for x in reports.values())                              # (nor a watchdog: `AgentSupervisor`)
    assert len({x['weights'] for x in reports.values()}) == 1 and all(x['n_preds'] == 360 for x in reports.values())
    assert r.stdout.count('train_loss') == 1, r.stdout[-3000:]                             # one progress table: the master's

def test_thread_replicas_share_out_the_data_and_measure_it_exactly(threads):
    out, r, reports = threads
    from test_replicas import indexed_learner
    for epoch in (0, 1):
        seen = [set(i for e, phase, ids in x['seen'] if (e, phase) == (epoch, 'train') for i in ids) for x in reports.values()]
        assert all(not (a & b) for k, a in enumerate(seen) for b in seen[k + 1:])           # disjoint
        valid = [i for x in reports.values() for e, phase, ids in x['seen'] if (e, phase) == (epoch, 'valid') for i in ids]
        assert sorted(valid) == list(range(1437, 1797))                                     # covering, once each
    one = indexed_learner(bs=32, path=out).to_xla()
    one.load('final')
    with one.no_bar(): values = one.validate()
    for x in reports.values(): assert x['valid'] == pytest.approx([float(v) for v in values], abs=1e-5)

def test_a_failure_in_one_thread_stops_all_four(tmp_path):
    r, reports, failed, ended = run_threads(tmp_path, 'fail')
    took = ended - float((tmp_path/'raised').read_text())
    said = json.loads(r.stdout.split('SAID ')[1].splitlines()[0])
    assert failed is not None and failed['1'] == 1 and not reports, (failed, r.stderr[-3000:])   # (process 1's thread failed)
    assert said.startswith('replica 3 (exit status 1): ValueError') and 'replica 3 breaks on purpose' in said, said   # (the thread's own record)
    assert took < 20, took                                                                  # (the agent stops the others at once)

def test_a_preempted_thread_process_stops_all_after_the_same_step_and_resumes(tmp_path, threads):
    r, reports, failed, _ = run_threads(tmp_path, 'preempt')
    assert set(failed.values()) == {75}, (failed, r.stderr[-3000:])                          # every replica, Preempted
    state = torch.load(tmp_path/'models'/'run.pth', weights_only=False)
    assert state['next_epoch'] == 1 and state['batch'] >= 4 and sorted(state['every_replica']) == [0, 1, 2, 3], state['batch']
    r, reports, failed, _ = run_threads(tmp_path, 'none')                                     # the same command again
    assert failed is None and len(reports) == 4, r.stderr[-3000:]
    whole = threads[2][0]['params']
    for x in reports.values():                                                               # as if never stopped (1e-5)
        for a, b in zip(x['params'], whole): assert max(abs(u - v) for u, v in zip(a, b)) < 1e-5

def eight_replicas_train(learn, out_dir):
    "Each of 8 replicas: one epoch, recording the items it saw; a checkpoint saved once; its report."
    from test_replicas import RecordItems
    rec = RecordItems()
    learn.fit(1, 1e-2, cbs=[rec, SaveModelCallback(fname='best', every_epoch=False)])
    Path(out_dir, f'replica-{replica_ordinal()}.json').write_text(json.dumps(dict(
        rank=replica_ordinal(), world=replica_count(), seen=rec.seen, values=[float(v) for v in learn.recorder.values[-1]])))

def check_eight(out_dir, learn_path=None):
    reps = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob('replica-*.json'))]
    assert sorted(r['rank'] for r in reps) == list(range(8)) and all(r['world'] == 8 for r in reps)
    train = [set(i for e, p, ids in r['seen'] if p == 'train' for i in ids) for r in reps]
    assert all(not (a & b) for k, a in enumerate(train) for b in train[k + 1:])                   # disjoint
    assert len(set().union(*train)) == 8 * 2 * 64                                                # 2 whole batches each
    valid = sorted(i for r in reps for e, p, ids in r['seen'] if p == 'valid' for i in ids)
    assert valid == list(range(1437, 1797))                                                       # covering, exactly once
    assert len({tuple(r['values']) for r in reps}) == 1                                          # the same reduced metrics
    return reps

def test_eight_replicas_from_a_notebook(tmp_path):
    "`learn.launch(nprocs=8)` (forked replicas, gloo) on this 2-core machine: shards, exact metrics, one checkpoint, bounded time."
    from test_replicas import indexed_learner
    learn = indexed_learner(bs=64, path=tmp_path)
    t = time.time()
    learn.launch(eight_replicas_train, str(tmp_path), nprocs=8, transport='gloo', dl_kwargs=dict(seed=0))
    took = time.time() - t
    reps = check_eight(tmp_path)
    with learn.no_bar(): one = learn.validate()                   # the weights that came back, one device, whole valid set
    assert reps[0]['values'][2] == pytest.approx(float(one[1]))   # accuracy, exact over the whole set
    saved = sorted(p.name for p in (tmp_path/'models').iterdir())
    assert saved == ['.best.pth.saves', 'best.pth'], saved                                      # one file, written once
    assert json.loads((tmp_path/'models'/'.best.pth.saves').read_text())['count'] == 1
    assert took < 300, took
    print(f'8 replicas, launched: {took:.0f} s')

EIGHT_SCRIPT = '''
import sys, time; sys.path.insert(0, {tests!r})
from helpers import *
from test_replicas import indexed_learner
from test_tpu_path import eight_replicas_train
def train(index):
    learn = indexed_learner(bs=64, path={out!r}).to_tpu_distributed(seed=0)
    eight_replicas_train(learn, {out!r})
if __name__ == '__main__':
    t = time.time()
    spawn(train, nprocs=8, transport='gloo', start_method='fork')
    print('TOOK', time.time() - t)
'''

def test_eight_replicas_from_a_script(tmp_path):
    "A script's `spawn(train, nprocs=8, transport='gloo')`: the same rules, one progress table."
    (tmp_path/'train.py').write_text(EIGHT_SCRIPT.format(tests=str(TESTS), out=str(tmp_path)))
    r = subprocess.run([sys.executable, 'train.py'], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0, r.stderr[-4000:]
    check_eight(tmp_path)
    assert r.stdout.count('train_loss') == 1, r.stdout[-2000:]
    took = float(r.stdout.split('TOOK ')[1].split()[0])
    assert took < 300, took
    print(f'8 replicas, spawned: {took:.0f} s')

TOPOLOGY = '''
import os, json
from torch_xla._internal import tpu
HOSTS = {hosts!r}
base, out = dict(os.environ), {{}}
for host, (accelerator, host_bounds, chips_per_host, processes) in HOSTS.items():
    for local_rank in range(processes):   # (each torchrun process of the host, as torch_xla's `xla://` set-up configures it)
        os.environ.clear(); os.environ.update(base)
        os.environ.update(TPU_SKIP_MDS_QUERY='1', TPU_ACCELERATOR_TYPE=accelerator, TPU_WORKER_ID='0', TPU_WORKER_HOSTNAMES='localhost')
        if host_bounds: os.environ.update(TPU_HOST_BOUNDS=host_bounds, TPU_CHIPS_PER_HOST_BOUNDS=chips_per_host)
        tpu.configure_topology(local_rank, processes)
        out.setdefault(host, []).append({{k: os.environ.get(k) for k in ('TPU_VISIBLE_CHIPS', 'TPU_CHIPS_PER_PROCESS_BOUNDS',
            'TPU_PROCESS_BOUNDS', 'CLOUD_TPU_TASK_ID', 'TPU_PROCESS_PORT', 'TPU_PROCESS_ADDRESSES')}})
print('RESULT ' + json.dumps(out))
'''
# host -> (its accelerator type as the TPU metadata names it, host bounds, chips per host: the metadata's `tpu-env`, chips)
TPU_HOSTS = {'v3-8': ('v3-8', None, None, 4), 'v4-8': ('v4-8', '1,1,1', '2,2,1', 4),
             'v5e-8': ('v5litepod-8', '1,1,1', '2,4,1', 8), 'v6e-8': ('v6e-8', '1,1,1', '2,4,1', 8)}

def test_torchrun_replicas_of_a_tpu_host_get_disjoint_chips_and_ports_from_torch_xla():
    """What torch_xla's own multi-process set-up (`configure_topology`, which `start_agent_replica` runs through
    `initialize_multiprocess` in every torchrun replica) gives each of a host's processes on v3-8, v4-8, v5e-8 and v6e-8 hosts,
    computed by torch_xla itself under its documented metadata overrides (`TPU_SKIP_MDS_QUERY` and the `TPU_*` variables its
    `build_tpu_env_from_vars` reads, in place of the GCE metadata server): one chip each, the chips disjoint and covering the
    host, a port each, every process the same bounds and addresses, the task ids the local ranks. Nothing of torch_xla
    faked; no TPU (the runtime is not started: on a chip that is where each process opens its own). On v3-8 each process's chip
    has two cores, which torchrun's one replica a process cannot use: `check_agent_placement` refuses it, naming `spawn`."""
    out = result(run_py(TOPOLOGY.format(hosts=TPU_HOSTS), env={'PJRT_DEVICE': 'TPU'}))
    for host, (_, _, _, n) in TPU_HOSTS.items():
        procs = out[host]
        assert sorted(int(p['TPU_VISIBLE_CHIPS']) for p in procs) == list(range(n)), (host, procs)      # disjoint, the whole host
        assert [int(p['CLOUD_TPU_TASK_ID']) for p in procs] == list(range(n)), host                     # task = local rank
        assert len({p['TPU_PROCESS_PORT'] for p in procs}) == n and all(p['TPU_CHIPS_PER_PROCESS_BOUNDS'] == '1,1,1' for p in procs)
        assert len({(p['TPU_PROCESS_BOUNDS'], p['TPU_PROCESS_ADDRESSES']) for p in procs}) == 1, host    # one view of the host
        bounds = [int(x) for x in procs[0]['TPU_PROCESS_BOUNDS'].split(',')]
        assert bounds[0] * bounds[1] * bounds[2] == n and procs[0]['TPU_PROCESS_ADDRESSES'].count(':') == n, (host, procs[0])
    print('\n'.join(f"{h}: {len(ps)} processes, bounds {ps[0]['TPU_PROCESS_BOUNDS']}, chips "
                    f"{[p['TPU_VISIBLE_CHIPS'] for p in ps]}, ports {[p['TPU_PROCESS_PORT'] for p in ps]}" for h, ps in out.items()))
