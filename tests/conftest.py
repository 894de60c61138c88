import os
os.environ.setdefault('PJRT_DEVICE', 'CPU')

def pytest_configure(config):
    config.addinivalue_line('markers', 'notebooks: executes the notebooks in nbs/ (the first pass of scripts/test.sh runs them with nbdev_test instead)')
