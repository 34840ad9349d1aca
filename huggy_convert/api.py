"""The public Python API: convert, verify, load a policy, act and sample with memory, write a checkpoint back.

One argument order everywhere: the thing first, the destination second, as safetensors' verbs
(``save_file(tensors, filename)``): ``convert(source, out)``, ``save_policy(policy, path)``,
``to_checkpoint(policy, out)``. Every function is a thin layer over the stages the command line uses
(``pipeline.convert_one``, ``batch.reverify.verify_dir``, ``pipeline.to_checkpoint``, ``modes.sources`` and the
``runtime`` runners): the same files, the same verdicts. Errors are ``huggy_convert.errors.HuggyError``
(``InputError``, ``CheckpointError``, ...), each one sentence naming the file.

The examples run as tests (``tests/test_api.py``) from the repository root, on the bundled fixtures.
"""
from __future__ import annotations

import warnings
from dataclasses import make_dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

from . import blocks, contract as C
from .converter.policy_file import save_policy as _save_policy
from .core.policy import Policy
from .core.spec import PolicySpec
from .errors import InputError
from .modes.sources import load_source, make_runner, obs_feed
from .batch.reverify import verify_dir
from .pipeline import ConvertOptions, convert_one
from .pipeline import to_checkpoint as _to_checkpoint
from .runtime import complete_feed
from .verify import VerifyOptions

__all__ = ["convert", "verify_files", "load_policy", "Session", "Actions", "save_policy", "to_checkpoint"]


def _verify_options(options: dict):
    return VerifyOptions(**options) if options else None


CONVERT_OPTIONS = ("opset", "reference", "divisor", "obs_sizes", "program", "verify")  # ConvertOptions' own


def convert(source, out, **options):
    """Convert one checkpoint (``.pt``) or ML-Agents ``.onnx`` into ``out/<stem>.{safetensors,onnx,pt2}``,
    then verify the files written: what ``huggy-convert SOURCE OUT/`` does (``pipeline.convert_one``).

    ``options``, each by keyword: ``opset`` (default 9); ``reference``: the official ONNX (default:
    ``<stem>.onnx`` beside the source); ``divisor``: ``auto`` (the default) adopts an official divisor
    within 1 ulp of IEEE, ``ieee`` never; ``obs_sizes``: the observation split (default: the official
    ONNX's); ``program``: write the ``.pt2`` (default True); ``verify``: verify the files (default True);
    any other: a ``VerifyOptions`` field (``rows``, ``seed``, ``devices``, ``atol``, ...).
    Returns a ``ConvertResult``: ``.ok``, ``.artifacts`` (kind -> path, sha256), ``.report``.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> result = convert("fixtures/variants/small/Small/Small-4157.pt", out)
    >>> result.ok, result.report.verdict
    (True, 'PASS')
    >>> sorted(result.artifacts)
    ['golden', 'onnx', 'pt2', 'report', 'safetensors']
    >>> Path(result.artifacts["safetensors"]["path"]).name
    'Small-4157.safetensors'
    """
    own = {k: options.pop(k) for k in CONVERT_OPTIONS if k in options}
    if own.get("reference"):
        own["reference"] = Path(own["reference"])
    return convert_one(source, out, ConvertOptions(**own, verify_options=_verify_options(options)))


def verify_files(out, *, reference=None, checkpoint=None, require_complete: bool = False, **verify_options) -> list:
    """Re-verify converted files, as ``huggy-convert verify OUT/`` does (``batch.reverify.verify_dir``; not named
    ``verify``: that is the ``huggy_convert.verify`` stage's package): every set
    under the folder ``out``, or the one set of a ``.safetensors`` file. Each set's files are read back and
    rebuilt from the ``.safetensors`` and compared byte for byte, each source found again by its recorded
    sha256 re-runs checks 1-2, and each set's ``<stem>.verify.json`` is rewritten. Each set gets the profile
    its batch gave it (``OUT/manifest.json``; the full one where none is recorded), as on the command line;
    a tolerance option naming an output of only some sets is a ``UserWarning``.

    Returns one ``Report`` per set (``.ok``, ``.verdict``, ``.first_failure()``).

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> result = convert("fixtures/variants/small/Small/Small-4157.pt", out, program=False)
    >>> [report.verdict for report in verify_files(out)]
    ['PASS']
    >>> [report.ok for report in verify_files(result.artifacts["safetensors"]["path"])]
    [True]
    """
    p, stem = Path(out), None
    if p.suffix == ".safetensors" and p.is_file():
        p, stem = p.parent, p.stem
    reports, notes = verify_dir(p, reference=reference, checkpoint=checkpoint, options=_verify_options(verify_options),
                                stem=stem, require_complete=require_complete)
    for note in notes:  # what the command line prints as a warning (each report notes it too)
        warnings.warn(note, stacklevel=2)
    return reports


