"""Sharded models on the native backend (`to_tpu_distributed(fsdp=True)`, nbs/17_fsdp): PyTorch's FSDP2 under
`torchrun --standalone`, the native backend on the CPU, its collectives over gloo.

Covered: a tabular learner (fastai's Adam through the grouped step on each replica's shards, one-cycle), a small CNN's
`fine_tune` in two parameter groups (`freeze`, `unfreeze`, discriminative rates, `GradientClip` on sharded gradients), a small
transformer (torch's `TransformerEncoder` over the digits' pixel rows as tokens; its blocks the shard units) trained
sharded and replicated from the same seed in the same processes, with 2 replicas and (tabular) 4: the losses of every
step, the bytes each replica holds of the parameters and of the optimizer's state; a sharded save at 2 replicas (a
torch.distributed.checkpoint folder, each replica its file) loaded by 1 sharded replica (DCP reshards), and its whole
save (`sharded=False`) by a plain fastai learner on the CPU, both validating to the 2 replicas' metric; saves in the
background (`BackgroundSaves`, `dcp.async_save`) holding the weights of the epoch that saved them, named once written; the sharded
learner's `export`, opened by `load_learner`: the plain model with the saved weights; `detach_xla` on every replica: the
plain model and Adam's state whole on the CPU, validating as before and training on with fastai's own loop; bfloat16 (FSDP2's mixed precision)
against autocast replicated; a sharded run SIGKILLed under `--max-restarts=1` resumed from its folder of shards; a
`learn.launch` of sharded replicas (saving in the background) bringing the whole weights back.
On the eager `tpu` test device (tests/eager_tpu.py: TorchTPU's kind of device, PyTorch's PrivateUse1, with a `tpu_dist`
group of its own that takes device tensors alone and has no `ReduceOp.AVG`, its collectives gloo's over host copies): 2
replicas, the tabular learner, the CNN's `fine_tune` and the transformer sharded against replicated, saves in the
background, and 1 replica loading the 2 replicas' shards; with `bash scripts/test.sh --all` (tests/conftest.py's SLOW), 4
replicas and the SIGKILLed run there too.
Not covered here: TorchTPU's own `tpu_dist` over a chip's interconnect and CUDA's nccl (no chip; nccl on a lent GPU:
scripts/native_gpu.sh); that the model never is whole on the device (sharded on the host, each unit moved as it is cut:
only that the master's weights reach every replica's shards is tested, with 4 replicas of different first weights);
torch_xla's `xla` stand-in (no process group of its own kind: `fsdp=` refuses it by name)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from test_torchrun import torchrun as elastic_run
from helpers import network_interface

TESTS = Path(__file__).parent

SCRIPT = '''
import os, sys, json
sys.path.insert(0, {tests!r})
from helpers import *
from fastai_xla.fsdp import replica_bytes, holds_shards, whole
from fastai_xla.checkpoint import BackgroundSaves
PHASE = {phase!r}

def digit_rows_learner(seed=0):
    "A transformer over scikit-learn's digits read as sequences of 8 pixel rows (tokens: a row's 8 pixels, 0-16, embedded), the digit from the rows."
    set_seed(seed, reproducible=True)
    dls = digits_dls(bs=64, seed=42, batch_tfms=[IntToFloatTensor(div=16.)])
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0., batch_first=True)
    model = nn.Sequential(nn.Flatten(1, 2), nn.Linear(8, 32), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(8*32, 10))
    return Learner(dls, model, loss_func=CrossEntropyLossFlat(), metrics=accuracy)

def digits_fine_tune_learner(seed=0):
    "A small CNN in two parameter groups (body, head) with `GradientClip`: for `fine_tune` (frozen body, then discriminative rates)."
    set_seed(seed, reproducible=True)
    body = nn.Sequential(ConvLayer(1, 16, stride=2), ConvLayer(16, 32, stride=2), nn.AdaptiveAvgPool2d(1), Flatten())
    return Learner(digits_dls(bs=64, seed=42), nn.Sequential(body, nn.Linear(32, 10)), loss_func=CrossEntropyLossFlat(),
                   metrics=accuracy, splitter=lambda m: [params(m[0]), params(m[1])], cbs=GradientClip(0.5))

class Losses(Callback):
    "The training losses of every step, over every fit (`fine_tune` fits twice)."
    order = 100
    def __init__(self): self.losses = []
    def after_batch(self):
        if self.training: self.losses.append(float(self.loss.detach()))

def whole_weights(learn): return torch.cat([whole(p).detach().cpu().flatten() for p in learn.model.parameters()])

class Seen(Callback):
    "The whole weights at the end of each epoch (after `SaveModelCallback` saved them)."
    order = 61
    def before_fit(self): self.weights = []
    def after_epoch(self): self.weights.append(whole_weights(self.learn))

def own_first_weights(make):
    "`make` whose learner's model draws its weights again from a seed of this replica's own: only the master's weights make replicas agree."
    def made():
        learn = make()
        torch.manual_seed(1000 + replica_ordinal())
        for m in learn.model.modules():
            if m is not learn.model and hasattr(m, 'reset_parameters'): m.reset_parameters()
        return learn
    return made

class ParamDtype(Callback):
    "The dtype of the first unit's parameters inside its forward (a sharded model's: as gathered), in training."
    def before_fit(self):
        self.seen = set()
        unit = self.model[2].layers[0]
        self.hook = unit.register_forward_pre_hook(lambda m, args: self.seen.add(str(next(m.parameters()).dtype)) if self.training else None)
    def after_fit(self): self.hook.remove()

def trained(make, fsdp, fine_tune=False, bf16=False):
    epochs = 2 * replica_count() // 2              # (20 steps or more: 11 a replica an epoch at 2 replicas, 5 at 4)
    learn = (make().to_bf16() if bf16 else make()).to_tpu_distributed(seed=0, fsdp=fsdp)
    if bf16: learn.add_cb(ParamDtype())
    rec = Losses()
    if fine_tune: learn.fine_tune(1, 1e-2, cbs=rec)  # (one epoch frozen, one unfrozen with discriminative rates)
    else: learn.fit_one_cycle(epochs, 1e-2, cbs=rec)
    whole = sum(p.numel() * p.element_size() for p in learn.model.parameters())
    return learn, dict(losses=rec.losses, bytes=replica_bytes(learn), whole=whole, sharded=holds_shards(learn.model),
                       metric=float(learn.recorder.values[-1][-1]), loss=float(learn.recorder.values[-1][1]),
                       dtypes=sorted(learn.param_dtype.seen) if bf16 else None)

report = {{}}
if PHASE == 'train':
    if replica_count() == 2:   # bfloat16: autocast replicated, FSDP2's mixed precision sharded
        for fsdp in (None, True): _, report[f'bf16 {{"sharded" if fsdp else "replicated"}}'] = trained(digit_rows_learner, fsdp, bf16=True)
    for name, make in ([('tabular', tabular_digits_learner), ('vision fine_tune', digits_fine_tune_learner),
                        ('transformer', digit_rows_learner)] if replica_count() == 2
                       else [('tabular', own_first_weights(tabular_digits_learner))]):   # (4: each its own first weights)
        for fsdp in (None, True):
            learn, report[f'{{name}} {{"sharded" if fsdp else "replicated"}}'] = trained(make, fsdp, fine_tune='fine_tune' in name)
    # saves in the background: each epoch's checkpoint holds that epoch's weights, though training went on while it was written
    bg, seen = tabular_digits_learner(seed=0).to_tpu_distributed(seed=0, fsdp=True), Seen()
    bg.fit(2, 1e-2, cbs=[BackgroundSaves(), SaveModelCallback(every_epoch=True, fname='bg'), seen])
    report['background'] = [float((whole_weights(bg.load(f'bg_{{e}}')) - w).abs().max()) for e, w in enumerate(seen.weights)]
    bg.add_cb(BackgroundSaves()); bg.save('later')        # (outside a fit: named at the next save or load, or fit)
    report['named before finished'] = Path('models/later.pth').exists()
    with bg.no_bar(): bg.fit(1, 1e-2)                       # (named as this fit starts, with the weights of before it)
    report['later'] = float((whole_weights(bg.load('later')) - seen.weights[-1]).abs().max())
    learn.save('sharded'); learn.save('sharded')            # (the transformer: a folder of shards, named by sharded.pth; the first one removed)
    report['folders'] = sorted(f.name.split('.')[0] + ' ' + str(len(list(f.glob('__*.distcp')))) for f in Path('models').glob('*.dcp'))
    learn.save('whole', sharded=False)                      # (every replica gathers, the master writes the whole file)
    learn.export('sharded.pkl')                             # (a plain fastai learner, its model the one before sharding)
    report['validated'] = [float(v) for v in learn.validate()]
    learn.detach_xla()                                      # (every replica: the plain model and Adam's state whole, fastai's own)
    state = [t for p in learn.model.parameters() for t in learn.opt.state[p].values() if isinstance(t, torch.Tensor) and t.ndim]
    report['detached'] = dict(cls=type(learn.model).__name__,
                              state_whole=len(state) > 0 and all(type(t) is torch.Tensor and t.device.type == 'cpu' for t in state)
                              and all(t.shape == p.shape for p in learn.model.parameters() for t in learn.opt.state[p].values() if isinstance(t, torch.Tensor) and t.ndim))
    # (fastai's own learner under torchrun gathers its metrics through torch.distributed's default group: gloo on the CPU;
    # on the eager `tpu` device that group is its tpu_dist, which takes device tensors alone: there fastai's own loop is left out)
    if os.environ['FASTAI_XLA_NATIVE_DEVICE'] != 'tpu':
        report['detached']['validated'] = [float(v) for v in learn.validate()]
        learn.fit(1, 1e-3)                                  # (fastai's own loop on the CPU, from the whole state)
        report['detached']['loss'] = float(learn.recorder.values[-1][1])
    if replica_ordinal() == 0:   # (last: the master predicts alone with the sharded learner: told, not left waiting)
        bg.xla_run.settings = bg.xla_run.settings.with_(timeout=2)
        try: bg.predict(bg.dls.valid_ds.items.iloc[0]); report['alone'] = None
        except Exception as e: report['alone'] = f'{{type(e).__name__}}: {{e}}'
elif PHASE == 'device':   # on the native device the test names (the eager `tpu` test device: its `tpu_dist`, gloo over host copies)
    for name, make in (('tabular', tabular_digits_learner), ('vision fine_tune', digits_fine_tune_learner), ('transformer', digit_rows_learner)):
        for fsdp in (None, True):
            learn, report[f'{{name}} {{"sharded" if fsdp else "replicated"}}'] = trained(make, fsdp, fine_tune='fine_tune' in name)
    import torch.distributed as dist
    report['where'] = [str(learn.xla_run.device), dist.get_backend(), str(next(learn.model.parameters()).device)]
    bg, seen = tabular_digits_learner(seed=0).to_tpu_distributed(seed=0, fsdp=True), Seen()
    bg.fit(2, 1e-2, cbs=[BackgroundSaves(), SaveModelCallback(every_epoch=True, fname='bg'), seen])
    report['background'] = [float((whole_weights(bg.load(f'bg_{{e}}')) - w).abs().max()) for e, w in enumerate(seen.weights)]
    learn.save('sharded'); learn.save('whole', sharded=False); learn.export('sharded.pkl')   # (for the 'load' phase)
    report['validated'] = [float(v) for v in learn.validate()]
else:   # one replica, sharded, loads the 2 replicas' checkpoint; then a plain fastai learner on the CPU
    learn = digit_rows_learner().to_tpu_distributed(fsdp=True)
    learn.load('sharded')
    report['validated'] = [float(v) for v in learn.validate()]
    plain = digit_rows_learner()
    try: plain.load('sharded'); report['refused'] = None
    except RuntimeError as e: report['refused'] = str(e)
    plain.load('whole')
    report['plain'] = [float(v) for v in plain.validate()]
    exported = load_learner('sharded.pkl')
    report['exported'] = dict(cls=type(exported.model).__name__, same=all(torch.equal(a, b) for a, b in zip(
        exported.model.state_dict().values(), plain.model.state_dict().values())))
report['listening'] = listening_addresses()   # (the run's gloo group and FSDP2's default group alive)
Path(f'report-{{replica_ordinal()}}.json').write_text(json.dumps(report))
'''

NATIVE_CPU = {'FASTAI_XLA_BACKEND': 'native', 'FASTAI_XLA_NATIVE_DEVICE': 'cpu', 'PJRT_DEVICE': 'CPU'}
# the eager `tpu` test device (tests/eager_tpu.py), loaded at `import torch` in every process torchrun starts
EAGER_TPU = dict(FASTAI_XLA_NATIVE_DEVICE='tpu', FASTAI_XLA_EAGER_TPU='1',
                 PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), os.environ.get('PYTHONPATH', '')) if p))

def torchrun(folder, nproc, phase, **env):
    folder.mkdir(exist_ok=True)
    (folder/'train.py').write_text(SCRIPT.format(tests=str(TESTS), phase=phase))
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc-per-node={nproc}', 'train.py'],
                       cwd=folder, capture_output=True, text=True, timeout=900,
                       env={**os.environ, **NATIVE_CPU, **env})
    assert r.returncode == 0, r.stderr[-5000:]
    return {int(p.stem.split('-')[1]): json.loads(p.read_text()) for p in folder.glob('report-*.json')}

def check_sharded_like_replicated(report, name, replicas):
    rep, sh = report[f'{name} replicated'], report[f'{name} sharded']
    assert sh['sharded'] and not rep['sharded']
    assert len(sh['losses']) == len(rep['losses']) >= 20
    worst = max(abs(a - b) / abs(a) for a, b in zip(rep['losses'], sh['losses']))
    assert worst <= 1e-3, f'{name}: sharded losses differ from replicated by {worst:.2e} (relative)'
    for part in ('params', 'opt_state'):   # (each replica: its shard, 1/N, and what does not divide evenly)
        share = sh['bytes'][part] / rep['bytes'][part]
        assert share <= 1 / replicas + 0.1, f'{name}: a sharded replica holds {share:.2f} of the {part}'
    assert rep['bytes']['params'] == rep['whole']
    print(f"{name}, {replicas} replicas: sharded params {sh['bytes']['params'] / rep['bytes']['params']:.3f}, optimizer state "
          f"{sh['bytes']['opt_state'] / rep['bytes']['opt_state']:.3f} of replicated; losses within {worst:.1e}")

def test_sharded_trains_as_replicated_holds_its_shards_and_saves_whole(tmp_path):
    """2 replicas: the tabular learner, a CNN's `fine_tune` (frozen body, then discriminative rates; `GradientClip`) and the
    transformer, sharded and replicated, the same losses step by step (relative
    1e-3), each sharded replica holding at most 1/2 + 0.1 of the parameters and of Adam's state; the transformer's sharded
    save, loaded by 1 sharded replica and by a plain fastai learner, validates to the 2 replicas' loss and accuracy; the
    master's `predict` alone on a sharded learner is named after the timeout (with what to do), not left waiting."""
    reports = torchrun(tmp_path, 2, 'train')
    assert sorted(reports) == [0, 1]
    for name in ('tabular', 'vision fine_tune', 'transformer'): check_sharded_like_replicated(reports[0], name, 2)
    assert reports[0]['validated'] == reports[1]['validated']
    for r in reports.values():   # (`detach_xla`: fastai's own learner, whole model and state, on every replica)
        d = r['detached']
        assert d['cls'] == 'Sequential' and d['state_whole'] and d['validated'] == pytest.approx(r['validated'], rel=1e-4), d
        assert d['loss'] < 2 * r['validated'][0], d
    alone = reports[0]['alone']   # (the master's `predict` alone, on a sharded learner: named after the timeout, what to do said)
    assert alone.startswith('ReplicasDiverged') and 'replica 1 did not come' in alone and 'whole on no replica' in alone, alone
    assert reports[0]['folders'] == ['bg_0 2', 'bg_1 2', 'later 2', 'sharded 2']   # (one folder a checkpoint, a file of shards per replica)
    for r in reports.values():   # (saved in the background: each checkpoint the weights of its epoch, named once written)
        assert r['background'] == [0., 0.] and r['later'] == 0. and not r['named before finished'], r
    rep, sh = reports[0]['bf16 replicated'], reports[0]['bf16 sharded']   # (bfloat16 gathered, float32 kept: another rounding)
    assert rep['dtypes'] == ['torch.float32'] and sh['dtypes'] == ['torch.bfloat16']
    print(f"bf16, 2 replicas: valid loss {rep['loss']:.4f} replicated (autocast), {sh['loss']:.4f} sharded (bf16 gathered); "
          f"accuracy {rep['metric']:.4f}, {sh['metric']:.4f}")
    assert abs(sh['loss'] - rep['loss']) <= 0.1 * rep['loss'] and abs(sh['metric'] - rep['metric']) <= 0.03, (rep, sh)
    loaded = torchrun(tmp_path, 1, 'load')[0]
    for got in (loaded['validated'], loaded['plain']):
        assert got == pytest.approx(reports[0]['validated'], rel=1e-4)
    assert loaded['exported'] == dict(cls='Sequential', same=True)
    assert 'fastai_xla_sharded' in loaded['refused']         # (fastai's own load, of the file that names a folder of shards: its keys named)   # (`export`: the plain model, the saved weights)

