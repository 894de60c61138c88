"""One replica on the CPU XLA device (PJRT_DEVICE=CPU): real fastai learners on scikit-learn
data. Covers fastai_xla's single-device path end to end: device placement, optimizer
re-binding, graph boundaries, padding, device-side metrics, checkpoints. Every comparison
with eager training runs the same seed and schedule on torch's CPU device."""
import os, sys, warnings
import pytest, torch
from helpers import *

def test_digits_cnn_matches_eager_cpu():
    cpu = digits_learner(); cpu.fit_one_cycle(4, 1e-2)
    xla = digits_learner().to_xla(seed=0); xla.fit_one_cycle(4, 1e-2)
    acc_cpu, acc_xla = final(cpu, 'accuracy'), final(xla, 'accuracy')
    assert acc_xla > 0.9, acc_xla
    assert abs(acc_xla - acc_cpu) <= 0.02, (acc_cpu, acc_xla)

def test_tabular_with_embeddings_matches_eager_cpu():
    cpu = tabular_digits_learner(); cpu.fit_one_cycle(4, 1e-2)
    xla = tabular_digits_learner().to_xla(seed=0)
    assert isinstance(xla.model.embeds[0].weight, torch.nn.Parameter)
    xla.fit_one_cycle(4, 1e-2)
    acc_cpu, acc_xla = final(cpu, 'accuracy'), final(xla, 'accuracy')
    assert all(on_train_device(p) for p in xla.model.parameters())
    assert acc_xla > 0.9, acc_xla
    assert abs(acc_xla - acc_cpu) <= 0.02, (acc_cpu, acc_xla)

def test_new_loaders_on_a_converted_learner_train():
    """`learn.dls = other` on a converted learner (issue 58): the new loaders become this run's XLA loaders, and the next fit
    trains the model on the device. Before, fastai's `TrainEvalCallback` moved the model to the host with them: its
    parameters left the optimizer's behind, and the second fit moved the weights by 0.0, silently."""
    learn = tabular_digits_learner().to_xla(seed=0)
    learn.fit_one_cycle(2, 1e-2)
    other = tabular_digits_learner(bs=32).dls
    learn.dls = other
    before = [to_host(p).clone() for p in learn.model.parameters()]
    learn.fit_one_cycle(2, 1e-3)
    assert learn.dls.cpu_dls is other and all(on_train_device(p) for p in learn.model.parameters())
    stepped = {id(p) for pg in learn.opt.param_lists for p in pg}
    assert all(id(p) in stepped for p in learn.model.parameters())           # the optimizer steps the model's own parameters
    moved = max((to_host(p) - b).abs().max().item() for p, b in zip(learn.model.parameters(), before))
    assert moved > 1e-4 and final(learn, 'accuracy') > 0.9, (moved, final(learn, 'accuracy'))

def test_fit_5_compiles_at_most_5_graphs_and_none_after_epoch_1():
    counts = EpochCounters()
    learn = digits_learner(cbs=counts).to_xla(seed=0)
    learn.fit(5, 1e-2)
    compiles = [e['compiles'] for e in counts.epochs]
    # the first training step, the usual one, a full validation batch, the padded last one's forward and its cut to real rows
    assert sum(compiles) <= 5, compiles
    assert compiles[1:] == [0, 0, 0, 0], compiles

class FitCounters(Callback):
    "XLA counters of each epoch of each fit: `fits[i][e]`."
    order = 100
    def __init__(self): self.fits = []
    def before_fit(self): self.fits.append([])
    def before_epoch(self): self.c0 = xla_counters()
    def after_epoch(self): self.fits[-1].append(counters_diff(xla_counters(), self.c0))

def two_group_splitter(m): return [params(m[:2]), params(m[2:])]   # fine_tune freezes the first group

SCHEDULES = {'fit_one_cycle': lambda l: l.fit_one_cycle(5, 1e-2),     # fastai's Adam, wd=0.01, lr down to lr_max/1e5
             'fit_flat_cos': lambda l: l.fit_flat_cos(4, 1e-2),
             'fit_sgdr': lambda l: l.fit_sgdr(2, 2, 1e-2),
             'fine_tune': lambda l: l.fine_tune(2, 1e-2, freeze_epochs=2),   # (then discriminative rates: slice(1e-4, 1e-2))
             'ParamScheduler': lambda l: l.fit(3, cbs=ParamScheduler({'lr': combine_scheds([0.3, 0.7], [SchedLin(1e-3, 1e-2),
                                                                        SchedExp(1e-2, 1e-4)]), 'mom': SchedCos(0.95, 0.85)})),
             'bf16_fit_one_cycle': lambda l: l.to_bf16().fit_one_cycle(4, 1e-2)}

