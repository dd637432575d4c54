"""Stand-in for sglang.test.ci.ci_register."""
from ..test_utils import register_cpu_ci  # noqa: F401
