"""fastai's applications as its tutorials build them, from files on disk and data frames, trained on
the CPU XLA device against the same recipe on eager CPU: image folders with `aug_transforms`
(augmented on the device), segmentation with augmentation and `DiceMulti`, collaborative filtering
from a ratings frame; tabular from a frame is in test_single_device.py. Each: learns as eager
does, no compilation after the first epoch, a bounded number of reads of the device per epoch,
nothing run on the CPU by torch_xla's fallbacks. The image recipe also runs on 2 replicas (gloo).

Small models stand in for fastai's pretrained ones (`resnet18` weights are a download; its graph
compiles for a minute on the CPU device): `benchmarks/apps.py` runs `vision_learner(resnet18)` and
`unet_learner(resnet18)`. Not covered here: a TPU (speed, torch_xla's own collectives)."""
import warnings
import pytest
from helpers import *
from fastai.vision.all import ImageDataLoaders, aug_transforms, DiceMulti
from fastai.collab import CollabDataLoaders, collab_learner
from fastai_xla.demo import digits_folder, digits_ratings_frame, centre_of_ink

def image_cnn():
    return nn.Sequential(ConvLayer(3, 16, stride=2), ConvLayer(16, 32, stride=2), ConvLayer(32, 64, stride=2),
                         nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(64, 10))

def image_folder_learner(path, seed=0):
    "fastai's image classification recipe: a folder per class of PNG files, `aug_transforms` with a random crop."
    set_seed(seed, reproducible=True)
    dls = ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=64, num_workers=0,
                                       batch_tfms=aug_transforms(size=24, min_scale=0.75))
    return Learner(dls, image_cnn(), metrics=accuracy)

def collab_digits_learner(seed=0):
    "fastai's collaborative filtering recipe on a ratings frame."
    set_seed(seed, reproducible=True)
    dls = CollabDataLoaders.from_df(digits_ratings_frame(), bs=256, seed=42, num_workers=0)
    return collab_learner(dls, n_factors=16, y_range=(0, 16.5))

def fit_xla(learn, fit):
    "`fit(learn)` on XLA with fastai's schedule; the epochs' counters, performance warnings and CPU fallbacks."
    checks = EpochCounters()
    learn.add_cb(checks)
    with warnings.catch_warnings(record=True) as caught, learn.no_bar(), learn.no_logging():
        warnings.simplefilter('always')
        fit(learn)
    perf = [str(w.message) for w in caught if issubclass(w.category, XLAPerformanceWarning)]
    return checks.epochs, perf

def assert_steady(epochs, perf, max_reads):
    assert [e['compiles'] for e in epochs[1:]] == [0] * (len(epochs) - 1), epochs
    assert all(e['to_host'] <= max_reads for e in epochs), epochs
    assert not perf, perf

def test_image_folder_with_aug_transforms_on_the_device(tmp_path):
    path = digits_folder(tmp_path/'digits', size=32)
    # 6 epochs, so that the bounds below stand clear of the seeds' spread: over seeds 0-5 (measured on the host, 2026-11-28)
    # fastai's own reached 0.883-0.903 and the native backend's 0.872-0.908, at most 0.031 apart. After 4 epochs they were
    # 0.79-0.86 and up to 0.064 apart, and on an H100 (`cuda`, scripts/native_gpu.sh) seed 0 ended at 0.783.
    fit = lambda l: l.fit_one_cycle(6, 1e-2)
    cpu = image_folder_learner(path)
    with cpu.no_bar(), cpu.no_logging(): fit(cpu)
    xla = image_folder_learner(path).to_xla(seed=0)
    on_device = [type(f).__name__ for f in xla.dls.train.device_tfms.fs]
    assert on_device == ['IntToFloatTensor', 'Flip', 'RandomResizedCropGPU', 'Brightness'], on_device
    # the loader's own copies, the sampling ones as their XLA versions; fastai's loader keeps fastai's
    assert [isinstance(f, XLAVersion) for f in xla.dls.train.device_tfms.fs] == [False, True, True, False]
    assert not any(isinstance(f, XLAVersion) for f in xla.dls.train.dl.after_batch.fs)
    epochs, perf = fit_xla(xla, fit)
    assert_steady(epochs, perf, max_reads=12)
    assert final(xla, 'accuracy') > 0.8, final(xla, 'accuracy')
    assert abs(final(xla, 'accuracy') - final(cpu, 'accuracy')) < 0.05, (final(xla, 'accuracy'), final(cpu, 'accuracy'))


def test_segmentation_with_augmentation_and_dice(tmp_path):
    "Images and masks warped together on the device (same draws), DiceMulti counted on the device."
    fit = lambda l: l.fit_one_cycle(3, 1e-2)
    make = lambda: segmentation_learner(tmp_path/'seg', classes='digit', metrics=[DiceMulti()],
                                        batch_tfms=aug_transforms(max_rotate=5., max_warp=0.1))
    cpu = make()
    with cpu.no_bar(), cpu.no_logging(): fit(cpu)
    xla = make().to_xla(seed=0)
    assert any(type(f).__name__ == 'Flip' and isinstance(f, XLAVersion) for f in xla.dls.train.device_tfms.fs)
    epochs, perf = fit_xla(xla, fit)
    assert_steady(epochs, perf, max_reads=12)
    assert abs(final(xla, 'dice_multi') - final(cpu, 'dice_multi')) < 0.05, (final(xla, 'dice_multi'), final(cpu, 'dice_multi'))

