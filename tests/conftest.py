import os, importlib.util
os.environ.setdefault('PJRT_DEVICE', 'CPU')
import pytest
if os.environ.get('FASTAI_XLA_NATIVE_DEVICE') == 'tpu' and importlib.util.find_spec('torch_tpu') is None:
    import eager_tpu  # noqa: F401 (the eager test device named `tpu`, tests/eager_tpu.py: in this process and those it starts)

def pytest_configure(config):
    config.addinivalue_line('markers', 'readme: runs the README snippets as written (slow; the first pass of scripts/test.sh only)')
    config.addinivalue_line('markers', 'text: fastai text learners end to end (slow; the first pass of scripts/test.sh only, the second runs nbs/11_text)')
    config.addinivalue_line('markers', 'notebooks: executes the notebooks in nbs/ (the first pass of scripts/test.sh runs them with nbdev_test instead)')
    config.addinivalue_line('markers', 'stacks: what differs between the supported stacks (torch_xla, Python, packaging): run on every stack')
    config.addinivalue_line('markers', "fastai_version: what fastai's or Python's version decides: run on Colab's stack too (the newest fastai, Python 3.13)")
    config.addinivalue_line('markers', "slow: left to `bash scripts/test.sh --all` (tests/conftest.py's SLOW says why and what covers it in the default run)")
    config.addinivalue_line('markers', "fast: the fast tier, the runtime's pieces in this process (tests/test_runtime_units.py): run first by scripts/test.sh, under a minute")
    config.addinivalue_line('markers', "native: run again on the native backend by scripts/test.sh (tests/conftest.py's NATIVE)")

@pytest.fixture(scope='session', autouse=True)
def xla_first(request):
    "Start the XLA device before any test runs a CPU backward pass (see `fastai_xla.core.check_autograd`); not for the fast tier, which runs none."
    import importlib.util
    if request.config.getoption('markexpr') == 'fast': return None
    if importlib.util.find_spec('torch_xla') is None and os.environ.get('FASTAI_XLA_BACKEND') != 'native': return None   # (TorchTPU's environment)
    from fastai_xla.core import xla_device
    return xla_device()

# What differs between the supported stacks, so that scripts/test.sh runs it on every one (the development stack runs
# every test; the two TPU images' stacks run these, not every test again). By file: every test (None), or these.
ON_EVERY_STACK = {   # what torch_xla's version, Python's and the installed package decide
    'test_device.py': None,                  # finding and starting the device, the install checks
    'test_learner_scope.py': ['test_import_replaces_nothing_but_the_pickling_patches', 'test_a_bad_environment_variable_is_named'],  # what importing fastai_xla replaces (nothing)
    # (test_packaging.py runs on the development stack only: each image's set-up installs fastai_xla with the README's
    # command on that image's Python, scripts/env.sh's image_install; the sdist, wheel and editable install are the same files)
    'test_single_device.py': ['test_digits_cnn_matches_eager_cpu', 'test_fit_5_compiles_at_most_5_graphs_and_none_after_epoch_1',
        'test_fastai_adam_grouped_on_xla_steps_as_fastais_own', 'test_accum_metrics_are_exact', 'test_save_load_then_fit'],  # learning, the optimizer, compiles
    'test_launch.py': ['test_script_form_with_xmp_spawn', 'test_a_launch_after_an_eager_fit_trains',
        'test_every_stateful_fastai_optimizer_saves_cpu_tensors'],  # xmp.spawn, spawn, pickling
    'test_replicas.py': ['test_shards_are_disjoint_and_cover_the_data', 'test_replicas_end_with_identical_weights_which_come_back',
        'test_metrics_equal_one_device_for_the_same_weights', 'test_get_preds_complete_and_in_order',
        'test_a_replica_failing_mid_epoch_stops_every_replica_with_its_traceback', 'test_a_single_host_launch_opens_nothing_beyond_loopback'],
    'test_checkpoint.py': ['test_export_opens_where_torch_xla_is_not_installed', 'test_save_on_the_master_only_neither_hangs_nor_breaks_load',
        'test_full_disk_keeps_the_previous_checkpoint'],
    'test_notebooks.py': ['test_notebook[00_backend]', 'test_notebook[13_models]'],  # every torch_xla name we use, module versions (torchvision's)
    'test_torchrun.py': ['test_torchrun_standalone_is_one_run[torch_xla]'],   # torch's launcher and elastic agent, as each torch has them
}
# Colab's stack has the development stack's torch_xla (2.9) with the newest fastai and Python 3.13: there runs what fastai's
# version decides (its private API, data, callbacks, training features) and what Python's does (pickling, processes). What
# torch_xla's version alone decides ran on the development stack already, with the same torch_xla.
ON_NEWEST_FASTAI = {
    'test_notebooks.py': None,               # every module's own tests
    'test_fastai_features.py': ['test_training_feature_learns_like_eager_and_stays_steady[CutMix]',
        'test_saving_stopping_logging_callbacks', 'test_channels_last_and_fp16_are_refused_with_what_to_call',
        'test_fastai_gpu_script_calls_on_two_replicas'],
    # (the image recipe trained end to end runs on the development stack: here, nbs/12_augment checks each of its device
    # transforms against the newest fastai's, masks and points included)
    'test_applications.py': ['test_collab_from_a_ratings_frame'],
    'test_notebook_launch.py': None,         # launching from a notebook's kernel: what a Colab user does
    'test_launch.py': ON_EVERY_STACK['test_launch.py'],       # fastai's learners, loaders and optimizers pickled; processes
    'test_replicas.py': ON_EVERY_STACK['test_replicas.py'],   # replica processes: forked, served, their sockets and signals
    'test_checkpoint.py': ['test_export_opens_where_torch_xla_is_not_installed'],           # fastai's types pickled
    'test_single_device.py': ['test_fastai_adam_grouped_on_xla_steps_as_fastais_own'],      # fastai's Adam, step for step
    'test_learner_scope.py': ['test_import_replaces_nothing_but_the_pickling_patches'],     # fastai's attributes
}

