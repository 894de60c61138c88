"""Faults and crafted files against sharded checkpoints (a folder of shards named by a checkpoint file: nbs/05_checkpoint),
run as a script by tests/test_security.py (`crafted`) and tests/test_checkpoint.py (`damaged`, `full`): one replica on the
native backend on the CPU, a real FSDP2 learner (`to_tpu_distributed(fsdp=True)`) on scikit-learn's digits, real
torch.distributed.checkpoint folders. Prints one JSON line: each case's outcome, and what stayed where it was.

    python tests/sharded_checkpoint_faults.py <phase>[,<phase>...] <folder> [<tiny disk>]"""
import sys, json, os, pickle, shutil, hashlib, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from helpers import *
from fastai_xla.fsdp import whole
from fastai_xla.checkpoint import BackgroundSaves

phases, root = sys.argv[1].split(','), Path(sys.argv[2])
out = {}

def learner(path, width=32, cbs=None):
    set_seed(0)
    model = nn.Sequential(Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))
    learn = Learner(digits_dls(), model, loss_func=CrossEntropyLossFlat(), path=path, cbs=cbs)
    return learn.to_tpu_distributed(fsdp=True, backend='native')

def weights(learn): return torch.cat([whole(p).detach().cpu().flatten() for p in learn.model.parameters()])

def case(name, f):
    "Run `f`; note its outcome as `ExceptionType: message` (or 'no error')."
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter('always')
            f()
        out[name] = 'no error' + ''.join(f' WARNING {w.message}' for w in seen if 'digests' in str(w.message))
    except Exception as e: out[name] = f'{type(e).__name__}: {e}'

def fitted(learn):
    with learn.no_bar(): learn.fit(1, 1e-2)
    return learn

def folders(models): return sorted(p.name for p in models.glob('*.dcp'))

if 'crafted' in phases:   # a checkpoint file naming a folder that is not its own: nothing read, nothing deleted
    learn = fitted(learner(root/'crafted'))
    models = learn.save('good').parent
    victim = root/'victim'; victim.mkdir(); (victim/'keep').write_text('kept')
    before = weights(learn)
    names = {'absolute': str(victim), 'empty': '', 'parent': '../../victim', 'models': '.', 'another name': 'good.0123abcd.dcp',
             'not a string': 7}
    for label, name in names.items():
        file = f"crafted_{label.replace(' ', '_')}"
        torch.save({'fastai_xla_sharded': 1, 'folder': name}, models/f'{file}.pth')
        case(f'load {label}', lambda: learn.load(file))
        torch.save({'fastai_xla_resume': 2, 'next_epoch': 1, 'fastai_xla_sharded': 1, 'folder': name}, models/f'{file}_resume.pth')
        case(f'load_resume {label}', lambda: learn.load_resume(f'{file}_resume'))
        torch.save({'fastai_xla_sharded': 1, 'folder': name}, models/f'{file}_again.pth')
        case(f'save over {label}', lambda: learn.save(f'{file}_again'))
    (models/'link.abcdef01.dcp').symlink_to(victim)    # (a symlink of the right name, to elsewhere)
    torch.save({'fastai_xla_sharded': 1, 'folder': 'link.abcdef01.dcp'}, models/'link.pth')
    case('load symlink', lambda: learn.load('link'))
    case('save over symlink', lambda: learn.save('link'))
    good_folder = models/torch.load(models/'good.pth', weights_only=True)['folder']
    copied = models/good_folder.name.replace('good.', 'copied.')           # (a copy of the good save under a name of its own)
    shutil.copytree(good_folder, copied)
    md = pickle.loads((copied/'.metadata').read_bytes())                    # DCP's own metadata, each piece's file named outside
    for info in md.storage_data.values(): info.relative_path = '../../victim/keep'
    (copied/'.metadata').write_bytes(pickle.dumps(md))
    state = torch.load(models/'good.pth', weights_only=True)
    state['folder'] = copied.name                                          # (its digests made to match: the reader's check is next)
    state['files'] = {p.name: [p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()] for p in copied.iterdir()}
    torch.save(state, models/'copied.pth')
    case('load metadata naming a file outside', lambda: learn.load('copied'))
    out.update(victim_kept=(victim/'keep').read_text() == 'kept', models_kept=models.is_dir() and good_folder.is_dir(),
               weights_same=bool(torch.equal(before, weights(learn))))