@pytest.mark.parametrize('device', ['cpu', 'tpu'])
def test_four_replicas_hold_a_quarter_and_listen_on_loopback_alone(tmp_path, device):
    """4 replicas, each making its model from a seed of its own: the tabular learner sharded trains as replicated (both from
    the master's weights: sharded, sent a tensor at a time as the model is sharded on the host), each replica holding at
    most 1/4 + 0.1 of the parameters and state; every port a replica listens on (its run's gloo group, and the default group FSDP2's mesh is made over, which
    `init_process_group` builds from the environment alone) is on loopback, though `GLOO_SOCKET_IFNAME` names the network's
    interface (as a platform may set it; gloo's own choice, the machine's name, is loopback on this machine, so the variable
    is what would show a group on the network here). On the CPU (gloo) and on the eager `tpu` test device (its `tpu_dist`)."""
    iface = network_interface()
    reports = torchrun(tmp_path, 4, 'train', **({'GLOO_SOCKET_IFNAME': iface} if iface else {}), **(EAGER_TPU if device == 'tpu' else {}))
    assert sorted(reports) == [0, 1, 2, 3]
    check_sharded_like_replicated(reports[0], 'tabular', 4)
    for r in reports.values():
        assert len(r['listening']) >= 2 and all(ip in ('127.0.0.1', '::1') for ip, _ in r['listening']), r['listening']

