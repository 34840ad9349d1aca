"""Stage 3: verification of every artifact against the official ONNX and the CPU reference."""
from .compare import (DEFAULT_TOLERANCES, Comparison, Tolerance, array_stats, compare_arrays,  # noqa: F401
                      parse_overrides, ulp_distance)
from .engine import Reference, VerifyOptions, load_golden, verify, write_report  # noqa: F401
from .report import Check, Report  # noqa: F401
