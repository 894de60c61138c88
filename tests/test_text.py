"""fastai's text classifier (AWD_LSTM) and language model on the CPU XLA device, against the same recipe on eager CPU.

Data: docstrings of installed libraries (`fastai_xla.demo.docstrings_csv`), read from a CSV file with fastai's
`TextDataLoaders.from_df`. A small AWD_LSTM (64-wide embeddings, 128 hidden units, 2 layers) keeps the tests
short; the code paths are the ones of the full-size model. One XLA device here: the replicas' shared bucket per
step is computed by every replica from the item lengths (tested in nbs/11_text.ipynb), not with a collective."""
import pandas as pd, pytest, torch, warnings
from fastai.text.all import *
from fastai_xla.all import *
from fastai_xla.demo import docstrings_csv
from helpers import EpochCounters, final

pytestmark = pytest.mark.text   # slow: scripts/test.sh runs these on the first stack only

SMALL = dict(emb_sz=64, n_hid=128, n_layers=2)

@pytest.fixture(scope='module')
def docs(tmp_path_factory):
    return pd.read_csv(docstrings_csv(tmp_path_factory.mktemp('text')/'docstrings.csv'))

def classifier(df, seed=0, bs=32):
    dls = TextDataLoaders.from_df(df, text_col='text', label_col='label', valid_pct=0.2, seed=42, bs=bs)
    set_seed(seed)
    return text_classifier_learner(dls, AWD_LSTM, pretrained=False, metrics=accuracy, config=SMALL)

@pytest.fixture(scope='module')
def trained(docs):
    "The same classifier recipe fitted eagerly on the CPU and on XLA (fit_one_cycle(3)), the XLA one with per-epoch counters."
    eager = classifier(docs)
    with eager.no_bar(): eager.fit_one_cycle(3, 1e-2)
    xla = classifier(docs).to_tpu_distributed()
    counters, shapes = EpochCounters(), BatchLengths()
    with xla.no_bar(): xla.fit_one_cycle(3, 1e-2, cbs=[counters, shapes])
    return eager, xla, counters.epochs, shapes.epochs

class BatchLengths(Callback):
    """The (training?, text length) pairs of the batches of each epoch, but for the fit's first training step: its graph
    is its own (no optimizer state yet), so its bucket's usual training graph compiles when the bucket next comes, which
    can be in a later epoch (fastai's SortedDL puts the longest batch first, often a rare bucket)."""
    def before_fit(self): self.epochs, self.first_step = [], True
    def before_epoch(self): self.epochs.append(set())
    def before_batch(self):
        if self.training and self.first_step: self.first_step = False
        else: self.epochs[-1].add((self.training, self.xb[0].shape[1]))

def test_classifier_learns_like_eager(trained):
    eager, xla, *_ = trained
    acc_eager, acc_xla = final(eager, 'accuracy'), final(xla, 'accuracy')
    assert acc_xla > 0.85 and abs(acc_xla - acc_eager) < 0.04, (acc_xla, acc_eager)   # majority class: 0.43

def assert_compiles_once_per_bucket(epochs, lengths):
    "Each epoch compiles no more graphs than new (phase, bucket length) pairs appear in it (the first epoch: 4 more)."
    seen = set()
    for counters, pairs in zip(epochs, lengths):
        new = pairs - seen
        seen |= pairs
        assert counters['compiles'] <= len(new) + (4 if counters is epochs[0] else 0), (counters, new)
        assert counters['to_host'] <= 3                                           # not per batch
    assert len(seen) <= 8, seen

def test_classifier_compiles_once_per_bucket(trained):
    "One graph per (phase, bucket length), compiled when that bucket first appears (in a later epoch for a rare one)."
    _, xla, epochs, lengths = trained
    assert_compiles_once_per_bucket(epochs, lengths)

def test_classifier_batches_are_padded_to_buckets(trained):
    _, xla, *_ = trained
    shapes = {b[0].shape[1] for b in xla.dls.train}
    assert shapes and all(n % 72 == 0 for n in shapes) and len(shapes) <= 4, shapes

