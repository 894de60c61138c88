"""The fast tier (`pytest -m fast`, run first by scripts/test.sh, under a minute): the runtime's pieces one by one, each
with real small objects in this process, no replica process started: settings read and checked, the backend a run takes,
the store a run meets in (a real `TCPStore` on loopback) and its keys' names, two replicas as threads meeting, voting and
all-reducing through a real gloo group, and how a launch reads its replicas' records into the error it raises.

Not covered here (the other test files start processes for them): replicas as processes, torch's agent, torchrun, signals,
`xmp.spawn`."""
import os, json, stat, threading
import pytest
import torch
from fastai_xla.backend import backend_for, BACKENDS
from fastai_xla.settings import Settings, replica_env, current_settings, this_thread
from fastai_xla.replicas import (meeting_store, private_prefix, key_secret, store_namespace, check_exposure,
                                 check_nprocs_arg, free_port, pid_alive, agent_secret)
from fastai_xla.run import Run
from fastai_xla.meetings import ReplicasDiverged
from fastai_xla.agent import record_error, read_record, ReplicasFailed, first_failure, exit_status
from fastai_xla.distributed import ended
from fastai_xla.resume import Preempted

pytestmark = pytest.mark.fast

# ---- settings: read once, checked, and carried to a replica whole

def test_a_bad_setting_is_named_with_what_to_set():
    with pytest.raises(ValueError, match=r"FASTAI_XLA_TIMEOUT='soon' is not a number of at least 0.001"):
        Settings.from_env({'FASTAI_XLA_TIMEOUT': 'soon'})
    with pytest.raises(ValueError, match=r"backend='jax' must be one of 'torch_xla', 'native'"):
        Settings.from_env({}, backend='jax')
    with pytest.raises(ValueError, match=r"The environment variable FASTAI_XLA_TRANSPORT='nccl' must be one of"):
        Settings.from_env({'FASTAI_XLA_TRANSPORT': 'nccl'})
    with pytest.raises(ValueError, match=r"WORLD_SIZE=2 is set but RANK is not"):
        Settings.from_env({'WORLD_SIZE': '2'})
    with pytest.raises(ValueError, match=r"FASTAI_XLA_RANK: fastai_xla reads a replica's place from PyTorch's names alone.*Set RANK instead"):
        Settings.from_env({'FASTAI_XLA_RANK': '1', 'RANK': '0', 'WORLD_SIZE': '2'})
    with pytest.raises(ValueError, match=r"RANK=2 must be below WORLD_SIZE=2"):
        Settings.from_env({'RANK': '2', 'WORLD_SIZE': '2'})
    with pytest.raises(ValueError, match='FASTAI_XLA_SECRET has 5 characters'):
        Settings.from_env({'FASTAI_XLA_SECRET': 'short'})

def test_torchruns_names_place_a_replica():
    s = Settings.from_env({'RANK': '1', 'WORLD_SIZE': '4', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2', 'MASTER_ADDR': '10.0.0.1',
                           'MASTER_PORT': '29500', 'TORCHELASTIC_RUN_ID': 'r', 'TORCHELASTIC_USE_AGENT_STORE': 'True'})
    assert (s.rank, s.world_size, s.local_rank, s.local_world_size, s.master_port) == (1, 4, 1, 2, 29500)
    assert s.in_group and s.supervised and s.agent_store and not s.single_host

def test_settings_travel_to_a_replica_whole():
    "What a launcher hands a replica (`replica_env`) reads back as the same settings, the secret included (never printed)."
    s = Settings(backend='native', native_device='xla', transport='gloo', timeout=12.5, fault_grace=3., heartbeat=7., rank=1,
                 world_size=2, local_rank=1, local_world_size=2, master_addr='127.0.0.1', master_port=1234, secret='s' * 32,
                 run_id='abc', restart_count=2, agent_store=True)
    assert Settings.from_env(replica_env(s)) == s
    assert 's' * 32 not in repr(s)

def test_an_entry_points_arguments_win_over_the_environment_and_are_checked():
    s = Settings.from_env({'FASTAI_XLA_BACKEND': 'native', 'FASTAI_XLA_TRANSPORT': 'xla'})
    assert s.asked(backend='torch_xla', transport='gloo').backend == 'torch_xla'
    assert s.asked() == s and s.asked(transport='gloo').transport == 'gloo'
    with pytest.raises(ValueError, match=r"transport='tcp' must be one of"): s.asked(transport='tcp')

