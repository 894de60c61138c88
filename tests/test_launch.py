"""The two ways to launch, each in a fresh process as a user would run it:

- script form: `xmp.spawn(train)`; on this CPU-only machine torch_xla starts one replica (the
  real xmp.spawn and XLA-transport code path, with one participant), also with image files read
  by fastai's default loader workers (forked beside the replica's XLA runtime);
- notebook form, `learn.launch(train)`, of a function defined in `__main__` (a script run
  without any `if __name__ == '__main__'` guard), on 2 replicas over gloo (forked, and
  spawned: the function then travels pickled by value), and over xmp.spawn (1 replica here);
- the refusal when the launching process already started the XLA runtime."""
import os, re, json, subprocess, sys, tempfile, textwrap
from pathlib import Path
import pytest
from helpers import *

ROOT = Path(__file__).parent.parent

def run_script(tmp_path, code, timeout=600):
    script = tmp_path/'script.py'
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, 'PJRT_DEVICE': 'CPU'}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout

def header_count(out): return len(re.findall(r'epoch\s+train_loss\s+valid_loss', out))

def test_script_form_with_xmp_spawn(tmp_path):
    out = run_script(tmp_path, '''
        import torch_xla.distributed.xla_multiprocessing as xmp
        from fastai_xla.all import *
        from fastai_xla.demo import digits_dls
        from fastai.vision.all import *

        def train(index):
            learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), metrics=accuracy)
            learn.to_tpu_distributed()
            learn.fit(3, 1e-2)
            if is_master(): print('FINAL', learn.recorder.values[-1][2], replica_count())

        if __name__ == '__main__':
            xmp.spawn(train)
    ''')
    assert header_count(out) == 1
    acc, world = re.search(r'FINAL ([0-9.]+) (\d+)', out).groups()
    assert float(acc) > 0.85 and world == '1'

def test_script_form_with_fastai_default_workers(tmp_path):
    "Image files through fastai's own loader workers (num_workers = every core, fastai's default) inside xmp.spawn."
    out = run_script(tmp_path, '''
        import torch_xla.distributed.xla_multiprocessing as xmp
        from fastai_xla.all import *
        from fastai.vision.all import *
        from fastai_xla.demo import digits_folder

        def train(index):
            dls = ImageDataLoaders.from_folder(digits_folder('digits', size=16), valid_pct=0.2, seed=42, bs=64)
            learn = Learner(dls, nn.Sequential(Flatten(), nn.Linear(3*16*16, 10)), metrics=accuracy).to_tpu_distributed()
            learn.fit(2, 1e-2)
            if is_master(): print('WORKERS', dls.train.fake_l.num_workers, defaults.cpus, 'FINAL', learn.recorder.values[-1][2])

        if __name__ == '__main__':
            xmp.spawn(train)
    ''')
    workers, default, acc = re.search(r'WORKERS (\d+) (\d+) FINAL ([0-9.]+)', out).groups()
    assert workers == default and int(workers) > 0         # fastai's default: worker processes
    assert float(acc) > 0.8

MAIN_LAUNCH = '''
    from fastai_xla.all import *
    from fastai_xla.demo import digits_dls
    from fastai.vision.all import *
    set_seed(0)
    learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), metrics=accuracy)

    def train(learn, epochs):          # defined in __main__, no guard anywhere: cloudpickle carries it
        learn.fit_one_cycle(epochs, 1e-2, cbs=SaveModelCallback(monitor='accuracy', fname='best'))
        return replica_count()

    world = learn.launch(train, 3, {launch_kwargs})
    # SaveModelCallback reloads the best epoch at the end: those are the weights that come back
    print('WORLD', world, 'ACC', max(v[2] for v in learn.recorder.values))
    preds, targs = learn.get_preds()   # back in this process, on the CPU: the trained weights
    print('CPU_ACC', (preds.argmax(1) == targs).float().mean().item())
    learn.xla_report()                 # the master replica's, brought back
'''

@pytest.mark.parametrize('launch_kwargs,world', [("nprocs=2, transport='gloo'", 2), ("nprocs=2, transport='gloo', start_method='spawn'", 2), ('', 1)],
                         ids=['gloo-2-fork', 'gloo-2-spawn', 'xmp-1-fork'])
