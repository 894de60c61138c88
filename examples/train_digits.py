"""Train a fastai vision learner on scikit-learn's digits (shipped offline) on the best XLA device here.

    bash scripts/demo.sh [--epochs 5] [--lr 3e-3] [--bs 64]

Prints which device was picked, fastai's epoch table, the final accuracy, and what the XLA
runtime did for the whole run (compilations, executions, host<->device transfers)."""
import argparse
from fastai_xla.all import *   # first: chooses the XLA device before anything else touches torch
from fastai_xla.demo import digits_dls

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=5)
    p.add_argument('--lr', type=float, default=3e-3)
    p.add_argument('--bs', type=int, default=64)
    a = p.parse_args()
    device = xla_device()
    print(f'fastai_xla: training on {device} ({device_kind()}), {replica_count()} replica(s)')
    from fastai.vision.all import vision_learner, resnet18, accuracy
    dls = digits_dls(bs=a.bs)
    learn = vision_learner(dls, resnet18, pretrained=False, n_in=1, metrics=accuracy).to_tpu_distributed()
    before = xla_counters()
    learn.fit_one_cycle(a.epochs, a.lr)
    run = counters_diff(xla_counters(), before)
    print(f'final accuracy: {learn.recorder.values[-1][2]:.4f}')
    print(f"XLA: {run['compiles']} compilations, {run['executions']} graph executions, "
          f"{run['to_host']} device-to-host and {run['to_device']} host-to-device transfers")

if __name__ == '__main__': main()
