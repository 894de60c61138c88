"""One LSTM layer's forward and backward on the CPU XLA device: fastai_xla's loops against torch_xla's `scan`, one table.

The layer of the text benchmark's AWD_LSTM (128 hidden units, batch 32, 72 steps), forward and backward per step:
- fastai_xla: `fastai_xla.text.lstm_loop` (the `While` built once per shape, the backward step written out);
- torch_xla's scan: `torch_xla.experimental.scan.scan(step, ..., is_fn_pure=True)` over the plain LSTM step, its backward
  derived by AOTAutograd.
Columns: ms per step (median after the first), host ms per step (tracing until the graph is handed to the device),
compiles after the first step, and the largest gradient difference from torch's own LSTM on the host.

    PJRT_DEVICE=CPU python benchmarks/scan.py [--steps 20]
"""
import argparse, statistics, time
import torch, torch.nn as nn
import torch_xla, torch_xla.debug.metrics as met
from torch_xla.experimental.scan import scan
from fastai_xla.core import check_autograd
from fastai_xla.text import lstm_loop

T, BS, N = 72, 32, 128

def plain_step(carry, x):
    "One LSTM step, for torch_xla's `scan` to derive the backward of."
    h, c, w_t = carry
    i, f, g, o = (x + h @ w_t).chunk(4, dim=-1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    h = o.sigmoid() * c.tanh()
    return (h, c, w_t), h

def with_fastai_xla(gates_in, h, c, w_hh): return lstm_loop(gates_in, h, c, w_hh)[0]
def with_torch_xla_scan(gates_in, h, c, w_hh): return scan(plain_step, (h, c, w_hh.t()), gates_in, is_fn_pure=True)[1]

def grads(way, lstm, x, device):
    "The input's and the weights' gradients of `sum(way(...) ** 2)`."
    w_ih, w_hh = (lstm.weight_ih_l0.detach().to(device).requires_grad_(), lstm.weight_hh_l0.detach().to(device).requires_grad_())
    x = x.to(device).requires_grad_()
    h = c = torch.zeros(BS, N, device=device)
    out = way(x @ w_ih.t(), h, c, w_hh)
    (out ** 2).sum().backward()
    return x.grad, w_ih.grad, w_hh.grad

def timed(way, lstm, x, device, steps):
    "Per step: wall ms and host ms; and the compiles after the first step."
    wall, host = [], []
    for k in range(steps):
        if k == 1: compiles = met.metric_data('CompileTime')[0]
        t0 = time.perf_counter()
        gs = grads(way, lstm, x, device)
        torch_xla.sync(); t1 = time.perf_counter()
        [g.cpu() for g in gs]; t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3); wall.append((t2 - t0) * 1e3)
    return statistics.median(wall[1:]), statistics.median(host[1:]), met.metric_data('CompileTime')[0] - compiles, gs

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=20)
    a = p.parse_args()
    if a.steps < 2: p.error(f'--steps {a.steps}: at least 2 (the first step compiles; the table reports the steps after it)')
    check_autograd()
    torch.manual_seed(0)
    lstm, x, device = nn.LSTM(N, N, bias=False), torch.randn(T, BS, N), torch_xla.device()
    x.requires_grad_()
    out, _ = lstm(x); (out ** 2).sum().backward()
    want = (x.grad, lstm.weight_ih_l0.grad, lstm.weight_hh_l0.grad)
    print(f'one LSTM layer, {N} units, batch {BS}, {T} steps, forward and backward; {a.steps} steps each\n')
    print('| loop | ms per step | host ms per step | compiles after step 1 | largest gradient difference from torch |')
    print('|---|---|---|---|---|')
    for name, way in (('fastai_xla', with_fastai_xla), ("torch_xla's scan", with_torch_xla_scan)):
        wall, host, compiles, gs = timed(way, lstm, x.detach(), device, a.steps)
        diff = max((g.cpu() - w).abs().max().item() for g, w in zip(gs, want))
        print(f'| {name} | {wall:.1f} | {host:.1f} | {compiles} | {diff:.1e} |', flush=True)

if __name__ == '__main__': main()
