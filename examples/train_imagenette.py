"""fastai's Imagenette recipe (fastai's own `nbs/examples/train_imagenette.py`: `xresnet` with `Mish`, `ranger`,
`LabelSmoothingCrossEntropy`, `MixUp`, `fit_flat_cos`), written as a fastai user ports a GPU script to TPUs: the
same fastai calls, with `to_tpu_distributed()` where the GPU script calls `to_distributed`/`distrib_ctx`, `to_bf16()`
for `to_fp16()`, and `xmp.spawn` for `python -m fastai.launch`.

    python examples/train_imagenette.py --data PATH [--arch xresnet50 --size 128 --epochs 5 --mixup 0.2 --bf16]
    python examples/train_imagenette.py --epochs 2 --size 32 --arch xresnet18    # offline: the digits, Imagenette's layout

PATH is a folder in Imagenette's layout (`train/<class>/*.JPEG`, `val/<class>/*.JPEG`); without `--data`,
scikit-learn's digits are written in that layout (`train/` and `val/`, a folder per digit), so that it runs offline.
On a TPU every core trains; on a CPU-only machine one replica runs on the CPU XLA device."""
import argparse
from functools import partial
from pathlib import Path
import torch_xla.distributed.xla_multiprocessing as xmp
from fastai_xla.all import *          # first: it picks the XLA device
from fastai.vision.all import *
from fastai.callback.mixup import MixUp
from fastai_xla.demo import digits_folder

def digits_in_imagenette_layout(path:Path, size:int) -> Path:
    "scikit-learn's digits as `path/train/<digit>/*.png` and `path/val/<digit>/*.png` (every fifth image held out)."
    if (path/'val').exists(): return path
    flat = digits_folder(path/'all', size=size)
    for i, f in enumerate(sorted(get_image_files(flat))):
        dest = path/('val' if i % 5 == 0 else 'train')/f.parent.name/f.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
    return path

def imagenette_dls(path:Path, size:int, bs:int):
    "fastai's Imagenette data block: random resized crops and flips per item, ImageNet's statistics per batch."
    block = DataBlock(blocks=(ImageBlock, CategoryBlock), get_items=get_image_files, get_y=parent_label,
                      splitter=GrandparentSplitter(valid_name='val'),
                      item_tfms=[RandomResizedCrop(size, min_scale=0.35), FlipItem(0.5)],
                      batch_tfms=[Normalize.from_stats(*imagenet_stats)])
    return block.dataloaders(path, path=path, bs=bs)

OPTIMIZERS = dict(adam=lambda a: partial(Adam, mom=a.mom, sqr_mom=a.sqrmom, eps=a.eps), sgd=lambda a: partial(SGD, mom=a.mom),
                  rms=lambda a: partial(RMSProp, sqr_mom=a.sqrmom), ranger=lambda a: partial(ranger, mom=a.mom, sqr_mom=a.sqrmom, eps=a.eps))

def train(index, a):
    path = Path(a.data) if a.data else digits_in_imagenette_layout(Path(a.out), a.size)
    model = getattr(models.xresnet, a.arch)(n_out=10, act_cls=Mish, sa=a.sa, sym=a.sym)
    learn = Learner(imagenette_dls(path, a.size, a.bs), model, opt_func=OPTIMIZERS[a.opt](a),
                    loss_func=LabelSmoothingCrossEntropy(), metrics=[accuracy, top_k_accuracy])
    if a.bf16: learn.to_bf16()                      # (the GPU script's `to_fp16()`)
    learn.to_tpu_distributed()                      # (the GPU script's `to_distributed` under `fastai.launch`)
    learn.fit_flat_cos(a.epochs, a.lr, wd=1e-2, cbs=MixUp(a.mixup) if a.mixup else [])
    if learn.xla_run.is_master: learn.xla_report()

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--data', help="a folder in Imagenette's layout (default: the digits, written to --out)")
    p.add_argument('--out', default='imagenette_digits')
    p.add_argument('--arch', default='xresnet50'); p.add_argument('--size', type=int, default=128)
    p.add_argument('--epochs', type=int, default=5); p.add_argument('--bs', type=int, default=64)
    p.add_argument('--lr', type=float, default=1e-2); p.add_argument('--mom', type=float, default=0.9)
    p.add_argument('--sqrmom', type=float, default=0.99); p.add_argument('--eps', type=float, default=1e-6)
    p.add_argument('--opt', default='ranger', choices=list(OPTIMIZERS)); p.add_argument('--mixup', type=float, default=0.)
    p.add_argument('--sa', type=int, default=0); p.add_argument('--sym', type=int, default=0)
    p.add_argument('--bf16', action='store_true', help='bfloat16 autocast (the GPU script has --fp16)')
    a = p.parse_args()
    xmp.spawn(train, args=(a,))
