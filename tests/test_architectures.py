"""fastai's own architectures on the XLA device, as benchmarks/architectures.py measures them (the benchmark covers
every architecture fastai ships and timm's common ones; this test a subset, for the test command's time): no CPU
fallback per step, no compile after the first epoch, two device reads per epoch, and one training step close to
the same step in float64 (the loss to 1e-4, every gradient to 1e-2 of the largest, or as close as ten times eager CPU's float32). Real fastai learners on the digits.

Covered: fastai's `xresnet18` (its `AvgPool2d(ceil_mode=True)` shortcuts, 3 fallbacks per step as fastai builds it)
and `unet_learner`'s DynamicUnet with `blur` and
`self_attention` (`PixelShuffle_ICNR`, `SelfAttention`). Not covered here: the other rows of the benchmark's table."""
import sys
from pathlib import Path
import pytest
sys.path.insert(0, str(Path(__file__).parent.parent/'benchmarks'))
from architectures import ARCHITECTURES, measure

@pytest.mark.parametrize('name', ['xresnet18', 'DynamicUnet blur, self_attention'])
def test_architecture_runs_on_xla_without_fallbacks_or_late_compiles(name, tmp_path):
    r = measure(name, ARCHITECTURES[name], tmp_path, size=32, epochs=2)
    assert r['after'] == 0 and r['late'] == 0 and r['reads'] <= 4, r
    assert r['ok'], r                                      # (the step: close to float64's, as the benchmark says)
    if name == 'xresnet18': assert r['before'].startswith('3 (aten::avg_pool2d_backward)'), r   # fastai's model as it is