if 'damaged' in phases:   # a shard cut short, changed or swapped: refused before the model changes; a failed read changes nothing
    learn = fitted(learner(root/'damaged'))
    models = learn.save('e1').parent
    fitted(learn); learn.save('e2')
    good = weights(learn)
    e1, e2 = (models/f for f in folders(models))
    shard = sorted(e2.glob('*.distcp'))[0]
    original = shard.read_bytes()
    fitted(learn)                                                          # (the weights move on: a load must bring e2's back)
    moved = weights(learn)
    shard.write_bytes(original[:len(original) // 2])
    case('cut short', lambda: learn.load('e2'))
    out['cut short: weights unchanged'] = bool(torch.equal(moved, weights(learn)))
    damaged = bytearray(original); damaged[len(original) // 2:len(original) // 2 + 1024] = os.urandom(1024)
    shard.write_bytes(bytes(damaged))
    case('1 KB changed', lambda: learn.load('e2'))
    shutil.copy(sorted(e1.glob('*.distcp'))[0], shard)
    case('swapped for epoch 1', lambda: learn.load('e2'))
    out['damaged: weights unchanged'] = bool(torch.equal(moved, weights(learn)))
    shard.write_bytes(original)
    case('whole again', lambda: learn.load('e2'))
    out['whole again: weights of e2'] = bool(torch.equal(good, weights(learn)))
    wider = learner(root/'damaged', width=48)
    wide = weights(wider)
    case('another model', lambda: wider.load('e2'))
    out['another model: weights unchanged'] = bool(torch.equal(wide, weights(wider)))
    state = torch.load(models/'e1.pth', weights_only=True); state.pop('files')
    old = models/e1.name.replace('e1.', 'old.'); shutil.copytree(e1, old)
    torch.save(dict(state, folder=old.name), models/'old.pth')             # (as an earlier fastai_xla wrote it: no digests)
    case('no digests', lambda: learn.load('old'))
    shutil.rmtree(old)
    case('folder gone', lambda: learn.load('old'))
    left = models/'e2.0badf00d.dcp'; left.mkdir(); (left/'__0_0.distcp').write_bytes(b'half')   # (what a killed save leaves)
    os.utime(left, (1, 1))
    kept = models/'e2.1234abcd.dcp'; kept.mkdir()                          # (another run's, being written now: kept)
    learn.save('e2')
    out['left by a killed save'] = left.exists()
    out['written since this run started'] = kept.exists()
    out['e2 folders'] = len([f for f in folders(models) if f.startswith('e2.')])

if 'full' in phases:      # a disk with no room for the shards: named, no half folder, the last checkpoint kept and loadable
    tiny = Path(sys.argv[3])
    small = fitted(learner(tiny))
    models = small.save('ckpt').parent
    kept = weights(small)
    before = (folders(models), (models/'ckpt.pth').read_bytes())
    big = learner(tiny, width=4096)
    case('save', lambda: big.save('ckpt'))
    out['after save'] = [folders(models) == before[0], (models/'ckpt.pth').read_bytes() == before[1]]
    background = learner(tiny, width=4096, cbs=BackgroundSaves())
    case('background save', lambda: (background.save('ckpt'), background.load('ckpt')))
    out['after background save'] = [folders(models) == before[0], (models/'ckpt.pth').read_bytes() == before[1]]
    fitted(small)
    case('load the last whole one', lambda: small.load('ckpt'))
    out['loaded its weights'] = bool(torch.equal(kept, weights(small)))
    out['temporaries'] = sorted(p.name for p in models.glob('.*.tmp'))

print('REPORT ' + json.dumps(out))
