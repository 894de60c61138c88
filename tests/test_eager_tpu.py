"""The eager `tpu` test device (tests/eager_tpu.py, tests/eager_tpu_device.cpp) and the native backend's TorchTPU branches,
executed on it.

scripts/test.sh runs this file in the native backend's step on the device (`FASTAI_XLA_BACKEND=native
FASTAI_XLA_NATIVE_DEVICE=tpu`: tests/conftest.py imports eager_tpu, which builds the device on the installed torch and
registers it in the pytest process and in every process started from it). Elsewhere the device's tests are skipped, but
the build's refusal without a compiler, which runs wherever the device can be built (a process of its own).

Covered on the device: tensors apart from the host, a host tensor mixed in refused; forward and backward of convolutions,
BatchNorm and an LSTM equal to the CPU's; the device's own random generator; the native backend's choice of `tpu`, its
refusal of `fork`, TorchTPU's launch environment set before replicas start, one process per device through
`learn.launch` (two replicas meeting over the device's own process group, `tpu_dist`, as on TorchTPU: the test device's
runs gloo over host copies, takes device tensors alone and has no `ReduceOp.AVG`), the
device's RNG state in a checkpoint's states, bf16 autocast, export and `get_preds`, the self-check; the README's vision
recipe and a tabular learner against eager CPU, and compiled (`compile=True`: `aot_eager`) against uncompiled. `torchrun` on it: tests/test_torchrun.py (`[native-tpu]`). Not covered (what only a chip shows): asynchrony (every op of this device
has finished when it returns), TorchTPU's precision of fp32 matmuls, its fusion and compiler, its collectives over the
chips' interconnect. Sharded models (FSDP2 over `tpu_dist`) on the device: tests/test_fsdp.py."""
import os, sys, json, subprocess, importlib.util
from pathlib import Path
import pytest, torch
from helpers import *

HERE = Path(__file__).parent
ON_DEVICE = torch._C._get_privateuse1_backend_name() == 'tpu' and importlib.util.find_spec('torch_tpu') is None
on_device = pytest.mark.skipif(not ON_DEVICE, reason='the eager tpu test device is not loaded (FASTAI_XLA_NATIVE_DEVICE=tpu: scripts/test.sh)')

def run_py(code:str, timeout=600, **env):
    "`code` in a fresh Python of this environment (which loads the device at `import torch` where this process has it)."
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})

@pytest.mark.skipif(importlib.util.find_spec('torch_tpu') is not None, reason="with Google's TorchTPU the real `tpu` is there")
def test_building_without_a_compiler_is_a_clear_error(tmp_path):
    res = run_py('import eager_tpu', CXX='/nonexistent/c++', XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(HERE),
                 FASTAI_XLA_EAGER_TPU='0')
    assert res.returncode == 1 and 'this machine has no C++ compiler (`/nonexistent/c++` is not on PATH)' in res.stderr, res.stderr[-2000:]

@on_device
def test_the_device_is_apart_from_the_host_and_refuses_host_tensors():
    x = torch.arange(6.).to('tpu')
    assert x.device == torch.device('tpu', 0) and x.is_tpu and torch.accelerator.current_accelerator().type == 'tpu'
    with pytest.raises(RuntimeError, match='Expected all tensors to be on the same device'): x + torch.ones(6)
    with pytest.raises(RuntimeError, match='Expected all tensors to be on the same device'): torch.nn.Linear(6, 1).to('tpu')(torch.ones(2, 6))
    assert torch.equal((x * torch.tensor(2.)).cpu(), torch.arange(0., 12., 2.))      # a 0-dim host scalar, as on CUDA
    assert torch.equal(x[torch.tensor([1, 3])].cpu(), torch.tensor([1., 3.]))         # host indices, as on CUDA
    view = x.view(2, 3).t(); view[0, 1] = 10                                          # a view shares the device memory
    assert x[3].item() == 10 and torch.tpu.ops_run() > 0

