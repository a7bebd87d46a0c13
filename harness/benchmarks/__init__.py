"""Registered benchmarks; importing this package registers them all."""
from . import instrumentation, matmul  # noqa: F401
from . import proton_cases  # noqa: F401,E402
from . import llm_profile  # noqa: F401,E402
from . import llm_e2e  # noqa: F401
