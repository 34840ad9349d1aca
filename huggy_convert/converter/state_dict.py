"""Back into ML-Agents: a canonical policy as the ``checkpoint.pt`` ML-Agents 1.1.0 initializes from
(``mlagents-learn --initialize-from`` / ``init_path``, or ``--resume``).

The inverse of :mod:`.mapping`, driven by the same rules rather than a second table:

1. every canonical tensor goes back under the ML-Agents key its block's ``claim`` took it from
   (``policy.sources``, recorded by ``KeyRules.take`` and re-checked by those rules on load);
2. each block's ``restore`` adds what no canonical tensor stands for and ML-Agents' own dtypes
   (the normalizer: its 0-d int64 step counts, exact, and the ``network_body.processors.*`` alias);
3. the forward rules (``map_policy``) run on the result and must give back the same spec and the same
   tensors bit for bit, else nothing is written;
4. the keys are put in torch's ``state_dict`` order (a module's own tensors, then its children, in
   the order the rules claimed them), which is the order of ML-Agents' own ``Policy`` dict.

The file holds ``Policy`` and ``global_step`` only (``torch_model_saver.TorchModelSaver.get_modules``
of the policy). The optimizer, the critic and reward-signal modules are not in a canonical policy:
ML-Agents' ``_load_model`` meets each missing module as a ``KeyError``, logs "Failed to load for
module <name>. Initializing" and starts it fresh; the policy itself loads with no missing or
unexpected key.
"""
from __future__ import annotations

import io
from typing import Dict, Iterable, List, Optional

import numpy as np

from .. import blocks
from .. import contract as C
from ..errors import SpecError
from .mapping import map_policy_as


def torch_order(keys: Iterable[str]) -> List[str]:
    """``keys`` in the order ``nn.Module.state_dict`` lists them for modules registered in the order the
    keys first appear: at each module its own tensors first, then each child's, recursively; the
    children of a ModuleList or Sequential (numbered) by index (an entity set's processor between two
    normalized vectors is claimed after them)."""
    tree: Dict[str, Optional[dict]] = {}
    for key in keys:
        node = tree
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = None

    def walk(node, prefix):
        yield from (prefix + name for name, sub in node.items() if sub is None)
        children = [name for name, sub in node.items() if sub is not None]
        if children and all(n.isdigit() for n in children):  # a ModuleList / Sequential: by index
            children.sort(key=int)
        for name in children:
            yield from walk(node[name], f"{prefix}{name}.")

    return list(walk(tree, ""))


def policy_state_dict(policy) -> Dict[str, "object"]:
    """ML-Agents' ``Policy`` state dict of ``policy`` (key -> torch tensor, in ML-Agents' order), checked
    by the forward rules: they must find the same spec and every tensor bit for bit."""
    import torch

    sd: Dict[str, object] = {}
    for canonical, key in policy.sources.items():
        sd[key] = torch.from_numpy(np.array(policy.tensors[canonical], dtype=np.float32, order="C"))
    for block in blocks.REGISTRY:
        block.restore(policy, sd)
    mapped = map_policy_as(sd, policy.spec)
    if mapped.spec != policy.spec:
        raise SpecError(f"the state dict written back reads as a {mapped.spec.family}, not the policy's "
                        f"{policy.spec.family}")
    for canonical, key in policy.sources.items():
        a, b = mapped.tensors.get(canonical), policy.tensors[canonical]
        if a is None or a.shape != b.shape or a.tobytes() != np.asarray(b, dtype=np.float32).tobytes():
            raise SpecError(f"'{key}' does not read back as the policy's '{canonical}'")
    unwritten = sorted(set(sd) - set(mapped.order))
    if unwritten:
        raise SpecError(f"'{unwritten[0]}' is not claimed by any block's rules")
    return {k: sd[k] for k in torch_order(mapped.order)}


def checkpoint_dict(policy, global_step: int) -> Dict[str, Dict[str, object]]:
    """``{'Policy': state dict, 'global_step': {'_GlobalSteps__global_step': int64 [step]}}``."""
    import torch

    if not 0 <= int(global_step) < 2 ** 63:
        raise SpecError(f"global step {global_step} is not in 0..2^63-1")
    step = torch.tensor([int(global_step)], dtype=getattr(torch, C.GLOBAL_STEP_DTYPE))
    return {C.CKPT_POLICY: policy_state_dict(policy), C.CKPT_GLOBAL_STEP: {C.GLOBAL_STEP_KEY: step}}


def checkpoint_bytes(checkpoint: Dict[str, Dict[str, object]]) -> bytes:
    """The bytes of the ``checkpoint.pt``: ``torch.save`` of :func:`checkpoint_dict`'s dict (plain tensors
    in dicts, which torch's weights-only loader reads; the same dict, the same bytes)."""
    import torch

    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    return buf.getvalue()
