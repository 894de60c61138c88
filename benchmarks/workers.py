"""fastai's default loader workers against num_workers=0 on the XLA device: image files with an item transform.

Data: scikit-learn's digits as PNG files (fastai_xla.demo.digits_folder), ImageDataLoaders.from_folder with
item_tfms=Resize(SIZE) (PIL decode and resize per item, the host work workers exist for), bs 64. Per setting:
  - loader: seconds to iterate one epoch of the XLA learner's training loader (batches on the device), no model;
  - fit: median epoch time of fit_one_cycle(EPOCHS) of vision_learner(resnet18) after the first epoch.
num_workers=None is fastai's default (as many workers as cores, up to 16; inside to_tpu_distributed each replica
gets its share). Rows alternate settings, so both see the same load.

    PJRT_DEVICE=CPU python benchmarks/workers.py [--size 64] [--epochs 3] [--out /tmp]
"""
import argparse, statistics, time, warnings
from pathlib import Path
warnings.filterwarnings('ignore')
from fastai.vision.all import *
from fastai_xla.all import *
from fastai_xla.demo import digits_folder

class EpochTimes(Callback):
    order = 100
    def before_fit(self): self.times = []
    def before_epoch(self): self.t0 = time.perf_counter()
    def after_epoch(self): self.times.append(time.perf_counter() - self.t0)

def learner(path, size, num_workers):
    kw = {} if num_workers is None else dict(num_workers=num_workers)
    dls = ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=64, item_tfms=Resize(size), **kw)
    set_seed(0)
    return vision_learner(dls, resnet18, pretrained=False, metrics=accuracy).to_tpu_distributed()

def loader_epoch(learn):
    t = time.perf_counter()
    for b in learn.dls.train: pass
    to_host(b[0][0, 0, 0, 0])               # the last batch has arrived
    return time.perf_counter() - t

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--size', type=int, default=64)
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--out', default='/tmp')
    a = p.parse_args()
    path = digits_folder(Path(a.out)/'fastai_xla_digits')
    print('| num_workers | workers used | loader epoch s | fit epoch s | accuracy |')
    print('|---|---|---|---|---|')
    for nw in (None, 0):
        learn = learner(path, a.size, nw)
        loader_epoch(learn)                                  # first pass: compiles nothing, warms the files' cache
        t_loader = statistics.median(loader_epoch(learn) for _ in range(3))
        times = EpochTimes()
        with learn.no_bar(): learn.fit_one_cycle(a.epochs, 3e-3, cbs=times)
        used = learn.dls.train.num_workers if learn.dls.train.num_workers is not None else learn.dls.train.dl.fake_l.num_workers
        acc = learn.recorder.values[-1][learn.recorder.metric_names.index('accuracy') - 1]
        print(f"| {'fastai default' if nw is None else nw} | {used} | {t_loader:.2f} | {statistics.median(times.times[1:]):.2f} | {acc:.4f} |", flush=True)

if __name__ == '__main__': main()
