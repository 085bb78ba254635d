"""The measured device: the kernel model fitted to one H200 against every kernel it was fitted to and every GPT
training step it was not (``python -m minidist device``), and the fit's own speed."""

import time

from minidist.hardware import kernels as K
from minidist.profiling import validate_device


def main() -> None:
    t0 = time.perf_counter()
    refit = K.fit_kernels(K.load_measurements())
    print(f"refit of the packaged H200 measurements in {time.perf_counter() - t0:.2f} s")
    s = validate_device()
    drift = max(abs(refit.parameters()[k] / v - 1) for k, v in K.measured_kernels().parameters().items())
    print(f"stored fit vs refit: largest parameter drift {drift:.2%}")
    print(f"targets: kernels median < 15% (now {s['kernel_median']:.1%}), kernels of 1 MB or more within 30% "
          f"(worst {s['kernel_1mb_worst']:.1%}); steps median < 10% (now {s['step_median']:.1%}), every step within "
          f"30% (worst {s['step_worst']:.1%})")
