"""Epoch time with batches made in a background thread (`prefetch=2`) or in the training loop (`prefetch=0`).

    PJRT_DEVICE=CPU python benchmarks/prefetch.py [--models mlp,cnn,tabular] [--rounds 4] [--epochs 3]

The models and data of bench.py. For each model one process, one learner: fits of
`--epochs` epochs with the two settings alternate `--rounds` times (after one fit of each to
compile), so a slow spell of this shared machine hits both. Prints the median epoch time
of each setting (all epochs but the first of each fit) and their ratio."""
import argparse, json, os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench

SETTINGS = (2, 0)

def compare(model_name, rounds, epochs):
    from fastai_xla.all import xla_device
    xla_device()
    learn = bench._fastai_learner(model_name).to_tpu_distributed()
    def use(p):
        def apply():
            for dl in learn.dls.loaders: dl.prefetch = p
        return apply
    return bench.alternate_fits(learn, {p: use(p) for p in SETTINGS}, rounds, epochs)

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', default=','.join(bench.MODELS))
    p.add_argument('--rounds', type=int, default=4)
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--child')
    a = p.parse_args()
    if a.child:
        print('RESULT ' + json.dumps(compare(a.child, a.rounds, a.epochs)), flush=True)
        return
    env = dict(os.environ, PJRT_DEVICE=os.environ.get('PJRT_DEVICE', 'CPU'))
    print('| model | epoch s, background thread (prefetch=2) | epoch s, in the loop (prefetch=0) | in the loop / thread |\n|---|---|---|---|')
    for m in a.models.split(','):
        out = subprocess.run([sys.executable, __file__, '--child', m, '--rounds', str(a.rounds), '--epochs', str(a.epochs)],
                             capture_output=True, text=True, env=env)
        res = [json.loads(l[7:]) for l in out.stdout.splitlines() if l.startswith('RESULT ')]
        if not res: print(f'| {m} | failed: {out.stderr.strip().splitlines()[-1][-100:]} |'); continue
        t = res[0]
        print(f"| {m} | {t['2']:.4f} | {t['0']:.4f} | {t['0']/t['2']:.2f} |")

if __name__ == '__main__': main()
