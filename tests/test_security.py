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
import subprocess, sys
from test_faults import start_replicas, wait_all, TESTS
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
    procs = start_replicas(SCRIPT, tmp_path, n=2, per_host=1, MASTER_ADDR=addr, MASTER_PORT=str(port),
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

# Under torchrun: torch's agent serves its store on every interface, whatever MASTER_ADDR says, and its run id is no secret
# (`none` under plain torchrun, the `--rdzv-id` of the two-agent form, a uuid in torch's logs under `--standalone`). The
# stranger knows the run id here (the script hands it over, as a log would), and writes under every name it could derive.
TORCHRUN_SCRIPT = """
import os, sys, json, time
sys.path.insert(0, {tests!r})
from pathlib import Path
Path(f"where-{{os.environ['RANK']}}.json").write_text(json.dumps(dict(port=int(os.environ['MASTER_PORT']),
                                                                      run_id=os.environ['TORCHELASTIC_RUN_ID'])))
from helpers import *
learn = linear_digits_learner().to_tpu_distributed(seed=0)
class Slowly(Callback):
    def after_batch(self): time.sleep(0.03)
learn.fit(5, 1e-2, cbs=[ResumeCallback('run', check_every=1), Slowly()])
Path(f'done-{{replica_ordinal()}}.json').write_text(json.dumps(dict(epochs=len(learn.recorder.values))))
"""

def _stranger_knowing(where_file, addr, stop, acts):
    "Wait for the run's port and id, then write, from the network address, under every name a run without a secret used."
    deadline = time.time() + 120
    while not where_file.exists() and not stop.is_set() and time.time() < deadline: time.sleep(0.05)
    if not where_file.exists(): return
    where = json.loads(where_file.read_text())
    names = ['', 'run/', 'run//'] + [private_prefix(where['run_id'], namespace) for namespace in ('run', 'group')]
    try: store = dist.TCPStore(addr, where['port'], is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5))
    except Exception as e: acts.append(f'refused: {e}'); return
    acts.append('connected')
    payload = pickle.dumps(_RunsACommand())
    while not stop.is_set():
        try:
            for prefix in names:
                store.set(f'{prefix}failed', '1|a stranger stopped this run')
                for n in range(1, 100): store.add(f'{prefix}vote/{n}/yes', 1)
                for r in (0, 1): store.set(f'{prefix}every_replica/{r}', payload)
        except Exception: return
        acts.append('wrote')
        time.sleep(0.05)

FORMS = {'plain': ['--nproc-per-node=2'], 'standalone': ['--standalone', '--nproc-per-node=2'], 'two-agents': None}

