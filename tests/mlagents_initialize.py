"""Run by tests/test_to_checkpoint.py with the fixture generator's interpreter (the real ``mlagents``
1.1.0 package): for each job, ML-Agents' own code initializes a policy from a ``checkpoint.pt``
exactly as ``mlagents-learn --initialize-from=<run-id>`` and ``--resume`` do, and runs it.

Per job (JSON list in argv[1]; results as JSON on the last line of stdout; ``golden``: the fixture's
golden file, onnxruntime on the official ONNX, keyed by the ONNX's input and output names):
- ``RunOptions`` from the fixture's ``configuration.yaml`` with ``initialize_from`` set, then
  ``learn.setup_init_path`` (``results/<run-id>/<Behavior>/checkpoint.pt``), ``TrainerFactory``,
  ``trainer.create_policy`` and ``trainer.add_policy``, whose ``TorchModelSaver.initialize_or_load``
  reads the file (``torch.load``, then ``load_state_dict(strict=False)`` per module);
- the same with ``resume`` (the global step is kept, not reset to 0);
- the warnings ML-Agents logged while loading;
- the loaded actor's state dict against the original checkpoint's ``Policy`` dict (bitwise), and its
  export forward (``SimpleActor.forward``, what ``torch.onnx.export`` traces) on the golden inputs:
  beside the official ONNX's outputs, and beside the same actor initialized from the original file
  (the outputs are saved to ``job["save"]``, ``ours.<name>`` / ``original.<name>``, for the test to
  judge against its float64 reference).
Not a test module (no ``test_`` prefix): it imports mlagents, which the project's venv lacks.
"""
import json
import logging
import os
import shutil
import sys
import tempfile

import numpy as np
import yaml


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def behavior_spec(job):
    from mlagents_envs.base_env import ActionSpec, BehaviorSpec, DimensionProperty, ObservationSpec, ObservationType

    shapes = job.get("obs_shapes") or [[n] for n in job["obs_sizes"]]  # [max_entities, size]: a buffer sensor
    obs = [ObservationSpec(shape=tuple(s), observation_type=ObservationType.DEFAULT, name=f"obs_{i}",
                           dimension_property=(DimensionProperty.NONE,) if len(s) == 1 else
                           (DimensionProperty.VARIABLE_SIZE, DimensionProperty.NONE))
           for i, s in enumerate(shapes)]
    return BehaviorSpec(observation_specs=obs, action_spec=ActionSpec(job["continuous"], tuple(job["branches"])))


def load_policy(job, results, src_run, new_run, resume, init_path=None):
    """A trainer's policy, initialized (or resumed) from results/<src_run>/<Behavior>/checkpoint.pt, or
    from ``init_path`` set in the behavior's settings (no --initialize-from)."""
    from mlagents.trainers.behavior_id_utils import BehaviorIdentifiers
    from mlagents.trainers.directory_utils import setup_init_path
    from mlagents.trainers.environment_parameter_manager import EnvironmentParameterManager
    from mlagents.trainers.settings import RunOptions
    from mlagents.trainers.trainer import TrainerFactory

    with open(job["config"]) as f:
        config = yaml.safe_load(f)
    config["checkpoint_settings"] = {"run_id": src_run if resume else new_run, "results_dir": results,
                                     "resume": resume,
                                     "initialize_from": None if resume or init_path else src_run}
    if init_path:
        config["behaviors"][job["behavior"]]["init_path"] = init_path
    config["torch_settings"] = {"device": "cpu"}
    options = RunOptions.from_dict(config)
    cs = options.checkpoint_settings
    if cs.maybe_init_path is not None:  # what learn.run_training does for --initialize-from
        setup_init_path(options.behaviors, cs.maybe_init_path)
    factory = TrainerFactory(trainer_config=options.behaviors, output_path=cs.write_path, train_model=True,
                             load_model=cs.resume, seed=1, param_manager=EnvironmentParameterManager(),
                             init_path=cs.maybe_init_path)
    trainer = factory.generate(job["behavior"])
    ident = BehaviorIdentifiers.from_name_behavior_id(job["behavior"])
    policy = trainer.create_policy(ident, behavior_spec(job))
    trainer.add_policy(ident, policy)
    return policy


