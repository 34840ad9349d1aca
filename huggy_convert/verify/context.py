"""What checks 2-5 and the golden file share for one policy (:class:`Context`): the runners of the
rebuilt and official ONNX, each feed run once, the feeds, the injected noise and the float64 references."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import onnx

from .. import contract as C
from ..converter.reference import official_divisors
from ..core.bounds import PRECISIONS
from ..core.numerics import same_arrays
from ..core.policy import Policy
from ..errors import describe
from ..host import describe as describe_host
from ..host import same_arithmetic
from ..exporters.onnx_export import model_bytes
from ..runtime import OrtRunner
from ..runtime.base import RunnerBase
from ..runtime.feeds import injected, make_noise, make_probes
from . import checks as K
from .bounds import Float64Policy, Reference as Ref64, within_both
from .golden import golden_bytes, ml_agents_golden
from .options import VerifyOptions
from .report import FAIL, SKIP, Check
from .structure import check_onnx_structure


def _with_divisors(policy: Policy, divisors: Dict[int, np.ndarray]) -> Policy:
    """``policy`` dividing by ``divisors`` (the official ONNX's) instead of its own."""
    tensors = dict(policy.tensors)
    for i, d in divisors.items():
        if C.c_divisor(i) in tensors and tensors[C.c_divisor(i)].shape == d.shape:
            tensors[C.c_divisor(i)] = d
    return replace(policy, tensors=tensors)


class Once:
    """A runner whose every feed runs once (``infer``; ``sample`` with injected noise: once per feed and
    noise): checks 3 and 4 and the golden file run one session on the same probes and share its outputs
    (a CPU session on one thread gives the same bytes for the same input: check 5 runs every row twice
    to prove it). ``runner``: the runner itself, run on each call."""

    def __init__(self, runner):
        self.runner = runner
        self.runtime, self.device, self.dtype, self.note = runner.runtime, runner.device, runner.dtype, runner.note
        self.label = runner.label
        self._ran: list = []  # [(feed, outputs)]
        self._sampled: list = []  # [(feed with the noise, outputs)]

    @staticmethod
    def _find(seen: list, feed):
        return next((out for f, out in seen if same_arrays(f, feed)), None)

    def infer(self, feed):
        out = self._find(self._ran, feed)
        if out is None:
            out = self.runner.infer(feed)
            self._ran.append((dict(feed), out))
        return out

    def sample(self, feed, seed=None, noise=None):
        if noise is None:
            return self.runner.sample(feed, seed)
        key = dict(feed, **{C.NOISE_INPUT: noise})
        out = self._find(self._sampled, key)
        if out is None:
            out = self.runner.sample(feed, seed, noise)
            self._sampled.append((key, out))
        return out


class Recorded(RunnerBase):
    """The golden file's outputs as a runner: ``infer`` gives its outputs, ``sample`` those of its
    injected noise (the feeds it was written for, whatever the feed)."""

    runtime = "golden file"

    def __init__(self, outputs: Dict[str, np.ndarray], noised: Optional[Dict[str, np.ndarray]] = None):
        self.outputs, self.noised = outputs, noised

    def infer(self, feed):
        return self.outputs

    def sample(self, feed, seed=None, noise=None):
        return self.noised


def _without_noise(ref):
    """A float64 reference run with injected noise, as the forward without it: ``continuous_actions``
    (the one output the noise enters) left out."""
    return Ref64({k: v for k, v in ref.values.items() if k != C.OUT_CONT},
                 {k: v for k, v in ref.bounds.items() if k != C.OUT_CONT}, ref.logits, ref.precision)


class Context:
    """What checks 2-5 share for one policy: the rebuilt ONNX's runner (``ours``), the feeds (seeded probes,
    plus the golden inputs ML-Agents' generator wrote beside an official file), the injected noise,
    the reference outputs (``ref``: onnxruntime on the official file, or a golden file) and the float64
    references (bounds.Float64Policy, weights prepared once; one forward per role and feed). The roles:
    ``ours`` (the policy), ``official`` (the policy dividing by the official ONNX's divisors: the
    same policy unless ``--divisor ieee`` kept IEEE against an official 1 ulp away)."""

    def __init__(self, policy: Policy, rebuilt: onnx.ModelProto, o: "VerifyOptions", data: Optional[bytes] = None):
        self.policy, self.o, self.onnx_data = policy, o, data
        # the rebuilt ONNX: each feed run once (checks 3-4, the golden file); its runner itself, each call (check 5)
        self.ours = Once(OrtRunner(data if data is not None else model_bytes(rebuilt), spec=policy.spec, graph=rebuilt))
        self.feeds = {"probes": make_probes(policy, o.rows, o.seed)}
        self.noises = {"probes": make_noise(policy, o.rows, o.seed)} if injected(policy.spec) else {}
        self.ref_name = None
        self.official: Optional[onnx.ModelProto] = None
        self.ref = self.fallback = None  # the reference of check 3: a runner (Once, Recorded)
        self.policies = {"ours": policy, "official": policy}
        self._prepared: Dict[str, Float64Policy] = {}
        self._refs: Dict[tuple, object] = {}
        self.rebuilt = rebuilt

    @property
    def divisors_differ(self) -> bool:
        """The official ONNX divides by other divisors than the policy (1 ulp apart, by request)."""
        return self.policies["official"] is not self.policy

    def prepared(self, role: str) -> Float64Policy:
        if role not in self._prepared:
            pol = self.policies[role]
            same = next((r for r, p in self.policies.items() if p is pol and r in self._prepared), None)
            self._prepared[role] = self._prepared[same] if same else Float64Policy(pol)
        return self._prepared[role]

    def reference(self, role: str, feed_name: str, with_noise: bool = False, dtype: str = "float32"):
        """The float64 reference of ``role`` on feed ``feed_name`` (with its injected noise), its bounds
        derived for a runtime in ``dtype`` (float32; float16 and bfloat16 only when a module of that
        dtype is checked). A feed with noise runs one forward for both: the injected noise enters
        ``continuous_actions`` only, every other output and bound is the forward's without it
        (``_without_noise``)."""
        prep = self.prepared(role)
        key = (prep, feed_name, with_noise, dtype)
        if key not in self._refs:
            p = PRECISIONS[dtype]
            noise = self.noises.get(feed_name)
            if noise is None:
                self._refs[key] = prep.forward(self.feeds[feed_name], precision=p)
            else:
                full = prep.forward(self.feeds[feed_name], noise, precision=p)
                self._refs[(prep, feed_name, True, dtype)] = full
                self._refs[(prep, feed_name, False, dtype)] = _without_noise(full)
        return self._refs[key]

    def values32(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """``Float64Policy.values32`` of the policy on ``feed`` (the reference fingerprint): the values of
        a forward already run on a bitwise-equal feed (a batch's 16 probe rows are its 16-step
        fingerprint's; the bounds never enter the values), else a forward of the values alone."""
        prep = self.prepared("ours")
        for (p, name, *_), ref in self._refs.items():
            if p is prep and same_arrays(self.feeds[name], feed):
                return {k: (v.astype(np.float32) if v.dtype.kind == "f" else v)
                        for k, v in ref.values.items() if k != C.OUT_CONT}
        return prep.values32(feed)

    def judge_pair(self, role_a: str, role_b: str):
        """check_outputs' fallback: two float32 results of the roles' references, by the derived bound."""
        def judge(feed_name, feed, name, a, b):
            w = name == C.OUT_CONT
            return within_both(self.reference(role_a, feed_name, w), self.reference(role_b, feed_name, w), name, a, b)
        return judge

    def use_official(self, official: onnx.ModelProto, official_path: Optional[Path], subject: str,
                     bitwise: bool = False) -> List[Check]:
        """Check 2 against ``official``, and its runner as the reference of check 3 (``bitwise``: no
        derived-bound fallback for divisors 1 ulp apart)."""
        policy, spec, out = self.policy, self.policy.spec, []
        self.official = official
        self.ref_name = f"official {official_path.name if official_path else 'ONNX'}"
        out.append(check_onnx_structure(self.rebuilt, official, subject, self.ref_name, policy=policy))
        theirs = _with_divisors(policy, official_divisors(official)) if spec.normalize else policy
        if any(theirs.tensors[k].tobytes() != policy.tensors[k].tobytes() for k in policy.tensors):
            self.policies["official"] = theirs
            if not bitwise:
                self.fallback = ("the divisors differ by 1 ulp: --divisor ieee", self.judge_pair("ours", "official"))
        try:
            runner = OrtRunner(official.SerializeToString(), spec=spec, graph=official)
            if self.noises:
                runner.noise_session()  # made now: one that does not run fails here, as the plain one
            self.ref = Once(runner)
        except Exception as exc:
            out.append(Check("3 outputs", FAIL, f"official ONNX does not run in onnxruntime: {describe(exc)}",
                             id="outputs"))
            return out
        mlg = ml_agents_golden(official_path)
        if mlg is not None:
            names = [i.name for i in runner.session.get_inputs()]
            if all(n in mlg for n in names):
                self.feeds["golden (ML-Agents)"] = {n: mlg[n] for n in names}
                if self.noises:
                    rows = mlg[names[0]].shape[0]
                    self.noises["golden (ML-Agents)"] = make_noise(policy, rows, self.o.seed + 1)
        return out

    def use_golden(self, golden: Dict, golden_path: Path, here: Dict, notes: List[str]) -> None:
        """The golden file written at conversion as the reference of check 3 (no official ONNX)."""
        self.ref_name = f"golden outputs ({Path(golden_path).name})"
        gh = golden["host"]
        if gh is None:
            notes.append("no official ONNX: outputs compared with the golden file written at conversion "
                         "(it does not say which host wrote it)")
        elif same_arithmetic(gh, here):
            notes.append("no official ONNX: outputs compared with the golden file written at conversion on this host")
        else:
            notes.append(f"no official ONNX: the golden file was written on another host ({describe_host(gh)}); "
                         f"this is {describe_host(here)}: outputs that are not bitwise are judged by the derived bound")
        if gh is None or not same_arithmetic(gh, here):
            self.fallback = ("golden written on another host" if gh is not None else "golden of an unknown host",
                             self.judge_pair("ours", "ours"))
        self.feeds = {"golden": golden["inputs"]}
        self.noises = {"golden": golden["noise"]["probes"]} if golden["noise"] else {}
        self.ref = Recorded(golden["outputs"], {C.OUT_CONT: golden["noised"]["probes"]} if golden["noised"] else None)

    def check_outputs(self) -> Check:
        """Check 3: the rebuilt ONNX against the reference, in onnxruntime."""
        if self.ref is None:
            return Check("3 outputs", SKIP, "no reference outputs (no official ONNX, no golden file)", id="outputs")
        return K.check_outputs(self.ours, self.ref, self.feeds, self.noises, self.policy, self.ref_name, self.fallback)


def compare_with_official(policy: Policy, rebuilt: onnx.ModelProto, official: onnx.ModelProto,
                          official_path: Optional[Path] = None, options: Optional["VerifyOptions"] = None,
                          subject: str = "", bitwise: bool = False) -> List[Check]:
    """Checks 2 and 3 of :func:`verify` against one official ONNX: what ``onnx-compare`` and ``export``
    report, so every command reaches the same verdict on the same pair."""
    ctx = Context(policy, rebuilt, options or VerifyOptions())
    out = ctx.use_official(official, official_path, subject, bitwise)
    if not any(c.id == "outputs" for c in out):
        out.append(ctx.check_outputs())
    return out


def golden_of(ctx: Context) -> bytes:
    """The golden file: the probes with the official's outputs where the rebuilt ONNX must reproduce
    them bitwise, the rebuilt's own where it divides by other divisors (--divisor ieee) or there is no
    official file."""
    feed_name = next(iter(ctx.feeds))
    feed, noise = ctx.feeds[feed_name], ctx.noises.get(feed_name)
    official = ctx.official is not None and ctx.ref is not None and not ctx.divisors_differ
    runner = ctx.ref if official else ctx.ours
    noised = runner.sample(feed, noise=noise)[C.OUT_CONT] if noise is not None else None
    return golden_bytes(feed, runner.infer(feed), noise, noised)
