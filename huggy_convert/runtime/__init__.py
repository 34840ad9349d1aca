"""One runtime layer (Polygraphy's idea): every way of running a policy is a :class:`Runner` with the
same two calls, ``infer(feed) -> {output: array}`` and ``sample(feed, seed=None, noise=None)`` for the
stochastic heads; and every feed (random observations at the normalizer's scale, verify's probes,
the inputs a feed may leave out and the carried state, from the ports; the CPU noise) is made in
:mod:`.feeds`.

- :mod:`.ort`: the one onnxruntime session factory (every execution provider) and :class:`OrtRunner`
- :mod:`.torch_runners`: :class:`ModuleRunner` (a ``PolicyModule``), :class:`ProgramRunner` (a saved
  ``.pt2``, through ``torch.export.load`` only)
- :mod:`.feeds`: probes, random observations, complete_feed, Stepper (a closed loop), noise
- :mod:`.threads`: ``torch_threads(n)``, torch's intra-op thread count for a scope (``VERIFY_THREADS``)

Stages below (contract, converter, exporters) are used; verify and modes use this layer.
"""
from .base import STOCHASTIC, Runner, deterministic
from .feeds import complete_feed, draw_noise, make_noise, make_probes, random_obs, zeros_obs
from .ort import INTRA_OP_THREADS, OrtRunner, cann_available, ort_provider_for, ort_providers, ort_run, ort_session, ort_session_on
from .threads import VERIFY_THREADS, torch_threads
from .torch_runners import ModuleRunner, ProgramRunner, module_runner, program_runner

__all__ = ["Runner", "STOCHASTIC", "deterministic", "OrtRunner", "ModuleRunner", "ProgramRunner", "ort_session",
           "ort_session_on", "ort_run", "ort_providers", "ort_provider_for", "INTRA_OP_THREADS", "module_runner",
           "program_runner", "torch_threads", "VERIFY_THREADS", "cann_available", "make_probes", "make_noise", "draw_noise", "random_obs", "zeros_obs", "complete_feed"]
