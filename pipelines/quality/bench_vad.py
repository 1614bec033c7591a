"""Measure the voice-activity detectors on a small labelled set: ``python -m pipelines.quality.bench_vad``.

Speech: the speech-real clips and the first speech-synth clips. Non-speech, made with numpy at 16 kHz:
digital silence, white noise (0.005, 0.05, 0.2 standard deviation), pink and brown noise, slowly pulsing
sine tones, 50 and 60 Hz hum, clicks. Gaps: a real clip, 10 s of noise (or silence), another real clip.
Per file and detector: speech found (yes/no), seconds of speech found (and inside the gap, for the gap
files), and the detector's time per minute of audio. ``--write DIR`` also writes the files there as wav,
to run ``tandem transcribe`` on them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ..asr.vad import energy_regions, silero_regions
from ..audio import SAMPLE_RATE, load_audio, write_wav
from .sets import read_manifest

SR = SAMPLE_RATE
DETECTORS = {"energy": energy_regions, "silero": silero_regions}


def coloured_noise(seconds: float, exponent: float, rng: np.random.Generator, rms: float = 0.05) -> np.ndarray:
    """Noise with power ~ 1/f**exponent (1: pink, 2: brown), scaled to ``rms``."""
    spectrum = np.fft.rfft(rng.standard_normal(int(seconds * SR)))
    freqs = np.fft.rfftfreq(int(seconds * SR), 1 / SR)
    spectrum[1:] /= freqs[1:] ** (exponent / 2)
    spectrum[0] = 0
    noise = np.fft.irfft(spectrum, int(seconds * SR))
    return rms * noise / np.sqrt(np.mean(noise ** 2))


def non_speech(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The non-speech files, by name (float32, 16 kHz, within [-1, 1])."""
    t = np.arange(12 * SR) / SR
    clicks = np.zeros(8 * SR)
    clicks[:: SR // 2] = 0.5
    cases = {
        "silence-10s": np.zeros(10 * SR),
        "white-0.005": 0.005 * rng.standard_normal(8 * SR),
        "white-0.05": 0.05 * rng.standard_normal(8 * SR),
        "white-0.2": 0.2 * rng.standard_normal(8 * SR),
        "pink-0.05": coloured_noise(8, 1, rng),
        "brown-0.05": coloured_noise(8, 2, rng),
        "tones-12s": 0.3 * np.sin(2 * np.pi * 440 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 0.5 * t)),
        "hum-50hz": 0.05 * (np.sin(2 * np.pi * 50 * t[: 8 * SR]) + 0.3 * np.sin(2 * np.pi * 150 * t[: 8 * SR])),
        "hum-60hz": 0.05 * (np.sin(2 * np.pi * 60 * t[: 8 * SR]) + 0.3 * np.sin(2 * np.pi * 180 * t[: 8 * SR])),
        "clicks": clicks,
    }
    return {name: np.clip(a, -1, 1).astype(np.float32) for name, a in cases.items()}


def manifest_clips(name: str, limit: int | None = None) -> dict[str, np.ndarray]:
    """The clips of an evaluation set (``tandem data build NAME``), by id."""
    return {item["id"]: load_audio(item["audio_path"]) for item in read_manifest(name)[:limit]}


def gaps(real: dict[str, np.ndarray], rng: np.random.Generator, seconds: int = 10) -> dict[str, tuple[np.ndarray, int, int]]:
    """The first two clips of ``real`` with ``seconds`` of noise (or silence) between them: (audio, gap start,
    gap end in samples) by name."""
    first, second = list(real.values())[:2]
    out = {}
    for name, gap in (("gap-white-0.05", 0.05 * rng.standard_normal(seconds * SR)), ("gap-silence", np.zeros(seconds * SR))):
        audio = np.concatenate([first, gap, second]).astype(np.float32)
        out[name] = (audio, len(first), len(first) + len(gap))
    return out


