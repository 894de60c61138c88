"""An eager test device named `tpu`: TorchTPU's kind of device (PyTorch's PrivateUse1 key renamed `tpu`, eager, one op
at a time, a device apart from the host), built from `tests/eager_tpu_device.cpp` on the installed torch, for the native
backend's tests where there is no TPU chip.

    import eager_tpu        # (with tests/ on the path) registers `tpu` in this process, and in the processes it starts

The first import builds the device with `torch.utils.cpp_extension` (a C++ compiler and ninja; about a minute on two
cores) into ~/.cache/fastai_xla/eager_tpu/<key of the source and torch>/, and later imports load it from there. It also
sets `FASTAI_XLA_EAGER_TPU=1` and puts tests/ on `PYTHONPATH`: a process started from this one (spawn, torchrun,
`learn.launch`, a subprocess) then loads the device at `import torch`, through the entry point of
tests/eager_tpu_test_device-0.dist-info and tests/eager_tpu_autoload.py (PyTorch's `torch.backends` group, the way TorchTPU itself is loaded). By hand:

    PYTHONPATH=tests FASTAI_XLA_EAGER_TPU=1 FASTAI_XLA_BACKEND=native python -m fastai_xla.check

What it is: an allocator of host memory handed out as the device's, a device guard (one device per process, `tpu:0`),
hooks (available, a generator of its own), the kernels that make and view tensors, and a fallback that runs every other
op with its host kernel on host views of the device's memory. What a real device refuses, it refuses: an op mixing a
device tensor with a host tensor (other than a 0-dim scalar) raises "Expected all tensors to be on the same device".
What it cannot show: asynchrony (every op has finished when it returns: its streams, PyTorch's `torch.Stream` and
`torch.Event` of the device, which FSDP2 uses, have nothing to wait for), TorchTPU's precision of fp32 matmuls, its fusion and
compiler, its memory limits, its collectives over the chips' interconnect.

Its process group, `tpu_dist` (TorchTPU's name, `TpuDistOverGloo`): a `torch.distributed` group of the device's own, as
TorchTPU's is, which takes the device's tensors only and has no `ReduceOp.AVG` (TorchTPU's has none: FSDP2 is told to sum,
then divide); its collectives are gloo's, run on host copies of the tensors, the results copied back to the device."""
import os, sys, types, fcntl, hashlib, shutil, importlib.util
from pathlib import Path
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
SOURCE = HERE/'eager_tpu_device.cpp'
GATE = 'FASTAI_XLA_EAGER_TPU'   # set: processes with tests/ on their path load the device at `import torch`

def build_dir() -> Path:
    "Where the device is built: one folder per source and torch version (and Python's ABI)."
    key = hashlib.sha256(SOURCE.read_bytes() + f'{torch.__version__} {sys.implementation.cache_tag}'.encode()).hexdigest()[:16]
    return Path(os.environ.get('XDG_CACHE_HOME') or Path.home()/'.cache')/'fastai_xla'/'eager_tpu'/key

def library() -> Path:
    "The device's shared library: built here the first time (one process builds, the others wait), then loaded from the cache."
    folder = build_dir(); built = folder/'eager_tpu_device.so'
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder/'build.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():   # (built beside, then moved in whole: a build cut short never leaves a broken library)
            _build(folder/'build')
            os.replace(folder/'build'/built.name, built)
    return built

def _build(folder:Path):
    compiler = os.environ.get('CXX', 'c++')
    if shutil.which(compiler) is None:
        raise RuntimeError(f"The eager tpu test device is C++ built on the installed torch, and this machine has no C++ "
                           f"compiler (`{compiler}` is not on PATH): install one (`apt install g++`) or set CXX to one.")
    os.environ['PATH'] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"   # (the venv's ninja)
    from torch.utils import cpp_extension
    folder.mkdir(exist_ok=True)
    cpp_extension.load(name='eager_tpu_device', sources=[str(SOURCE)], build_directory=str(folder),
                       extra_cflags=['-O2'], is_python_module=False, verbose=False)

def _ops(): return torch.ops.eager_tpu

def _one_device(device=None):
    index = device if isinstance(device, int) else torch.device(device or 'tpu').index
    if index not in (None, 0): raise RuntimeError(f"the eager tpu test device has one device per process, tpu:0 (not tpu:{index})")

def _launch_env(nproc_per_node:int):
    "What TorchTPU's `set_tpu_launch_env` does before `torchrun` starts its processes, here only noted (each replica sees tpu:0)."
    os.environ['EAGER_TPU_LAUNCH_NPROCS'] = str(nproc_per_node)

def Stream(device=None, priority:int=0) -> torch.Stream:
    "`torch.tpu.Stream()`: PyTorch's `torch.Stream` of the device, whose one stream is always idle (the device's guard)."
    _one_device(device); return torch.Stream('tpu', priority=priority)

