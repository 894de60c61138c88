"""Scripts started with `torchrun`, as PyTorch users, clusters and TorchTPU's docs start replicas: torch's own elastic agent
places every process (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`...), hosts the store, watches the replicas and restarts the group
(`--max-restarts`). The script calls `to_tpu_distributed()` in each process, as under `spawn`, and the processes are one run.

Covered: `torchrun --standalone --nproc-per-node=2` on both backends (torch_xla's CPU device, one per process; the native
backend on torch_xla's device and on the eager `tpu` test device standing in for a chip), replicas over gloo through the agent's store; a replica SIGKILLed
(as the out-of-memory killer does) with and without `--max-restarts`, the restarted attempt resuming from the last
checkpoint; SIGTERM to the agent (a VM's shutdown); with `--all`, the multi-node form (two agents, `--rdzv-backend=c10d`).
Not covered: separate machines (the "nodes" share this one), TorchTPU's `tpu_dist` group (no chip here)."""
import json, os, re, signal, subprocess, sys, time
from pathlib import Path
import pytest
from helpers import fault_row
from fastai_xla.replicas import free_port

TESTS = Path(__file__).parent

SCRIPT = '''
import os, sys, json, time, signal
sys.path.insert(0, {tests!r})
from helpers import *
from test_replicas import indexed_learner, RecordItems
from fastai_xla.fsdp import whole
KILL, RESUME = {kill!r}, {resume!r}

class KillMe(Callback):
    "Replica 1 SIGKILLs itself in epoch 1, before its 4th training batch, in the first attempt only (no clean-up: nothing said)."
    def before_batch(self):
        if (KILL and replica_ordinal() == 1 and self.training and (self.epoch, self.iter) == (1, 3)
                and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0'):
            Path('killed').write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

learn = indexed_learner(bs=32, path=Path.cwd()).to_tpu_distributed(seed=0, fsdp=os.environ.get('TEST_FSDP') == '1' or None)   # (sharded: tests/test_fsdp.py)
rec = RecordItems()
extra = dict(start_epoch=learn.load_resume('run', missing_ok=True), cbs=[rec, KillMe(), ResumeCallback('run')]) if RESUME else dict(cbs=[rec, KillMe()])
learn.fit(3, 1e-2, **extra)
run = learn.xla_run
Path(f'replica-{{run.ordinal}}.json').write_text(json.dumps(dict(
    rank=run.ordinal, world=run.count, attempt=run.settings.restart_count, run_id=run.run_id, seen=rec.seen,
    epochs=len(learn.recorder.values), backend=run.backend.name, device=str(run.device), collectives=run.collectives.name,
    local=[os.environ.get(k) for k in ('LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'PJRT_LOCAL_PROCESS_RANK', 'PJRT_LOCAL_PROCESS_COUNT')],
    all_reduces=run.backend.counters.op_counts().get('xla::AllReduceInPlace', 0) if run.backend.name == 'torch_xla' else None,
    params=[to_host(whole(p)).flatten().tolist() for p in learn.model.parameters()])))
'''

def torchrun(tmp_path, *flags, kill=False, resume=False, env=None, timeout=600):
    "Run the training script under torchrun with `flags` in `tmp_path`; its result, and the replicas' reports by rank."
    (tmp_path/'train.py').write_text(SCRIPT.format(tests=str(TESTS), kill=kill, resume=resume))
    for f in tmp_path.glob('replica-*.json'): f.unlink()
    t = time.time()
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', *flags, 'train.py'], cwd=tmp_path, capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, 'PJRT_DEVICE': 'CPU', **(env or {})})
    reports = {json.loads(p.read_text())['rank']: json.loads(p.read_text()) for p in tmp_path.glob('replica-*.json')}
    killed = tmp_path/'killed'
    return r, reports, time.time() - (float(killed.read_text()) if killed.exists() else t)   # (from the kill, where there was one)

BACKENDS = {'torch_xla': {'FASTAI_XLA_BACKEND': 'torch_xla'},
            # the eager `tpu` test device (tests/eager_tpu.py), which every process loads at `import torch`
            'native-tpu': {'FASTAI_XLA_BACKEND': 'native', 'FASTAI_XLA_NATIVE_DEVICE': 'tpu', 'FASTAI_XLA_EAGER_TPU': '1',
                           'PYTHONPATH': os.pathsep.join(p for p in (str(TESTS), os.environ.get('PYTHONPATH')) if p)}}