def small_steps_learner(counts, **kwargs):
    "A linear model on the digits in batches of 4: 360 training steps an epoch, cheap ones."
    set_seed(0, reproducible=True)
    return Learner(digits_dls(bs=4, seed=42), nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
                   loss_func=CrossEntropyLossFlat(), metrics=accuracy, cbs=counts, splitter=two_group_splitter, **kwargs).to_xla(seed=0)

# every weight decay, schedule, decoupled (fastai's `true_wd`) or L2 decay, weight decay on batch norm and bias, and
# discriminative learning rates, at least once: (wd, schedule, Adam's keywords, Learner's keywords, lr)
HYPER_SWEEP = [(0., 'fit_one_cycle', {}, {}, 1e-2), (1e-4, 'fit_flat_cos', dict(decouple_wd=False), {}, 1e-2),
               (0.01, 'fit_sgdr', {}, dict(wd_bn_bias=True), 1e-2), (0.1, 'fit_one_cycle', {}, {}, 1e-2),
               (1., 'fit_one_cycle', {}, {}, slice(1e-4, 1e-2)), (0.1, 'fit_flat_cos', dict(decouple_wd=False), dict(wd_bn_bias=True), slice(1e-4, 1e-2))]

@pytest.mark.parametrize('wd,schedule,adam,learner,lr', HYPER_SWEEP, ids=[f'wd{c[0]}-{c[1]}-{i}' for i, c in enumerate(HYPER_SWEEP)])
def test_no_hyper_parameter_value_compiles_late(wd, schedule, adam, learner, lr):
    """Long enough to cross what a short fit never reaches: fastai's smoothed loss divides by `1 - 0.98**n`, which rounds
    to 1.0 in float32 from step 858 on (torch_xla then traced a constant 1.0 into a new graph: a compile in the third epoch)."""
    counts = FitCounters()
    learn = small_steps_learner(counts, wd=wd, opt_func=partial(Adam, **adam), **learner)
    with learn.no_bar(), learn.no_logging():
        if schedule == 'fit_sgdr': learn.fit_sgdr(2, 1, lr)          # 1 + 2 epochs
        else: getattr(learn, schedule)(3, lr)
    epochs = counts.fits[0]
    assert len(epochs) * len(learn.dls.train) > 1000
    assert [e['compiles'] for e in epochs[1:]] == [0] * (len(epochs) - 1), epochs

@pytest.mark.parametrize('schedule', list(SCHEDULES))
def test_fastai_schedules_compile_in_the_first_epoch_only(schedule):
    "fastai's schedules with fastai's default optimizer: no graph after a fit's first epoch, a few reads an epoch, no performance warning, the plots drawn."
    counts = FitCounters()
    learn = digits_learner(cbs=counts, splitter=two_group_splitter).to_xla(seed=0)
    with warnings.catch_warnings(record=True) as caught, learn.no_bar(), learn.no_logging():
        warnings.simplefilter('always')
        SCHEDULES[schedule](learn)
    late = [[e['compiles'] for e in fit[1:]] for fit in counts.fits]
    assert all(c == 0 for fit in late for c in fit), (schedule, late)
    assert all(e['to_host'] <= 12 for fit in counts.fits for e in fit), counts.fits
    assert not [w for w in caught if issubclass(w.category, XLAPerformanceWarning)], [str(w.message) for w in caught]
    assert final(learn, 'accuracy') > 0.6      # it learned (fine_tune with a random-init body: 0.66 on eager CPU)
    learn.recorder.plot_loss(); learn.recorder.plot_sched()

def test_two_step_epochs_compile_in_the_first_epoch_only():
    """Issue 58, finding 3: with 2 training steps an epoch, fit_one_cycle's momentum passes 0.9 in epoch 1, where Adam's
    `1 - mom` (0.1) equalled BatchNorm's momentum (0.1); torch_xla's cache of Python numbers gave both one graph input,
    a graph of its own that compiled in epoch 1 ([4, 1, 0, 0]). The grouped step now sends its numbers as tensors."""
    counts = FitCounters()
    learn = tabular_digits_learner(bs=718).to_xla(seed=0)
    learn.add_cb(counts)
    assert len(learn.dls.train) == 2
    with warnings.catch_warnings(record=True) as caught, learn.no_bar(), learn.no_logging():
        warnings.simplefilter('always')
        learn.fit_one_cycle(4, 1e-2)
    compiles = [e['compiles'] for e in counts.fits[0]]
    assert compiles[0] > 0 and compiles[1:] == [0, 0, 0], compiles
    assert not [w for w in caught if issubclass(w.category, XLAPerformanceWarning)], [str(w.message) for w in caught]

