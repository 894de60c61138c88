"""Faults, each one for real, and what the other replicas see. Replicas here are separate Python processes started one
by one with their own environment (`RANK`, ..., gloo), as a pod's hosts start theirs: no launcher watches
them, so what stops the others is fastai_xla's own telling (the meeting store) and heartbeats. Each test writes its row
of the README's fault table (what the user sees, how long it took, what was lost) to `$FASTAI_XLA_FAULT_TABLE` when
that is set (`benchmarks/faults.py` collects them).

Not covered: torch_xla's in-graph collectives (a replica stuck there only ends through the watchdog: the same code,
but on a TPU), separate machines (a real network, a host's disk lost), a real preemption."""
import os, re, signal, subprocess, sys, time
from pathlib import Path
import pytest
from helpers import *

TESTS = Path(__file__).parent

def start_replicas(script:str, tmp_path, n=2, per_host=1, **env):
    "Start `n` replica processes of `script` by hand, `per_host` on each host (default: each its own host), gloo; return them."
    (tmp_path/'train.py').write_text(f'import sys; sys.path.insert(0, {str(TESTS)!r})\n' + script)
    port = free_port()
    procs = []
    for r in range(n):
        e = {**os.environ, **gloo_replica_env(r, n, port, local_rank=r % per_host, local_world=per_host), **env}
        procs.append(subprocess.Popen([sys.executable, 'train.py'], cwd=tmp_path, env=e, text=True,
                                      stdout=open(tmp_path/f'out-{r}.txt', 'w'), stderr=open(tmp_path/f'err-{r}.txt', 'w')))
    return procs

def wait_all(procs, timeout=300):
    deadline = time.time() + timeout
    try:
        for p in procs: p.wait(max(1, deadline - time.time()))
    finally:
        for p in procs:
            if p.poll() is None: p.kill(); p.wait()
    return [p.returncode for p in procs], time.time()

OUTSIDE_FIT = """
from helpers import *
learn = linear_digits_learner().to_tpu_distributed(seed=0)
learn.fit(1, 1e-2)
if replica_ordinal() == 1:
    Path('raised').write_text(repr(time.time()))
    raise ValueError('boom, in the script, outside fit')
learn.validate()                       # replica 0: a collective replica 1 never reaches
"""

def test_a_failure_outside_fit_stops_the_others_at_once(tmp_path):
    "Replica 1 raises in the script after `fit`; replica 0, in `validate`, stops with its traceback, not after the timeout."
    procs = start_replicas(OUTSIDE_FIT, tmp_path, FASTAI_XLA_TIMEOUT='120', FASTAI_XLA_FAULT_GRACE='2')
    codes, ended = wait_all(procs)
    err0 = (tmp_path/'err-0.txt').read_text()
    assert codes[0] != 0 and codes[1] != 0, (codes, err0[-3000:])
    assert 'replica 1 failed' in err0 and 'boom, in the script, outside fit' in err0, err0[-3000:]
    took = ended - float((tmp_path/'raised').read_text())
    assert took < 30, took                                          # FASTAI_XLA_TIMEOUT is 120: seen ~2 s
    fault_row('a replica raises in the script, outside `fit`', "every replica stops; the others' error holds its traceback",
              took, 'nothing saved is lost')

KILLED = """
import os, signal
from helpers import *
def die(): Path('killed').write_text(repr(time.time())); os.kill(os.getpid(), signal.SIGKILL)   # no clean-up: nothing told
class KillMe(Callback):
    def before_batch(self):
        if WHERE == 'mid-epoch' and replica_ordinal() == 1 and self.training and (self.epoch, self.iter) == (1, 3): die()
learn = linear_digits_learner().to_tpu_distributed(seed=0)
learn.fit(2, 1e-2, cbs=KillMe())
if WHERE == 'between fit and validate' and replica_ordinal() == 1: die()
learn.validate()
if WHERE == 'the master, while the others load' and replica_ordinal() == 0: die()
learn.save('x'); learn.load('x')         # (replica 1 waits for the master's save)
"""

