"""fastai's own per-step cost, without XLA: the MLP of bench.py on eager CPU, a plain loop against a fastai Learner.

    python benchmarks/fastai_overhead.py
"""
import sys, time, os; sys.path.insert(0, os.path.dirname(__file__))
import torch, bench
from fastai.callback.progress import *
Xt, yt, Xv, yv = bench.digits_tensors(); torch.manual_seed(0)
model = bench.make_model('mlp'); opt = torch.optim.Adam(model.parameters(), lr=1e-2)
trl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(Xt, yt), batch_size=64, shuffle=True, drop_last=True)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(Xv, yv), batch_size=64)
ts=[]
for ep in range(6):
    t=time.perf_counter()
    for xb,yb in trl:
        loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step(); opt.zero_grad()
    with torch.no_grad():
        c=0
        for xb,yb in val: c+=(model(xb).argmax(1)==yb).sum()
    ts.append(time.perf_counter()-t)
raw = sorted(ts)[3]; print(f'plain loop     {raw:.4f} s per epoch')
learn = bench._fastai_learner('mlp'); timer = bench._Timer()
with learn.no_bar(), learn.no_logging(): learn.fit(6, 1e-2, cbs=timer.callback())
fa = sorted(timer.times)[3]; print(f'fastai Learner {fa:.4f} s per epoch')
steps = 22 + 6
print(f'fastai costs {1000*(fa-raw)/steps:.2f} ms more per step ({steps} steps per epoch)')
