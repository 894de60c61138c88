"""Several replicas for real: `learn.launch(..., transport='gloo', nprocs=N)` starts N
processes, each with its own CPU XLA device (PJRT_DEVICE=CPU), whose cross-replica traffic
(start weights, gradients, metric totals, predictions, the shuffling seed, barriers) goes
through fastai_xla's collective layer over torch.distributed/gloo.

What this covers: the whole multi-replica path of fastai_xla (sharding, padding, gradient
averaging, metric reduction, ordered gathering, master-only output, launch and return)
with real replicas and real collectives. What it does not cover: torch_xla's own
in-graph collectives (`XLATransport`), which deadlock across CPU devices on torch_xla
2.5-2.9 and need a TPU (or SPMD, see the SPMD tests)."""
import json, os, hashlib, time
from pathlib import Path
import pytest, torch
from helpers import *

def _params_digest(learn):
    h = hashlib.sha256()
    for p in learn.model.parameters(): h.update(to_host(p.detach()).numpy().tobytes())
    return h.hexdigest()

def indexed_digits_dls(bs=64, val_bs=None, n_valid=None):
    "Digits as 65 features: 64 pixels and the item's index (the model ignores it; the tests read it to see which items each replica got)."
    from sklearn.datasets import load_digits
    from fastai.data.load import DataLoader
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X, dtype=torch.float32) / 16.
    items = [(torch.cat([X[i], torch.tensor([float(i)])]), torch.tensor(int(y[i]))) for i in range(len(X))]
    n = int(len(items) * 0.8)
    return DataLoaders(DataLoader(items[:n], bs=bs, shuffle=True, drop_last=True),
                       DataLoader(items[n:n + (n_valid or len(items))], bs=val_bs or bs))

class Pixels(nn.Module):
    def forward(self, x): return x[:, :64]

