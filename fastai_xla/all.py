"""Everything a user calls: `from fastai_xla.all import *`."""
# Importing it loads every module that adds methods to fastai's `Learner`; fastai_xla's features for fastai's
# applications load when the learner needs them (`application_features`, 04_distributed).
from . import pickling, optimizer, metrics, models, launch  # noqa: F401 (what they add to fastai's classes and to the learner's path)
from .settings import Settings, current_settings
from .core import xla_device, device_kind, on_torch_xla, off_host, is_xla, to_host, step_boundary, xla_counters, counters_diff, AutogradStartedFirst
from .run import Run, replica_ordinal, replica_count, is_master, is_local_master
from .meetings import ReplicasDiverged
from .agent import ReplicasFailed
from .data import XLADataLoader
from .callback import TPUCallback, XLALearner, is_xla_learner, xla_dataloaders, NothingToTrain
from .distributed import spawn, rank0_first, xla_distrib_ctx
from .checkpoint import CheckpointRefused, CheckpointCollision, load_weights
from .resume import ResumeCallback, StopOnSignal, Preempted
from .precision import XLAMixedPrecision
from .diagnostics import XLAPerformanceWarning, XLADiagnostics, enable_compile_cache, ProfileSteps
from .spmd import data_mesh

__all__ = ['Settings', 'current_settings', 'xla_device', 'device_kind', 'on_torch_xla', 'off_host', 'is_xla',
           'to_host', 'step_boundary', 'xla_counters', 'counters_diff', 'AutogradStartedFirst', 'Run',
           'replica_ordinal', 'replica_count', 'is_master', 'is_local_master', 'ReplicasDiverged', 'ReplicasFailed',
           'XLADataLoader', 'TPUCallback', 'XLALearner', 'is_xla_learner', 'xla_dataloaders', 'NothingToTrain',
           'spawn', 'rank0_first', 'xla_distrib_ctx', 'CheckpointRefused', 'CheckpointCollision', 'load_weights',
           'ResumeCallback', 'StopOnSignal', 'Preempted', 'XLAMixedPrecision', 'XLAPerformanceWarning',
           'XLADiagnostics', 'enable_compile_cache', 'ProfileSteps', 'data_mesh']