def test_launch_a_function_defined_in_main(tmp_path, launch_kwargs, world):
    out = run_script(tmp_path, MAIN_LAUNCH.format(launch_kwargs=launch_kwargs))
    assert header_count(out) == 1, out[-2000:]
    w, acc = re.search(r'WORLD (\d+) ACC ([0-9.]+)', out).groups()
    cpu_acc = float(re.search(r'CPU_ACC ([0-9.]+)', out).group(1))
    assert int(w) == world and float(acc) > 0.8                 # it learned (a linear model, 3 epochs: 0.85-0.91)
    assert out.count('Better model found at epoch 0 ') == 1      # a callback's message, printed once (by the master)
    assert abs(cpu_acc - float(acc)) < 1e-6           # the weights that came back give the best epoch's accuracy
    report = out.split('CPU_ACC')[1]
    assert "(the master replica's, from the last `learn.launch`)" in report and re.search(r'epoch +2: .*\n +time [\d.]+ s: waiting', report), report
    # what bounds the fit, where the backend measured it; the native backend measures no device time and says so
    said = r"bound by" if os.environ.get('FASTAI_XLA_BACKEND') != 'native' else r"\d+% of the epoch is the host's work and the device's .* cannot say"
    assert re.search(r'fit 1, epochs 1-2: ' + said, report), report

SPAWN_SCRIPT = '''
    import os, sys
    from fastai_xla.all import *
    from fastai.tabular.all import *
    from fastai_xla.demo import digits_frame

    def train(index):                  # a script's function: its fresh interpreters unpickle it by value, fastai_xla not named
        df, cats, conts = digits_frame()
        to = TabularPandas(df, procs=[Categorify, Normalize], cat_names=cats, cont_names=conts, y_names='digit',
                           y_block=CategoryBlock(), splits=RandomSplitter(0.2, seed=42)(range_of(df)))
        learn = tabular_learner(to.dataloaders(bs=64, num_workers=0), layers=[100, 50], metrics=accuracy).to_tpu_distributed(seed=0)
        learn.fit(2, 1e-2)
        if is_master(): print('FINAL', learn.recorder.values[-1][2], replica_count())

    if __name__ == '__main__':
        spawn(train, {kwargs})
'''