def indexed_mlp(): return nn.Sequential(Pixels(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

def indexed_learner(bs=64, val_bs=None, metrics=None, n_valid=None, **kwargs):
    set_seed(0)
    return Learner(indexed_digits_dls(bs, val_bs, n_valid), indexed_mlp(), loss_func=CrossEntropyLossFlat(),
                   metrics=metrics if metrics is not None else [accuracy, F1Score(average='macro')], **kwargs)

class RecordItems(Callback):
    "Which items (by index feature) reached this replica's model, per epoch and phase, padding cut."
    order = TPUCallback.order + 1
    def before_fit(self): self.seen = []
    def after_pred(self):
        ids = to_host(self.learn.xb[0][:, 64]).long().tolist()
        self.seen.append((self.epoch, 'train' if self.training else 'valid', ids))

def train_and_report(learn, out_dir, epochs=2, lr=1e-2, extra_cbs=()):
    rec = RecordItems()
    learn.fit(epochs, lr, cbs=[rec, *extra_cbs])
    values = [[float(x) for x in v] for v in learn.recorder.values]   # (get_preds resets the Recorder, as in fastai)
    preds, targs = learn.get_preds()
    report = dict(rank=replica_ordinal(), world=replica_count(), seen=rec.seen, digest=_params_digest(learn), values=values,
                  reach=what_a_stranger_reaches())
    Path(out_dir, f'replica-{replica_ordinal()}.json').write_text(json.dumps(report))
    return dict(preds=preds, targs=targs)

class MasterLooksAtBatches(Callback):
    "After every epoch replica 0 alone takes one batch of each loader (as `learn.summary()` or `show_batch` would)."
    def after_epoch(self):
        if replica_ordinal() == 0:
            for dl in self.dls.loaders: dl.one_batch()

def train_with_master_looking(learn, out_dir):
    return train_and_report(learn, out_dir, extra_cbs=[MasterLooksAtBatches()])

def reports(out_dir): return [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob('replica-*.json'))]

@pytest.fixture(scope='module')
def two_replicas(tmp_path_factory):
    "One 2-replica run shared by several tests: fit 2 epochs (replica 0 alone takes a batch after each), get_preds, per-replica reports."
    out = tmp_path_factory.mktemp('two')
    learn = indexed_learner(bs=32)
    res = learn.launch(train_with_master_looking, str(out), nprocs=2, transport='gloo')
    return learn, res, reports(out)

def test_shards_are_disjoint_and_cover_the_data(two_replicas):
    "In every epoch, though replica 0 alone took a batch of each loader after the first (it once shifted its epoch order)."
    learn, res, reps = two_replicas
    assert [r['rank'] for r in reps] == [0, 1] and all(r['world'] == 2 for r in reps)
    n_train, n_valid = len(learn.dls.train_ds), len(learn.dls.valid_ds)
    for epoch in (0, 1):
        for phase, n, lo in (('train', n_train, 0), ('valid', n_valid, n_train)):
            per = [sorted(i for e, p, ids in r['seen'] if e == epoch and p == phase for i in ids) for r in reps]
            assert not set(per[0]) & set(per[1])                         # disjoint
            union = set(per[0]) | set(per[1])
            if phase == 'valid': assert union == set(range(lo, lo + n))  # every validation item once, padding cut
            else: assert union <= set(range(n)) and n - len(union) < 2 * 32   # only a ragged tail is dropped
            assert len(per[0]) == len(per[1]) or phase == 'valid'
    # the epoch order changes between epochs, the same way on every replica
    firsts = [[ids for e, p, ids in r['seen'] if p == 'train'][0] for r in reps]
    assert firsts[0] != firsts[1]

def what_a_stranger_reaches() -> dict:
    "In a replica, with its store and gloo's links open: the TCP ports it and its launcher (torch's agent, which serves the store) listen on, and which a stranger at this machine's network address reaches."
    from fastai_xla.agent import launcher_pid
    addr, mine, launcher = network_address(), listening_addresses(), listening_addresses(launcher_pid())
    return dict(listening=mine, from_network=[addr is not None and not refused_from(addr, port) for _, port in mine + launcher],
                from_loopback=[not refused_from('127.0.0.1', port) for _, port in mine], network=addr, launcher=launcher)

def test_a_single_host_launch_opens_nothing_beyond_loopback(two_replicas):
    """Every port a replica of a single-host launch and its launcher listen on (gloo's links; the store torch's agent serves in
    the launching process: found in the kernel's socket tables by the processes' own sockets) is bound to loopback, and refuses a connection from the machine's network
    address while the run is alive. (gloo's links listen where the machine's name resolves to: 127.0.0.1 on this machine, so
    only the store's binding could be seen to fail here; on a cloud VM the name gives its network address.)"""
    learn, res, reps = two_replicas
    if reps[0]['reach']['network'] is None: pytest.skip('this machine has no network address apart from loopback')
    assert reps[0]['reach']['listening'] and reps[0]['reach']['launcher'], reps[0]   # (gloo's links; torch's agent serves the store)
    for r in reps:
        assert all(ip in ('127.0.0.1', '::1') for ip, _ in r['reach']['listening'] + r['reach']['launcher']), r['reach']
        assert not any(r['reach']['from_network']) and all(r['reach']['from_loopback']), r['reach']

def test_replicas_end_with_identical_weights_which_come_back(two_replicas):
    learn, res, reps = two_replicas
    assert reps[0]['digest'] == reps[1]['digest']
    assert _params_digest(learn) == reps[0]['digest']       # the launching process has the trained weights
    assert len(reps[0]['values']) == 2 and len(learn.recorder.values) >= 1   # and the Recorder's history

def test_metrics_equal_one_device_for_the_same_weights(two_replicas):
    learn, res, reps = two_replicas
    valid_loss, acc, f1 = reps[0]['values'][1][1:4]   # epoch 2: train_loss, valid_loss, accuracy, f1
    assert reps[1]['values'][1] == reps[0]['values'][1]     # every replica reports the same (reduced) values
    one = learn.validate()                                   # the same weights, one eager CPU device, whole valid set
    test_close(one[0], valid_loss, eps=1e-4); test_close(one[1], acc); test_close(one[2], f1)

def test_get_preds_complete_and_in_order(two_replicas):
    learn, res, reps = two_replicas
    preds, targs = learn.get_preds()                         # one device, same weights
    assert res['preds'].shape == preds.shape == (len(learn.dls.valid_ds), 10)
    test_eq(res['targs'], targs)
    test_close(res['preds'], preds, eps=1e-4)

def sgd_steps(learn, epochs=1):
    learn.fit(epochs, 0.1)
    return None

def test_two_replicas_of_32_step_like_one_device_of_64(tmp_path):
    "Averaged gradients: 2 replicas x 32 items = one device x 64 items, same epoch order (MLP, no batch norm)."
    two = Learner(indexed_digits_dls(32), indexed_mlp(), loss_func=CrossEntropyLossFlat(), opt_func=SGD)
    set_seed(1); two.model = indexed_mlp(); w0 = {k: v.clone() for k, v in two.model.state_dict().items()}
    two.launch(sgd_steps, nprocs=2, transport='gloo', dl_kwargs=dict(seed=7))
    one = Learner(indexed_digits_dls(64), indexed_mlp(), loss_func=CrossEntropyLossFlat(), opt_func=SGD)
    one.model.load_state_dict(w0)
    one.to_xla(seed=7)
    one.fit(1, 0.1)
    for (k, a), b in zip(two.model.state_dict().items(), one.model.state_dict().values()):
        test_close(a, to_host(b), eps=1e-4)

def indexed_bn_mlp(): return nn.Sequential(Pixels(), nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))

