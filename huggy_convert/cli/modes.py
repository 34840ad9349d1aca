"""The mode commands: each parses its options and returns the mode's result (``modes/``, logic there);
``options.Command`` renders it (text or ``--json``) and gives its exit code."""
from __future__ import annotations

import inspect
from pathlib import Path

import click

from .. import contract as C
from ..contract.consumers import BY_NAME as _CONSUMERS
from ..errors import DeviceError, InputError
from ..modes.actions import act, sample
from ..modes.batch_sizes import batch_sizes
from ..modes.benchmark import RUNTIMES as ALL
from ..modes.benchmark import Timing, benchmark
from ..modes.check import check
from ..modes.common import ModeResult
from ..modes.compare import onnx_compare_paths
from ..modes.export import ExportOptions, export
from ..modes.fingerprint import STEPS as FINGERPRINT_STEPS
from ..modes.fingerprint import fingerprint
from ..modes.info import info
from ..modes.matrix import list_cases, run_matrix
from ..modes.precision import precision
from ..modes.sources import DTYPES, load_source
from ..modes.stats import rollout
from .options import (DEVICE_HELP, target_opt, targeted_opset, ITERS, MAX_ROWS, OPSET, OPSET_HELP, REPEATS, ROWS, ROWS_RANGE, SOURCE_HELP, STEPS,
                      STEPS_RANGE, THREADS, WARMUP, Command, TargetList, device_opt, devices_opt, range_text,
                      dtype_opt, json_opt, obs_opt, options, rows_opt, runtime_opt, seed_opt, source_arg)


@click.command("info", cls=Command,
               short_help="Show a policy's spec, parameter counts and environment.")
@source_arg
@click.option("--device", default="auto", show_default=True, metavar="DEV", help=DEVICE_HELP)
@dtype_opt
@json_opt
def info_cmd(source, device, dtype, as_json):
    """Spec, parameter counts, normalizer summary, checkpoint inventory (run directory) and environment.

    SOURCE: a .pt checkpoint, a .safetensors policy, an .onnx model, an SB3 model .zip or a run directory."""
    return info(source, device=device, dtype=dtype)


CONSUMER_NAMES = list(_CONSUMERS)


@click.command("check", cls=Command, subject="onnx",
               short_help="Say which Unity and Ascend runtimes load an ONNX, and why.")
@click.argument("onnx", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE.onnx")
@click.option("--for", "consumers", multiple=True, metavar="CONSUMER", type=click.Choice(CONSUMER_NAMES),
              help="a consumer to check for (repeatable; default: every one): " + ", ".join(CONSUMER_NAMES))
@json_opt
def check_cmd(onnx, consumers, as_json):
    """Will Unity, Barracuda, Sentis and Ascend load this ONNX? Each consumer's loader rules.

    A table of consumers (accepts or not), one line per rule that rejects the file (consumer, rule, what
    was found, what to do) and the way back for a torch dynamo export. Exit 1 if an asked-for consumer
    rejects it."""
    return check(onnx, consumers)


@click.command("act", cls=Command,
               short_help="Print deterministic actions for given observations.")
@source_arg
@options(obs_opt, rows_opt, seed_opt, device_opt, dtype_opt, runtime_opt, json_opt)
def act_cmd(source, obs, rows, seed, device, dtype, runtime, as_json):
    """Deterministic actions for --obs random --seed N, --obs zeros or an observation file."""
    return act(load_source(source), device, dtype, runtime, obs, rows, seed)


@click.command("sample", cls=Command,
               short_help="Print seeded stochastic actions, the same on every device.")
@source_arg
@options(obs_opt, rows_opt)
@click.option("--seed", default=0, show_default=True, type=int, help="noise seed (drawn on the CPU: the same on every device)")
@click.option("--obs-seed", default=0, show_default=True, type=int, help="seed of --obs random")
@options(device_opt, dtype_opt, runtime_opt, json_opt)
def sample_cmd(source, obs, rows, seed, obs_seed, device, dtype, runtime, as_json):
    """Stochastic actions for a seed, the same on every device (noise drawn on the CPU). An ONNX
    runs with its RandomNormalLike replaced by the same noise."""
    return sample(load_source(source), device, dtype, runtime, obs, rows, seed, obs_seed)


@click.command("batch-sizes", cls=Command,
               short_help="Time batch sizes and check that rows do not depend on them.")
@source_arg
@click.option("--sizes", default="16,32,64,128,256,512", show_default=True, help=f"comma-separated batch sizes, each {ROWS_RANGE}")
@click.option("--repeats", default=5, show_default=True, type=REPEATS,
              help=f"timed runs per size (median), {range_text(REPEATS)}")
@options(seed_opt, device_opt, dtype_opt, runtime_opt, json_opt)
def batch_sizes_cmd(source, sizes, repeats, seed, device, dtype, runtime, as_json):
    """Batch sizes 16..512 (not to be confused with converting a run directory, 'huggy-convert RUN_DIR
    OUT/'): time per size, and row i of every batch vs row i of the largest (float32 with canonical
    tensors: within the derived float32 bound; otherwise the dtype's tolerance; bitwise reported).
    Exit 1 when unstable."""
    try:
        ns = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--sizes {sizes[:40]!r} is not a comma-separated list of integers") from None
    if any(not 1 <= n <= MAX_ROWS for n in ns):
        raise InputError(f"--sizes {sizes[:40]!r}: each batch size is {ROWS_RANGE}")
    return batch_sizes(load_source(source), device, dtype, runtime, ns, seed, repeats)


@click.command("precision", cls=Command,
               short_help="Compare float32, float16 and bfloat16 on each device.")
@source_arg
@devices_opt
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(DTYPES),
              help="repeatable (default: float32, float16, bfloat16)")