@pytest.mark.parametrize('how', ["nprocs=2, transport='gloo'", 'native'])
def test_spawn_from_a_script_in_fresh_interpreters(tmp_path, how):
    """A script's `spawn` of a function that names fastai's tabular learner and calls `to_tpu_distributed`, its replicas fresh
    interpreters (the start method 'spawn'): over gloo on torch_xla's device, and the native backend's process per chip (2 on the
    host here). Before: every replica ended with "'TabularModel' object has no attribute 'to_tpu_distributed'" (nothing there
    imported fastai_xla's patches before unpickling the function)."""
    native = how == 'native'
    script = textwrap.dedent(SPAWN_SCRIPT.format(kwargs='nprocs=2' if native else how))
    env = {**os.environ, 'PJRT_DEVICE': 'CPU', **({'FASTAI_XLA_BACKEND': 'native'} if native else {})}
    (tmp_path/'script.py').write_text(script)
    r = subprocess.run([sys.executable, 'script.py'], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    acc, world = re.search(r'FINAL ([0-9.]+) (\d+)', r.stdout).groups()
    assert float(acc) > 0.85 and world == '2' and header_count(r.stdout) == 1, r.stdout[-2000:]

AGAIN_IN_LAUNCH = '''
    from fastai_xla.all import *
    from fastai_xla.demo import digits_dls
    from fastai.vision.all import *
    learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), metrics=accuracy)

    def train(learn):
        learn.to_tpu_distributed(seed=0)             # (converted again in the replica)
        learn.fit(1, 1e-2)
        other = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), metrics=accuracy).to_tpu_distributed(seed=0)
        other.fit(1, 1e-2)
        try: learn.launch(lambda l: None, nprocs=2, transport='gloo'); refused = ''
        except RuntimeError as e: refused = str(e)
        return refused, float(other.recorder.values[-1][2])

    refused, acc = learn.launch(train, nprocs=2, transport='gloo')
    print('REFUSED', refused)
    print('ACC', acc, learn.recorder.values[-1][2])
'''

def test_converted_again_and_a_second_learner_in_a_launch(tmp_path):
    "In a replica of `learn.launch`: `to_tpu_distributed` again, a second learner, each trains; a `learn.launch` there is refused by name."
    out = run_script(tmp_path, AGAIN_IN_LAUNCH)
    assert 'REFUSED `learn.launch` starts the replicas of a run, and this process is already replica 0 of 2' in out, out[-2000:]
    accs = [float(a) for a in re.search(r'ACC ([0-9.]+) ([0-9.]+)', out).groups()]
    assert min(accs) > 0.8, accs

FP16_HABIT = '''
    from fastai_xla.all import *
    from fastai_xla.demo import digits_dls
    from fastai.vision.all import *
    learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), metrics=accuracy).to_fp16()   # (a GPU user's habit)
    def train(learn): learn.fit(1, 1e-2)
    try: learn.launch(train, nprocs=2, transport='gloo')
    except ValueError as e: print('REFUSED', str(e))
    learn.to_bf16()                    # (what the refusal says)
    learn.launch(train, nprocs=2, transport='gloo')
    print('ACC', learn.recorder.values[-1][2])
'''

def test_a_gpu_habit_to_fp16_then_to_bf16_through_launch(tmp_path):
    "`to_fp16()` through `learn.launch`: refused, saying to call `to_bf16()`; after it, the launch trains in bfloat16 (before: `to_bf16()` after `to_fp16()` was refused again, and a launch ended in `AttributeError: ... 'metric_names'`)."
    out = run_script(tmp_path, FP16_HABIT)
    assert 'REFUSED float16 mixed precision' in out and 'the precision asked last is the one used' in out, out[-2000:]
    assert float(re.search(r'ACC ([0-9.]+)', out).group(1)) > 0.7, out[-2000:]

SIGTERM_TO_A_REPLICA = '''
    import os, sys, signal, time
    from fastai_xla.all import *
    from fastai_xla.demo import digits_dls
    from fastai.vision.all import *
    learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)))

    class SigtermAt(Callback):
        "Replica 1 sends itself SIGTERM before its third training batch (a machine's notice, or `kill` by hand)."
        def before_batch(self):
            if replica_ordinal() == 1 and self.training and self.iter == 2: os.kill(os.getpid(), signal.SIGTERM)

    def train(learn): learn.fit(20, 1e-2, cbs=SigtermAt())
    start = time.monotonic()
    try: learn.launch(train, nprocs=2, transport='gloo', start_method=sys.argv[1])
    except BaseException as e: print('STOPPED', type(e).__name__, str(e)[:300])
    print('AFTER', round(time.monotonic() - start, 1))
'''

@pytest.mark.parametrize('method', ['fork', 'spawn'])
def test_sigterm_to_a_forked_replica_stops_the_run(method):
    """A forked replica acts on SIGTERM as a spawned one does: it used to inherit the launcher's handler, which passes the
    signal on, and so ignored it while the run went on (20 epochs). Without `ResumeCallback`, the `StopOnSignal` `launch`
    gives every replica stops them all after the same step: `Preempted` out of `launch`."""
    with tempfile.TemporaryDirectory() as d:
        script = Path(d)/'script.py'
        script.write_text(textwrap.dedent(SIGTERM_TO_A_REPLICA))
        r = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=600, cwd=d,
                           env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert 'STOPPED Preempted' in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]        # (before: the 20 epochs ran to their end)
    assert float(re.search(r'AFTER ([0-9.]+)', r.stdout).group(1)) < 120, r.stdout[-3000:]   # (seconds once started)
    if method == 'fork': fault_row('SIGTERM to one replica, no `ResumeCallback` (fork, spawn)', 'every replica stops after the same step; `Preempted` out of '
              '`launch` (a forked replica used to ignore it, and the run went on)', None, 'the run since its start (nothing saved)')

def test_launch_refuses_when_the_runtime_is_already_running():
    learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)))
    with pytest.raises(RuntimeError, match="torch_xla backend's device is already in use in this process"):
        learn.launch(lambda l: l.fit(1))             # this pytest process started XLA (see conftest.py)

# --- what fastai's own scripts hit (issue 32): ranger's state, and what a launched function returns

def ranger_then_save(learn):
    learn.fit_flat_cos(2, 1e-2)
    learn.save('ranger')
    return learn.validate()

