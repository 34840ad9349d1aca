"""The CLI's command class (the one guard), click types and option groups shared by the commands."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple, Optional, Tuple

import click

from .. import contract as C
from ..conformance.target import target_opset
from ..contract import targets as T
from ..console import step
from ..contract.consumers import TARGETS_BY_NAME
from ..errors import InputError, as_error
from ..modes.sources import DTYPES
from ..verify import VerifyOptions, parse_overrides
from . import render

MAX_ROWS = 1 << 16  # rows of generated observations: Huggy's 512-wide body takes ~130 MB per layer at this bound
ROWS = click.IntRange(1, MAX_ROWS)
STEPS = click.IntRange(1, 1 << 20)
JOBS = click.IntRange(0, 256)
OPSET = click.IntRange(C.ONNX_OPSETS[0], C.ONNX_OPSETS[-1])
REPEATS = click.IntRange(1, 1 << 16)
WARMUP = click.IntRange(0, 1 << 20)
ITERS = click.IntRange(1, 1 << 20)
THREADS = click.IntRange(1, 256)
GLOBAL_STEP = click.IntRange(0, 2 ** 63 - 1)


def range_text(t: click.IntRange) -> str:
    """An integer option's accepted range as its help states it: ``9..15`` (``2^63-1`` for int64's top).
    tests/test_cli_surface.py reads it back from every help and compares it with the option's type."""
    hi = "2^63-1" if t.max == 2 ** 63 - 1 else str(t.max)
    return f"{t.min}..{hi}"


JOBS_RANGE, ROWS_RANGE, STEPS_RANGE = range_text(JOBS), range_text(ROWS), range_text(STEPS)
OPSET_HELP = (f"ONNX opset written, {range_text(OPSET)}; where runtimes take an ONNX: {C.opset_story()}")


class OneLineUsageError(click.UsageError):
    """A usage error shown as the README promises: one line ``huggy-convert: error: <reason>``."""

    def show(self, file=None) -> None:
        render.usage_error(self.format_message())


class JsonUsageError(OneLineUsageError):
    """The same, for a command given ``--json``: its envelope on stdout too (``ok`` false, exit code 2)."""

    def show(self, file=None) -> None:
        super().show(file)
        render.json_error(self.ctx.command.name if self.ctx else "", self.format_message(), self.exit_code)


class Command(click.Command):
    """Every command's class, and the one guard: a bad option (``--rows 1e9``) ends in one line, exit 2;
    the command's body returns its exit code, or a mode's result that is rendered (text or ``--json``)
    and gives it; any error it raises becomes one line and its exit code (``render.fail``): a
    ``HuggyError`` as it is, a foreign failure through ``errors.from_foreign`` (an ``OSError`` names its
    path, else the command's ``subject`` argument; a bug is exit 3), Ctrl-C "interrupted", exit 130."""

    def __init__(self, *args, subject: Optional[str] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.subject = subject

    def parse_args(self, ctx, args):
        as_json = "--json" in args  # before click's parser consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            cls = JsonUsageError if as_json and "as_json" in {p.name for p in self.params} else OneLineUsageError
            raise cls(exc.format_message(), ctx) from None

    def invoke(self, ctx):
        as_json = bool(ctx.params.get("as_json"))
        name = ctx.command.name
        step(f"running {name}")  # a terminal: the step under way (a command may name a finer one)
        try:
            result = super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit):
            raise
        except (KeyboardInterrupt, click.exceptions.Abort):  # Ctrl-C: one line, and not exit 1 (a verdict)
            render.interrupted(as_json, name)
        except Exception as e:  # noqa: BLE001 - the one place foreign failures become typed errors
            subject = ctx.params.get(self.subject) if self.subject else None
            render.fail(as_error(e, subject), as_json, name)
        sys.exit(render.outcome(result, as_json, name))


def parse_obs_sizes(text: str):
    """``--obs-sizes``: comma-separated widths (``8,5``), a camera as ``CxHxW`` (``3x84x84,6``)."""
    out = []
    for part in text.split(","):
        try:
            dims = tuple(int(d) for d in part.strip().lower().split("x"))
        except ValueError:
            raise InputError(f"--obs-sizes '{text}' is not a comma-separated list of widths or CxHxW shapes") from None
        if len(dims) not in (1, 3) or min(dims) < 1:
            raise InputError(f"--obs-sizes '{text}': '{part}' is neither a width nor a CxHxW shape")
        out.append(dims[0] if len(dims) == 1 else dims)
    return out


class Targets(NamedTuple):
    """``--targets``: whether the ``.pt2`` is written, and the deploy targets written beside it."""

    program: bool = True
    extra: Tuple[str, ...] = ()


class TargetList(click.ParamType):
    """``--targets onnx,pt2,openvino,...``: a comma-separated list of ``contract.targets`` kinds (the ``.onnx``
    is written whether named or not: the verification reads it). ``deploy_only``: benchmark's (the deploy
    targets timed beside onnxruntime and torch, which are always timed)."""

    name = "LIST"

    def __init__(self, deploy_only: bool = False):
        self.known = T.TARGETS if deploy_only else T.CORE_TARGETS + T.TARGETS

    def convert(self, value, param, ctx):
        if isinstance(value, Targets):
            return value
        words = [w.strip().lower() for w in str(value).split(",") if w.strip()]
        bad = [w for w in words if w not in self.known]
        if bad or not words:
            self.fail(f"{', '.join(bad) or 'nothing'}: not a target (choose from {', '.join(self.known)})", param, ctx)
        return Targets("pt2" in words, tuple(t for t in T.TARGETS if t in words))