def test_get_preds_predict_show_results_export(trained, tmp_path):
    eager, xla, *_ = trained
    acc = final(xla, 'accuracy')
    preds, targs = xla.get_preds()
    test_eq(targs, tensor([y for _, y in xla.dls.cpu_dls.valid_ds]))     # in data set order
    assert (preds.argmax(1) == targs).float().mean().item() == pytest.approx(acc, abs=1e-6)
    label, idx, probs = xla.predict('Return a new DataFrame with the rows of this one sorted by the given column labels.')
    assert label in xla.dls.vocab[1] and probs.sum().item() == pytest.approx(1, abs=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        xla.dls.show_batch(max_n=2)    # (fastai's own text show_results fails, eager too: "'Function' object is not subscriptable")
    xla.export(tmp_path/'text.pkl')
    cpu = load_learner(tmp_path/'text.pkl', cpu=True)
    label_cpu, _, probs_cpu = cpu.predict('Return a new DataFrame with the rows of this one sorted by the given column labels.')
    assert label_cpu == label and torch.allclose(probs_cpu, probs.cpu(), atol=1e-4)

def test_lr_find_on_the_classifier(trained):
    "fastai's `lr_find` on the XLA text classifier (it saves the model and loads it back through `TextLearner.load`): it runs and restores the weights."
    _, xla, *_ = trained
    before = [p.detach().cpu().clone() for p in xla.model.parameters()]
    with xla.no_bar(): res = xla.lr_find(num_it=20, show_plot=False)
    assert res.valley > 0
    assert all(torch.equal(a, p.detach().cpu()) for a, p in zip(before, xla.model.parameters()))

class FitAccuracies(Callback):
    "The final accuracy of each fit."
    order = 100
    def __init__(self): self.accuracies = []
    def after_fit(self): self.accuracies.append(final(self.learn, 'accuracy'))

def test_fine_tune_after_fit(trained):
    "fastai's `fine_tune` (a fit with the encoder frozen, then one with all of it) on the fitted XLA classifier: both run and it stays accurate."
    _, xla, *_ = trained
    fits = FitAccuracies()
    with xla.no_bar(), xla.added_cbs(fits): xla.fine_tune(1, 1e-3)
    assert len(fits.accuracies) == 2 and min(fits.accuracies) > 0.85, fits.accuracies

class TinyTransformer(nn.Module):
    "A transformer-style text encoder from torch modules: an embedding and one `TransformerEncoderLayer`."
    def __init__(self, vocab_sz, d_model=64, n_heads=4, pad_idx=1):
        super().__init__()
        self.embed = nn.Embedding(vocab_sz, d_model, padding_idx=pad_idx)
        self.layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=128, dropout=0.1, batch_first=True)
    def reset(self): pass
    def forward(self, x): return self.layer(self.embed(x))

def test_transformer_classifier(docs):
    "An architecture registered in fastai's `_model_meta` (here a transformer from torch modules) through `text_classifier_learner` on XLA: it learns, at the bucket shapes (chunk by chunk, `static_forward`)."
    from fastai.text.models.core import _model_meta
    _model_meta[TinyTransformer] = dict(config_clas=dict(d_model=64, output_p=0.1), hid_name='d_model',
                                        split_clas=lambda m: [list(m.parameters())])
    dls = TextDataLoaders.from_df(docs, text_col='text', label_col='label', valid_pct=0.2, seed=42, bs=32)
    set_seed(0)
    learn = text_classifier_learner(dls, TinyTransformer, pretrained=False, metrics=accuracy).to_xla()
    counters, shapes = EpochCounters(), BatchLengths()
    with learn.no_bar(): learn.fit_one_cycle(3, 1e-3, cbs=[counters, shapes])
    assert final(learn, 'accuracy') > 0.7, learn.recorder.values                 # majority class: 0.43
    assert_compiles_once_per_bucket(counters.epochs, shapes.epochs)