def test_ranger_through_launch_and_save_holds_cpu_tensors(tmp_path):
    "fastai's `ranger` (Lookahead over RAdam: slow weights in fastcore `L`s) on 2 gloo replicas: the checkpoint and the result hold CPU tensors only."
    from test_replicas import indexed_learner
    learn = indexed_learner(bs=32, opt_func=ranger, path=tmp_path, metrics=accuracy)
    valid = learn.launch(ranger_then_save, nprocs=2, transport='gloo')
    state = torch.load(tmp_path/'models'/'ranger.pth', weights_only=False)      # no map_location: as saved
    assert state['opt']['slow_weights'] is not None and len(tensors_in(state['opt']['slow_weights'])) == 4
    assert not any(off_host(t) for t in tensors_in(state)), 'an XLA tensor in the checkpoint'
    assert not any(off_host(t) for t in tensors_in(learn.opt.state_dict()))      # the optimizer state that came back
    test_close(learn.validate(), valid, eps=1e-4)                                   # the weights that came back

def test_every_stateful_fastai_optimizer_saves_cpu_tensors(tmp_path):
    "Each stateful fastai optimizer's state, after a fit on XLA (a linear model: the state's kinds are the point, not its size)."
    for opt_func in (Adam, partial(SGD, mom=0.9), RMSProp, QHAdam, Lamb, RAdam, ranger):
        learn = digits_learner(bs=256, path=tmp_path, opt_func=opt_func, model=nn.Sequential(Flatten(), nn.Linear(64, 10))).to_xla(seed=0)
        with learn.no_bar(): learn.fit(1, 1e-3)
        learn.save('opt')
        state = torch.load(tmp_path/'models'/'opt.pth', weights_only=False)
        assert len(tensors_in(state['opt'])) > 0 and not any(off_host(t) for t in tensors_in(state)), opt_func

def find_tune_and_look(learn):
    return dict(lr=learn.lr_find(show_plot=False), tuned=learn.fine_tune(1, 1e-2), valid=learn.validate(), preds=learn.get_preds())

def returns_a_lock(learn):
    import threading
    learn.fit(1, 1e-2)
    return threading.Lock()

def test_what_a_launched_function_returns_comes_back(tmp_path):
    "fastai's `lr_find` result (a namedtuple class fastai makes at each call), `fine_tune`, `validate`, `get_preds`; what cannot be pickled is refused by name, and the weights still come back."
    from test_replicas import indexed_learner
    learn = indexed_learner(bs=32, metrics=accuracy)
    res = learn.launch(find_tune_and_look, nprocs=2, transport='gloo')
    assert type(res['lr']).__name__ == 'SuggestedLRs' and 1e-7 <= res['lr'].valley <= 10, res['lr']
    assert res['tuned'] is None and len(res['valid']) == 2
    preds, targs = res['preds']
    assert not off_host(preds) and len(preds) == len(learn.dls.valid_ds)
    test_close(accuracy(preds, targs).item(), res['valid'][1])
    learn = indexed_learner(bs=32, metrics=accuracy)
    before = [p.detach().clone() for p in learn.model.parameters()]
    with pytest.raises(TypeError, match='returned a lock, which cannot be pickled.*did come back'):
        learn.launch(returns_a_lock, nprocs=2, transport='gloo')
    assert any((a != p).any() for a, p in zip(before, learn.model.parameters()))   # trained weights came back anyway

def one_cycle(learn): learn.fit_one_cycle(1, 1e-2)

def test_a_launch_under_no_bar_draws_no_bar(capfd):
    "`with learn.no_bar(): learn.launch(...)`, as eager fastai under `no_bar`: the epochs' rows, printed by the master, and no progress bar; fastai's `ActivationStats` and the schedule come back (15a_hooks, 05a_resume)."
    from test_replicas import indexed_learner
    learn = indexed_learner(bs=32, cbs=ActivationStats(with_hist=True))
    with learn.no_bar(): learn.launch(one_cycle, nprocs=2, transport='gloo')
    out = capfd.readouterr().out
    assert 'Epoch 1/1' not in out and '%' not in out, out[-2000:]
    assert out.count('[0, ') == 1, out[-2000:]                  # (fastai's logger without a bar: the row as a list, once)
    stats = learn.activation_stats.stats                         # the master's: its half of the training batches, read
    assert len(stats) == len(learn.dls.train) // 2 and isinstance(stats[0][0]['mean'], float), len(stats)
    assert stats[0][0]['hist'].shape == (40,) and stats[0][0]['hist'].sum() > 0
    learn.activation_stats.plot_layer_stats(0)                   # (fastai's plots, drawn in the launching process)
    hps = learn.recorder.hps                                     # fit_one_cycle's learning rates and momentums, step by step
    assert len(hps['lr']) == len(hps['mom']) == len(learn.dls.train) // 2 and max(hps['lr']) > 10 * hps['lr'][0], hps
    learn.recorder.plot_sched(); learn.recorder.plot_loss()

