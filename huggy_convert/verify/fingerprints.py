"""Check 5 of the verification: sha256 fingerprints of seeded action sequences, the float64
reference's (the same on every host) and this host's runtimes' (stable between two runs)."""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np

from .. import contract as C
from ..core.policy import Policy
from ..exporters.devices import NPU, torch_npu_installed
from ..exporters.torch_module import build_module
from ..runtime import ModuleRunner, Runner
from ..runtime.feeds import Stepper, make_probes
from ..runtime.threads import torch_threads
from .bounds import Float64Policy
from .report import FAIL, PASS, WARN, Check


def reference_fingerprint(policy: Policy, steps: int, seed: int = 0, prepared=None, probes=None,
                          values32=None) -> str:
    """:func:`fingerprint` of the float64 reference (bounds.Float64Policy), its outputs rounded once to
    float32: the same on every host (a float64 result would have to lie within ~1e-16 of a float32
    rounding boundary to change the hash). Without a carried state every step is independent: the whole
    sequence runs as one batch, hashed step by step as :func:`fingerprint` hashes it. ``prepared``: the
    policy's bounds.Float64Policy, when the caller has one; ``probes``: ``make_probes(policy, steps,
    seed)``, when the caller has drawn them; ``values32``: what gives ``prepared.values32`` of a feed
    (the verifier's, which reuses a forward already run on the same feed)."""
    ref = prepared or Float64Policy(policy)
    if policy.spec.io_signature().feedback():  # a carried state: step by step
        return fingerprint(ref.values32, policy, steps, seed, probes)
    # every step's masks allow every choice, as the loop's (Stepper)
    feed = Stepper(policy.spec, steps).step(dict(make_probes(policy, rows=steps, seed=seed) if probes is None
                                                 else probes))
    with torch_threads():
        out = (values32 or ref.values32)(feed)
    h = hashlib.sha256()
    for t in range(steps):
        for name in (C.OUT_CONT_DET, C.OUT_DISC_DET):
            if name in out:
                h.update(np.ascontiguousarray(out[name][t:t + 1]).tobytes())
    return h.hexdigest()


def fingerprint(step_fn, policy: Policy, steps: int, seed: int = 0, probes=None) -> str:
    """sha256 over the float32 bytes of a seeded ``steps``-long action sequence; ``step_fn``: a
    ``runtime.Runner`` (its ``infer``) or a function of a feed.

    Observation t is drawn from ``default_rng(seed)`` at the normalizer's scale; the carried
    state is fed back (``IOSignature.feedback``); masks allow everything. Row by row, torch on
    ``runtime.VERIFY_THREADS`` threads (``runtime.torch_threads``): each action is one row's own
    forward, so neither the batch nor the process's thread count enters the bytes hashed. ``probes``:
    ``make_probes(policy, steps, seed)``, when the caller has drawn them (read, never changed)."""
    step_fn = step_fn.infer if hasattr(step_fn, "infer") else step_fn
    with torch_threads():
        return _fingerprint(step_fn, make_probes(policy, rows=steps, seed=seed) if probes is None else probes,
                            policy, steps)


def _fingerprint(step_fn, feed_all, policy: Policy, steps: int) -> str:
    h = hashlib.sha256()
    loop = Stepper(policy.spec, rows=1)
    for t in range(steps):
        feed = loop.step({k: v[t:t + 1].copy() for k, v in feed_all.items()})  # a copy: feed_all stays as drawn
        out = step_fn(feed)
        for name in (C.OUT_CONT_DET, C.OUT_DISC_DET):
            if name in out:
                h.update(np.ascontiguousarray(out[name]).tobytes())
        loop.update(out)
    return h.hexdigest()


def check_fingerprints(ctx, devices: Sequence[str], cpu32: Optional[Runner] = None) -> Check:
    """Check 5: the float64 reference's fingerprint (the same on every host) and this host's runtimes,
    stable between two runs: the torch module (``cpu32``: check 4's cpu float32 runner, where it built
    one) and the rebuilt ONNX's runner (``ctx``: the verification's ``context.Context``)."""
    policy, o = ctx.policy, ctx.o
    c5 = Check("5 determinism fingerprints", id="fingerprints")
    cpu32 = cpu32 or ModuleRunner(build_module(policy, "cpu", "float32"))
    fps = {}
    for steps in o.fingerprint_steps:
        probes = make_probes(policy, rows=steps, seed=o.seed)  # drawn once: every run below reads them
        f = reference_fingerprint(policy, steps, o.seed, ctx.prepared("ours"), probes, ctx.values32)
        a, b = (fingerprint(cpu32, policy, steps, o.seed, probes) for _ in range(2))
        ra, rb = (fingerprint(ctx.ours.runner, policy, steps, o.seed, probes) for _ in range(2))
        fps[steps] = {"reference": f, "torch_cpu_float32": a, "onnxruntime_rebuilt": ra}
        c5.add(Check(f"{steps} steps", PASS if a == b and ra == rb else FAIL,
                     f"reference {f[:16]}… (float64, any host); this host: torch cpu {a[:12]}… "
                     f"({'stable' if a == b else 'CHANGED between runs'}), onnxruntime {ra[:12]}… "
                     f"({'stable' if ra == rb else 'CHANGED between runs'})"))
        for dev in devices:
            if dev == "cpu" or (dev.split(":")[0] == NPU and not torch_npu_installed()):  # no torch module there
                continue
            d = fingerprint(ModuleRunner(build_module(policy, dev, "float32")), policy, steps, o.seed, probes)
            fps[steps][f"torch_{dev}_float32"] = d
            c5.add(Check(f"{steps} steps on {dev}", PASS if d == a else WARN,
                         f"{d[:16]}… " + ("equal to cpu" if d == a else "differs from cpu (device arithmetic differs; "
                                                                           "not a failure)")))
    c5.figures = {"fingerprints": fps}
    c5.summary = ", ".join(f"{s}: {v['reference'][:12]}" for s, v in fps.items())
    return c5
