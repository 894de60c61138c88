"""fastai's application recipes, as its tutorials write them, on the XLA device against the same recipe on eager CPU.

    PJRT_DEVICE=CPU python benchmarks/apps.py [--epochs 3] [--recipes vision segmentation tabular collab] [--out /tmp]

Each recipe is built from files on disk or a data frame with fastai's own high-level functions and defaults
(fastai's `Adam`, `fit_one_cycle`, the default loader workers) and trained twice in this process, first on eager
CPU, then with `.to_tpu_distributed(prefetch=2)` (one replica, the CPU XLA device; `prefetch=2`: the loader copies
batches to the device in a background thread, as it does by default on a TPU and as the hand-written loop's
`MpDeviceLoader` does; on the CPU device it does not by default, see `nbs/02_data.ipynb`):
- `vision`: `ImageDataLoaders.from_folder` (scikit-learn's digits written as 32x32 PNG files), `aug_transforms()`
  (run on the device), `vision_learner(resnet18, pretrained=False, metrics=accuracy)`;
- `segmentation`: `SegmentationDataLoaders.from_label_func` (the digits as 32x32 images and per-pixel digit masks),
  `aug_transforms()`, `unet_learner(resnet18, pretrained=False, metrics=DiceMulti())`;
- `tabular`: `TabularDataLoaders.from_df` (the 64 pixels as a frame, 8 of them categorical), `tabular_learner`;
- `collab`: `CollabDataLoaders.from_df` (a ratings frame: users are digits, items pixels), `collab_learner`;
- `torch_loaders`: fastai's "PyTorch to fastai" tutorial as written: plain PyTorch `DataLoader`s of a map-style dataset
  (the digits as 1x8x8 tensors) in fastai's `DataLoaders`, an `nn.Sequential`, PyTorch's `cross_entropy`;
- `multilabel`: a `DataBlock` of `ImageBlock` and `MultiCategoryBlock` (each digit tagged with itself, `even`/`odd`
  and `big`), `aug_transforms()`, `vision_learner(resnet18)` with fastai's `accuracy_multi`, `F1ScoreMulti`, `RocAucMulti`;
- `keypoints`: fastai's head-pose tutorial's recipe: `ImageBlock` and `PointBlock` (the point the digit's ink balances
  on), `aug_transforms()` (warp included), `vision_learner(resnet18, y_range=(-1, 1))`;
- `regression`: `TabularDataLoaders.from_df` with `RegressionBlock` (the digit as a number), `tabular_learner` with
  `rmse` and `R2Score`;
- `progressive`: fastbook's progressive resizing (chapter 7) on the digits: `vision_learner(resnet18)` fitted at 16
  pixels, then new loaders at 24 (`learn.dls = ...`) and `fine_tune`; the columns are `fine_tune`'s (its second fit's
  epochs: the new size compiles in its first);
- `gan`: fastai's WGAN recipe (`basic_generator`, `basic_critic`, `GANLearner.wgan`, RMSProp, `fit`) on the digits at
  16 px; its metric is the last training loss (the critic's or the generator's, as fastai's `Recorder` shows it);
- `mixup`, `cutmix`: the vision recipe with fastai's `MixUp()` or `CutMix()` (fastbook's chapter 7);
- `activation_stats`: the vision recipe with fastai's `ActivationStats(with_hist=True)` (fastbook's chapter 13: a hook
  on each of resnet18's layers with parameters, its statistics and histograms kept for every training batch);
- `padded_tokens`: the digits as variable-length token sequences (each pixel with ink a token: 9 to 51 a digit) padded
  per batch by fastai's `pad_input` (`before_batch=partial(pad_input, pad_idx=0)`, as Hugging Face users write it), and
  torch's `nn.TransformerEncoder` masking the padding (its nested-tensor path in evaluation: the CPU's alone);
- `bert`: a random-init Hugging Face `BertForSequenceClassification` (2 layers, 64 wide; config only, nothing
  downloaded) behind a logits wrapper that passes a 4D mask, on the digits' 64 pixel values as tokens (needs `transformers`);
- `accumulate`: fastbook's chapter 7 with small batches: label smoothing (`LabelSmoothingCrossEntropy`), batches of 32,
  `GradientAccumulation(n_acc=64)` (a step every second batch; under `--launch` every replica's items count).
Text (`AWD_LSTM`) has its own script, `text.py`. `--launch` prints instead each recipe's metric, compiles and reads
through `learn.launch` on 2 replica processes over gloo (the CPU device's transport; each replica takes half the
recipe's batch size, so the run takes one device's steps). Its reads per epoch are split in two: gloo's (its
all-reduce goes through host memory: the gradients once per optimizer step, the metric totals once a phase; on a TPU
the collectives are in the step's graph and read nothing) and the others, which should equal one device's. `--host-rounds N --recipes vision tabular` prints
instead the host's time per step on XLA and in the hand-written loop, measured N times alternating, with the medians.

Columns: median epoch time after the first (the first compiles) on each device and their ratio; XLA compilations
in the first epoch and in all later ones; host reads of the device per epoch (the most of any epoch); the metric
at the end (validation loss for collab) on each; then the host's work per training step, in the second and third
epochs of one more fit after the timed one (as `bench.py --counts` measures it): XLA operations traced, Python calls (every thread, the loaders'
workers aside: they are other processes) on eager CPU and on XLA, their ratio and which packages make XLA's; the main
thread's CPU time per step (an epoch without the profiler) on eager CPU, on XLA, and, for `vision` and `tabular`, in
the hand-written torch_xla loop of `reference_loop.py` (torch Adam, `MpDeviceLoader`) on the recipe's own model, items
and batch size, without augmentation, and XLA's ratio to it. Counts are exact and repeat from run to run; times are this
machine's: the CPU XLA device runs convolutions much slower than PyTorch's CPU kernels, so the time ratio says
nothing about a TPU (on a TPU the device does the arithmetic; what stays on the host is what the counts measure). The last
two columns: transfers from the host to the device per training step (torch_xla's count, exact; one transfer may carry
several tensors) on XLA and in the hand-written loop: the batch, the random generator's seed where the model has
dropout, and with fastai_xla the step's numbers (one transfer) and the batch augmentations' draws (one).
`resnet18` is fastai's architecture with random weights (`pretrained=False`: this machine has no internet)."""
import argparse, statistics, time, warnings
from pathlib import Path
warnings.filterwarnings('ignore')
from fastai.vision.all import *
from fastai.tabular.all import *
from fastai.collab import CollabDataLoaders, collab_learner
from fastai.text.data import TensorText, pad_input
from fastai_xla.all import *
from bench import measure_host, StepCounts, host_and_calls, top_packages
from reference_loop import train_reference
from fastai_xla.demo import (digits_folder, digits_segmentation_folder, digit_mask_path, segmentation_codes,
                             digits_ratings_frame, digits_frame, centre_of_ink)