@pytest.mark.parametrize('where', ['mid-epoch', 'between fit and validate', 'the master, while the others load'])
def test_a_replica_killed_with_sigkill_is_noticed(tmp_path, where):
    """A replica is SIGKILLed; the other (no launcher watches it) ends, naming it. Mid-epoch, replica 0 is in gloo's
    all-reduce, which sees the connection drop; between fit and validate it waits at a meeting in the store, where only
    the heartbeat tells (as in torch_xla's in-graph collectives on a TPU, which see nothing). The master serves the
    store: killed while replica 1 waits in `load` for its save, it is named by the store's silence, not after the timeout."""
    dead = 0 if where.startswith('the master') else 1
    procs = start_replicas(f'WHERE = {where!r}\n' + KILLED, tmp_path, per_host=2 if dead == 0 else 1,   # (one host: one writer)
                           FASTAI_XLA_TIMEOUT='120', FASTAI_XLA_FAULT_GRACE='1', FASTAI_XLA_HEARTBEAT='3')
    codes, ended = wait_all(procs)
    err = (tmp_path/f'err-{1 - dead}.txt').read_text()
    assert codes[dead] == -signal.SIGKILL and codes[1 - dead] != 0, (codes, err[-3000:])
    took = ended - float((tmp_path/'killed').read_text())
    assert took < 30, took                                          # FASTAI_XLA_TIMEOUT is 120
    expected = {'mid-epoch': r'Connection (closed|reset) by peer|replica 1 stopped answering',
                'between fit and validate': r'replica 1 stopped answering: its heartbeat has not moved for \d+ s',
                'the master, while the others load': r'replica 0, the master, is gone'}[where]
    said = re.search(expected, err)
    assert said, err[-3000:]
    fault_row('the master (replica 0, which serves the meeting store) killed (SIGKILL) while the others wait in `load`' if dead == 0
              else f'a replica killed (SIGKILL) {where}', f"the others stop: `{said.group(0)}`", took,
              'the epoch in progress (resume from the last checkpoint)' if where == 'mid-epoch' else 'nothing saved')

BEFORE_OR_DURING = """
from helpers import *
class RaiseMidEpoch(Callback):
    def before_batch(self):
        if WHERE == 'during fit' and replica_ordinal() == 1 and self.training and (self.epoch, self.iter) == (0, 3):
            Path('raised').write_text(repr(time.time())); raise ValueError(f'boom, {WHERE}')
learn = linear_digits_learner().to_tpu_distributed(seed=0)
if WHERE == 'before fit' and replica_ordinal() == 1:
    Path('raised').write_text(repr(time.time())); raise ValueError(f'boom, {WHERE}')
learn.fit(2, 1e-2, cbs=RaiseMidEpoch())
"""

@pytest.mark.parametrize('where', ['before fit', 'during fit'])
def test_a_failure_before_or_during_fit_stops_the_others_at_once(tmp_path, where):
    """Replica 1 raises before `fit` (replica 0 waits at the first meeting) or mid-epoch (replica 0 waits for its gradients in
    gloo's all-reduce: what a script under xmp.spawn is, with gloo instead of torch_xla's collectives): replica 0 stops
    within FASTAI_XLA_FAULT_GRACE, printing replica 1's traceback, not after the timeout."""
    procs = start_replicas(f'WHERE = {where!r}\n' + BEFORE_OR_DURING, tmp_path, FASTAI_XLA_TIMEOUT='120', FASTAI_XLA_FAULT_GRACE='2')
    codes, ended = wait_all(procs)
    err0 = (tmp_path/'err-0.txt').read_text()
    assert codes[0] != 0 and codes[1] != 0, (codes, err0[-3000:])
    assert f'boom, {where}' in err0, err0[-3000:]                 # replica 1's own error, in replica 0's
    assert 'replica 1 failed' in err0 and 'Traceback' in (tmp_path/'err-1.txt').read_text(), err0[-3000:]
    took = ended - float((tmp_path/'raised').read_text())
    assert took < 30, took
    fault_row(f'a replica raises {where}', "every replica stops; the others' error holds its traceback", took,
              'nothing saved' if where == 'before fit' else 'the epoch in progress (resume from the last checkpoint)')

NEVER_MEETS = """
from helpers import *
learn = linear_digits_learner().to_tpu_distributed(seed=0)
"""

def test_a_replica_that_never_starts(tmp_path):
    "Replica 1 of 2 is never started: replica 0 stops after FASTAI_XLA_TIMEOUT, saying who did not come and what to check."
    t = time.time()
    codes, ended = wait_all(start_replicas(NEVER_MEETS, tmp_path, n=1, WORLD_SIZE='2', FASTAI_XLA_TIMEOUT='5'))
    err0 = (tmp_path/'err-0.txt').read_text()
    said = re.search(r'Replica 0 of 2 waited 5 s \(FASTAI_XLA_TIMEOUT\) for the others to meet at .*, and not all came', err0)
    assert codes[0] != 0 and said, err0[-3000:]
    fault_row('a replica never starts', "`Replica 0 of 2 waited 5 s (FASTAI_XLA_TIMEOUT) for the others to meet at ..., and not all came` ... "
              "start every replica (seconds: from its start, imports included)", ended - t, 'nothing (nothing ran)')

