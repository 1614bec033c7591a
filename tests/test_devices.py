"""The device as a value: resolved once (``--device``, ``$TANDEM_DEVICE``), refused in one line where it does
not exist, part of the summaries, the resume signature and the evaluation environment; the engine creates
every tensor on its model's device."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipelines.asr import TranscribeOptions
from pipelines.asr.outputs import run_signature
from pipelines.cli import main
from pipelines.devices import DeviceError, int8_allowed, resolve_device, resolve_dtype
from pipelines.paths import PROJECT_ROOT


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TANDEM_DEVICE", raising=False)


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with two CUDA devices, as torch reports it (nothing runs on them here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("TANDEM_DEVICE", raising=False)


def test_names_resolve_to_torch_devices(no_cuda, monkeypatch):
    assert resolve_device("cpu") == resolve_device("auto") == resolve_device(None) == "cpu"
    assert resolve_device(" CPU ") == "cpu"
    monkeypatch.setenv("TANDEM_DEVICE", "cpu")
    assert resolve_device() == "cpu"
    for bad in ("gpu", "cuda:x", "cuda:-1", "mps"):
        with pytest.raises(DeviceError, match="unknown device"):
            resolve_device(bad)
    with pytest.raises(DeviceError, match="no CUDA device is available here"):
        resolve_device("cuda")


def test_cuda_indices_and_the_dtype_that_goes_with_them(two_gpus, monkeypatch):
    assert resolve_device("auto") == resolve_device("cuda") == "cuda:0"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(DeviceError, match="2 CUDA device"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("cuda:0", None, "float32") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("cuda:1", None, "float32") == "float16"
    assert resolve_dtype("cuda:0", "float32", "float32") == "float32"  # asked for: kept
    assert resolve_dtype("cpu", None, "bfloat16") == "bfloat16"  # the CPU: the pair's own
    assert int8_allowed("cpu") and not int8_allowed("cuda:0")


@pytest.mark.parametrize("argv", [
    ["--device", "cuda", "transcribe", "x.wav"],
    ["transcribe", "x.wav", "--device", "cuda:1"],
    ["eval", "--task", "asr", "--pair", "p", "--set", "s", "--device", "cuda"],
    ["--device", "tpu", "regress"],
    ["bench", "asr", "--device", "cuda"],
])
def test_a_device_that_is_not_here_is_one_line_and_exit_2(no_cuda, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tandem: ") and "\n" not in err and "Traceback" not in err


def test_the_environment_variable_is_read_when_no_option_is_given(no_cuda, monkeypatch, capsys):
    monkeypatch.setenv("TANDEM_DEVICE", "cuda")
    assert main(["transcribe", "x.wav"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert main(["--device", "cpu", "transcribe", "no-such-file.wav"]) == 2  # the option wins: the file is next
    assert "no such file" in capsys.readouterr().err


def test_cpu_only_commands_refuse_cuda_but_take_auto(two_gpus, capsys):
    assert main(["--device", "cuda", "bench", "scale"]) == 2
    assert "runs on the CPU only so far" in capsys.readouterr().err
    assert main(["bench", "scale", "--device", "cuda:1"]) == 2


@pytest.mark.parametrize("argv", [["bench", "engine"], ["bench", "text", "--task", "translate"], ["bench", "asr"],
                                  ["bench", "shapes"], ["transcribe", "x.wav"]])
def test_the_benchmarks_take_the_gpu_like_every_model_command(two_gpus, argv):
    """Every benchmark but bench scale resolves the device as the commands that load models do: auto is the
    first GPU, cuda:N the one named; bench scale measures CPU threads and Ray actors, auto is the CPU there."""
    from pipelines.cli import _resolve_device
    from pipelines.cli.parser import build_parser

    assert _resolve_device(build_parser().parse_args(argv)) == "cuda:0"
    assert _resolve_device(build_parser().parse_args(argv + ["--device", "cuda:1"])) == "cuda:1"
    assert _resolve_device(build_parser().parse_args(["bench", "scale"])) == "cpu"


def test_bench_engine_runs_its_systems_on_the_device_it_is_given(monkeypatch):
    """The random-weight workloads (models and inputs) on the device named (here the CPU; tests/test_cuda.py runs
    them on CUDA), every system's output equal to transformers' plain greedy output."""
    from pipelines.quality import bench

    loaded = []
    for w in bench.toy_workloads(n=3, device="cpu"):
        assert {p.device.type for p in w.main_model.parameters()} == {"cpu"}
        assert all(i["enc"] is None or i["enc"]["input_ids"].device.type == "cpu" for i in w.items)
        w.max_new_tokens = 6
        rows = bench.bench_workload(w, batches=(2,), log=loaded.append)
        assert {r.system for r in rows} >= {"transformers plain", "tandem plain", "tandem assisted (adaptive)"}
        assert all(r.identical == 1.0 and r.tokens > 0 for r in rows), rows
    assert len(loaded) == 2 * 6


def test_device_is_part_of_the_resume_signature():
    cpu = TranscribeOptions()
    assert run_signature("p", cpu) == run_signature("p", TranscribeOptions(device="cpu"))
    assert run_signature("p", cpu) != run_signature("p", TranscribeOptions(device="cuda:0"))
    assert run_signature("p", TranscribeOptions(device="cuda:0")) != run_signature("p", TranscribeOptions(device="cuda:1"))


def test_the_transcribe_summary_names_dtype_and_device(registry):
    from pipelines.cli.transcribe import describe_mode as _mode

    pair = registry.get("whisper-base+distilled")
    assert ", float32 on cpu, batch 4" in _mode(pair, TranscribeOptions(), None)
    assert ", bfloat16 on cpu, batch 1" in _mode(pair, TranscribeOptions(dtype="bfloat16", batch_size=1), None)


# Tensor factories that must say where: in the engine every new tensor is created on its model's (or its
# logits') device. Exempt: FixedShapeDecoder._tile builds a pass's ids, positions and slots on the host, moved in
# one copy; int8 quantization runs on a CPU only.
FACTORIES = {"tensor", "zeros", "ones", "full", "empty", "arange", "eye", "rand", "randn", "randint", "as_tensor"}
HOST_BUILT = {("fixed.py", "_tile"), ("lean.py", "__init__")}


def _factory_calls_without_device(path: Path):
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or (path.name, fn.name) in HOST_BUILT:
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                    and not any(k.arg == "device" for k in node.keywords)):
                yield f"{path.name}:{node.lineno} torch.{node.func.attr} in {fn.name}"


def test_every_engine_tensor_is_created_on_a_device():
    missing = [hit for path in sorted((PROJECT_ROOT / "pipelines" / "engine").glob("*.py"))
               for hit in _factory_calls_without_device(path)]
    assert not missing, missing


def test_the_detector_finds_a_host_tensor(tmp_path):
    """The check above can fail: a factory call without device= in an engine function is reported."""
    bad = tmp_path / "core.py"
    bad.write_text("import torch\n\ndef step(x):\n    return torch.zeros(3) + torch.ones(3, device=x.device)\n")
    assert list(_factory_calls_without_device(bad)) == ["core.py:4 torch.zeros in step"]


def test_bench_shapes_oracle_sets_the_acceptance_and_output_stays_exact(monkeypatch, tmp_path):
    """The shapes benchmark on a tiny shape: an oracle that is always wrong gives one token per main call, one
    that is always right lookahead + 1; the assisted output equals Tandem plain's either way."""
    from pipelines.quality import bench_shapes

    monkeypatch.setitem(bench_shapes.SHAPES, "tiny", {"d_model": 64, "decoder_layers": 2, "decoder_attention_heads": 4,
                                                      "decoder_ffn_dim": 128, "vocab_size": 500})
    report = bench_shapes.bench_shapes("tiny", tokens=24, acceptances=(0.0, 1.0), lookaheads=(3, 6), width=8,
                                       json_path=str(tmp_path / "s.json"), log=lambda *_: None)
    never, always, never6, always6 = report["rows_out"][2:]
    assert [(r["acceptance"], r["lookahead"]) for r in (never, always, never6, always6)] == [
        (0.0, 3), (1.0, 3), (0.0, 6), (1.0, 6)]
    assert all(r["identical"] for r in (never, always, never6, always6))
    assert never["tokens_per_call"] == 1.0 and always["tokens_per_call"] >= 3.5
    assert never6["tokens_per_call"] == 1.0 and always6["tokens_per_call"] >= 5.5  # 7 a call: one pass of width 8
    assert report["width"] == 8 and report["lookaheads"] == [3, 6]
    assert report["environment"]["device"] == "cpu" and (tmp_path / "s.json").is_file()


