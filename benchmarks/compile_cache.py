"""Effect of the persistent compilation cache: the same one-epoch resnet18 fit in three fresh
processes, without the cache, then twice with it (the second run could reuse the first's graphs).

    PJRT_DEVICE=CPU python benchmarks/compile_cache.py
"""
import os, subprocess, sys, tempfile

CHILD = r'''
import os, sys, time
from fastai_xla.all import *
from fastai_xla.demo import digits_dls
from fastai.vision.all import *
import torch_xla.debug.metrics as met
if sys.argv[1] != '-': enable_compile_cache(sys.argv[1])
t = time.time(); set_seed(0)
learn = vision_learner(digits_dls(), resnet18, pretrained=False, n_in=1, metrics=accuracy).to_tpu_distributed(seed=0)
with learn.no_bar(), learn.no_logging(): learn.fit(1)
data = met.metric_data('CompileTime')
print(f"RESULT {time.time()-t:.1f} {data[1]/1e9:.1f} {data[0]}")
'''

def run(cache):
    out = subprocess.run([sys.executable, '-c', CHILD, cache], capture_output=True, text=True,
                         env={**os.environ, 'PJRT_DEVICE': os.environ.get('PJRT_DEVICE', 'CPU')})
    line = [l for l in out.stdout.splitlines() if l.startswith('RESULT')]
    if not line: sys.exit(out.stderr[-2000:])
    return line[0].split()[1:]

if __name__ == '__main__':
    cache = tempfile.mkdtemp()
    print('| run | wall s | compile s | graphs compiled |'); print('|---|---|---|---|')
    for name, c in [('no cache', '-'), ('cache, first run', cache), ('cache, second run', cache)]:
        print('| ' + ' | '.join([name, *run(c)]) + ' |')