def test_the_meeting_port_is_taken(tmp_path):
    "Another process listens on MASTER_PORT: replica 0 says so at once."
    import socket
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0)); taken.listen()
        t = time.time()
        procs = start_replicas(NEVER_MEETS, tmp_path, n=1, WORLD_SIZE='2', FASTAI_XLA_TIMEOUT='5',
                               MASTER_PORT=str(taken.getsockname()[1]))
        codes, ended = wait_all(procs)
    err0 = (tmp_path/'err-0.txt').read_text()
    assert codes[0] != 0 and 'another process holds that port' in err0, err0[-3000:]
    fault_row('the meeting port is taken', '`Replica 0 cannot serve the replicas\' meeting at ...: another process holds that port`',
              ended - t, 'nothing (nothing ran); seconds from its start, imports included')

def test_a_corrupted_or_truncated_resume_checkpoint(tmp_path):
    learn = digits_learner(bs=64, path=tmp_path).to_xla(seed=0)
    learn.fit(1, 1e-2, cbs=ResumeCallback('run'))
    f = tmp_path/'models'/'run.pth'
    whole = f.read_bytes()
    for name, damaged in [('truncated', whole[:len(whole)//2]), ('corrupted', whole[:100] + bytes(len(whole) - 100))]:
        f.write_bytes(damaged)
        t = time.time()
        with pytest.raises(RuntimeError, match=r'run.pth is not a readable checkpoint \(truncated or corrupted\?\)') as e:
            digits_learner(bs=64, path=tmp_path).to_xla(seed=0).load_resume('run')
        fault_row(f'a {name} resume checkpoint', f"`...run.pth {str(e.value).split('run.pth ', 1)[1][:60]}...`", time.time() - t,
                  'that checkpoint (written atomically, it is damaged only from outside)')

def test_a_checkpoint_of_random_bytes_is_called_damaged_not_malicious(tmp_path):
    "A checkpoint overwritten with random bytes: 'not a readable checkpoint', nothing loaded, and no advice to load it unsafely (before: 'holds more than weights', with `weights_only=False` advised)."
    learn = linear_digits_learner(path=tmp_path).to_xla(seed=0)
    learn.save('model')
    (tmp_path/'models'/'model.pth').write_bytes(np.random.default_rng(0).bytes(4096))
    t = time.time()
    with pytest.raises(RuntimeError) as e: linear_digits_learner(path=tmp_path).to_xla(seed=0).load('model')
    said = str(e.value)
    assert 'model.pth is not a readable checkpoint (truncated or corrupted?)' in said and 'Nothing of it was loaded' in said, said
    assert 'weights_only=False' not in said and 'more than weights' not in said, said
    fault_row('a checkpoint overwritten with random bytes', f"`...model.pth {said.split('model.pth ', 1)[1][:70]}...`", time.time() - t,
              'that checkpoint (nothing of it loaded)')

def test_a_marker_that_is_not_ours_does_not_stop_saves(tmp_path):
    "`.run.pth.saves` holding `{}` (or anything not a marker of ours): saves and loads go on (before: every save raised a bare `KeyError: run`); the marker names no run id in clear."
    learn = linear_digits_learner(path=tmp_path).to_xla(seed=0)
    for junk in ('{}', '[1, 2]', 'not json'):
        (tmp_path/'models').mkdir(exist_ok=True)
        (tmp_path/'models'/'.run.pth.saves').write_text(junk)
        learn.save('run'); learn.load('run')
        marker = json.loads((tmp_path/'models'/'.run.pth.saves').read_text())
        assert marker['count'] >= 1 and learn.xla_run.run_id not in json.dumps(marker), marker
    fault_row('the checkpoint marker `.run.pth.saves` holds `{}` (or any file not a marker)', 'nothing: the next save writes it anew',
              None, 'nothing')

def test_validate_and_get_preds_with_an_empty_validation_set_answer_as_fastai(tmp_path):
    "An XLA learner whose validation set is empty, before any fit: `validate()` and `get_preds()` answer as fastai's do (before: `'TabularModel' object has no attribute 'batch_rows'`)."
    df, cats, conts = digits_frame()
    to = TabularPandas(df, procs=[Categorify, TabNormalize], cat_names=cats, cont_names=conts, y_names='digit',
                       y_block=CategoryBlock(), splits=[list(range(len(df))), []])
    learns = [tabular_learner(to.dataloaders(bs=64, num_workers=0), layers=[10], metrics=accuracy) for _ in range(2)]
    eager, on_xla = learns[0], learns[1].to_xla()
    for learn in (eager, on_xla):
        with learn.no_bar(): assert list(learn.validate()) == [None, None] and tuple(learn.get_preds()) == (None, None)

BAD_VALUES = [('FASTAI_XLA_TIMEOUT', '-1'), ('FASTAI_XLA_FAULT_GRACE', 'soon'), ('FASTAI_XLA_HEARTBEAT', '0'),
              ('FASTAI_XLA_TRANSPORT', 'mpi'), ('RANK', '-1'), ('WORLD_SIZE', '0'),
              ('LOCAL_RANK', 'first'), ('LOCAL_WORLD_SIZE', '0'), ('MASTER_PORT', 'port')]

@pytest.mark.parametrize('name,bad', BAD_VALUES)
def test_a_bad_value_of_every_variable_is_named(name, bad):
    "Each variable's bad value is refused when the settings are read (`Settings.from_env`, what every replica reads at start)."
    t = time.time()
    placed = {'RANK': '0', 'WORLD_SIZE': '2'} if name in TORCH_NAMES.values() else {}   # (PyTorch's names of a place count as a set)
    with pytest.raises(ValueError) as e: Settings.from_env({**placed, name: bad})
    assert f'{name}={bad!r}' in str(e.value) and ('Set it to' in str(e.value) or 'must be' in str(e.value)), str(e.value)
    fault_row(f'`{name}={bad}`', f'`{str(e.value)[:90]}...`', time.time() - t, 'nothing (nothing ran)')

def test_a_bad_backend_name_is_named(tmp_path):
    r = subprocess.run([sys.executable, '-c', f'import sys; sys.path.insert(0, {str(TESTS)!r})\nfrom helpers import *\ndigits_learner().to_xla()'],
                       capture_output=True, text=True, timeout=300, env={**os.environ, 'PJRT_DEVICE': 'CPU', 'FASTAI_XLA_BACKEND': 'jax'})
    assert r.returncode != 0 and "FASTAI_XLA_BACKEND='jax'" in r.stderr, r.stderr[-3000:]
    fault_row('`FASTAI_XLA_BACKEND=jax`', f"`{r.stderr.strip().splitlines()[-1][:90]}...`", 0, 'nothing (nothing ran)')

ORPHANED = """
import os, time
from helpers import *
from fastai_xla.launch import *
def train(learn):
    Path(f'replica-{{replica_ordinal()}}.pid').write_text(f'{{os.getpid()}} {{os.getppid()}}')   # (its parent: the launcher's agent)
    learn.fit(50, 1e-3)                  # long: the launcher dies first
if __name__ == '__main__':
    learn = linear_digits_learner()
    learn.launch(train, nprocs=2, transport='gloo', start_method={start_method!r})
"""

@pytest.mark.parametrize('start_method', ['fork', 'spawn'])
def test_a_killed_launcher_leaves_no_replica_running(tmp_path, start_method):
    """The process that called `learn.launch` is SIGKILLed (a restarted notebook kernel, a stopped Kaggle session): its
    replicas notice within a second and end; the job folder it left is removed by the next launch (`04a_launch`'s
    `remove_stale_jobs`, tested there). Forked by the launcher (torch's agent sets their parent-death signal), or fresh
    interpreters (a notebook that used the device launches that way): fastai_xla's watch of the launching process ends them."""
    (tmp_path/'launch.py').write_text(f'import sys; sys.path.insert(0, {str(TESTS)!r})\n' + ORPHANED.format(start_method=start_method))
    launcher = subprocess.Popen([sys.executable, 'launch.py'], cwd=tmp_path, stdout=open(tmp_path/'out.txt', 'w'),
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 240
    while len(list(tmp_path.glob('replica-*.pid'))) < 2 and time.time() < deadline and launcher.poll() is None: time.sleep(0.2)
    seen = [p.read_text().split() for p in tmp_path.glob('replica-*.pid')]
    assert len(seen) == 2, (tmp_path/'out.txt').read_text()[-3000:]
    pids, parents = [int(p) for p, _ in seen], list({int(q) for _, q in seen})
    assert parents == [launcher.pid], (parents, launcher.pid)                                 # (the agent's children)
    time.sleep(1)
    killed = time.time()
    launcher.kill(); launcher.wait()
    while any(map(pid_alive, pids + parents)) and time.time() - killed < 30: time.sleep(0.2)
    seconds = time.time() - killed
    left = [p for p in pids + parents if pid_alive(p)]
    for p in left: os.kill(p, signal.SIGKILL)
    assert not left, f'replicas {left} still run {seconds:.0f} s after their launcher was killed'
    fault_row('the process that called `learn.launch` killed (SIGKILL: a restarted kernel, a stopped session)'
              + (', its replicas fresh interpreters' if start_method == 'spawn' else ''),
              'every replica ends (' + ("at torch's parent-death signal" if start_method == 'fork' else
              '`fastai_xla: this replica (pid ...) stops: the process that launched it (pid ...) is gone.`') + '); '
              'the next launch removes the job folder it left', seconds, 'the launch in progress (resume from the last checkpoint)')
