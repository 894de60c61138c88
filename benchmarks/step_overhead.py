"""What four of fastai_xla's changes to fastai's per-batch work save, each against fastai's own way.

    PJRT_DEVICE=CPU python benchmarks/step_overhead.py [--rounds 8] [--events 3000]

- lean event dispatch (`nbs/03_callback.ipynb`): microseconds per event that no callback of
  the learner handles, with fastai's dispatch and with fastai_xla's; then MLP epochs with each;
- whole-table tabular batches (`nbs/02_data.ipynb`): host time the training loop spends
  waiting for the next batch, and tabular epochs, with fastai's batches (`whole_table=False`)
  and with the whole table;
- cached items (`XLADataLoader(cache_items=True)`, `nbs/02_data.ipynb`): the same two measures
  for the CNN's digits images, each item made every epoch (fastai's way) or once;
- torch's optimizer step out of place (`nbs/02a_optimizer.ipynb`): host CPU time of torch Adam's
  step per training step on the CNN (14 tensors), torch's own per parameter (`foreach=False`, torch's
  choice off CUDA) and fastai_xla's out-of-place twin (`OutOfPlaceAdam`), then CNN epochs with each.
One process per change, the models and data of bench.py; the two settings alternate for
`--rounds` fits of 3 epochs (epochs after the first of each fit count), so that a slow spell
of this shared machine hits both. Prints one table."""
import argparse, json, os, subprocess, sys, time, timeit
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench

def _fit_epochs(learn, n=3):
    timer = bench._Timer()
    with learn.no_bar(), learn.no_logging(): learn.fit(n, 1e-2, cbs=timer.callback())
    return timer.times[1:]

def dispatch(rounds, events):
    from fastai.learner import Learner
    from fastai_xla.all import xla_device, XLALearner
    lean = XLALearner.__call__                # fastai_xla's dispatch, a method of the XLA learner's class
    xla_device()
    learn = bench._fastai_learner('mlp').to_tpu_distributed()
    def use(f): return lambda: setattr(XLALearner, '__call__', f)
    with learn.no_bar(), learn.no_logging():
        _fit_epochs(learn, 1)
        learn.training = True
        per_event = {}
        for name, f in (('fastai', Learner.__call__), ('fastai_xla', lean)):
            XLALearner.__call__ = f
            per_event[name] = timeit.timeit(lambda: learn('after_cancel_batch'), number=events) / events
    epochs = bench.alternate_fits(learn, {'fastai': use(Learner.__call__), 'fastai_xla': use(lean)}, rounds)
    XLALearner.__call__ = lean
    return dict(per_event=per_event, epochs=epochs)

def loader_setting(model, attr, rounds):
    "Loop wait per batch and epoch time of `model` with the loaders' `attr` off (fastai's way) and on."
    from fastai_xla.all import xla_device, XLADataLoader
    xla_device()
    learn = bench._fastai_learner(model).to_tpu_distributed()
    waited = {'t': 0.0, 'n': 0}
    iterate = XLADataLoader.__iter__
    def timed(self):                       # the time `next()` takes in the training loop
        it = iterate(self)
        while True:
            t = time.perf_counter()
            try: b = next(it)
            except StopIteration: return
            waited['t'] += time.perf_counter() - t; waited['n'] += 1
            yield b
    XLADataLoader.__iter__ = timed
    per_batch, epochs = {}, {}
    def use(v):
        def apply():
            for dl in learn.dls.loaders: setattr(dl, attr, v)
        return apply
    for v in (True, False): use(v)(); _fit_epochs(learn, 1)       # (the cache, if any, is made here)
    for name, v in (('fastai', False), ('fastai_xla', True)):
        use(v)(); waited.update(t=0.0, n=0); _fit_epochs(learn)
        per_batch[name] = waited['t'] / waited['n']
    XLADataLoader.__iter__ = iterate
    epochs = bench.alternate_fits(learn, {'fastai': use(False), 'fastai_xla': use(True)}, rounds)
    return dict(per_batch=per_batch, epochs=epochs)