# --- fastai's way to repeat a run (issue 41): `set_seed` before it

def fit_one_epoch(learn): learn.fit(1, 1e-2)

def test_launches_after_the_same_set_seed_end_alike():
    "Two launches after `set_seed(7)` end with the same weights (the replicas' epoch order and dropout follow the launcher's generators); one after `set_seed(8)` differs. Forked replicas used to draw the run's seed anew each time."
    from test_replicas import indexed_learner
    def launched(seed):
        learn = indexed_learner(bs=32)
        learn.model.insert(1, nn.Dropout(0.3))     # (dropout draws from the replicas' generators too)
        set_seed(seed)
        learn.launch(fit_one_epoch, nprocs=2, transport='gloo')
        return torch.cat([p.detach().flatten() for p in learn.model.parameters()])
    first, again, other = launched(7), launched(7), launched(8)
    assert torch.equal(first, again), (first - again).abs().max()
    assert not torch.allclose(first, other)

# --- the notebook trap (issue 41): a first eager try, then a launch

EAGER_THEN_LAUNCH = '''
import warnings; warnings.filterwarnings('ignore')
from fastai.vision.all import *
from fastai_xla.all import *
from fastai_xla.demo import digits_folder
dls = ImageDataLoaders.from_folder(digits_folder('digits'), valid_pct=0.2, seed=42, bs=64)   # (PILImage.create: a plum Function)
learn = Learner(dls, nn.Sequential(nn.AdaptiveAvgPool2d(8), Flatten(), nn.Linear(3 * 8 * 8, 10)), metrics=accuracy)
with learn.no_bar(): learn.fit(1, 1e-2)                                            # a first eager try, on the CPU
def train(learn): learn.fit(2, 1e-2)
learn.launch(train, nprocs=2, transport='gloo')
print('LAUNCHED', learn.recorder.values[-1][-1])
'''

def test_a_launch_after_an_eager_fit_trains():
    "A CPU backward pass before the first launch leaves forked replicas without autograd on XLA: `launch` starts them again in fresh processes (`spawn`) and says so; the job pickles fastai 2.8.7's loaders (plum's lock: 01_pickling). Run as a notebook's kernel runs cells: no `__main__` file."
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, '-c', EAGER_THEN_LAUNCH], capture_output=True, text=True, timeout=600, cwd=d, env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "starting them again with start_method='spawn'" in r.stderr and 'Traceback' not in r.stderr, r.stderr[-3000:]
    assert float(r.stdout.split('LAUNCHED ')[1].split()[0]) > 0.5, r.stdout[-2000:]
    fault_row('`learn.launch` after an eager CPU `fit` in the same notebook', "`fastai_xla: this process ran a backward pass on the CPU "
              "before its first launch ...: starting them again with start_method='spawn' (fresh processes; ...)`, and it trains", None, 'nothing (a first try of a few seconds)')

# --- what a launch says when it cannot go on (issue 48): each message names what is wrong and the fix

