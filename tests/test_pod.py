"""A pod, simulated on one machine: 2 hosts x 2 replicas as 4 processes over gloo, started by hand as the README's pod
recipe starts them on every worker, each "host" with its own local ranks (LOCAL_RANK 0 and 1), its own
checkpoint folder (a host's local disk) and its own local master. Checked: the shards of every epoch are disjoint and
cover the validation set, each host writes its own checkpoint, the metrics equal one device's over the same weights,
one progress table (the global master's), and a run preempted on one replica of the second host resumes to the weights
of a run never stopped.

Not covered: separate machines (a real network between hosts, a host lost), torch_xla's multi-host runtime on a TPU pod
(PJRT finds the hosts itself there; the processes here are told their place by the environment, as on TorchTPU or with
gloo)."""
import json
import pytest, torch
from helpers import *
from test_faults import start_replicas, wait_all

HOSTS, PER_HOST = 2, 2

SCRIPT = """
import os, json, time, signal, threading
from helpers import *
from test_replicas import indexed_learner, RecordItems, _params_digest
host = int(os.environ['RANK']) // int(os.environ['LOCAL_WORLD_SIZE'])
learn = indexed_learner(bs=16, path=Path(f'host{host}'))          # each host: its own disk
learn.to_tpu_distributed(seed=0)

class PreemptOnce(Callback):
    "SIGTERM to replica 3 (the second host's second replica) only, once, during epoch 1."
    def before_batch(self):
        if (os.environ.get('TEST_PREEMPT') and replica_ordinal() == 3 and self.training and (self.epoch, self.iter) == (1, 4)
                and not Path('signalled').exists()):
            Path('signalled').write_text('1')
            threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGTERM)).start()

rec = RecordItems()
start = learn.load_resume('run', missing_ok=True)
learn.fit_one_cycle(3, 1e-2, start_epoch=start, cbs=[rec, ResumeCallback('run', check_every=2), PreemptOnce()])
run = learn.xla_run
Path(f'report-{run.ordinal}.json').write_text(json.dumps(dict(
    rank=run.ordinal, local_rank=run.local_ordinal, local_master=run.is_local_master, seen=rec.seen,
    values=[[float(x) for x in v[:4]] for v in learn.recorder.values])))
if run.is_master: torch.save({k: v.detach().cpu() for k, v in learn.model.state_dict().items()}, 'final.pth')
"""

def start_pod(cwd, preempt=False):
    "Start the 4 replica processes, host by host, each with its place in the environment; wait for them; their exit codes."
    procs = start_replicas(SCRIPT, cwd, n=HOSTS * PER_HOST, per_host=PER_HOST, TEST_PREEMPT='1' if preempt else '',
                           FASTAI_XLA_TIMEOUT='120')
    return wait_all(procs, timeout=600)[0]

def errors(cwd): return '\n'.join((cwd/f'err-{r}.txt').read_text()[-2000:] for r in range(HOSTS * PER_HOST))

@pytest.fixture(scope='module')
def pod(tmp_path_factory):
    "A 2x2 run never stopped, and one preempted then started again, in folders of their own."
    whole, cut = tmp_path_factory.mktemp('whole'), tmp_path_factory.mktemp('cut')
    codes = start_pod(whole)
    assert codes == [0] * 4, (codes, errors(whole))
    codes = start_pod(cut, preempt=True)
    assert codes == [75] * 4, (codes, errors(cut))
    first_try = {str(f): f.stat().st_mtime for f in cut.glob('host*/models/run.pth')}
    codes = start_pod(cut, preempt=True)                               # the same command again, on every host
    assert codes == [0] * 4, (codes, errors(cut))
    return whole, cut, first_try

def reports(cwd): return [json.loads((cwd/f'report-{r}.json').read_text()) for r in range(HOSTS * PER_HOST)]

def test_each_host_has_its_local_ranks_and_master(pod):
    whole, _, _ = pod
    reps = reports(whole)
    assert [(r['rank'], r['local_rank'], r['local_master']) for r in reps] == [(0, 0, True), (1, 1, False), (2, 0, True), (3, 1, False)]

def test_shards_are_disjoint_and_cover_the_validation_set(pod):
    whole, _, _ = pod
    reps = reports(whole)
    from test_replicas import indexed_learner
    n_valid = len(indexed_learner().dls.valid.dataset)
    for epoch in range(3):
        for phase in ('train', 'valid'):
            shards = [[i for e, ph, ids in r['seen'] if (e, ph) == (epoch, phase) for i in ids] for r in reps]
            every = [i for s in shards for i in s]
            assert len(every) == len(set(every)), (epoch, phase)          # disjoint
            if phase == 'valid': assert len(every) == n_valid            # and covering (padding cut)

def test_each_host_writes_its_own_checkpoint_once(pod):
    whole, _, _ = pod
    for host in range(HOSTS):
        models = whole/f'host{host}'/'models'
        assert (models/'run.pth').exists() and not list(models.glob('.*.tmp'))
        marker = json.loads((models/'.run.pth.saves').read_text())
        saves = marker['count']
        assert saves == 3                                         # one write per epoch on this host, by its local master

def test_metrics_equal_one_devices(pod):
    "The 4-replica run's last validation equals one device's over the whole validation set with its final weights."
    whole, _, _ = pod
    from test_replicas import indexed_learner
    one = indexed_learner(bs=16)
    one.model.load_state_dict(torch.load(whole/'final.pth'))
    valid_loss, acc, f1 = one.validate()
    last = reports(whole)[0]['values'][-1]
    assert last[1] == pytest.approx(valid_loss, rel=1e-4) and last[2] == pytest.approx(acc, abs=1e-6) and last[3] == pytest.approx(f1, rel=1e-4)

def test_one_progress_table(pod):
    whole, _, _ = pod
    outs = [(whole/f'out-{r}.txt').read_text() for r in range(HOSTS * PER_HOST)]
    assert 'train_loss' in outs[0] and not any('train_loss' in o for o in outs[1:])

def test_preempted_on_one_replica_resumes_to_the_uninterrupted_weights(pod):
    whole, cut, first_try = pod
    assert len(first_try) == HOSTS                                      # both hosts wrote the stop's checkpoint
    a, b = torch.load(whole/'final.pth'), torch.load(cut/'final.pth')
    for k in a: assert torch.allclose(a[k].float(), b[k].float(), atol=1e-5, rtol=0), k
    for a, b in zip(reports(cut)[0]['values'], reports(whole)[0]['values']): assert a == pytest.approx(b, rel=1e-4)   # the history too
