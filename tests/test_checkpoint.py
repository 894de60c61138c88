"""Checkpoints, export and interruptions, with what each covers:

- export: a learner trained on the CPU XLA device, exported, then opened and used for a
  prediction in a fresh process whose site-packages lack torch_xla;
- the save-on-master-only mistake with 2 real replicas (gloo): it neither hangs nor breaks
  the later `load` on every replica;
- a pod's per-host checkpoints, with 2 replica processes playing two hosts with separate disks;
- Ctrl-C in the launching process during a 2-replica fit (gloo processes, forked): control
  returns promptly and no replica process is left."""
import os, re, signal, subprocess, sys, textwrap, time
from pathlib import Path
import pytest
from helpers import *
from test_device import site_without_torch_xla, ROOT  # noqa: F401 (a fixture: the tests below take it by name)

def test_export_opens_where_torch_xla_is_not_installed(tmp_path, site_without_torch_xla):  # noqa: F811
    learn = digits_learner(path=tmp_path).to_xla(seed=0)
    learn.fit(2, 1e-2)
    learn.export('model.pkl')
    item = learn.dls.valid_ds.items[0]
    expected = learn.predict(item)[0]
    code = f'''
        import sys; sys.path[:0] = [{str(site_without_torch_xla)!r}, {str(ROOT)!r}]
        import importlib.util; assert importlib.util.find_spec('torch_xla') is None
        from fastai.vision.all import load_learner
        import numpy as np
        learn = load_learner({str(tmp_path/'model.pkl')!r})
        item = ({item[0].tolist()!r}, {item[1]!r})
        print('PRED', learn.predict((np.array(item[0], dtype='uint8'), item[1]))[0])
        print('TORCH_XLA_LOADED', 'torch_xla' in sys.modules)
    '''
    r = subprocess.run([sys.executable, '-S', '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f'PRED {expected}' in r.stdout and 'TORCH_XLA_LOADED False' in r.stdout

def save_on_master_only(learn, out_dir):
    learn.fit(1, 1e-2)
    if is_master(): learn.save('by_master')        # the classic mistake: only ordinal 0 saves
    learn.fit(1, 1e-2)
    learn.load('by_master')                        # every replica loads it
    Path(out_dir, f'digest-{replica_ordinal()}').write_text(str(sum(p.double().sum().item() for p in learn.model.parameters())))

def test_save_on_the_master_only_neither_hangs_nor_breaks_load(tmp_path):
    from test_replicas import indexed_learner
    learn = indexed_learner(bs=32, path=tmp_path)
    t = time.time()
    learn.launch(save_on_master_only, str(tmp_path), nprocs=2, transport='gloo')
    assert time.time() - t < 300
    digests = [p.read_text() for p in sorted(tmp_path.glob('digest-*'))]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert (tmp_path/'models'/'by_master.pth').exists()

EVERY_HOST = """
from helpers import *
from test_replicas import indexed_learner
learn = indexed_learner(bs=32, path=Path(f'host{replica_ordinal()}')).to_tpu_distributed(seed=0)   # each "host": its own disk
learn.fit(1, 1e-2)
learn.save('every_host')
learn.load('every_host')
Path(f'digest-{replica_ordinal()}').write_text(str(sum(p.double().sum().item() for p in learn.model.parameters())))
"""

def test_each_host_writes_its_own_checkpoint(tmp_path):
    """A pod's rule with 2 replica processes started by hand as two hosts (each the first replica of its host: `LOCAL_RANK=0`
    of `LOCAL_WORLD_SIZE=1`, over gloo), each with a directory of its own for a disk: each writes the checkpoint, each loads
    its own. Not covered: real separate machines and torch_xla's multi-host runtime (which gives `xr.local_ordinal()`)."""
    from test_faults import start_replicas, wait_all
    codes, _ = wait_all(start_replicas(EVERY_HOST, tmp_path, n=2, per_host=1, FASTAI_XLA_TIMEOUT='60'))
    assert codes == [0, 0], [(tmp_path/f'err-{r}.txt').read_text()[-3000:] for r in (0, 1)]
    assert all((tmp_path/f'host{i}'/'models'/'every_host.pth').exists() for i in (0, 1))
    digests = [p.read_text() for p in sorted(tmp_path.glob('digest-*'))]
    assert len(digests) == 2 and digests[0] == digests[1]

def test_ctrl_c_during_a_launched_fit_leaves_no_process(tmp_path):
    script = tmp_path/'interrupt.py'
    script.write_text(textwrap.dedent('''
        import os, signal, threading, time, multiprocessing, faulthandler
        faulthandler.dump_traceback_later(180, exit=True)   # a hang: every thread's stack to stderr, then out
        # Ctrl-C as a terminal or a notebook kernel has it. A test run started in the background (`nohup ... &` from a
        # shell without job control) hands every process SIGINT *ignored*; that survives fork and exec, Python then
        # installs no KeyboardInterrupt handler, and the Ctrl-C below would be lost (the test hung that way, twice).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from fastai_xla.all import *
        from fastai_xla.demo import digits_dls
        from fastai.vision.all import *
        learn = Learner(digits_dls(bs=16), nn.Sequential(Flatten(), nn.Linear(64, 10)), metrics=accuracy)
        def train(learn):
            Path('pids').mkdir(exist_ok=True); Path('pids', str(os.getpid())).touch()
            learn.fit(1000)
        threading.Timer(20, lambda: os.kill(os.getpid(), signal.SIGINT)).start()   # Ctrl-C after 20 s
        t = time.time()
        try: learn.launch(train, nprocs=2, transport='gloo')
        except KeyboardInterrupt: print('INTERRUPTED after', round(time.time() - t), 's')
        pids = [int(p.name) for p in Path('pids').iterdir()]
        alive = [p for p in pids if os.path.exists(f'/proc/{p}') and 'Z' not in open(f'/proc/{p}/stat').read().split()[2]]
        print('REPLICAS', len(pids), 'ALIVE', alive, 'CHILDREN', multiprocessing.active_children())
    '''))
    env = {**os.environ, 'PJRT_DEVICE': 'CPU'}
    # output to files, not pipes: replicas left running would hold a pipe open, and the stack dump would be lost
    with open(tmp_path/'out.txt', 'w') as out, open(tmp_path/'err.txt', 'w') as err:
        try: code = subprocess.run([sys.executable, str(script)], stdout=out, stderr=err, timeout=240, env=env, cwd=tmp_path).returncode
        finally:
            for p in (tmp_path/'pids').glob('*'):      # a replica that outlived its launcher must not train on in the suite
                try: os.kill(int(p.name), signal.SIGKILL)
                except ProcessLookupError: pass
    stdout, stderr = (tmp_path/'out.txt').read_text(), (tmp_path/'err.txt').read_text()
    assert 'INTERRUPTED after' in stdout, stdout[-2000:] + stderr[-12000:]
    assert int(re.search(r'INTERRUPTED after (\d+)', stdout).group(1)) < 60
    assert 'REPLICAS 2 ALIVE [] CHILDREN []' in stdout and code == 0, stdout[-2000:] + stderr[-12000:]

@pytest.fixture
def tiny_disk(tmp_path):
    "A real 256 KiB file system (tmpfs), to fill up."
    mnt = tmp_path/'tiny'; mnt.mkdir()
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=256k', 'tmpfs', str(mnt)], capture_output=True, text=True)
    if r.returncode != 0: pytest.skip(f'cannot mount a tmpfs here: {r.stderr.strip()}')
    yield mnt
    subprocess.run(['umount', str(mnt)])

def test_full_disk_keeps_the_previous_checkpoint(tiny_disk):
    small = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 10)), path=tiny_disk).to_xla(seed=0)
    small.fit(1)
    f = small.save('ckpt')                                  # a few KiB: fits
    good = f.read_bytes()
    big = Learner(digits_dls(), nn.Sequential(Flatten(), nn.Linear(64, 4096), nn.Linear(4096, 10)), path=tiny_disk).to_xla(seed=0)
    with pytest.raises(OSError, match=r'Could not write the checkpoint .*ckpt.pth.*untouched'): big.save('ckpt')
    assert f.read_bytes() == good                           # the previous checkpoint is intact
    assert not list((tiny_disk/'models').glob('.*.tmp'))    # and no half-written file is left
    with pytest.raises(OSError, match=r'No space left on the disk of .*export.pkl.*untouched'): big.export()   # (fastai's writer)
    assert not list(tiny_disk.glob('.*.tmp')) and not (tiny_disk/'export.pkl').exists()
    fault_row('disk full while saving (`save`; `export` says the same through fastai\'s writer)', '`OSError: Could not write the checkpoint ...ckpt.pth (No space left on device); any previous checkpoint there is untouched.`',
              None, 'nothing: the previous checkpoint is intact, no half file is left')

