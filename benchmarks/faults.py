"""The fault table: every fault the tests cause for real, what the user sees, how long it took, what was lost.

Runs the fault tests (tests/test_faults.py, tests/test_preemption.py, the full-disk test of tests/test_checkpoint.py)
with FASTAI_XLA_FAULT_TABLE set: each writes its row when it passes. Then prints the table (markdown). About 5 minutes.

    PJRT_DEVICE=CPU python benchmarks/faults.py
"""
import json, os, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ['tests/test_faults.py', 'tests/test_preemption.py', 'tests/test_checkpoint.py::test_full_disk_keeps_the_previous_checkpoint']

def main():
    with tempfile.TemporaryDirectory() as d:
        table = Path(d)/'faults.jsonl'
        env = {**os.environ, 'FASTAI_XLA_FAULT_TABLE': str(table), 'PJRT_DEVICE': os.environ.get('PJRT_DEVICE', 'CPU')}
        r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *TESTS], cwd=ROOT, env=env)
        rows = [json.loads(l) for l in table.read_text().splitlines()] if table.exists() else []
    print('| fault | what the user sees | seconds | what is lost |')
    print('|---|---|---|---|')
    for row in rows:
        secs = '-' if row['seconds'] is None else f"{row['seconds']:.1f}"
        print(f"| {row['fault']} | {row['sees']} | {secs} | {row['lost']} |")
    if r.returncode: sys.exit(f'{r.returncode}: some fault tests failed; their rows are missing above')

if __name__ == '__main__': main()