def test_step_costs_on_a_tiny_shape(monkeypatch):
    """The step-cost table on a tiny shape on the CPU: eager rows only (the graph path is CUDA's), a positive
    wall time for each part, no kernel time (the profiler's device time is CUDA's); the calls leave the
    caches consistent (the draft cache grows a token a call, the main one is rewritten in place)."""
    from pipelines.quality import bench_shapes

    monkeypatch.setitem(bench_shapes.SHAPES, "tiny", {"d_model": 64, "decoder_layers": 2, "decoder_attention_heads": 4,
                                                      "decoder_ffn_dim": 128, "vocab_size": 500})
    costs = bench_shapes.step_costs("tiny", device="cpu", lookahead=3, repeats=3, log=lambda *_: None)
    assert [(c.part, c.path) for c in costs] == [("main step", "eager"), ("verify pass (4 tokens)", "eager"),
                                                 ("draft step", "eager")]
    assert all(c.wall_ms > 0 and c.kernel_ms is None for c in costs)
    # a draft in half precision (the default off a CPU) is timed beside the same draft in float32
    from pipelines.engine.whisper import WhisperDraftDecoder

    real_as_decoder = bench_shapes.as_decoder
    monkeypatch.setattr(bench_shapes, "as_decoder", lambda model, assistant=False, int8=False: (
        WhisperDraftDecoder(model, dtype=torch.bfloat16) if assistant else real_as_decoder(model)))
    costs = bench_shapes.step_costs("tiny", dtype="bfloat16", device="cpu", repeats=2, log=lambda *_: None)
    assert [c.part for c in costs][2:] == ["draft step", "draft step, float32"] and all(c.wall_ms > 0 for c in costs)