HEADS = blocks.action_heads()  # (name, (deterministic output, sampled output)) of each head

class Actions(make_dataclass("Actions", [(name, Optional[np.ndarray]) for name, _ in HEADS]
                             + [("outputs", Dict[str, np.ndarray])])):
    """What a policy did for a batch of observations: one attribute per head (``blocks.action_heads``):
    ``continuous`` (float32 [rows, actions]) and ``discrete`` (int64 [rows, branches]), None where the
    policy has no such head; ``outputs``: every output the runtime gave, by its ONNX name."""


def _actions(out: Dict[str, np.ndarray], sampled: bool):
    """``out`` as ``Actions``: each head's deterministic (or ``sampled``) output."""
    return Actions(*(out.get(names[1] if sampled else names[0]) for _, names in HEADS), out)


class Session:
    """A policy ready to act: its canonical tensors (``policy``, ``spec``, ``tensors``, ``metadata``) and a
    runtime (``runner``: torch for a checkpoint or ``.safetensors``, onnxruntime for an ``.onnx``).

    ``act`` and ``sample`` take observations as one array of rows (the observations' concatenation), one
    array per observation, or a dict by input name; one row may come without its batch axis. A policy with
    memory (LSTM) returns its next state with the actions: pass it back in on the next step (None: zeros,
    the start of an episode). A policy without memory returns None as its state."""

    def __init__(self, source, runner):
        self._source, self.runner = source, runner

    @property
    def path(self) -> Path:
        return self._source.path

    @property
    def spec(self) -> PolicySpec:
        return self._source.spec

    @property
    def policy(self) -> Optional[Policy]:
        """The canonical policy (None for an ONNX whose tensors could not be recovered)."""
        return self._source.policy

    @property
    def tensors(self) -> Dict[str, np.ndarray]:
        self._source.require_tensors("the tensors")
        return self._source.policy.tensors

    @property
    def metadata(self) -> Dict[str, str]:
        self._source.require_tensors("the metadata")
        return self._source.policy.metadata

    def initial_state(self, rows: int = 1) -> Optional[np.ndarray]:
        """The memory at the start of an episode: zeros [rows, 1, memory_size], or None without memory."""
        port = next(iter(self.spec.io_signature().state_inputs()), None)
        return port.filled(rows) if port is not None else None

    def _feed(self, obs, state, action_masks) -> Dict[str, np.ndarray]:
        carried = self._carried()
        if carried is None and state is not None:
            raise InputError("a state was given, but this policy carries none from step to step (its inputs: "
                             f"{', '.join(self.spec.input_names())})")
        extra = {C.ACTION_MASKS: action_masks}
        if carried is not None:
            extra = {carried[1]: state, **extra}
        extra = {k: v for k, v in extra.items() if v is not None}
        if extra:  # checked with the observations (names, widths, one number of rows), by input name: arrays
            # of rows are split into their observations first
            obs = dict(obs if isinstance(obs, dict) else obs_feed(self.spec, obs), **extra)
        return complete_feed(self.spec, obs_feed(self.spec, obs))

    def _state(self, out: Dict[str, np.ndarray]) -> Optional[np.ndarray]:
        carried = self._carried()
        return out[carried[0]] if carried is not None else None

    def _carried(self) -> Optional[Tuple[str, str]]:
        """(output, input) of the carried state (``IOSignature.feedback``), None without one."""
        return next(iter(self.spec.io_signature().feedback().items()), None)

    def act(self, obs, state: Optional[np.ndarray] = None, *,
            action_masks: Optional[np.ndarray] = None) -> Tuple[Actions, Optional[np.ndarray]]:
        """The deterministic actions for ``obs`` and the next memory state.

        >>> import numpy as np
        >>> session = load_policy("fixtures/variants/small/Small/Small-4157.pt")
        >>> actions, state = session.act(np.zeros((4, 12), np.float32))
        >>> actions.continuous.shape, actions.continuous.dtype, actions.discrete, state
        ((4, 3), dtype('float32'), None, None)
        >>> bool(np.all(np.abs(actions.continuous) <= 1))  # clamp(mu, -3, 3) / 3
        True

        With memory, the state goes from one step to the next:

        >>> lstm = load_policy("fixtures/variants/lstm/Lstm/Lstm-4108.pt")
        >>> obs = np.ones((1, 8), np.float32)
        >>> a1, state = lstm.act(obs)  # state=None: an episode's start
        >>> state.shape, state.dtype
        ((1, 1, 16), dtype('float32'))
        >>> a2, state2 = lstm.act(obs, state)
        >>> np.array_equal(lstm.act(obs, lstm.initial_state())[1], state)  # None means zeros
        True
        >>> bool(np.array_equal(state2, state))  # the memory moved on
        False
        """
        out = self.runner.infer(self._feed(obs, state, action_masks))
        return _actions(out, sampled=False), self._state(out)

    def sample(self, obs, state: Optional[np.ndarray] = None, *, seed: int = 0,
               action_masks: Optional[np.ndarray] = None) -> Tuple[Actions, Optional[np.ndarray]]:
        """Stochastic actions for ``obs`` with noise drawn on the CPU from ``seed`` (one seed, one sample
        on every device and runtime), and the next memory state (the noise does not touch it).

        >>> import numpy as np
        >>> lstm = load_policy("fixtures/variants/lstm/Lstm/Lstm-4108.pt")
        >>> obs = np.ones((2, 8), np.float32)
        >>> a, state = lstm.sample(obs, seed=1)
        >>> a.continuous.shape, state.shape
        ((2, 2), (2, 1, 16))
        >>> np.array_equal(lstm.sample(obs, seed=1)[0].continuous, a.continuous)
        True
        >>> np.array_equal(lstm.act(obs)[1], state)
        True
        >>> discrete = load_policy("fixtures/variants/discrete/Discrete/Discrete-4101.pt")
        >>> a, _ = discrete.sample(np.zeros(9, np.float32), seed=3)  # one row without its batch axis
        >>> a.discrete.shape, a.discrete.dtype
        ((1, 2), dtype('int64'))
        """
        out = self.runner.sample(self._feed(obs, state, action_masks), seed)  # (with the next state)
        return _actions(out, sampled=True), self._state(out)

    def __repr__(self) -> str:
        return f"Session({str(self.path)!r}, {self.spec.family!r}, {self.runner.label})"


