"""fastai's "PyTorch to fastai" tutorial as written: plain PyTorch `DataLoader`s of a map-style dataset (torchvision's style:
a dataset object with `__getitem__`, PyTorch's collate) wrapped in fastai's `DataLoaders`, an `nn.Sequential`, `Learner`
with PyTorch's loss, `fit_one_cycle`: eagerly on the CPU, with `to_xla()` on the CPU XLA device, and through `learn.launch`
on 2 replicas over gloo (each reads its shard as `DistributedSampler` would; metrics over the whole validation set).

Not covered: torchvision itself (not installed here: sklearn's digits stand in for MNIST), a TPU."""
import torch.nn.functional as F
import torch.utils.data as tud
from helpers import *
from sklearn.datasets import load_digits

class Digits(tud.Dataset):
    "The digits as a PyTorch user writes a dataset: an image tensor and a label per index."
    def __init__(self, train:bool):
        d = load_digits()
        x, y = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16., torch.tensor(d.target)
        idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(42))
        self.idx = idx[:1400] if train else idx[1400:]
        self.x, self.y = x, y
    def __len__(self): return len(self.idx)
    def __getitem__(self, i): return self.x[self.idx[i]], self.y[self.idx[i]]

def tutorial_learner():
    set_seed(0, reproducible=True)
    train = tud.DataLoader(Digits(True), batch_size=64, shuffle=True)
    valid = tud.DataLoader(Digits(False), batch_size=128)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))
    return Learner(DataLoaders(train, valid), model, loss_func=F.cross_entropy, metrics=accuracy)

def _launched(learn): learn.fit_one_cycle(4, 3e-3)

def test_the_pytorch_to_fastai_tutorial_trains_on_xla_and_launched():
    eager = tutorial_learner()
    with eager.no_bar(): eager.fit_one_cycle(4, 3e-3)
    xla = tutorial_learner().to_xla()
    with xla.no_bar(): xla.fit_one_cycle(4, 3e-3)
    launched = tutorial_learner()
    launched.launch(_launched, nprocs=2, transport='gloo')
    accs = [final(l, 'accuracy') for l in (eager, xla, launched)]
    assert accs[0] > 0.85, accs
    assert abs(accs[1] - accs[0]) <= 0.03 and abs(accs[2] - accs[0]) <= 0.03, accs
    assert len(xla.dls.valid.dl.dataset) == len(eager.dls.valid.dataset) == 397       # (the whole validation set, once)