def shards(reports, epoch, phase):
    return [sorted(i for e, p, ids in reports[r]['seen'] if (e, p) == (epoch, phase) for i in ids) for r in sorted(reports)]

def test_one_torchrun_replica_on_torch_xla_all_reduces_in_the_graph(tmp_path):
    """`torchrun --standalone --nproc-per-node=1` with torch_xla's `XLA_ALWAYS_ALLREDUCE=1`: the replica went through torch_xla's
    single-process set-up, its collectives are torch_xla's in-graph ones (`AgentXLACollectives`, what a TPU's torchrun replicas
    use), and every training step's gradient all-reduce is an op of its graph, executed (counted: `xla::AllReduceInPlace`)."""
    r, reports, _ = torchrun(tmp_path, '--standalone', '--nproc-per-node=1', env={'FASTAI_XLA_BACKEND': 'torch_xla', 'XLA_ALWAYS_ALLREDUCE': '1'})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    x = reports[0]
    assert x['collectives'] == 'xla' and x['local'][2:] == [None, '1'], x['local']      # (initialize_singleprocess: the count alone)
    assert x['all_reduces'] >= 3 * 44 and x['epochs'] == 3, x['all_reduces']           # (3 epochs of 44 steps, each its all-reduce)

@pytest.fixture(scope='module')
def never_stopped(tmp_path_factory):
    "One torchrun run of the script with `ResumeCallback`, never stopped: the torch_xla case of the next test, and the weights a resumed run must end with."
    return torchrun(tmp_path_factory.mktemp('never_stopped'), '--standalone', '--nproc-per-node=2', resume=True, env=BACKENDS['torch_xla'])

# (the native backend on the lazy `xla` device under torchrun is the same code as on the eager one: its own branches run in
# scripts/test.sh's native tests on that device)
@pytest.mark.parametrize('backend', ['torch_xla', 'native-tpu'])
def test_torchrun_standalone_is_one_run(tmp_path, backend, request):
    """Two processes under `torchrun --standalone --nproc-per-node=2`: each trains half the batches of every epoch (disjoint
    shards), validates half the set (exact metrics over the whole of it), one progress table prints (the master's), and
    both end with the same weights. (Before: each process trained all 22 batches alone, and printed its own table.) On
    torch_xla each replica went through torch_xla's own multi-process set-up first (`PJRT_LOCAL_PROCESS_RANK`/`_COUNT` as its
    `xla://` handler sets them from `LOCAL_RANK`/`LOCAL_WORLD_SIZE`), and averages through gloo: torch_xla's CPU device has no
    collectives between processes (on a TPU the in-graph ones: `agent_collectives`, tested in nbs/00d_backend_xla)."""
    r, reports, took = (request.getfixturevalue('never_stopped') if backend == 'torch_xla' else
                        torchrun(tmp_path, '--standalone', '--nproc-per-node=2', env=BACKENDS[backend]))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    if backend == 'torch_xla':
        for x in reports.values(): assert x['local'][:2] == x['local'][2:] == [str(x['rank']), '2'] and x['collectives'] == 'gloo', x['local']
    assert sorted(reports) == [0, 1] and all(x['world'] == 2 and x['backend'] == backend.split('-')[0] for x in reports.values()), reports.keys()
    device = 'tpu:0' if backend == 'native-tpu' else 'xla'
    assert all(x['device'].startswith(device) for x in reports.values()), reports   # (a device apart from the host, every way)
    for epoch in range(3):
        train = shards(reports, epoch, 'train')
        assert not set(train[0]) & set(train[1]) and len(train[0]) == len(train[1]) == 22 * 32   # half of 44 batches each
        assert sorted(shards(reports, epoch, 'valid')[0] + shards(reports, epoch, 'valid')[1]) == list(range(1437, 1797))
    assert reports[0]['params'] == reports[1]['params']                          # the same weights everywhere
    assert reports[0]['run_id'] == reports[1]['run_id'] and len(re.findall(r'epoch\s+train_loss', r.stdout)) == 1, r.stdout[-2000:]
    print(f'torchrun, 2 replicas, {backend}: {took:.0f} s')