def load_policy(path, *, runtime: str = "auto", device: str = "cpu", dtype: str = "float32") -> Session:
    """A policy ready to act: a ``.safetensors`` this tool wrote, a ``.pt`` checkpoint (its divisors decided
    as a conversion decides them), an ML-Agents ``.onnx`` or a run directory (its newest checkpoint).

    ``runtime``: ``torch`` (a ``PolicyModule``; ``device`` cpu / cuda / npu, ``dtype`` float32 / float16 /
    bfloat16), ``onnxruntime``, or ``auto`` (onnxruntime for an ``.onnx``, else torch).

    >>> session = load_policy("fixtures/variants/lstm/Lstm/Lstm-4108.pt")
    >>> session.spec.obs_sizes, session.spec.continuous_size, session.spec.memory_size
    ((8,), 2, 16)
    >>> session.runner.runtime
    'torch'
    >>> load_policy("fixtures/variants/lstm/Lstm/Lstm-4108.onnx").runner.runtime
    'onnxruntime'
    """
    src = load_source(path)
    return Session(src, make_runner(src, device, dtype, runtime))


def _policy_of(policy) -> Policy:
    if isinstance(policy, Session):
        policy._source.require_tensors("writing the policy")
        return policy.policy
    return policy


def save_policy(policy, path) -> Path:
    """Write ``policy`` (a ``Session`` or a canonical ``Policy``) as the canonical ``.safetensors`` at
    ``path`` (atomically; the same policy, the same bytes). Returns the path.

    >>> import tempfile
    >>> session = load_policy("fixtures/variants/small/Small/Small-4157.pt")
    >>> path = save_policy(session, Path(tempfile.mkdtemp()) / "small.safetensors")
    >>> load_policy(path).spec == session.spec
    True
    >>> save_policy(path, session)
    Traceback (most recent call last):
    ...
    TypeError: save_policy(policy, path): the policy first, the destination second (the arguments came the other way round)
    """
    return _save_policy(_policy_of(policy), path)  # a path first is refused there, with the sentence that says why


def to_checkpoint(policy, out, *, global_step: Optional[int] = None):
    """Write ``policy`` (a ``Session``, a canonical ``Policy`` or a ``.safetensors`` path) back as
    ML-Agents' ``out/checkpoint.pt``, which ``mlagents-learn --initialize-from`` takes, then read it back
    with this tool's own reader (``pipeline.to_checkpoint``). ``global_step``: default, the step recorded.

    Returns a ``ToCheckpointResult``: ``.ok`` (the same spec, every tensor bitwise, the step), ``.path``.

    >>> import tempfile
    >>> session = load_policy("fixtures/variants/lstm/Lstm/Lstm-4108.pt")
    >>> result = to_checkpoint(session, tempfile.mkdtemp())
    >>> result.ok, result.path.name, result.global_step
    (True, 'checkpoint.pt', 4108)
    >>> load_policy(result.path).spec == session.spec
    True
    """
    if isinstance(policy, (str, Path)) and Path(policy).suffix != ".safetensors":
        policy = load_policy(policy)
    return _to_checkpoint(_policy_of(policy), out, global_step)