def test_collab_from_a_ratings_frame():
    fit = lambda l: l.fit_one_cycle(4, 5e-2)
    cpu = collab_digits_learner()
    with cpu.no_bar(), cpu.no_logging(): fit(cpu)
    xla = collab_digits_learner().to_xla(seed=0)
    epochs, perf = fit_xla(xla, fit)
    assert_steady(epochs, perf, max_reads=12)
    valid_loss = lambda l: l.recorder.values[-1][1]
    assert valid_loss(cpu) < 12 and abs(valid_loss(xla) - valid_loss(cpu)) < 0.05 * valid_loss(cpu), (valid_loss(xla), valid_loss(cpu))

TWO_REPLICAS_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from test_applications import *

def fit_and_count(learn):
    checks = EpochCounters()
    learn.fit_one_cycle(5, 2e-2, cbs=checks)       # (2 replicas: half the steps of one, each of 128 items)
    return checks.epochs

learn = image_folder_learner(digits_folder('digits', size=32))
epochs = learn.launch(fit_and_count, nprocs=2, transport='gloo')
print('RESULT ' + json.dumps(dict(epochs=epochs, accuracy=final(learn, 'accuracy'))))
"""

def test_image_folder_with_aug_transforms_on_two_replicas(tmp_path):
    """In a fresh process (fastai's item transforms of an image folder do not pickle on every fastai version: forked replicas).
    No compilation after the first epoch on 2 replicas either (this failed until the gloo transport sent its results back as
    one transfer: see 00_core, torch_xla's cache of scalars). The gloo transport reads the device for every step's gradient
    all-reduce (CPU collectives), so reads per epoch grow with the batches here, unlike on a TPU."""
    import json, os, subprocess, sys
    from pathlib import Path
    (tmp_path/'two.py').write_text(TWO_REPLICAS_SCRIPT.format(tests=str(Path(__file__).parent)))
    r = subprocess.run([sys.executable, 'two.py'], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU', 'PYTHONPATH': str(Path(__file__).parents[1])})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.split('RESULT ')[-1])
    epochs = res['epochs']
    assert [e['compiles'] for e in epochs[1:]] == [0, 0, 0, 0], epochs
    assert res['accuracy'] > 0.75, res

# --- fastai's programs that assign to a learner between fits (issue 58): progressive resizing, as fastbook writes it

def resized_dls(path, size, bs=64):
    "fastbook's `get_dls` (chapter 7): the items resized, then `aug_transforms` at `size`."
    from fastai.vision.all import Resize
    return ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=bs, num_workers=0, item_tfms=Resize(size),
                                       batch_tfms=aug_transforms(size=size, min_scale=0.75))

def train_progressively(learn, path, bs=64):
    "At 16 pixels, then at 24 (`learn.dls = ...`), fine-tuned: what fastbook's chapter 7 does at 128 and 224."
    learn.fit_one_cycle(3, 2e-2)
    learn.dls = resized_dls(path, 24, bs)
    learn.fine_tune(3, 2e-2)
    return final(learn, 'accuracy')

@pytest.mark.parametrize('where', ['one device', 'launched'])
def test_progressive_resizing_trains_like_eager(tmp_path, where):
    """New loaders between fits, on one device and in a launched function (2 replicas of half the batch size: the same
    steps): the fits after them train as eager does (before: 0.490 and 0.426 against eager's 0.955), and the new size
    compiles in its first epochs only."""
    path = digits_folder(tmp_path/'digits', size=32)
    new = lambda bs=64: (set_seed(0, reproducible=True), Learner(resized_dls(path, 16, bs), image_cnn(), metrics=accuracy))[1]
    cpu = new()
    with cpu.no_bar(), cpu.no_logging(): eager = train_progressively(cpu, path)
    learn = new() if where == 'one device' else new(bs=32)
    if where == 'one device':
        counts = EpochCounters()
        learn = learn.to_xla(seed=0)
        learn.add_cb(counts)
        with learn.no_bar(), learn.no_logging(): acc = train_progressively(learn, path)
        assert counts.epochs[-1]['compiles'] == 0, counts.epochs                 # (the new size: compiled in its first epochs)
    else: acc = learn.launch(train_progressively, path, 32, nprocs=2, transport='gloo')
    assert abs(acc - eager) <= 0.05 and acc > 0.85, (acc, eager)

# --- keypoints, as fastai's head-pose tutorial writes them (issue 58): `PointBlock` through every default `aug_transforms`

def keypoint_learner(path, seed=0):
    "fastai's keypoint regression recipe (the head-pose tutorial's): `ImageBlock`, `PointBlock`, `aug_transforms()` (warp included), `y_range`."
    from fastai.vision.all import DataBlock, ImageBlock, PointBlock, get_image_files, RandomSplitter, MSELossFlat, SigmoidRange
    dls = DataBlock(blocks=(ImageBlock, PointBlock), get_items=get_image_files, get_y=centre_of_ink,
                    splitter=RandomSplitter(0.2, seed=42), batch_tfms=aug_transforms()).dataloaders(path, bs=64, num_workers=0)
    set_seed(seed, reproducible=True)
    model = nn.Sequential(*list(image_cnn())[:-1], nn.Linear(64, 2), SigmoidRange(-1, 1))
    return Learner(dls, model, loss_func=MSELossFlat())

def test_keypoints_with_default_aug_transforms_train_like_eager(tmp_path):
    """Points warped, flipped, rotated and zoomed with their images on the device, as fastai moves them on the CPU (tested
    against fastai on the same draws: nbs/12_augment): the keypoints' loss as eager's, no read of the device per batch, no
    compile after the first epoch. (Before: `Expected XLA tensor. Got: torch.FloatTensor` in the first batch, in fastai's
    `apply_perspective`; without the warp, a read of the device per batch for `torch.inverse`.)"""
    path = digits_folder(tmp_path/'digits', size=32)
    fit = lambda l: l.fit_one_cycle(3, 1e-2)
    cpu = keypoint_learner(path)
    with cpu.no_bar(), cpu.no_logging(): fit(cpu)
    xla = keypoint_learner(path).to_xla(seed=0)
    epochs, perf = fit_xla(xla, fit)
    assert_steady(epochs, perf, max_reads=4)
    eager, on_xla = cpu.recorder.values[-1][1], xla.recorder.values[-1][1]
    spread = torch.cat([y for _, y in cpu.dls.valid]).flatten(1).var(0).mean().item()   # (the loss of always guessing the mean: ~0.008)
    assert on_xla < spread / 2 and on_xla < 1.5 * eager, (on_xla, eager, spread)   # (eager's own varies by 1.5x between runs)

class HuggingFaceLogits(nn.Module):
    "A Hugging Face classifier as fastai takes a model: token ids in, logits out (0 the padding token)."
    def __init__(self, model, mask_4d:bool): super().__init__(); self.model, self.mask_4d = model, mask_4d
    def forward(self, ids):
        mask = (ids != 0)[:, None, None, :] if self.mask_4d else (ids != 0).long()   # (4D: taken as it is, never read)
        return self.model(input_ids=ids, attention_mask=mask).logits

def bert_digits_learner(mask_4d:bool):
    "A random-init `BertForSequenceClassification` (its config alone: nothing downloaded) on the digits, each image's 64 pixel intensities its tokens."
    from transformers import BertConfig, BertForSequenceClassification
    from sklearn.datasets import load_digits
    d = load_digits()
    x, y = torch.tensor(d.data, dtype=torch.long) + 1, torch.tensor(d.target)   # (intensities 0-16 as tokens 1-17)
    dls = DataLoaders.from_dsets(list(zip(x[:1400], y[:1400])), list(zip(x[1400:], y[1400:])), bs=64, device='cpu')
    set_seed(0, reproducible=True)
    config = BertConfig(vocab_size=20, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=64, hidden_dropout_prob=0., attention_probs_dropout_prob=0., num_labels=10)
    return Learner(dls, HuggingFaceLogits(BertForSequenceClassification(config), mask_4d), loss_func=CrossEntropyLossFlat(), metrics=accuracy)

def test_a_random_init_hugging_face_bert_trains_like_eager():
    """Issue 83: a Hugging Face BERT behind a logits wrapper (`transformers`, a test dependency of the development stack).
    With a 4D mask: eager's losses, no compile after epoch 1, 2 reads an epoch. With the 2D mask Hugging Face users pass,
    its attention layers read the mask every batch (transformers' `_ignore_bidirectional_mask_sdpa`): the warning names
    the model and the 4D mask."""
    pytest.importorskip('transformers')
    fit = lambda l: l.fit_one_cycle(2, 3e-3)
    cpu = bert_digits_learner(mask_4d=True)
    with cpu.no_bar(), cpu.no_logging(): fit(cpu)
    xla = bert_digits_learner(mask_4d=True).to_xla(seed=0)
    epochs, perf = fit_xla(xla, fit)
    assert_steady(epochs, perf, max_reads=12)
    valid_loss = lambda l: l.recorder.values[-1][1]
    assert abs(valid_loss(xla) - valid_loss(cpu)) < 0.01 * valid_loss(cpu), (valid_loss(xla), valid_loss(cpu))
    epochs, perf = fit_xla(bert_digits_learner(mask_4d=False).to_xla(seed=0), lambda l: l.fit(1, 3e-3))
    assert epochs[0]['to_host'] > len(xla.dls.train), epochs
    assert any('BertForSequenceClassification' in w and '`mask[:, None, None, :].bool()`' in w for w in perf), perf
