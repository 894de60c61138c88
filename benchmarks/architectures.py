"""fastai's own architectures, and torchvision's and timm's through fastai's learners, on the XLA device.

    PJRT_DEVICE=CPU python benchmarks/architectures.py [--only xresnet18 unet ...] [--epochs 2] [--size 32]

Each architecture is built as a fastai user builds it (`Learner(dls, xresnet18(n_out=10))` as fastai's Imagenette
script does, `vision_learner(dls, densenet121)`, `vision_learner(dls, 'convnext_atto')` for timm,
`unet_learner`, `tabular_learner`, `collab_learner`, `text_classifier_learner`) on small offline data (scikit-learn's
digits as 3-channel images, masks, a table, ratings, docstrings), then measured on the CPU XLA device:
- fallbacks per step, before -> after: operations torch_xla ran on the CPU (its `aten::` counters) in one training
  step of fastai's model moved to the device as it is (before), and per training step of a fit with
  `to_xla()` (after: the learner's modules as their XLA versions);
- device reads per epoch and graphs compiled after the first epoch, in a fit of `--epochs` epochs ("expected": the
  one `XLADiagnostics` expects and does not warn about, the usual training graph of the shapes of a fit's first
  step, which had a graph of its own: fastai's text loaders put the longest batch first);
- one step as exact as eager CPU's: the loss and every gradient of one training step (dropout off, the same weights
  and batch) on the XLA device and on eager CPU, each against the same step in float64 on the CPU, as the largest
  difference relative to the largest value (float32's rounding grows with depth on either device);
- ok: no fallback after, no late compile but the expected one, reads per epoch at most 4 (fastai_xla reads twice: the
  losses and metrics of each phase), the step close to float64's (the loss to 1e-4, every gradient to 1e-2 of the
  model's largest) or no further from it than ten times eager CPU's (where float32 itself is far off: batch norm over
  1x1 maps at 32 px). The normalizations run as their XLA versions (`nbs/13_models.ipynb`: torch_xla's one-pass
  variance cancels); in deep networks the XLA float32 step is still further from float64 than eager CPU's (xresnet50's
  gradients 1e-3 against 4e-6, 2e-3 before the normalization versions; not the matrix products' precision, which gave
  the same at 'highest'; the rest of the cause is not found).
Counts are exact; nothing here is timed. timm's rows need `pip install timm` (skipped without it). Each architecture
runs in a process of its own."""
import argparse, sys, tempfile, warnings
from copy import deepcopy
from functools import partial
from pathlib import Path
warnings.filterwarnings('ignore')
from fastai_xla.all import *
from fastai_xla.core import move_to_device, map_tensors, plain_tensor
from fastai.vision.all import *
from fastai.tabular.all import *
from fastai.collab import CollabDataLoaders, collab_learner
from fastai.text.all import TextDataLoaders, text_classifier_learner, AWD_LSTM
from fastai_xla.core import model_on_xla
from fastai_xla.settings import current_backend
from fastai_xla.demo import (digits_folder, digits_segmentation_folder, digit_mask_path, segmentation_codes,
                             digits_ratings_frame, digits_frame, docstrings_frame)
try: import timm
except ImportError: timm = None

def image_dls(out, size, n=192, bs=16):
    "`n` of the digits as `size`-pixel RGB images, a quarter held out: a few steps per epoch, for any model."
    path = digits_folder(out/f'digits{size}', size=size)
    files = get_image_files(path)[:n]
    return ImageDataLoaders.from_lists(path, files, [parent_label(f) for f in files], valid_pct=0.25, seed=42, bs=bs,
                                       num_workers=0)

def segmentation_dls(out, size, n=96):
    path = digits_segmentation_folder(out/f'digits_seg{size}', size=size, classes='digit')
    files = get_image_files(path/'images')[:n]
    return SegmentationDataLoaders.from_label_func(path, files, digit_mask_path, codes=segmentation_codes('digit'),
                                                   valid_pct=0.25, seed=42, bs=8, num_workers=0)

def fastai_model(model_fn):   # fastai's own models, as its Imagenette script builds them
    return lambda out, size: Learner(image_dls(out, size), model_fn(n_out=10), metrics=accuracy)
def through_vision_learner(arch, **kwargs):
    return lambda out, size: vision_learner(image_dls(out, size), arch, pretrained=False, metrics=accuracy, **kwargs)
def unet(**kwargs):
    return lambda out, size: unet_learner(segmentation_dls(out, size), resnet18, pretrained=False, **kwargs)
def tabular(out, size):
    df, cats, conts = digits_frame()
    dls = TabularDataLoaders.from_df(df.iloc[:480], procs=[Categorify, FillMissing, Normalize], cat_names=cats,
                                     cont_names=conts, y_names='digit', y_block=CategoryBlock(), valid_idx=list(range(0, 480, 4)), bs=32)
    return tabular_learner(dls, metrics=accuracy)
