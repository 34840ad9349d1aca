"""verify's seeded probes and noise: made in runtime.feeds (re-exported for verify.checks)."""
from ..runtime.feeds import make_noise, make_probes

__all__ = ["make_noise", "make_probes"]