def rss_mb() -> float: return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20

def test_fits_in_a_row_leave_the_memory_where_it_was():
    """Ten fits of one learner in a row, then five new learners each converted, fitted and given back (a notebook's
    session): after the first fit (which compiles), this process's memory stays within 30 MB (measured: 2 MB)."""
    import gc
    learn, sizes = digits_learner().to_xla(seed=0), []
    for _ in range(10):
        with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
        gc.collect(); sizes.append(rss_mb())
    for _ in range(5):
        other = digits_learner().to_xla(seed=0)
        with other.no_bar(), other.no_logging(): other.fit(1, 1e-2)
        other.detach_xla(); del other
        gc.collect(); sizes.append(rss_mb())
    assert max(sizes) - sizes[0] < 30, sizes

def test_host_reads_per_epoch_do_not_grow_with_the_number_of_batches():
    reads = {}
    for bs in (64, 16):   # 22 and 89 training batches per epoch
        counts = EpochCounters()
        learn = digits_learner(bs=bs, cbs=counts).to_xla(seed=0)
        learn.fit(2, 1e-2)
        reads[bs] = counts.epochs[-1]['to_host']
        assert len(learn.dls.train) == 1438 // bs
    assert reads[16] == reads[64], reads      # a constant, not proportional to the batches
    assert reads[64] <= 12, reads

def test_fit_again_keeps_the_optimizer_on_the_model_parameters():
    learn = digits_learner().to_xla(seed=0)
    learn.fit(1, 1e-2)
    w0 = learn.model[-1].weight.detach().cpu().clone()
    learn.fit(1, 1e-2)
    model_params = {id(p) for p in learn.model.parameters()}
    assert all(id(p) in model_params for pg in learn.opt.param_lists for p in pg)
    assert not torch.equal(w0, learn.model[-1].weight.detach().cpu())    # the second fit trained

def test_optimizer_created_before_to_xla_is_rebound():
    "vision-style: the optimizer exists (on the CPU parameters) before the learner moves to XLA."
    learn = digits_learner()
    learn.create_opt()
    cpu_params = [p for pg in learn.opt.param_lists for p in pg]
    learn.to_xla(seed=0)
    assert all(on_train_device(p) for pg in learn.opt.param_lists for p in pg)
    assert device_is_host() or not any(p is q for pg in learn.opt.param_lists for p in pg for q in cpu_params)   # (moved, unless the device is the host)
    learn.fit(2, 1e-2)
    assert final(learn, 'accuracy') > 0.8

def test_save_load_then_fit(tmp_path):
    learn = digits_learner(path=tmp_path).to_xla(seed=0)
    learn.fit(1, 1e-2)
    learn.save('ckpt')
    state = torch.load(tmp_path/'models'/'ckpt.pth', weights_only=False)
    assert not off_host(next(iter(state['model'].values())))      # CPU tensors in the file
    acc = learn.validate()[1]
    learn.fit(1, 1e-2)
    learn.load('ckpt')
    test_close(learn.validate()[1], acc)
    learn.fit(1, 1e-2)                                          # the loaded optimizer state steps on the device
    assert all(on_train_device(v) for s in learn.opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)

def small_body(pretrained=False):
    "A body for `vision_learner` (3 input channels, as fastai's models, adapted to `n_in`; cut at its pooling layer): what"
    "freezing, unfreezing and `fine_tune` do does not depend on the body's size, and `resnet18` compiles for minutes here."
    return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.BatchNorm2d(32),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1))

class FirstBodyWeight(Callback):
    "The body's first convolution weight at the start and end of each fit."
    def before_fit(self): self.fits = getattr(self, 'fits', []) + [[self.weight()]]
    def after_fit(self): self.fits[-1].append(self.weight())
    def weight(self): return self.learn.model[0][0].weight.detach().cpu().clone()

