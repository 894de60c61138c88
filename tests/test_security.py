"""A stranger on the network against a multi-host run: 2 replicas as 2 "hosts" of this machine (each its own local master),
meeting at the machine's network address as a pod's hosts do, with the run's secret (`FASTAI_XLA_SECRET`) in their
environment. A stranger's process, without the secret, reaches the master's store from the network and does what the
issue's stranger did: writes the failure key, "yes" votes, and a pickle that would run a command where the replicas
exchange their resume state; the run must train to its end as if nobody had come.

Covered: the store's keys named from the secret (`private_prefix`), the replicas' votes, failures and resume exchange
through it, the refusal of a run that would listen beyond loopback without a secret (00c_replicas's notebook test). Not covered:
separate machines (the "hosts" share this one), a stranger who can read the network's traffic (the store's protocol is plain
TCP: the keys' names travel in clear; the guide's "Security" says to keep pods on a private network), a stranger who
floods or deletes keys at random (torch's store has no access control: it can be slowed down, not fed)."""
import json, os, pickle, threading, time
import pytest
import torch.distributed as dist
from helpers import *
from test_faults import start_replicas, wait_all
from fastai_xla.replicas import free_port
from datetime import timedelta   # (after helpers' star import, which brings `datetime` the class)

SCRIPT = """
import json, time
from helpers import *
learn = linear_digits_learner().to_tpu_distributed(seed=0)
class Slowly(Callback):
    "A few seconds of training, for the stranger to act during."
    def after_batch(self): time.sleep(0.03)
learn.fit(5, 1e-2, cbs=[ResumeCallback('run', check_every=1), Slowly()])
Path(f'done-{replica_ordinal()}.json').write_text(json.dumps(dict(epochs=len(learn.recorder.values))))
"""

class _RunsACommand:
    "What the stranger pickles: unpickling it runs `touch pwned`."
    def __reduce__(self): return (os.system, ('touch pwned',))

def _stranger(addr, port, stop, acts):
    "Reach the store from the network, then write what would stop, preempt or run code in a run whose keys were guessable."
    deadline = time.time() + 120
    while not stop.is_set() and time.time() < deadline:
        try: store = dist.TCPStore(addr, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=2)); break
        except Exception: time.sleep(0.1)
    else: return
    acts.append('connected')
    payload = pickle.dumps(_RunsACommand())
    while not stop.is_set():
        try: _write_all(store, payload)
        except Exception: return                                            # (the run ended: its store is gone)
        acts.append('wrote')
        time.sleep(0.05)

def _write_all(store, payload):
    for prefix in ('run//', 'run/', ''):                                       # (torch's `PrefixStore` joins with '/')
        store.set(f'{prefix}failed', '1|a stranger stopped this run')
        for n in range(1, 200): store.add(f'{prefix}vote/{n}/yes', 1)
        for r in (0, 1): store.set(f'{prefix}every_replica/{r}', payload)

def test_a_stranger_without_the_secret_can_neither_stop_nor_preempt_nor_run_code(tmp_path):
    addr = network_address()
    if addr is None: pytest.skip('this machine has no network address apart from loopback')
    port = free_port()
    procs = start_replicas(SCRIPT, tmp_path, n=2, per_host=1, FASTAI_XLA_MASTER_ADDR=addr, FASTAI_XLA_MASTER_PORT=str(port),
                           FASTAI_XLA_SECRET='a-run-secret-0123456789abcdef')
    stop, acts = threading.Event(), []
    stranger = threading.Thread(target=_stranger, args=(addr, port, stop, acts), daemon=True)
    stranger.start()
    try: codes, _ = wait_all(procs, timeout=600)
    finally: stop.set(); stranger.join(10)
    outs = [(tmp_path/f'err-{r}.txt').read_text() for r in range(2)]
    assert 'connected' in acts and acts.count('wrote') >= 3, acts[:5]      # (the store was reachable: the secret is what held)
    assert codes == [0, 0], (codes, outs[0][-3000:], outs[1][-3000:])
    for r in range(2): assert json.loads((tmp_path/f'done-{r}.json').read_text())['epochs'] == 5
    assert not (tmp_path/'pwned').exists()
    assert not any('stranger' in o or 'preempted' in o for o in outs), outs
    fault_row('a stranger on the network, without the run\'s secret, writes a failure, "yes" votes and a pickle that would run a '
              'command into a 2-host run\'s store', 'nothing: the run trains to its end, nothing runs (a store beyond loopback '
              'without `FASTAI_XLA_SECRET` is refused)', None, 'nothing')