def foreach_step(rounds):
    "Host CPU time of the optimizer step, and epoch time, with torch Adam's own per-parameter step and fastai_xla's out-of-place one."
    import torch
    from fastai_xla.core import xla_device, swap_class
    from fastai_xla.optimizer import OutOfPlaceAdam
    xla_device()
    learn = bench._fastai_learner('cnn').to_tpu_distributed()
    _fit_epochs(learn, 1)
    torch_opt, spent = learn.opt.opt, {'t': 0.0, 'n': 0}
    def timed_step(*args, **kwargs):      # (the step of the optimizer's class of the moment)
        t = time.thread_time(); res = type(torch_opt).step(torch_opt, *args, **kwargs)
        spent['t'] += time.thread_time() - t; spent['n'] += 1
        return res
    def use(v):             # fastai_xla's out-of-place step, or torch's own per parameter (its default off CUDA)
        def apply():
            swap_class(learn.opt.opt, OutOfPlaceAdam if v else torch.optim.Adam)
            for g in learn.opt.opt.param_groups: g['foreach'] = None if v else False
        return apply
    per_step = {}
    torch_opt.step = timed_step
    for name, v in (('fastai', False), ('fastai_xla', True)):
        use(v)(); spent.update(t=0.0, n=0); _fit_epochs(learn)
        per_step[name] = spent['t'] / spent['n']
    del torch_opt.step
    epochs = bench.alternate_fits(learn, {'fastai': use(False), 'fastai_xla': use(True)}, rounds)
    return dict(per_step=per_step, epochs=epochs)

CHILDREN = dict(dispatch=lambda a: dispatch(a.rounds, a.events),
                whole_table=lambda a: loader_setting('tabular', 'whole_table', a.rounds),
                cache_items=lambda a: loader_setting('cnn', 'cache_items', a.rounds),
                foreach=lambda a: foreach_step(a.rounds))

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=8)
    p.add_argument('--events', type=int, default=3000)
    p.add_argument('--child')
    a = p.parse_args()
    if a.child:
        res = CHILDREN[a.child](a)
        print('RESULT ' + json.dumps(res), flush=True)
        return
    env = dict(os.environ, PJRT_DEVICE=os.environ.get('PJRT_DEVICE', 'CPU'))
    res = {}
    for child in CHILDREN:
        out = subprocess.run([sys.executable, __file__, '--child', child, '--rounds', str(a.rounds), '--events', str(a.events)],
                             capture_output=True, text=True, env=env)
        lines = [l for l in out.stdout.splitlines() if l.startswith('RESULT ')]
        if not lines: sys.exit(f'{child} failed: ' + (out.stderr.strip().splitlines() or ['no output'])[-1])
        res[child] = json.loads(lines[-1][7:])
    d, w, c, f = res['dispatch'], res['whole_table'], res['cache_items'], res['foreach']
    rows = [('lean event dispatch', 'mlp', 'us per event no callback handles', d['per_event'], 1e6),
            ('lean event dispatch', 'mlp', 'epoch ms', d['epochs'], 1e3),
            ('whole-table batches', 'tabular', 'us the loop waits per batch', w['per_batch'], 1e6),
            ('whole-table batches', 'tabular', 'epoch ms', w['epochs'], 1e3),
            ('cached items', 'cnn', 'us the loop waits per batch', c['per_batch'], 1e6),
            ('cached items', 'cnn', 'epoch ms', c['epochs'], 1e3),
            ('torch optimizer step out of place', 'cnn', 'host CPU us per Adam step', f['per_step'], 1e6),
            ('torch optimizer step out of place', 'cnn', 'epoch ms', f['epochs'], 1e3)]
    print("| change | model | measure | fastai's way | fastai_xla | fastai_xla / fastai's way |\n|---|---|---|---|---|---|")
    for change, model, what, v, scale in rows:
        print(f"| {change} | {model} | {what} | {v['fastai']*scale:.1f} | {v['fastai_xla']*scale:.1f} | {v['fastai_xla']/v['fastai']:.2f} |")

if __name__ == '__main__': main()
