"""fastai's Imagenette script, ported to XLA as the README's "from fastai's GPU scripts" tells (`examples/train_imagenette.py`):
run as a user runs it, in a fresh process through `xmp.spawn` (one replica on the CPU XLA device), offline on the
digits written in Imagenette's folder layout: fastai's `DataBlock` with `GrandparentSplitter`, `xresnet18` with
`Mish` (its pooling as the XLA version: no CPU fallback), `ranger`, `LabelSmoothingCrossEntropy`, `MixUp`,
`fit_flat_cos`, `top_k_accuracy`. Not covered: several TPU cores, Imagenette itself (a download)."""
import os, re, subprocess, sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent/'examples'/'train_imagenette.py'

def test_fastai_imagenette_script_ported_to_xla(tmp_path):
    env = {**os.environ, 'PJRT_DEVICE': 'CPU'}
    r = subprocess.run([sys.executable, str(SCRIPT), '--epochs', '1', '--size', '16', '--arch', 'xresnet18', '--mixup', '0.2',
                        '--out', str(tmp_path/'digits')], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    out = (r.stdout + r.stderr).replace('\r', '\n')
    assert r.returncode == 0, out[-4000:]
    rows = re.findall(r'^0\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+\d\d:\d\d', out, re.M)
    assert len(rows) == 1 and float(rows[0][2]) > 0.3, out[-3000:]          # it learns (1 epoch; 10 classes)
    assert 'CPU fallbacks: -' in out and 'XLAPerformanceWarning' not in out, out[-3000:]
    assert (tmp_path/'digits'/'train').is_dir() and (tmp_path/'digits'/'val').is_dir()
