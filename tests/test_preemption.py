"""Preemption: a real SIGTERM, sent from another thread at a moment the training loop does not choose (as a preempted
machine sends it), stops the run after a whole step with a resume checkpoint and exit status 75; the same script run
again continues from the step after the last one done, and ends with the weights of a run that was never stopped.

What this covers: one replica (a script on the CPU XLA device, or the native backend under FASTAI_XLA_BACKEND=native),
run twice as a user would rerun it; two replica processes over gloo (`learn.launch`), the signal sent to one replica
only, so the stop is agreed by the replicas' vote; a run killed with SIGKILL while it writes its checkpoint (the
previous one stays whole). Not covered: a real preemption (a TPU VM's ACPI shutdown, which signals every process),
torch_xla's in-graph collectives (a TPU), replicas on several machines."""
import os, re, signal, subprocess, sys, threading, time
from pathlib import Path
import pytest, torch
from helpers import *

TESTS = Path(__file__).parent

SCRIPT = """
import os, sys, signal, threading, time, json
sys.path.insert(0, {tests!r})
from helpers import *
mode = sys.argv[1]                 # 'whole': never stopped; 'preemptible': SIGTERM once, during epoch 1
learn = digits_learner(bs=32, path=Path.cwd()).to_xla(seed=0)

class PreemptOnce(Callback):
    "The machine: once, at epoch 1's 5th batch, SIGTERM from another thread 20 ms later (wherever the loop is then)."
    def before_batch(self):
        if self.training and (self.epoch, self.iter) == (1, 5) and not Path('signalled').exists():
            Path('signalled').write_text(repr(time.time()))
            threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGTERM)).start()

cbs = [ResumeCallback('run')] + ([PreemptOnce()] if mode == 'preemptible' else [])
learn.fit_one_cycle(3, 1e-2, start_epoch=learn.load_resume('run', missing_ok=True), cbs=cbs)
torch.save({{k: v.detach().cpu() for k, v in learn.model.state_dict().items()}}, 'final.pth')
print('VALUES', json.dumps([list(map(float, v[:3])) for v in learn.recorder.values]))
"""

def run_script(mode, cwd):
    cwd.mkdir(exist_ok=True)
    (cwd/'train.py').write_text(SCRIPT.format(tests=str(TESTS)))
    r = subprocess.run([sys.executable, 'train.py', mode], cwd=cwd, capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    return r, time.time()

def assert_same_weights(a, b, eps=1e-5):
    for k in a: assert torch.allclose(a[k].float(), b[k].float(), atol=eps, rtol=0), (k, (a[k].float() - b[k].float()).abs().max())

def test_a_preempted_script_run_again_ends_as_if_never_stopped(tmp_path):
    whole, _ = run_script('whole', tmp_path/'whole')
    assert whole.returncode == 0, whole.stderr[-3000:]

    cut, ended = run_script('preemptible', tmp_path/'cut')
    assert cut.returncode == 75, (cut.returncode, cut.stderr[-3000:])
    said = re.search(r'fastai_xla: preempted \(SIGTERM\): stopped after (\d+) training batches of epoch 1 \(of 3\), '
                     r'([\d.]+) s after the signal; the resume checkpoint is .*run\.pth\. Run the same script again', cut.stderr)
    assert said, cut.stderr[-3000:]
    assert int(said.group(1)) >= 6                                  # the step in progress when the signal came, done
    assert float(said.group(2)) <= 10                               # the goal: seen ~0.05 s
    signalled = float((tmp_path/'cut'/'signalled').read_text())
    assert ended - signalled < 30, ended - signalled                # a preempted VM's notice; seen ~1 s with the exit
    assert not (tmp_path/'cut'/'final.pth').exists()
    fault_row('SIGTERM mid-epoch (a preemption; one replica)', '`fastai_xla: preempted (SIGTERM): stopped after N training batches of epoch E ... '
              f'Run the same script again ...`, exit status 75 (the process gone {ended - signalled:.0f} s after the signal)',
              float(said.group(2)), 'nothing: the step in progress finishes, the rerun ends with the never-stopped weights (1e-5)')

    again, _ = run_script('preemptible', tmp_path/'cut')            # the same command, as a job scheduler reruns it
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_weights(torch.load(tmp_path/'whole'/'final.pth'), torch.load(tmp_path/'cut'/'final.pth'))
    values = lambda r: eval(r.stdout.split('VALUES ')[1].splitlines()[0])
    assert len(values(again)) == 3                                  # the whole history, the cut run's epoch 0 included
    for a, b in zip(values(whole), values(again)): assert a[:3] == pytest.approx(b[:3], rel=1e-4)

def train_preemptible(learn, signal_replica, out_dir):
    "Launched: a fit that replica `signal_replica` (only) gets SIGTERM during, at a moment the loop does not choose."
    class PreemptOnce(Callback):
        def before_batch(self):
            if (self.training and (self.epoch, self.iter) == (1, 3) and replica_ordinal() == signal_replica
                    and not Path(out_dir, 'signalled').exists()):
                Path(out_dir, 'signalled').write_text(repr(time.time()))
                threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGTERM)).start()
    cbs = [ResumeCallback('run', check_every=4)] + ([PreemptOnce()] if signal_replica is not None else [])
    learn.fit_one_cycle(3, 1e-2, start_epoch=learn.load_resume('run', missing_ok=True), cbs=cbs)

