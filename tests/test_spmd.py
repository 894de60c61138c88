"""SPMD (`learn.to_tpu_spmd()`) on 8 simulated XLA CPU devices, each run in a fresh process
(SPMD must be switched on before the XLA runtime starts; this pytest process has started it).

What runs for real here: torch_xla's SPMD partitioner over 8 CPU devices, the batch split at
transfer, the compiler-inserted gradient reduction (and, with `shard_params`, its all-gathers
and reduce-scatters), fastai's loop, metrics, save/load and export, a sharded run's folders of shards (loaded on another
mesh, and resumed by `ResumeCallback` in a new process to the weights of a run never stopped). What does not: TPU
hardware, and multi-host SPMD (one process per host of a pod), which needs several hosts."""
import json, os, subprocess, sys
import pytest

WORKER = '''
import json, sys, torch
from fastai.basics import *
from fastai.callback.all import *
sys.path.insert(0, {tests!r})
from helpers import *

mode, data, epochs = {mode!r}, {data!r}, {epochs}

class StepLosses(Callback):
    "Every training step's loss, kept on the device, read once at the end."
    order = 51
    def before_fit(self): self.losses = []
    def after_batch(self):
        if self.training: self.losses.append(self.learn.loss.detach())

learn = digits_learner(seed=0) if data == 'digits' else tabular_digits_learner(seed=0)
if mode == 'cpu': pass
elif mode == 'single': learn.to_xla(seed=0)
else: learn.to_tpu_spmd(seed=0, shard_params=(mode == 'spmd-fsdp'))
steps = StepLosses()
with learn.no_bar(), learn.no_logging(): learn.fit(epochs, 1e-2, cbs=steps)
res = dict(losses=[float(l) for l in to_host(steps.losses)] if mode != 'cpu' else [float(l) for l in steps.losses],
           acc=learn.recorder.values[-1][learn.recorder.metric_names.index('accuracy') - 1])
if mode != 'cpu':
    res['compiles'] = [r['compiles'] for r in learn.xla_diagnostics.epochs]
if mode.startswith('spmd'):
    xb = learn.dls.train.one_batch()[0 if data == 'digits' else 1]
    step_boundary()                           # (a pending tensor has no layout yet; the compiled step gives it one)
    res['batch_sharding'] = sharding_of(xb)
    res['param_shardings'] = [sharding_of(p) for p in learn.model.parameters()]
    res['param_shapes'] = [list(p.shape) for p in learn.model.parameters()]
    # a whole checkpoint holds whole CPU tensors, whatever the layout on the devices
    learn.save('spmd', sharded=False)
    sd = torch.load(learn.path/learn.model_dir/'spmd.pth', map_location='cpu', weights_only=False)
    sd = sd.get('model', sd)
    res['saved_on_cpu'] = all(t.device.type == 'cpu' for t in sd.values())
    res['saved_equal'] = all(torch.equal(sd[k], to_host(v)) for k, v in learn.model.state_dict().items())
    # exported, it predicts on a CPU-only learner exactly what it predicts on the mesh
    preds, _ = learn.get_preds()
    learn.export('spmd.pkl')
    cpu = load_learner(learn.path/'spmd.pkl')
    raw = learn.dls.valid_ds.items if data == 'digits' else digits_frame()[0].loc[learn.dls.valid_ds.items.index]
    cpu_preds, _ = cpu.get_preds(dl=cpu.dls.test_dl(raw, with_labels=True))
    res['export_max_diff'] = (cpu_preds - preds).abs().max().item()
    if mode == 'spmd-fsdp':   # its own save: a torch.distributed.checkpoint folder, each device's shards (torch_xla's SPMD planners)
        learn.save('sharded')
        res.update(sharded_files=sorted(p.name for p in (learn.path/learn.model_dir).iterdir()), **saved_state(learn))
print('RESULT', json.dumps(res))
'''

