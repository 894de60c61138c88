"""fastai's tabular script (fastai's own `nbs/examples/train_tabular.py`: `TabularDataLoaders.from_csv` with
`Categorify`, `FillMissing`, `Normalize`, `tabular_learner`, `fit_one_cycle`), ported as the README's "From fastai's
GPU scripts" tells: the same fastai calls; `learn.xla_distrib_ctx()` (for XLA replicas) where the GPU
script picks `parallel_ctx` or `distrib_ctx`; `to_bf16()` for `to_fp16()`; `spawn` for `python -m fastai.launch`.

    python examples/train_tabular.py --data PATH [--epochs 5 --bf16 --runs 1 --dump]
    python examples/train_tabular.py --epochs 3        # offline: the digits as a CSV table

PATH is the folder of fastai's ADULT_SAMPLE (`adult.csv`, the column `salary` predicted from fastai's choice of
categorical and continuous columns). Without `--data`, scikit-learn's digits are written as `digits.csv` in `--out`
(the middle row's 8 pixels as categories, the other 56 continuous, the column `digit` predicted), so that it runs
offline. On a TPU every core trains; on a CPU-only machine one replica runs on the CPU XLA device."""
import argparse
from pathlib import Path
from fastai_xla.all import *          # first: it picks the device
from fastai.tabular.all import *
from fastai_xla.demo import digits_frame

ADULT = dict(csv='adult.csv', y='salary', cats=['workclass', 'education', 'marital-status', 'occupation', 'relationship', 'race'],
             conts=['age', 'fnlwgt', 'education-num'])

def digits_table(path:Path) -> dict:
    "scikit-learn's digits written as `path/digits.csv`; the table's description, as `ADULT`."
    df, cats, conts = digits_frame()
    df['digit'] = 'digit ' + df['digit']        # (a word, as adult's `salary`: read back from the CSV, numbers would make a regression)
    path.mkdir(parents=True, exist_ok=True)
    if not (path/'digits.csv').exists(): df.to_csv(path/'digits.csv', index=False)
    return dict(csv='digits.csv', y='digit', cats=cats, conts=conts)

def get_dls(path:Path, table:dict, bs:int):
    "fastai's tabular loaders of the script: from the CSV file, categories made numbers, missing values filled, normalized."
    return TabularDataLoaders.from_csv(path/table['csv'], path=path, y_names=table['y'], cat_names=table['cats'],
                                       cont_names=table['conts'], procs=[Categorify, FillMissing, Normalize], bs=bs)

def train(index, a):
    path = Path(a.data) if a.data else Path(a.out)
    table = ADULT if a.data else rank0_first(digits_table, path)      # (the master writes the file, then the others read it)
    dls = get_dls(path, table, a.bs)
    print(f'epochs: {a.epochs};')
    for run in range(a.runs):
        print(f'Run: {run}')
        learn = tabular_learner(dls, metrics=accuracy)
        if a.dump: print(learn.model); return
        if a.bf16: learn = learn.to_bf16()                # (the GPU script's `to_fp16()`)
        with learn.xla_distrib_ctx():                     # (the GPU script's `parallel_ctx` or `distrib_ctx`)
            learn.fit_one_cycle(a.epochs)
            if learn.xla_run.is_master: print(f'final accuracy: {float(learn.recorder.values[-1][-1]):.4f}')

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--data', help="the ADULT_SAMPLE folder (default: the digits, written to --out)")
    p.add_argument('--out', default='digits_table')
    p.add_argument('--epochs', type=int, default=5); p.add_argument('--bs', type=int, default=64)
    p.add_argument('--bf16', action='store_true', help='bfloat16 autocast (the GPU script has --fp16)')
    p.add_argument('--dump', action='store_true', help="print the model; don't train")
    p.add_argument('--runs', type=int, default=1, help='number of times to repeat training')
    a = p.parse_args()
    spawn(train, args=(a,))                               # one process per TPU core (one replica on a CPU-only machine)
