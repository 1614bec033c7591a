"""``tandem bench asr``: every ASR system on the same files in one run, one after the other: faster-whisper
(int8 and float32, sequential, and its batched pipeline on long files), transformers ``generate`` plain and
assisted, Tandem plain and assisted in each dtype asked (float32 and bfloat16 by default; int8 / int4: the
decoders' weights quantized, ``models/quantize.py``), and on long files Tandem's chunked long-form;
with ``peers`` also CPU peers on the same weights (``quality.peers``: whisper.cpp f16 and q8_0).
Wall time, real-time factor, speedup against transformers plain float32, WER, identical-output rate against
Tandem plain, tokens per main call."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from .bench import environment, write_report


@dataclass(frozen=True)
class AsrRow:
    set: str
    system: str
    files: int
    audio_s: float
    wall_s: float
    rtf: float  # wall / audio
    speedup: float  # vs transformers plain float32 on the same files
    wer: float
    identical: float | None  # share of files whose transcript equals the same main model's plain greedy (Tandem;
    # a peer's: Tandem plain's in the first dtype, sequential)
    tokens_per_call: float | None = None  # Tandem: tokens per main-model pass per sequence (accepted drafts + 1)


def _fw_model(compute_type: str, threads: int, warm_path: str, device: str = "cpu"):
    """faster-whisper on the very same base weights (their CTranslate2 folder), loaded and warmed up, on the
    CPU or on CUDA device N (``device`` "cuda:N")."""
    from faster_whisper import WhisperModel

    from ..models.embedded import ct2_folder

    kind, _, index = device.partition(":")
    model = WhisperModel(str(ct2_folder("whisper-base")), device=kind, device_index=int(index or 0),
                         compute_type=compute_type, cpu_threads=threads)
    list(model.transcribe(warm_path, language="en", beam_size=1)[0])
    return model


def _fw_transcribe(model, paths: list[str], batch_size: int | None = None) -> list[str]:
    """faster-whisper greedy: its sequential transcribe, or with ``batch_size`` its BatchedInferencePipeline
    (Silero VAD cuts the audio into chunks decoded together; timestamps on, like Tandem's chunked mode)."""
    from faster_whisper import BatchedInferencePipeline

    run, extra = model.transcribe, {}
    if batch_size:
        run, extra = BatchedInferencePipeline(model).transcribe, {"without_timestamps": False, "batch_size": batch_size}
    out = []
    for p in paths:
        segments, _ = run(p, language="en", beam_size=1, temperature=0.0, condition_on_previous_text=False, **extra)
        out.append(" ".join(s.text.strip() for s in segments).strip())
    return out


def _hf_transcribe(paths: list[str], runner, assistant) -> list[str]:
    """transformers' own generate (short-form, or its sequential long-form with timestamps)."""
    from ..asr import WINDOW
    from ..audio import SAMPLE_RATE, load_audio

    model, tok = runner.model, runner.tokenizer
    out = []
    for p in paths:
        audio = load_audio(p)
        long = len(audio) > WINDOW
        feats = runner.features(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", truncation=not long,
                                padding="longest" if long else "max_length", return_attention_mask=long)
        kwargs = dict(do_sample=False, num_beams=1, language="en", task="transcribe")
        if long:
            kwargs.update(attention_mask=feats.attention_mask.to(model.device), return_timestamps=True)
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        with torch.inference_mode():
            ids = model.generate(feats.input_features.to(model.device, model.dtype), **kwargs)
        ids = ids["sequences"] if isinstance(ids, dict) else ids
        out.append(tok.decode(ids[0], skip_special_tokens=True).strip())
    return out


def bench_asr(pair_name: str = "whisper-base", sets=("speech-real", "speech-synth", "speech-long"), limit: int = 60,
              batch_size: int = 8, json_path: str | None = None, log=print, chunk_batch: int = 8,
              device: str = "cpu", also: tuple[str, ...] = (),
              dtypes: tuple[str, ...] = ("float32", "bfloat16"), peers: tuple[str, ...] = ()) -> dict:
    """Every system on every set, one after the other in this process. On a set with files over 30 s, also
    the chunked long-form systems: faster-whisper's batched pipeline and Tandem's ``long_form="chunked"``,
    ``chunk_batch`` chunks at a time (their identical-output rate is against Tandem plain chunked). ``also``:
    pairs with the same main model and another assistant, whose Tandem assisted rows ("... [pair]") follow the
    pair's (RegistryError when a main model differs). ``dtypes``: the dtypes of the transformers and Tandem
    rows, as ``pairs.load_pair`` takes them (int8 / int4 too: transformers ``generate`` then runs the same
    quantized modules); speed-ups are against transformers plain in the first. ``peers``: ``peers.ASR_PEERS`` names
    whose rows follow faster-whisper's (model preparation and load not timed; one line instead where a peer
    cannot run here)."""
    from ..asr import TranscribeOptions, WhisperRunner, transcribe
    from ..models.registry import RegistryError, load_registry
    from .metrics import wer
    from .peers import asr_peer_systems
    from .sets import build_set, read_manifest

    registry = load_registry()
    pair = registry.get(pair_name)
    others = [registry.get(name) for name in also]
    for other in others:
        if other.main != pair.main or not other.uses_assistant:
            raise RegistryError(f"--also {other.name}: not an assisted pair over {pair.main}")
    threads = torch.get_num_threads()
    log(f"environment: {environment(device)}")
    log(f"pair: {pair.name} ({pair.main}, assistant {pair.assistant or 'none'}); Tandem batch {batch_size}")
    log(f"{'set':13s} {'system':60s} {'files':>5s} {'audio s':>8s} {'wall s':>7s} {'RTF':>6s} {'speedup':>8s} {'WER':>6s} {'identical':>9s} {'tok/call':>9s}")
    runners = {d: WhisperRunner(pair, d, device) for d in dtypes}
    other_runners = {(o.name, d): WhisperRunner(o, d, device) for o in others for d in dtypes}
    rows: list[AsrRow] = []
    for set_name in sets:
        build_set(set_name)
        items = read_manifest(set_name)[:limit]
        paths = [i["audio_path"] for i in items]
        refs = [i["reference"] for i in items]
        audio_s = sum(i["duration"] for i in items)
        results: dict[str, tuple[list[str], float]] = {}
        per_call: dict[str, float] = {}

        def timed(name, fn):
            # fn(paths) -> transcripts. On a GPU each system first runs once on the first file, untimed: CUDA
            # creates its library handles, kernels and Tandem's captured graphs on first use.
            if device != "cpu":
                fn(paths[:1])
            start = time.perf_counter()
            texts = fn(paths)
            results[name] = (texts, time.perf_counter() - start)
            log(f"  {set_name}: {name} {results[name][1]:.2f} s")

        def tandem(name, opts, runner, which, files):
            done = sorted(transcribe(files, which, opts, runner), key=lambda r: files.index(r.path))
            calls = sum(r.main_calls for r in done)
            per_call[name] = sum(r.tokens for r in done) / calls if calls else None
            return [r.text for r in done]

        for dtype in dtypes:
            timed(f"transformers plain {dtype}", lambda ps, d=dtype: _hf_transcribe(ps, runners[d], None))
            if runners[dtype].loaded.assistant_model is not None:
                timed(f"transformers assisted {dtype}",
                      lambda ps, d=dtype: _hf_transcribe(ps, runners[d], runners[d].loaded.assistant_model))
        long_files = any(i["duration"] > 30.0 for i in items)
        try:
            for compute in ("int8", "float32"):
                fw = _fw_model(compute, threads, paths[0], device)
                timed(f"faster-whisper {compute}", lambda ps, m=fw: _fw_transcribe(m, ps))
                if long_files and compute == "int8":
                    timed(f"faster-whisper {compute} batched {chunk_batch}",
                          lambda ps, m=fw: _fw_transcribe(m, ps, chunk_batch))
                del fw
        except ImportError:
            log("faster-whisper is not installed (pip install 'tandem-pipelines[bench]'): its rows are left out")
        except (RuntimeError, ValueError, OSError) as err:  # e.g. CTranslate2 without its CUDA libraries
            log(f"faster-whisper cannot run on {device} here ({type(err).__name__}: {err}): its rows are left out")
        peer_systems = asr_peer_systems(peers, pair.main, threads, paths[0], log)
        for name, run in peer_systems.items():
            timed(name, run)
        modes = [("sequential", batch_size, "")] + ([("chunked", chunk_batch, f" chunked {chunk_batch}")] if long_files else [])
        for long_form, batch, suffix in modes:
            for dtype in dtypes:
                for assisted in (False, True):
                    if assisted and not pair.uses_assistant and not others:
                        continue
                    opts = TranscribeOptions(use_assistant=assisted, batch_size=batch, dtype=dtype, long_form=long_form,
                                             device=device)
                    name = f"tandem {'assisted' if assisted else 'plain'} {dtype}{suffix}"
                    if pair.uses_assistant or not assisted:  # --also's pairs run even when --pair drafts nothing
                        timed(name, lambda ps, n=name, o=opts, d=dtype: tandem(n, o, runners[d], pair, ps))
                    for other in others if assisted else ():
                        name = f"tandem assisted {dtype}{suffix} [{other.name}]"
                        timed(name, lambda ps, n=name, o=opts, d=dtype, p=other: tandem(n, o, other_runners[p.name, d], p, ps))
        base_wall = results[f"transformers plain {dtypes[0]}"][1]
        for name, (texts, wall) in results.items():
            ident = None
            if name.startswith("tandem") or name in peer_systems:
                own = name.split(" [")[0].replace("assisted", "plain")
                plain = results[own if name.startswith("tandem") else f"tandem plain {dtypes[0]}"][0]
                ident = sum(a == b for a, b in zip(texts, plain)) / len(texts)
            row = AsrRow(set_name, name, len(paths), audio_s, wall, wall / audio_s, base_wall / wall,
                         wer(texts, refs).value, ident, per_call.get(name))
            rows.append(row)
            idt = f"{100 * ident:8.0f}%" if ident is not None else f"{'-':>9s}"
            tpc = f"{row.tokens_per_call:9.2f}" if row.tokens_per_call else f"{'-':>9s}"
            log(f"{set_name:13s} {name:60s} {row.files:5d} {audio_s:8.1f} {wall:7.1f} {row.rtf:6.3f} {row.speedup:7.2f}x "
                f"{100 * row.wer:5.1f}% {idt} {tpc}")
    report = {"environment": environment(device), "pair": pair.name, "batch_size": batch_size, "chunk_batch": chunk_batch,
              "rows": [asdict(r) for r in rows]}
    return write_report(report, json_path, log)