STATE = '''
def saved_state(learn):
    "What a checkpoint restores: the validation loss and accuracy, and a digest of each tensor of the optimizer's state."
    state = [v for p in learn.model.parameters() for v in learn.opt.state[p].values() if isinstance(v, torch.Tensor)]
    return dict(valid=[float(v) for v in learn.validate()], opt=[float(v.double().abs().sum().cpu()) for v in state],
                opt_sharding=[sharding_of(v) for v in state])
'''
WORKER = WORKER.replace("mode, data, epochs =", STATE + "\nmode, data, epochs =")

LOADER = '''
import json, sys, torch
from fastai.basics import *
sys.path.insert(0, {tests!r})
from helpers import *
''' + STATE + '''
learn = digits_learner()
torch.manual_seed(7)                                   # (other first weights)
for m in learn.model.modules():
    if hasattr(m, 'reset_parameters'): m.reset_parameters()
learn.to_tpu_spmd(seed=0, shard_params=True)           # (another mesh: 4 devices)
learn.load('sharded')
res = saved_state(learn)
learn.load('spmd')                                     # (the whole file `save(name, sharded=False)` wrote: fastai's own load)
print('RESULT', json.dumps(dict(res, whole=saved_state(learn))))
'''

def run(tmp_path, mode, data='digits', epochs=3, devices=8):
    code = WORKER.format(tests=os.path.dirname(__file__), mode=mode, data=data, epochs=epochs)
    env = {**os.environ, 'PJRT_DEVICE': 'CPU', 'CPU_NUM_DEVICES': str(devices)}
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = [l for l in r.stdout.splitlines() if l.startswith('RESULT ')][-1]
    return json.loads(line[len('RESULT '):])

def close(a, b, rtol): return all(abs(x - y) <= rtol * max(1.0, abs(y)) for x, y in zip(a, b))

@pytest.mark.parametrize('data', ['digits', 'tabular'])
def test_spmd_trains_like_one_device(tmp_path, data):
    one, spmd = run(tmp_path, 'single', data), run(tmp_path, 'spmd', data)
    # the batch is split by rows over the 8 devices (read from torch_xla, not assumed)
    assert spmd['batch_sharding'].startswith('{devices=[8'), spmd['batch_sharding']
    assert all(s in ('', '{replicated}') for s in spmd['param_shardings'])
    # the same global batches give the same losses: the compiler's gradient reduction is right
    n = len(one['losses'])
    assert n == len(spmd['losses']) and n >= 3 * 20
    assert close(spmd['losses'][:10], one['losses'][:10], 1e-4), (spmd['losses'][:10], one['losses'][:10])
    assert close(spmd['losses'], one['losses'], 2e-2)        # float reduction order drifts a little over 3 epochs
    assert abs(spmd['acc'] - one['acc']) <= 0.02 and spmd['acc'] > 0.85
    assert spmd['compiles'][0] > 0 and spmd['compiles'][1:] == [0, 0]
    assert spmd['saved_on_cpu'] and spmd['saved_equal'] and spmd['export_max_diff'] < 1e-5