# What `bash scripts/test.sh` (CI's run, within its 50-minute budget) leaves to `bash scripts/test.sh --all`: the slowest
# end-to-end runs, each with what covers its code paths in the default run. Not skipped: deselected there, run by --all.
SLOW = {
    'test_architectures.py': {'*': "every module's XLA version: nbs/13_models; the whole table: benchmarks/architectures.py"},
    'test_examples.py': {'test_fastai_imagenette_script_ported_to_xla': "xresnet, ranger, MixUp, label smoothing: test_fastai_features.py, 13_models",
                         'test_fastai_imdb_script_ported_to_xla': 'AWD_LSTM classifier and fine_tune: test_text.py, nbs/11_text',
                         'test_fastai_tabular_script_ported_to_xla': "a tabular learner from a frame, its embeddings, against eager: "
                         "test_single_device.py's test_tabular_with_embeddings_matches_eager_cpu"},
    'test_spmd.py': {'test_spmd_trains_like_one_device[tabular]': 'SPMD on the digits images: the [digits] case',
                     'test_sharded_parameters_train_like_replicated': 'shard_params: nbs/08_spmd'},
    'test_pod.py': {'*': "replicas' local ranks, shards, checkpoints and resume: test_replicas.py, test_checkpoint.py "
                         "(each host writes its own checkpoint), test_preemption.py"},
    'test_applications.py': {'test_progressive_resizing_trains_like_eager[launched]': "new loaders between fits: the [one device] "
                             "case and test_single_device.py's test of `learn.dls = other`; each replica's shard of them: `keep_on_xla` "
                             "(nbs/03_callback) wraps them with the run's ordinal and count as `to_xla` does (test_replicas.py's shards)",
                             'test_image_folder_with_aug_transforms_on_two_replicas': 'device batch transforms: [on_the_device]; replicas: test_replicas.py',
                             'test_segmentation_with_augmentation_and_dice': "masks warped with their images on the device, as fastai "
                             "does on the CPU: nbs/12_augment; DiceMulti counted on the device, exact: nbs/02b_metrics; a recipe "
                             "trained with aug_transforms on the device: test_image_folder_with_aug_transforms_on_the_device"},
    'test_fastai_features.py': {'test_training_feature_learns_like_eager_and_stays_steady[MixUp]': "fastai's MixHandler (lambda drawn per batch, "
                                "the mixed loss): the [CutMix] case",
                                'test_training_feature_learns_like_eager_and_stays_steady[label smoothing]': "a loss function of fastai's "
                                "on the device (a plain function of the outputs, compiled into the step): the [CutMix] case's mixed loss"},
    'test_fsdp.py': {'test_four_replicas_hold_a_quarter_and_listen_on_loopback_alone[tpu]': "sharding over the eager device's "
                     "tpu_dist: test_two_replicas_shard_on_the_eager_tpu_test_device; 4 replicas: the [cpu] case",
                     'test_a_sharded_run_killed_under_max_restarts_ends_with_the_weights_of_a_run_never_stopped[tpu]': "the "
                     "sharded resume: the [cpu] case; sharded saves and loads on the device: test_two_replicas_shard_on_the_eager_tpu_test_device"},
    'test_replicas.py': {'test_segmentation_metrics_summed_over_two_replicas_equal_one_device': "replicas' exact metrics: test_metrics_equal_one_device_for_the_same_weights; segmentation metrics: nbs/02b_metrics"},
    'test_single_device.py': {f'test_no_hyper_parameter_value_compiles_late[{k}]': 'the sweep\'s other cases, and test_fastai_schedules_compile_in_the_first_epoch_only'
                              for k in ('wd0.0-fit_one_cycle-0', 'wd0.0001-fit_flat_cos-1', 'wd0.1-fit_one_cycle-3', 'wd0.1-fit_flat_cos-5', 'wd1.0-fit_one_cycle-4')},
}
SLOW['test_readme.py'] = {
    'test_readme_snippet_runs_as_written[script]': 'spawn, to_tpu_distributed, an image folder with aug_transforms: test_launch.py (the script form), test_applications.py, the Kaggle stack\'s demo',
    'test_readme_snippet_runs_as_written[notebook]': 'learn.launch from a notebook: test_notebook_launch.py, test_tpu_path.py (8 replicas), 04a_launch',
    'test_readme_snippet_runs_as_written[spmd]': 'to_tpu_spmd: test_spmd.py (the same calls on the digits)'}
