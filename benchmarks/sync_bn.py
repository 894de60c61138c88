"""What `to_tpu_distributed(sync_bn=True)` (nbs/04b_sync_bn.ipynb) costs in a training step, and what it buys a model
with batch norms trained over replicas with small batches.

    PJRT_DEVICE=CPU python benchmarks/sync_bn.py [--seeds 6] [--rounds 3] [--batches 32,8]

1. The step (torch_xla's in-graph path): one process with `XLA_ALWAYS_ALLREDUCE=1` (torch_xla's collectives run with one
   replica, as they run between the replicas of a TPU), bench.py's CNN (3 `BatchNorm2d`); its fits alternate between
   fastai_xla's usual batch norms and synchronized ones for `--rounds` fits of 3 epochs after a warm-up round. Exact
   counts: XLA operations traced per training step, all-reduces per step, graphs compiled per fit after the warm-up;
   and the median epoch seconds and their ratio (noisy on a shared machine; the all-reduce of one replica is a copy, so
   this is the cost of the statistics, not of the network between chips).
2. What it buys: issue 69's program, a `TabularPandas` regression (the digits as a frame, the digit as the target,
   fastai's `tabular_learner` with its default batch norms), 5 epochs of `fit_one_cycle`: eager fastai on one CPU device
   at the global batch; `learn.launch(nprocs=2, transport='gloo')` at half of it per replica (the same global batch and
   steps); the same with `sync_bn=True`; for each batch per replica of `--batches` (32: issue 69's; 8: a TPU's eight
   cores sharing a batch of 64). The validation rmse for each of `--seeds` seeds (the model's weights and the epochs' order).
"""
import argparse, json, os, statistics, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench
import fastai_xla.all  # noqa: F401,E402 (to_tpu_distributed, launch)

def step_cost(rounds):
    from fastai_xla.core import xla_device, xla_counters
    import torch_xla.debug.metrics as met
    xla_device()
    plain, synced = bench._fastai_learner('cnn').to_tpu_distributed(), bench._fastai_learner('cnn').to_tpu_distributed(sync_bn=True)
    norms = sum(type(m).__name__ == 'BatchNorm2d' for m in plain.model.modules())
    res = {k: dict(times=[], compiles=[]) for k in ('plain', 'synced')}
    for r in range(rounds + 1):
        for k, learn in (('plain', plain), ('synced', synced)):
            counts, timer = bench.StepCounts(profile=False), bench._Timer()
            c0, a0 = xla_counters()['compiles'], met.counter_value('xla::AllReduceInPlace') or 0
            with learn.no_bar(), learn.no_logging(): learn.fit(3, 1e-2, cbs=[timer.callback(), bench._counting_callback(counts)])
            if not r: continue
            res[k]['times'] += timer.times[1:]; res[k]['compiles'].append(xla_counters()['compiles'] - c0)
            res[k]['ops'] = counts.per_step()['xla_ops']
            res[k]['all_reduces'] = ((met.counter_value('xla::AllReduceInPlace') or 0) - a0) / (3 * len(learn.dls.train))
    return dict(norms=norms, **{k: dict(epoch=statistics.median(v['times']), ops=v['ops'], all_reduces=v['all_reduces'],
                                        compiles=max(v['compiles'])) for k, v in res.items()})

def regression_dls(bs, seed):
    from fastai.tabular.all import TabularDataLoaders, RegressionBlock, Categorify, FillMissing, Normalize
    from fastai_xla.demo import digits_frame
    df, cats, conts = digits_frame()
    df['digit'] = df['digit'].astype('float32')
    return TabularDataLoaders.from_df(df, procs=[Categorify, FillMissing, Normalize], cat_names=cats, cont_names=conts, y_names='digit',
                                      y_block=RegressionBlock(), valid_idx=list(range(0, len(df), 5)), bs=bs, seed=seed)

def regression_learner(bs, seed):
    from fastai.tabular.all import tabular_learner, rmse, set_seed
    set_seed(seed)
    return tabular_learner(regression_dls(bs, seed), y_range=(-0.5, 9.5), metrics=rmse)

def train(learn):
    with learn.no_logging(): learn.fit_one_cycle(5, 1e-2)
    return float(learn.recorder.values[-1][-1])

def rmse_table(seeds, per_replica):
    "`{(run, batch per replica): {seed: rmse}}`: every launch first (forked from a process that ran no backward pass yet), then eager fastai at the global batch."
    rows = {}
    for bs in per_replica:
        for s in seeds:
            for sync in (False, True):
                learn = regression_learner(bs, s)
                with learn.no_bar():
                    rows.setdefault(('launch_sync' if sync else 'launch', bs), {})[s] = learn.launch(
                        train, nprocs=2, transport='gloo', sync_bn=sync, dl_kwargs=dict(seed=s))
    for bs in per_replica:
        for s in seeds:
            learn = regression_learner(2 * bs, s)
            with learn.no_bar(): rows.setdefault(('eager', bs), {})[s] = train(learn)
    return rows

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--seeds', type=int, default=6)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--batches', default='32,8', help='batch sizes per replica, comma-separated')
    p.add_argument('--step', action='store_true', help='measure the step in this process (internal)')
    a = p.parse_args()
    if a.step: print('RESULT', json.dumps(step_cost(a.rounds))); return
    out = subprocess.run([sys.executable, __file__, '--step', '--rounds', str(a.rounds)], capture_output=True, text=True,
                         env={**os.environ, 'XLA_ALWAYS_ALLREDUCE': '1'})
    lines = [line for line in out.stdout.splitlines() if line.startswith('RESULT ')]
    if not lines: sys.exit(out.stderr[-3000:])
    r = json.loads(lines[-1][7:])
    p_, s_ = r['plain'], r['synced']
    print(f"The step, torch_xla's in-graph collectives (bench.py's CNN, {r['norms']} batch norms, one replica with XLA_ALWAYS_ALLREDUCE=1):\n")
    print('| batch norms | XLA ops per step | all-reduces per step | compiles per fit (after warm-up) | epoch s (median) | ratio |')
    print('|---|---|---|---|---|---|')
    for name, v in (('fastai_xla\'s usual', p_), ('synchronized (`sync_bn=True`)', s_)):
        print(f"| {name} | {v['ops']:.0f} | {v['all_reduces']:.0f} | {v['compiles']} | {v['epoch']:.2f} | {v['epoch'] / p_['epoch']:.2f} |")
    seeds, per_replica = list(range(a.seeds)), [int(b) for b in a.batches.split(',')]
    rows = rmse_table(seeds, per_replica)
    print(f"\nValidation rmse after 5 epochs, the digits regression (`tabular_learner`, its default batch norms), {a.seeds} seeds:\n")
    print('| run | global batch | batch per replica | ' + ' | '.join(f'seed {s}' for s in seeds) + ' | range |')
    print('|---|---|---|' + '---|' * (len(seeds) + 1))
    for bs in per_replica:
        for key, name, each in (('eager', 'eager fastai, one CPU device', 2 * bs), ('launch', '`learn.launch(nprocs=2)`', bs),
                                ('launch_sync', '`learn.launch(nprocs=2, sync_bn=True)`', bs)):
            vals = [rows[key, bs][s] for s in seeds]
            print(f'| {name} | {2 * bs} | {each} | ' + ' | '.join(f'{v:.3f}' for v in vals) + f' | {min(vals):.3f}-{max(vals):.3f} |')

if __name__ == '__main__': main()