TARGETS_HELP = (f"what to write beside the .safetensors, comma-separated: {', '.join(T.CORE_TARGETS + T.TARGETS)} "
                "(the .onnx always: verification reads it; each deploy target is an optional extra, "
                "pip install 'huggy-convert[openvino]', ...: docs/targets.md)")
targets_option = click.option("--targets", type=TargetList(), default=",".join(T.DEFAULT_TARGETS),
                              show_default=True, help=TARGETS_HELP)


def verify_options(atol, rtol, cosine, devices, dtypes, rows=64, seed=0):
    return VerifyOptions(rows=rows, seed=seed, devices=list(devices) or None, dtypes=tuple(dtypes),
                         atol=parse_overrides(atol), rtol=parse_overrides(rtol), cosine=parse_overrides(cosine))


def options(*decorators):
    """Several click decorators as one (an option group)."""
    def deco(f):
        for d in reversed(decorators):
            f = d(f)
        return f
    return deco


tolerance_options = options(
    click.option("--atol", multiple=True, metavar="[OUTPUT:]TOL",
                 help="absolute tolerance for module checks, per output (Polygraphy style), in place of the "
                      "derived float32 bound for that output (fp16/bf16: of their thresholds); repeatable. "
                      "OUTPUT: an output of the policy (of one of them, over several), else exit 2 before "
                      "anything is written; * or none: every output"),
    click.option("--rtol", multiple=True, metavar="[OUTPUT:]TOL",
                 help="relative tolerance: an element fails only past both atol and rtol (with --atol: "
                      "an --atol override alone means absolute only)"),
    click.option("--cosine", multiple=True, metavar="[OUTPUT:]MIN", help="minimum cosine similarity, per output"),
    click.option("--verify-device", "devices", multiple=True, metavar="DEV",
                 help="devices to verify on (default: every device present: cpu, cuda:i, npu:i)"),
    click.option("--verify-dtype", "dtypes", multiple=True, default=("float32", "float16", "bfloat16"),
                 show_default=True, type=click.Choice(["float32", "float16", "bfloat16"])),
)

DEVICE_HELP = "cpu, cuda[:i], npu[:i] or auto (npu, then cuda, then cpu)"
RUNTIMES = ("auto", "torch", "onnxruntime")
SOURCE_HELP = ("SOURCE: a .pt checkpoint, a .safetensors policy, an .onnx model, a Stable-Baselines3 model .zip or a "
               "run directory (newest checkpoint).")

source_arg = click.argument("source", type=click.Path(path_type=Path), metavar="SOURCE")
device_opt = click.option("--device", default="cpu", show_default=True, metavar="DEV", help=DEVICE_HELP)
devices_opt = click.option("--device", "devices", multiple=True, metavar="DEV",
                           help=f"{DEVICE_HELP}; repeatable (default: every device present)")
dtype_opt = click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES),
                         help="weights dtype of the torch module (an ONNX runs in float32 only)")
runtime_opt = click.option("--runtime", default="auto", show_default=True, type=click.Choice(RUNTIMES),
                           help="auto: torch eager for .pt/.safetensors, onnxruntime for .onnx; onnxruntime on a "
                                "policy runs the ONNX rebuilt from it")
target_opt = click.option(
    "--target", type=click.Choice(list(TARGETS_BY_NAME)), default=None,
    help="what the ONNX is for: " + "; ".join(f"{t.name} = {t.help}" for t in TARGETS_BY_NAME.values())
         + ". It picks the opset (unless --opset is given within its consumers' window), checks the file written "
           "against its consumers' rules (huggy-convert check; exit 1 if one rejects it), and for Ascend prints the "
           "atc command of that CANN and writes its --keep_dtype file beside the model.")


def targeted_opset(target, opset: int) -> int:
    """The opset a command writes: ``opset`` as given, or, with ``--target`` and no ``--opset`` on the
    command line, the target's own (``conformance.target.target_opset``)."""
    if not target:
        return opset
    given = click.get_current_context().get_parameter_source("opset") == click.core.ParameterSource.COMMANDLINE
    return target_opset(target, opset if given else None)


json_opt = click.option("--json", "as_json", is_flag=True, help="machine-readable output on stdout: one JSON "
                        "object, its schema huggy-convert/<command>/1 (huggy_convert/schemas/<command>.json)")
# how much a command prints: -q the verdict only, -v everything (the full tree, the Ascend ATC advice)
verbosity_opts = options(
    click.option("--quiet", "-q", "quiet", is_flag=True, help="print the verdict line only"),
    click.option("--verbose", "-v", "verbose", is_flag=True,
                 help="print everything: the full verification tree, the notes and the Ascend ATC advice"),
)
seed_opt = click.option("--seed", default=0, show_default=True, type=int, help="seed of the generated inputs")
obs_opt = click.option("--obs", default="random", show_default=True, metavar="random|zeros|probes|FILE",
                       help="random: seeded, at the normalizer's scale; zeros; probes: verify's probes; or a file: "
                            ".npy (rows x obs width), .npz / .json object by input name ("
                            f"{C.OBS_INPUT.format(i=0)}, {C.OBS_INPUT.format(i=1)}, ...: the inputs 'info' lists), "
                            ".json list of rows")
rows_opt = click.option("--rows", default=1, show_default=True, type=ROWS,
                        help=f"rows of generated observations, {ROWS_RANGE}")