def collab(use_nn):
    def make(out, size):
        dls = CollabDataLoaders.from_df(digits_ratings_frame(n_users=60), bs=256, seed=42)
        return collab_learner(dls, n_factors=16, y_range=(0, 16.5), use_nn=use_nn, layers=[32] if use_nn else None)
    return make
def awd_lstm(out, size):
    df = docstrings_frame().iloc[:256]
    dls = TextDataLoaders.from_df(df, text_col='text', label_col='label', valid_pct=0.25, seed=42, bs=16)
    return text_classifier_learner(dls, AWD_LSTM, pretrained=False, metrics=accuracy,
                                   config=dict(emb_sz=32, n_hid=48, n_layers=2))

ARCHITECTURES = {
    **{n: fastai_model(getattr(models.xresnet, n)) for n in
       ['xresnet18', 'xresnet34', 'xresnet50', 'xresnet101', 'xresnet152', 'xresnet18_deep', 'xresnet34_deep',
        'xresnet18_deeper', 'xresnext18', 'xresnext50', 'xse_resnet18', 'xse_resnext18', 'xse_resnext50', 'xsenet154']},
    'xresnet18 Mish': fastai_model(partial(models.xresnet.xresnet18, act_cls=Mish)),
    'xresnet18 sa': fastai_model(partial(models.xresnet.xresnet18, sa=True)),
    'xresnet18 sym': fastai_model(partial(models.xresnet.xresnet18, sa=True, sym=True)),
    'DynamicUnet (resnet18)': unet(),
    'DynamicUnet blur, self_attention': unet(blur=True, self_attention=True),
    'TabularModel': tabular,
    'EmbeddingDotBias': collab(False),
    'EmbeddingNN': collab(True),
    'AWD_LSTM classifier': awd_lstm,
    **{f'torchvision {n}': through_vision_learner(getattr(models, n)) for n in
       ['resnet18', 'resnet50', 'densenet121', 'mobilenet_v3_small', 'efficientnet_b0', 'vgg11_bn', 'convnext_tiny']},
    **{f'timm {n}': through_vision_learner(n) for n in
       ['resnet18', 'convnext_atto', 'efficientnet_b0', 'regnetx_002', 'mobilenetv3_small_050']},
    'timm vit_tiny (32 px)': through_vision_learner('vit_tiny_patch16_224', img_size=32, patch_size=4) if timm else None,
    'timm deit_tiny (32 px)': through_vision_learner('deit_tiny_patch16_224', img_size=32, patch_size=4) if timm else None,
}

def no_dropout(model):
    "`model` with its dropouts at 0 (fastai's `WeightDropout` aside: at 0 it makes a weight a parameter twice; see `step_grads`)."
    for m in model.modules():
        if isinstance(m, nn.Dropout) or type(m).__name__ in ('RNNDropout', 'EmbeddingDropout', 'DropPath', 'StochasticDepth'):
            for attr in ('p', 'drop_prob', 'embed_p'):
                if hasattr(m, attr): setattr(m, attr, 0.)
    return model

def step_grads(learn, model, batch):
    "The loss and gradients of one training step of `model` on `batch`, with the learner's loss function."
    *xb, yb = map_tensors(plain_tensor, batch)
    # (train mode: torch_xla's batch norm has no backward in eval mode; fastai's `WeightDropout` in eval mode: it
    # draws differently on each device, and at p=0 it breaks)
    model.train(); model.zero_grad()
    for m in model.modules():
        if type(m).__name__ == 'WeightDropout': m.eval()
    if hasattr(model, 'reset'): model.reset()
    pred = model(*xb)
    loss = learn.loss_func(pred[0] if isinstance(pred, tuple) else pred, yb)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]

def fallbacks(fn):
    "`fn()` and the number of operations torch_xla ran on the CPU while it ran (its step cut and run)."
    f0 = current_backend().counters.fallback_counts()
    res = fn(); step_boundary()
    f1 = current_backend().counters.fallback_counts()
    return res, {k: v - f0.get(k, 0) for k, v in f1.items() if v > f0.get(k, 0)}