def train_save_load(learn, out_dir, lr, master_late):
    "Train, save and load (as SaveModelCallback does), the master `master_late` seconds late to its save; write each replica's weights."
    learn.fit(1, lr)
    if replica_ordinal() == 0: time.sleep(master_late)
    learn.save('same_name')
    learn.load('same_name')
    Path(out_dir, f'sum-{lr}-{replica_ordinal()}').write_text(repr(sum(p.double().sum().item() for p in learn.model.parameters())))

def test_a_rerun_with_the_same_seed_loads_its_own_checkpoint(tmp_path):
    """Two runs of the same 2-replica script in one folder, with the same seed (the second with another learning rate, so
    its weights differ). In the second, the master reaches `save` 8 s after replica 1 reaches `load`: replica 1 must wait
    for this run's file, not take the first run's (which it did when a run was told by its seed)."""
    from test_replicas import indexed_learner
    for lr, late in ((1e-2, 0), (5e-2, 8)):
        learn = indexed_learner(bs=32, path=tmp_path)
        learn.launch(train_save_load, str(tmp_path), lr, late, nprocs=2, transport='gloo', dl_kwargs=dict(seed=42))
    first, second = ([float(tmp_path.joinpath(f'sum-{lr}-{r}').read_text()) for r in (0, 1)] for lr in (1e-2, 5e-2))
    assert first[0] == first[1] and second[0] != first[0]
    assert second[1] == second[0], f'replica 1 loaded {second[1]}, the master saved {second[0]} (the first run saved {first[0]})'

