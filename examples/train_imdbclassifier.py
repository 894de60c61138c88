"""fastai's IMDB script (fastai's own `nbs/examples/train_imdbclassifier.py`: `TextDataLoaders.from_folder`,
`text_classifier_learner` with `AWD_LSTM`, `rank0_first`, `fine_tune`), ported as the README's "From fastai's GPU
scripts" tells: the same fastai calls, `rank0_first` and `learn.xla_distrib_ctx()` from fastai_xla (fastai's need HF
accelerate and a GPU), `to_bf16()` for `to_fp16()`, and `spawn` for `python -m fastai.launch`.

    python examples/train_imdbclassifier.py --data PATH [--epochs 5 --lr 1e-2 --bs 64 --bf16]
    python examples/train_imdbclassifier.py --epochs 2 --small     # offline: docstrings in IMDB's layout

PATH is a folder in IMDB's layout (`train/<label>/*.txt`, `test/<label>/*.txt`). Without `--data`, docstrings of
installed libraries are written in that layout (labelled by the library they document, every fourth one in `test/`),
and the model is not pretrained (fastai's WikiText-103 weights are a download; `--pretrained` takes them);
`--small` makes the AWD-LSTM small (a quick run). On a TPU every core trains; on a CPU-only machine one replica
runs on the CPU XLA device."""
import argparse
from pathlib import Path
from fastai_xla.all import *          # first: it picks the device
from fastai.text.all import *
from fastai_xla.demo import docstrings_frame

def docstrings_in_imdb_layout(path:Path) -> Path:
    "Docstrings as `path/train/<library>/<n>.txt` and `path/test/<library>/<n>.txt` (every fourth held out)."
    if (path/'test').exists(): return path
    for i, (text, label) in enumerate(docstrings_frame()[['text', 'label']].itertuples(index=False)):
        dest = path/('test' if i % 4 == 0 else 'train')/label/f'{i}.txt'
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    return path

def train(index, a):
    path = Path(a.data) if a.data else rank0_first(docstrings_in_imdb_layout, Path(a.out))
    dls = TextDataLoaders.from_folder(path, bs=a.bs, valid='test')
    pretrained = a.pretrained if a.pretrained is not None else bool(a.data)
    config = dict(awd_lstm_clas_config, emb_sz=64, n_hid=96, n_layers=2) if a.small else None
    for run in range(a.runs):
        print(f'Rank[{replica_ordinal()}] Run: {run}; epochs: {a.epochs}; lr: {a.lr}; bs: {a.bs}')
        learn = rank0_first(lambda: text_classifier_learner(dls, AWD_LSTM, drop_mult=0.5, metrics=accuracy,
                                                            pretrained=pretrained, config=config))
        if a.dump: print(learn.model); return
        if a.bf16: learn = learn.to_bf16()             # (the GPU script's `to_fp16()`)
        with learn.xla_distrib_ctx():                   # (the GPU script's `distrib_ctx(cuda_id=gpu)`)
            learn.fine_tune(a.epochs, a.lr)
            if learn.xla_run.is_master: print(f'final accuracy: {float(learn.recorder.values[-1][-1]):.4f}')

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--data', help="a folder in IMDB's layout (default: docstrings, written to --out)")
    p.add_argument('--out', default='docstrings_imdb')
    p.add_argument('--lr', type=float, default=1e-2); p.add_argument('--bs', type=int, default=64)
    p.add_argument('--epochs', type=int, default=5)
    p.add_argument('--pretrained', type=int, default=None, help="fastai's WikiText-103 weights (default: with --data)")
    p.add_argument('--small', action='store_true', help='a small AWD-LSTM (emb_sz 64, n_hid 96, 2 layers)')
    p.add_argument('--bf16', action='store_true', help='bfloat16 autocast (the GPU script has --fp16)')
    p.add_argument('--dump', action='store_true', help="print the model; don't train")
    p.add_argument('--runs', type=int, default=1, help='number of times to repeat training')
    a = p.parse_args()
    spawn(train, args=(a,))                            # one process per TPU core (one replica on a CPU-only machine)