def vision(out):
    path = digits_folder(out/'fastai_xla_digits32', size=32)
    dls = ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=64, batch_tfms=aug_transforms())
    return vision_learner(dls, resnet18, pretrained=False, metrics=accuracy), 'accuracy', 1e-2

def segmentation(out):
    path = digits_segmentation_folder(out/'fastai_xla_digits_seg32', size=32, classes='digit')
    dls = SegmentationDataLoaders.from_label_func(path, get_image_files(path/'images'), digit_mask_path, bs=32,
                                                  codes=segmentation_codes('digit'), valid_pct=0.2, seed=42,
                                                  batch_tfms=aug_transforms())
    return unet_learner(dls, resnet18, pretrained=False, metrics=DiceMulti()), 'dice_multi', 1e-3

def tabular(out):
    df, cats, conts = digits_frame()
    dls = TabularDataLoaders.from_df(df, procs=[Categorify, FillMissing, Normalize], cat_names=cats, cont_names=conts,
                                     y_names='digit', y_block=CategoryBlock(), valid_idx=list(range(0, len(df), 5)), bs=64)
    return tabular_learner(dls, metrics=accuracy), 'accuracy', 1e-2

def collab(out):
    dls = CollabDataLoaders.from_df(digits_ratings_frame(), bs=256, seed=42)
    return collab_learner(dls, n_factors=32, y_range=(0, 16.5)), 'valid_loss', 5e-2

class DigitTensors(torch.utils.data.Dataset):
    "The digits as a PyTorch user writes a dataset: a 1x8x8 image tensor and a label per index (the first 1,400 train)."
    def __init__(self, train:bool):
        from sklearn.datasets import load_digits
        d = load_digits()
        order = torch.randperm(len(d.target), generator=torch.Generator().manual_seed(42))
        self.idx = order[:1400] if train else order[1400:]
        self.x, self.y = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16., torch.tensor(d.target)
    def __len__(self): return len(self.idx)
    def __getitem__(self, i): return self.x[self.idx[i]], self.y[self.idx[i]]

