"""The hand-written torch_xla training loop that fastai_xla's benchmarks compare with.

    PJRT_DEVICE=CPU python benchmarks/reference_loop.py     # the MLP on scikit-learn's digits, 5 epochs

It is the loop torch_xla's own examples teach, with nothing of fastai in it: torch
`DataLoader`s wrapped in torch_xla's `MpDeviceLoader` (which copies each batch to the
device and cuts the graph after every step), a torch `Adam` left on its defaults, and one
read from the device per epoch (the accuracy and the last loss). `benchmarks/bench.py`
runs `train_reference` with the same model, items, split and preprocessing as its fastai
rows; with `spmd=True` the loader splits each batch's rows over every device of a
one-axis mesh (torch_xla's SPMD data parallelism), with `eager_cpu=True` the same loop
runs on PyTorch's eager CPU device, without XLA."""
import time

def xla_counters() -> dict:
    "Graphs compiled and device-to-host transfers so far, from torch_xla's metrics."
    import torch_xla.debug.metrics as met
    get = lambda k: (met.metric_data(k) or [0])[0]
    return dict(compiles=get('CompileTime'), to_host=get('TransferFromDeviceTime'))

def spmd_input_sharding(ndim:int):
    "Switch torch_xla to SPMD and return a sharding that splits a batch's first dimension over every device."
    import numpy as np, torch_xla.runtime as xr, torch_xla.distributed.spmd as xs
    xr.use_spmd(); n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ('data',))
    return xs.ShardingSpec(mesh, ('data',) + (None,) * (ndim - 1))

def train_reference(model, train:tuple, valid:tuple, epochs:int, prep=None, bs:int=64, lr:float=1e-2,
                    spmd:bool=False, eager_cpu:bool=False, log=None, counts=None) -> dict:
    """Train `model` with Adam and cross-entropy on `train` = (inputs..., targets) tensors, validate on `valid`.
    `prep(device)` may return a function applied to the inputs on the device. Returns each epoch's seconds and
    counters and the last accuracy. `counts` (with `start()` and `stop(steps)`), or `{epoch: counts}`, is started and
    stopped around the training steps of that epoch (the second by default)."""
    import torch, torch_xla
    import torch_xla.distributed.parallel_loader as pl
    sharding = spmd_input_sharding(train[0].ndim) if spmd else None
    d = torch.device('cpu') if eager_cpu else torch_xla.device()
    model = model.to(d)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    trl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=bs, shuffle=True, drop_last=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*valid), batch_size=bs, drop_last=spmd)
    if not eager_cpu: trl, val = (pl.MpDeviceLoader(dl, d, input_sharding=sharding) for dl in (trl, val))
    prepare = prep(d) if prep else (lambda *xs: xs)
    counters = (lambda: dict(compiles=0, to_host=0)) if eager_cpu else xla_counters
    times, per_epoch, acc = [], [], None
    if counts is not None and not isinstance(counts, dict): counts = {1: counts}
    for ep in range(epochs):
        c0 = counters(); t = time.perf_counter(); model.train()
        measured = (counts or {}).get(ep)
        if measured: measured.start(); steps = 0
        for *xs, yb in trl:
            loss = torch.nn.functional.cross_entropy(model(*prepare(*xs)), yb)
            loss.backward(); opt.step(); opt.zero_grad()
            if measured: steps += 1
        if measured: measured.stop(steps)
        model.eval(); correct = torch.zeros((), device=d); total = 0
        with torch.no_grad():
            for *xs, yb in val:
                correct += (model(*prepare(*xs)).argmax(1) == yb).sum(); total += len(yb)
        acc = correct.item() / total; last_loss = loss.item()
        times.append(time.perf_counter() - t); per_epoch.append({k: v - c0[k] for k, v in counters().items()})
        if log: log(f'epoch {ep}: loss {last_loss:.4f} accuracy {acc:.4f} {times[-1]:.3f}s')
    return dict(times=times, per_epoch=per_epoch, accuracy=acc)

def digits_tensors():
    "scikit-learn's digits as (64 pixels / 16, label), the first 80% for training."
    import torch
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X, dtype=torch.float32) / 16.; y = torch.tensor(y)
    n = int(len(X) * 0.8)
    return X[:n], y[:n], X[n:], y[n:]

if __name__ == '__main__':
    import torch
    Xt, yt, Xv, yv = digits_tensors(); torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    res = train_reference(mlp, (Xt, yt), (Xv, yv), epochs=5, log=print)
    print('compiles', sum(p['compiles'] for p in res['per_epoch']),
          'device-to-host transfers', sum(p['to_host'] for p in res['per_epoch']))
