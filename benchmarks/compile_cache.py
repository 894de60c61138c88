"""Effect of the persistent compilation cache: the same one-epoch fit in three fresh processes, without the cache,
then twice with it (the second run could reuse the first's graphs).

    PJRT_DEVICE=CPU python benchmarks/compile_cache.py            # torch_xla: resnet18 on the digits
    PJRT_DEVICE=CPU python benchmarks/compile_cache.py --native   # the native backend on the CPU, compile=True (inductor)

`--native` fits the digits' tabular learner compiled with inductor; its "no cache" run gets an empty inductor cache
folder of its own (inductor keeps one in the temporary directory by default: a run after any other would hit it).
Compile seconds: torch_xla's `CompileTime`; on the native backend, the seconds dynamo spent compiling frames
(`torch._dynamo.utils.compilation_time_metrics`, its tracing, AOTAutograd's and inductor's work included, and a backward
compiled at its first call)."""
import os, subprocess, sys, tempfile

CHILD = r'''
import os, sys, time
from fastai_xla.all import *
from fastai.vision.all import *
from fastai.tabular.all import *
from fastai_xla.demo import digits_dls, digits_frame
native = sys.argv[2] == 'native'
kept = sys.argv[1] != '-'
t = time.time(); set_seed(0)
if native:
    df, cats, conts = digits_frame()
    dls = TabularDataLoaders.from_df(df, procs=[Categorify, FillMissing, Normalize], cat_names=cats, cont_names=conts, y_names='digit',
                                     y_block=CategoryBlock(), valid_idx=list(range(0, len(df), 5)), bs=64, num_workers=0)
    learn = tabular_learner(dls, metrics=accuracy).to_tpu_distributed(seed=0, backend='native', compile=True,
                                                                      compile_cache=sys.argv[1] if kept else None)
else:
    if kept: enable_compile_cache(sys.argv[1])
    learn = vision_learner(digits_dls(), resnet18, pretrained=False, n_in=1, metrics=accuracy).to_tpu_distributed(seed=0)
with learn.no_bar(), learn.no_logging(): learn.fit(1)
if native:
    import torch._dynamo.utils as du
    timed = du.compilation_time_metrics      # (frames compiled; a backward compiled at its first call, apart)
    seconds = sum(sum(timed.get(k, [])) for k in ('_compile.compile_inner', 'backward._backward_impl'))
    graphs = du.counters['stats']['unique_graphs']
else:
    import torch_xla.debug.metrics as met
    data = met.metric_data('CompileTime'); seconds, graphs = data[1] / 1e9, data[0]
print(f"RESULT {time.time()-t:.1f} {seconds:.1f} {graphs}")
'''

def run(cache:str, native:bool):
    env = {**os.environ, 'PJRT_DEVICE': os.environ.get('PJRT_DEVICE', 'CPU')}
    if native and cache == '-': env['TORCHINDUCTOR_CACHE_DIR'] = tempfile.mkdtemp()   # (not inductor's default folder: warm)
    out = subprocess.run([sys.executable, '-c', CHILD, cache, 'native' if native else 'torch_xla'], capture_output=True, text=True, env=env)
    line = [l for l in out.stdout.splitlines() if l.startswith('RESULT')]
    if not line: sys.exit(out.stderr[-2000:])
    return line[0].split()[1:]

if __name__ == '__main__':
    native = '--native' in sys.argv[1:]
    cache = tempfile.mkdtemp()
    print('| run | wall s | compile s | graphs compiled |'); print('|---|---|---|---|')
    for name, c in [('no cache', '-'), ('cache, first run', cache), ('cache, second run', cache)]:
        print('| ' + ' | '.join([name, *run(c, native)]) + ' |', flush=True)