def test_a_damaged_sharded_checkpoint_is_refused_whole_and_a_full_disk_leaves_no_half_folder(tmp_path, tiny_disk):
    """A sharded checkpoint (FSDP2, one replica on the native backend on the CPU; tests/sharded_checkpoint_faults.py): a shard
    file cut short, 1 KB of it changed, or swapped for epoch 1's: `CheckpointDamaged` naming the file, before the model
    changes (its weights as they were); the file put back: the saved weights. Another model's load (a size mismatch, found
    after DCP planned the read) leaves the weights as they were. A checkpoint without digests (an earlier fastai_xla) loads
    with a warning; its folder gone: named. A folder a killed save left (no file names it, older than the run) goes at the
    next save of that name; one written since the run started stays. On a real 256 KiB file system: a save (and a background
    save) that does not fit is an `OSError` naming the folder and saying the last checkpoint is kept; no half folder stays,
    and the last whole checkpoint loads to its weights."""
    from test_security import sharded_checkpoint_faults
    r = sharded_checkpoint_faults(tmp_path, 'damaged,full', tiny_disk)
    assert r['cut short'].startswith('CheckpointDamaged: ') and '__0_0.distcp has' in r['cut short'] and 'cut short' in r['cut short'], r
    for case in ('1 KB changed', 'swapped for epoch 1'):
        assert r[case].startswith('CheckpointDamaged: ') and 'is not the file its save wrote' in r[case], r
    assert r['cut short: weights unchanged'] and r['damaged: weights unchanged'], r
    assert r['whole again'] == 'no error' and r['whole again: weights of e2'], r
    assert r['another model'].startswith('RuntimeError: ') and 'is for a different model' in r['another model'] and r['another model: weights unchanged'], r
    assert r['no digests'].startswith('no error WARNING') and 'without digests' in r['no digests'], r
    assert r['folder gone'].startswith('CheckpointDamaged: ') and 'which is not there' in r['folder gone'], r
    assert not r['left by a killed save'] and r['written since this run started'] and r['e2 folders'] == 2, r
    for case in ('save', 'background save'):
        assert r[case].startswith('OSError: ') and 'Could not write the sharded checkpoint' in r[case] and 'No space left' in r[case], r
        assert r[f'after {case}'] == [True, True], r            # (the folders as before: no half one; the checkpoint file as it was)
    assert r['load the last whole one'] == 'no error' and r['loaded its weights'] and r['temporaries'] == [], r
    fault_row('a sharded checkpoint\'s shard cut short, changed, or swapped for another save\'s', '`CheckpointDamaged: .../m.<hex>.dcp/'
              '__0_0.distcp is not the file its save wrote (changed, damaged, or another save\'s): nothing of the checkpoint was loaded. '
              'Load an earlier checkpoint, or save again.`', None, 'nothing: the model keeps its weights')
    fault_row('disk full during a sharded save (at once or in the background)', '`OSError: [Errno 28] Could not write the sharded '
              'checkpoint .../ckpt.<hex>.dcp (No space left on device); the half-written folder is removed, and the checkpoint ... '
              'still names the last whole save. ...`', None, 'nothing: the last whole checkpoint stays named and loads; no half folder')