@click.option("--rows", default=64, show_default=True, type=ROWS, help=f"probe rows, {ROWS_RANGE}")
@options(seed_opt, runtime_opt, json_opt)
def precision_cmd(source, devices, dtypes, rows, seed, runtime, as_json):
    """float32 / float16 / bfloat16 on each device against the CPU float32 reference (cosine,
    max abs). float32 and float16 over verify's tolerances fail (exit 1); bfloat16 over its
    threshold is reported as not-for-production."""
    return precision(load_source(source), list(devices) or None, list(dtypes) or DTYPES, rows, seed, runtime)


@click.command("onnx-compare", cls=Command,
               short_help="Compare ONNX files with the ONNX rebuilt from the policy.")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="SOURCE [ONNX]...")
@click.option("--rows", multiple=True, type=ROWS, help=f"probe batch sizes, {ROWS_RANGE}, repeatable (default 64)")
@click.option("--bitwise", is_flag=True, help="require bitwise equality on every float output (default: verify's rule, bitwise except "
              "where the divisors differ by 1 ulp by request: then the derived float32 bound)")
@click.option("--device", default="cpu", show_default=True, metavar="DEV", help="onnxruntime device (cpu, cuda EP)")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES), help="float32 only")
@options(seed_opt, json_opt)
def onnx_compare_cmd(inputs, rows, bitwise, device, dtype, seed, as_json):
    """Compare ONNX files with our reference: the ONNX rebuilt from the policy, both in
    onnxruntime on the same seeded probes; per-output stats. Give a policy (.pt/.safetensors)
    and ONNX files; a policy alone compares the official <stem>.onnx beside it; an ONNX alone is
    compared with the <stem>.pt beside it. Exit 1 when an output differs."""
    if dtype != "float32":
        raise DeviceError(f"--dtype {dtype} is not available for onnx-compare: ONNX files run in float32")
    return onnx_compare_paths(inputs, rows=list(rows) or [64], seed=seed, device=device, bitwise=bitwise)


@click.command("fingerprint", cls=Command,
               short_help="Hash seeded action sequences (verify's check 5).")
@source_arg
@click.option("--steps", multiple=True, type=STEPS, help=f"sequence lengths, {STEPS_RANGE}, repeatable (default 64 and 128)")
@click.option("--expect", multiple=True, metavar="SHA256", help="expected fingerprint(s), in --steps order, or "
              "their first 8+ hex digits as the verify tree prints them; exit 1 on a mismatch")
