"""What a replica meeting (`Meetings.meet`, before each collective outside a training step) costs, and a preemption vote
(`Meetings.vote`, which `ResumeCallback` holds every `check_every` training steps when there are several replicas).

A TCPStore in this process, a run whose transport says there are 2 replicas, and replica 1's entries written in advance, so
each `meet` does what it does in a real run once the other replica has arrived: two writes, one check, two reads.
A fit meets 3 times per epoch (the start of training, the metric reduction after training and after validation).

    PJRT_DEVICE=CPU python benchmarks/meeting.py [--n 2000]
"""
import argparse, time
import torch.distributed as dist
from fastai_xla.backend import Collectives
from fastai_xla.run import Run
from fastai_xla.settings import current_settings

class TwoReplicas(Collectives):
    def count(self): return 2

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--n', type=int, default=2000)
    n = p.parse_args().n
    store = dist.TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)
    run = Run(current_settings(), device='cpu')
    run.collectives = TwoReplicas()
    run.meetings.use(store)
    for i in range(1, n + 1): store.set(f'{i}/1', 'the same collective')
    t = time.perf_counter()
    for _ in range(n): run.meetings.meet('the same collective')
    per = (time.perf_counter() - t) / n
    print('| meetings | ms per meeting | ms per epoch (3 meetings) |')
    print('|---|---|---|')
    print(f'| {n} | {per * 1e3:.3f} | {3 * per * 1e3:.3f} |')
    for i in range(1, n + 1): store.add(f'vote/{i}/came', 1)       # replica 1 voted (no) in each, in advance
    t = time.perf_counter()
    for _ in range(n): run.meetings.vote(False, 'preemption check')
    per = (time.perf_counter() - t) / n
    print()
    print('| votes | ms per vote | ms per training step (check_every=10) |')
    print('|---|---|---|')
    print(f'| {n} | {per * 1e3:.3f} | {per * 1e3 / 10:.4f} |')

if __name__ == '__main__': main()