@pytest.mark.parametrize('sync_bn', [True, False], ids=['sync_bn', 'own statistics'])
def test_two_replicas_of_32_with_batch_norms_step_like_one_device_of_64(tmp_path, sync_bn):
    """With `sync_bn=True` a batch norm sees the global batch (04b_sync_bn): 2 replicas x 32 items = one device x 64 items,
    the running statistics included. Without it, each replica normalizes with its own 32 items, and they do not."""
    set_seed(1); model = indexed_bn_mlp(); w0 = {k: v.clone() for k, v in model.state_dict().items()}
    two = Learner(indexed_digits_dls(32), model, loss_func=CrossEntropyLossFlat(), opt_func=SGD)
    two.launch(sgd_steps, nprocs=2, transport='gloo', dl_kwargs=dict(seed=7), sync_bn=sync_bn)
    assert type(two.model[2]) is nn.BatchNorm1d                      # (the notebook's learner keeps fastai's own)
    one = Learner(indexed_digits_dls(64), indexed_bn_mlp(), loss_func=CrossEntropyLossFlat(), opt_func=SGD)
    one.model.load_state_dict(w0)
    one.to_xla(seed=7)
    one.fit(1, 0.1)
    gap = max(float((a.float() - to_host(b).float()).abs().max() / (1 + to_host(b).float().abs().max()))
              for a, b in zip(two.model.state_dict().values(), one.model.state_dict().values()))
    assert (gap < 1e-4) if sync_bn else (gap > 1e-3), gap

def test_three_replicas_with_a_batch_of_padding_only(tmp_path):
    "359 validation items over 3 replicas in batches of 119: replica 2 has 119 items, so its second batch is all padding."
    learn = indexed_learner(bs=32, val_bs=119, n_valid=359)
    assert len(learn.dls.valid_ds) == 359
    learn.launch(train_and_report, str(tmp_path), epochs=1, nprocs=3, transport='gloo')
    reps = reports(tmp_path)
    valid = [sorted(i for e, p, ids in r['seen'] if p == 'valid' for i in ids) for r in reps]
    assert sum(map(len, valid)) == 359 and len(set().union(*map(set, valid))) == 359
    one = learn.validate()
    test_close(one[0], reps[0]['values'][0][1], eps=1e-4); test_close(one[1], reps[0]['values'][0][2])
    assert len({r['digest'] for r in reps}) == 1

def with_callbacks(learn, out_dir):
    learn.fit(2, 1e-2, cbs=[GradientAccumulation(n_acc=64), GradientClip(0.1),
                            SaveModelCallback(monitor='accuracy', fname='best'), EarlyStoppingCallback(patience=3)])
    learn.lr_find(end_lr=1e3, num_it=60, show_plot=False)   # diverges: every replica must stop at the same step, and be restored
    Path(out_dir, f'replica-{replica_ordinal()}.json').write_text(json.dumps(dict(digest=_params_digest(learn))))

def test_callbacks_and_lr_find_keep_replicas_identical(tmp_path):
    learn = indexed_learner(bs=32, path=tmp_path)
    learn.launch(with_callbacks, str(tmp_path), nprocs=2, transport='gloo')
    digests = [json.loads(p.read_text())['digest'] for p in sorted(tmp_path.glob('replica-*.json'))]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert (tmp_path/'models'/'best.pth').exists()