@options(seed_opt, device_opt, dtype_opt, runtime_opt, json_opt)
def fingerprint_cmd(source, steps, expect, seed, device, dtype, runtime, as_json):
    """sha256 of seeded 64- and 128-step deterministic action sequences (verify's check 5): the
    float64 reference's, the same on every host, with this host's runtime's beside it (run twice):
    exit 1 if that one changes between runs or the reference's differs from --expect."""
    return fingerprint(load_source(source), device, dtype, runtime, list(steps) or FINGERPRINT_STEPS, seed, list(expect))


@click.command("stats", cls=Command,
               short_help="Roll a policy out in a closed loop; summarise its actions.")
@source_arg
@click.option("--steps", default=256, show_default=True, type=STEPS, help=f"rollout length, {STEPS_RANGE}")
@click.option("--rows", default=8, show_default=True, type=ROWS, help=f"parallel rollouts, {ROWS_RANGE}")
@click.option("--stochastic", is_flag=True, help="sampled actions (noise seed = seed + 1 + t) instead of deterministic")
@options(seed_opt, device_opt, dtype_opt, runtime_opt, json_opt)
def stats_cmd(source, steps, rows, stochastic, seed, device, dtype, runtime, as_json):
    """Closed-loop rollout: per-dimension action statistics (mean, std, min, max, fraction at
    the +-1 clip) and whether the loop stays bounded (exit 1 if not).

    \b
    Surrogate dynamics, in normalized units u = (obs - mean) / D
    (mean, D = sqrt(running_variance / steps) of the normalizer; 0 and 1 without one):
      u_0     ~ N(0, I)
      obs_t   = mean + D * u_t
      a_t     = policy(obs_t)
      u_{t+1} = clip(0.9 * u_t + 0.5 * pad(clip(a_t, -1, 1)) + 0.1 * xi_t, -10, 10)
    pad tiles the action values over the observation width (discrete choice k of n
    -> 2k/(n-1) - 1); xi_t ~ N(0, I); all draws from numpy default_rng(seed).
    Bounded: every action finite and |u| never reaches 10."""
    if steps < 1 or rows < 1:
        raise InputError("--steps and --rows must be at least 1")
    return rollout(load_source(source), device, dtype, runtime, steps, rows, seed, stochastic)


@click.command("benchmark", cls=Command,
               short_help="Measure load time, latency and RAM use per device, runtime.")
@source_arg
@devices_opt
@click.option("--runtime", "runtimes", multiple=True, type=click.Choice(("torch", "onnxruntime")),
              help="repeatable (default: both)")
@click.option("--batch", "batches", multiple=True, type=ROWS,
              help=f"batch sizes, {ROWS_RANGE}, repeatable (default 1 and 64)")
@click.option("--warmup", default=10, show_default=True, type=WARMUP, help=f"untimed runs first, {range_text(WARMUP)}")
@click.option("--iters", default=100, show_default=True, type=ITERS, help=f"timed runs, {range_text(ITERS)}")
@click.option("--threads", default=1, show_default=True, type=THREADS,
              help=f"intra-op threads of torch and onnxruntime alike, {range_text(THREADS)}")
@click.option("--targets", type=TargetList(deploy_only=True), default=None,
              help="deploy targets timed beside them on the CPU (float32, the same threads), comma-separated: "
                   "openvino, litert, executorch (each an optional extra: docs/targets.md)")
@options(dtype_opt, seed_opt, json_opt)
def benchmark_cmd(source, devices, runtimes, batches, warmup, iters, threads, targets, dtype, seed, as_json):
    """Load time, warm-up, then mean / p50 / p95 / p99 latency and memory (RSS delta; CUDA:
    torch.cuda.max_memory_allocated) per device and runtime."""
    timed = (list(runtimes) or list(ALL)) + list(targets.extra if targets else ())
    return benchmark(source, list(devices) or None, timed, list(batches) or (1, 64),
                     Timing(dtype, warmup, iters, seed, threads))


@click.command("export", cls=Command,
               short_help="Write an ONNX at another opset and verify it.")
@source_arg
@click.argument("out_dir", required=False, type=click.Path(path_type=Path), metavar="[OUT/]")
@click.option("--opset", type=OPSET, default=C.ONNX_OPSET_DEFAULT, show_default=True, help=OPSET_HELP)
@target_opt
@click.option("--out", "-o", type=click.Path(path_type=Path), help="output file (default OUT/<stem>.opset<N>.onnx; "
              "without OUT/, beside the .safetensors of a set convert wrote)")