def torch_loaders(out):
    train = torch.utils.data.DataLoader(DigitTensors(True), batch_size=64, shuffle=True)
    valid = torch.utils.data.DataLoader(DigitTensors(False), batch_size=128)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))
    return Learner(DataLoaders(train, valid), model, loss_func=F.cross_entropy, metrics=accuracy), 'accuracy', 3e-3

def gan(out):
    from fastai.vision.gan import GANLearner, basic_generator, basic_critic, generate_noise
    path = digits_folder(out/'fastai_xla_digits16', size=16)
    dblock = DataBlock(blocks=(TransformBlock, ImageBlock), get_x=generate_noise, get_items=get_image_files,
                       splitter=IndexSplitter([]), item_tfms=Resize(16), batch_tfms=Normalize.from_stats(0.5, 0.5))
    dls = dblock.dataloaders(path, path=path, bs=64)
    generator = basic_generator(16, n_channels=3, n_extra_layers=1)
    critic = basic_critic(16, n_channels=3, n_extra_layers=1, act_cls=partial(nn.LeakyReLU, negative_slope=0.2))
    return GANLearner.wgan(dls, generator, critic, opt_func=RMSProp), 'train_loss', 1e-4

def digit_tags(f) -> list:
    "The digit of the image file `f` (its folder's name) and two tags of it: `even`/`odd`, `big` (5 or more)."
    d = int(Path(f).parent.name)
    return [str(d), 'even' if d % 2 == 0 else 'odd'] + (['big'] if d >= 5 else [])

def multilabel(out):
    path = digits_folder(out/'fastai_xla_digits32', size=32)
    dls = DataBlock(blocks=(ImageBlock, MultiCategoryBlock), get_items=get_image_files, get_y=digit_tags,
                    splitter=RandomSplitter(0.2, seed=42), batch_tfms=aug_transforms()).dataloaders(path, bs=64)
    metrics = [partial(accuracy_multi, thresh=0.5), F1ScoreMulti(), RocAucMulti()]
    return vision_learner(dls, resnet18, pretrained=False, metrics=metrics), 'accuracy_multi', 1e-2

def keypoints(out):
    path = digits_folder(out/'fastai_xla_digits32', size=32)
    dls = DataBlock(blocks=(ImageBlock, PointBlock), get_items=get_image_files, get_y=centre_of_ink,
                    splitter=RandomSplitter(0.2, seed=42), batch_tfms=aug_transforms()).dataloaders(path, bs=64)
    return vision_learner(dls, resnet18, pretrained=False, y_range=(-1, 1)), 'valid_loss', 1e-2

def regression(out):
    df, cats, conts = digits_frame()
    df['digit'] = df['digit'].astype('float32')
    dls = TabularDataLoaders.from_df(df, procs=[Categorify, FillMissing, Normalize], cat_names=cats, cont_names=conts,
                                     y_names='digit', y_block=RegressionBlock(), valid_idx=list(range(0, len(df), 5)), bs=64)
    return tabular_learner(dls, y_range=(-0.5, 9.5), metrics=[rmse, R2Score()]), 'r2_score', 1e-2

def smoothed_small_batches(out):
    "fastbook's chapter 7 with a small batch: label smoothing, batches of 32 (the vision recipe's items), `GradientAccumulation`."
    path = digits_folder(out/'fastai_xla_digits32', size=32)
    dls = ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=32, batch_tfms=aug_transforms())
    return vision_learner(dls, resnet18, pretrained=False, loss_func=LabelSmoothingCrossEntropy(), metrics=accuracy), 'accuracy', 1e-2

def ink_tokens(x) -> TensorText:
    "A digit's pixels with ink as token ids, each its place and value (0 the padding): 9 to 51 tokens a digit."
    return TensorText(torch.tensor([1 + 17 * p + int(v) for p, v in enumerate(x) if v > 2]))

class TokenTransformer(nn.Module):
    "Token ids in, torch's `nn.TransformerEncoder` masking the padding, the mean of its outputs, logits out."
    def __init__(self, vocab:int=17 * 64 + 1, d:int=32):
        super().__init__()
        self.emb, self.out = nn.Embedding(vocab, d, padding_idx=0), nn.Linear(d, 10)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True), 2)
    def forward(self, x):
        pad = x == 0
        keep = (~pad).float()[..., None]
        return self.out((self.encoder(self.emb(x), src_key_padding_mask=pad) * keep).sum(1) / keep.sum(1))

