"""What a block is: the :class:`Block` hooks, the stages, and :class:`KeyRules`, the context the key rules
get for a checkpoint (the ports and the flows the other hooks get, ``OnnxFlow``, ``TorchFlow``,
``ReferenceFlow``, are ``core.flow``'s). Nothing here imports torch or onnx at import time."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..core.flow import InputHint, OnnxFlow, Port, ReferenceFlow, TorchFlow
from ..core.spec import SpecField
from ..errors import SpecError

# Stages, in the order the computation runs them. Within a stage blocks run in registry order.
# frame: the actor's constants; observe: each observation to its encoding (the orchestrators then
# concatenate the encodings in observation order); encode: features to features; head: actions.
FRAME, OBSERVE, ENCODE, HEAD = "frame", "observe", "encode", "head"
STAGES = (FRAME, OBSERVE, ENCODE, HEAD)


class Choices(NamedTuple):
    """What ``onnx_detect`` answers for a field its ONNX I/O does not decide: the ``values`` it can have,
    likeliest first; ``importers.from_onnx`` takes the first whose graph is the input's, or says that
    none of them (``what``, e.g. "encoder") gives this graph ``where`` (e.g. "for the input obs_0")."""

    values: Tuple[Any, ...]
    what: str
    where: str


class Block:
    """One part of the actor. Every hook has a neutral default, so a block implements what it owns.

    A block is a stateless singleton; the orchestrators (``converter.mapping``, ``PolicySpec``,
    ``exporters.onnx_export``, ``exporters.torch_module``, ``runtime.feeds``) call its hooks in
    registry order, stage by stage."""

    name: str = ""
    stage: str = ENCODE
    row_as_vector: bool = True  # its torch forward takes one row as a vector (False: it needs the batch axis)

    def active(self, spec) -> bool:
        """Whether ``spec`` has this block at all."""
        return True

    def has(self, hook: str) -> bool:
        """Whether this block implements ``hook`` (the orchestrators skip the neutral defaults)."""
        return getattr(type(self), hook) is not getattr(Block, hook)

    # --- checkpoint (converter.mapping) --------------------------------------------------
    def claim(self, r: "KeyRules") -> None:
        """Take this block's keys from ``r`` (``r.take``), infer its spec fields (``r.fields``) and
        check their shapes; raise ``r.error(...)`` for anything wrong. Runs even when the block is
        absent from the checkpoint (it then claims nothing and says so in ``r.fields``)."""

    def finish(self, r: "KeyRules") -> None:
        """After every block has claimed: rules across blocks (e.g. 'at least one action head')."""

    def constant_checks(self, r: "KeyRules") -> List[Tuple[str, List[int], str]]:
        """(constant key, what this block's tensors say it must hold, what says so)."""
        return []

    # --- back into ML-Agents (converter.state_dict) -------------------------------------------
    def restore(self, policy, sd: Dict[str, Any]) -> None:
        """The inverse of ``claim`` beyond what ``policy.sources`` gives back (each canonical tensor,
        float32, under the key it was taken from): ML-Agents' own dtype where that is not float32, and
        the keys no canonical tensor stands for (an alias). ``sd``: ML-Agents key -> torch tensor;
        raise ``SpecError`` where the policy cannot be written back."""

    # --- spec ------------------------------------------------------------------------------
    spec_fields: Tuple[SpecField, ...] = ()  # the PolicySpec fields this block declares (core.spec.SpecField)
    spec_derived: Dict[str, Callable[[Any], Any]] = {}  # name -> the value that follows from its fields
    obs_rank: int = 0  # OBSERVE blocks: the rank of the observations it encodes (its kind: obs_kind)
    obs_kind: str = ""
    obs_dims: str = ""  # OBSERVE blocks: its ONNX input's dims, in words ("[batch, width]")
    onnx_inputs: Tuple[str, ...] = ()  # the inputs other than the observations its ports can add

    def check_spec(self, spec) -> None:
        """The rules across fields (each field's own check is its ``SpecField.check``): ``SpecError``."""

    def describe(self, spec) -> List[Tuple[str, str]]:
        """Its parts of ``PolicySpec.family``: (slot, text), slots ``trainer``, ``obs``, ``body``, ``heads``."""
        return []

    def spec_hints(self, spec, hints: Dict[int, InputHint]) -> None:
        """What its fields say of its observation inputs, as an official ONNX would (``PolicySpec.input_hints``)."""

    def onnx_detect(self, g, found: Dict[str, Any]) -> Dict[str, Any]:
        """The spec fields an ML-Agents ONNX's I/O says of this block (``g``: ``converter.reference.OnnxView``;
        ``found``: the fields the blocks before it in registry order said): a value, or :class:`Choices`
        where only the graph decides. ``g.error(what)`` for what no ML-Agents export has."""
        return {}

    def onnx_stated(self, g) -> Dict[str, Any]:
        """The fields an official ONNX states and no checkpoint tensor does (``SpecField.stated``), for the
        key rules (``KeyRules.stated``; ``converter.reference.stated_fields``)."""
        return {}

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        return 0

    def inputs(self, spec) -> List[Port]:
        return []

    def encoded_width(self, spec) -> int:
        """OBSERVE blocks: the width of the encodings this block adds to the body's input."""
        return 0

    def outputs(self, spec) -> List[Port]:
        return []

    def encoders(self, spec) -> List[Dict[str, Any]]:
        """OBSERVE blocks, for ``info``: what encodes its observations, one entry per encoder:
        ``inputs`` (names), ``kind``, ``encoder`` (a sentence), ``width`` (its encoding's), ``parameters``."""
        return []

    # --- ONNX (exporters.onnx_export) ------------------------------------------------------
    def onnx_float32_nodes(self, spec) -> List[Tuple[str, Tuple[str, ...]]]:
        """(node scope prefix, op types) of the nodes that must stay float32 when a compiler casts the
        rest to fp16 (Ascend ATC's ``--keep_dtype``): the normalizer's, the attention's masking."""
        return []

    def onnx_observe(self, f: "OnnxFlow") -> None:
        """OBSERVE blocks: ``f.encoded[i]`` for every observation ``i`` this block processes."""

    def onnx_append(self, f: "OnnxFlow") -> Optional[str]:
        """OBSERVE blocks whose encoding needs the others' (attention: its self embedding): called once the
        other observations' encodings are concatenated into ``f.h`` (None when there are none); returns
        the encoding ML-Agents' ObservationEncoder appends after them."""
        return None

    def onnx_encode(self, f: "OnnxFlow") -> None:
        """ENCODE blocks: from ``f.h`` (None before the first) to the next features."""

    def onnx_head(self, f: "OnnxFlow") -> None:
        """HEAD blocks, first pass: the distribution (all heads' in trace order)."""

    def onnx_output(self, f: "OnnxFlow") -> None:
        """HEAD blocks, second pass: the output nodes."""

    def onnx_dims(self, spec) -> Dict[str, str]:
        """Output name -> the name torch.onnx gives its batch axis (where it is not ``batch``)."""
        return {}

    # --- torch (exporters.torch_module) ----------------------------------------------------
    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        """Register this block's parameters/buffers on ``module`` (the names are part of the .pt2).
        Called for every block, present in the spec or not: an absent one registers nothing, or an
        empty container (the discrete head's ``branches``: the .pt2's module call graph lists it)."""

    def torch_row(self, module) -> Any:
        """This block's eager form with autograd off (not traced), bound once after ``torch_init``, or None:
        OBSERVE blocks ``{observation index: fn(module, x) -> encoding}`` (any batch), ENCODE blocks
        ``fn(module, h) -> h`` and HEAD blocks ``fn(module, h) -> [deterministic outputs]`` on one row as a
        vector. Its hooks call it in that mode, and where every block of a spec has one the module chains
        them directly (``PolicyModule._row_plan``): at batch 1 each Python step after a GEMV reads memory
        the weights evicted. The functions take the module (never hold it, its tensors or their dicts:
        ``.to()``, ``copy.deepcopy`` and torch.export swap those) and read what they need from it."""
        return None

    def torch_observe(self, f: "TorchFlow") -> None:
        """OBSERVE blocks: ``f.encoded[i]`` for every observation ``i`` this block processes."""

    def torch_append(self, f: "TorchFlow"):
        """OBSERVE blocks: as ``onnx_append`` (``f.h``: the other observations' encodings, or None)."""
        return None

    def torch_encode(self, f: "TorchFlow") -> None:
        """ENCODE blocks: from ``f.h`` to the next features."""

    def torch_output(self, f: "TorchFlow") -> list:
        """This block's outputs: deterministic ones, or sampled ones when ``f.sampling``."""
        return []

    # --- the float64 reference with error bounds (verify.bounds.Float64Policy, core.bounds) ---
    def reference_init(self, policy) -> Any:
        """This block's weights in float64 (``core.bounds.Linear``...), prepared once per policy."""
        return None

    def reference_observe(self, r: "ReferenceFlow", w) -> None:
        """OBSERVE blocks: ``r.encoded[i]`` (a ``core.bounds.Bounded``) for each of its observations."""

    def reference_append(self, r: "ReferenceFlow", w):
        """OBSERVE blocks: as ``onnx_append``, a ``core.bounds.Bounded`` (``r.h``: the others' encodings, or None)."""
        return None

    def reference_encode(self, r: "ReferenceFlow", w) -> None:
        """ENCODE blocks: from ``r.h`` to the next features."""

    def reference_output(self, r: "ReferenceFlow", w) -> None:
        """Output blocks: ``r.values[name]``, ``r.errs[name]`` (and ``r.logits`` for argmax ties)."""

    # --- probes (runtime.feeds) ------------------------------------------------------------
    def probe(self, policy, rng: np.random.Generator, rows: int) -> Dict[str, np.ndarray]:
        """Seeded inputs for this block's input ports."""
        return {}

    # --- an ONNX-only policy (importers.from_onnx) ------------------------------------------
    def state_template(self, spec) -> Dict[str, np.ndarray]:
        """The ML-Agents keys ``claim`` takes from a ``spec`` actor, as arrays of their shapes and dtypes:
        placeholders, except what the spec alone fixes (the constant vectors). ``importers.from_onnx``
        builds the graph of this template to find where each tensor sits in an ONNX."""
        return {}

    def onnx_recover(self, spec, found: Dict[str, np.ndarray], sd: Dict[str, np.ndarray]) -> None:
        """The inverse of this block's ONNX nodes for tensors not stored as they are: from ``found``
        (an ONNX's initializers, by the names this block's ``onnx_*`` hooks give them) write the
        ML-Agents keys they hold into ``sd`` and pop them from ``found``; raise ``InputError`` where
        the values cannot be this block's. An initializer named after its key is taken as it is by
        ``importers.from_onnx`` (no hook needed)."""


    # --- the run modes (modes/: plain data and answers, never modes' code) -------------------
    # what a policy with this block is, in the words the run modes print: a trait's name -> what it is
    # (the need a matrix case names); the fixture variants (fixtures/variants/<name>) this block's
    # kind of policy stands for: a variant's name -> the trait a user's policy needs to stand in for it
    traits_described: Dict[str, str] = {}
    variants: Dict[str, str] = {}
    onnx_weight_ops: Tuple[str, ...] = ()  # the ONNX op types whose initializers hold this block's parameters

    def traits(self, spec) -> Tuple[str, ...]:
        """The traits of ``spec`` that its ports do not tell (the run modes derive the others from them)."""
        return ()

    def describe_input(self, spec, i: int, given=None) -> str:
        """What observation ``i`` (one of this block's inputs) is, for an input-shape error; ``given``:
        the shape given, where this block can tell what was meant."""
        return ""

def _shape(t) -> Tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


class KeyRules:
    """A ``Policy`` state dict being accounted for: every key is taken by a block, ignored for a
    stated reason, or an error naming it. Blocks infer spec fields into ``fields`` and pass what the
    next block needs in ``state`` (e.g. ``width``: the features the next block takes)."""

    def __init__(self, sd: Dict[str, Any], path=None, obs_sizes: Optional[Sequence[int]] = None,
                 inputs: Optional[Dict[int, InputHint]] = None, stated: Optional[Dict[str, Any]] = None):
        self.sd = sd
        self.keys = list(sd.keys())
        self.path = path
        self.obs_sizes = obs_sizes
        # observation index -> what the official ONNX says of its input (or the spec, re-reading a
        # canonical file) that the checkpoint cannot (an entity count, 0.30's transposed entities)
        self.inputs: Dict[int, InputHint] = dict(inputs or {})
        # spec fields the official ONNX (or the spec, re-reading a canonical file) states that no tensor does
        self.stated: Dict[str, Any] = dict(stated or {})
        self.remaining = set(self.keys)
        self.tensors: Dict[str, np.ndarray] = {}
        self.sources: Dict[str, str] = {}
        self.ignored: Dict[str, str] = {}
        self.original: Dict[str, Dict[str, object]] = {}
        self.exact_steps: Dict[str, int] = {}
        self.fields: Dict[str, Any] = {}
        self.state: Dict[str, Any] = {}
        self.order: List[str] = []  # every key taken or ignored, in the order the rules met them

    def error(self, message: str) -> SpecError:
        return SpecError(message, self.path)

    @staticmethod
    def shape(t) -> Tuple[int, ...]:
        return _shape(t)

    def matching(self, pattern) -> List[Any]:
        """The match objects of every key ``pattern`` matches, in key order."""
        return [m for k in self.keys if (m := pattern.match(k))]

    def indices(self, pattern) -> List[int]:
        """The sorted distinct group(1) integers of the keys ``pattern`` matches."""
        return sorted({int(m.group(1)) for m in self.matching(pattern)})

    def contiguous(self, idx: List[int], what: str) -> None:
        if idx and idx != list(range(len(idx))):
            raise self.error(f"{what} indices {idx} are not 0..{len(idx) - 1}")

    def require(self, key: str, message: Optional[str] = None):
        if key not in self.sd:
            raise self.error(message or f"missing key '{key}'")
        return self.sd[key]

    def matrix(self, key: str):
        """The 2-D tensor at ``key``, or a 'missing key' error."""
        t = self.sd.get(key)
        if t is None or len(_shape(t)) != 2:
            raise self.error(f"missing key '{key}'")
        return t

    def ignore(self, key: str, why: str) -> None:
        self.ignored[key] = why
        self.remaining.discard(key)
        self.order.append(key)

    def twin(self, alias: str, key: str) -> None:
        """``alias`` (a second name of ``key``'s module), when present, must be ``key``'s tensor bit for
        bit; it is then ignored."""
        import torch

        if alias in self.sd:
            a, b = self.sd[alias], self.sd[key]
            if a.dtype != b.dtype or _shape(a) != _shape(b) or not torch.equal(a, b):
                raise self.error(f"'{alias}' differs from its twin '{key}' (they are one module)")
            self.ignore(alias, f"alias of {key} (bitwise equal)")

    def take(self, key: str, canonical: str, shape: Optional[Tuple[int, ...]] = None, finite: bool = True,
             integer: bool = False):
        """Claim ``key`` as the canonical tensor ``canonical`` (float32, C order): dtype, shape and
        finiteness checked (a floating-point tensor; ``integer``: an int32/int64 one also fits, e.g.
        a step count); a non-float32 original is recorded, and must fit float32 exactly."""
        import torch

        if key not in self.sd:
            raise self.error(f"missing key '{key}'")
        t = self.sd[key]
        if shape is not None and _shape(t) != tuple(shape):
            raise self.error(f"wrong shape for '{key}': {list(_shape(t))}, expected {list(shape)}")
        if not (t.dtype.is_floating_point or (integer and t.dtype in (torch.int64, torch.int32))):
            raise self.error(f"unexpected dtype {str(t.dtype).replace('torch.', '')} for '{key}' (a "
                             f"{'number' if integer else 'floating-point'} tensor belongs here)")
        a = t.detach().cpu().contiguous()
        a = (a.to(torch.float32) if t.dtype in (torch.bfloat16,) else a).numpy()
        if a.dtype != np.float32:
            self.original[canonical] = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(_shape(t))}
            if a.dtype.kind == "f" and a.dtype.itemsize > 4:
                with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the error raised below
                    round_trip = a.astype(np.float32).astype(a.dtype)
                if not np.array_equal(round_trip, a, equal_nan=True):
                    raise self.error(f"'{key}' is {a.dtype} and does not fit float32 exactly")
            a = a.astype(np.float32)
        if finite and not np.all(np.isfinite(a)):
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            raise self.error(f"'{key}' holds {bad} non-finite value(s) (NaN/Inf)")
        self.tensors[canonical] = np.array(a, dtype=np.float32, order="C")
        self.sources[canonical] = key
        self.remaining.discard(key)
        self.order.append(key)
        return a

    def linear(self, key_pattern: str, w_canonical: str, b_canonical: str, out: int, width: int) -> None:
        """Take a Linear's ``weight`` [out, width] and ``bias`` [out] (``key_pattern`` has ``{p}``)."""
        self.take(key_pattern.format(p="weight"), w_canonical, (out, width))
        self.take(key_pattern.format(p="bias"), b_canonical, (out,))