@click.option("--noise-input", is_flag=True, help="RandomNormalLike as the input 'epsilon' (reproducible sampling)")
@click.option("--rows", default=64, show_default=True, type=ROWS,
              help=f"probe rows for the reference check, {ROWS_RANGE}")
@click.option("--reference", type=click.Path(path_type=Path), help="official ONNX to verify against "
              "(default: <stem>.onnx beside a checkpoint)")
@options(seed_opt, device_opt, dtype_opt, json_opt)
def export_cmd(source, out_dir, opset, target, out, noise_input, rows, reference, seed, device, dtype, as_json):
    """Write an ONNX at --opset, check it with onnx.checker (full_check) and verify it as a conversion
    does: against the official ONNX (beside a checkpoint, or --reference) through verify's checks 2
    and 3, else against the opset-9 rebuild (bitwise in onnxruntime). An ONNX input is read back into its
    policy first, so any opset of --opset can be written from it too; only an ONNX whose tensors could
    not be recovered is written at its own opset alone (another: exit 2)."""
    opset = targeted_opset(target, opset)
    return export(load_source(source), opset, out, ExportOptions(noise_input, device, dtype, rows, seed, reference, target, out_dir))


@click.command("matrix", cls=Command,
               short_help="Run the numbered test matrix on a checkpoint or run dir.")
@click.argument("source", required=False, type=click.Path(path_type=Path), metavar="[CKPT|RUN_DIR]")
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("huggy-matrix"), show_default=True,
              help="folder for matrix.log, matrix.json and the files the cases write")
@click.option("--quick", is_flag=True, help="only the cases that take seconds (latency-heavy ones are SKIPPED)")
@click.option("--fixtures", type=click.Path(path_type=Path),
              help="instead of CKPT|RUN_DIR: a fixtures folder laid out as the bundled one (huggy/, variants/)")
@click.option("--only", multiple=True, metavar="N", help="run only these groups or cases (e.g. 2, 6.1); repeatable")
@click.option("--list", "list_only", is_flag=True, help="print the numbered listing without running it")
@json_opt
def matrix_cmd(source, out, quick, fixtures, only, list_only, as_json):
    """The numbered test matrix on a checkpoint or run directory: 10 groups, every case one line with
    its number, the equivalent huggy-convert command, figures and a verdict (PASS / FAIL / SKIP). Cases
    that need what the input lacks (its official ONNX, an older checkpoint, an LSTM or discrete policy,
    an accelerator) SKIP and say why. Seeded: two runs print the same figures (latencies are in a
    separate column). Without CKPT|RUN_DIR, in a source checkout: the bundled fixtures (Huggy and the
    variants). Writes OUT/matrix.log and OUT/matrix.json. Exit 0 when no case fails, 1 otherwise."""
    if list_only:
        cases = list_cases(fixtures, out, source)
        r = ModeResult("matrix-list", data={"cases": cases, "count": len(cases),
                                            "groups": len({c["group"] for c in cases})})
        r.lines = [f"{c['number']:<5} {c['title']}  [{c['command']}]"
                   + (f"  (needs {c['needs']})" if c["needs"] else "") + ("" if c["quick"] else "  (not in --quick)")
                   for c in cases] + [f"{len(cases)} cases in {r.data['groups']} groups"]
        return r
    return run_matrix(out, quick=quick, source=source, fixtures=fixtures, only=list(only),
                      echo=None if as_json else click.echo)


for _cmd in (act_cmd, sample_cmd, batch_sizes_cmd, precision_cmd, fingerprint_cmd, stats_cmd, benchmark_cmd, export_cmd):
    _cmd.help = inspect.cleandoc(_cmd.help or "") + "\n\n" + SOURCE_HELP

COMMANDS = (info_cmd, check_cmd, act_cmd, sample_cmd, batch_sizes_cmd, precision_cmd, onnx_compare_cmd, fingerprint_cmd, stats_cmd,
            benchmark_cmd, export_cmd, matrix_cmd)
