"""Signals to the process that called `learn.launch`, with every start method (fork, spawn), one launching
process per case that launches three times: SIGTERM without `ResumeCallback` (a VM or container shutting down), one
interrupt (Ctrl-C, the notebook's stop button), and a second interrupt while a replica ignores the first.

Covered: the launcher's handlers, the replicas' (`StopOnSignal` added by `launch`, `reset_signals`), the stop by
interrupt then SIGKILL, `Preempted` out of `launch`. Not covered: `xmp.spawn`'s process pool (torch_xla's launcher, which
this machine's CPU device runs with one process only), signals sent by a real machine's shutdown (sent here by `os.kill`)."""
import json, os, re, subprocess, sys, textwrap
from pathlib import Path
from helpers import fault_row

TESTS = Path(__file__).parent
METHODS = ('fork', 'spawn')

SCRIPT = '''
import os, sys, json, time, signal, threading
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)   # (a shell without job control hands SIGINT ignored)
from fastai_xla.all import *
from fastai_xla.replicas import pid_alive
from fastai_xla.demo import digits_dls
from fastai.vision.all import *
case = sys.argv[1]

class Mark(Callback):
    "Each replica writes its pid; in the 'twice' case the master hangs in epoch 1, deaf to interrupts (stuck where Python"
    "cannot act: it serves the store, so the other replica's watchdog cannot tell it is gone), the other waits for it."
    def before_fit(self): Path(f'pid-{replica_ordinal()}').write_text(str(os.getpid()))
    def before_train(self):
        if self.epoch == 1 and replica_ordinal() == 0 and case != 'twice': Path('epoch1').touch()
    def before_batch(self):
        if case == 'twice' and replica_ordinal() == 0 and self.training and (self.epoch, self.iter) == (1, 2):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            Path('epoch1').touch()
            while True: time.sleep(1)

def train(learn): learn.fit(500, 1e-2, cbs=Mark())

def machine(sigs):
    "Once epoch 1 has started: the signals, to this process only, 0.5 s apart."
    while not Path('epoch1').exists(): time.sleep(0.01)
    Path('signalled').write_text(repr(time.monotonic()))
    for i, s in enumerate(sigs):
        if i: time.sleep(0.5)
        os.kill(os.getpid(), s)

sigs = dict(sigterm=[signal.SIGTERM], interrupt=[signal.SIGINT], twice=[signal.SIGINT, signal.SIGINT])[case]
learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)))
for method in sys.argv[2].split(','):
    for f in Path('.').glob('*'):
        if f.is_file() and f.name != 'script.py': f.unlink()
    threading.Thread(target=machine, args=(sigs,), daemon=True).start()
    try: learn.launch(train, nprocs=2, transport='gloo', start_method=method); out, said = 'returned', ''
    except Preempted as e: out, said = 'Preempted', str(e)
    except KeyboardInterrupt as e: out, said = 'KeyboardInterrupt', str(e)
    took = time.monotonic() - float(Path('signalled').read_text())
    print(f'RETURNED {method}', file=sys.stderr, flush=True); time.sleep(2); print(f'QUIET {method}', file=sys.stderr, flush=True)
    pids = [int(p.read_text()) for p in Path('.').glob('pid-*')]
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids): time.sleep(0.05)
    print('\\nRESULT', json.dumps(dict(method=method, out=out, said=said, took=took, replicas=len(pids),
                                    alive=[p for p in pids if pid_alive(p)])), flush=True)
'''

def _launch_with_signals(tmp_path, case):
    (tmp_path/'script.py').write_text(textwrap.dedent(SCRIPT))
    # (run as a notebook's kernel runs its cells: no `__main__` file)
    r = subprocess.run([sys.executable, '-c', textwrap.dedent(SCRIPT), case, ','.join(METHODS)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900, env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    results = [json.loads(x) for x in re.findall(r'^RESULT (\{.*\})$', r.stdout, re.M)]
    assert r.returncode == 0 and [x['method'] for x in results] == list(METHODS), r.stdout[-3000:] + r.stderr[-5000:]
    for x in results: assert x['replicas'] == 2 and not x['alive'], x            # (each launch's replicas all gone)
    return results, r.stderr

def test_sigterm_to_the_launcher_without_resume_callback_stops_every_start_method(tmp_path):
    """A shutdown's SIGTERM to the launching process: passed on to the replicas, whose `StopOnSignal` (added by `launch`, the
    fit having no `ResumeCallback`) stops each after the same step; `Preempted` out of `launch`. Before, with fork, the
    signal was swallowed and the fit ran to its end."""
    results, err = _launch_with_signals(tmp_path, 'sigterm')
    for x in results:
        assert x['out'] == 'Preempted' and 'nothing was saved: add `ResumeCallback`' in x['said'], x
        assert x['took'] < 60, x
    fault_row('SIGTERM to the launching process, no `ResumeCallback` (fork, spawn)',
              '`Preempted` out of `launch` (exit status 75): "stopped after N training batches of epoch E ... nothing was saved: '
              'add `ResumeCallback` ..."', max(x['took'] for x in results), 'the run since its start (nothing saved)')

def test_one_interrupt_stops_the_replicas_at_once_with_every_start_method(tmp_path):
    "Ctrl-C: the replicas are interrupted (not sent SIGTERM, which a fit now answers only after a vote) and gone within seconds."
    results, err = _launch_with_signals(tmp_path, 'interrupt')
    for x in results: assert x['out'] == 'KeyboardInterrupt' and x['took'] < 10, x
    assert 'Traceback' not in err, err[-3000:]                                   # (the replicas stop quietly)
    fault_row('Interrupt (Ctrl-C) during a launch (fork, spawn)', '`KeyboardInterrupt` out of `launch`; the replicas '
              'are interrupted, killed after 5 s if still running', max(x['took'] for x in results), 'the run')

def test_a_second_interrupt_kills_the_replicas_and_ends_quietly(tmp_path):
    """A replica that ignores the interrupt (stuck in C++, or deaf to SIGINT): the second Ctrl-C kills it at once; `launch`
    returns only when no replica runs (before, it returned while both ran, and they printed tracebacks about the removed
    job folder)."""
    results, err = _launch_with_signals(tmp_path, 'twice')
    for x in results: assert x['out'] == 'KeyboardInterrupt' and x['took'] < 4.5, x   # (the first stop alone waits 5 s)
    for m in METHODS: assert f'RETURNED {m}\nQUIET {m}' in err, err[-3000:]      # (nothing printed once `launch` returned)
    assert 'FileNotFoundError' not in err, err[-3000:]
    fault_row('A second interrupt while a replica ignores the first', '`KeyboardInterrupt` out of `launch` after every replica '
              'is killed; nothing printed after', max(x['took'] for x in results), 'the run')
