"""The README's three ways to run, run as written: each snippet marked `<!-- test_readme: name -->` in
README.md is saved verbatim as a script and run in a fresh process on the CPU XLA device, from an empty
directory (the snippets write their PNG folders there).

Covered: the script form through the real `xmp.spawn` (one replica here, the XLA transport with one
participant) with fastai's default `num_workers` (worker processes beside a running XLA runtime), the
notebook form's `learn.launch` (xmp.spawn with one replica here) and `show_results` afterwards, SPMD on
one CPU device. Not covered: several TPU cores (see the README's Testing section).
Slow (about two minutes each): `scripts/test.sh` runs these on its first stack only."""
import os, re, subprocess, sys
from pathlib import Path
import pytest

README = Path(__file__).parent.parent/'README.md'

def readme_snippets() -> dict:
    "The python blocks of README.md that follow a `<!-- test_readme: name -->` line, by name."
    found = re.findall(r'<!-- test_readme: (\w+) -->\s*```python\n(.*?)```', README.read_text(), re.S)
    return dict(found)

def test_the_readme_marks_its_three_ways_to_run():
    assert sorted(readme_snippets()) == ['notebook', 'script', 'spmd']

def epoch_rows(out:str) -> list:
    "fastai's epoch table rows in `out`: (epoch, train_loss, valid_loss, accuracy)."
    return [tuple(map(float, m)) for m in re.findall(r'^(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+\d\d:\d\d', out, re.M)]

@pytest.mark.readme
@pytest.mark.parametrize('name', ['script', 'notebook', 'spmd'])
def test_readme_snippet_runs_as_written(name, tmp_path):
    if name == 'spmd' and os.environ.get('FASTAI_XLA_BACKEND') == 'native': pytest.skip("SPMD is torch_xla's")
    (tmp_path/'snippet.py').write_text(readme_snippets()[name])
    env = {**os.environ, 'PJRT_DEVICE': 'CPU', 'MPLBACKEND': 'Agg'}
    r = subprocess.run([sys.executable, 'snippet.py'], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    out = (r.stdout + r.stderr).replace('\r', '\n')
    assert r.returncode == 0, out[-4000:]
    assert len(re.findall(r'epoch\s+train_loss\s+valid_loss\s+accuracy', out)) == 1, out[-3000:]   # one table: the master's
    rows = epoch_rows(out)
    assert [int(r[0]) for r in rows] == [0, 1, 2], out[-3000:]
    assert rows[-1][3] > 0.9, rows                     # it learned (0.97-0.98 in the runs the README quotes)
    assert 'XLAPerformanceWarning' not in out, out[-3000:]   # a healthy run: no late compile, no per-batch reads
    if name != 'script':                               # (`xla_report`: each epoch's time split and what bounds the fit)
        assert re.search(r'time [\d.]+ s: waiting for batches \d+%, compiling \d+%', out) and 'epochs 1-2: bound by' in out, out[-3000:]

def test_the_images_install_command_is_the_one_env_sh_runs():
    "scripts/env.sh installs fastai_xla into its copies of Colab's and Kaggle's images with the README's two lines."
    lines = re.search(r"```bash\n(pip list --format=freeze \| grep -iE '([^']+)' > keep\.txt)\n(pip install -c keep\.txt \./fastai_xla)\n```",
                      README.read_text())
    assert lines, 'the README has no Kaggle/Colab install block'
    env = (README.parent/'scripts'/'env.sh').read_text()
    assert f"pip\" list --format=freeze | grep -iE '{lines.group(2)}' > \"$1/keep.txt\"" in env
    assert 'pip" install "${PIP_QUIET[@]}" -c "$1/keep.txt" "$2"' in env
    assert re.search(r'colab-kaggle\) image_env colab 3\.13 [^\n]*; image_env kaggle 3\.12', env)   # (what scripts/test.sh makes)

def test_the_readme_is_read_in_one_sitting():
    "At most 200 lines: the detail of the measurements is in benchmarks/README.md and the guide, which it links."
    assert len(README.read_text().splitlines()) <= 200, len(README.read_text().splitlines())