def long_run(learn, out_dir):
    "The callbacks users keep for long runs, on every replica (W&B's run started on the master, as its docs ask); what each replica saw."
    import wandb
    from fastai.callback.tensorboard import TensorBoardCallback
    from fastai.callback.wandb import WandbCallback
    os.environ.update(WANDB_MODE='offline', WANDB_DIR=out_dir, WANDB_SILENT='true')   # (no network: the run is written offline)
    if is_master(): wandb.init(project='fastai_xla')
    never_better = dict(monitor='valid_loss', comp=np.greater)       # (a falling loss never "improves": they act soon)
    learn.fit(8, 1e-2, cbs=[CSVLogger(fname=str(Path(out_dir, 'history.csv'))), SaveModelCallback(monitor='accuracy', fname='best'),
                            EarlyStoppingCallback(patience=3, **never_better), ReduceLROnPlateau(patience=1, factor=10, **never_better),
                            TensorBoardCallback(log_dir=str(Path(out_dir, 'tensorboard'))), WandbCallback(log_preds=False)])
    logged = {k: v for k, v in dict(wandb.run.summary).items() if k in ('accuracy', 'epoch')} if is_master() else None
    if is_master(): wandb.finish()
    Path(out_dir, f'replica-{replica_ordinal()}.json').write_text(json.dumps(dict(
        values=[[float(x) for x in v] for v in learn.recorder.values], lr=learn.opt.hypers[0]['lr'], digest=_params_digest(learn),
        wandb=logged)))

def test_the_loggers_and_trackers_of_long_runs_write_once_and_act_alike_under_launch(tmp_path):
    """Issue 68: fastai's `CSVLogger`, `SaveModelCallback`, `EarlyStoppingCallback`, `ReduceLROnPlateau`, `TensorBoardCallback`
    and `WandbCallback` (offline) in every replica of `learn.launch` (2 over gloo): the loggers write once, from the master,
    every epoch's exact metrics (one CSV file, one TensorBoard event file, one W&B run); the best model is saved once and
    loads on the host; early stopping ends every replica at the same epoch, and the plateau's lower rate is every replica's."""
    linear_digits_learner(path=tmp_path).launch(long_run, str(tmp_path), nprocs=2, transport='gloo')
    assert_long_run_logged_once_and_alike(tmp_path)

def assert_long_run_logged_once_and_alike(tmp_path):
    "What `long_run`'s replicas left in `tmp_path`: see the test above (and `test_torchrun.py`'s)."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    reps = reports(tmp_path)
    epochs = len(reps[0]['values'])
    assert 1 < epochs < 8 and all(r['values'] == reps[0]['values'] for r in reps), reps     # stopped early, on each alike
    assert reps[0]['lr'] == reps[1]['lr'] < 1e-3 and reps[0]['digest'] == reps[1]['digest'], reps
    rows = (tmp_path/'history.csv').read_text().splitlines()
    assert rows[0].startswith('epoch,train_loss,valid_loss,accuracy') and len(rows) == 1 + epochs, rows
    test_close([float(r.split(',')[3]) for r in rows[1:]], [v[2] for v in reps[0]['values']])
    best = max(v[2] for v in reps[0]['values'])
    learn = linear_digits_learner(path=tmp_path).load('best')       # (on the host)
    test_close(learn.validate()[1], best)
    [events] = list((tmp_path/'tensorboard').glob('events.out.tfevents.*'))
    logged = EventAccumulator(str(events)); logged.Reload()
    test_close([s.value for s in logged.Scalars('accuracy')], [v[2] for v in reps[0]['values']])
    assert len(list((tmp_path/'wandb').glob('offline-run-*'))) == 1
    summary = reps[0]['wandb']                        # (the run's last values, as the master's W&B run holds them)
    test_close(summary['accuracy'], reps[0]['values'][-1][2]); assert summary['epoch'] == epochs, summary

class StepsAndTransportReads(Callback):
    "Each epoch's optimizer steps, and how often the replicas' collectives read the device (gloo's, through host memory)."
    def before_fit(self): self.steps, self.transport = [], []
    def before_epoch(self): self.steps.append(0); self.transport.append(-self.learn.xla_run.collectives.reads)
    def after_step(self): self.steps[-1] += 1
    def after_epoch(self): self.transport[-1] += self.learn.xla_run.collectives.reads

