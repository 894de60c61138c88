"""What a replica holds and how long a step takes, replicated and sharded (`to_tpu_distributed(fsdp=True)`, nbs/17_fsdp),
for 1, 2 and 4 replicas under `torchrun --standalone` on the native backend on the CPU (gloo), the same model, data and seed:

    python benchmarks/fsdp.py [--layers 4] [--width 256] [--replicas 1 2 4]

The model: a transformer encoder over scikit-learn's digits read as 8 rows of 8 pixels (`--layers` blocks of `--width`;
each block a shard unit), fastai's Adam, `fit_one_cycle(2)`. Per replica (replica 0; the others hold as much or less):
the bytes of the parameters and of the optimizer's state after the fit, of the gradients just before the first step
(their peak), and the median training step in the second epoch, in milliseconds. The sharded columns as a fraction of the
replicated ones of the same run (the machine's load moves both alike). The stand-ins here are processes on one host's
CPU cores: the step times say what FSDP's extra collectives cost over gloo on loopback, not on a chip's interconnect."""
import argparse, json, os, subprocess, sys, tempfile
from pathlib import Path

SCRIPT = '''
import json, statistics, sys, time
from fastai.basics import *
from fastai.vision.all import IntToFloatTensor
from fastai_xla.all import *
from fastai_xla.demo import digits_dls
from fastai_xla.fsdp import replica_bytes
from fastai_xla.checkpoint import BackgroundSaves, finish_saves

def learner(layers, width):
    set_seed(0, reproducible=True)
    dls = digits_dls(bs=64, seed=42, batch_tfms=[IntToFloatTensor(div=16.)])
    block = nn.TransformerEncoderLayer(width, 8, 4 * width, dropout=0., batch_first=True)
    model = nn.Sequential(nn.Flatten(1, 2), nn.Linear(8, width), nn.TransformerEncoder(block, layers, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(8 * width, 10))
    return Learner(dls, model, loss_func=CrossEntropyLossFlat(), metrics=accuracy)

class Measure(Callback):
    "The bytes of the gradients before the first step (their peak), of the parameters and state after the fit, and each training step's time in the last epoch."
    order = 100
    def before_fit(self): self.grads, self.steps = None, []
    def before_step(self):
        if self.grads is None: self.grads = replica_bytes(self.learn)['grads']
    def after_fit(self): self.held = dict(replica_bytes(self.learn), grads=self.grads)
    def before_batch(self): self.t = time.perf_counter()
    def after_batch(self):
        if self.training and self.epoch == self.n_epoch - 1: self.steps.append(time.perf_counter() - self.t)

out = {{}}
for fsdp in (None, True):
    learn = learner({layers}, {width}).to_tpu_distributed(seed=0, fsdp=fsdp)
    m = Measure()
    with learn.no_bar(): learn.fit_one_cycle(2, 1e-3, cbs=m)
    out['sharded' if fsdp else 'replicated'] = dict(m.held, step_ms=1000 * statistics.median(m.steps),
                                                    loss=float(learn.recorder.values[-1][1]))
# a sharded save: how long training waits, written at once and in the background (then how long the naming waited)
timed = lambda f: (time.perf_counter(), f(), time.perf_counter())
saves = dict(whole=[], staged=[], named=[])
bg = BackgroundSaves()
learn.add_cb(bg); learn.save('first'); finish_saves(learn); learn.remove_cb(bg)   # (the writers' group made once, first)
for i in range(3):
    t0, _, t1 = timed(lambda: learn.save(f'now{{i}}')); saves['whole'].append(t1 - t0)
    learn.add_cb(bg)
    t0, _, t1 = timed(lambda: learn.save(f'bg{{i}}')); saves['staged'].append(t1 - t0)
    t0, _, t1 = timed(lambda: finish_saves(learn)); saves['named'].append(t1 - t0)
    learn.remove_cb(bg)
out['saves'] = {{k: 1000 * statistics.median(v) for k, v in saves.items()}}
if replica_ordinal() == 0: Path('bench.json').write_text(json.dumps(out))
'''

def run(replicas, layers, width):
    with tempfile.TemporaryDirectory() as d:
        (Path(d)/'bench.py').write_text(SCRIPT.format(layers=layers, width=width))
        env = {**os.environ, 'FASTAI_XLA_BACKEND': 'native', 'FASTAI_XLA_NATIVE_DEVICE': 'cpu', 'OMP_NUM_THREADS': '1'}
        r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc-per-node={replicas}', 'bench.py'],
                           cwd=d, env=env, capture_output=True, text=True)
        if r.returncode: sys.exit(r.stderr[-4000:])
        return json.loads((Path(d)/'bench.json').read_text())

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--layers', type=int, default=4)
    p.add_argument('--width', type=int, default=256)
    p.add_argument('--replicas', type=int, nargs='+', default=[1, 2, 4])
    a = p.parse_args()
    mb = lambda b: f'{b / 2**20:.2f}'
    print(f'transformer, {a.layers} blocks of width {a.width}; per replica: MiB replicated -> sharded (sharded/replicated)')
    print('| replicas | parameters | gradients | optimizer state | step ms | valid loss |')
    print('|---|---|---|---|---|---|')
    saves = {}
    for n in a.replicas:
        res = saves[n] = run(n, a.layers, a.width)
        rep, sh = res['replicated'], res['sharded']
        cells = [f"{mb(rep[k])} -> {mb(sh[k])} ({sh[k] / rep[k]:.2f})" for k in ('params', 'grads', 'opt_state')]
        print(f"| {n} | " + ' | '.join(cells) + f" | {rep['step_ms']:.1f} -> {sh['step_ms']:.1f} ({sh['step_ms'] / rep['step_ms']:.2f})"
              f" | {rep['loss']:.4f}, {sh['loss']:.4f} |", flush=True)
    print('\nA sharded save, median of 3 (ms training waits): written at once; in the background (`BackgroundSaves`): the host copy,')
    print('then the wait at the next save or load if the writes had not ended (here at once: the worst case)')
    print('| replicas | at once | background: copy | background: naming wait |')
    print('|---|---|---|---|')
    for n, res in saves.items():
        s = res['saves']
        print(f"| {n} | {s['whole']:.1f} | {s['staged']:.1f} ({s['staged'] / s['whole']:.2f}) | {s['named']:.1f} |")
