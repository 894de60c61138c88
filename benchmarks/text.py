"""fastai's text recipes on the CPU XLA device against the same recipe on eager CPU, one table.

Data: docstrings of installed libraries (fastai_xla.demo.docstrings_csv), a small AWD_LSTM (64-wide embeddings,
128 hidden units, 2 layers). Rows: the classifier (TextDataLoaders.from_df, text_classifier_learner, bs 32) and the
language model (is_lm=True, language_model_learner, bs 32, seq_len 72), fit_one_cycle(EPOCHS) each.
Columns: epoch time (median after the first epoch) and its ratio eager/XLA in the same run, compiles in epoch 1 and
after it, device-to-host reads per epoch, final accuracy of each.

    PJRT_DEVICE=CPU python benchmarks/text.py [--epochs 4] [--out /tmp]
"""
import argparse, statistics, time, warnings
from pathlib import Path
warnings.filterwarnings('ignore')
import pandas as pd
from fastai.text.all import *
from fastai_xla.all import *
from fastai_xla.core import check_autograd
from fastai_xla.demo import docstrings_csv

SMALL = dict(emb_sz=64, n_hid=128, n_layers=2)

class EpochStats(Callback):
    "Wall time and XLA counters of each epoch."
    order = 100
    def before_fit(self): self.rows = []
    def before_epoch(self): self.t0, self.c0 = time.perf_counter(), xla_counters()
    def after_epoch(self): self.rows.append((time.perf_counter() - self.t0, counters_diff(xla_counters(), self.c0)))

def learner(kind, df):
    set_seed(0)
    if kind == 'classifier':
        dls = TextDataLoaders.from_df(df, text_col='text', label_col='label', valid_pct=0.2, seed=42, bs=32)
        return text_classifier_learner(dls, AWD_LSTM, pretrained=False, metrics=accuracy, config=SMALL)
    dls = TextDataLoaders.from_df(df, text_col='text', is_lm=True, valid_pct=0.1, seed=42, bs=32, seq_len=72)
    return language_model_learner(dls, AWD_LSTM, pretrained=False, metrics=accuracy, config={**awd_lstm_lm_config, **SMALL})

def run(kind, df, on_xla, epochs):
    learn = learner(kind, df)
    if on_xla: learn = learn.to_xla()
    stats = EpochStats()
    with learn.no_bar(): learn.fit_one_cycle(epochs, 1e-2, cbs=stats)
    acc = learn.recorder.values[-1][learn.recorder.metric_names.index('accuracy') - 1]
    return [t for t, _ in stats.rows], [c for _, c in stats.rows], acc

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=4)
    p.add_argument('--out', default='/tmp', help='where the docstrings CSV is written')
    a = p.parse_args()
    check_autograd()
    df = pd.read_csv(docstrings_csv(Path(a.out)/'fastai_xla_docstrings.csv'))
    print(f'{len(df)} docstrings; {a.epochs} epochs each\n')
    print('| recipe | eager epoch s | XLA epoch s | XLA/eager | compiles epoch 1 | compiles after | host reads / epoch | accuracy eager | accuracy XLA |')
    print('|---|---|---|---|---|---|---|---|---|')
    for kind in ('classifier', 'language model'):
        te, _, acc_e = run(kind, df, False, a.epochs)
        tx, cx, acc_x = run(kind, df, True, a.epochs)
        me, mx = statistics.median(te[1:]), statistics.median(tx[1:])
        print(f"| {kind} | {me:.2f} | {mx:.2f} | {mx / me:.2f} | {cx[0]['compiles']} | {sum(c['compiles'] for c in cx[1:])} | "
              f"{max(c['to_host'] for c in cx)} | {acc_e:.4f} | {acc_x:.4f} |", flush=True)

if __name__ == '__main__': main()