def reads_and_steps(learn):
    "The second epoch (nothing compiles) of a fit with each of the callbacks that touch the loss, the batch or the step: its reads of the device, those of the collectives among them, its optimizer steps."
    from fastai.callback.mixup import MixUp
    out, first_epoch_compiles = {}, None
    for name, cbs in (('plain', []), ('MixUp', [MixUp()]), ('GradientAccumulation', [GradientAccumulation(n_acc=128)])):
        counts, steps = EpochCounters(), StepsAndTransportReads()
        with learn.no_bar(): learn.fit(2, 1e-2, cbs=[counts, steps, *cbs])
        out[name] = (counts.epochs[1]['to_host'], steps.transport[1], steps.steps[1])
        if first_epoch_compiles is None: first_epoch_compiles = counts.epochs[0]['compiles']
    return out, first_epoch_compiles

def test_a_launch_reads_the_device_as_one_device_does_besides_its_collectives():
    """Issue 68: under `learn.launch` (2 replicas over gloo), MixUp and `GradientAccumulation` read the device as often as
    one device's run, besides the collectives' own reads: gloo's all-reduce goes through host memory (on a TPU the
    collectives are in the step's graph and read nothing), the gradients once per optimizer step, and the same few reads a
    phase (the metric totals) whatever the callbacks. `GradientAccumulation(n_acc=128)` steps where one device steps (its
    128 items counted over both replicas: every second batch of 32 here, every fourth on one device), and the replicas
    average their gradients at the step only (`AverageGradients`), not after every batch (before: a read a batch). The
    first epoch compiles at most 2 graphs more than one device's (issue 83: the gradients' graph, cut where gloo reads them,
    and the metric totals summed over the replicas; before, 10 against 4: the weights broadcast at the start arrived as
    parts of one tensor, and the first step compiled graphs of its own)."""
    launched, launched_compiles = linear_digits_learner().launch(reads_and_steps, nprocs=2, transport='gloo')
    one, one_compiles = reads_and_steps(linear_digits_learner().to_xla(seed=0))
    assert 0 < launched_compiles <= one_compiles + 2, (launched_compiles, one_compiles)
    assert launched['GradientAccumulation'][2] == one['GradientAccumulation'][2] < launched['plain'][2], (launched, one)
    assert len({transport - steps for _, transport, steps in launched.values()}) == 1, launched
    assert {name: reads - transport for name, (reads, transport, _) in launched.items()} == {name: r for name, (r, *_) in one.items()}, (launched, one)

class BreakMidEpoch(Callback):
    def __init__(self, out_dir=None): self.out_dir = out_dir
    def after_batch(self):
        if replica_ordinal() == 1 and self.epoch == 1 and self.iter == 5:
            if self.out_dir: Path(self.out_dir, 'raised').write_text(repr(time.time()))
            raise ValueError('replica 1 breaks on purpose')

def fails_on_replica_1(learn, out_dir=None):
    learn.fit(3, cbs=BreakMidEpoch(out_dir))

def test_a_replica_failing_mid_epoch_stops_every_replica_with_its_traceback(tmp_path, monkeypatch):
    "Replica 0 is then waiting for replica 1's gradients: it must be stopped, not left hanging. Asked to, the launch keeps its files."
    import time, tempfile
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))          # where the launch makes its job directory
    learn = indexed_learner(bs=32)
    t = time.time()
    with pytest.raises(RuntimeError) as e: learn.launch(fails_on_replica_1, str(tmp_path), nprocs=2, transport='gloo', keep_failed_job=True)
    assert time.time() - t < 60
    took = time.time() - float((tmp_path/'raised').read_text())
    assert str(e.value).startswith('replica 1 (exit status 1): ValueError') and 'replica 1 breaks on purpose' in str(e.value), str(e.value)
    assert 'Traceback' in str(e.value)                              # (its traceback, from torch's agent's record of it)
    kept = list(tmp_path.glob('fastai_xla-*'))   # (the launch's folder, beside the file 'raised')
    records = list(kept[0].glob('agent/*/attempt_0/1/error.json')) if len(kept) == 1 else []
    assert len(records) == 1 and 'replica 1 breaks on purpose' in records[0].read_text()   # (the record, in torch's format)
    fault_row('a replica raises mid-epoch under `learn.launch` (torch\'s elastic agent)', "torch's agent stops the other at once; "
              '`ReplicasFailed: replica 1 (exit status 1): ValueError: ...` and its traceback, from the agent\'s record of it',
              took, 'the epoch in progress')