SLOW['test_tpu_path.py'] = {
    'test_eight_replicas_from_a_script': "8 replicas forked, gloo, shards, exact metrics, one checkpoint: test_eight_replicas_from_a_notebook "
        "(the same ElasticLauncher); one progress table from a script's replicas: test_launch.py's script forms"}
SLOW['test_launch.py'] = {
    'test_launch_a_function_defined_in_main[gloo-2-spawn]': "a launch with spawn from a script's main: test_a_launch_after_an_eager_fit_trains "
        '(spawned after the fork fails; the learner, its loaders and the function pickled)',
    'test_launches_in_a_row_leave_the_memory_where_it_was[fork]': "the same launches' memory: the [spawn] case (a notebook's way)"}
SLOW['test_preemption.py'] = {
    'test_a_preempted_script_run_again_ends_as_if_never_stopped': 'SIGTERM to a script, rerun to the never-stopped weights: '
        "test_tpu_path.py's preempted thread-process script; the vote and resume on replicas: test_two_replicas_stop_after_the_same_step_and_resume"}
SLOW['test_torchrun.py'] = {
    'test_the_multi_node_form[2]': "torchrun's agents meeting through c10d: torch's own; each process's place, the agents' store, the "
        "run's secret: test_torchrun_standalone_is_one_run, 00_settings, 00c_replicas"}
SLOW['test_text.py'] = {'*': "text learners end to end (AWD_LSTM, a transformer, two replicas): nbs/11_text (its loop builder, buckets, a "
                             "classifier and language model on the XLA device), in the default run and on Colab's stack"}

# Run again on the native backend by scripts/test.sh, on two devices apart from the host that stand in for TorchTPU's
# chip (`FASTAI_XLA_BACKEND=native`): torch_xla's CPU device (`FASTAI_XLA_NATIVE_DEVICE=xla`, lazy), and the project's
# eager `tpu` test device (`FASTAI_XLA_NATIVE_DEVICE=tpu`: tests/eager_tpu.py, loaded above; eager like TorchTPU, and
# the native backend's `tpu` branches run on it); replicas over gloo on both. The files below,
# as they are, but these tests, which count what only torch_xla has (compiled graphs, traced XLA operations, device
# reads), or check a refusal only torch_xla needs; the native backend counts only what torch.compile compiled, so they would pass
# whatever the code does.
NATIVE_FILES = ['test_single_device.py', 'test_replicas.py', 'test_checkpoint.py', 'test_launch.py', 'test_applications.py',
                'test_readme.py', 'test_preemption.py', 'test_text.py', 'test_eager_tpu.py']
