"""What a replica meeting (fastai_xla.core.meet, before each collective outside a training step) costs.

A TCPStore in this process, the replica count set to 2 for the calls and replica 1's entries written in advance, so
each `meet` does what it does in a real run once the other replica has arrived: two writes, one check, two reads.
A fit meets 3 times per epoch (the start of training, the metric reduction after training and after validation).

    PJRT_DEVICE=CPU python benchmarks/meeting.py [--n 2000]
"""
import argparse, time
from unittest import mock
import torch.distributed as dist
import fastai_xla.core as core

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--n', type=int, default=2000)
    n = p.parse_args().n
    store = dist.TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)
    with mock.patch.object(core, 'replica_count', return_value=2):
        core.set_meeting_store(store)
        for i in range(1, n + 1): store.set(f'{i}/1', 'the same collective')
        t = time.perf_counter()
        for _ in range(n): core.meet('the same collective')
        per = (time.perf_counter() - t) / n
    print('| meetings | ms per meeting | ms per epoch (3 meetings) |')
    print('|---|---|---|')
    print(f'| {n} | {per * 1e3:.3f} | {3 * per * 1e3:.3f} |')

if __name__ == '__main__': main()
