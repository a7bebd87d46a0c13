"""Pure compute kernels (Triton and friends).

Nothing in this package knows about Hydra, CSV files or figures. The harness
imports these modules; they never import the harness.
"""


class Unsupported(Exception):
    """This implementation cannot compute this problem (dtype, shape, group size...)."""


class Unavailable(Exception):
    """The package or hardware this implementation needs is not present here."""