def test_fine_tune_freezes_then_unfreezes():
    "fastai's `fine_tune` on XLA: its frozen fit leaves the body's convolutions where they were, the unfrozen one moves them."
    from fastai.vision.all import vision_learner
    set_seed(0)
    watch = FirstBodyWeight()
    learn = vision_learner(digits_dls(bs=64), small_body, pretrained=False, n_in=1, metrics=accuracy, cbs=watch).to_xla(seed=0)
    learn.fine_tune(1, freeze_epochs=1)
    (frozen0, frozen1), (tuned0, tuned1) = watch.fits
    assert torch.equal(frozen0, frozen1) and torch.equal(frozen1, tuned0)
    assert not torch.equal(tuned0, tuned1)
    assert final(learn, 'accuracy') > 0.5

def test_gradient_accumulation_steps_every_other_batch():
    steps = []
    class CountSteps(Callback):
        def after_step(self): steps.append(self.iter)
    learn = digits_learner(cbs=[GradientAccumulation(n_acc=128), CountSteps()]).to_xla(seed=0)
    learn.fit(1, 1e-2)
    assert len(steps) == len(learn.dls.train) // 2
    assert final(learn, 'accuracy') > 0.5

def test_gradient_clip_matches_eager_cpu():
    cpu = digits_learner(cbs=GradientClip(0.05)); cpu.fit(2, 1e-2)
    xla = digits_learner(cbs=GradientClip(0.05)).to_xla(seed=0); xla.fit(2, 1e-2)
    assert abs(final(cpu, 'accuracy') - final(xla, 'accuracy')) <= 0.03

def test_save_model_and_early_stopping(tmp_path):
    learn = digits_learner(path=tmp_path).to_xla(seed=0)
    learn.fit(6, 1e-2, cbs=[SaveModelCallback(monitor='accuracy', fname='best'),
                            EarlyStoppingCallback(monitor='valid_loss', min_delta=10.0, patience=1)])
    assert len(learn.recorder.values) == 2            # no improvement of 10 in the loss: stops after patience
    assert (tmp_path/'models'/'best.pth').exists()
    best = max(v[2] for v in learn.recorder.values)
    test_close(learn.validate()[1], best)             # the best model was loaded at the end

def test_lr_find_restores_the_weights():
    learn = digits_learner().to_xla(seed=0)
    w0 = learn.model[-1].weight.detach().cpu().clone()
    res = learn.lr_find(num_it=30, show_plot=False)
    assert res.valley > 0
    assert torch.equal(w0, learn.model[-1].weight.detach().cpu())
    assert len(learn.recorder.losses) > 5 and not off_host(learn.recorder.losses[0])

def test_accum_metrics_are_exact():
    from sklearn.metrics import f1_score
    learn = digits_learner(metrics=[accuracy, F1Score(average='macro')]).to_xla(seed=0)
    learn.fit(2, 1e-2)
    f1, acc = final(learn, 'f1_score'), final(learn, 'accuracy')   # (get_preds adds a row to the Recorder)
    preds, targs = learn.get_preds()
    assert len(preds) == len(learn.dls.valid_ds) == 359
    test_close(f1, f1_score(targs, preds.argmax(1), average='macro'))
    test_close(acc, (preds.argmax(1) == targs).float().mean().item())

def test_get_preds_with_input_and_loss_drop_the_padding():
    learn = digits_learner().to_xla(seed=0)
    learn.fit(1, 1e-2)
    inp, preds, targs, losses = learn.get_preds(with_input=True, with_loss=True)
    assert inp.shape == (359, 1, 8, 8) and preds.shape == (359, 10) and losses.shape == (359,)
    test_close(losses.mean().item(), learn.validate()[0], eps=1e-4)
    test_eq(targs, torch.stack([o[1] for o in learn.dls.valid_ds]))

def test_predict_and_show_results():
    import matplotlib; matplotlib.use('Agg')
    learn = digits_learner().to_xla(seed=0)
    learn.fit(2, 1e-2)
    item = learn.dls.valid_ds.items[0]
    cls, idx, probs = learn.predict(item)
    assert probs.shape == (10,) and not off_host(probs)
    assert str(cls) == item[1] or probs.max() < 0.99
    learn.show_results(max_n=4)

def python_calls(f) -> int:
    "Python calls (Python and C functions) made in this thread by `f()`: the host's work, counted exactly."
    n = [0]
    def count(frame, event, arg):
        if event in ('call', 'c_call'): n[0] += 1
    sys.setprofile(count)
    try: f()
    finally: sys.setprofile(None)
    return n[0]

