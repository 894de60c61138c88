"""fastai's batch augmentation on the host CPU against on the XLA device: host time per batch at ImageNet sizes.

    PJRT_DEVICE=CPU python benchmarks/augment.py [--batches 10] [--bs 64] [--rounds 3] [--out /tmp]

The recipe is fastai's "presizing" one (its pets tutorial): items of 460 px (written at that size here), then per batch
`aug_transforms(size=224, min_scale=0.75)` (flip, rotate, zoom, warp, lighting and a random resized crop to
3x224x224) and ImageNet normalization; batches of 64. Data: scikit-learn's digits written as 460x460 PNG files.
The items are made once (`cache_items=True`: PIL decoding is the same for both settings and is not what is measured)
and the loader's batches are taken on the XLA device by `XLADataLoader` with
- `batch_tfms_on='cpu'`: fastai's transforms run on the host, on float images, then the batch is sent;
- `batch_tfms_on='auto'` (the default): the uint8 batch is sent, the transforms run in the device's graph.
Per setting, median over `--rounds` rounds (the settings alternate, so both see the same load):
- `host ms/batch`: wall time to get a batch from the loader, the device's graph not run: what a TPU host spends,
  while the TPU (asynchronously) runs the previous step;
- `host CPU ms/batch`: process CPU time for the same (every thread: torch's kernels use both cores here);
- `ms/batch, graph run`: the same with the batch's graph run and waited for (`torch_xla.sync()`): on this machine
  the CPU XLA device does the device's share on the same two cores, so this is not a TPU figure;
- compilations while measuring (0: one graph for every batch), and the device reads (0: nothing read back)."""
import argparse, itertools, statistics, time, warnings
from pathlib import Path
warnings.filterwarnings('ignore')
from fastai.vision.all import *
from fastai_xla.all import *
from fastai_xla.demo import digits_folder

def loader(path, bs, batch_tfms_on):
    dls = ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=bs, num_workers=0,
                                       batch_tfms=[*aug_transforms(size=224, min_scale=0.75), Normalize.from_stats(*imagenet_stats)])
    return XLADataLoader(dls.train, batch_tfms_on=batch_tfms_on, cache_items=True, seed=0)

def per_batch(dl, n, run_graph):
    "Wall and CPU seconds per batch over `n` batches (after one to warm up), and the XLA counters meanwhile."
    import torch_xla
    it = iter(dl)
    next(it); torch_xla.sync(); torch_xla._XLAC._xla_wait_device_ops([])   # the first batch compiles; not measured
    c0, t0, p0 = xla_counters(), time.perf_counter(), time.process_time()
    for b in itertools.islice(it, n):
        if run_graph: torch_xla.sync(); torch_xla._XLAC._xla_wait_device_ops([])
    wall, cpu = (time.perf_counter() - t0) / n, (time.process_time() - p0) / n
    return wall, cpu, counters_diff(xla_counters(), c0)

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--batches', type=int, default=10)
    p.add_argument('--bs', type=int, default=64)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--out', default='/tmp')
    a = p.parse_args()
    path = digits_folder(Path(a.out)/'fastai_xla_digits460', size=460)
    dls = {on: loader(path, a.bs, on) for on in ('cpu', 'auto')}
    for dl in dls.values(): dl._every_item()                               # make the items once, before measuring
    res = {(on, g): [] for on in dls for g in (False, True)}
    for _ in range(a.rounds):
        for on, dl in dls.items():
            for g in (False, True): res[on, g].append(per_batch(dl, a.batches, g))
    med = lambda rs, i: statistics.median(r[i] for r in rs)
    print(f'3x224x224, bs {a.bs}, {a.batches} batches x {a.rounds} rounds')
    print('| batch transforms on | host ms/batch | host CPU ms/batch | ms/batch, graph run | compiles | device reads |')
    print('|---|---|---|---|---|---|')
    for on, name in (('cpu', 'host (fastai)'), ('auto', 'XLA device (fastai_xla)')):
        host, run = res[on, False], res[on, True]
        counts = [r[2] for r in host + run]
        print(f"| {name} | {1e3 * med(host, 0):.0f} | {1e3 * med(host, 1):.0f} | {1e3 * med(run, 0):.0f} | "
              f"{sum(c['compiles'] for c in counts)} | {sum(c['to_host'] for c in counts)} |", flush=True)

if __name__ == '__main__':
    xla_device()
    main()
