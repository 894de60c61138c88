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
the model at all would show here; each fit's seconds (fastai's runs first: a card's start-up is in its time)."""
import argparse, sys, tempfile, time, warnings
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

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=3); p.add_argument('--recipes', nargs='*', default=list(RECIPES))
    a = p.parse_args(argv)
    s = current_settings()
    if s.backend != 'native': sys.exit('Run with FASTAI_XLA_BACKEND=native (and FASTAI_XLA_NATIVE_DEVICE=xla, or cuda...).')
    device = xla_device()            # (first: torch_xla's autograd must see its device before a CPU backward pass)
    out = Path(tempfile.mkdtemp())
    rows = []
    for name in a.recipes:
        eager, fit = RECIPES[name](out, a.epochs)
        t = time.time()
        with eager.no_bar(), eager.no_logging(): fit(eager)
        eager_s = time.time() - t
        native, fit = RECIPES[name](out, a.epochs)
        native.to_xla(seed=0)
        inputs = note_model_inputs(native)
        t = time.time()
        with native.no_bar(), native.no_logging(): fit(native)
        native_s = time.time() - t
        e, n = float(eager.recorder.values[-1][-1]), float(native.recorder.values[-1][-1])
        rows.append((name, str(eager.dls.device), f'{e:.3f}', f'{n:.3f}', f'{n - e:+.3f}', ', '.join(sorted(set().union(*inputs))),
                     f'{eager_s:.1f} / {native_s:.1f}'))
        print(f'{name}: done', file=sys.stderr)
    print(f'native backend on {device} ({s.native_device or "default"}), {a.epochs} epochs\n')
    print("| recipe | fastai's own device | accuracy, fastai's own | accuracy, native | difference | the model's inputs in the native fit | seconds, fastai's own / native |")
    print('|---|---|---|---|---|---|---|')
    for r in rows: print('| ' + ' | '.join(r) + ' |')

if __name__ == '__main__': main()