def measure(name, make, out, size, epochs):
    set_seed(0)
    learn = make(out, size)
    learn.model = no_dropout(learn.model)
    batch = learn.dls.train.one_batch()
    def twin():   # the same model again
        try: return deepcopy(learn.model)
        except RuntimeError:      # (fastai's DynamicUnet holds activations, which deepcopy refuses)
            m = no_dropout(make(out, size).model)
            m.load_state_dict(learn.model.state_dict())
            return m
    cpu = twin()
    dev = xla_device()
    # before: fastai's model as it is, moved to the device
    try:
        plain = twin().to(dev)
        (_, _), before = fallbacks(lambda: step_grads(learn, plain, move_to_device(batch)))
        before = f"{sum(before.values())} ({', '.join(sorted(before)) or '-'})"
    except Exception as e: before = f'fails ({type(e).__name__})'
    # one step against eager CPU, the model as the learner runs it on XLA
    (loss_c, grads_c) = step_grads(learn, cpu, batch)
    on_xla = model_on_xla(twin().to(dev))
    (loss_x, grads_x), _ = fallbacks(lambda: step_grads(learn, on_xla, move_to_device(batch)))
    loss_x, grads_x = to_host(loss_x), to_host(grads_x)
    # both against the same step in float64 on the CPU: float32's rounding grows with depth on either device
    as64 = lambda b: map_tensors(lambda t: t.double() if t.is_floating_point() else t, b)
    loss_64, grads_64 = step_grads(learn, twin().double(), as64(batch))
    def errors(loss, grads):
        largest = max(float(g.abs().max()) for g in grads_64)        # (relative to the model's largest gradient)
        return (float((loss.double() - loss_64).abs() / loss_64.abs().clamp_min(1e-12)),
                max(float((a.double() - b).abs().max()) for a, b in zip(grads, grads_64)) / max(largest, 1e-300))
    (loss_err, grad_err), (cpu_loss_err, cpu_grad_err) = errors(loss_x, grads_x), errors(loss_c, grads_c)
    # a fit on XLA
    learn.to_xla(seed=0)
    with learn.no_bar(), learn.no_logging(): learn.fit(epochs, 1e-3)   # (the bar reads the loss to show it)
    rows = learn.xla_diagnostics.epochs
    steps = sum(r['train_batches'] for r in rows)
    after = sum(sum(r['fallbacks'].values()) for r in rows) / max(steps, 1)
    late = sum(r['compiles'] for r in rows[1:])
    warned_late = bool(learn.xla_diagnostics.warned & {'shapes', 'recompile'})   # (not the one fastai_xla expects: below)
    reads = max(r['to_host'] for r in rows)
    # the step: close to float64's, or no further from it than ten times eager CPU's (where float32 itself is far off)
    step_ok = (loss_err < 1e-4 or loss_err <= 10 * cpu_loss_err) and (grad_err < 1e-2 or grad_err <= 10 * cpu_grad_err)
    ok = after == 0 and not warned_late and reads <= 4 and step_ok
    return dict(architecture=name, before=before, after=after,
                reads=reads, late=late, warned_late=warned_late, loss_err=loss_err, grad_err=grad_err, cpu_loss_err=cpu_loss_err, cpu_grad_err=cpu_grad_err, ok=ok)

def selected(only) -> list:
    "The names of ARCHITECTURES that `--only` asks for: each name exactly, or every name starting so for `'xresnet*'`; all without it."
    return [n for n in ARCHITECTURES if not only or any(n == o or (o.endswith('*') and n.startswith(o[:-1])) for o in only)]

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--only', nargs='*', help="names of the architectures to run ('xresnet*': every name that starts so)")
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--size', type=int, default=32)
    p.add_argument('--out', type=Path, default=Path(tempfile.gettempdir())/'fastai_xla_architectures')
    p.add_argument('--in-process', action='store_true', help='run in this process (else each architecture in a fresh one)')
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.in_process: return each_in_its_own_process(a)
    print(HEADER)
    for name in selected(a.only):
        make = ARCHITECTURES[name]
        if make is None or (name.startswith('timm') and timm is None):
            print(f'| {name} | (timm is not installed) | | | | |'); continue
        try: r = measure(name, make, a.out, a.size, a.epochs)
        except Exception as e:
            print(f'| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | | | no |', flush=True); continue
        print(f"| {name} | {r['before']} -> {r['after']:g} | {r['reads']} | {r['late']}{'' if r['warned_late'] or not r['late'] else ' (expected)'} | "
              f"{r['loss_err']:.0e}, {r['grad_err']:.0e} ({r['cpu_loss_err']:.0e}, {r['cpu_grad_err']:.0e}) | {'yes' if r['ok'] else 'no'} |", flush=True)

HEADER = ('| architecture | CPU fallbacks per step: before -> after | device reads per epoch | compiles after epoch 1 | '
          'one step vs float64: loss, gradients on XLA (eager CPU) | ok |\n|---|---|---|---|---|---|')

def each_in_its_own_process(a):
    "Each architecture in a process of its own (one process ran out of memory in XLA's CPU compiler after 13 of them)."
    import subprocess
    print(HEADER)
    for name in selected(a.only):
        r = subprocess.run([sys.executable, __file__, '--in-process', '--only', name, '--epochs', str(a.epochs), '--size', str(a.size),
                            '--out', str(a.out)], capture_output=True, text=True)
        rows = [l for l in r.stdout.splitlines() if l.startswith('|')]
        if len(rows) > 2: print(rows[2], flush=True)
        else: print(f"| {name} | crashed (exit {r.returncode}): {(r.stderr.strip().splitlines() or [''])[-1][:120]} | | | | no |", flush=True)

if __name__ == '__main__': main()
