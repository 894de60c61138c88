"Small real learners on scikit-learn data, shared by the tests."
import os
import torch, numpy as np, pandas as pd
from fastai.basics import *
from fastai.callback.all import *
from fastai.vision.all import ConvLayer, Flatten
from fastai.tabular.all import TabularPandas, tabular_learner, Categorify, Normalize as TabNormalize, CategoryBlock
from fastai_xla.all import *
# the tests reach into the modules too: their helpers, which `fastai_xla.all` (a user's names only) leaves in them
from fastai_xla.backend import *; from fastai_xla.settings import *; from fastai_xla.replicas import *; from fastai_xla.core import *
from fastai_xla.run import *; from fastai_xla.data import *; from fastai_xla.optimizer import *; from fastai_xla.callback import *
from fastai_xla.metrics import *; from fastai_xla.distributed import *; from fastai_xla.launch import *; from fastai_xla.checkpoint import *
from fastai_xla.resume import *; from fastai_xla.precision import *; from fastai_xla.diagnostics import *; from fastai_xla.spmd import *
from fastai_xla.models import *
from fastai_xla.demo import digits_frame, digits_dls

def digits_cnn():
    return nn.Sequential(ConvLayer(1, 16, stride=2), ConvLayer(16, 32, stride=2), nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(32, 10))

def digits_learner(seed=0, bs=64, model=None, metrics=accuracy, loss_func=None, **kwargs):
    set_seed(seed, reproducible=True)
    dls = digits_dls(bs=bs, seed=42)
    return Learner(dls, model or digits_cnn(), loss_func=loss_func or CrossEntropyLossFlat(), metrics=metrics, **kwargs)

def linear_digits_learner(bs=32, **kwargs):
    "`digits_learner` with a linear model, for tests of what goes on around the training (faults, replicas' meetings), where"
    "the model proves nothing: its graphs compile in about a second in each replica process, the CNN's in several."
    return digits_learner(bs=bs, model=nn.Sequential(Flatten(), nn.Linear(64, 10)), **kwargs)

class EpochCounters(Callback):
    "XLA counters of each epoch."
    order = 100
    def before_fit(self): self.epochs = []
    def before_epoch(self): self.c0 = xla_counters()
    def after_epoch(self): self.epochs.append(counters_diff(xla_counters(), self.c0))

def tabular_digits_learner(seed=0, bs=64):
    set_seed(seed, reproducible=True)
    df, cats, conts = digits_frame()
    splits = RandomSplitter(0.2, seed=42)(range_of(df))
    to = TabularPandas(df, procs=[Categorify, TabNormalize], cat_names=cats, cont_names=conts, y_names='digit',
                       y_block=CategoryBlock(), splits=splits)
    dls = to.dataloaders(bs=bs, num_workers=0)
    return tabular_learner(dls, layers=[100, 50], metrics=accuracy)

def final(learn, name):
    "The last epoch's value of metric `name` from the Recorder."
    return learn.recorder.values[-1][learn.recorder.metric_names.index(name) - 1]

def segmentation_learner(path, classes='digit', metrics=(), bs=32, seed=0, batch_tfms=None):
    "fastai's SegmentationDataLoaders over the digits written as 16x16 PNG images and masks, a small fully convolutional model."
    from fastai.vision.all import SegmentationDataLoaders, get_image_files
    from fastai_xla.demo import digits_segmentation_folder, digit_mask_path, segmentation_codes
    path = digits_segmentation_folder(path, size=16, classes=classes)
    codes = segmentation_codes(classes)
    dls = SegmentationDataLoaders.from_label_func(path, get_image_files(path/'images'), digit_mask_path, bs=bs, codes=codes,
                                                  valid_pct=0.2, seed=42, num_workers=0, batch_tfms=batch_tfms)
    set_seed(seed)
    model = nn.Sequential(ConvLayer(3, 16), ConvLayer(16, 16), nn.Conv2d(16, len(codes), 1))
    return Learner(dls, model, metrics=list(metrics))

def on_train_device(t) -> bool:
    "Is `t` on the device this process trains on? (The XLA device; on the native backend's CPU, the CPU.)"
    return t.device == xla_device()

def device_is_host() -> bool:
    "Is the training device the host itself (the native backend on the CPU: nothing moves, `to_host` copies nothing)?"
    return xla_device().type == 'cpu'

def gloo_replica_env(rank:int, world:int, port:int, local_rank=None, local_world=None, **more) -> dict:
    "The environment variables of replica `rank` of `world` processes meeting on this host's `port` over gloo (what a pod's host, or `learn.launch`, gives each replica)."
    from fastai_xla.settings import Settings, replica_env
    s = Settings(transport='gloo', rank=rank, world_size=world, local_rank=rank if local_rank is None else local_rank,
                 local_world_size=world if local_world is None else local_world, master_addr='127.0.0.1', master_port=port)
    backend = os.environ.get('FASTAI_XLA_BACKEND')
    return {**replica_env(s), 'PJRT_DEVICE': 'CPU', **({'FASTAI_XLA_BACKEND': backend} if backend else {}), **more}

def fault_row(fault:str, sees:str, seconds:float|None, lost:str):
    "Record one row of the README's fault table in `$FASTAI_XLA_FAULT_TABLE`, when set (`benchmarks/faults.py` sets it)."
    import json, os
    out = os.environ.get('FASTAI_XLA_FAULT_TABLE')
    if out:
        with open(out, 'a') as f: f.write(json.dumps(dict(fault=fault, sees=sees, seconds=None if seconds is None else round(seconds, 1), lost=lost)) + '\n')

# Who can reach a run (tests/test_replicas.py's stranger, tests/test_security.py)
import socket, subprocess
from pathlib import Path

def listening_addresses(pid='self') -> list:
    "`(address, port)` of every TCP socket the process `pid` listens on, read from the kernel's tables (IPv4 and IPv6)."
    fds = Path(f'/proc/{pid}/fd')
    inodes = set()
    for fd in fds.iterdir():
        try: target = os.readlink(fd)
        except OSError: continue
        if target.startswith('socket:['): inodes.add(target[8:-1])
    found = []
    for table, family in (('/proc/net/tcp', socket.AF_INET), ('/proc/net/tcp6', socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] != '0A' or parts[9] not in inodes: continue          # 0A: LISTEN
            addr, port = parts[1].split(':')
            raw = bytes.fromhex(addr)
            raw = b''.join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))   # (the kernel writes each 32-bit word in host order)
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found

def network_address() -> str|None:
    "This machine's own address on its network (not loopback), or None if it has none."
    out = subprocess.run(['hostname', '-I'], capture_output=True, text=True).stdout.split()
    return next((a for a in out if ':' not in a and not a.startswith('127.')), None)

def network_interface() -> str|None:
    "The name of the network interface that holds `network_address()` (Linux), or None."
    import fcntl, struct
    addr = network_address()
    def address_of(name):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try: return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', name[:15].encode()))[20:24])   # SIOCGIFADDR
            except OSError: return None
    return next((name for _, name in socket.if_nameindex() if addr is not None and address_of(name) == addr), None)

def refused_from(addr:str, port:int) -> bool:
    "Is a TCP connection from this machine to `addr:port` refused (nothing listens there for that address)?"
    try:
        with socket.create_connection((addr, port), timeout=3): return False
    except OSError: return True
