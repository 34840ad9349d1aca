"""The types the stages hand each other about a policy's computation: its I/O :class:`Port` and
:class:`IOSignature` (what ``PolicySpec.io_signature`` returns), what an official ONNX says of an input
(:class:`InputHint`), and the flows the orchestrators pass to the blocks' hooks — :class:`OnnxFlow`
(the graph being built), :class:`TorchFlow` (one forward of the torch module), :class:`ReferenceFlow`
(one float64 forward with bounds). Nothing here imports torch or onnx."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

# Port kinds
OBSERVATION = "observation"  # an observation input
MASK = "mask"  # an input that restricts an output's choices (ones: every choice allowed)
STATE = "state"  # carried state, in and out: an output fed back as an input on the next step; part of the deterministic outputs
CONSTANT = "constant"  # a constant output (an initializer behind an Identity)
SAMPLED = "sampled"  # a stochastic action output
DETERMINISTIC = "deterministic"  # a deterministic action output

Dim = Any  # an int, or C.BATCH_DIM


@dataclass(frozen=True)
class Port:
    """One input or output of the policy as Unity binds it.

    ``dims`` uses ``C.BATCH_DIM`` for the batch axis; ``tensor`` (constant outputs) is the canonical
    tensor behind it and ``init`` the ONNX initializer's name.

    What generic code needs to know of a port without knowing the block behind it:
    ``fill``: an input other than an observation that a feed may leave out gets this value everywhere
    (a mask: 1.0, every choice allowed; carried state: 0.0, the first step);
    ``feeds``: an output that becomes an input on the next step names that input (carried state);
    ``levels``: an integer action output's number of choices per column (each value in ``0..n-1``);
    ``noise``: a sampled output's injected noise, ``"normal"`` (one standard normal per column) or
    ``"uniform"`` (one uniform in [0, 1) per column), the way ``sample`` draws it."""

    name: str
    dims: Tuple[Dim, ...]
    dtype: str = "float32"
    kind: str = OBSERVATION
    tensor: Optional[str] = None
    init: Optional[str] = None
    fill: Optional[float] = None
    feeds: Optional[str] = None
    levels: Tuple[int, ...] = ()
    noise: Optional[str] = None

    @property
    def width(self) -> int:
        """The number of elements of one row (the dims after the batch axis, multiplied)."""
        n = 1
        for d in self.dims[1:]:
            n *= int(d)
        return n

    def filled(self, rows: int) -> np.ndarray:
        """This input for ``rows`` rows, every element ``fill``."""
        return np.full((rows,) + tuple(int(d) for d in self.dims[1:]), self.fill, np.float32)


@dataclass(frozen=True)
class InputHint:
    """What an official ONNX says about one observation input that no checkpoint tensor holds: its
    ``dims`` without the batch axis (None where not fixed), and whether the graph first transposes
    it (``transposed``: ML-Agents 0.30's export of an entity input, for Barracuda)."""

    dims: Tuple[Any, ...]
    transposed: bool = False


@dataclass(frozen=True)
class IOSignature:
    """The policy's inputs and outputs, in Unity's order: the one source of their names, dims, dtypes."""

    inputs: Tuple[Port, ...]
    outputs: Tuple[Port, ...]

    def input_names(self) -> List[str]:
        return [p.name for p in self.inputs]

    def output_names(self) -> List[str]:
        return [p.name for p in self.outputs]

    def deterministic_output_names(self) -> List[str]:
        """What the torch module's ``forward`` returns: every deterministic action, then the carried state."""
        return [p.name for p in self.outputs if p.kind in (DETERMINISTIC, STATE)]

    def sampled_output_names(self) -> List[str]:
        """What the torch module's ``sample`` returns."""
        return [p.name for p in self.outputs if p.kind == SAMPLED]

    def constant_outputs(self) -> List[Port]:
        return [p for p in self.outputs if p.kind == CONSTANT]

    def fills(self) -> List[Port]:
        """The inputs a feed may leave out (masks, carried state), each with its ``fill``."""
        return [p for p in self.inputs if p.fill is not None]

    def defaults(self, rows: int) -> Dict[str, np.ndarray]:
        """Every input a feed may leave out, filled for ``rows`` rows."""
        return {p.name: p.filled(rows) for p in self.fills()}

    def feedback(self) -> Dict[str, str]:
        """output -> the input it becomes on the next step (carried state), in output order."""
        return {p.name: p.feeds for p in self.outputs if p.feeds}

    def state_inputs(self) -> List[Port]:
        return [p for p in self.inputs if p.kind == STATE]

    def noise_outputs(self) -> List[Port]:
        """The sampled outputs with injected noise, in output order."""
        return [p for p in self.outputs if p.kind == SAMPLED and p.noise]

    def port(self, name: str) -> Port:
        for p in self.inputs + self.outputs:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass
class OnnxFlow:
    """The graph being built: ``g`` (the opset-aware builder), the policy, each observation's
    encoding (``encoded``), the current features ``h`` and what heads hand from their first pass
    to their second (``state``)."""

    g: Any
    policy: Any
    h: Optional[str] = None
    encoded: Dict[int, str] = field(default_factory=dict)
    state: Dict[str, Any] = field(default_factory=dict)
    current: Optional[int] = None  # the observation being encoded (None: all of a block's at once)

    @property
    def spec(self):
        return self.policy.spec

    def observing(self, pairs):
        """The ``(index, ...)`` pairs an ``onnx_observe`` hook encodes now: the orchestrator calls every
        observe block once per observation, in observation order, so the nodes come in the order
        ML-Agents' ObservationEncoder runs its processors (a camera's before a later vector's)."""
        return [p for p in pairs if self.current is None or p[0] == self.current]

    def init(self, canonical: str) -> str:
        """An initializer holding canonical tensor ``canonical``, named as ML-Agents names it (its key)."""
        return self.g.init(self.policy.sources.get(canonical, canonical), self.policy.tensors[canonical])

    def gemm(self, x: str, w_canonical: str, b_canonical: str, scope: str, out: Optional[str] = None) -> str:
        w, b = self.init(w_canonical), self.init(b_canonical)
        return self.g.node("Gemm", [x, w, b], scope, out=out, alpha=1.0, beta=1.0, transB=1)


@dataclass(slots=True)
class TorchFlow:
    """One forward through the module: the inputs by name, each observation's encoding
    (``encoded``), the current features ``h``, and how to run (``vec``: one row as a vector, eager; ``inplace``: autograd off, not traced).
    ``sampling`` holds the injected noise ({'noise', 'uniform'}) for ``sample``, else None."""

    module: Any
    feed: Dict[str, Any]
    vec: bool
    inplace: bool
    h: Any = None
    sampling: Optional[Dict[str, Any]] = None
    encoded: Dict[int, Any] = field(default_factory=dict)
    state: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ReferenceFlow:
    """One float64 forward (``verify.bounds.Float64Policy``): the feed, whether bounds are carried, the injected
    noise (or None), each observation's encoding, the features ``h``, and the outputs' values,
    bounds and (discrete heads) masked logits, in output order; ``precision``: the format of the
    runtime the bounds are for (every bound hook passes it to ``core.bounds``' functions as ``p``)."""

    feed: Dict[str, np.ndarray]
    bounds: bool
    noise: Optional[np.ndarray] = None
    h: Any = None
    encoded: Dict[int, Any] = field(default_factory=dict)
    values: Dict[str, np.ndarray] = field(default_factory=dict)
    errs: Dict[str, np.ndarray] = field(default_factory=dict)
    logits: Dict[int, Any] = field(default_factory=dict)
    state: Dict[str, Any] = field(default_factory=dict)
    precision: Any = None  # the bounds' format (core.bounds.Precision: float32, float16, bfloat16)
