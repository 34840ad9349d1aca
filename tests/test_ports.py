"""The port API (``core.flow``: ``Port.fill``/``feeds``/``levels``/``noise``, ``IOSignature.fills``/
``defaults``/``feedback``/``state_inputs``/``noise_outputs``) of three fixture policies, which is what the
generic code (``runtime.feeds``, ``verify``) reads instead of a family's spec fields. Expected: what
``fixtures/generate.py`` trained each with (hybrid: 7 observations, 2 continuous actions, one branch of 3;
lstm: 8 observations, 2 continuous actions, memory_size 16; discrete: 9 observations, branches 3 and 2)
and the dims their official ONNX declares."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import variant_ckpt

from huggy_convert import contract as C
from huggy_convert.converter import convert_checkpoint
from huggy_convert.exporters.torch_module import draw_noise, noise_widths
from huggy_convert.runtime.feeds import Stepper, complete_feed, injected, make_noise, unseeded

# name -> (fills {input: (fill, dims after the batch axis)}, feedback, noise outputs [(name, kind, width)],
#          levels {output: levels})
KNOWN = {
    "hybrid": ({C.ACTION_MASKS: (1.0, (3,))}, {},
               [(C.OUT_CONT, "normal", 2), (C.OUT_DISC, "uniform", 1)],
               {C.OUT_DISC: (3,), C.OUT_DISC_DET: (3,)}),
    "lstm": ({C.RECURRENT_IN: (0.0, (1, 16))}, {C.RECURRENT_OUT: C.RECURRENT_IN},
             [(C.OUT_CONT, "normal", 2)], {}),
    "discrete": ({C.ACTION_MASKS: (1.0, (5,))}, {},
                 [(C.OUT_DISC, "uniform", 2)], {C.OUT_DISC: (3, 2), C.OUT_DISC_DET: (3, 2)}),
}


def _official_dims(ck, name):
    """The dims after the batch axis the official ONNX beside ``ck`` declares for input ``name``."""
    model = onnx.load(str(ck.with_suffix(".onnx")))
    vi = next(i for i in model.graph.input if i.name == name)
    return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim[1:])


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_the_ports_say_what_the_fixture_was_trained_with(name):
    fills, feedback, noise, levels = KNOWN[name]
    ck = variant_ckpt(name)
    sig = convert_checkpoint(ck).policy.spec.io_signature()
    assert {p.name: (p.fill, tuple(p.dims[1:])) for p in sig.fills()} == fills
    for inp, (_, dims) in fills.items():
        assert _official_dims(ck, inp) == dims  # the official ONNX declares the same input
    defaults = sig.defaults(4)
    assert sorted(defaults) == sorted(fills)
    for inp, (fill, dims) in fills.items():
        assert defaults[inp].shape == (4,) + dims and defaults[inp].dtype == np.float32
        assert np.all(defaults[inp] == fill)
    assert sig.feedback() == feedback
    assert [p.name for p in sig.state_inputs()] == list(feedback.values())
    assert [(p.name, p.noise, p.width) for p in sig.noise_outputs()] == noise
    assert {p.name: p.levels for p in sig.outputs if p.levels} == levels


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_the_runtime_feeds_follow_the_ports(name):
    fills, feedback, noise, _ = KNOWN[name]
    pol = convert_checkpoint(variant_ckpt(name)).policy
    normal = sum(w for _, kind, w in noise if kind == "normal")
    uniform = sum(w for _, kind, w in noise if kind == "uniform")
    assert [p.name for p in injected(pol.spec)] == [n for n, kind, _ in noise if kind == "normal"]
    assert [p.name for p in unseeded(pol.spec)] == [n for n, kind, _ in noise if kind == "uniform"]
    assert noise_widths(pol.spec) == (normal, uniform)
    eps, u = draw_noise(pol.spec, 3, 0)
    assert tuple(eps.shape) == (3, normal) and tuple(u.shape) == (3, uniform)
    assert make_noise(pol, 3).shape == (3, normal)
    obs = {C.OBS_INPUT.format(i=0): np.zeros((3, pol.spec.obs_sizes[0]), np.float32)}
    assert sorted(complete_feed(pol.spec, dict(obs))) == sorted(list(obs) + list(fills))
    loop = Stepper(pol.spec, 3)
    first = loop.step(dict(obs))
    for out, inp in feedback.items():  # the carried state: the fill first, then what the step returned
        assert np.all(first[inp] == fills[inp][0])
        loop.update({out: np.full((3,) + fills[inp][1], 0.5, np.float32)})
        assert np.all(loop.step(dict(obs))[inp] == 0.5)
