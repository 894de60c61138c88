"""fastai's training features that real scripts use (fastai's own examples: MixUp, CutMix, label smoothing, ranger,
`fit_flat_cos`, callbacks that save, stop, log and draw, interpretation), each on the CPU XLA device against what it
does on eager CPU: it runs, it learns, it reads the device a few times per epoch (not per batch) and compiles nothing
after the first epoch. With 2 real replicas (gloo): callbacks that draw or write the master's view (`ShowGraphCallback`,
`CSVLogger`) and the diagnostics' warnings on the master only, fastai's `rank0_first` and `distrib_ctx` (`xla_distrib_ctx`) in a script,
standard output given back when the learner leaves the run.
Not covered: fastai's `fastai.distributed` itself (it needs HF accelerate and CUDA processes)."""
import os, subprocess, sys, warnings
from pathlib import Path
import pytest
from helpers import *
from fastai.callback.mixup import MixUp, CutMix
from fastai.losses import LabelSmoothingCrossEntropyFlat
from fastai.interpret import ClassificationInterpretation

def fit_both(make, fit, loss_func=None):
    "The same learner fitted on eager CPU and on XLA: (cpu, xla, XLA counters of each epoch, performance warnings)."
    cpu = make()
    with cpu.no_bar(), cpu.no_logging(): fit(cpu)
    counts = EpochCounters()
    xla = make().to_xla(seed=0)
    with warnings.catch_warnings(record=True) as caught, xla.no_bar(), xla.no_logging():
        warnings.simplefilter('always')
        fit(xla, counts)
    return cpu, xla, counts.epochs, [str(w.message) for w in caught if issubclass(w.category, XLAPerformanceWarning)]

FEATURES = {'MixUp': (dict(), lambda l, *c: l.fit_one_cycle(3, 1e-2, cbs=[MixUp(), *c])),
            'CutMix': (dict(), lambda l, *c: l.fit_one_cycle(3, 1e-2, cbs=[CutMix(), *c])),
            'label smoothing': (dict(loss_func=LabelSmoothingCrossEntropyFlat()), lambda l, *c: l.fit_flat_cos(3, 1e-2, cbs=list(c))),
            'ranger + fit_flat_cos': (dict(opt_func=ranger), lambda l, *c: l.fit_flat_cos(3, 1e-2, cbs=list(c)))}

@pytest.mark.parametrize('name', list(FEATURES))
def test_training_feature_learns_like_eager_and_stays_steady(name):
    kwargs, fit = FEATURES[name]
    cpu, xla, epochs, perf = fit_both(lambda: digits_learner(**kwargs), fit)
    assert perf == [], perf
    assert all(e['compiles'] == 0 for e in epochs[1:]), epochs
    assert all(e['to_host'] <= 12 for e in epochs), epochs              # per epoch of ~28 batches: the phase ends, not each batch
    assert abs(final(xla, 'accuracy') - final(cpu, 'accuracy')) < 0.05, (final(xla, 'accuracy'), final(cpu, 'accuracy'))

def test_saving_stopping_logging_callbacks(tmp_path):
    learn = digits_learner(path=tmp_path).to_xla(seed=0)
    with learn.no_bar():
        learn.fit(3, 1e-2, cbs=[SaveModelCallback(every_epoch=True), CSVLogger(), EarlyStoppingCallback(patience=0, min_delta=10)])
    assert len(learn.recorder.values) == 2                                # stopped after no improvement of 10
    assert sorted(p.name for p in (tmp_path/'models').glob('model_*.pth')) == ['model_0.pth', 'model_1.pth']
    history = (tmp_path/'history.csv').read_text().splitlines()
    assert history[0].startswith('epoch,train_loss,valid_loss,accuracy') and len(history) == 3
    interp = ClassificationInterpretation.from_learner(learn)             # fastai's interpretation after an XLA fit
    assert interp.confusion_matrix().sum() == len(learn.dls.valid_ds)
    losses, idxs = interp.top_losses(3)
    assert not off_host(losses) and losses[0] >= losses[-1]

