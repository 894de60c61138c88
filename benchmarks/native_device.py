"""The native backend (TorchTPU's path) on a device apart from the host, against fastai's own path (eager, on fastai's
default device: the CPU, or CUDA on a GPU machine): the README's recipe and a tabular learner, the same epochs and seeds.

    FASTAI_XLA_BACKEND=native FASTAI_XLA_NATIVE_DEVICE=xla PJRT_DEVICE=CPU python benchmarks/native_device.py [--epochs 3]

`FASTAI_XLA_NATIVE_DEVICE=xla` is torch_xla's CPU device, the stand-in for a chip on a machine without one (`cuda` on a
GPU machine). Recipes:
- `vision`: the README's, `ImageDataLoaders.from_folder` (scikit-learn's digits as 32x32 PNG files),
  `aug_transforms(do_flip=False, max_zoom=1.0)` and `Normalize.from_stats(*imagenet_stats)` as batch transforms (on the
  device), `vision_learner(resnet18, pretrained=False)`, `fit_one_cycle(epochs, 3e-3)`;
- `tabular`: `TabularDataLoaders.from_df` (the 64 pixels as a frame, 8 of them categorical), `tabular_learner`,
  `fit_one_cycle(epochs, 1e-2)`.
Columns: the metric at the end on fastai's own path and on the native backend, their difference, and the devices of every input
the model got in the native fit (a forward pre-hook): a host tensor reaching a device model would fail, and one reaching
the model at all would show here; each fit's seconds (fastai's runs first: a card's start-up is in its time).
`--compile` adds a third fit, the native backend with `compile=True` (`torch.compile` with the device's compiler:
inductor on the CPU and CUDA), and a second table: its metric, the graphs dynamo compiled in the first epoch and after it,
graph breaks, and the median epoch after the first (the first compiles) of the three fits, in seconds."""
import argparse, statistics, sys, tempfile, time, warnings
from pathlib import Path
warnings.filterwarnings('ignore')
from fastai.vision.all import *
from fastai.tabular.all import *
from fastai_xla.all import *
from fastai_xla.check import note_model_inputs
from fastai_xla.demo import digits_folder, digits_frame

def vision(out, epochs):
    set_seed(0, reproducible=True)
    dls = ImageDataLoaders.from_folder(digits_folder(out/'digits32', size=32), valid_pct=0.2, seed=42, bs=64,
                                       batch_tfms=[*aug_transforms(do_flip=False, max_zoom=1.0), Normalize.from_stats(*imagenet_stats)])
    return vision_learner(dls, resnet18, pretrained=False, metrics=accuracy), lambda l: l.fit_one_cycle(epochs, 3e-3)

def tabular(out, epochs):
    set_seed(0, reproducible=True)
    df, cats, conts = digits_frame()
    dls = TabularDataLoaders.from_df(df, procs=[Categorify, FillMissing, Normalize], cat_names=cats, cont_names=conts,
                                     y_names='digit', y_block=CategoryBlock(), valid_idx=list(range(0, len(df), 5)), bs=64)
    return tabular_learner(dls, metrics=accuracy), lambda l: l.fit_one_cycle(epochs, 1e-2)

RECIPES = dict(vision=vision, tabular=tabular)

class EpochTimes(Callback):
    "Each epoch's seconds."
    order = 100
    def before_fit(self): self.seconds = []
    def before_epoch(self): self.t0 = time.perf_counter()
    def after_epoch(self): self.seconds.append(time.perf_counter() - self.t0)
    def after_first(self) -> float: return statistics.median(self.seconds[1:]) if len(self.seconds) > 1 else float('nan')

def timed_fit(learn, fit) -> tuple:
    "`(seconds, median epoch seconds after the first)` of `fit(learn)`."
    times = EpochTimes(); learn.add_cb(times)
    t = time.time()
    with learn.no_bar(), learn.no_logging(): fit(learn)
    learn.remove_cb(times)
    return time.time() - t, times.after_first()

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=3); p.add_argument('--recipes', nargs='*', default=list(RECIPES))
    p.add_argument('--compile', action='store_true', help='also the native backend with compile=True')
    a = p.parse_args(argv)
    s = current_settings()
    if s.backend != 'native': sys.exit('Run with FASTAI_XLA_BACKEND=native (and FASTAI_XLA_NATIVE_DEVICE=xla, or cuda...).')
    device = xla_device()            # (first: torch_xla's autograd must see its device before a CPU backward pass)
    out = Path(tempfile.mkdtemp())
    rows, compiled_rows = [], []
    for name in a.recipes:
        eager, fit = RECIPES[name](out, a.epochs)
        eager_s, eager_epoch = timed_fit(eager, fit)
        native, fit = RECIPES[name](out, a.epochs)
        native.to_xla(seed=0)
        inputs = note_model_inputs(native)
        native_s, native_epoch = timed_fit(native, fit)
        e, n = float(eager.recorder.values[-1][-1]), float(native.recorder.values[-1][-1])
        rows.append((name, str(eager.dls.device), f'{e:.3f}', f'{n:.3f}', f'{n - e:+.3f}', ', '.join(sorted(set().union(*inputs))),
                     f'{eager_s:.1f} / {native_s:.1f}'))
        if a.compile:
            compiled, fit = RECIPES[name](out, a.epochs)
            compiled.to_xla(seed=0, compile=True)
            _, compiled_epoch = timed_fit(compiled, fit)
            c = float(compiled.recorder.values[-1][-1])
            fits = [r for r in compiled.xla_diagnostics.epochs if r['kind'] == 'fit']
            compiled_rows.append((name, compiled.xla_compile_options['backend'], f'{e:.3f}', f'{n:.3f}', f'{c:.3f}', str(fits[0]['compiles']),
                                  str(sum(r['compiles'] for r in fits[1:])), str(sum(r['graph_breaks'] for r in fits)),
                                  f'{eager_epoch:.2f} / {native_epoch:.2f} / {compiled_epoch:.2f}', f'{compiled_epoch / native_epoch:.2f}'))
        print(f'{name}: done', file=sys.stderr)
    print(f'native backend on {device} ({s.native_device or "default"}), {a.epochs} epochs\n')
    print("| recipe | fastai's own device | accuracy, fastai's own | accuracy, native | difference | the model's inputs in the native fit | seconds, fastai's own / native |")
    print('|---|---|---|---|---|---|---|')
    for r in rows: print('| ' + ' | '.join(r) + ' |')
    if not compiled_rows: return
    print("\n| recipe | compiler | accuracy, fastai's own | native | native compiled | graphs compiled in epoch 1 | after | graph breaks | "
          "epoch s after the first: fastai's own / native / compiled | compiled / native |")
    print('|---|---|---|---|---|---|---|---|---|---|')
    for r in compiled_rows: print('| ' + ' | '.join(r) + ' |')

if __name__ == '__main__': main()