def test_a_replica_killed_under_max_restarts_resumes_and_ends_its_epochs(tmp_path, never_stopped):
    """`torchrun --max-restarts=1` with `ResumeCallback`: replica 1 is SIGKILLed in epoch 1; torch's agent stops replica 0 and
    starts the group again; the new attempt (`TORCHELASTIC_RESTART_COUNT=1`) loads the checkpoint of epoch 0 and trains epochs
    1 and 2, and ends with the weights of a run never stopped: no batch counted twice, none lost."""
    (tmp_path/'killed').mkdir()
    r, reports, took = torchrun(tmp_path/'killed', '--standalone', '--nproc-per-node=2', '--max-restarts=1', kill=True, resume=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert sorted(reports) == [0, 1] and all(x['attempt'] == 1 and x['epochs'] == 3 for x in reports.values()), reports
    assert all(sorted({e for e, p, _ in x['seen'] if p == 'train'}) == [1, 2] for x in reports.values())   # (epoch 0 was in the checkpoint)
    assert reports[0]['params'] == reports[1]['params']
    r2, whole, _ = never_stopped
    assert r2.returncode == 0, r2.stderr[-3000:]
    for a, b in zip(reports[0]['params'], whole[0]['params']): assert max(abs(u - v) for u, v in zip(a, b)) < 1e-6
    fault_row('torchrun `--max-restarts=1`: a replica killed (SIGKILL)', "torch's agent stops the others and starts the group again; "
              'the new attempt resumes from the last checkpoint (`ResumeCallback`) and ends with the weights of a run never stopped '
              '(seconds: from the kill to the end of the run, its last epochs trained again)', took, 'the epoch in progress, trained again')

def test_a_replica_killed_without_restarts_ends_the_run_named(tmp_path):
    """`torchrun` without restarts: replica 1 SIGKILLed; the agent stops replica 0 at once (it waits in gloo's all-reduce for
    the dead one) and torchrun ends with an error naming rank 1 and the signal. The same under `--max-restarts=1` without
    `ResumeCallback`: the new attempt says it starts from scratch, and trains all its epochs."""
    r, reports, took = torchrun(tmp_path, '--standalone', '--nproc-per-node=2', kill=True)
    (tmp_path/'killed').unlink()
    assert r.returncode != 0 and not reports, r.stderr[-3000:]
    said = re.search(r'rank\s*:\s*1.*\n.*\n.*exitcode\s*:\s*-9', r.stderr) or re.search(r'Signal 9 \(SIGKILL\) received by PID', r.stderr)
    assert said, r.stderr[-3000:]
    assert took < 120, took
    fault_row('torchrun without restarts: a replica killed (SIGKILL)', "torch's agent stops the others; torchrun's error names the rank "
              'and `Signal 9 (SIGKILL)`', took, 'the run since its last checkpoint')
    r, reports, _ = torchrun(tmp_path, '--standalone', '--nproc-per-node=2', '--max-restarts=1', kill=True)
    assert r.returncode == 0 and all(x['attempt'] == 1 and x['epochs'] == 3 for x in reports.values()), r.stderr[-3000:]
    assert 'this is attempt 2 of run' in r.stderr and 'it starts from scratch' in r.stderr, r.stderr[-3000:]

SIGTERMED = '''
import os, sys, time
sys.path.insert(0, {tests!r})
from helpers import *
from test_replicas import indexed_learner
class Slowly(Callback):
    def after_batch(self):
        if self.epoch == 1 and replica_ordinal() == 0: Path('epoch1').touch()
        time.sleep(0.02)
learn = indexed_learner(bs=32, path=Path.cwd()).to_tpu_distributed(seed=0)
learn.fit(20, 1e-2, start_epoch=learn.load_resume('run', missing_ok=True), cbs=[ResumeCallback('run'), Slowly()])
'''

def test_sigterm_to_torchrun_stops_every_replica_after_the_same_step(tmp_path):
    """A VM's shutdown notice to torchrun's agent: it passes SIGTERM on, every replica stops after the same step (their vote),
    the master writes the resume checkpoint there, and each replica exits with status 75 (`Preempted`)."""
    (tmp_path/'train.py').write_text(SIGTERMED.format(tests=str(TESTS)))
    p = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2', 'train.py'],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    deadline = time.time() + 300
    while not (tmp_path/'epoch1').exists() and time.time() < deadline and p.poll() is None: time.sleep(0.1)
    t = time.time()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    took = time.time() - t
    assert p.returncode != 0 and 'preempted (SIGTERM)' in err, err[-3000:]
    import torch
    state = torch.load(tmp_path/'models'/'run.pth', weights_only=False)
    assert state['next_epoch'] == 1 and state['batch'] > 0 and sorted(state['every_replica']) == [0, 1], (state['next_epoch'], state['batch'])
    assert took < 60, took
    fault_row("SIGTERM to torchrun's agent", 'every replica stops after the same step; the resume checkpoint holds it; each exits '
              'with status 75', took, 'nothing: run the same command again')

@pytest.mark.parametrize('nodes', [2])
def test_the_multi_node_form(tmp_path, nodes):
    """Two agents, as two hosts would run them (`--nnodes=2 --node-rank=N --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT`), on
    this one machine, with the run's secret (`FASTAI_XLA_SECRET`: the agents' store listens on the network): one run."""
    (tmp_path/'train.py').write_text(SCRIPT.format(tests=str(TESTS), kill=False, resume=False))
    port, env = free_port(), {**os.environ, 'PJRT_DEVICE': 'CPU', 'FASTAI_XLA_SECRET': 'a-run-secret-0123456789abcdef'}
    procs = [subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', f'--nnodes={nodes}', f'--node-rank={n}', '--nproc-per-node=1',
                               '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{port}', '--rdzv-id=multi-node-test', 'train.py'],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for n in range(nodes)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    reports = {json.loads(p.read_text())['rank']: json.loads(p.read_text()) for p in tmp_path.glob('replica-*.json')}
    assert sorted(reports) == [0, 1] and reports[0]['params'] == reports[1]['params'] and reports[0]['run_id'] == 'multi-node-test'
    train = shards(reports, 0, 'train')
    assert not set(train[0]) & set(train[1])

AGAIN = '''
import os, sys, json
sys.path.insert(0, {tests!r})
from helpers import *
# a learner converted twice (a notebook cell run again), then a second learner in the same process: each trains, none hangs
learn = linear_digits_learner().to_tpu_distributed(seed=0)
learn.to_tpu_distributed(seed=0)
learn.fit(1, 1e-2)
other = tabular_digits_learner().to_tpu_distributed(seed=0)
other.fit(1, 1e-2)
learn.fit(1, 1e-2)                                           # (the first learner again, after the second)
try: learn.launch(lambda l: None, nprocs=2, transport='gloo'); refused = None
except RuntimeError as e: refused = str(e)
Path(f'replica-{{replica_ordinal()}}.json').write_text(json.dumps(dict(rank=replica_ordinal(), refused=refused,
    accuracy=[float(final(learn, 'accuracy')), float(final(other, 'accuracy'))],
    params=[to_host(p).flatten().tolist() for p in learn.model.parameters()])))
'''

def test_converted_twice_two_learners_and_a_launch_inside_torchrun(tmp_path):
    """Under torchrun: `to_tpu_distributed()` called twice on a learner, then a second learner, then the first again: each fits,
    the replicas agree, nothing hangs (before: the second call built a gloo group under the first one's keys and hung in 9 of
    19 tries). `learn.launch` inside a torchrun replica is refused by name (before: each replica launched 2 more)."""
    (tmp_path/'train.py').write_text(AGAIN.format(tests=str(TESTS)))
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2', 'train.py'], cwd=tmp_path,
                       capture_output=True, text=True, timeout=400, env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    reports = [json.loads((tmp_path/f'replica-{n}.json').read_text()) for n in range(2)]
    assert reports[0]['params'] == reports[1]['params']
    assert all(min(x['accuracy']) > 0.8 for x in reports), reports[0]['accuracy']
    for x in reports:
        assert '`learn.launch` starts the replicas of a run, and this process is already replica' in x['refused'], x['refused']
        assert 'started by torchrun' in x['refused'] and 'learn.to_tpu_distributed()' in x['refused']

NAN = '''
import os, sys, json, time
sys.path.insert(0, {tests!r})
from helpers import *
class NaNOnReplica1(Callback):
    "Replica 1's loss is not a number at epoch 1's 4th training batch (a bad batch of its shard)."
    def after_loss(self):
        if replica_ordinal() == 1 and self.training and (self.epoch, self.iter) == (1, 3):
            self.learn.loss_grad = self.learn.loss_grad * float('nan'); self.learn.loss = self.learn.loss_grad.clone()
            Path('nan-at').write_text(repr(time.time()))
learn = linear_digits_learner().to_tpu_distributed(seed=0)
learn.lr_find(num_it=20, show_plot=False)      # (cancelled on every replica at once: fastai's cancel, the run goes on)
Path(f'found-{{replica_ordinal()}}').write_text('1')
learn.fit(4, 1e-2, cbs=[NaNOnReplica1(), TerminateOnNaNCallback()])
Path(f'fitted-{{replica_ordinal()}}').write_text('1')
'''

def test_a_nan_on_one_replica_ends_the_run_named(tmp_path):
    """Issue 82: fastai's `TerminateOnNaNCallback` on a NaN loss of replica 1 alone (under torchrun) ends the run on every
    replica within the fault grace, naming the callback, the epoch, the batch and the loss; before it, `lr_find`, which
    every replica cancels at the same step, went on. (Before issue 82 the replicas went on in a new process group, a
    path torch_xla's in-graph collectives cannot take; before that, replica 1 ended alone and torchrun blamed replica 0.)"""
    (tmp_path/'train.py').write_text(NAN.format(tests=str(TESTS)))
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2', 'train.py'], cwd=tmp_path,
                       capture_output=True, text=True, timeout=400, env={**os.environ, 'PJRT_DEVICE': 'CPU', 'FASTAI_XLA_FAULT_GRACE': '3'})
    ended = time.time()
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert all((tmp_path/f'found-{n}').exists() for n in range(2)), r.stderr[-3000:]
    assert not any((tmp_path/f'fitted-{n}').exists() for n in range(2)), r.stderr[-3000:]
    said = ("replica 1's fit was cancelled by TerminateOnNaNCallback.after_batch at epoch 1, training batch 3, its loss nan, "
            "and the other replicas did not cancel theirs within 3 s (FASTAI_XLA_FAULT_GRACE): a fit cancelled on one replica ends the run")
    assert said in r.stderr, r.stderr[-3000:]
    took = ended - float((tmp_path/'nan-at').read_text())
    assert took < 30, took
    fault_row("a NaN loss on one replica under torchrun with fastai's `TerminateOnNaNCallback`",
              'the run ends on every replica within `FASTAI_XLA_FAULT_GRACE` (3 s here), naming the callback, the epoch, the batch and the loss '
              '(seconds: from the NaN to torchrun\'s exit)', took, 'the run since its last checkpoint (the fit stops where fastai stops it)')

LONG_RUN = '''
import sys
sys.path.insert(0, {tests!r})
from helpers import *
from test_replicas import long_run
long_run(linear_digits_learner(path=Path.cwd()).to_tpu_distributed(seed=0), str(Path.cwd()))
'''

def test_the_loggers_and_trackers_of_long_runs_write_once_and_act_alike_under_torchrun(tmp_path):
    """Issue 68: the callbacks users keep for long runs (`test_replicas.py`'s test under `learn.launch`: fastai's CSV,
    TensorBoard and W&B loggers, the best model's save, early stopping, the plateau's rate) in a script under `torchrun
    --standalone --nproc-per-node=2` that calls `to_tpu_distributed()`: written once, alike on both replicas."""
    from test_replicas import assert_long_run_logged_once_and_alike
    (tmp_path/'train.py').write_text(LONG_RUN.format(tests=str(TESTS)))
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2', 'train.py'],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert_long_run_logged_once_and_alike(tmp_path)
