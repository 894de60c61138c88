"""TorchTPU (`torch-tpu` 0.2.0, torch 2.13): what runs without a TPU chip. `scripts/test.sh` runs this file in
`.venv-torchtpu` (Python 3.11, torch 2.13.0 (CPU), torch-tpu 0.2.0 and its libtpu, the newest fastai, no torch_xla):
the package imports, Google's TorchTPU is recognised, and every way of asking for a backend fails with an error that
says why (never an abort). Not run here (no chip): training on the `tpu` device, `tpu_dist` collectives, TorchTPU's
launch environment, rng states on the device. In the other environments (no torch-tpu) every test here is skipped.
torchvision's PyPI wheel does not load with the CPU build of torch 2.13 installed here (the CUDA build would add ~4 GB of
CUDA libraries), so these tests use fastai_xla's modules that do not import fastai.vision (`fastai_xla.all` does)."""
import os, sys, subprocess, importlib.util
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec('torch_tpu') is None, reason='needs torch-tpu (.venv-torchtpu)')

def run_py(code, **env):
    "Run `code` in a fresh Python of this environment: TorchTPU loads itself when torch is imported."
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'PYTHONWARNINGS': 'ignore', **env})

LEARNER = """
import torch
from sklearn.datasets import load_digits
from fastai.basics import *
from fastai_xla.distributed import *
x, y = load_digits(return_X_y=True)
ds = [(torch.tensor(a, dtype=torch.float32), torch.tensor(b)) for a, b in zip(x, y)]
dls = DataLoaders.from_dsets(ds[:1400], ds[1400:], bs=64, num_workers=0)
learn = Learner(dls, nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), loss_func=CrossEntropyLossFlat(), metrics=accuracy)
"""
# (no `fit` on the CPU here: with torch-tpu 0.2.0 installed and no chip, a CPU backward pass hangs in torch's autograd
# engine, seen with fastai's own fit; TorchTPU's device guard is the likely cause)

def test_google_torchtpu_is_recognised_and_the_package_imports():
    import torch, fastai  # noqa: F401 (that they import is the test)
    from fastai_xla.distributed import to_tpu_distributed  # noqa: F401
    from fastai_xla.backend import google_torch_tpu, tpu_pci_devices
    assert google_torch_tpu() == '0.2.0'
    assert torch.__version__.startswith('2.13') and not tpu_pci_devices()             # this machine has no chip
    assert torch.accelerator.current_accelerator() is None                            # and torch says so too
    assert importlib.util.find_spec('torch_xla') is None

def test_native_backend_without_a_chip_is_a_clear_error_not_an_abort():
    from fastai_xla.backend import backend_for
    from fastai_xla.settings import Settings
    with pytest.raises(RuntimeError, match='no TPU chip'): backend_for(Settings(backend='native'))
    # a fastai learner asked onto the native backend, in a process of its own: an error and exit status 1, not SIGABRT
    res = run_py(LEARNER + "learn.to_tpu_distributed(backend='native')")
    assert res.returncode == 1 and 'this machine has no TPU chip' in res.stderr, (res.returncode, res.stderr[-2000:])
    res = run_py("from fastai_xla.core import xla_device\nxla_device()", FASTAI_XLA_BACKEND='native')
    assert res.returncode == 1 and 'this machine has no TPU chip' in res.stderr, (res.returncode, res.stderr[-2000:])

def test_torch_xla_backend_says_torch_xla_is_missing_and_names_torchtpu():
    from fastai_xla.backend import backend_for
    from fastai_xla.settings import Settings
    with pytest.raises(ImportError, match="needs torch_xla, which is not installed") as e: backend_for(Settings(backend='torch_xla'))
    assert "FASTAI_XLA_BACKEND=native" in str(e.value)
    with pytest.raises(ImportError, match='not installed'): backend_for(Settings())      # chosen from the machine: no chip, no torch_xla

def test_nprocs_is_checked_against_the_tpu_generation():
    from fastai_xla.backend_native import check_nprocs
    assert check_nprocs(8, ['0x006f'] * 8) == 8                                 # v6e: 1, 4 or 8
    with pytest.raises(ValueError, match='not 2'): check_nprocs(2, ['0x006f'] * 8)
    with pytest.raises(ValueError, match='v7'): check_nprocs(1, ['0x0076'] * 8)   # v7: 2, 4 or 8
