"""torch's intra-op thread count, set deliberately for a scope and restored after.

Verification's forwards are small: 64-row GEMMs and hundreds of single-row GEMVs (the fingerprints).
On more than one thread, torch's intra-op workers spin between calls; on shared cores they collapse
(the 384 single-row fingerprint forwards of a Huggy policy took 1.8-6.3 s on 2 threads, 0.09 s on
one). ``VERIFY_THREADS`` (1, like the onnxruntime reference sessions: ``ort.INTRA_OP_THREADS``) is
what verification and the fingerprints run on, whatever the process's setting.

``torch.set_num_threads`` is process-wide: ``torch_threads`` changes nothing when the count is
already ``n`` (a batch's workers run one thread each), so only a caller that is alone may ask for
another count."""
from __future__ import annotations

from contextlib import contextmanager

VERIFY_THREADS = 1


@contextmanager
def torch_threads(n: int = VERIFY_THREADS):
    """torch on ``n`` intra-op threads inside the block; the earlier count restored after."""
    import torch

    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
