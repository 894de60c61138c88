"""`python -m fastai_xla.check`, the self-check a user runs on their TPU, run here as a user runs it: on this machine's one
CPU XLA device, whose collectives it runs through `XLA_ALWAYS_ALLREDUCE=1`, every way of running in a process of its own."""
import json, os, subprocess, sys

def check(env=None, *args):
    return subprocess.run([sys.executable, '-m', 'fastai_xla.check', *args], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})

def test_the_self_check_passes_here_and_names_the_versions():
    r = check({'PJRT_DEVICE': 'CPU'}, '--json')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout)
    env, checks = res['environment'], res['checks']
    import torch, fastai
    assert env['torch'] == torch.__version__.split('+')[0] or env['torch'] == torch.__version__, env
    assert env['fastai'] == fastai.__version__ and env['fastai_xla'] and env['python'] and env['backend'] == 'torch_xla', env
    passed = [c['name'] for c in checks if c['ok'] and not c.get('skipped')]
    assert len(passed) >= 5, checks
    for name in ('collectives: all-reduce and gather of the ordinals', 'shards: disjoint, covering', 'a fit: it learns, no compile after epoch 1',
                 'metrics: exact over the whole validation set', 'learn.launch from a notebook', 'bfloat16 mixed precision',
                 "torchrun: this replica's place, chips and collectives", 'torchrun: a fit: it learns, no compile after epoch 1',
                 "torchrun: the gradients' collectives where torch_xla runs them"):
        assert name in passed, (name, checks)
    place = next(c for c in checks if c['name'] == "torchrun: this replica's place, chips and collectives")['detail']
    assert "rank 0 of 2 (local 0 of 2)" in place and "torch_xla's set-up done" in place and '[2 replicas]' in place, place

def test_a_failing_torchrun_replica_is_named():
    """`--only torchrun` on a device the runtime does not know: every replica fails at its start, named, exit status 1. (The
    torchrun form on the native backend passes in the default check on the eager `tpu` test device: tests/test_eager_tpu.py,
    in scripts/test.sh's native pass.)"""
    r = check({'PJRT_DEVICE': 'NOSUCH'}, '--timeout', '240', '--only', 'torchrun')
    assert r.returncode == 1 and 'FAIL  torchrun: replicas start and agree' in r.stdout and 'NOSUCH' in r.stdout, r.stdout[-3000:]

def test_a_failing_check_is_reported_and_fails_the_command():
    """A device the runtime does not know: the way of running checked (`--only launch`: one process, not three) fails, by
    name, and the command exits with status 1."""
    r = check({'PJRT_DEVICE': 'NOSUCH'}, '--timeout', '240', '--only', 'launch')
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'FAIL  learn.launch from a notebook' in r.stdout and 'NOSUCH' in r.stdout and 'please paste this report' in r.stdout, r.stdout
    assert 'to_tpu_spmd' not in r.stdout and 'replicas start and agree' not in r.stdout, r.stdout   # (the others not run)
