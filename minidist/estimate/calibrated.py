"""The performance model's two fitted constants, apart from the fit that produces them.

``CALIBRATED`` is the default :class:`~minidist.estimate.perf.Efficiency` of the planner and the search.
``calibration.py`` fits it on Megatron-LM 2021's Table 1 and checks the model on runs it was not fitted on
(with the planner, for layouts a paper does not give), so the number lives here, below both.
"""

from __future__ import annotations

from minidist.estimate.perf import Efficiency

# Result of calibration.fit_efficiency() on the ten rows (worst row error 6.1%); re-checked by
# tests/test_estimate_calibration.py.
CALIBRATED = Efficiency(gemm=0.6575, overhead_bytes=350.0)