def test_fastai_adam_grouped_on_xla_steps_as_fastais_own():
    """fastai's default Adam on an XLA learner steps grouped (GroupedOptimizer), out of place, and lands where fastai's
    own step does, for a fraction of its host work (each in-place operation on an XLA tensor runs PyTorch's Python meta
    functions: most of fastai's own step's calls)."""
    from fastai.optimizer import Optimizer
    from fastai_xla.optimizer import GroupedOptimizer
    learners, calls = {}, {}
    for grouped in (True, False):
        learn = digits_learner().to_xla(seed=0, grouped_steps=grouped)
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(2, 1e-2)
        assert type(learn.opt) is (GroupedOptimizer if grouped else Optimizer)
        learners[grouped] = learn
    for a, b in zip(learners[True].model.parameters(), learners[False].model.parameters()):
        assert torch.allclose(to_host(a.detach()), to_host(b.detach()), atol=1e-4, rtol=1e-3)
    for grouped, learn in learners.items():   # one more step of each, its optimizer's part counted
        xb, yb = (t.as_subclass(torch.Tensor) for t in learn.dls.train.one_batch())   # (as fastai's CastToTensor gives them)
        learn.model.train()     # (torch_xla has no backward of an evaluating BatchNorm: "the size of offset factor is 0")
        learn.loss_func(learn.model(xb), yb).backward()
        calls[grouped] = python_calls(learn.opt.step)
    assert calls[True] < 0.2 * calls[False], calls

TABULAR_USER = '''
import sys
from sklearn.datasets import load_digits
from fastai.tabular.all import *
from fastai_xla.all import *
X, y = load_digits(return_X_y=True)
df = pd.DataFrame(X, columns=[f'p{i}' for i in range(64)]); df['digit'] = y
dls = TabularDataLoaders.from_df(df, y_names='digit', cont_names=list(df.columns[:64]), procs=[Normalize], y_block=CategoryBlock(), bs=64)
learn = tabular_learner(dls, layers=[50], metrics=accuracy).to_xla()
with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules if m.split('.')[:2] in (['fastai', 'text'], ['fastai', 'vision'])}))
print(learn.recorder.values[-1][-1])
'''

def test_a_tabular_user_imports_neither_fastai_text_nor_vision():
    "fastai_xla's features for text and images load when the user loads fastai's (`application_features`, 04_distributed), not for a tabular learner."
    import subprocess, sys
    r = subprocess.run([sys.executable, '-c', TABULAR_USER], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    modules, accuracy_ = r.stdout.strip().splitlines()[-2:]
    assert modules == '[]', modules
    assert float(accuracy_) > 0.8, accuracy_

class RaiseAfterStep(Callback):
    "A user's callback with a bug, after the optimizer's step (the step's updates are traced, not run)."
    def after_step(self): raise RuntimeError('a bug in a callback')

class InterruptAfterLoss(Callback):
    "Ctrl-C in the middle of a step (after the forward pass and the loss, before the backward)."
    def after_loss(self): raise KeyboardInterrupt

class Breaks(nn.Module):
    "A module of the user's whose forward has a bug while `on` (after the batch norm: its statistics' update was traced)."
    on = False
    def forward(self, x):
        if self.on: raise ValueError('a bug in the forward')
        return x

def _bool_targets(o, t): return CrossEntropyLossFlat()(o, t.bool())       # (fastai's Siamese tutorial's first version: cannot compile on XLA)
def _python_error(o, t): raise ValueError('a bug in the loss')

FAILURES = {'callback': RaiseAfterStep, 'interrupt': InterruptAfterLoss}

@pytest.mark.parametrize('failure', ['boundary', 'loss', 'forward', 'callback', 'interrupt'])
@pytest.mark.parametrize('warm', [False, True], ids=['first fit', 'after a good fit'])
def test_a_fit_that_fails_leaves_the_learner_usable(tmp_path, failure, warm):
    """A notebook's mistake, then its fix, on the same learner (issue 69): a loss that fails where the step ends (on torch_xla
    at its boundary, where the step's in-place updates were traced: before, the parameters were left without data and the next
    fit failed with `Check failed: data()->tensor_data`), a loss that raises, a model's forward that raises, a callback that
    raises after the optimizer's step, a Ctrl-C mid-step; in the first fit of the learner and after a good one (the optimizer's state exists then). After the failure the weights,
    buffers and optimizer state are the last good step's, and fit, validate, get_preds, save and load work."""
    model = nn.Sequential(Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), Breaks(), nn.ReLU(), nn.Linear(32, 10))
    learn = digits_learner(model=model, path=tmp_path).to_xla()
    if warm: learn.fit(1, 1e-2)
    before = [t.cpu().clone() for t in [*learn.model.parameters(), *learn.model.buffers()]]
    opt_state = lambda: [(k, v.cpu().clone()) for p in learn.model.parameters() for k, v in (learn.opt.state[p] if learn.opt else {}).items()
                         if isinstance(v, torch.Tensor)]   # (a failed first step leaves none: it made the state)
    state = opt_state()
    if failure in FAILURES: learn.add_cb(FAILURES[failure]())
    elif failure == 'forward': learn.model[3].on = True
    else: learn.loss_func = _bool_targets if failure == 'boundary' else _python_error
    with pytest.raises(KeyboardInterrupt if failure == 'interrupt' else Exception): learn.fit(1, 1e-2)
    after = [t.cpu() for t in [*learn.model.parameters(), *learn.model.buffers()]]
    if learn.xla_run.backend.runtime.defers_failures:   # (an eager device, as eager fastai, keeps what ran before the error:
        # the batch norms' statistics of the failed forward, the step before a callback's error; it fails at the operation)
        assert all(torch.equal(a, b) for a, b in zip(before, after))      # the last good step's weights and buffers
        assert [k for k, _ in opt_state()] == [k for k, _ in state] and all(torch.equal(a, b) for (_, a), (_, b) in zip(opt_state(), state))
    if failure in FAILURES: learn.remove_cbs(FAILURES[failure])
    learn.model[3].on = False
    learn.loss_func = CrossEntropyLossFlat()
    learn.fit(2, 1e-2)
    assert learn.recorder.values[-1][2] > 0.85                            # it trains from there
    loss, acc = learn.validate()
    preds, targs = learn.get_preds()
    assert abs(float((preds.argmax(1) == targs).float().mean()) - acc) < 1e-6
    learn.save('after'); learn.load('after')