def test_one_replica_shards_on_the_native_device(tmp_path):
    """One replica (`torchrun --nproc-per-node=1`) on the native backend's device, `FASTAI_XLA_FSDP_DEVICE` (default the
    CPU; scripts/native_gpu.sh sets `cuda`: nccl, one GPU, one replica): the tabular learner sharded trains as replicated,
    saves (at once and in the background), exports and detaches; every port it listens on is on loopback."""
    device = os.environ.get('FASTAI_XLA_FSDP_DEVICE', 'cpu')
    reports = torchrun(tmp_path, 1, 'train', FASTAI_XLA_NATIVE_DEVICE=device)
    check_sharded_like_replicated(reports[0], 'tabular', 1)
    r = reports[0]
    assert r['background'] == [0., 0.] and r['later'] == 0. and r['folders'] == ['bg_0 1', 'bg_1 1', 'later 1', 'sharded 1']
    assert r['detached']['state_whole'] and r['detached']['validated'] == pytest.approx(r['validated'], rel=1e-4)
    assert all(ip in ('127.0.0.1', '::1') for ip, _ in r['listening']), r['listening']

def test_two_replicas_shard_on_the_eager_tpu_test_device(tmp_path):
    """2 replicas on the eager `tpu` test device (tests/eager_tpu.py: TorchTPU's kind of device, and its process group
    `tpu_dist`, whose collectives gloo runs over host copies, with no `ReduceOp.AVG` as TorchTPU's): the tabular learner, a
    CNN's `fine_tune` and the transformer sharded train as replicated (FSDP2 over `tpu_dist`, summing, then dividing), each
    replica holding at most 1/2 + 0.1 of the parameters and of Adam's state; saves in the background hold their epoch's
    weights; 1 replica on the device loads the 2 replicas' sharded save, a plain fastai learner the whole one, both
    validating as the 2 did, and `load_learner` opens the export. What it cannot show: TorchTPU's own collectives over the
    chips' interconnect, and asynchrony (the test device has none)."""
    reports = torchrun(tmp_path, 2, 'device', **EAGER_TPU)
    assert sorted(reports) == [0, 1]
    for name in ('tabular', 'vision fine_tune', 'transformer'): check_sharded_like_replicated(reports[0], name, 2)
    assert reports[0]['where'] == ['tpu:0', 'tpu_dist', 'tpu:0'], reports[0]['where']
    for r in reports.values(): assert r['background'] == [0., 0.], r['background']
    loaded = torchrun(tmp_path, 1, 'load', **EAGER_TPU)[0]       # (1 replica on the device: DCP reshards the 2 replicas' shards)
    for got in (loaded['validated'], loaded['plain']): assert got == pytest.approx(reports[0]['validated'], rel=1e-4)
    assert loaded['exported'] == dict(cls='Sequential', same=True)

