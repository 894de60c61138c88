"""Speed of fastai_xla against the hand-written torch_xla loop and naive fastai on XLA.

    PJRT_DEVICE=CPU python benchmarks/bench.py [--epochs 6] [--repeats 5] [--naive-epochs 2] [--models mlp] [--spmd-devices 8]

Models: `mlp` (64-128-10 on the 64 pixels), `cnn` (3 conv layers on digits as 1x8x8
uint8 TensorImages with fastai batch transforms), `tabular` (fastai's TabularModel with 8
embeddings and 56 continuous columns). Each row runs in its own process (a crash or an out-of-memory compiler in the naive row
cannot take the others down) on the same data, model, batch size and optimizer:
- `reference`: the hand-written torch_xla loop of `reference_loop.py` (MpDeviceLoader, torch Adam), with
  the same model and the same items, split and preprocessing as the fastai rows (for the
  CNN it also does fastai's batch transforms, IntToFloatTensor and Normalize, on the device);
- `fastai_xla`: a fastai Learner with `to_tpu_distributed()`, torch Adam through OptimWrapper;
- `fastai_xla_cached`: the same with `to_tpu_distributed(cache_items=True)`: each item made once
  (these data sets are in memory and their item transforms are deterministic), as the
  reference loop, which makes its tensors before it starts, does;
- `fastai_xla_defaults`: the same Learner with fastai's defaults for the optimizer and the loss: fastai's own `Adam`
  (`wd=0.01`) and `CrossEntropyLossFlat`, `accuracy`, through `to_tpu_distributed()`;
- `naive`: the same Learner with `dls.device` set to the XLA device and the model moved first.
- `reference_spmd` and `fastai_xla_spmd` (with `--spmd-devices N`, default 8): the same on
  one process over N simulated XLA CPU devices (`CPU_NUM_DEVICES=N`), SPMD: the reference
  loop feeds MpDeviceLoader an `input_sharding` on a one-axis mesh (`reference_loop.py`,
  `spmd=True`); fastai_xla is `to_tpu_spmd()`. Their ratio
  divides by the SPMD reference.
- `reference_cpu` and `fastai_cpu` (unless `--cpu-rows 0`): the same loop and the same fastai
  Learner on PyTorch's own eager CPU device, no XLA anywhere: fastai's own cost per step
  against a bare loop, on any device. `fastai_cpu`'s ratio divides by `reference_cpu`.
Epoch time is the median over the epochs after the first (compilation happens in the first),
then the median over `--repeats` runs. Each measured run alternates with a run of its
reference, and its ratio divides its epoch time by that of the reference run just before it,
so that a slow spell of this shared machine hits both; the table gives the median of these
paired ratios and their range (each round runs the reference, then `fastai_xla`, then
`fastai_xla_cached`, then `fastai_xla_defaults`; each divides by that round's reference). The naive row (one run)
divides by the median reference.

`--counts` prints instead what each XLA run costs the host per training step, one process per row, 3 epochs (the first
compiles): the main thread's CPU time (and the wall time) per step of the second epoch, run without a profiler, then,
over the third, XLA operations traced (the sum of torch_xla's `xla::` counters) and Python function calls
(`sys.setprofile` 'call' and 'c_call' events, in every thread, the loader's included) by package. Counts are exact and
repeat whatever the machine's load; times are indicative. `fastai_xla_defaults_cached` is `fastai_xla_defaults` with
`cache_items=True`."""
import argparse, json, os, statistics, subprocess, sys, threading, time
from reference_loop import train_reference, digits_tensors, xla_counters as counters

MODELS = ['mlp', 'cnn', 'tabular']