@pytest.mark.parametrize('form', list(FORMS))
def test_a_stranger_cannot_stop_a_torchrun_run(tmp_path, form):
    """A stranger on the network reaches torch's agent's store from this host's network address (it listens on every
    interface), knows the run id, and writes failures, "yes" votes and a pickle under every name a run without a secret used.
    Plain `torchrun` and `--standalone` have no `FASTAI_XLA_SECRET`: their replicas make one and share it in the agent's
    private folder; the two-agent form (two "hosts") has the user's. The run trains to its end untouched. Before: every
    replica printed "preempted (a signal to another replica)" and exited 75."""
    addr = network_address()
    if addr is None: pytest.skip('this machine has no network address apart from loopback')
    (tmp_path/'train.py').write_text(TORCHRUN_SCRIPT.format(tests=str(TESTS)))
    env, port = {**os.environ, 'PJRT_DEVICE': 'CPU'}, free_port()
    run = [sys.executable, '-m', 'torch.distributed.run']
    if form == 'two-agents':
        env['FASTAI_XLA_SECRET'] = 'a-run-secret-0123456789abcdef'
        cmds = [run + ['--nnodes=2', f'--node-rank={n}', '--nproc-per-node=1', '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{port}',
                       '--rdzv-id=a-documented-id', 'train.py'] for n in range(2)]
    else: cmds = [run + FORMS[form] + ([f'--master-port={port}'] if form == 'plain' else []) + ['train.py']]
    procs = [subprocess.Popen(c, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    stop, acts = threading.Event(), []
    stranger = threading.Thread(target=_stranger_knowing, args=(tmp_path/'where-0.json', addr, stop, acts), daemon=True)
    stranger.start()
    try: outs = [p.communicate(timeout=400) for p in procs]
    finally: stop.set(); stranger.join(10)
    assert 'connected' in acts and acts.count('wrote') >= 3, acts[:5]      # (the store was reachable: the secret is what held)
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    for r in range(2): assert json.loads((tmp_path/f'done-{r}.json').read_text())['epochs'] == 5
    assert not (tmp_path/'pwned').exists() and not any('stranger' in o[1] or 'preempted' in o[1] for o in outs)
    if form == 'standalone':                                                 # (the secret: in no file others may read)
        assert not list(tmp_path.rglob('*secret*')) and 'run_id' not in (tmp_path/'models'/'.run.pth.saves').read_text()
    fault_row(f"a stranger on the network, knowing the run id, writes a failure, \"yes\" votes and a pickle into torch's agent's store "
              f"(`torchrun {' '.join(FORMS[form] or ['--nnodes=2 ... --rdzv-id=...'])}`, which listens on every interface)",
              'nothing: the run trains to its end (its keys are named after a secret: the user\'s, or one its replicas share in the '
              'agent\'s private folder)', None, 'nothing')

def test_several_hosts_under_torchrun_without_a_secret_are_refused(tmp_path):
    "The two-agent form (two hosts) without `FASTAI_XLA_SECRET`: every replica refuses at `to_tpu_distributed`, saying what to set."
    (tmp_path/'train.py').write_text(TORCHRUN_SCRIPT.format(tests=str(TESTS)))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--nnodes=2', f'--node-rank={n}', '--nproc-per-node=1',
                               '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{port}', '--rdzv-id=a-documented-id', 'train.py'],
                              cwd=tmp_path, env={**os.environ, 'PJRT_DEVICE': 'CPU'}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for n in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode != 0 for p in procs)
    for _, err in outs:
        assert "torch's agent serves this run's store on every network interface" in err and 'FASTAI_XLA_SECRET' in err, err[-3000:]
    fault_row('torchrun on several hosts (two agents) without `FASTAI_XLA_SECRET`', "every replica refuses at `to_tpu_distributed`: "
              "`ValueError: torch's agent serves this run's store on every network interface of its host ... Give every host of the "
              "run the same secret in FASTAI_XLA_SECRET ...`", None, 'nothing (nothing ran)')

