"""fastai's example scripts, ported to XLA as the README's "From fastai's GPU scripts" tells, each run as a user runs
it, in a fresh process (one replica on the CPU XLA device), offline on data written in the script's folder layout:
- Imagenette (`examples/train_imagenette.py`, through `xmp.spawn`): fastai's `DataBlock` with `GrandparentSplitter`,
  `xresnet18` with `Mish` (its pooling as the XLA version: no CPU fallback), `ranger`, `LabelSmoothingCrossEntropy`,
  `MixUp`, `fit_flat_cos`, `top_k_accuracy`;
- tabular (`examples/train_tabular.py`, through fastai_xla's `spawn` and `learn.xla_distrib_ctx()`): `from_csv` with
  `Categorify`, `FillMissing`, `Normalize`, `tabular_learner`, `fit_one_cycle`;
- IMDB (`examples/train_imdbclassifier.py`): `TextDataLoaders.from_folder(valid='test')`, `rank0_first`,
  `text_classifier_learner(AWD_LSTM, drop_mult=0.5)` (small, not pretrained), `fine_tune`.
Not covered: several TPU cores, the real datasets and fastai's pretrained WikiText-103 weights (downloads)."""
import os, re, subprocess, sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent/'examples'

def run_example(script, tmp_path, *args):
    "The output of `python examples/script args` in `tmp_path`, which must end well."
    r = subprocess.run([sys.executable, str(EXAMPLES/script), *args], capture_output=True, text=True, timeout=900,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU'}, cwd=tmp_path)
    out = (r.stdout + r.stderr).replace('\r', '\n')
    assert r.returncode == 0, out[-4000:]
    assert 'XLAPerformanceWarning' not in out and 'shadowing an attribute' not in out, out[-3000:]
    return out

def test_fastai_imagenette_script_ported_to_xla(tmp_path):
    out = run_example('train_imagenette.py', tmp_path, '--epochs', '1', '--size', '16', '--arch', 'xresnet18', '--mixup', '0.2',
                      '--out', str(tmp_path/'digits'))
    rows = re.findall(r'^0\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+\d\d:\d\d', out, re.M)
    assert len(rows) == 1 and float(rows[0][2]) > 0.3, out[-3000:]          # it learns (1 epoch; 10 classes)
    assert 'CPU fallbacks: -' in out, out[-3000:]
    assert (tmp_path/'digits'/'train').is_dir() and (tmp_path/'digits'/'val').is_dir()

def accuracies(out):
    "The accuracy column of fastai's epoch tables in `out`."
    return [float(a) for a in re.findall(r'^\d+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+\d\d:\d\d', out, re.M)]

def epoch_rows(out):
    "How many rows fastai's epoch tables in `out` have (a wide number can run into the next column: no columns parsed)."
    return len(re.findall(r'^\d+\s+[0-9.]+\s.*\d\d:\d\d\s*$', out, re.M))

def test_fastai_tabular_script_ported_to_xla(tmp_path):
    out = run_example('train_tabular.py', tmp_path, '--epochs', '2', '--out', 'table')
    # (the validation loss can be huge: a pixel column constant over the training rows, normalized by its ~0 std)
    final = re.findall(r'^final accuracy: ([0-9.]+)$', out, re.M)
    assert epoch_rows(out) == 2 and len(final) == 1 and float(final[0]) > 0.5, out[-3000:]   # 10 classes, and it learns
    assert (tmp_path/'table'/'digits.csv').exists()

def test_fastai_imdb_script_ported_to_xla(tmp_path):
    out = run_example('train_imdbclassifier.py', tmp_path, '--epochs', '1', '--small', '--out', 'texts')
    acc = accuracies(out)
    assert len(acc) == 2, out[-3000:]                                        # fine_tune: the frozen epoch, then one
    assert len(set(p.parent.name for p in (tmp_path/'texts'/'test').glob('*/*.txt'))) > 1