def forward(policy, job, data):
    """The export forward on the golden inputs (``job``: the input names of each kind), in ML-Agents'
    exporting context as ``ModelSerializer.export_policy_model`` runs it (the memory in ONNX's layout)."""
    import torch
    from mlagents.trainers.torch_entities.model_serialization import exporting_to_onnx

    def arr(name):
        return torch.from_numpy(data[name]) if name else None

    with torch.no_grad(), exporting_to_onnx():
        out = policy.actor.forward([arr(n) for n in job["obs_inputs"]], arr(job["mask_input"]), arr(job["memory_input"]))
    return {name: np.asarray(o.detach().numpy() if hasattr(o, "detach") else o)
            for name, o in zip(job["outputs"], out)}


def one(job):
    import torch
    from mlagents.trainers.model_saver.torch_model_saver import DEFAULT_CHECKPOINT_NAME

    work = tempfile.mkdtemp(prefix="mlagents-init-")
    try:
        results = os.path.join(work, "results")
        res = {"name": job["name"]}
        data = dict(np.load(job["golden"]))
        actors = {}
        for label, ckpt in (("ours", job["checkpoint"]), ("original", job["original"])):
            src = os.path.join(results, f"src-{label}", job["behavior"])
            os.makedirs(src)
            shutil.copyfile(ckpt, os.path.join(src, DEFAULT_CHECKPOINT_NAME))
            handler = Collect()
            saver_log = logging.getLogger("mlagents.trainers.model_saver.torch_model_saver")
            saver_log.addHandler(handler)
            try:
                policy = load_policy(job, results, f"src-{label}", f"init-{label}", resume=False)
            finally:
                saver_log.removeHandler(handler)
            actors[label] = policy
            res[f"{label}_warnings"] = handler.messages
            res[f"{label}_step_after_initialize"] = policy.get_current_step()
            resumed = load_policy(job, results, f"src-{label}", None, resume=True)
            res[f"{label}_step_after_resume"] = resumed.get_current_step()
        via = load_policy(job, results, None, "init-path", resume=False, init_path=os.path.abspath(job["checkpoint"]))
        res["init_path_bitwise"] = all(torch.equal(a, b) for a, b in zip(via.actor.state_dict().values(),
                                                                          actors["ours"].actor.state_dict().values()))
        want = torch.load(job["original"], map_location="cpu", weights_only=True)["Policy"]
        got = actors["ours"].actor.state_dict()
        res["state_dict_keys_equal"] = list(got) == list(want)
        res["state_dict_mismatches"] = [k for k in want if k not in got or got[k].dtype != want[k].dtype
                                        or got[k].shape != want[k].shape or not torch.equal(got[k], want[k])]
        ours, orig = forward(actors["ours"], job, data), forward(actors["original"], job, data)
        res["outputs"] = {}
        for name in job["deterministic"]:
            a, b, off = ours[name], orig[name], data[name]
            res["outputs"][name] = {
                "bitwise_vs_original_initialized": bool(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()),
                "max_abs_vs_official_onnx": float(np.max(np.abs(a.astype(np.float64) - off.astype(np.float64)))) if a.size else 0.0,
                "shape": list(a.shape), "official_shape": list(off.shape)}
        np.savez(job["save"], **{f"{label}.{k}": v for label, outs in (("ours", ours), ("original", orig))
                                 for k, v in outs.items() if k in job["deterministic"]})
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    from mlagents.plugins.trainer_type import register_trainer_plugins

    register_trainer_plugins()  # as mlagents-learn does: ppo, sac, poca
    logging.getLogger("mlagents").setLevel(logging.INFO)
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    out = [one(job) for job in jobs]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