def returns_its_count(learn): return replica_count()   # and fits nothing: no Recorder history to bring back

def test_launch_leaves_no_files_behind(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    assert indexed_learner(bs=32).launch(returns_its_count, nprocs=2, transport='gloo') == 2
    assert not list(tmp_path.glob('fastai_xla-*'))

SEGMENTATION_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from helpers import *
def validate_values(learn): return [float(v) for v in learn.validate()]
def fit_then_validate(learn):
    learn.fit(1, 1e-2)                                            # some training: masks not all one class
    return validate_values(learn)
learn = segmentation_learner('seg', 'digit', [Dice(), JaccardCoeff(), DiceMulti(), JaccardCoeffMulti()])
two = learn.launch(fit_then_validate, nprocs=2, transport='gloo') # forked: this process never started XLA
one = validate_values(learn)          # the weights that came back, on one eager CPU device, with fastai's own metrics
print('VALUES', json.dumps(dict(two=two, one=one)))
"""

def test_segmentation_metrics_summed_over_two_replicas_equal_one_device(tmp_path):
    "fastai's Dice, JaccardCoeff, DiceMulti, JaccardCoeffMulti counted on each replica's device, summed over 2 replicas."
    import subprocess, sys
    (tmp_path/'seg.py').write_text(SEGMENTATION_SCRIPT.format(tests=str(Path(__file__).parent)))
    r = subprocess.run([sys.executable, 'seg.py'], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.split('VALUES ')[-1])
    assert 0 < res['one'][3] < 1                                   # a real multi-class Dice, not a trivial one
    test_close(res['two'], res['one'], eps=1e-4)

# --- replicas that go their own way (issue 17): a clear, named error in bounded time, never a silent hang

def fit_then_master_alone_in_get_preds(learn):
    learn.fit(1)
    if replica_ordinal() == 0: learn.get_preds()   # replica 1 goes on to the end of the launched function

def test_master_alone_in_get_preds_is_named_at_once():
    "Both replicas raise as soon as they meet at different collectives, not after FASTAI_XLA_TIMEOUT (300 s)."
    import time
    learn = indexed_learner(bs=32)
    t = time.time()
    with pytest.raises(RuntimeError) as e: learn.launch(fit_then_master_alone_in_get_preds, nprocs=2, transport='gloo')
    assert time.time() - t < 150, time.time() - t   # (replicas spawned and one epoch trained; before: gloo's 300 s timeout)
    msg = str(e.value)
    assert 'ReplicasDiverged' in msg and 'replica 0 in metric reduction at the end of validation' in msg, msg
    assert 'replica 1 in the end of the function learn.launch runs' in msg and 'call fit, validate and get_preds on every replica' in msg

def master_alone_looks_then_all_fit(learn):
    learn.fit(1)
    if replica_ordinal() == 0:                               # the master alone: these need no other replica
        learn.summary()
        learn.predict(learn.dls.valid_ds.items[0])
        learn.show_results(max_n=2)
    learn.fit(1)                                             # then every replica trains on, together
    return _params_digest(learn)

def test_summary_predict_show_results_on_the_master_alone():
    learn = digits_learner(bs=32)
    learn.launch(master_alone_looks_then_all_fit, nprocs=2, transport='gloo')
    assert final(learn, 'accuracy') > 0.5

def replica_1_late(learn):
    if replica_ordinal() == 1: time.sleep(30)
    learn.fit(1)

def test_a_replica_that_does_not_come_is_named_after_the_timeout(monkeypatch):
    import time
    monkeypatch.setenv('FASTAI_XLA_TIMEOUT', '5')
    learn = indexed_learner(bs=32)
    t = time.time()
    with pytest.raises(RuntimeError) as e: learn.launch(replica_1_late, nprocs=2, transport='gloo')
    assert time.time() - t < 150, time.time() - t
    msg = str(e.value)
    assert 'Replica 0 waited 5 s (FASTAI_XLA_TIMEOUT) in collective #2 (training epoch 0)' in msg, msg
    assert 'replica 1 did not come: its last was #1 (weights broadcast when the replicas are set up)' in msg, msg