def make_model(name):
    import torch.nn as nn
    if name == 'mlp': return nn.Sequential(nn.Linear(64,128), nn.ReLU(), nn.Linear(128,10))
    if name == 'cnn':   # digits as 1x8x8 images
        conv = lambda ni, nf: nn.Sequential(nn.Conv2d(ni, nf, 3, padding=1), nn.BatchNorm2d(nf), nn.ReLU())
        return nn.Sequential(conv(1, 64), conv(64, 128), nn.MaxPool2d(2),
                             conv(128, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    if name == 'tabular':
        from fastai.tabular.model import TabularModel
        import torch; torch.manual_seed(0)
        return TabularModel(TAB_EMB_SZS, n_cont=56, out_sz=10, layers=[200, 100])
    raise ValueError(name)

# --- the data of each model, as fastai DataLoaders (fastai_xla, naive) and as tensors (reference), same split
TAB_CATS = [f'p{i}' for i in range(32, 40)]          # the 8 pixels of the middle row, as categories
TAB_EMB_SZS = [(18, 8)] * 8                          # 17 values (0-16) + fastai's #na#

def image_dls():
    from fastai_xla.demo import digits_dls
    return digits_dls(bs=64, seed=42)                # uint8 TensorImages; IntToFloatTensor(div=16) + Normalize batch transforms

def tabular_dls():
    import pandas as pd
    from sklearn.datasets import load_digits
    from fastai.tabular.all import TabularPandas, Categorify, Normalize, CategoryBlock, RandomSplitter, range_of
    X, y = load_digits(return_X_y=True)
    df = pd.DataFrame(X, columns=[f'p{i}' for i in range(64)]); df['digit'] = y.astype(str)
    for c in TAB_CATS: df[c] = pd.Categorical(df[c].astype(int), categories=range(17))
    conts = [c for c in df.columns if c.startswith('p') and c not in TAB_CATS]
    to = TabularPandas(df, procs=[Categorify, Normalize], cat_names=TAB_CATS, cont_names=conts, y_names='digit',
                       y_block=CategoryBlock(), splits=RandomSplitter(0.2, seed=42)(range_of(df)))
    return to.dataloaders(bs=64, num_workers=0)

def reference_tensors(model_name):
    "The reference loop's train and validation tensors: the same items, split and preprocessing as the fastai rows."
    import torch
    if model_name == 'mlp':
        Xt, yt, Xv, yv = digits_tensors(); return (Xt,), yt, (Xv,), yv
    if model_name == 'cnn':
        dls = image_dls()
        plain = lambda ts: torch.stack(ts).as_subclass(torch.Tensor)      # a hand-written loop has plain tensors
        def grab(ds): return plain([ds[i][0] for i in range(len(ds))]), plain([ds[i][1] for i in range(len(ds))])
        (Xt, yt), (Xv, yv) = grab(dls.train_ds), grab(dls.valid_ds)   # uint8: the loop does the batch transforms itself
        return (Xt,), yt, (Xv,), yv
    if model_name == 'tabular':
        dls = tabular_dls()
        def grab(dl): 
            xs = dl.dataset.xs
            return torch.tensor(xs[TAB_CATS].values, dtype=torch.long), torch.tensor(xs.drop(columns=TAB_CATS).values, dtype=torch.float32), torch.tensor(dl.dataset.ys.values.ravel(), dtype=torch.long)
        ct, xt, yt = grab(dls.train); cv, xv, yv = grab(dls.valid)
        return (ct, xt), yt, (cv, xv), yv
    raise ValueError(model_name)

def run_reference(model_name, epochs, spmd=False, bs=64, eager_cpu=False, counts=None):
    "The hand-written loop of reference_loop.py on this model's tensors (for images it also does the batch transforms, on the device)."
    import torch
    xt, yt, xv, yv = reference_tensors(model_name); torch.manual_seed(0)
    def image_prep(d):      # fastai's IntToFloatTensor(div=16) and Normalize, done by hand on the device
        mean, std = torch.tensor(0.3).to(d), torch.tensor(0.35).to(d)
        return lambda x: ((x.float() / 16. - mean) / std,)
    return train_reference(make_model(model_name), (*xt, yt), (*xv, yv), epochs, bs=bs, spmd=spmd, eager_cpu=eager_cpu,
                           prep=image_prep if model_name == 'cnn' else None, counts=counts)

class StepCounts:
    """The host's work per training step between `start` and `stop`. With `profile` (the default): XLA operations traced
    and Python calls made in every thread, by package (the package of the function called; a C function counts for its
    caller's). Without: the main thread's CPU time and the wall time (a profiler would inflate both), and the XLA
    operations. Measure both in separate epochs."""
    def __init__(self, profile:bool=True): self.profile, self.calls, self.steps, self.by_package = profile, 0, 0, {}
    def _count(self, frame, event, arg):
        if event not in ('call', 'c_call'): return
        self.calls += 1
        package = (frame.f_globals.get('__name__') or '?').split('.')[0]
        self.by_package[package] = self.by_package.get(package, 0) + 1
    def start(self):
        self.ops0, self.up0, self.cpu0, self.wall0 = xla_ops(), xla_uploads(), time.thread_time(), time.perf_counter()
        if self.profile: threading.setprofile(self._count); sys.setprofile(self._count)
    def stop(self, steps:int):
        if self.profile: sys.setprofile(None); threading.setprofile(None)
        self.cpu, self.wall = time.thread_time() - self.cpu0, time.perf_counter() - self.wall0
        self.ops, self.uploads, self.steps = xla_ops() - self.ops0, xla_uploads() - self.up0, steps
    def per_step(self) -> dict:
        res = dict(xla_ops=self.ops / self.steps, uploads=self.uploads / self.steps, steps=self.steps)
        if not self.profile: return dict(res, host_ms=1e3 * self.cpu / self.steps, wall_ms=1e3 * self.wall / self.steps)
        return dict(res, py_calls=self.calls / self.steps, by_package={k: v / self.steps for k, v in self.by_package.items()})

def host_and_calls(timed:StepCounts, counted:StepCounts) -> dict:
    "One record of a run's host time per step (from `timed`) and Python calls per step (from `counted`)."
    t, c = timed.per_step(), counted.per_step()
    return dict(c, host_ms=t['host_ms'], wall_ms=t['wall_ms'])

def top_packages(by_package:dict, n:int=4) -> str:
    "The `n` packages that make the most calls, with their share: 'torch 61%, fastai 22%...'."
    total = sum(by_package.values()) or 1
    top = sorted(by_package.items(), key=lambda kv: -kv[1])[:n]
    return ', '.join(f'{k} {100 * v / total:.0f}%' for k, v in top)

def xla_ops() -> int:
    "XLA operations traced so far: the sum of torch_xla's `xla::` counters."
    import torch_xla.debug.metrics as met
    return sum(met.counter_value(k) for k in met.counter_names() if k.startswith('xla::'))

def xla_uploads() -> int:
    "Transfers from the host to the XLA device so far (torch_xla's `TransferToDeviceTime` count: one per transfer, of one tensor or of many together)."
    import torch_xla.debug.metrics as met
    return (met.metric_data('TransferToDeviceTime') or [0])[0]

def _fastai_learner(model_name, bs=64, defaults=False):
    import torch
    from functools import partial
    from fastai.basics import Learner, DataLoaders, CrossEntropyLossFlat, accuracy, OptimWrapper
    from fastai.data.load import DataLoader
    import fastai.callback.progress  # noqa: F401 (Learner.no_bar)
    if model_name == 'mlp':
        Xt, yt, Xv, yv = digits_tensors()
        dls = DataLoaders(DataLoader(list(zip(Xt, yt)), bs=bs, shuffle=True, drop_last=True),
                          DataLoader(list(zip(Xv, yv)), bs=bs))
    elif bs != 64: raise ValueError('only the MLP takes another batch size')
    else: dls = image_dls() if model_name == 'cnn' else tabular_dls()
    torch.manual_seed(0)
    if defaults: return Learner(dls, make_model(model_name), loss_func=CrossEntropyLossFlat(), metrics=accuracy)
    return Learner(dls, make_model(model_name), loss_func=CrossEntropyLossFlat(), metrics=accuracy,
                   opt_func=partial(OptimWrapper, opt=torch.optim.Adam))

class _Timer:
    "Times each epoch and reads the XLA counters around it."
    def __init__(self): self.times, self.per_epoch = [], []
    def callback(self):
        from fastai.callback.core import Callback
        timer = self
        class EpochTimer(Callback):
            order = 100
            def before_epoch(self): self.c0, self.t = counters(), time.perf_counter()
            def after_epoch(self):
                timer.times.append(time.perf_counter() - self.t)
                timer.per_epoch.append({k: v - self.c0[k] for k, v in counters().items()})
        return EpochTimer()

def alternate_fits(learn, settings:dict, rounds:int, epochs:int=3) -> dict:
    "Median epoch time of `learn` under each setting (a function that applies it): fits alternate, a first round warms up."
    times = {k: [] for k in settings}
    for r in range(rounds + 1):
        for k, apply in settings.items():
            apply()
            timer = _Timer()
            with learn.no_bar(), learn.no_logging(): learn.fit(epochs, 1e-2, cbs=timer.callback())
            if r: times[k] += timer.times[1:]
    return {k: statistics.median(v) for k, v in times.items()}

def _counting_callback(counts:StepCounts, epoch:int=1):
    "A callback that measures the training steps of `epoch` into `counts`."
    from fastai.callback.core import Callback
    class CountSteps(Callback):
        order = -100   # around everything else of the step
        def before_train(self):
            if self.epoch == epoch: self.n = 0; counts.start()
        def after_batch(self):
            if self.epoch == epoch and self.training: self.n += 1
        def after_train(self):
            if self.epoch == epoch: counts.stop(self.n)
    return CountSteps()

def measure_host(learn, lr:float, first:int=1) -> dict:
    """Fit `learn` `first + 2` epochs: the host's time per training step in epoch `first` (not profiled), its calls
    in the next (profiled)."""
    timed, counted = StepCounts(profile=False), StepCounts()
    cbs = [_counting_callback(timed, first), _counting_callback(counted, first + 1)]
    with learn.no_bar(), learn.no_logging(): learn.fit(first + 2, lr, cbs=cbs)
    return host_and_calls(timed, counted)

def run_fastai_xla(model_name, epochs, spmd=False, bs=64, cache_items=False, defaults=False, count=False):
    from fastai_xla.all import xla_device
    if spmd: learn = _fastai_learner(model_name, bs, defaults).to_tpu_spmd(cache_items=cache_items)
    else:
        xla_device()
        learn = _fastai_learner(model_name, bs, defaults).to_tpu_distributed(cache_items=cache_items)
    if count: return measure_host(learn, 1e-2)
    timer = _Timer()
    with learn.no_bar(), learn.no_logging(): learn.fit(epochs, 1e-2, cbs=timer.callback())
    return dict(times=timer.times, per_epoch=timer.per_epoch, accuracy=float(learn.recorder.values[-1][-1]))

def count_reference(model_name, spmd=False):
    "The hand-written loop's counts per training step of its second epoch."
    timed, counted = StepCounts(profile=False), StepCounts()
    run_reference(model_name, 3, spmd=spmd, counts={1: timed, 2: counted})
    return host_and_calls(timed, counted)

def run_fastai_cpu(model_name, epochs):
    "The fastai Learner on PyTorch's own CPU device, without XLA: fastai's own cost next to `reference_cpu`."
    learn = _fastai_learner(model_name)
    timer = _Timer()
    with learn.no_bar(), learn.no_logging(): learn.fit(epochs, 1e-2, cbs=timer.callback())
    return dict(times=timer.times, per_epoch=timer.per_epoch, accuracy=float(learn.recorder.values[-1][-1]))

def run_naive(model_name, epochs):
    import torch_xla
    d = torch_xla.device()
    learn = _fastai_learner(model_name)
    learn.model.to(d)           # moved before the optimizer exists, so that it learns
    learn.dls.device = d
    timer = _Timer()
    with learn.no_bar(), learn.no_logging(): learn.fit(epochs, 1e-2, cbs=timer.callback())
    return dict(times=timer.times, per_epoch=timer.per_epoch, accuracy=float(learn.recorder.values[-1][-1]))

RUNNERS = dict(reference=run_reference, fastai_xla=run_fastai_xla, naive=run_naive, fastai_cpu=run_fastai_cpu,
               fastai_xla_cached=lambda m, e: run_fastai_xla(m, e, cache_items=True),
               fastai_xla_defaults=lambda m, e: run_fastai_xla(m, e, defaults=True),
               count_reference=lambda m, e: count_reference(m), count_fastai_xla=lambda m, e: run_fastai_xla(m, e, count=True),
               count_fastai_xla_defaults=lambda m, e: run_fastai_xla(m, e, defaults=True, count=True),
               count_fastai_xla_defaults_cached=lambda m, e: run_fastai_xla(m, e, defaults=True, count=True, cache_items=True),
               reference_cpu=lambda m, e: run_reference(m, e, eager_cpu=True),
               reference_spmd=lambda m, e: run_reference(m, e, spmd=True), fastai_xla_spmd=lambda m, e: run_fastai_xla(m, e, spmd=True))

def run_child(kind, model_name, epochs, timeout, devices=None):
    cmd = [sys.executable, __file__, '--child', kind, model_name, str(epochs)]
    env = dict(os.environ, PJRT_DEVICE=os.environ.get('PJRT_DEVICE', 'CPU'))
    if devices: env['CPU_NUM_DEVICES'] = str(devices)
    try: out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired: return dict(error=f'timed out after {timeout}s')
    for line in out.stdout.splitlines()[::-1]:
        if line.startswith('RESULT '): return json.loads(line[7:])
    lines = out.stderr.strip().splitlines() or ['no output']
    crash = [l for l in lines if 'LLVM compilation error' in l or 'out of memory' in l.lower()]
    reason = 'XLA compiler crashed (LLVM compilation error)' if crash else lines[-1][-100:]
    return dict(error=f'failed (exit {out.returncode}): {reason}')

def summarize(res):
    if 'error' in res: return None
    later = res['times'][1:] or res['times']
    pe = res['per_epoch']
    return dict(epoch_s=statistics.median(later), compiles=sum(p['compiles'] for p in pe),
                compiles_after_1=sum(p['compiles'] for p in pe[1:]),
                to_host_per_epoch=statistics.median(p['to_host'] for p in pe[1:] or pe), accuracy=res['accuracy'])

def combine(ss):
    "Median epoch time over runs; the counters and accuracy of the last run."
    if not ss: return None
    return dict(ss[-1], epoch_s=statistics.median(s['epoch_s'] for s in ss))

# each measured run and the reference it is divided by; the two alternate, so that a slow spell of the machine hits both
PAIRS = {'fastai_xla': 'reference', 'fastai_xla_cached': 'reference', 'fastai_xla_defaults': 'reference',
         'fastai_cpu': 'reference_cpu',
         'fastai_xla_spmd': 'reference_spmd'}

def paired_ratios(refs, runs):
    "The epoch time of each run over that of the reference run just before it."
    return [s['epoch_s'] / r['epoch_s'] for r, s in zip(map(summarize, refs), map(summarize, runs)) if r and s]

def run_alternating(kinds, model_name, a, devices=None):
    "`a.repeats` rounds of a run of the reference of `kinds` then one of each kind: `{reference: [...], kind: [...], ...}`."
    ref = PAIRS[kinds[0]]
    runs = {k: [] for k in (ref, *kinds)}
    for _ in range(a.repeats):
        for k in runs: runs[k].append(run_child(k, model_name, a.epochs, a.timeout, devices))
    return runs

def table_rows(model_name, runs):
    "One table row per kind of run; a measured run's ratio is the median of its paired ratios, with their range."
    rows = []
    for kind, rs in runs.items():
        ss = [s for s in map(summarize, rs) if s]
        if not ss: rows.append((model_name, kind, rs[0].get('error', 'failed'))); continue
        s = combine(ss)
        if kind in PAIRS:
            pr = paired_ratios(runs[PAIRS[kind]], rs)
            ratio, spread = (f'{statistics.median(pr):.2f}', f'{min(pr):.2f}-{max(pr):.2f}') if pr else ('nan', '-')
        elif kind == 'naive':   # one run, minutes long: divided by the median reference
            ref = combine([x for x in map(summarize, runs['reference']) if x])
            ratio, spread = (f"{s['epoch_s'] / ref['epoch_s']:.2f}" if ref else 'nan'), '-'
        else: ratio, spread = '1.00', '-'
        xla = (s['compiles'], s['compiles_after_1'], f"{s['to_host_per_epoch']:g}") if not kind.endswith('_cpu') else ('-',)*3
        rows.append((model_name, kind, f"{s['epoch_s']:.4f}", ratio, spread, *xla, f"{s['accuracy']:.4f}", len(ss)))
    return rows

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=6)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--naive-epochs', type=int, default=2, help='epochs of the naive row (0: no naive row)')
    p.add_argument('--models', default=','.join(MODELS))
    p.add_argument('--timeout', type=int, default=900)
    p.add_argument('--spmd-devices', type=int, default=8, help='simulated devices of the SPMD rows (0: no SPMD rows)')
    p.add_argument('--cpu-rows', type=int, default=1, help="1: also fastai and the loop on PyTorch's eager CPU device, without XLA")
    p.add_argument('--counts', action='store_true', help='print XLA ops and Python calls per training step instead')
    p.add_argument('--child', nargs=3)
    a = p.parse_args()
    if a.child:
        kind, model_name, epochs = a.child
        print('RESULT ' + json.dumps(RUNNERS[kind](model_name, int(epochs))), flush=True)
        return
    if a.counts: return print_counts(a)
    rows = []
    for model_name in a.models.split(','):
        runs = run_alternating(['fastai_xla', 'fastai_xla_cached', 'fastai_xla_defaults'], model_name, a)
        if a.naive_epochs: runs['naive'] = [run_child('naive', model_name, a.naive_epochs, a.timeout)]
        if a.cpu_rows: runs.update(run_alternating(['fastai_cpu'], model_name, a))
        if a.spmd_devices: runs.update(run_alternating(['fastai_xla_spmd'], model_name, a, a.spmd_devices))
        rows += table_rows(model_name, runs)
    head = ('model', 'run', 'epoch s (median, after 1st)', 'ratio to reference (median of pairs)', 'pair ratios (min-max)',
            'compiles', 'compiles after epoch 1', 'host transfers / epoch', 'final accuracy', 'runs')
    print('| ' + ' | '.join(head) + ' |'); print('|' + '---|'*len(head))
    for r in rows: print('| ' + ' | '.join(map(str, r)) + ' |')

def print_counts(a):
    """One table: the host's work per training step of each XLA run and its ratio to the loop's: XLA operations traced,
    Python calls, the main thread's CPU time (and the wall time), and which packages make the calls."""
    head = ('model', 'run', 'XLA ops / step', 'ratio', 'Python calls / step', 'ratio', 'host CPU ms / step', 'ratio',
            'wall ms / step', 'calls by package')
    print('| ' + ' | '.join(head) + ' |'); print('|' + '---|'*len(head))
    for model_name in a.models.split(','):
        ref = run_child('count_reference', model_name, 3, a.timeout)
        for kind in ('reference', 'fastai_xla', 'fastai_xla_defaults', 'fastai_xla_defaults_cached'):
            c = ref if kind == 'reference' else run_child('count_' + kind, model_name, 3, a.timeout)
            if 'error' in c or 'error' in ref: print(f"| {model_name} | {kind} | {c.get('error') or ref.get('error')} |"); continue
            print(f"| {model_name} | {kind} | {c['xla_ops']:.1f} | {c['xla_ops'] / ref['xla_ops']:.2f} | "
                  f"{c['py_calls']:.0f} | {c['py_calls'] / ref['py_calls']:.2f} | {c['host_ms']:.2f} | "
                  f"{c['host_ms'] / ref['host_ms']:.2f} | {c['wall_ms']:.2f} | {top_packages(c['by_package'])} |", flush=True)

if __name__ == '__main__': main()
