"""Packaging for fastai_xla. Every setting lives in settings.ini (nbdev 2's layout): edit there, not here.

Builds with any setuptools since 64 (pyproject.toml names the build system): no `pkg_resources`, which
setuptools 81 removed, and nothing read at build time that the source distribution does not carry
(MANIFEST.in adds settings.ini, README.md and LICENSE)."""
from configparser import ConfigParser
from pathlib import Path
import shlex, setuptools

here = Path(__file__).parent
config = ConfigParser(delimiters=['='])
config.read(here/'settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

expected = 'version description keywords author author_email lib_name user branch license status min_python audience language'.split()
missing = [o for o in expected if o not in cfg]
if missing: raise ValueError(f"settings.ini lacks the settings {missing}")

statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive']
py_versions = '3.10 3.11 3.12'.split()
requirements = lambda key: shlex.split(cfg.get(key, ''))

setuptools.setup(
    name = cfg['lib_name'],
    version = cfg['version'],
    description = cfg['description'],
    keywords = cfg['keywords'],
    author = cfg['author'],
    author_email = cfg['author_email'],
    license = 'Apache-2.0',
    classifiers = [
        'Development Status :: ' + statuses[int(cfg['status']) - 1],
        'Intended Audience :: ' + cfg['audience'].title(),
        'Natural Language :: ' + cfg['language'].title(),
    ] + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(cfg['min_python']):]],
    url = cfg['git_url'],
    packages = setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data = True,
    install_requires = requirements('requirements'),
    # torch_xla's wheels do not name the torch they need: each extra installs a pair that works together
    extras_require = {'cpu': requirements('cpu_requirements'), 'tpu': requirements('tpu_requirements'),
                      'torchtpu': requirements('torchtpu_requirements'),
                      'dev': requirements('dev_requirements')},
    python_requires = '>=' + cfg['min_python'],
    long_description = (here/'README.md').read_text(encoding='utf-8'),
    long_description_content_type = 'text/markdown',
    zip_safe = False,
    entry_points = {'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
)
