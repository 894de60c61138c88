"""The fault table: every fault the tests cause for real, what the user sees, how long it took, what was lost.

Runs the fault tests (tests/test_faults.py, tests/test_preemption.py, tests/test_signals.py, tests/test_security.py, the
full-disk test of tests/test_checkpoint.py, six of tests/test_launch.py, one of tests/test_replicas.py, five of tests/test_torchrun.py) with
FASTAI_XLA_FAULT_TABLE set: each writes its row when it passes. Then runs a finished torchrun script `--runs` times in a row
(default 20; the native backend on torch_xla's device, where a run once ended with SIGABRT at exit) and counts the exit
statuses: one more row. Prints the table (markdown). About 30 minutes.

    PJRT_DEVICE=CPU python benchmarks/faults.py [--runs 20]
"""
import argparse, collections, json, os, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ['tests/test_faults.py', 'tests/test_preemption.py', 'tests/test_checkpoint.py::test_full_disk_keeps_the_previous_checkpoint',
         'tests/test_launch.py::test_a_launch_after_an_eager_fit_trains', 'tests/test_launch.py::test_sigterm_to_a_forked_replica_stops_the_run',
         'tests/test_launch.py::test_what_a_launch_says_when_it_cannot_go_on', 'tests/test_signals.py', 'tests/test_security.py',
         'tests/test_launch.py::test_spawn_from_a_script_in_fresh_interpreters', 'tests/test_launch.py::test_converted_again_and_a_second_learner_in_a_launch',
         'tests/test_torchrun.py::test_converted_twice_two_learners_and_a_launch_inside_torchrun',
         'tests/test_torchrun.py::test_a_nan_on_one_replica_ends_the_run_named',
         'tests/test_replicas.py::test_a_replica_failing_mid_epoch_stops_every_replica_with_its_traceback',
         'tests/test_torchrun.py::test_a_replica_killed_under_max_restarts_resumes_and_ends_its_epochs',
         'tests/test_torchrun.py::test_a_replica_killed_without_restarts_ends_the_run_named',
         'tests/test_torchrun.py::test_sigterm_to_torchrun_stops_every_replica_after_the_same_step',
         'tests/test_checkpoint.py::test_a_damaged_sharded_checkpoint_is_refused_whole_and_a_full_disk_leaves_no_half_folder',
         'tests/test_compile_options.py']

def finished_torchrun_runs(runs:int, folder:Path) -> dict:
    "The fault table's row for `runs` torchrun runs of a finished script in a row: how many exited with each status."
    sys.path.insert(0, str(ROOT/'tests'))
    from test_torchrun import SCRIPT, TESTS as TESTS_DIR
    (folder/'train.py').write_text(SCRIPT.format(tests=str(TESTS_DIR), kill=False, resume=False))
    env = {**os.environ, 'PJRT_DEVICE': 'CPU', 'FASTAI_XLA_BACKEND': 'native', 'FASTAI_XLA_NATIVE_DEVICE': 'xla'}
    statuses, aborts, start = collections.Counter(), 0, time.time()
    for _ in range(runs):
        r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2', 'train.py'],
                           cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        statuses[r.returncode] += 1
        aborts += 'terminate called without an active exception' in r.stderr
    said = ', '.join(f'{n} with status {s}' for s, n in sorted(statuses.items()))
    return dict(fault=f'{runs} finished runs in a row of `torchrun --standalone --nproc-per-node=2` (the native backend, torch_xla installed)',
                sees=f'{said}; {aborts} aborted at exit ("terminate called without an active exception")',
                seconds=(time.time() - start) / runs, lost='nothing (seconds: per run)')

def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument('--runs', type=int, default=20, help='finished torchrun runs in a row (0: none)')
    runs = args.parse_args().runs
    with tempfile.TemporaryDirectory() as d:
        table = Path(d)/'faults.jsonl'
        env = {**os.environ, 'FASTAI_XLA_FAULT_TABLE': str(table), 'PJRT_DEVICE': os.environ.get('PJRT_DEVICE', 'CPU')}
        r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *TESTS], cwd=ROOT, env=env)
        rows = [json.loads(l) for l in table.read_text().splitlines()] if table.exists() else []
        if runs: rows.append(finished_torchrun_runs(runs, Path(d)))
    print('| fault | what the user sees | seconds | what is lost |')
    print('|---|---|---|---|')
    for row in condensed(rows):
        secs = '-' if row['seconds'] is None else f"{row['seconds']:.1f}"
        print(f"| {row['fault']} | {row['sees']} | {secs} | {row['lost']} |")
    if r.returncode: sys.exit(f'{r.returncode}: some fault tests failed; their rows are missing above')

def condensed(rows):
    "The rows, those of the bad `FASTAI_XLA_*` values made one (each variable is a test of its own; the messages are alike)."
    bad = [r for r in rows if r['fault'].startswith('`FASTAI_XLA_')]
    rest = [r for r in rows if r not in bad]
    if bad:
        names = ', '.join(r['fault'].strip('`').split('=')[0].replace('FASTAI_XLA_', '') for r in bad)
        rest.append(dict(fault=f'a bad value of a `FASTAI_XLA_*` variable ({len(bad)} tested: {names})', sees=bad[0]['sees'],
                         seconds=max(r['seconds'] for r in bad), lost=bad[0]['lost']))
    raised = [r for r in rest if r['fault'].startswith('a replica raises')]
    if len(raised) > 1:
        rest[rest.index(raised[0])] = dict(fault='a replica raises before, during or after `fit` (each tested)', sees=raised[0]['sees'],
                                           seconds=max(r['seconds'] for r in raised), lost='at most the epoch in progress')
        for r in raised[1:]: rest.remove(r)
    damaged = [r for r in rest if r['fault'] in ('a truncated resume checkpoint', 'a corrupted resume checkpoint')]
    if len(damaged) == 2:
        rest[rest.index(damaged[0])] = {**damaged[0], 'fault': 'a truncated or corrupted resume checkpoint (each tested)'}
        rest.remove(damaged[1])
    return rest

if __name__ == '__main__': main()