def test_a_replica_thread_reads_its_own_settings():
    seen = {}
    def replica(rank):
        this_thread.settings = Settings(rank=rank, world_size=2)
        seen[rank] = current_settings(backend='native')
    threads = [threading.Thread(target=replica, args=(r,)) for r in (0, 1)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert [(seen[r].rank, seen[r].backend) for r in (0, 1)] == [(0, 'native'), (1, 'native')]
    assert current_settings().rank is None or os.environ.get('RANK')      # (this thread: the environment's)

# ---- the backend a run takes

def test_the_backend_a_run_takes_is_made_once_a_thread_from_its_settings():
    xla = backend_for(Settings(backend='torch_xla'))
    assert xla is backend_for(Settings(backend='torch_xla', timeout=3.)) and xla.name == 'torch_xla'
    other = []
    t = threading.Thread(target=lambda: other.append(backend_for(Settings(backend='torch_xla')))); t.start(); t.join()
    assert other[0] is not xla                                            # (a replica thread's own)
    assert set(BACKENDS) == {'torch_xla', 'native'}
    with pytest.raises(ValueError, match="No backend is named 'jax'"): backend_for(Settings(backend='jax'))

# ---- where the replicas meet, and who can reach it

def test_the_meeting_store_listens_on_loopback_alone():
    store, listener = meeting_store('127.0.0.1', 0, 1, 5., serve=True)
    try:
        assert listener.getsockname()[0] == '127.0.0.1'
        store.set('k', 'v')
        reached, _ = meeting_store('127.0.0.1', listener.getsockname()[1], 1, 5., serve=False)
        assert reached.get('k') == b'v'
    finally: listener.close()

def test_the_store_and_its_listener_each_close_their_own_descriptor():
    """torch's `TCPStore` closes the listening descriptor it is given when it goes. It was given the listener's own: the
    listener's close, then the store's, closed one number twice, the second time whatever file had it by then (a CI run
    lost pytest's own directory listing so: `OSError: [Errno 9] Bad file descriptor`). Now the store gets a copy."""
    import gc
    store, listener = meeting_store('127.0.0.1', 0, 1, 5., serve=True)
    fd = listener.fileno()
    del store; gc.collect()
    os.fstat(fd)                       # still open: the store closed its own copy, not the listener's
    listener.close()

def test_a_runs_keys_are_named_after_its_secret_and_its_attempt():
    a, b = private_prefix('x' * 32, 'run'), private_prefix('y' * 32, 'run')
    assert a != b and a.startswith('run/') and len(a) > 30 and private_prefix(None, 'run') == 'run/'
    assert store_namespace(Settings(restart_count=2), 'run') == 'run/2' and store_namespace(Settings(), 'run') == 'run'
    assert key_secret(Settings(secret='z' * 32)) == 'z' * 32 and key_secret(Settings()) is None

def test_a_store_the_network_reaches_needs_a_secret():
    check_exposure(Settings(master_addr='127.0.0.1'))                    # loopback: only this machine
    check_exposure(Settings(master_addr='10.0.0.1', secret='s' * 32))
    with pytest.raises(ValueError, match='which the network reaches, and the run has no secret'):
        check_exposure(Settings(master_addr='10.0.0.1'))
    with pytest.raises(ValueError, match="serves this run's store on every network interface"):
        check_exposure(Settings(agent_store=True, world_size=4, local_world_size=2, master_port=29500))

def test_the_agents_secret_is_this_users_alone_and_the_same_for_every_replica(tmp_path, monkeypatch):
    run = tmp_path/'run_1'; run.mkdir(mode=0o700)
    monkeypatch.setenv('TORCHELASTIC_ERROR_FILE', str(run/'attempt_0'/'0'/'error.json'))
    secret = agent_secret()
    assert len(secret) == 64 and agent_secret() == secret and (run/'fastai_xla-secret').read_text() == secret
    assert stat.S_IMODE((run/'fastai_xla-secret').stat().st_mode) == 0o600

def test_nprocs_is_checked():
    assert check_nprocs_arg(None) is None and check_nprocs_arg(2) == 2
    for bad in (0, 1.5, True, '2'):
        with pytest.raises(ValueError, match='nprocs must be a whole number of at least 1'): check_nprocs_arg(bad)
    with pytest.raises(ValueError, match="transport='gloo' needs nprocs"): check_nprocs_arg(None, 'gloo')
    assert pid_alive(os.getpid()) and 0 < free_port() < 65536

# ---- two replicas as threads: a real gloo group, a real store

def _two_replicas(work, timeout=10.):
    "Run `work(run)` as replicas 0 and 1 of a run over gloo (threads of this process); `{rank: result or exception}`."
    port, secret, out = free_port(), 'q' * 32, {}
    def replica(rank):
        s = Settings(backend='torch_xla', transport='gloo', rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                     master_addr='127.0.0.1', master_port=port, secret=secret, timeout=timeout)
        this_thread.settings = s
        run = Run(s, device='cpu').enter()
        try:
            run.meetings.open()
            out[rank] = work(run)
        except Exception as e: out[rank] = e
        finally: run.collectives.close()
    threads = [threading.Thread(target=replica, args=(r,)) for r in (0, 1)]
    for t in threads: t.start()
    for t in threads: t.join(60)
    return out

def test_two_replicas_reduce_meet_and_vote():
    def work(run):
        t = torch.tensor([float(run.ordinal + 1), 10.])
        run.all_reduce_mean_([t], what='mean')
        run.barrier('together')
        seen = run.broadcast_object({'from': run.ordinal})
        return t.tolist(), run.meetings.vote(run.ordinal == 1, 'stop?'), run.meetings.vote(False, 'go on?'), seen
    out = _two_replicas(work)
    assert out[0] == out[1] == ([1.5, 10.0], True, False, {'from': 0}), out

def test_replicas_in_different_collectives_are_named_not_left_waiting():
    out = _two_replicas(lambda run: run.meetings.meet('validate' if run.ordinal == 0 else 'save'))
    for r in (0, 1):
        assert isinstance(out[r], ReplicasDiverged), out
        assert 'replica 0 in validate, replica 1 in save' in str(out[r])

def test_a_replica_that_never_comes_is_named_after_the_timeout():
    out = _two_replicas(lambda run: run.meetings.meet('fit') if run.ordinal == 0 else None, timeout=1.)
    assert isinstance(out[0], ReplicasDiverged) and 'replica 1 did not come: it has not reached any collective' in str(out[0]), out

# ---- how a launch reads its replicas' ends

def _recorded(tmp_path, monkeypatch, e, rank):
    "`e` as replica `rank` records it (its error file, torch's format), read back."
    path = tmp_path/f'error-{rank}-{len(list(tmp_path.iterdir()))}.json'   # (a file of its own: the first error of a file stays)
    monkeypatch.setenv('TORCHELASTIC_ERROR_FILE', str(path))
    try: raise e
    except BaseException as raised: record_error(raised, rank)
    return read_record(rank, json.loads(path.read_text()), exit_status(e))

def test_a_replicas_record_keeps_its_error(tmp_path, monkeypatch):
    r = _recorded(tmp_path, monkeypatch, ValueError('bad batch'), 1)
    assert (r.rank, r.status, r.error['type'], r.error['message']) == (1, 1, 'ValueError', 'bad batch')
    assert 'raise e' in r.error['traceback'] and 'replica 1 (exit status 1): ValueError: bad batch' in str(r)
    assert read_record(3, {'message': '<NONE>'}, -9).status == -9 and 'SIGKILL' in str(read_record(3, None, -9))

def test_a_launch_raises_the_first_failure_and_a_preemption_as_such(tmp_path, monkeypatch):
    first = _recorded(tmp_path, monkeypatch, RuntimeError('first'), 0)
    later = _recorded(tmp_path, monkeypatch, RuntimeError('broken pipe'), 1)
    assert first_failure({0: first, 1: later}, 1) == 0                # (by the time each recorded it, not who ended first)
    failed = ReplicasFailed({0: first, 1: later}, 0, count=2)
    assert str(failed).startswith('replica 0 (exit status 1): RuntimeError: first') and 'then replica 1' in str(failed)
    assert ended(failed) is failed                                     # (one replica's own failure: named as such)
    both = ReplicasFailed({0: first, 1: _recorded(tmp_path, monkeypatch, RuntimeError('first'), 1)}, 0, count=2)
    again = ended(both)                                                # every replica raised it: raised as itself
    assert type(again) is RuntimeError and str(again) == 'first' and 'every replica, 2 of them' in again.__notes__[0]
    stopped = _recorded(tmp_path, monkeypatch, Preempted('stopped after epoch 2, saved'), 0)
    assert stopped.status == 75 and isinstance(ended(ReplicasFailed({0: stopped}, 0)), Preempted)
