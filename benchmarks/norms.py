"""What the XLA versions of torch's normalizations (`nbs/13_models.ipynb`: each group's mean taken out before torch_xla's
one-pass variance, batch norms' running statistics as PyTorch keeps them) add to a training step, against torch_xla's
own normalizations, on the models of bench.py that normalize (the CNN: 3 `BatchNorm2d`; fastai's `TabularModel`: 3
`BatchNorm1d`) and an MLP with 2 `LayerNorm`s.

    PJRT_DEVICE=CPU python benchmarks/norms.py [--rounds 5]

Per model, one process: the XLA learner's fits alternate between the two settings (the normalization modules as
their XLA versions, or back to torch's classes) for `--rounds` fits of 3 epochs after a warm-up round, so that a slow
spell of this shared machine hits both; epochs after each fit's first count. Prints one table: XLA operations traced
per training step (exact: the sum of torch_xla's `xla::` counters), graphs compiled per fit after the warm-up,
median epoch seconds and their ratio."""
import argparse, json, os, statistics, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench

NORMS = ('BatchNorm1d', 'BatchNorm2d', 'LayerNorm')

def mlp_ln():
    import torch.nn as nn
    return nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.ReLU(), nn.Linear(128, 128), nn.LayerNorm(128), nn.ReLU(),
                         nn.Linear(128, 10))

def learner(model_name):
    if model_name != 'mlp_ln': return bench._fastai_learner(model_name)
    learn = bench._fastai_learner('mlp')
    learn.model = mlp_ln()
    return learn

def measure(model_name, rounds):
    from fastai_xla.core import xla_device, xla_counters, fastai_version
    from fastai_xla.callback import module_versions
    xla_device()
    learn = learner(model_name).to_tpu_distributed()
    norms = [m for m in learn.model.modules() if type(m).__name__ in NORMS]
    ours = {cls: v for cls, v in module_versions.items() if cls.__name__ in NORMS}
    def torch_xlas():   # (each fit makes the model's modules their XLA versions: the norms' registered versions out)
        for cls in ours: module_versions.pop(cls, None)
        for m in norms: fastai_version(m)
    settings = {'xla_versions': lambda: module_versions.update(ours), 'torch_xla': torch_xlas}
    times, ops, compiles = {k: [] for k in settings}, {}, {k: [] for k in settings}
    for r in range(rounds + 1):
        for k, apply in settings.items():
            apply()
            counts, timer = bench.StepCounts(), bench._Timer()
            c0 = xla_counters()['compiles']
            with learn.no_bar(), learn.no_logging(): learn.fit(3, 1e-2, cbs=[timer.callback(), bench._counting_callback(counts)])
            if r:
                times[k] += timer.times[1:]; compiles[k].append(xla_counters()['compiles'] - c0)
                ops[k] = counts.per_step()['xla_ops']
    return dict(model=model_name, norms=len(norms), **{f'{k}_{what}': v for k in settings for what, v in
                (('epoch', statistics.median(times[k])), ('ops', ops[k]), ('compiles', max(compiles[k])))})

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--model', help='run one model in this process (internal)')
    a = p.parse_args()
    if a.model: print('RESULT', json.dumps(measure(a.model, a.rounds))); return
    print('| model | normalizations | XLA ops per step: torch_xla -> XLA versions | compiles per fit (after warm-up) | '
          'epoch s: torch_xla, XLA versions | ratio |\n|---|---|---|---|---|---|')
    for model in ('cnn', 'tabular', 'mlp_ln'):
        out = subprocess.run([sys.executable, __file__, '--model', model, '--rounds', str(a.rounds)], capture_output=True, text=True)
        res = [l for l in out.stdout.splitlines() if l.startswith('RESULT ')]
        if not res: print(f'| {model} | failed: {(out.stderr.strip().splitlines() or [""])[-1][:150]} |||||'); continue
        r = json.loads(res[0][7:])
        print(f"| {model} | {r['norms']} | {r['torch_xla_ops']:.0f} -> {r['xla_versions_ops']:.0f} | "
              f"{r['torch_xla_compiles']}, {r['xla_versions_compiles']} | {r['torch_xla_epoch']:.4f}, {r['xla_versions_epoch']:.4f} | "
              f"{r['xla_versions_epoch'] / r['torch_xla_epoch']:.2f} |", flush=True)

if __name__ == '__main__': main()
