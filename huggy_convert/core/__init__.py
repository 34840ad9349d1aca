"""The floor every stage stands on; it imports only ``contract`` and ``errors``.

- :mod:`.spec`: ``PolicySpec`` (what an actor is: the fields every actor has here, each block's own
  declared by the block as ``SpecField``s; its ports, parameter count and encoding width come from the
  block registry, which binds itself to it: ``spec.bind_architecture``)
- :mod:`.policy`: ``Policy`` (a spec and its canonical float32 tensors)
- :mod:`.flow`: the port and flow types (``Port``, ``IOSignature``, ``InputHint``, ``OnnxFlow``,
  ``TorchFlow``, ``ReferenceFlow``) the blocks' hooks and the stages share
- :mod:`.bounds`: the float64 bounds arithmetic (``Precision``, ``Bounded``, ``Linear`` and the
  operations the blocks' float64 hooks compose)
- :mod:`.numerics`: host-independent float32 arithmetic (the IEEE divisor, ulp distances, bitwise equality)
- :mod:`.files`: bounded file I/O (``read_input_file``, ``stored_zip``, ``load_npz``) and atomic writes
- :mod:`.artifacts`: ``ArtifactSet``, the files of one converted policy
- :mod:`.version`: ``__version__``
"""