@on_device
def test_forward_and_backward_equal_the_cpus():
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten())
    lstm = torch.nn.LSTM(5, 7, num_layers=2, batch_first=True)
    for model, x in ((conv, torch.randn(4, 3, 8, 8)), (lstm, torch.randn(3, 4, 5))):
        grads = []
        for device in ('cpu', 'tpu'):
            model.to(device).zero_grad()
            y = model(x.to(device)); y = y[0] if isinstance(y, tuple) else y
            (y * y).sum().backward()
            grads.append([p.grad.cpu() for p in model.parameters()])
        for a, b in zip(*grads): torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

@on_device
def test_the_device_has_a_random_generator_of_its_own():
    torch.tpu.manual_seed(3); a = torch.randn(4, device='tpu')
    cpu_before = torch.get_rng_state()
    torch.tpu.manual_seed(3); b = torch.randn(4, device='tpu')
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(torch.get_rng_state(), cpu_before)   # the CPU's untouched
    state = torch.tpu.get_rng_state(); c = torch.rand(3, device='tpu')
    torch.tpu.set_rng_state(state); assert torch.equal(torch.rand(3, device='tpu').cpu(), c.cpu())
    torch.manual_seed(5); d = torch.rand(2, device='tpu'); torch.manual_seed(5)            # torch.manual_seed seeds it too
    assert torch.equal(torch.rand(2, device='tpu').cpu(), d.cpu())

@on_device
def test_the_native_backend_chooses_the_device_and_takes_its_tpu_paths():
    from fastai_xla.backend_native import Native, native_device_type, stand_in_tpu, _chip_replicas
    assert stand_in_tpu() and native_device_type() == 'tpu' and native_device_type('tpu') == 'tpu'
    native = Native()
    assert native.runtime.device() == torch.device('tpu', 0) and native.process_group == 'tpu_dist'   # (the test device's: tests/eager_tpu.py)
    launcher = native.launcher(Settings(rank=0, world_size=2, master_addr='127.0.0.1', master_port=1))
    with pytest.raises(ValueError, match="TorchTPU refuses `fork`: use start_method='spawn'"): launcher.start_method('fork', False)
    assert launcher.start_method('auto', False) == 'spawn'
    assert _chip_replicas(None) == 1 and _chip_replicas(2) == 2   # (a stand-in: no chip on the PCI bus to count)
    state = rng_states(native.runtime)
    assert torch.equal(state['device'], torch.tpu.get_rng_state())                         # the device's, in a checkpoint's states
    drawn = torch.rand(3, device='tpu').cpu()
    set_rng_states(state, native.runtime)
    assert torch.equal(torch.rand(3, device='tpu').cpu(), drawn)

def _note_replica(learn, out):
    "In each replica: where it trained, and what TorchTPU's launch environment said; then a short fit."
    learn.fit(1, 1e-2)
    Path(out, f'replica{replica_ordinal()}.json').write_text(json.dumps(dict(
        device=str(next(learn.model.parameters()).device), launch_nprocs=os.environ.get('EAGER_TPU_LAUNCH_NPROCS'))))

@on_device
def test_launch_starts_a_process_per_device_after_torchtpus_launch_environment(tmp_path):
    learn = linear_digits_learner()
    learn.launch(_note_replica, str(tmp_path), nprocs=2, transport='xla', backend='native')
    seen = [json.loads((tmp_path/f'replica{i}.json').read_text()) for i in range(2)]
    assert seen == [dict(device='tpu:0', launch_nprocs='2')] * 2, seen
    assert final(learn, 'accuracy') > 0.5 and next(learn.model.parameters()).device.type == 'cpu'   # weights came back

def readme_recipe(tmp_path):
    "The README's vision learner on the digits written to `tmp_path`, made anew each call from the same seed."
    from fastai.vision.all import ImageDataLoaders, vision_learner, resnet18, aug_transforms
    from fastai_xla.demo import digits_folder
    path = digits_folder(tmp_path/'digits')
    def readme_learner():
        set_seed(0, reproducible=True)
        dls = ImageDataLoaders.from_folder(path, valid_pct=0.2, seed=42, bs=64, num_workers=0,
                                           batch_tfms=aug_transforms(do_flip=False, max_zoom=1.0))
        return vision_learner(dls, resnet18, pretrained=False, metrics=accuracy)
    return readme_learner