def test_language_model_trains_at_fixed_shapes(docs):
    dls = TextDataLoaders.from_df(docs, text_col='text', is_lm=True, valid_pct=0.1, seed=42, bs=32, seq_len=72)
    set_seed(0)
    learn = language_model_learner(dls, AWD_LSTM, pretrained=False, metrics=[accuracy, Perplexity()],
                                   config={**awd_lstm_lm_config, **SMALL}).to_xla()
    counters = EpochCounters()
    with learn.no_bar(): learn.fit_one_cycle(3, 1e-2, cbs=counters)
    assert learn.model[1].decoder.weight is learn.model[0].encoder.weight     # fastai's tied weights stay tied on XLA
    assert final(learn, 'accuracy') > 0.15                        # a uniform guess over the vocabulary: < 0.001
    assert counters.epochs[0]['compiles'] <= 5, counters.epochs     # full and last batch, training and validation, + 1
    assert counters.epochs[1]['compiles'] == 0 and counters.epochs[2]['compiles'] == 0, counters.epochs
    assert max(e['to_host'] for e in counters.epochs) <= 3

REPLICAS_SCRIPT = """
import json, sys, warnings
warnings.filterwarnings('ignore')
import pandas as pd
from fastai.text.all import *
from fastai_xla.all import *
from fastai_xla.demo import docstrings_csv
SMALL = dict(emb_sz=64, n_hid=128, n_layers=2)
df = pd.read_csv(docstrings_csv('docs/docstrings.csv')).sample(800, random_state=0)
def validate_values(learn): return [float(v) for v in learn.validate()]
def fit_then_validate(learn):
    learn.fit_one_cycle(1, 1e-2)
    return validate_values(learn)
def learner(is_lm, bs):
    set_seed(0)
    if is_lm:
        dls = TextDataLoaders.from_df(df, text_col='text', is_lm=True, valid_pct=0.2, seed=42, bs=bs, seq_len=72)
        return language_model_learner(dls, AWD_LSTM, pretrained=False, metrics=accuracy, config={{**awd_lstm_lm_config, **SMALL}})
    dls = TextDataLoaders.from_df(df, text_col='text', label_col='label', valid_pct=0.2, seed=42, bs=bs)
    return text_classifier_learner(dls, AWD_LSTM, pretrained=False, metrics=accuracy, config=SMALL)
is_lm = {is_lm}
learn = learner(is_lm, 16)
two = learn.launch(fit_then_validate, nprocs=2, transport='gloo')   # forked: this process never started XLA
# the weights that came back, on one XLA device; a language model's with 32 rows (2 replicas of 16 rows)
one_device = learner(is_lm, 32 if is_lm else 16)
one_device.model.load_state_dict(learn.model.state_dict())
print('VALUES', json.dumps(dict(two=two, one=validate_values(one_device.to_xla()))))
"""

@pytest.mark.parametrize('kind', ['classifier', 'language_model'])
def test_two_replicas_validate_like_one_device(tmp_path, kind):
    """A fit on 2 gloo replicas (learn.launch, forked), then validation: loss and accuracy summed over the replicas
    equal one XLA device's for the same weights. The classifier's replicas pad each step to a shared bucket; the
    language model's replicas read alternate rows of a loader with twice their rows (one device: all rows)."""
    import json, os, subprocess, sys
    (tmp_path/'text.py').write_text(REPLICAS_SCRIPT.format(is_lm=kind == 'language_model'))
    r = subprocess.run([sys.executable, 'text.py'], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                       env={**os.environ, 'PJRT_DEVICE': 'CPU'})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.split('VALUES ')[-1])
    assert res['two'][0] < (1.35 if kind == 'classifier' else 7.0), res    # it learnt: below a uniform guess (ln 4; ln of the vocabulary)
    test_close(res['two'], res['one'], eps=1e-4)
