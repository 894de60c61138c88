"""The device layer, each case in a fresh Python process (device choice and runtime state
are per process): the CPU fallback notice, a clear error when torch_xla is not installed
(a real environment without it: the test's site-packages lack torch_xla), and the
autograd-before-XLA trap."""
import os, subprocess, sys, textwrap
from pathlib import Path
import pytest

ROOT = Path(__file__).parent.parent

def run_py(code, env=None, python_args=()):
    env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, *python_args, '-c', textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)

def test_no_tpu_falls_back_to_the_cpu_xla_device_with_a_notice():
    env = {k: v for k, v in os.environ.items() if k != 'PJRT_DEVICE'}
    r = subprocess.run([sys.executable, '-c', 'from fastai_xla.core import *; print(xla_device(), device_kind())'],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert 'no TPU found, using the CPU XLA device (PJRT_DEVICE=CPU)' in r.stdout
    assert r.stdout.strip().endswith('xla:0 CPU')

def test_user_choice_of_pjrt_device_is_kept():
    r = run_py('from fastai_xla.core import *; print(xla_device(), device_kind())', env={'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0 and 'no TPU found' not in r.stdout and r.stdout.strip().endswith('CPU')

@pytest.fixture
def site_without_torch_xla(tmp_path):
    "A site-packages with everything installed here except torch_xla (symlinks)."
    import torch
    site = Path(torch.__file__).parent.parent
    out = tmp_path/'site'; out.mkdir()
    for p in site.iterdir():
        if not p.name.lower().startswith(('torch_xla', 'libtpu')): (out/p.name).symlink_to(p)
    return out

def test_missing_torch_xla_gives_the_install_command(site_without_torch_xla):
    code = f'''
        import sys; sys.path[:0] = [{str(site_without_torch_xla)!r}, {str(ROOT)!r}]
        import fastai_xla.core as core
        try: core.xla_device()
        except ImportError as e: print('ERROR:', e)
    '''
    r = run_py(code, python_args=('-S',))
    assert "ERROR: fastai_xla's torch_xla backend needs torch_xla, which is not installed" in r.stdout, r.stdout + r.stderr
    import torch
    release = torch.__version__.split('+')[0]      # the hint keeps the installed torch: 2.9.0 here, 2.8.0 on the Kaggle-like stack
    assert f"pip install torch=={release} torchvision==" in r.stdout and f"'torch_xla=={release}'" in r.stdout, r.stdout

def test_cpu_backward_before_the_xla_device_gives_a_clear_error():
    code = '''
        import torch
        from fastai.basics import *
        from fastai_xla.all import *
        from fastai_xla.demo import digits_dls
        x = torch.randn(3, requires_grad=True); (x*2).sum().backward()   # a CPU backward pass first
        learn = Learner(digits_dls(), nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
        try: learn.to_xla()
        except RuntimeError as e: print('ERROR:', e)
    '''
    r = run_py(code)
    assert "ERROR: PyTorch's autograd engine started before the XLA device existed" in r.stdout, r.stdout + r.stderr
    assert 'Restart the Python process' in r.stdout