@on_device
def test_the_readme_recipe_and_tabular_learn_like_eager_cpu(tmp_path):
    readme_learner = readme_recipe(tmp_path)
    for make in (readme_learner, tabular_digits_learner):
        cpu = make(); cpu.fit_one_cycle(3, 3e-3)
        ops = torch.tpu.ops_run()
        tpu = make().to_tpu_distributed(backend='native', seed=0); tpu.fit_one_cycle(3, 3e-3)
        assert next(tpu.model.parameters()).device.type == 'tpu' and torch.tpu.ops_run() > ops
        acc_cpu, acc_tpu = final(cpu, 'accuracy'), final(tpu, 'accuracy')
        assert acc_tpu > 0.8 and abs(acc_tpu - acc_cpu) <= 0.05, (make.__name__, acc_cpu, acc_tpu)

@on_device
def test_compiled_steps_learn_like_eager_ones_and_compile_in_the_first_epoch_alone(tmp_path):
    """`compile=True` on the device (16_compile): `aot_eager`, the stand-in having no code generator (AOTAutograd's graphs,
    forward and backward, run by the device's kernels): the README's recipe and a tabular learner train to the accuracy of
    their uncompiled fit on the device, dynamo compiles in the first epoch alone, with no graph break in fastai's models;
    the optimizer's step is compiled too (its numbers sent to the device as one tensor)."""
    for make in (readme_recipe(tmp_path), tabular_digits_learner):
        eager = make().to_tpu_distributed(backend='native', seed=0); eager.fit_one_cycle(2, 3e-3)
        compiled = make().to_tpu_distributed(backend='native', seed=0, compile=True); compiled.fit_one_cycle(2, 3e-3)
        assert compiled.xla_compile_options['backend'] == 'aot_eager' and compiled.opt.compiled_steps.graphs
        fits = [r for r in compiled.xla_diagnostics.epochs if r['kind'] == 'fit']
        assert fits[0]['compiles'] > 0 and fits[1]['compiles'] == 0 and sum(r['graph_breaks'] for r in fits) == 0, fits
        acc_eager, acc_compiled = final(eager, 'accuracy'), final(compiled, 'accuracy')
        assert abs(acc_compiled - acc_eager) <= 0.03, (make.__name__, acc_eager, acc_compiled)

@on_device
def test_bf16_autocast_export_and_get_preds_on_the_device(tmp_path):
    learn = digits_learner().to_tpu_distributed(backend='native', seed=0).to_bf16()
    dtypes = []
    hook = learn.model[-1].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    learn.fit_one_cycle(3, 1e-2)
    hook.remove()
    assert dtypes and set(dtypes) == {torch.bfloat16} and final(learn, 'accuracy') > 0.8   # the Linear ran in bf16
    preds, targs = learn.get_preds()
    assert preds.shape == (len(learn.dls.valid_ds), 10) and preds.device.type == 'cpu'
    learn.export(tmp_path/'digits.pkl')
    again = load_learner(tmp_path/'digits.pkl')
    assert next(again.model.parameters()).device.type == 'cpu'
    preds_again, _ = again.get_preds(dl=again.dls.test_dl(learn.dls.valid_ds.items, with_labels=True))
    assert (preds.argmax(1) == preds_again.argmax(1)).float().mean() > 0.95   # (bf16 on the device, fp32 on the host)

@on_device
def test_the_self_check_passes_on_the_device_and_started_processes_load_it():
    res = run_py("import torch; print(torch.zeros(1, device='tpu').device)")
    assert res.returncode == 0 and res.stdout.strip() == 'tpu:0', res.stderr[-2000:]
    res = run_py('from fastai_xla.check import main; main()', timeout=900, FASTAI_XLA_BACKEND='native')
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert 'backend native on tpu' in res.stdout and ' 0 failed' in res.stdout and 'FAIL ' not in res.stdout, res.stdout[-4000:]