def test_channels_last_and_fp16_are_refused_with_what_to_call():
    learn = digits_learner().to_xla(seed=0)
    with pytest.raises(ValueError, match="to_channelslast\\(amp_mode='bf16'\\)"): learn.to_channelslast()
    with pytest.raises(ValueError, match='use bfloat16'): learn.to_fp16()
    learn.to_channelslast(amp_mode='bf16')
    with learn.no_bar(): learn.fit(1, 1e-2)
    assert final(learn, 'accuracy') > 0.5

def draw_and_log(learn, out_dir):
    learn.path = Path(out_dir, f'replica{replica_ordinal()}')
    learn.path.mkdir()
    learn.model.add_module('falls_back', FallsBack())                     # something that makes the diagnostics warn
    learn.fit(2, 1e-2, cbs=[ShowGraphCallback(), CSVLogger()])

class FallsBack(nn.Module):
    "An operation torch_xla does not lower (adaptive max pooling to a size that does not divide the input's), every batch."
    def forward(self, x): return x + 0 * F.adaptive_max_pool1d(x[:, None], 3).sum()

def test_master_only_callbacks_and_warnings_on_two_replicas(tmp_path, capfd):
    learn = digits_learner(bs=32)
    learn.launch(draw_and_log, str(tmp_path), nprocs=2, transport='gloo')
    err = capfd.readouterr().err
    told = [l.split('XLAPerformanceWarning: ')[1] for l in err.splitlines() if 'XLAPerformanceWarning: ' in l]
    assert sum('without an XLA lowering' in t for t in told) == 1, err[-3000:]   # told once, by the master, not once per replica
    assert len(told) == len(set(told)), err[-3000:]                # (the read may also cut a graph late: told once too)
    assert (tmp_path/'replica0'/'history.csv').exists() and not (tmp_path/'replica1'/'history.csv').exists()   # (ShowGraphCallback, which needs the progress bar only the master has, ran there alone)

FASTAI_GPU_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from helpers import *
from pathlib import Path
def prepare():
    Path('prepared').mkdir(exist_ok=True)
    seen = len(list(Path('prepared').iterdir()))
    if replica_ordinal() == 0: Path('prepared', 'done').write_text('x')   # (written before the others may start)
    return seen
seen = rank0_first(prepare)                                  # fastai's rank0_first: the master first, then the others
learn = linear_digits_learner()
with learn.xla_distrib_ctx():                                 # fastai's distrib_ctx: a replica of the run inside
    learn.fit(1, 1e-2)
    ours = replica_count()
    print('INSIDE', replica_ordinal())                        # (the master's alone: the others' output is dropped)
print('REPLICA', replica_ordinal(), 'OF', ours, 'SAW', seen, 'ACC', learn.recorder.values[-1][-1], 'BACK', not is_xla_learner(learn))
"""

def test_fastai_gpu_script_calls_on_two_replicas(tmp_path):
    (tmp_path/'train.py').write_text(FASTAI_GPU_SCRIPT.format(tests=str(Path(__file__).parent)))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, 'train.py'], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **gloo_replica_env(rank, 2, port)}) for rank in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[1][1][-3000:] + outs[0][1][-3000:]
    lines = sorted(l for o, _ in outs for l in o.splitlines() if l.startswith('REPLICA'))
    inside = [l for o, _ in outs for l in o.splitlines() if l.startswith('INSIDE')]
    assert inside == ['INSIDE 0'], inside                          # in the run, replica 1's print is dropped
    assert len(lines) == 2, lines                                  # after it (`detach_xla`), standard output is given back
    assert lines[0].startswith('REPLICA 0 OF 2 SAW 0 ACC') and lines[0].endswith('BACK True'), lines
    assert lines[1].startswith('REPLICA 1 OF 2 SAW 1 ACC') and lines[1].endswith('BACK True'), lines