def test_the_pass_shape_follows_the_machine_kind(monkeypatch):
    """The main decoder's pass shape comes from a table keyed by CPU vendor and dtype (never from a timing
    probe, which could change the bits from one run to the next); unknown CPUs take width 4, CUDA width 8."""
    from pipelines.devices import cpu_info
    from pipelines.engine import whisper

    vendor, model = cpu_info()
    assert isinstance(vendor, str) and model
    monkeypatch.setattr(whisper, "cpu_info", lambda: ("GenuineIntel", "Intel(R) Xeon(R) Processor"))
    assert whisper.step_shape(torch.float32) == whisper.StepShape(2, False)
    shape = whisper.step_shape(torch.bfloat16)
    assert shape.head_transposed and (shape.width_for(1), shape.width_for(4), shape.width_for(8)) == (4, 4, 2)
    monkeypatch.setattr(whisper, "cpu_info", lambda: ("AuthenticAMD", "AMD EPYC"))
    shape = whisper.step_shape(torch.float32)
    assert shape.head_transposed and (shape.width_for(1), shape.width_for(4), shape.width_for(8)) == (4, 4, 2)
    assert whisper.step_shape(torch.bfloat16) == whisper.StepShape(4, False)
    monkeypatch.setattr(whisper, "cpu_info", lambda: ("", "unknown"))
    assert whisper.step_shape(torch.float32, "cuda:0").width == 8


def test_half_precision_is_native_only_where_the_cpu_lists_its_units(monkeypatch):
    """bfloat16 (float16) products are native on a CPU only with AMX or AVX-512 units for them (the flags of
    /proc/cpuinfo); elsewhere torch emulates them, several times slower than float32."""
    from pipelines import devices

    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx_vnni"}))
    assert not devices.half_is_native("cpu", "bfloat16") and not devices.half_is_native("cpu", "float16")
    assert devices.half_is_native("cpu", "float32") and devices.half_is_native("cuda:0", "bfloat16")
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert devices.half_is_native("cpu", "bfloat16") and not devices.half_is_native("cpu", "float16")
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"amx_bf16", "amx_fp16"}))
    assert devices.half_is_native("cpu", "bfloat16") and devices.half_is_native("cpu", "float16")
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"fp", "asimd", "bf16"}))  # an Arm Neoverse V1
    assert devices.half_is_native("cpu", "bfloat16") and not devices.half_is_native("cpu", "float16")
    from pipelines.distill.student import autocast_pays  # distill's bfloat16 autocast: only where it is native

    assert autocast_pays(torch.device("cpu")) and autocast_pays(torch.device("cuda", 0))
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx2"}))
    assert not autocast_pays(torch.device("cpu"))