@pytest.mark.parametrize('device', ['cpu', 'tpu'])
def test_a_sharded_run_killed_under_max_restarts_ends_with_the_weights_of_a_run_never_stopped(tmp_path, device):
    """tests/test_torchrun.py's script sharded: `torchrun --max-restarts=1` with `ResumeCallback`, replica 1 SIGKILLed in epoch
    1; the new attempt loads the sharded run's resume checkpoint of epoch 0 (every replica its shards of it) and ends with
    the weights of a sharded run never stopped. On the CPU (gloo) and on the eager `tpu` test device (its `tpu_dist`)."""
    env = {**NATIVE_CPU, 'TEST_FSDP': '1', **(EAGER_TPU if device == 'tpu' else {})}
    (tmp_path/'killed').mkdir(); (tmp_path/'whole').mkdir()
    r, killed, _ = elastic_run(tmp_path/'killed', '--standalone', '--nproc-per-node=2', '--max-restarts=1', kill=True, resume=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert sorted(killed) == [0, 1] and all(x['attempt'] == 1 and x['epochs'] == 3 for x in killed.values()), killed
    r2, whole, _ = elastic_run(tmp_path/'whole', '--standalone', '--nproc-per-node=2', resume=True, env=env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    for a, b in zip(killed[0]['params'], whole[0]['params']): assert max(abs(u - v) for u, v in zip(a, b)) < 1e-6

LAUNCH = '''
import json, sys
sys.path.insert(0, {tests!r})
from helpers import *
from fastai_xla.fsdp import holds_shards
from fastai_xla.checkpoint import BackgroundSaves
def train(learn):   # (saving in the background, as a notebook's user might, in the launched replicas)
    learn.fit(1, 1e-2, cbs=[BackgroundSaves(), SaveModelCallback(every_epoch=True, fname='bg')])
    validated = [float(v) for v in learn.validate()]
    learn.load('bg_0')
    return dict(sharded=holds_shards(learn.model), validated=validated, reloaded=[float(v) for v in learn.validate()])
learn = tabular_digits_learner(seed=0)
out = learn.launch(train, nprocs=2, dl_kwargs=dict(fsdp=True))
print(json.dumps(dict(out, back=[float(v) for v in learn.validate()], cls=type(learn.model).__name__)))
'''

def test_a_launch_trains_sharded_and_brings_back_the_whole_weights(tmp_path):
    """`learn.launch(train, nprocs=2, dl_kwargs=dict(fsdp=True))`, as from a notebook: the replicas train sharded; the
    launching process's learner (fastai's, on the CPU) gets the whole weights (gathered by every replica, written by the
    master) and validates as the replicas did; the replicas' checkpoint saved in the background loads to the same validation."""
    (tmp_path/'launch.py').write_text(LAUNCH.format(tests=str(TESTS)))
    r = subprocess.run([sys.executable, 'launch.py'], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, **NATIVE_CPU})
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out['sharded'] and out['cls'] == 'TabularModel'
    assert out['back'] == pytest.approx(out['validated'], rel=1e-5)
    assert out['reloaded'] == pytest.approx(out['validated'], rel=1e-5)   # (the epoch's checkpoint, written in the background)
