"""The one exception type modelprof raises for anything the user can cause, and its warnings.

Every module may import this one; it imports nothing of modelprof's, so no import can close a
cycle through it."""

from __future__ import annotations

__all__ = [
    "DriftWarning",
    "FewSamplesWarning",
    "ModelProfError",
    "ModelProfWarning",
    "NoisyMeasurementWarning",
    "TimingDisagreementWarning",
]


class ModelProfError(Exception):
    """A bad argument, input or model. The message names the offending value."""


class ModelProfWarning(UserWarning):
    """Something the numbers do not cover (ops with no formula), said once per profile."""


class NoisyMeasurementWarning(UserWarning):
    """Issued once per measurement whose spread makes its median less trustworthy."""


class DriftWarning(NoisyMeasurementWarning):
    """Issued once per measurement whose blocks drift beyond its confidence interval."""


class FewSamplesWarning(NoisyMeasurementWarning):
    """Issued once per measurement that a time budget stopped below its minimum sample count."""


class LoadedMachineWarning(NoisyMeasurementWarning):
    """Issued once per measurement whose wall time the machine's load stretched (wall well
    above the CPU time of the same work): the wall figure moved with the machine; it names the
    CPU-time figure to quote."""


class TimingDisagreementWarning(ModelProfWarning):
    """Issued where two timed figures that must agree do not, beyond their intervals, with
    both figures: a profile's per-layer passes against its clean end-to-end runs (it names the
    figure to quote), its leaf rows against their root, identical layers against each other; a
    point of a series (batch size, context, phase) above one doing more work; a comparison's
    ratio of medians against its per-round ratios. The figure is marked rough wherever it is
    exported (``~``, a ``*_rough`` column, a caption or note)."""
