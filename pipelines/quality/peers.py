"""The benchmarks' CPU peers for speech: whisper.cpp (through pywhispercpp) and OpenVINO GenAI's WhisperPipeline
beside ``tandem bench asr --peers``, on the same Whisper weights, the same files, greedy, with torch's thread count.

The peer's model is prepared once into the Tandem cache (``models/<name>-ggml-<precision>/ggml-model.bin``,
stamped like every converted model): the embedded Whisper's transformers folder written as a whisper.cpp file
by whisper.cpp's own converter (``ggml_whisper.write_ggml``), in float16 (``f16``, what whisper.cpp's download
script serves) and ``q8_0`` (its quantize tool's 8-bit blocks, what its users pick on a CPU).

OpenVINO's models are IR folders (``models/<name>-ov-<format>/``) exported from the same transformers folders by
``optimum-cli export openvino`` (``ov_ir_folder``). Its exporter, optimum-intel, requires transformers<5.6 where
Tandem pins a newer one, so it runs in a venv of its own under the cache (``venvs/ov-export``, made on first use
with ``OV_EXPORT_PINS``: the CPU torch, no CUDA); only the runtime (openvino, openvino-genai and the
openvino-tokenizers its tokenizer IR needs, all wheels) is in the ``bench-peers`` extra.

A peer that cannot run here (its package is absent, the pair's model is not one it can read, the conversion
fails) raises ``PeerUnavailable``; the benchmark prints its one-line reason and leaves its rows out. Install
the peers with ``pip install -e '.[bench-peers]'``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError

EXTRA = "pip install -e '.[bench-peers]'"
ASR_PEERS = ("whispercpp", "openvino")
TEXT_PEERS = ("llamacpp", "openvino")
WHISPERCPP_PRECISIONS = ("f16", "q8_0")
GGML_FILE = "ggml-model.bin"


@dataclass(frozen=True)
class OvWhisperRow:
    """One OpenVINO speech row: the IR's weight format (optimum-cli's ``--weight-format``) and the CPU plugin's
    ``INFERENCE_PRECISION_HINT`` (None: the plugin's default)."""

    weight_format: str
    hint: str | None


# OpenVINO's rows by name. The plugin's default computes in bfloat16 on a CPU with native bf16 (AVX-512 BF16,
# AMX) even for an fp32 IR ("bf16" here: ``ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")``), so the
# fp32 row asks for f32 and the bf16 row is the fp32 IR at bf16; int8 (weights) keeps the default for its
# activations.
OPENVINO_WHISPER_ROWS = {"fp32": OvWhisperRow("fp32", "f32"), "bf16": OvWhisperRow("fp32", "bf16"),
                         "int8": OvWhisperRow("int8", None)}
# The IR formats the rows read (each exported once), in the rows' order: ("fp32", "int8").
OPENVINO_WHISPER_FORMATS = tuple(dict.fromkeys(row.weight_format for row in OPENVINO_WHISPER_ROWS.values()))
OV_ASR_TASK, OV_TEXT_TASK = "automatic-speech-recognition-with-past", "text-generation-with-past"  # its --task
# The export venv: optimum-intel 2.2.0 needs transformers<5.6; torch pinned to the CPU build (a local wheel in
# PIP_FIND_LINKS here) so pip does not pull CUDA's; openvino and its tokenizers equal to the runtime's.
OV_EXPORT_PINS = ("torch==2.13.0+cpu", "torchvision==0.28.0", "transformers==5.5.4", "optimum==2.3.0",
                  "optimum-intel==2.2.0", "nncf==3.4.0", "openvino==2026.4.1", "openvino-tokenizers==2026.4.1.0")
# optimum-intel requires torchvision, but PyPI's is built for CUDA's torch: beside the CPU torch its import fails
# ("operator torchvision::nms does not exist") and with it transformers' PreTrainedModel. Pinned (so pip keeps
# torch 2.13.0), then removed: transformers and the text and speech exports run without it.
OV_EXPORT_REMOVED = ("torchvision",)
OV_TOKENIZER_FILES = ("openvino_tokenizer.xml", "openvino_detokenizer.xml")  # what openvino-genai reads

Transcriber = Callable[[list[str]], list[str]]  # audio paths -> one transcript each


class PeerUnavailable(TandemError, RuntimeError):
    """A benchmark peer cannot run here; the message is the reason, one line."""


def parse_peers(text: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """``"whispercpp,openvino"`` -> ``("whispercpp", "openvino")``. Raises ``TandemError`` on a name not in
    ``known`` (before any model loads)."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise TandemError(f"{', '.join(unknown) or 'nothing named'}: choose from {', '.join(known)}")
    return names


def ggml_whisper_file(name: str, precision: str) -> Path:
    """The whisper.cpp model file of embedded Whisper ``name`` in ``precision`` (f16, f32, q8_0, q5_1), written
    from its transformers folder on first use and cached. Raises ``PeerUnavailable`` when ``name`` is not an
    embedded Whisper or the conversion fails (q8_0 / q5_1 need pywhispercpp's libggml)."""
    from .. import paths
    from ..models.cache import build_into, is_complete
    from ..models.embedded import WHISPER, embedded_path
    from .ggml_whisper import write_ggml

    if name not in WHISPER:
        raise PeerUnavailable(f"{name} is not an embedded Whisper: whisper.cpp's converter runs on those only")
    final = paths.models_dir() / f"{name}-ggml-{precision}"
    source = f"{WHISPER[name].sha256}:ggml-{precision}"
    if not is_complete(final, source, GGML_FILE):
        folder = embedded_path(name)
        try:
            build_into(final, lambda tmp: write_ggml(folder, tmp / GGML_FILE, precision), source, GGML_FILE)
        except (OSError, KeyError, ValueError) as err:
            raise PeerUnavailable(f"converting {name} to ggml {precision} failed: {type(err).__name__}: {err}") from err
    return final / GGML_FILE


def _whispercpp_transcriber(model) -> Transcriber:
    """whisper.cpp greedy on Tandem's decoded audio (16 kHz mono float32): temperature 0 without fallback,
    best of 1, English, no conditioning on the previous window, non-speech tokens suppressed (Whisper's
    ``suppress_tokens=-1``, as Tandem and faster-whisper do); the segments' texts joined by spaces."""
    from ..audio import load_audio

    def run(paths: list[str]) -> list[str]:
        out = []
        for p in paths:
            segments = model.transcribe(load_audio(p), language="en", temperature=0.0, temperature_inc=0.0,
                                        greedy={"best_of": 1}, no_context=True, suppress_nst=True)
            out.append(" ".join(s.text.strip() for s in segments).strip())
        return out

    return run


def whispercpp_systems(main, threads: int, warm_path: str, log=print) -> dict[str, Transcriber]:
    """``{"whisper.cpp f16": transcribe, "whisper.cpp q8_0": transcribe}`` for the pair's main model ``main``
    (a ``ModelRef``), each model loaded with ``threads`` threads and run once on ``warm_path`` (so the timed
    runs exclude loading). A precision that cannot be converted is logged with its reason and left out; the
    whole peer raises ``PeerUnavailable`` when pywhispercpp is absent or ``main`` is not an embedded Whisper."""
    try:
        from pywhispercpp.model import Model
    except ImportError:
        raise PeerUnavailable(f"pywhispercpp is not installed ({EXTRA})") from None
    if main.source != "embedded":
        raise PeerUnavailable(f"the pair's main model is {main}, not an embedded Whisper the converter reads")

    def load(precision: str) -> dict[str, Transcriber]:
        model = Model(str(ggml_whisper_file(main.id, precision)), n_threads=threads, print_progress=False,
                      print_realtime=False, redirect_whispercpp_logs_to=None)
        run = _whispercpp_transcriber(model)
        run([warm_path])
        return {f"whisper.cpp {precision}": run}

    return each_precision("whisper.cpp", WHISPERCPP_PRECISIONS, load, log)


def each_precision(peer: str, precisions: tuple[str, ...], load: Callable[[str], dict], log=print) -> dict:
    """``load(p)``'s systems for every precision ``p``, in order. The first precision's ``PeerUnavailable`` is
    the whole peer's; a later one's is one logged line ``<peer> <p>: no row: <reason>`` and no systems."""
    systems: dict = {}
    for precision in precisions:
        try:
            systems.update(load(precision))
        except PeerUnavailable as err:
            if precision == precisions[0]:
                raise
            log(f"{peer} {precision}: no row: {err}")
    return systems


def _run_step(what: str, command: list[str], env: dict[str, str] | None = None) -> None:
    """Run ``command`` to its end; a failure raises ``PeerUnavailable`` with ``what``, the exit status and the
    last line it printed."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    except OSError as err:
        raise PeerUnavailable(f"{what} failed: {type(err).__name__}: {err}") from err
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        raise PeerUnavailable(f"{what} failed (exit {done.returncode}): {lines[-1].strip()}")


def ov_export_bin(log=print) -> Path:
    """The ``bin`` folder of the OpenVINO export venv, ``<cache>/venvs/ov-export``: made on first use (minutes)
    with ``python -m venv``, ``pip install OV_EXPORT_PINS`` (pip's own index and find-links settings apply) and
    ``pip uninstall OV_EXPORT_REMOVED``, made again when its stamp lists other pins. Raises ``PeerUnavailable``
    when a step fails."""
    from .. import paths

    venv = paths.cache_root() / "venvs" / "ov-export"
    stamp = venv / "tandem-pins.txt"
    wanted = "\n".join(OV_EXPORT_PINS + tuple(f"-{r}" for r in OV_EXPORT_REMOVED)) + "\n"
    with paths.build_lock(venv):
        if not (stamp.is_file() and stamp.read_text() == wanted):
            log(f"  openvino: making the export venv {paths.display(venv)}: pip install {' '.join(OV_EXPORT_PINS)}")
            shutil.rmtree(venv, ignore_errors=True)
            _run_step("python -m venv", [sys.executable, "-m", "venv", str(venv)])
            pip = [str(venv / "bin" / "python"), "-m", "pip"]
            _run_step("pip install of the exporter", [*pip, "install", "--quiet", *OV_EXPORT_PINS])
            _run_step("pip uninstall of torchvision", [*pip, "uninstall", "--yes", "--quiet", *OV_EXPORT_REMOVED])
            stamp.write_text(wanted)
    return venv / "bin"


def _ov_target(name: str, source_sha: str, task: str, weight_format: str) -> tuple[Path, str, str]:
    """(folder, the source its stamp names, the weights file the stamp checks) of an OpenVINO export."""
    from .. import paths

    weights = "openvino_encoder_model.bin" if task == OV_ASR_TASK else "openvino_model.bin"
    stamped = f"{source_sha}:ov-{weight_format}:{' '.join(OV_EXPORT_PINS)}"
    return paths.models_dir() / f"{name}-ov-{weight_format}", stamped, weights


def ov_ir_is_cached(name: str, source_sha: str, task: str, weight_format: str) -> bool:
    """Whether ``ov_ir_folder`` would find its export complete in the cache (and so export nothing)."""
    from ..models.cache import is_complete

    return is_complete(*_ov_target(name, source_sha, task, weight_format))


def ov_ir_folder(name: str, source: Path, source_sha: str, task: str, weight_format: str, log=print) -> Path:
    """The OpenVINO IR folder of model ``name`` in ``weight_format`` (fp32, int8, int4), cached as
    ``models/<name>-ov-<format>``: on first use ``optimum-cli export openvino --task <task>`` in the export venv
    (offline) on ``source``, the transformers folder whose pinned checksum is ``source_sha``; the stamp names
    that checksum, the format and the exporter's pins. Raises ``PeerUnavailable`` when the venv or the export
    fails or the folder lacks the model or the tokenizer IR openvino-genai reads (``OV_TOKENIZER_FILES``)."""
    from ..models.cache import build_into

    final, stamped, weights = _ov_target(name, source_sha, task, weight_format)
    if ov_ir_is_cached(name, source_sha, task, weight_format):
        return final

    def export(tmp: Path) -> None:
        bin_dir = ov_export_bin(log)
        started = time.perf_counter()
        offline = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        _run_step(f"optimum-cli export of {name} ({weight_format})",
                  [str(bin_dir / "optimum-cli"), "export", "openvino", "--model", str(source), "--task", task,
                   "--weight-format", weight_format, str(tmp)], offline)
        missing = [f for f in (weights, *OV_TOKENIZER_FILES) if not (tmp / f).is_file()]
        if missing:
            raise PeerUnavailable(f"the OpenVINO export of {name} ({weight_format}) lacks {', '.join(missing)}")
        size = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file())
        log(f"  openvino: exported {name} {weight_format} in {time.perf_counter() - started:.0f} s "
            f"({size / 1e6:.0f} MB)")

    return build_into(final, export, stamped, weights)


def ov_pipeline(what: str, make: Callable[[], object]):
    """``make()``: an OpenVINO GenAI pipeline, loaded and compiled. Its ``RuntimeError`` (an IR or a device it
    cannot compile) raises ``PeerUnavailable`` with ``what`` and the error's first line."""
    try:
        return make()
    except RuntimeError as err:
        first = (str(err).strip() or type(err).__name__).splitlines()[0]
        raise PeerUnavailable(f"OpenVINO cannot load {what}: {first}") from err


def _openvino_transcriber(pipe) -> Transcriber:
    """OpenVINO GenAI's Whisper greedy (its only search here: one beam, no temperature fallback) on Tandem's
    decoded audio (16 kHz mono float32), English, transcribe, no timestamps asked (a file past 30 s is cut into
    windows by the pipeline, which then decodes them with timestamps); the text stripped."""
    from ..audio import load_audio

    config = pipe.get_generation_config()
    config.language, config.task, config.return_timestamps = "<|en|>", "transcribe", False

    def run(paths: list[str]) -> list[str]:
        return [pipe.generate(load_audio(p), config).texts[0].strip() for p in paths]

    return run


def openvino_asr_systems(main, threads: int, warm_path: str, log=print) -> dict[str, Transcriber]:
    """``{"OpenVINO fp32": transcribe, "OpenVINO bf16": ..., "OpenVINO int8": ...}`` (``OPENVINO_WHISPER_ROWS``):
    ``openvino_genai.WhisperPipeline`` on the IR of the pair's main model ``main`` (an embedded Whisper,
    ``ov_ir_folder``), on the CPU with ``threads`` inference threads and the row's inference precision, run once
    on ``warm_path``. Raises ``PeerUnavailable`` without openvino-genai or an embedded Whisper main model, or when
    the first row cannot be exported (a later one is logged)."""
    from ..models.embedded import WHISPER, embedded_path

    try:
        import openvino_genai
    except ImportError:
        raise PeerUnavailable(f"openvino-genai is not installed ({EXTRA})") from None
    if main.source != "embedded" or main.id not in WHISPER:
        raise PeerUnavailable(f"the pair's main model is {main}, not an embedded Whisper to export")

    def load(name: str) -> dict[str, Transcriber]:
        row = OPENVINO_WHISPER_ROWS[name]
        folder = ov_ir_folder(main.id, embedded_path(main.id), WHISPER[main.id].sha256, OV_ASR_TASK, row.weight_format,
                              log)
        precision = {} if row.hint is None else {"INFERENCE_PRECISION_HINT": row.hint}
        pipe = ov_pipeline(f"{main.id} {name}", lambda: openvino_genai.WhisperPipeline(
            str(folder), "CPU", INFERENCE_NUM_THREADS=threads, **precision))
        run = _openvino_transcriber(pipe)
        run([warm_path])
        return {f"OpenVINO {name}": run}

    return each_precision("OpenVINO", tuple(OPENVINO_WHISPER_ROWS), load, log)


def gather_peers(peers: tuple[str, ...], adapters: dict[str, Callable[[], dict]], log=print) -> dict:
    """Every peer's systems (name -> run), from ``adapters[peer]()``. A peer that cannot run is one logged line
    ``<peer>: no row: <reason>``."""
    systems: dict = {}
    for peer in peers:
        try:
            started = time.perf_counter()
            systems.update(adapters[peer]())
            log(f"  {peer}: models ready in {time.perf_counter() - started:.1f} s (not counted)")
        except PeerUnavailable as err:
            log(f"{peer}: no row: {err}")
    return systems


def asr_peer_systems(peers: tuple[str, ...], main, threads: int, warm_path: str, log=print) -> dict[str, Transcriber]:
    """The speech peers' systems (name -> transcribe), loaded and warmed up (``gather_peers``)."""
    return gather_peers(peers, {"whispercpp": lambda: whispercpp_systems(main, threads, warm_path, log),
                                "openvino": lambda: openvino_asr_systems(main, threads, warm_path, log)}, log)
