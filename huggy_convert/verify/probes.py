"""verify's seeded probes and noise: made in runtime.feeds (re-exported for verify.checks)."""
from ..runtime.feeds import make_noise, make_probes  # noqa: F401