TORCH_XLA_ONLY = {
    'test_single_device.py': ['test_fastai_schedules_compile_in_the_first_epoch_only', 'test_fit_5_compiles_at_most_5_graphs_and_none_after_epoch_1',
        'test_host_reads_per_epoch_do_not_grow_with_the_number_of_batches', 'test_no_hyper_parameter_value_compiles_late',
        'test_fastai_adam_grouped_on_xla_steps_as_fastais_own'],
    'test_launch.py': ['test_launch_refuses_when_the_runtime_is_already_running'],
    'test_text.py': ['test_classifier_compiles_once_per_bucket'],
}
# The tests scripts/test.sh runs again on the native backend's stand-in devices (the whole files with `--all`, which runs
# this selection on the host too, FASTAI_XLA_NATIVE_DEVICE=cpu): on both, learning, replicas and a launch, where the lazy
# device takes its own branches (torch_xla's runtime ends the steps, moves the tensors, drops a failed step: 00e); on the
# eager `tpu` test device alone, TorchTPU's stand-in, what is the same code on either device (a checkpoint, a preemption,
# fastai's applications: images with aug_transforms and Normalize on the device, segmentation, collab, text; the README's
# script), each against eager CPU.
NATIVE_TESTS = {
    'test_single_device.py': ['test_digits_cnn_matches_eager_cpu', 'test_tabular_with_embeddings_matches_eager_cpu',
                              'test_accum_metrics_are_exact', 'test_save_load_then_fit', 'test_gradient_accumulation_steps_every_other_batch',
                              *[f'test_a_fit_that_fails_leaves_the_learner_usable[{w}-{f}]' for w in ('first fit', 'after a good fit')
                                for f in ('boundary', 'loss', 'forward', 'callback', 'interrupt')]],
    'test_replicas.py': ['test_shards_are_disjoint_and_cover_the_data', 'test_replicas_end_with_identical_weights_which_come_back',
                         'test_metrics_equal_one_device_for_the_same_weights', 'test_get_preds_complete_and_in_order',
                         'test_a_replica_failing_mid_epoch_stops_every_replica_with_its_traceback',
                         'test_a_single_host_launch_opens_nothing_beyond_loopback'],
    'test_launch.py': ['test_launch_a_function_defined_in_main[gloo-2-fork]'],
    'test_eager_tpu.py': None,   # (skipped but on the eager `tpu` test device: FASTAI_XLA_NATIVE_DEVICE=tpu)
}
ON_THE_EAGER_STAND_IN = {
    'test_replicas.py': ['test_two_replicas_of_32_with_batch_norms_step_like_one_device_of_64[sync_bn]'],
    'test_preemption.py': ['test_two_replicas_stop_after_the_same_step_and_resume'],
    'test_applications.py': ['test_image_folder_with_aug_transforms_on_the_device', 'test_segmentation_with_augmentation_and_dice',
                             'test_collab_from_a_ratings_frame'],
    'test_text.py': ['test_classifier_learns_like_eager'],
    'test_readme.py': ['test_readme_snippet_runs_as_written[script]'],   # (the script form's `spawn`: fresh interpreters)
}
NATIVE = os.environ.get('FASTAI_XLA_BACKEND') == 'native'
LAZY_STAND_IN = os.environ.get('FASTAI_XLA_NATIVE_DEVICE') == 'xla'

def _listed(item, table) -> bool:
    names = table.get(item.path.name, [])
    return names is None or item.name in names

def pytest_collection_modifyitems(config, items):
    "fastai's star imports bring fastcore's `test_eq`, `test_fail`...: they are helpers, not tests. Then the stack marks."
    ours = lambda i: getattr(getattr(i, 'obj', None), '__module__', '').split('.')[0] not in ('fastcore', 'fastai', 'torch')
    items[:] = [i for i in items if ours(i)]
    for item in items:
        # `--dist loadgroup` (scripts/test.sh): a test file's tests run in one worker (its shared fixtures made once), each
        # notebook is a unit of its own
        if item.path.name != 'test_notebooks.py': item.add_marker(pytest.mark.xdist_group(item.path.name))
        if NATIVE and item.originalname in (TORCH_XLA_ONLY.get(item.path.name) or []):
            item.add_marker(pytest.mark.skip(reason="counts or refuses what only torch_xla has (tests/conftest.py's TORCH_XLA_ONLY)"))
        if '*' in SLOW.get(item.path.name, {}) or item.name in SLOW.get(item.path.name, {}): item.add_marker(pytest.mark.slow)
        if _listed(item, NATIVE_TESTS) or (not LAZY_STAND_IN and _listed(item, ON_THE_EAGER_STAND_IN)): item.add_marker(pytest.mark.native)
        if _listed(item, ON_EVERY_STACK): item.add_marker(pytest.mark.stacks)
        if _listed(item, ON_NEWEST_FASTAI): item.add_marker(pytest.mark.fastai_version)
    # a name in the tables above that no longer names a test would quietly leave it untested on the image stacks
    collected = {}
    for item in items: collected.setdefault(item.path.name, set()).add(item.name)
    slow_names = {f: [n for n in names if n != '*'] for f, names in SLOW.items()}
    for table in (ON_EVERY_STACK, ON_NEWEST_FASTAI, NATIVE_TESTS, ON_THE_EAGER_STAND_IN, slow_names):
        for file, names in table.items():
            whole_file = file in collected and not config.option.keyword and not any('::' in a for a in config.args)
            missing = set(names or []) - collected[file] if whole_file else set()
            if missing:
                raise pytest.UsageError(f'tests/conftest.py names tests that tests/{file} does not have: {sorted(missing)}')
