"""fastai's input pipeline against what a TPU eats: items per second per host core, at 224 px, from JPEG files.

Data: N JPEG files made offline from scikit-learn's two sample photographs (china.jpg, flower.jpg, 427x640): random
crops of 200-427 px, resized to 300-500 px on the long side, re-encoded at quality 90, in two class folders (the
sizes and decode cost of a photo data set such as Imagenette's). One epoch over every file, batches of 64, after a
first epoch that warms the file cache and the workers; each row at num_workers 0, 1 and 2:
  - decode: PIL opens and decodes each file, nothing else (the limit: every pipeline decodes);
  - torchvision: `ImageFolder` + `RandomResizedCrop(224)`, `RandomHorizontalFlip`, `ToTensor`, torch's `DataLoader`
    (what a PyTorch user picks);
  - fastai: `ImageDataLoaders.from_folder` with `item_tfms=[RandomResizedCrop(224), FlipItem(0.5)]` (fastai's default
    batch transform `IntToFloatTensor`), fastai's own loader on the host;
  - fastai_xla: the same `DataLoaders` through an XLA learner's loader (`to_xla`): batches on the XLA device,
    `IntToFloatTensor` there (uint8 crosses, a quarter of torchvision's float bytes).
Items/s per core divides by the cores the row keeps busy: 1 with num_workers=0 (the main process), else num_workers.
The rows of one num_workers alternate, `--repeats` times (the median is given), so that a slow spell of this shared
machine hits all of them. Host cores a TPU needs = its ResNet-50 training rate (TPU_RATES: a v3-8 3,344 img/s, torch_xla's
418 per core; a v5e-8 about 10,700, the v3-8's scaled by peak bfloat16 FLOPs, an estimate) / a pipeline's items/s per core.

    PJRT_DEVICE=CPU python benchmarks/pipeline.py [--items 512] [--repeats 3] [--out /tmp]
"""
import argparse, os, random, statistics, time, warnings
from pathlib import Path
warnings.filterwarnings('ignore')
import torch
from PIL import Image

# ResNet-50 training images/s of a whole TPU host: torch_xla's published 418 img/s per v3 core (8 cores); for a v5e-8
# no torch_xla figure is published: the v3-8's scaled by peak bfloat16 FLOPs (8 x 197 TFLOPs against 4 x 123), an
# estimate.
TPU_RATES = {'v3-8': 8 * 418, 'v5e-8': round(8 * 418 * (8 * 197) / (4 * 123))}

def make_jpegs(folder:Path, n:int, seed:int=0) -> Path:
    "`n` JPEG files in `folder/{china,flower}/`, crops of scikit-learn's sample photos (made once)."
    if folder.exists() and len(list(folder.rglob('*.jpg'))) == n: return folder
    from sklearn.datasets import load_sample_images
    rng, photos = random.Random(seed), load_sample_images()
    for name, img in zip(('china', 'flower'), photos.images): (folder/name).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        name, img = rng.choice(list(zip(('china', 'flower'), photos.images)))
        h, w = img.shape[:2]
        side = rng.randint(200, min(h, w))
        top, left = rng.randint(0, h - side), rng.randint(0, w - side)
        crop = Image.fromarray(img[top:top+side, left:left+side]).resize((rng.randint(300, 500),) * 2, Image.BICUBIC)
        crop.save(folder/name/f'{i:05d}.jpg', quality=90)
    return folder

class DecodeOnly(torch.utils.data.Dataset):
    def __init__(self, files): self.files = files
    def __len__(self): return len(self.files)
    def __getitem__(self, i):
        with Image.open(self.files[i]) as im: im.convert('RGB').load()
        return 0

def epoch_items_per_s(batches, items:int) -> float:
    "Items per second of one pass over `batches` (the last batch's arrival included)."
    t = time.perf_counter()
    for b in batches: last = b
    x = last[0] if isinstance(last, (tuple, list)) else last
    if isinstance(x, torch.Tensor) and x.device.type != 'cpu': x[0].sum().item()    # (the device has it)
    return items / (time.perf_counter() - t)

def rows(path:Path, nw:int):
    "Each row's loader at `nw` workers: name -> (an iterable of one epoch's batches, items in it)."
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from fastai.vision.all import ImageDataLoaders, RandomResizedCrop, FlipItem, Learner, nn, Flatten
    import fastai_xla.all  # noqa: F401  (Learner.to_xla)
    files = sorted(path.rglob('*.jpg'))
    decode = torch.utils.data.DataLoader(DecodeOnly(files), batch_size=64, num_workers=nw)
    tv = torch.utils.data.DataLoader(ImageFolder(path, T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()])),
                                     batch_size=64, shuffle=True, num_workers=nw, drop_last=True)
    dls = ImageDataLoaders.from_folder(path, valid_pct=0.1, seed=0, bs=64, num_workers=nw,
                                       item_tfms=[RandomResizedCrop(224), FlipItem(0.5)])
    learn = Learner(dls, nn.Sequential(nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(3, 2))).to_xla(seed=0)
    n = lambda dl: len(dl) * 64
    return {'decode': (decode, len(files)), 'torchvision': (tv, n(tv)), 'fastai': (dls.train, n(dls.train)),
            'fastai_xla': (learn.dls.train, n(learn.dls.train))}

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--items', type=int, default=512)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--workers', type=int, nargs='+', default=[0, 1, 2])
    p.add_argument('--out', default='/tmp')
    a = p.parse_args()
    torch.set_num_threads(1)                  # (one core per process: the figure is per core)
    path = make_jpegs(Path(a.out)/f'fastai_xla_jpegs_{a.items}', a.items)
    results = {}
    for nw in a.workers:
        loaders = rows(path, nw)
        for name, (dl, items) in loaders.items(): epoch_items_per_s(dl, items)      # warm: files, workers, compiles
        for _ in range(a.repeats):
            for name, (dl, items) in loaders.items(): results.setdefault((nw, name), []).append(epoch_items_per_s(dl, items))
        del loaders
    print(f'{a.items} JPEG files (300-500 px), 224 px crops, batches of 64; {os.cpu_count()} host cores; '
          f'median of {a.repeats} epochs\n')
    print('| num_workers | pipeline | items/s | items/s per core | / torchvision | host cores for a ' + ' / '.join(TPU_RATES) + ' |')
    print('|---|---|---|---|---|---|')
    for nw in a.workers:
        tv = statistics.median(results[(nw, 'torchvision')]) / max(nw, 1)
        for name in ('decode', 'torchvision', 'fastai', 'fastai_xla'):
            rate = statistics.median(results[(nw, name)])
            per_core = rate / max(nw, 1)
            cores = ' / '.join(f'{r / per_core:.0f}' for r in TPU_RATES.values())
            print(f'| {nw} | {name} | {rate:,.0f} | {per_core:,.0f} | {per_core / tv:.2f} | {cores} |', flush=True)

if __name__ == '__main__': main()