def padded_tokens(out):
    "Variable-length token sequences padded per batch by fastai's `pad_input` (as Hugging Face users write it), a transformer."
    from sklearn.datasets import load_digits
    X, Y = load_digits(return_X_y=True)
    items = [(ink_tokens(x), int(y)) for x, y in zip(X, Y)]
    dls = DataLoaders.from_dsets(items[:1400], items[1400:], bs=64, before_batch=partial(pad_input, pad_idx=0))
    return Learner(dls, TokenTransformer(), loss_func=CrossEntropyLossFlat(), metrics=accuracy), 'accuracy', 3e-3

class HuggingFaceLogits(nn.Module):
    "A Hugging Face classifier as fastai takes a model: token ids in, logits out; its mask 4D (taken as it is, never read)."
    def __init__(self, model): super().__init__(); self.model = model
    def forward(self, ids): return self.model(input_ids=ids, attention_mask=(ids != 0)[:, None, None, :]).logits

def bert(out):
    "A random-init Hugging Face `BertForSequenceClassification` (config only) on the digits' 64 pixels as tokens."
    from transformers import BertConfig, BertForSequenceClassification
    from sklearn.datasets import load_digits
    X, Y = load_digits(return_X_y=True)
    items = [(torch.tensor(x, dtype=torch.long) + 1, int(y)) for x, y in zip(X, Y)]
    dls = DataLoaders.from_dsets(items[:1400], items[1400:], bs=64)
    config = BertConfig(vocab_size=20, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=64, num_labels=10)
    return Learner(dls, HuggingFaceLogits(BertForSequenceClassification(config)), loss_func=CrossEntropyLossFlat(), metrics=accuracy), 'accuracy', 3e-3

def with_callbacks(*make):
    "A one-cycle fit with fastai's training callbacks `make()` (made anew for each fit), as fastbook's chapter 7 adds them."
    def fit(learn, epochs, lr, cbs): learn.fit_one_cycle(epochs, lr, cbs=[*L(cbs), *(m() for m in make)])
    return fit

def resized_digits(out, size:int, bs:int=64):
    "fastbook's `get_dls` (chapter 7) on the digits: the items resized to `size`, then `aug_transforms` at `size`."
    path = digits_folder(out/'fastai_xla_digits32', size=32)
    return ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=bs, item_tfms=Resize(size),
                                        batch_tfms=aug_transforms(size=size, min_scale=0.75))

def progressive(out):
    learn = vision_learner(resized_digits(out, 16), resnet18, pretrained=False, metrics=accuracy)
    learn.loaders_at = partial(resized_digits, out)       # (for `progressive_fit`)
    return learn, 'accuracy', 1e-2

def progressive_fit(learn, epochs, lr, cbs):
    "fastbook's progressive resizing: a fit at 16 pixels, new loaders at 24 (`learn.dls = ...`), `fine_tune` (measured)."
    learn.fit_one_cycle(epochs, lr)
    learn.dls = learn.loaders_at(24)
    learn.fine_tune(epochs, lr, cbs=cbs)

RECIPES = dict(vision=vision, segmentation=segmentation, tabular=tabular, collab=collab, torch_loaders=torch_loaders, gan=gan,
               multilabel=multilabel, keypoints=keypoints, regression=regression, progressive=progressive,
               mixup=vision, cutmix=vision, accumulate=smoothed_small_batches, activation_stats=vision,
               padded_tokens=padded_tokens, bert=bert)
FITS = dict(gan='fit', progressive=progressive_fit,   # (fastai's WGAN tutorial trains with a constant rate; the others with one cycle)
            mixup=with_callbacks(MixUp), cutmix=with_callbacks(CutMix), accumulate=with_callbacks(partial(GradientAccumulation, n_acc=64)),
            activation_stats=with_callbacks(partial(ActivationStats, with_hist=True)))

class EpochStats(Callback):
    "Each epoch's time and, on XLA, its counters."
    order = 100
    def __init__(self, on_xla): self.on_xla = on_xla
    def before_fit(self): self.epochs = []
    def _transport_reads(self): return self.learn.xla_run.collectives.reads if self.on_xla else 0
    def before_epoch(self):
        self.t0, self.c0, self.r0 = time.perf_counter(), xla_counters() if self.on_xla else {}, self._transport_reads()
    def after_epoch(self):
        e = counters_diff(xla_counters(), self.c0) if self.on_xla else {}
        self.epochs.append(dict(e, seconds=time.perf_counter() - self.t0, transport_reads=self._transport_reads() - self.r0))