MESSAGES = '''
import os, sys, resource, signal, tempfile, threading, warnings; warnings.filterwarnings('ignore')
from pathlib import Path
from fastai.vision.all import *
from fastai_xla.all import *
from fastai_xla.demo import digits_dls
def said(case, f):
    try: f(); print(f'CASE {case}: no error')
    except BaseException as e: print(f'CASE {case}: {type(e).__name__}: ' + str(e).replace(chr(10), ' ') + ' NOTES ' + ' '.join(getattr(e, '__notes__', [])).replace(chr(10), ' '))
linear = lambda: Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)))
def bad_config(learn): raise ValueError('the learning rate schedule is wrong')
said('same', lambda: linear().launch(bad_config, nprocs=2, transport='gloo', start_method='fork'))
said('nothing', lambda: Learner(digits_dls(), nn.Sequential(Flatten(), nn.Identity()), loss_func=CrossEntropyLossFlat())
                        .launch(lambda learn: learn.fit(1), nprocs=2, transport='gloo', start_method='fork'))
def full_disk():                         # (a temporary folder with no room: any write over 2 kB fails, as on a full disk)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try: linear().launch(lambda learn: learn.fit(1), nprocs=2, transport='gloo', start_method='spawn')
    finally: resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
said('full', full_disk)
print('LEFT', sorted(p.name for p in Path(tempfile.gettempdir()).glob('fastai_xla-*')))
eager = linear()
with eager.no_bar(): eager.fit(1, 1e-2)                    # an eager CPU fit: forked replicas cannot train after it
class Unpicklable(Callback):
    def __init__(self): self.lock = threading.Lock()
said('unpicklable', lambda: Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), cbs=Unpicklable())
                            .launch(lambda learn: learn.fit(1), nprocs=2, transport='gloo'))
'''

