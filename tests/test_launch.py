"""The two ways to launch, each in a fresh process as a user would run it:

- script form: `xmp.spawn(train)`; on this CPU-only machine torch_xla starts one replica (the
  real xmp.spawn and XLA-transport code path, with one participant), also with image files read
  by fastai's default loader workers (forked beside the replica's XLA runtime);
- notebook form, `learn.launch(train)`, of a function defined in `__main__` (a script run
  without any `if __name__ == '__main__'` guard), on 2 replicas over gloo (forked, and
  spawned: the function then travels pickled by value), and over xmp.spawn (1 replica here);
- the refusal when the launching process already started the XLA runtime."""
import os, re, subprocess, sys, textwrap
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

def test_launch_refuses_when_the_runtime_is_already_running():
    learn = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)))
    with pytest.raises(RuntimeError, match='XLA runtime is already running in this process'):
        learn.launch(lambda l: l.fit(1))             # this pytest process started XLA (see conftest.py)