def final(learn, name):
    names = list(learn.recorder.metric_names[1:-1])     # without 'epoch' and 'time'
    if name == 'train_loss': return learn.recorder.values[-1][0]
    return learn.recorder.values[-1][names.index(name)]

def fit_recipe(learn, recipe, epochs, lr, cbs):
    "The recipe's own fit (`FITS`: a learner method's name or a function), without the bar and the log."
    fit = FITS.get(recipe, 'fit_one_cycle')
    with learn.no_bar(), learn.no_logging():
        if callable(fit): fit(learn, epochs, lr, cbs=cbs)
        else: getattr(learn, fit)(epochs, lr, cbs=cbs)

def run(recipe, out, epochs, on_xla):
    set_seed(0)
    learn, metric, lr = RECIPES[recipe](out)
    if on_xla: learn = learn.to_tpu_distributed(prefetch=2)   # (the loader's background copy, as on a TPU and in `MpDeviceLoader`)
    stats = EpochStats(on_xla)
    fit_recipe(learn, recipe, epochs, lr, stats)
    value = final(learn, metric)
    return stats.epochs, value, metric, measure_host(learn, lr / 10)

def tensors_of(dl) -> tuple:
    "Every batch of `dl` (without its random augmentation: fastai's validation transforms) as CPU tensors, joined."
    batches = [tuple(t.as_subclass(torch.Tensor).cpu() for t in b) for b in dl]
    return tuple(torch.cat(ts) for ts in zip(*batches))

HAND_WRITTEN = ('vision', 'tabular')   # the recipes whose model a hand-written loop of torch_xla's examples trains too

def run_hand_written(recipe, out) -> dict:
    """The recipe's model (a fresh copy), items and batch size in the hand-written torch_xla loop (`reference_loop.py`,
    torch Adam, no augmentation): its host time per step (epoch 1) and Python calls (epoch 2)."""
    set_seed(0)
    learn, metric, lr = RECIPES[recipe](out)
    dls = learn.dls
    train, valid = (tensors_of(dls.test_dl(dl.items, with_labels=True)) for dl in (dls.train, dls.valid))
    train, valid = ((*xs, y.view(-1).long()) for *xs, y in (train, valid))     # (tabular's targets are (n, 1) int8)
    timed, counted = StepCounts(profile=False), StepCounts()
    train_reference(learn.model, train, valid, 3, bs=dls.train.bs, lr=lr, counts={1: timed, 2: counted})
    return host_and_calls(timed, counted)

def host_rounds(recipe, out, rounds:int) -> dict:
    """The host's CPU time per training step of `recipe` on XLA and in the hand-written loop, measured `rounds` times
    alternating (so that a slow spell of this shared machine hits both): the medians and the median of the ratios."""
    set_seed(0)
    learn, metric, lr = RECIPES[recipe](out)
    learn = learn.to_tpu_distributed(prefetch=2)
    fit_recipe(learn, recipe, 1, lr, [])                  # (the graphs compiled once, before the rounds)
    xla, loop = [], []
    for _ in range(rounds):
        xla.append(measure_host(learn, lr / 10)['host_ms'])
        loop.append(run_hand_written(recipe, out)['host_ms'])
    return dict(xla=statistics.median(xla), loop=statistics.median(loop),
                ratio=statistics.median(a / b for a, b in zip(xla, loop)), ratios=[round(a / b, 2) for a, b in zip(xla, loop)])

def print_host_rounds(recipes, out, rounds):
    "`--host-rounds`: one table, the host's time per step on XLA against the hand-written loop, `rounds` alternating runs."
    print('| recipe | rounds | host CPU ms / step: XLA (median) | hand-written loop (median) | XLA / loop (median) | each round |')
    print('|---|---|---|---|---|---|')
    for r in recipes:
        h = host_rounds(r, out, rounds)
        print(f"| {r} | {rounds} | {h['xla']:.1f} | {h['loop']:.1f} | {h['ratio']:.2f} | {' '.join(map(str, h['ratios']))} |", flush=True)

def train_launched(learn, recipe, epochs, lr):
    "What each replica of `--launch` runs: the recipe's fit; the master's epochs' counters come back."
    stats = EpochStats(on_xla=True)
    fit_recipe(learn, recipe, epochs, lr, stats)
    return stats.epochs