def sharded_checkpoint_faults(tmp_path, phases, *args) -> dict:
    "Run tests/sharded_checkpoint_faults.py's `phases` (one replica, FSDP2 on the native backend on the CPU); its report."
    r = subprocess.run([sys.executable, str(TESTS/'sharded_checkpoint_faults.py'), phases, str(tmp_path), *map(str, args)],
                       capture_output=True, text=True, timeout=400, env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    line = [l for l in r.stdout.splitlines() if l.startswith('REPORT ')]
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(line[0][len('REPORT '):])

def test_a_crafted_sharded_checkpoint_reads_and_deletes_nothing_outside_its_folder(tmp_path):
    """A checkpoint file of the sharded form (`{'fastai_xla_sharded': 1, 'folder': ...}`, which passes the weights-only load)
    naming an absolute path, the empty name, `../..`, `.`, another checkpoint's folder, a number, or a symlink of the right
    name pointing elsewhere: `load` and `load_resume` refuse it by name before reading anything, and a `save` over it deletes
    nothing; a DCP `.metadata` (its digests made to match) placing its pieces in `../../victim/keep` is refused before DCP
    opens that file. The folder outside, `models/` and the good save stay; the weights are as they were. Real FSDP2 on the
    native backend on the CPU, one replica (the same code names and checks the folder for `to_tpu_spmd(shard_params=True)`)."""
    r = sharded_checkpoint_faults(tmp_path, 'crafted')
    for label in ('absolute', 'empty', 'parent', 'models', 'another name', 'not a string'):
        for how in ('load', 'load_resume'):
            assert r[f'{how} {label}'].startswith('CheckpointRefused: ') and 'not a checkpoint of ours' in r[f'{how} {label}'], (how, label, r)
        assert r[f'save over {label}'] == 'no error', r
    assert r['load symlink'].startswith('CheckpointDamaged: ') and 'a link to elsewhere' in r['load symlink'], r
    assert r['save over symlink'] == 'no error'
    assert r['load metadata naming a file outside'].startswith('UnpicklingError: ') and 'not a file of its folder' in r['load metadata naming a file outside'], r
    assert r['victim_kept'] and r['models_kept'] and r['weights_same'], r
    fault_row("a crafted sharded checkpoint file names a folder outside its own (an absolute path, `''`, `..`, a symlink), or its "
              "`.metadata` a piece outside", '`CheckpointRefused: ... names \'/...\' as its folder of shards, which is not a name '
              "fastai_xla's sharded save writes (`m.<8 hex digits>.dcp`, beside it): not a checkpoint of ours. Nothing was read or "
              "deleted ...` at `load`, `load_resume`; a later `save` deletes nothing but its own", None, 'nothing: no folder deleted or read')

class _Planted:
    def __reduce__(self): return (os.system, ('touch planted-ran',))

@pytest.mark.parametrize('backend', ['torch_xla', 'native'])
def test_a_compile_cache_another_user_can_write_is_refused(tmp_path, backend, monkeypatch):
    """`enable_compile_cache` (`compile_cache=`) on a folder another user can write (mode 0777, holding a pickle planted where
    inductor's FX graph cache would unpickle it), one that another user owns, or one of ours holding another user's file:
    a `PermissionError` naming the folder and the fix, before any cache is set (torch_xla's `initialize_cache`, inductor's and
    TorchTPU's variables), and before the backend is chosen (the same refusal on every backend); nothing planted runs. A folder of ours under the sticky /tmp is used. (The check itself:
    `own_folder`, nbs/00c_replicas; another user's files made with `chown`, which needs root: skipped otherwise.)"""
    monkeypatch.chdir(tmp_path)
    settings = current_settings(backend=backend)
    shared = tmp_path/'shared'; planted = shared/'ordinal_0'/'inductor'/'fxgraph'/'ab'/'abcdef'
    planted.mkdir(parents=True); (planted/'entry').write_bytes(pickle.dumps(_Planted()))
    for d in [shared, *shared.rglob('*')]: os.chmod(d, 0o777)
    before = os.environ.get('TORCHINDUCTOR_CACHE_DIR')
    with pytest.raises(PermissionError, match=r'compile cache .*shared.* is not safe to use: .* can be written by other users'):
        enable_compile_cache(shared, settings=settings)
    if os.getuid() == 0:
        theirs = tmp_path/'theirs'; theirs.mkdir(); os.chown(theirs, 65534, 65534)
        with pytest.raises(PermissionError, match=r'belongs to another user \(uid 65534\)'): enable_compile_cache(theirs, settings=settings)
        mine = tmp_path/'mine'; (mine/'ordinal_0').mkdir(parents=True); (mine/'ordinal_0'/'graph.bin').write_bytes(b'x')
        os.chown(mine/'ordinal_0'/'graph.bin', 65534, 65534)
        with pytest.raises(PermissionError, match=r'graph.bin belongs to another user'): enable_compile_cache(mine, settings=settings)
    assert os.environ.get('TORCHINDUCTOR_CACHE_DIR') == before and not (tmp_path/'planted-ran').exists()
    assert own_folder(tmp_path/'ours'/'cache', 'compile cache').stat().st_mode & 0o777 == 0o700
    fault_row(f'`compile_cache=` on a folder another user can write or owns ({backend})', '`PermissionError: The compile cache ... is '
              'not safe to use: ... can be written by other users (mode drwxrwxrwx). What it holds runs in this process ...`',
              None, 'nothing: no cache set, nothing in it read')