def test_distill_encodes_labelled_clips_in_float32_where_bfloat16_is_emulated(monkeypatch, tmp_path):
    """The labelling teacher stays bfloat16 (the corpus's teacher); clips the corpus already labels are encoded
    by a float32 teacher on a CPU without bfloat16 units, and by the labelling teacher itself elsewhere."""
    from pipelines import devices, distill
    from pipelines.distill.options import DistillOptions

    class FakeTeacher:
        def __init__(self, ref, dtype, device="cpu"):
            self.ref, self.dtype, self.device = ref, dtype, device

    monkeypatch.setattr(distill, "Teacher", FakeTeacher)
    label = FakeTeacher("embedded:whisper-base", "bfloat16")
    opts = DistillOptions(main="whisper-base", out=tmp_path)
    lines: list[str] = []
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx2"}))
    reader = distill.features_teacher(label, opts, lines.append)
    assert (reader.dtype, reader.ref) == ("float32", label.ref) and "no bfloat16 units" in lines[0]
    assert distill.features_teacher(label, DistillOptions(**{**opts.__dict__, "label_only": True}), print) is label
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    assert distill.features_teacher(label, opts, print) is label


def test_loading_a_pair_in_an_emulated_dtype_says_so(monkeypatch, registry):
    """bfloat16 on a CPU without bfloat16 units: the pair loads and the run warns that float32 is faster there."""
    from pipelines.models import pairs

    monkeypatch.setattr(pairs, "half_is_native", lambda device, dtype: dtype == "float32")
    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("loaded")))
    pair = registry.pairs["whisper-base"]
    with pytest.warns(RuntimeWarning, match="bfloat16 is emulated on this CPU"), pytest.raises(RuntimeError, match="loaded"):
        pairs.load_pair(pair, "bfloat16", "cpu")


def test_aligned_rows_pads_only_on_cuda():
    """``rows.aligned_rows`` leaves a CPU tensor as it is (no copy); on CUDA (tests/test_cuda.py) it pads the
    vocabulary with -inf columns so that every row starts at the same alignment."""
    from pipelines.engine.rows import aligned_rows

    x = torch.randn(2, 3, 51865)
    assert aligned_rows(x) is x


_PUTS = (torch.ops.aten.index_put_, torch.ops.aten.index_put, torch.ops.aten._index_put_impl_)