def test_sharded_parameters_train_like_replicated(tmp_path):
    rep, fsdp = run(tmp_path, 'spmd'), run(tmp_path, 'spmd-fsdp')
    split = [s for s, shape in zip(fsdp['param_shardings'], fsdp['param_shapes']) if shape[0] % 8 == 0]
    kept = [s for s, shape in zip(fsdp['param_shardings'], fsdp['param_shapes']) if shape[0] % 8]
    assert split and all(s.startswith('{devices=[8') for s in split), fsdp['param_shardings']   # still split after training
    assert kept and all(s in ('', '{replicated}') for s in kept)
    assert close(fsdp['losses'][:10], rep['losses'][:10], 1e-4), (fsdp['losses'][:10], rep['losses'][:10])
    assert abs(fsdp['acc'] - rep['acc']) <= 0.02
    assert fsdp['compiles'][1:] == [0, 0]
    assert fsdp['saved_on_cpu'] and fsdp['saved_equal'] and fsdp['export_max_diff'] < 1e-5
    # its own save, a folder of shards, loaded on a mesh of 4 devices into a learner of other first weights: the same
    # validation, the same optimizer state, laid out over the 4
    assert len([f for f in fsdp['sharded_files'] if f.startswith('sharded.') and f.endswith('.dcp')]) == 1, fsdp['sharded_files']
    code = LOADER.format(tests=os.path.dirname(__file__))
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=tmp_path, timeout=900,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU', 'CPU_NUM_DEVICES': '4'})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    loaded = json.loads([l for l in r.stdout.splitlines() if l.startswith('RESULT ')][-1][len('RESULT '):])
    assert loaded['valid'] == pytest.approx(fsdp['valid'], rel=1e-5) and loaded['opt'] == pytest.approx(fsdp['opt'], rel=1e-5)
    assert any(s.startswith('{devices=[8') for s in fsdp['opt_sharding']) and any(s.startswith('{devices=[4') for s in loaded['opt_sharding'])
    assert loaded['whole']['valid'] == pytest.approx(fsdp['valid'], rel=1e-5)

RESUMED = '''
import json, sys, torch
from fastai.basics import *
sys.path.insert(0, {tests!r})
from helpers import *
from fastai_xla.resume import ResumeCallback
phase = {phase!r}

class StopAfterFirstEpoch(Callback):
    "A run stopped after its first epoch (after `ResumeCallback` wrote that epoch's checkpoint)."
    order = 99
    def after_epoch(self): raise CancelFitException()

learn = digits_learner(seed=0)
if phase == 'resumed':                                 # (another process, other first weights: all from the checkpoint)
    torch.manual_seed(7)
    for m in learn.model.modules():
        if hasattr(m, 'reset_parameters'): m.reset_parameters()
learn.to_tpu_spmd(seed=0, shard_params=True)
start = learn.load_resume('run', missing_ok=True)
cbs = [ResumeCallback('run')] + ([StopAfterFirstEpoch()] if phase == 'stopped' else [])
with learn.no_bar(), learn.no_logging(): learn.fit(3, 1e-2, start_epoch=start, cbs=cbs)
print('RESULT', json.dumps(dict(start=start, valid=[float(v) for v in learn.validate()],
                                folders=sorted(p.name for p in (learn.path/learn.model_dir).glob('*.dcp')),
                                weights=[float(to_host(p).double().abs().sum()) for p in learn.model.parameters()])))
'''

def test_a_sharded_spmd_run_stopped_resumes_to_the_weights_of_a_run_never_stopped(tmp_path):
    """`to_tpu_spmd(shard_params=True)` with `ResumeCallback`: a 3-epoch run stopped after its first epoch (the resume
    checkpoint a folder of each device's shards), then the same script in a new process (other first weights) resumes from
    epoch 1 and ends with the validation and weights of the run never stopped (the same process kind, another folder)."""
    def run_phase(folder, phase):
        folder.mkdir(exist_ok=True)
        r = subprocess.run([sys.executable, '-c', RESUMED.format(tests=os.path.dirname(__file__), phase=phase)], capture_output=True,
                           text=True, cwd=folder, timeout=900, env={**os.environ, 'PJRT_DEVICE': 'CPU', 'CPU_NUM_DEVICES': '8'})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return json.loads([l for l in r.stdout.splitlines() if l.startswith('RESULT ')][-1][len('RESULT '):])
    stopped = run_phase(tmp_path/'stopped', 'stopped')
    assert stopped['start'] == 0 and len(stopped['folders']) == 1, stopped    # (the resume checkpoint: one folder of shards)
    resumed, whole = run_phase(tmp_path/'stopped', 'resumed'), run_phase(tmp_path/'whole', 'whole')
    assert resumed['start'] == 1 and whole['start'] == 0
    assert resumed['valid'] == pytest.approx(whole['valid'], rel=1e-4) and resumed['weights'] == pytest.approx(whole['weights'], rel=1e-4)