def test_what_a_launch_says_when_it_cannot_go_on(tmp_path):
    """Every replica raising the same error: that error out of `launch` (not `RuntimeError: 2 replica(s) failed` around it);
    a model without parameters: said before fastai's `IndexError`; a temporary folder without room: what to do, and no
    folder left; an unpicklable callback after an eager fit: no advice to use fork, which cannot run there."""
    (tmp_path/'tmp').mkdir()
    r = subprocess.run([sys.executable, '-c', MESSAGES], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU', 'TMPDIR': str(tmp_path/'tmp')})
    cases = dict(re.findall(r'^CASE (\w+): (.*)$', r.stdout, re.M))
    assert len(cases) == 4, r.stdout[-3000:] + r.stderr[-3000:]
    assert cases['same'].startswith('ValueError: the learning rate schedule is wrong NOTES (every replica, 2 of them, raised it'), cases   # (each replica's record, torch's agent's)
    assert cases['nothing'].startswith('NothingToTrain: The model (Sequential) has no parameters: there is nothing to train'), cases   # (a ValueError: said by one replica for all, which refuse alike)
    assert cases['full'].startswith('OSError: [Errno 27] The launch cannot write its files') and 'set the environment variable TMPDIR' in cases['full'], cases
    assert "LEFT []" in r.stdout, r.stdout[-2000:]                                # (no half-made job folder left behind)
    assert cases['unpicklable'].startswith("RuntimeError: start_method='spawn' pickles the learner") and \
        "start_method='fork' cannot run here either" in cases['unpicklable'], cases
    fault_row('Every replica raises the same error (in the launched function, say)', 'that error out of `launch`, with the first '
              "replica's traceback as a note", None, 'the run')
    fault_row('`learn.launch` with a temporary folder without room', '`OSError: ... The launch cannot write its files ... in /tmp: '
              'File too large. Free space there, or set the environment variable TMPDIR ...`; nothing left behind', None, 'nothing')

# --- several launches from one process (issue 58): a Kaggle-style cross-validation launches once per fold

MEMORY = '''
import sys, os, gc, json
sys.path.insert(0, {tests!r})
from helpers import *
from test_replicas import indexed_learner
def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20
def fit_one(learn): learn.fit(1, 1e-2)
{first}
learn = indexed_learner(bs=32)
sizes = []
for fold in range(3):
    learn.launch(fit_one, nprocs=2, transport='gloo')
    gc.collect(); sizes.append(rss())
print('RSS', json.dumps(sizes))
'''

@pytest.mark.parametrize('method', ['fork', 'spawn'])
def test_launches_in_a_row_leave_the_memory_where_it_was(tmp_path, method):
    """Three launches from one process (cross-validation's folds), forked, and as fresh interpreters (a process whose device
    runs): after the first (which imports the engine's modules), the launching process's memory stays within 50 MB. (Before:
    1,059 -> 1,235 -> 1,369 MB over three launches.)"""
    first = 'xla_device()   # (the device runs here: replicas are fresh interpreters)' if method == 'spawn' else ''
    r = subprocess.run([sys.executable, '-c', MEMORY.format(tests=str(Path(__file__).parent), first=first)], capture_output=True,
                       text=True, timeout=600, cwd=tmp_path, env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0, r.stderr[-3000:]
    sizes = json.loads(r.stdout.split('RSS ')[1].splitlines()[0])
    assert max(sizes) - sizes[0] < 50, sizes

REACH_SCRIPT = '''
    import os
    from fastai_xla.all import *
    from fastai_xla.settings import current_backend
    from fastai_xla.demo import digits_dls
    from fastai.vision.all import *

    def report(index, tag):
        s = current_settings()
        if is_master(): print('SEEN', tag, current_backend().name, s.backend, s.transport, replica_count(), flush=True)

    def launched(learn): return learn.xla_run.backend.name, learn.xla_run.settings.transport, learn.xla_run.count

    if __name__ == '__main__':
        # each time the environment says otherwise than the call: the call's choice is what every replica trains with
        os.environ.update(FASTAI_XLA_BACKEND='native', FASTAI_XLA_TRANSPORT='gloo')
        spawn(report, ('xmp',), backend='torch_xla', transport='xla')                  # torch_xla's xmp.spawn (1 replica here)
        os.environ.update(FASTAI_XLA_BACKEND='torch_xla', FASTAI_XLA_TRANSPORT='gloo')
        spawn(report, ('native',), nprocs=2, backend='native', transport='xla')       # torch's agent, the native backend
        os.environ.update(FASTAI_XLA_BACKEND='native', FASTAI_XLA_TRANSPORT='xla')
        spawn(report, ('gloo',), nprocs=2, backend='torch_xla', transport='gloo')     # torch's agent, torch_xla's device over gloo
        os.environ.update(FASTAI_XLA_BACKEND='native', FASTAI_XLA_TRANSPORT='gloo')
        learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), metrics=accuracy)
        print('LAUNCHED', *learn.launch(launched, backend='torch_xla', transport='xla'))
        os.environ.update(FASTAI_XLA_BACKEND='torch_xla', FASTAI_XLA_TRANSPORT='xla')
        print('LAUNCHED', *learn.launch(launched, nprocs=2, backend='native', transport='gloo'))
'''

def test_backend_and_transport_given_reach_every_replica(tmp_path):
    """`spawn`'s and `learn.launch`'s `backend=` and `transport=` are what every replica trains with, on each launcher (torch_xla's
    `xmp.spawn`, torch's agent for the native backend and for gloo), with the environment saying otherwise each time. Before:
    `xmp.spawn`'s replicas read the environment again (FASTAI_XLA_TRANSPORT=gloo there: a replica without a group, refused)."""
    out = run_script(tmp_path, REACH_SCRIPT)
    seen = re.findall(r'SEEN (\S+) (\S+) (\S+) (\S+) (\d+)', out)
    assert seen == [('xmp', 'torch_xla', 'torch_xla', 'xla', '1'), ('native', 'native', 'native', 'xla', '2'),
                    ('gloo', 'torch_xla', 'torch_xla', 'gloo', '2')], out[-3000:]
    assert re.findall(r'LAUNCHED (\S+) (\S+) (\d+)', out) == [('torch_xla', 'xla', '1'), ('native', 'gloo', '2')], out[-3000:]

REFIT_IN_LAUNCH = '''
    from fastai_xla.all import *
    from fastai_xla.demo import digits_dls
    from fastai.vision.all import *
    model = nn.Sequential(Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    learn = Learner(digits_dls(), model, metrics=accuracy)

    def train(learn):
        learn.loss_func = lambda o, t: CrossEntropyLossFlat()(o, t.bool())   # (a mistake: cannot compile on XLA)
        try: learn.fit(1, 1e-2); failed = 'nothing'
        except Exception as e: failed = type(e).__name__
        learn.loss_func = CrossEntropyLossFlat()                             # (fixed, on the same learner)
        learn.fit(2, 1e-2)
        return failed

    print('FAILED', learn.launch(train, nprocs=2, transport='gloo'))
    print('ACC', learn.recorder.values[-1][2])
'''

def test_a_fit_that_fails_in_every_replica_of_a_launch_leaves_each_usable(tmp_path):
    "The refit of issue 69 in every replica of a launch (2 over gloo): there the failure shows at the gradients' read for gloo's all-reduce, mid-step."
    out = run_script(tmp_path, REFIT_IN_LAUNCH)
    failed = re.search(r'FAILED (\S+)', out).group(1)
    assert failed != 'nothing' and float(re.search(r'ACC ([0-9.]+)', out).group(1)) > 0.85, out[-3000:]
