"""A diagnosis for .ci/gpu-check (issue 14): where a main step's and a draft step's kernel time goes, with the
real Whisper base and the shipped assistant, eager and on the graph path (kernels a call, the ten longest);
and where a real assisted decode of four speech-real files (constant lookahead 3) spends its host time
(cProfile), and unprofiled, speech-real decoded plain and at several lookaheads (ms a token and a round).
On a machine without CUDA it runs the eager part on the CPU (aten ops for kernels): a dry run."""
import cProfile
import io
import pstats
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from pipelines.asr import TranscribeOptions, WhisperRunner  # noqa: E402
from pipelines.audio import load_audio  # noqa: E402
from pipelines.devices import resolve_device  # noqa: E402
from pipelines.engine import PolicyOptions, as_decoder  # noqa: E402
from pipelines.engine.policies import parse_policy  # noqa: E402
from pipelines.engine.decoders import EncoderOutput  # noqa: E402
from pipelines.models.registry import load_registry  # noqa: E402
from pipelines.quality.sets import read_manifest  # noqa: E402

cuda = torch.cuda.is_available()
dev = resolve_device("cuda" if cuda else "cpu")
ACT = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
if not cuda:  # a dry run of this script on a CPU
    torch.cuda.synchronize = lambda: None
runner = WhisperRunner(load_registry().get("whisper-base+distilled"), None, dev)
loaded = runner.loaded
print("dtype", loaded.dtype, "assistant vocab", getattr(loaded.assistant_model.config, "draft_vocab", None) and
      len(loaded.assistant_model.config.draft_vocab))
hidden = torch.randn(1, 1500, loaded.main_model.config.d_model, dtype=loaded.main_model.dtype, device=dev)
prompt = list(range(3, 43))


def feed(draft, dcache):
    """The first feed of a round (3 tokens the drafter has not seen), then forgotten again."""
    _, real = draft.forward([[5, 6, 7]], dcache, None, 0)
    dcache.commit(real, [3])
    dcache.rollback_rows([3])


for path in ("graphs", "eager") if cuda else ("eager",):
    with torch.inference_mode():
        main = as_decoder(loaded.main_model)
        draft = as_decoder(loaded.assistant_model, assistant=True)
        main.graphs = draft.graphs = "capture" if path == "graphs" else None
        cache = main.new_cache(1, capacity=448)
        _, real = main.forward([prompt], cache, EncoderOutput(hidden, None), 0, need_from=[len(prompt) - 1])
        cache.commit(real, [len(prompt)])
        dcache = draft.new_cache(1, capacity=448)
        _, real = draft.forward([prompt], dcache, EncoderOutput(hidden.to(draft.dtype), None), 0)
        dcache.commit(real, [len(prompt)])
        one = torch.tensor([[5]], device=dev)
        yes = torch.ones(1, 1, dtype=torch.bool, device=dev)
        calls = {"main step": lambda: main.forward([[5]], cache, None, 0),
                 "draft step": lambda: (draft.forward_ids(one, yes, dcache, None), dcache.commit(yes, [1])),
                 "draft first feed (3 tokens)": lambda: feed(draft, dcache)}
        for name, call in calls.items():
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            n = 20
            with profile(activities=[ACT]) as prof:
                for _ in range(n):
                    call()
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if (e.self_device_time_total if cuda else e.self_cpu_time_total) > 0]
            launches = sum(e.count for e in events) / n
            t = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
            total = sum(t(e) for e in events) / n
            print(f"\n== {path}: {name}: {launches:.0f} kernels a call, {total / 1000:.3f} ms of kernels a call")
            for e in sorted(events, key=lambda e: -t(e))[:10]:
                print(f"  {t(e) / n:8.1f} us  x{e.count / n:4.1f}  {e.key[:110]}")
        cache.release()
        dcache.release()

# unprofiled: speech-real's files decoded one at a time (encoder outputs computed before), plain and assisted at
# a few lookaheads: wall ms a token and a round, beside the kernel times above (the host's share of a round)
every = read_manifest("speech-real")[: 4 if not cuda else None]
prompt_ids = runner.prompt("en", "transcribe", False)
encoded = [runner.encode_windows([load_audio(i["audio_path"]).astype(np.float32)])[0] for i in every]
print(f"\n== real decode of {len(encoded)} speech-real files, one at a time, no profiler")
for label, opts in [("plain", TranscribeOptions(device=dev, use_assistant=False))] + [
        (p, TranscribeOptions(device=dev, policy=parse_policy(p)))
        for p in ("constant:1", "constant:2", "constant:3", "constant:5", "constant:7", "adaptive")]:
    for e in encoded:  # warm: graphs captured, caches pooled
        runner.decode_encoded(e, [prompt_ids], False, opts)
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = [runner.decode_encoded(e, [prompt_ids], False, opts).stats for e in encoded]
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    tokens, rounds, calls = (sum(getattr(s, k) for s in done) for k in ("new_tokens", "rounds", "main_calls"))
    print(f"  {label:11s} {1000 * wall:8.1f} ms, {tokens} tokens, {rounds} rounds: {1000 * wall / tokens:.3f} ms a token, "
          f"{1000 * wall / rounds:.3f} ms a round, {tokens / calls:.2f} tokens a main call")

# host time of a real assisted decode: 4 speech-real files, one at a time, constant lookahead 3
options = TranscribeOptions(device=dev, policy=PolicyOptions("constant", 3))
encs = encoded[:4]  # the same files' encoder outputs, computed above
for e in encs:
    runner.decode_encoded(e, [prompt_ids], False, options)
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
stats = [runner.decode_encoded(e, [prompt_ids], False, options).stats for e in encs]
torch.cuda.synchronize()
prof.disable()
print("\n== real assisted decode, constant:3, 4 files:",
      [(s.new_tokens, s.rounds, s.main_calls, s.draft_calls, round(s.total_s * 1000, 1)) for s in stats],
      "(tokens, rounds, main calls, draft calls, ms)")
buf = io.StringIO()
pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
print(buf.getvalue()[:6000])

# where a whole transcription's time goes (audio decoding, features, encoder, decoding): speech-real, batch 1,
# the default (adaptive) policy, after one warm pass
from pipelines.asr import transcribe  # noqa: E402

pair = load_registry().get("whisper-base+distilled")
paths = [i["audio_path"] for i in read_manifest("speech-real")]
whole = TranscribeOptions(device=dev, batch_size=1)
list(transcribe(paths, pair, whole, runner))
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
list(transcribe(paths, pair, whole, runner))
torch.cuda.synchronize()
prof.disable()
buf = io.StringIO()
pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
print("\n== transcribe speech-real, batch 1, by cumulative time")
print(buf.getvalue()[:9000])
