"""fastai_xla installs the way users install it, with today's pip and setuptools.

Each test makes a fresh virtual environment, upgrades pip to the newest release (as Kaggle and
Colab have it), and installs a copy of this repository with `--no-deps` (the torch stack is not
what is tested here). pip then builds in an isolated environment with the newest setuptools, as
it does on users' machines: a `setup.py` that needs something setuptools dropped (it dropped
`pkg_resources` in 81) fails here first. Needs the package index (PyPI), like every install."""
import configparser, re, shutil, subprocess, sys, tarfile, zipfile
from pathlib import Path
import pytest

ROOT = Path(__file__).parent.parent
_cfg = configparser.ConfigParser(delimiters=['=']); _cfg.read(ROOT/'settings.ini')
VERSION = _cfg['DEFAULT']['version']

def run(*cmd, cwd=None):
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout

def source_copy(dest:Path) -> Path:
    "The repository's files as a clone would have them (tracked and new, not ignored), without the environments."
    try: files = run('git', 'ls-files', '-co', '--exclude-standard', cwd=ROOT).splitlines()
    except (AssertionError, FileNotFoundError): files = [str(p.relative_to(ROOT)) for p in ROOT.rglob('*') if p.is_file()]
    for f in files:
        if f.split('/')[0].startswith(('.venv', '.git/')) or not (ROOT/f).is_file(): continue
        (dest/f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT/f, dest/f)
    return dest

def fresh_venv(path:Path) -> Path:
    "A new virtual environment with the newest pip; returns its python."
    run(sys.executable, '-m', 'venv', path)
    py = path/'bin'/'python'
    run(py, '-m', 'pip', 'install', '-q', '-U', 'pip')
    return py

def installed(py, cwd) -> tuple:
    """What `py` imports as fastai_xla, from a directory outside the source: (metadata version, __version__, file); found, not
    run (importing the package imports its backends, which need torch, and these environments have no torch stack)."""
    out = run(py, '-c', "import importlib.metadata as m, importlib.util as u, re; s = u.find_spec('fastai_xla'); "
                        "print(m.version('fastai_xla'), re.search(r'__version__ = .(.+?).$', open(s.origin).read(), re.M).group(1), s.origin)", cwd=cwd)
    return tuple(out.split())

@pytest.fixture(scope='module')
def src(tmp_path_factory): return source_copy(tmp_path_factory.mktemp('src'))

def test_pip_install_and_editable(src, tmp_path):
    py = fresh_venv(tmp_path/'venv')
    run(py, '-m', 'pip', 'install', '-q', '--no-deps', src)
    version, init_version, where = installed(py, tmp_path)
    assert (version, init_version) == (VERSION, VERSION)
    assert str(tmp_path/'venv') in where                    # a real copy in site-packages
    run(py, '-m', 'pip', 'install', '-q', '--no-deps', '-e', src)
    version, init_version, where = installed(py, tmp_path)
    assert (version, init_version) == (VERSION, VERSION)     # the editable install reports settings.ini's version
    assert where == str(src/'fastai_xla'/'__init__.py')      # and imports the source itself

def extra_pins(meta:str) -> dict:
    "`{extra: {requirement, ...}}` of a wheel's METADATA (no extra: '')."
    pins = {}
    for req, extra in re.findall(r'^Requires-Dist: ([^;\n]+?)(?:\s*;\s*extra == "(\w+)")?$', meta, re.M):
        pins.setdefault(extra, set()).add(req.replace(' ', ''))
    return pins

def check_extras_as_the_readme_names_them(meta:str):
    "The stack each extra installs is the one README.md's install table names for it (`pip install --dry-run` of `[cpu]`"
    "resolved to torch 2.9.0, torch_xla 2.9.0, torchvision 0.24.0, fastai 2.8.12 on 2026-11-25: fastai is not pinned)."
    pins, readme = extra_pins(meta), (ROOT/'README.md').read_text()
    row = lambda start: next(l for l in readme.splitlines() if l.startswith(start))
    assert pins['cpu'] == {'torch==2.9.0', 'torchvision==0.24.0', 'torch_xla==2.9.0'}, pins['cpu']
    assert pins['tpu'] == {'torch==2.9.0', 'torchvision==0.24.0', 'torch_xla[tpu]==2.9.0'}, pins['tpu']
    assert "`pip install './fastai_xla[cpu]'` | torch + torch_xla 2.9.0 (torchvision 0.24.0) and the newest fastai 2.8.x" in row('| a CPU machine')
    assert "`pip install './fastai_xla[tpu]'` | torch + torch_xla[tpu] 2.9.0" in row('| your TPU VM')
    assert 'fastai<2.9,>=2.8.7' in pins[''], pins['']     # "the newest fastai 2.8.x"

def test_build_sdist_and_wheel(src, tmp_path):
    py = fresh_venv(tmp_path/'venv')
    run(py, '-m', 'pip', 'install', '-q', 'build')
    run(py, '-m', 'build', '--outdir', tmp_path/'dist', src)     # the sdist, then the wheel built from the sdist
    sdist, = (tmp_path/'dist').glob('*.tar.gz')
    wheel, = (tmp_path/'dist').glob('*.whl')
    assert wheel.name == f'fastai_xla-{VERSION}-py3-none-any.whl'
    names = {n.split('/', 1)[-1] for n in tarfile.open(sdist).getnames()}
    assert {'settings.ini', 'setup.py', 'pyproject.toml', 'README.md', 'LICENSE', 'fastai_xla/core.py'} <= names
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f'fastai_xla-{VERSION}.dist-info/METADATA').decode()
    assert f'Version: {VERSION}' in meta and 'Requires-Dist: fastai' in meta and 'Provides-Extra: tpu' in meta
    check_extras_as_the_readme_names_them(meta)
    py2 = fresh_venv(tmp_path/'venv2')                           # the wheel alone, in a new environment
    run(py2, '-m', 'pip', 'install', '-q', '--no-deps', wheel)
    assert installed(py2, tmp_path)[:2] == (VERSION, VERSION)