def test_putting_the_failed_step_back_never_hides_the_users_error(tmp_path, monkeypatch):
    "Should putting the step back fail itself (here made to), the user still sees their own error, and a warning says what to do."
    from fastai_xla.callback import StepStart
    def broken(self): raise RuntimeError('putting back failed')
    monkeypatch.setattr(StepStart, 'restore', broken)
    learn = digits_learner(path=tmp_path).to_xla()
    learn.loss_func = _python_error
    with pytest.warns(UserWarning, match='could not put the learner back'), pytest.raises(ValueError, match='a bug in the loss'): learn.fit(1, 1e-2)

SYNC_BN_IN_THE_GRAPH = '''
import torch_xla.debug.metrics as met
from fastai.vision.all import *
from fastai_xla.all import *
from fastai_xla.demo import digits_dls
for sync in (False, True):
    set_seed(0)
    model = nn.Sequential(ConvLayer(1, 8, stride=2), ConvLayer(8, 16, stride=2), nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(16, 10))
    learn = Learner(digits_dls(bs=32, seed=42), model, loss_func=CrossEntropyLossFlat()).to_tpu_distributed(sync_bn=sync)
    with learn.no_bar(), learn.no_logging(): learn.fit(1)
    met.clear_all()
    with learn.no_bar(), learn.no_logging(): learn.fit(1)
    print(sync, met.counter_value('xla::AllReduceInPlace'), (met.metric_data('CompileTime') or (0,))[0], len(learn.dls.train))
    learn.detach_xla()
'''

def test_synced_batch_norms_add_one_collective_per_layer_each_way_in_the_compiled_step():
    """torch_xla's in-graph path of `sync_bn` (XLA_ALWAYS_ALLREDUCE=1: its collectives run with one replica, as on a TPU with
    several): each of the model's 2 batch norms adds one all-reduce to the forward pass and one to the backward, traced
    into the step (no device read), and the second fit compiles nothing. (Several replicas' in-graph collectives need a TPU;
    tests/test_replicas.py checks the statistics over two replicas through gloo.)"""
    import subprocess, sys
    r = subprocess.run([sys.executable, '-c', SYNC_BN_IN_THE_GRAPH], capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'XLA_ALWAYS_ALLREDUCE': '1'})
    assert r.returncode == 0, r.stderr[-3000:]
    (_, plain, _, steps), (_, synced, compiles, _) = [line.split() for line in r.stdout.strip().splitlines()[-2:]]
    assert int(synced) - int(plain) == 2 * 2 * int(steps), r.stdout
    assert int(compiles) == 0, r.stdout