def overlap(regions: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Samples of ``regions`` inside [lo, hi)."""
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in regions)


def measure(files: dict[str, tuple[str, np.ndarray, int, int]]) -> list[dict]:
    """Each detector on each file (kind, audio, gap start, gap end): a row per file and detector."""
    rows = []
    for detector, find in DETECTORS.items():
        find(np.zeros(SR, dtype=np.float32))  # load the model outside the timing
        for name, (kind, audio, lo, hi) in files.items():
            t0 = time.perf_counter()
            regions = find(audio)
            seconds = time.perf_counter() - t0
            found = overlap(regions, 0, len(audio))
            rows.append({"file": name, "kind": kind, "detector": detector, "duration": len(audio) / SR,
                         "speech": found > 0, "speech_s": found / SR, "in_gap_s": overlap(regions, lo, hi) / SR,
                         "time_s": seconds})
    return rows


def summary(rows: list[dict]) -> str:
    """A markdown table per detector: false positives on non-speech, misses on speech, gap seconds, speed."""
    lines = ["| detector | non-speech files with speech found | speech s found in non-speech | speech clips missed "
             "| speech s found / clip s | s found inside the 10 s gaps | ms per audio minute |",
             "|---|---|---|---|---|---|---|"]
    for det in DETECTORS:
        mine = [r for r in rows if r["detector"] == det]
        noise = [r for r in mine if r["kind"] == "non-speech"]
        speech = [r for r in mine if r["kind"] == "speech"]
        gap = [r for r in mine if r["kind"] == "gap"]
        ms = 1000 * sum(r["time_s"] for r in mine) / (sum(r["duration"] for r in mine) / 60)
        lines.append(f"| {det} | {sum(r['speech'] for r in noise)}/{len(noise)} "
                     f"| {sum(r['speech_s'] for r in noise):.1f} of {sum(r['duration'] for r in noise):.0f} "
                     f"| {sum(not r['speech'] for r in speech)}/{len(speech)} "
                     f"| {sum(r['speech_s'] for r in speech):.1f} / {sum(r['duration'] for r in speech):.1f} "
                     f"| {', '.join('%.1f' % r['in_gap_s'] for r in gap)} | {ms:.1f} |")
    return "\n".join(lines)


def build_files(synth: int) -> dict[str, tuple[str, np.ndarray, int, int]]:
    """The labelled set: name -> (kind, audio, gap start, gap end); kind is speech, non-speech or gap."""
    rng = np.random.default_rng(0)
    real = manifest_clips("speech-real")
    files = {k: ("speech", a, 0, 0) for k, a in {**real, **manifest_clips("speech-synth", synth)}.items()}
    files |= {k: ("non-speech", a, 0, len(a)) for k, a in non_speech(rng).items()}
    files |= {k: ("gap", a, lo, hi) for k, (a, lo, hi) in gaps(real, rng).items()}
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.quality.bench_vad", description=__doc__.split("\n")[0])
    parser.add_argument("--synth", type=int, default=10, help="speech-synth clips to include (default: 10)")
    parser.add_argument("--write", metavar="DIR", help="also write the non-speech and gap files here (wav)")
    parser.add_argument("--json", metavar="FILE", help="write the per-file rows here")
    args = parser.parse_args(argv)
    files = build_files(args.synth)
    rows = measure(files)
    for r in rows:
        print(f"{r['detector']:7} {r['kind']:10} {r['file'][:44]:44} {r['duration']:6.2f}s speech={r['speech']!s:5} "
              f"{r['speech_s']:6.2f}s gap={r['in_gap_s']:5.2f}s {1000 * r['time_s']:7.1f} ms")
    print(summary(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.write:
        Path(args.write).mkdir(parents=True, exist_ok=True)
        for name, (kind, audio, _, _) in files.items():
            if kind != "speech":
                write_wav(Path(args.write) / f"{name}.wav", audio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