class ScalarPuts(TorchDispatchMode):
    """Records an index_put_ of a 0-dim value, and a copy_ from a tensor torch made of a Python number
    (``lift_fresh``: ``row[c] = -inf`` copies it into one element, blocking on CUDA as well)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.lifted: list[torch.Tensor] = []  # kept alive: their ids stay theirs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in _PUTS:
            values = args[2] if len(args) > 2 else kwargs["values"]
            if values.dim() == 0:
                self.seen.append(str(func))
        if func.overloadpacket is torch.ops.aten.copy_ and any(args[1] is t for t in self.lifted):
            self.seen.append(str(func))
        out = func(*args, **kwargs)
        if func.overloadpacket in (torch.ops.aten.lift_fresh, torch.ops.aten.lift_fresh_copy):
            self.lifted.append(out)
        return out


def test_rules_copy_no_python_number_to_the_device():
    """The rules forbid columns with ``index_fill_``: an indexed assignment of a Python number
    (``logits[..., idx] = -inf``) makes torch copy the number to the logits' device as a tensor first, a
    blocking copy that waits for the stream on CUDA (an H200 run counted it once per rules call, 35 of
    the 50 synchronisations of a greedy decode of 4 rows in 7 rounds). Checked on the CPU through the operations torch dispatches: no
    ``index_put_`` of a 0-dim value, over the full vocabulary and a reduced one, and the same columns forbidden."""
    from pipelines.engine.rules import Rules, TimestampRules, apply_rules

    rules = Rules(eos=(2,), suppress=(5, 7), begin_suppress=(3,), min_new_tokens=2)
    lens = torch.tensor([[0, 1], [1, 2], [2, 3]])  # (rows, positions): new tokens before each position
    vocab = [1, 2, 3, 5, 8]  # a reduced head's sorted ids: columns 0-4
    full, sub = torch.zeros(3, 2, 10), torch.zeros(3, 2, len(vocab))
    # Whisper's timestamp rules too (ids 0-5 text, 6 <|notimestamps|>, 7-11 timestamps, 2 the end), at
    # every state: the first token, after text, after a lone timestamp, after a pair
    stamps = TimestampRules(no_timestamps=6, begin=7, eos=2, prompt_len=1, max_initial=2)
    timed = dataclasses.replace(rules, suppress=(5,), timestamps=stamps)
    prefixes = [[[0], [0, 3]], [[0, 8], [0, 8, 9]], [[0, 8, 9, 4], [0, 8, 9, 4, 10]]]
    ts_logits = torch.zeros(3, 2, 12)
    with ScalarPuts() as mode:
        apply_rules(rules, full, lens, 16)
        apply_rules(rules, sub, lens, 16, vocab=vocab)
        apply_rules(timed, ts_logits, lens, 16, prefixes)
    assert mode.seen == []
    with ScalarPuts() as mode:  # the detector sees the one-element assignment
        torch.zeros(3)[1] = float("-inf")
    assert mode.seen == ["aten.copy_.default"]
    assert ts_logits[:, :, 6].isinf().all()  # <|notimestamps|> never (tests/test_timestamp_rules.py: the rest)
    for logits, col in ((full, lambda t: t), (sub, vocab.index)):
        forbidden = torch.zeros(logits.shape, dtype=torch.bool)
        forbidden[..., col(5)] = True  # suppressed everywhere (7 is not in the reduced vocabulary)
        if logits is full:
            forbidden[..., 7] = True
        forbidden[0, 0, col(3)] = True  # begin-suppressed where no token is new yet
        forbidden[lens < 2, col(2)] = True  # no end of sequence before two new tokens
        assert torch.equal(logits.isinf(), forbidden)


def test_from_device_rules_from_on_the_device_rules_are_apply_rules():
    """``rules.device_rules_from``: the generated length from which ``apply_rules`` does what the device paths do
    from each row's generated length alone (the suppressed columns, then ``apply_length_rules``: the first
    token's suppressions, no end of sequence before a minimum length), to the bit; before it (a forced first
    token) they differ, and rules that read prefixes or max_new_tokens have none. Checked against
    ``apply_rules`` itself at every length below 8, full and reduced vocabulary, several rows at once, with no
    Python number copied to the device."""
    from pipelines.engine.rules import Rules, apply_length_rules, apply_rules, device_rules_from, length_columns

    cases = [Rules(), Rules(eos=(2,), suppress=(5, 7)), Rules(eos=(2,), suppress=(5,), begin_suppress=(3,)),
             Rules(eos=(2,), begin_suppress=(3, 7), min_new_tokens=4), Rules(eos=(), min_new_tokens=4),
             Rules(eos=(2, 8), min_new_tokens=3), Rules(eos=(2,), forced_first=8)]
    assert [device_rules_from(r) for r in cases] == [0, 0, 0, 0, 0, 0, 1]
    assert device_rules_from(Rules(eos=(2,), forced_last=2)) is None
    # Whisper's timestamp rules do not move it: the device paths apply them from each row's timestamp state
    from pipelines.engine.rules import TimestampRules

    stamps = TimestampRules(no_timestamps=6, begin=7, eos=2, prompt_len=1)
    assert [device_rules_from(dataclasses.replace(r, timestamps=stamps)) for r in cases] == [0, 0, 0, 0, 0, 0, 1]
    gen = torch.arange(8)
    for rules in cases:
        for vocab in (None, [1, 2, 3, 5, 8]):
            width = 10 if vocab is None else len(vocab)
            logits = torch.randn(8, 1, width, generator=torch.Generator().manual_seed(len(rules.eos)))
            expected = logits.clone()
            apply_rules(rules, expected, gen[:, None], 16, vocab=vocab)
            if rules.suppress:
                cols = [c for c, t in enumerate(vocab or range(width)) if t in rules.suppress]
                logits[..., cols] = float("-inf")
            with ScalarPuts() as mode:
                apply_length_rules(rules, logits[:, 0], gen, length_columns(rules, vocab, logits.device))
            assert mode.seen == []
            same = [torch.equal(logits[g], expected[g]) for g in range(8)]
            assert same == [g >= device_rules_from(rules) for g in range(8)], (rules, vocab, same)