def launch_on_2(path, signal_replica):
    from test_replicas import indexed_learner
    learn = indexed_learner(bs=32, path=path)
    learn.launch(train_preemptible, signal_replica, str(path), nprocs=2, transport='gloo', dl_kwargs=dict(seed=0))
    return learn

def test_two_replicas_stop_after_the_same_step_and_resume(tmp_path):
    (tmp_path/'whole').mkdir(); (tmp_path/'cut').mkdir()
    whole = launch_on_2(tmp_path/'whole', None)
    with pytest.raises(Preempted) as e: launch_on_2(tmp_path/'cut', 1)
    took = time.time() - float((tmp_path/'cut'/'signalled').read_text())
    assert e.value.code == 75
    # the master (which says it) got no signal: it stopped on the vote, after the same step as replica 1
    said = re.search(r'preempted \(a signal to another replica\): stopped after (\d+) training batches of epoch 1', str(e.value))
    assert said and int(said.group(1)) > 3, str(e.value)
    state = torch.load(tmp_path/'cut'/'models'/'run.pth', weights_only=False)
    assert (state['next_epoch'], state['batch']) == (1, int(said.group(1))) and sorted(state['every_replica']) == [0, 1]
    fault_row('SIGTERM to one of 2 replicas mid-epoch', 'every replica stops after the same step (their vote); `learn.launch` raises `Preempted`',
              took, 'nothing: resumed, the weights equal the never-stopped run\'s (1e-5)')
    resumed = launch_on_2(tmp_path/'cut', None)
    for a, b in zip(whole.model.parameters(), resumed.model.parameters()):
        assert torch.allclose(a.detach(), b.detach(), atol=1e-5, rtol=0), (a - b).abs().max()
    assert len(resumed.recorder.values) == 3
    for a, b in zip(whole.recorder.values, resumed.recorder.values): assert a[:3] == pytest.approx(b[:3], rel=1e-4)

KILL_SCRIPT = """
import sys; sys.path.insert(0, {tests!r})
from helpers import *
set_seed(0)
learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.Linear(4096, 10)),
                path=Path.cwd()).to_xla(seed=0)
learn.fit(100, 1e-3, cbs=ResumeCallback('run'))     # ~200 MB written after every epoch, until killed
"""

def test_sigkill_while_writing_leaves_the_previous_checkpoint(tmp_path):
    (tmp_path/'train.py').write_text(KILL_SCRIPT.format(tests=str(TESTS)))
    p = subprocess.Popen([sys.executable, 'train.py'], cwd=tmp_path, env={**os.environ, 'PJRT_DEVICE': 'CPU'},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    models, killed = tmp_path/'models', None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and killed is None and p.poll() is None:
            if (models/'run.pth').exists() and list(models.glob('.run.pth.*.tmp')):   # the second write, under way
                p.kill(); killed = time.time()
            time.sleep(0.001)
    finally:
        if p.poll() is None: p.kill()
        p.wait()
    assert killed is not None, p.stderr.read().decode()[-3000:]
    state = torch.load(models/'run.pth', weights_only=False)         # whole and readable: the first epoch's
    assert state['next_epoch'] == 1 and state['batch'] == 0
    from fastai_xla.checkpoint import remove_stale_temporaries        # (what the next save or load of it runs first)
    left = list(models.glob('.run.pth.*.tmp'))
    assert left and remove_stale_temporaries(models/'run.pth') and not list(models.glob('.run.pth.*.tmp')), left
    fault_row('SIGKILL while the checkpoint is written', 'the previous checkpoint, whole; the killed write\'s temporary file is '
              'removed by the next save or load of that checkpoint', None, 'the epoch since that checkpoint')

LAUNCHER = """
import os, sys, signal, threading, time
sys.path.insert(0, {tests!r})
from helpers import *
from test_replicas import indexed_learner
def train(learn):
    class Started(Callback):
        def before_train(self):
            if self.epoch == 1 and replica_ordinal() == 0: Path('epoch1').touch()
    learn.fit_one_cycle(3, 1e-2, start_epoch=learn.load_resume('run', missing_ok=True), cbs=[ResumeCallback('run', check_every=2), Started()])
def preempt_me():                      # the machine: SIGTERM to this launching process only, once epoch 1 has started
    while not Path('epoch1').exists(): time.sleep(0.01)
    Path('signalled').write_text(repr(time.time())); os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=preempt_me, daemon=True).start()
learn = indexed_learner(bs=32, path=Path.cwd())
learn.launch(train, nprocs=2, transport='gloo', dl_kwargs=dict(seed=0))
"""

def test_sigterm_to_the_launching_process_reaches_the_replicas(tmp_path):
    "A container's runtime may signal only the process it started: `learn.launch` passes SIGTERM on to its replicas."
    (tmp_path/'launch.py').write_text(LAUNCHER.format(tests=str(TESTS)))
    r = subprocess.run([sys.executable, 'launch.py'], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    ended = time.time()
    assert r.returncode == 75, (r.returncode, r.stderr[-3000:])    # Preempted, out of `learn.launch`
    assert re.search(r'preempted \(SIGTERM\): stopped after \d+ training batches of epoch 1', r.stderr), r.stderr[-3000:]
    state = torch.load(tmp_path/'models'/'run.pth', weights_only=False)
    assert state['next_epoch'] == 1 and state['batch'] > 0
    fault_row('SIGTERM to the launching process only (`learn.launch`)', 'passed on to every replica: they stop after the same step; '
              '`Preempted` out of `launch`, exit status 75', ended - float((tmp_path/'signalled').read_text()),
              'nothing: the step in progress finishes')