def run_launched(recipe, out, epochs):
    "The recipe through `learn.launch` on 2 replica processes (gloo): its metric (from the master's `Recorder`), compiles, reads."
    set_seed(0)
    learn, metric, lr = RECIPES[recipe](out)
    for dl in learn.dls.loaders: dl.bs = dl.bs // 2      # (each replica half the batch: the steps of one device)
    epochs_seen = learn.launch(train_launched, recipe, epochs, lr, nprocs=2, transport='gloo')
    return final(learn, metric), epochs_seen

def print_launched(recipes, out, epochs):
    "`--launch`: one table, each recipe on 2 replicas (each replica half the recipe's batch: one device's steps)."
    print('| recipe | metric | launched, 2 replicas | compiles in epoch 1 | compiles after epoch 1 | reads / epoch (max) | '
          "of them gloo's (max) | the others (max) |")
    print('|---|---|---|---|---|---|---|---|')
    for r in recipes:
        _, metric, _ = RECIPES[r](out)
        value, es = run_launched(r, out, epochs)
        print(f"| {r} | {metric} | {value:.4f} | {es[0]['compiles']} | {sum(e['compiles'] for e in es[1:])} | "
              f"{max(e['to_host'] for e in es)} | {max(e['transport_reads'] for e in es)} | "
              f"{max(e['to_host'] - e['transport_reads'] for e in es)} |", flush=True)

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--recipes', nargs='+', default=list(RECIPES), choices=list(RECIPES))
    p.add_argument('--out', default='/tmp')
    p.add_argument('--launch', action='store_true', help="instead: each recipe through `learn.launch` on 2 replicas (gloo)")
    p.add_argument('--host-rounds', type=int, default=0, help=f"instead: the host's time per step on XLA and in the "
                   f"hand-written loop, this many alternating runs (recipes {', '.join(HAND_WRITTEN)})")
    a = p.parse_args()
    if a.epochs < 2: p.error('--epochs must be at least 2: the first epoch compiles and is not timed')
    if a.launch: return print_launched(a.recipes, Path(a.out), a.epochs)
    xla_device()         # before any CPU backward pass: autograd's engine must know the XLA device (see `check_autograd`)
    if a.host_rounds:
        if set(a.recipes) - set(HAND_WRITTEN): p.error(f"--host-rounds: the recipes with a hand-written loop, {' '.join(HAND_WRITTEN)}")
        return print_host_rounds(a.recipes, Path(a.out), a.host_rounds)
    print('| recipe | eager epoch s | XLA epoch s | XLA / eager | compiles in epoch 1 | compiles after epoch 1 | '
          'reads / epoch (max) | metric | eager | XLA | XLA ops / step | Python calls / step: eager | XLA | XLA / eager | '
          'XLA calls by package | host CPU ms / step: eager | XLA | hand-written loop | XLA / loop | '
          'transfers to the device / step: XLA | loop |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|')
    for r in a.recipes:
        eager, m_eager, metric, n_eager = run(r, Path(a.out), a.epochs, on_xla=False)
        xla, m_xla, _, n_xla = run(r, Path(a.out), a.epochs, on_xla=True)
        loop = run_hand_written(r, Path(a.out)) if r in HAND_WRITTEN else None
        t_eager, t_xla = (statistics.median(e['seconds'] for e in es[1:]) for es in (eager, xla))
        versus_loop = f"{loop['host_ms']:.1f} | {n_xla['host_ms'] / loop['host_ms']:.2f}" if loop else '- | -'
        loop_uploads = f"{loop['uploads']:.1f}" if loop else '-'
        print(f"| {r} | {t_eager:.2f} | {t_xla:.2f} | {t_xla / t_eager:.2f} | {xla[0]['compiles']} | "
              f"{sum(e['compiles'] for e in xla[1:])} | {max(e['to_host'] for e in xla)} | {metric} | {m_eager:.4f} | {m_xla:.4f} | "
              f"{n_xla['xla_ops']:.0f} | {n_eager['py_calls']:.0f} | {n_xla['py_calls']:.0f} | {n_xla['py_calls'] / n_eager['py_calls']:.2f} | "
              f"{top_packages(n_xla['by_package'])} | {n_eager['host_ms']:.1f} | {n_xla['host_ms']:.1f} | {versus_loop} | "
              f"{n_xla['uploads']:.1f} | {loop_uploads} |", flush=True)

if __name__ == '__main__': main()
