"""The `torch.backends` entry point of the eager tpu test device (tests/eager_tpu_test_device-0.dist-info): PyTorch calls
`autoload` at `import torch` in every process with tests/ on its path; it loads the device (tests/eager_tpu.py) only where
the process asked for it, `FASTAI_XLA_EAGER_TPU=1` (which importing eager_tpu sets for the processes it starts)."""
import os

def autoload():
    if os.environ.get('FASTAI_XLA_EAGER_TPU') == '1': import eager_tpu  # noqa: F401 (its import registers the device)