def Event(enable_timing=False, blocking=False, interprocess=False) -> torch.Event:
    "`torch.tpu.Event()`: PyTorch's `torch.Event` of the device, reached as soon as it is recorded."
    return torch.Event('tpu', enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

def _current_stream(device=None) -> torch.Stream: _one_device(device); return torch.accelerator.current_stream(torch.device('tpu', 0))

class _DeviceContext:
    "`torch.tpu.device(d)`: the device made current in a `with` (there is one)."
    def __init__(self, device): _one_device(device)
    def __enter__(self): return self
    def __exit__(self, *exc): return False

def device_module() -> types.ModuleType:
    "`torch.tpu`: what PyTorch and fastai_xla ask of a device's module (TorchTPU's has these names)."
    m = types.ModuleType('torch.tpu', "The eager tpu test device (tests/eager_tpu.py): one device per process, on the host's memory.")
    def get_rng_state(device='tpu'): _one_device(device); return _ops().get_rng_state()
    def set_rng_state(state, device='tpu'): _one_device(device); _ops().set_rng_state(state)
    def manual_seed(seed): _ops().manual_seed(int(seed))
    m.__dict__.update(
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
        device=_DeviceContext, set_device=_one_device, synchronize=lambda device=None: None,   # (every op has finished when it returns)
        get_rng_state=get_rng_state, set_rng_state=set_rng_state,
        get_rng_state_all=lambda: [get_rng_state()], set_rng_state_all=lambda states: set_rng_state(states[0]),
        manual_seed=manual_seed, manual_seed_all=manual_seed, seed=lambda: _ops().seed(), seed_all=lambda: _ops().seed(),
        initial_seed=lambda: _ops().initial_seed(), _is_in_bad_fork=lambda: False,
        get_amp_supported_dtype=lambda: [torch.bfloat16, torch.float16],
        ops_run=lambda: _ops().ops_run(),   # (the ops its fallback ran in this process: work went through the device)
        Stream=Stream, Event=Event, current_stream=_current_stream, default_stream=_current_stream,
        stream=lambda stream: stream)   # (`with torch.tpu.stream(s)`: a `torch.Stream` is its own context)
    m.distributed = types.ModuleType('torch.tpu.distributed')
    m.distributed.set_tpu_launch_env = _launch_env
    return m

class TpuDistOverGloo(dist.ProcessGroup):
    "`tpu_dist` of the eager test device: a process group of the device's own (its tensors only, no `ReduceOp.AVG`, as TorchTPU's), whose collectives gloo runs on host copies."
    def __init__(self, store, rank:int, size:int, timeout):
        super().__init__(rank, size)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout, opts._devices = timeout, [dist.ProcessGroupGloo.create_device(hostname='127.0.0.1')]   # (one host: loopback)
        self.gloo = dist.ProcessGroupGloo(store, rank, size, opts)
    def getBackendName(self): return 'tpu_dist'
    group_name = property(lambda self: dist.distributed_c10d._world.pg_names[self])   # (as torch.distributed named it)
    _device_types = property(lambda self: [torch.device('tpu')])   # (where torch.distributed puts an object collective's tensors)
    def _host(self, x, copies:list, op:str):
        "`x` (a tensor, or lists of them) as host copies, each noted with its device tensor in `copies`."
        if isinstance(x, (list, tuple)): return [self._host(y, copies, op) for y in x]
        if not isinstance(x, torch.Tensor): return x
        if x.device.type != 'tpu':
            raise ValueError(f"tpu_dist's {op} got a tensor on {x.device}: the device's process group takes the device's tensors")
        copies.append((x, x.cpu())); return copies[-1][1]
    def _run(self, op:str, *args):
        copies = []
        getattr(self.gloo, op)(*[self._host(a, copies, op) for a in args]).wait()
        for on_device, on_host in copies: on_device.copy_(on_host)   # (inputs too: unchanged, or their own part of the output)
        done = torch.futures.Future(); done.set_result(None)
        return torch._C._distributed_c10d._create_work_from_future(done)

for _op in ('allreduce', 'allreduce_coalesced', 'broadcast', 'allgather', '_allgather_base', 'reduce_scatter',
            '_reduce_scatter_base', 'gather', 'scatter', 'reduce', 'alltoall_base', 'barrier'):
    setattr(TpuDistOverGloo, _op, lambda self, *args, _op=_op, **kwargs: self._run(_op, *args, *kwargs.values()))
TpuDistOverGloo.allgather_into_tensor_coalesced = lambda self, outs, ins, opts=None: [self._run('_allgather_base', o, i) for o, i in zip(outs, ins)][-1]
TpuDistOverGloo.reduce_scatter_tensor_coalesced = lambda self, outs, ins, opts: [self._run('_reduce_scatter_base', o, i, opts) for o, i in zip(outs, ins)][-1]

_registered = False
def register():
    "Load the device into this process as `tpu`, with its `torch.tpu` module; processes started from here load it too."
    global _registered
    if _registered: return
    if importlib.util.find_spec('torch_tpu') is not None:
        raise RuntimeError("Google's TorchTPU is installed here, and its `tpu` is the real device: the eager test device "
                           "stands in for it only where TorchTPU is not installed.")
    torch.ops.load_library(str(library()))
    torch.utils.rename_privateuse1_backend('tpu')
    module = device_module()
    torch._register_device_module('tpu', module)
    sys.modules['torch.tpu.distributed'] = module.distributed
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    if 'tpu_dist' not in dist.Backend.backend_list: dist.Backend.register_backend('tpu_dist', TpuDistOverGloo, devices=['tpu'])
    os.environ[GATE] = '1'
    path = os.environ.get('PYTHONPATH', '')
    if str(HERE) not in path.split(os.pathsep): os.environ['PYTHONPATH'] = os.pathsep.join(p for p in (str(HERE), path) if p)
    _registered = True

register()
