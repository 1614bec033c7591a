"""The benchmarks' CPU peers for speech: whisper.cpp (through pywhispercpp) beside ``tandem bench asr --peers``,
on the same Whisper weights, the same files, greedy, with torch's thread count.

The peer's model is prepared once into the Tandem cache (``models/<name>-ggml-<precision>/ggml-model.bin``,
stamped like every converted model): the embedded Whisper's transformers folder written as a whisper.cpp file
by whisper.cpp's own converter (``ggml_whisper.write_ggml``), in float16 (``f16``, what whisper.cpp's download
script serves) and ``q8_0`` (its quantize tool's 8-bit blocks, what its users pick on a CPU).

A peer that cannot run here (its package is absent, the pair's model is not one it can read, the conversion
fails) raises ``PeerUnavailable``; the benchmark prints its one-line reason and leaves its rows out. Install
the peers with ``pip install -e '.[bench-peers]'``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..errors import TandemError

EXTRA = "pip install -e '.[bench-peers]'"
ASR_PEERS = ("whispercpp", "openvino")
TEXT_PEERS = ("llamacpp", "openvino")
WHISPERCPP_PRECISIONS = ("f16", "q8_0")
GGML_FILE = "ggml-model.bin"
# Why OpenVINO has no rows: its exporter (optimum-intel 2.2.0, the newest) requires transformers<5.6 and a
# torch it would replace with a CUDA build; Tandem pins transformers 5.24.0 and a CPU torch.
OPENVINO_REASON = ("no OpenVINO IR can be made from the same weights here: its exporter optimum-intel (2.2.0) "
                   "requires transformers<5.6 (Tandem pins 5.24.0) and would replace the CPU torch")

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
    systems = {}
    for precision in WHISPERCPP_PRECISIONS:
        try:
            path = ggml_whisper_file(main.id, precision)
        except PeerUnavailable as err:
            if precision == WHISPERCPP_PRECISIONS[0]:
                raise
            log(f"whisper.cpp {precision}: no row: {err}")
            continue
        model = Model(str(path), n_threads=threads, print_progress=False, print_realtime=False,
                      redirect_whispercpp_logs_to=None)
        run = _whispercpp_transcriber(model)
        run([warm_path])
        systems[f"whisper.cpp {precision}"] = run
    return systems


def gather_peers(peers: tuple[str, ...], adapters: dict[str, Callable[[], dict]], log=print) -> dict:
    """Every peer's systems (name -> run), from ``adapters[peer]()``; a peer without an adapter is OpenVINO
    (``OPENVINO_REASON``). A peer that cannot run is one logged line ``<peer>: no row: <reason>``."""
    systems: dict = {}
    for peer in peers:
        try:
            if peer not in adapters:
                raise PeerUnavailable(OPENVINO_REASON)
            started = time.perf_counter()
            systems.update(adapters[peer]())
            log(f"  {peer}: models ready in {time.perf_counter() - started:.1f} s (not counted)")
        except PeerUnavailable as err:
            log(f"{peer}: no row: {err}")
    return systems


def asr_peer_systems(peers: tuple[str, ...], main, threads: int, warm_path: str, log=print) -> dict[str, Transcriber]:
    """The speech peers' systems (name -> transcribe), loaded and warmed up (``gather_peers``)."""
    return gather_peers(peers, {"whispercpp": lambda: whispercpp_systems(main, threads, warm_path, log)}, log)
