import os
os.environ.setdefault('PJRT_DEVICE', 'CPU')
import pytest

def pytest_configure(config):
    config.addinivalue_line('markers', 'readme: runs the README snippets as written (slow; the first pass of scripts/test.sh only)')
    config.addinivalue_line('markers', 'text: fastai text learners end to end (slow; the first pass of scripts/test.sh only, the second runs nbs/11_text)')
    config.addinivalue_line('markers', 'notebooks: executes the notebooks in nbs/ (the first pass of scripts/test.sh runs them with nbdev_test instead)')

@pytest.fixture(scope='session', autouse=True)
def xla_first():
    "Start the XLA device before any test runs a CPU backward pass (see `fastai_xla.core.check_autograd`)."
    from fastai_xla.core import xla_device
    return xla_device()

def pytest_collection_modifyitems(config, items):
    "fastai's star imports bring fastcore's `test_eq`, `test_fail`...: they are helpers, not tests."
    ours = lambda i: getattr(getattr(i, 'obj', None), '__module__', '').split('.')[0] not in ('fastcore', 'fastai', 'torch')
    items[:] = [i for i in items if ours(i)]
