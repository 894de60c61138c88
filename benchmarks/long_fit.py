"""Does a step get slower as a fit gets longer? The step marker's cost against the number of live device tensors, and a long fit.

    PJRT_DEVICE=CPU python benchmarks/long_fit.py [--epochs 12] [--bs 8]

torch_xla's step marker (`torch_xla.sync()`) looks at every live XLA tensor, so anything
that keeps one more device tensor per step (fastai's Recorder keeps every step's loss)
makes each step slower than the last. First table: the time of one small step against the
number of live device tensors, in this process. Second table: the MLP of bench.py with a
small batch (many steps), each run in its own process: the hand-written loop and fastai_xla,
the median epoch time early in the fit (epochs 2-4) and late (the last 3 epochs), and
their ratio. A ratio near 1 means the steps do not slow down."""
import argparse, json, os, statistics, subprocess, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench

def step_marker_cost(lives=(0, 1000, 4000, 8000), steps=50):
    import torch, torch_xla
    d = torch_xla.device()
    w, keep, rows = torch.randn(64, 64, device=d), [], []
    for n in lives:
        while len(keep) < n: keep.append(w.sum() * len(keep))   # computed on the device, then kept alive
        torch_xla.sync(); torch_xla.sync()
        t = time.perf_counter()
        for _ in range(steps): w = w * 1.0001; torch_xla.sync()
        rows.append((n, 1e3 * (time.perf_counter() - t) / steps))
    return rows

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=12)
    p.add_argument('--bs', type=int, default=8)
    p.add_argument('--child', nargs=1)
    a = p.parse_args()
    if a.child:
        run = bench.run_reference if a.child[0] == 'reference' else bench.run_fastai_xla
        print('RESULT ' + json.dumps(run('mlp', a.epochs, bs=a.bs)), flush=True)
        return
    env = dict(os.environ, PJRT_DEVICE=os.environ.get('PJRT_DEVICE', 'CPU'))
    cost = subprocess.run([sys.executable, '-c', f'import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); '
                           'import long_fit, json; print("RESULT " + json.dumps(long_fit.step_marker_cost()))'],
                          capture_output=True, text=True, env=env)
    rows = json.loads([l for l in cost.stdout.splitlines() if l.startswith('RESULT ')][-1][7:])
    print('| live device tensors | ms per step (a 64x64 multiply and a step marker) |\n|---|---|')
    for n, ms in rows: print(f'| {n} | {ms:.3f} |')
    print('\n| run | steps | epoch s, epochs 2-4 | epoch s, last 3 | late / early |\n|---|---|---|---|---|')
    for kind in ('reference', 'fastai_xla'):
        out = subprocess.run([sys.executable, __file__, '--child', kind, '--epochs', str(a.epochs), '--bs', str(a.bs)],
                             capture_output=True, text=True, env=env)
        res = [json.loads(l[7:]) for l in out.stdout.splitlines() if l.startswith('RESULT ')]
        if not res: print(f'| {kind} | failed: {out.stderr.strip().splitlines()[-1][-100:]} |'); continue
        t = res[0]['times']
        early, late = statistics.median(t[1:4]), statistics.median(t[-3:])
        steps = a.epochs * (1437 // a.bs)
        print(f'| {kind} | {steps} | {early:.3f} | {late:.3f} | {late/early:.2f} |')

if __name__ == '__main__': main()
