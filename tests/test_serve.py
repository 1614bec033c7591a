"""``tandem serve``: a real uvicorn server on 127.0.0.1, called with the official ``openai`` client.

Transcripts must equal what ``asr.transcribe`` (the API ``tandem transcribe`` runs) gives for the same file
decoded alone, in every response format and when several requests are decoded together; bad requests get
OpenAI's error JSON and the server serves the next one. Chat completions run on a tiny random-weight chat
pair built here (a locally trained tokenizer with a chat template): greedy output equals ``generate``'s.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

for _module in ("fastapi", "uvicorn", "multipart", "prometheus_client", "openai"):
    pytest.importorskip(_module, reason="needs the serve extra and openai: pip install -e '.[serve,test]'")

import openai  # noqa: E402

try:  # the HTTP client the openai client is built on, to hang up mid-request
    import httpx2 as httpx
except ImportError:
    import httpx
import uvicorn  # noqa: E402

KEY = "test-key"
PAIR = "whisper-base+distilled"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """An app under uvicorn in a thread, on a free loopback port; ready once /health answers."""

    def __init__(self, app) -> None:
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        import urllib.request

        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or not self.thread.is_alive():
                    raise RuntimeError("the server did not come up") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str | None = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or "none", max_retries=0, timeout=300)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture(scope="module")
def asr(distilled_asr):
    return distilled_asr


@pytest.fixture(scope="module")
def clips(speech_real):
    """Four short clips of speech-real (the shortest, to keep the decoding cheap)."""
    items = sorted(speech_real, key=lambda i: i["duration"])[:4]
    return [Path(i["audio_path"]) for i in items]


@pytest.fixture(scope="module")
def alone(asr, clips):
    """Each clip transcribed alone in-process, as tandem transcribe does: without and with timestamps."""
    from pipelines.asr import TranscribeOptions, transcribe

    runner, pair = asr
    return {ts: [next(transcribe([c], pair, TranscribeOptions(timestamps=ts, batch_size=1), runner=runner))
                 for c in (clips if not ts else clips[:1])] for ts in (False, True)}


@pytest.fixture(scope="module")
def server(asr, alone):
    from pipelines.serve import ServeOptions, load_served
    from pipelines.serve.app import create_app

    options = ServeOptions(api_key=KEY, max_batch=4, max_wait_ms=500, max_upload_mb=3)  # speech-long's first file: 2.3 MB
    s = _Server(create_app(load_served(options, asr=asr), grace_seconds=30))
    yield s
    s.stop()


def _transcribe(client, path: Path, **kwargs):
    with open(path, "rb") as f:
        return client.audio.transcriptions.create(model=PAIR, file=f, language="en", **kwargs)


def test_every_format_equals_tandem_transcribe(server, asr, clips, alone):
    from pipelines.asr.outputs import format_srt

    client = server.client()
    plain, timed = alone[False][0], alone[True][0]
    got = _transcribe(client, clips[0])
    assert got.text == plain.text
    figures = got.model_extra["tandem"]
    assert figures["tokens"] == plain.tokens and figures["decoder_seconds"] > 0
    # the cost-based lookahead (engine/policies.py) times draft and verify passes: on a busy machine it may
    # decode a short clip plainly, so the figures are checked for consistency, not for drafts (no drafts: no
    # acceptance, None, as formats.tandem_figures gives it)
    assert 0 <= figures["accepted"] <= figures["drafted"]
    assert figures["acceptance"] is None if not figures["drafted"] else 0 <= figures["acceptance"] <= 1
    assert _transcribe(client, clips[0], response_format="text").strip() == plain.text
    assert _transcribe(client, clips[0], response_format="srt") == format_srt(timed.segments)
    verbose = _transcribe(client, clips[0], response_format="verbose_json", timestamp_granularities=["segment"])
    assert verbose.text == timed.text and verbose.language == "english"
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [(s.start, s.end, s.text) for s in timed.segments]
    # word timestamps: OpenAI's top-level words, each as tandem transcribe --word-timestamps gives it
    from pipelines.asr import TranscribeOptions, transcribe

    runner, pair = asr
    timed_words = next(transcribe([clips[0]], pair, TranscribeOptions(word_timestamps=True, batch_size=1),
                                  runner=runner))
    expected = [(w.word.strip(), w.start, w.end) for s in timed_words.segments for w in s.words]
    assert expected
    verbose = _transcribe(client, clips[0], response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert [(w.word, w.start, w.end) for w in verbose.words] == expected and verbose.text == timed_words.text
    with pytest.raises(openai.BadRequestError, match="verbose_json"):
        _transcribe(client, clips[0], response_format="json", timestamp_granularities=["word"])
    with pytest.raises(openai.BadRequestError, match="segment and/or word"):
        _transcribe(client, clips[0], response_format="verbose_json", timestamp_granularities=["sentence"])


def test_concurrent_requests_equal_one_at_a_time_and_share_batches(server, clips, alone):
    client = server.client()
    requests = clips * 2  # eight at once on a server of four rows: four join the running batch as rows leave it
    with ThreadPoolExecutor(len(requests)) as pool:
        texts = list(pool.map(lambda c: _transcribe(client, c).text, requests))
    assert texts == [t.text for t in alone[False]] * 2
    import urllib.request

    req = urllib.request.Request(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        metrics = r.read().decode()
    value = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line and line[0] != "#"}
    # some batch took more than one request at once (the rest joined at step boundaries or went alone)
    assert value['tandem_batch_admitted_requests_sum{kind="asr"}'] > value['tandem_batch_admitted_requests_count{kind="asr"}']
    assert value['tandem_requests_total{endpoint="transcriptions",status="200"}'] >= len(clips)
    assert value["tandem_queue_length"] == 0 and value["tandem_audio_seconds_total"] > 0


@pytest.fixture(scope="module")
def long_clip():
    """The shortest file of speech-long (72 s: three windows)."""
    from pipelines.quality.sets import build_set, read_manifest

    build_set("speech-long")
    return Path(min(read_manifest("speech-long"), key=lambda i: i["duration"])["audio_path"])


@pytest.fixture(scope="module")
def long_alone(asr, long_clip):
    """The long clip transcribed alone in-process, as tandem transcribe does."""
    from pipelines.asr import TranscribeOptions, transcribe

    runner, pair = asr
    return next(transcribe([long_clip], pair, TranscribeOptions(batch_size=1), runner=runner))


def test_streamed_transcription_joins_to_the_plain_text(server, long_clip, long_alone, clips, alone):
    client = server.client()
    plain = long_alone.text
    events = list(_transcribe(client, long_clip, stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert [e.type for e in events[len(deltas):]] == ["transcript.text.done"]  # deltas, then one done event
    assert len(deltas) >= 2  # window by window, not one piece at the end
    assert "".join(deltas) == events[-1].text == plain
    assert events[-1].model_extra["tandem"]["tokens"] > 0
    short = list(_transcribe(client, clips[0], stream=True, response_format="text"))
    assert "".join(e.delta for e in short[:-1]) == short[-1].text == alone[False][0].text
    with pytest.raises(openai.BadRequestError, match="stream"):
        _transcribe(client, clips[0], stream=True, response_format="srt")
    with pytest.raises(openai.BadRequestError) as bad:  # bad audio is still a 400, not a broken stream
        client.audio.transcriptions.create(model=PAIR, file=("clip.wav", b"not audio\n" * 40), stream=True)
    assert bad.value.body["code"] == "invalid_audio"


def _metric(url: str, name: str, key: str | None = None) -> float:
    req = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        lines = r.read().decode().splitlines()
    return next((float(line.split()[1]) for line in lines if line.split(" ")[0] == name), 0.0)  # 0: not yet counted


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_sigterm_answers_the_request_in_flight_refuses_new_ones_and_exits_0(long_clip, long_alone):
    import torch

    from pipelines.serve.server import GRACE_SECONDS

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "--threads", str(torch.get_num_threads()), "serve",
                             "--port", str(port), "-m", PAIR], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while _refused(port):
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(_transcribe, client, long_clip)  # three 30 s windows: seconds of decoding
            while _metric(url, "tandem_running_requests") < 1:
                assert not pending.done(), "the request ended before it could be caught in flight"
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            while not _refused(port):  # the listening socket closes at uvicorn's next tick (0.1 s)
                assert time.monotonic() - signalled < 5, "still taking connections 5 s after SIGTERM"
                time.sleep(0.05)
            with pytest.raises(openai.APIConnectionError):
                client.models.list()
            assert not pending.done()  # the refusal came while the request was still being decoded
            assert pending.result().text == long_alone.text  # answered whole, as decoded alone
        code = proc.wait(timeout=GRACE_SECONDS + 30)
        log = proc.stdout.read()
        assert code == 0, log
        assert time.monotonic() - signalled < GRACE_SECONDS, log
        assert "Finished server process" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _settled(url: str, key: str | None = None, timeout: float = 60) -> None:
    """Wait until /metrics shows no queued and no running request (AssertionError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while _metric(url, "tandem_queue_length", key) or _metric(url, "tandem_running_requests", key):
        assert time.monotonic() < deadline, "rows still queued or running after the client went away"
        time.sleep(0.1)


def test_a_client_gone_mid_transcription_leaves_no_rows_and_the_next_is_served(server, long_clip, clips, alone):
    answered = 'tandem_requests_total{endpoint="transcriptions",status="200"}'
    before = _metric(server.url, answered, KEY)
    request = httpx.Request("POST", f"{server.url}/v1/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                            data={"model": PAIR, "language": "en"}, files={"file": long_clip.read_bytes()})
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    with socket.create_connection(("127.0.0.1", server.port)) as sock:  # a client that will hang up
        sock.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\n{head}\r\n".encode() + request.read())
        deadline = time.monotonic() + 60
        while _metric(server.url, "tandem_running_requests", KEY) < 1:
            assert time.monotonic() < deadline, "the request was never seen decoding"
            time.sleep(0.05)
        sock.settimeout(0)
        with pytest.raises(BlockingIOError):
            sock.recv(1)  # nothing answered yet: it goes away mid-request (three 30 s windows of decoding left)
    _settled(server.url, KEY)
    assert _metric(server.url, answered, KEY) == before  # it was cut, not answered to nobody
    assert _transcribe(server.client(), clips[1]).text == alone[False][1].text


def test_models_lists_the_served_pair(server):
    ids = [m.id for m in server.client().models.list()]
    assert ids == [PAIR, "whisper-1"]


def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, clips, alone, tmp_path):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.transcriptions.create(model=PAIR, file=("clip.wav", b"plain text, not audio at all\n" * 40))
    assert bad.value.status_code == 400 and bad.value.body["code"] == "invalid_audio"
    assert set(bad.value.response.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        _transcribe(server.client("wrong-key"), clips[0])
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="no-such-model", file=clips[0])
    with pytest.raises(openai.BadRequestError, match="response_format"):
        _transcribe(client, clips[0], response_format="docx")
    with pytest.raises(openai.APIStatusError) as big:
        client.audio.transcriptions.create(model=PAIR, file=("big.wav", b"\0" * (5 << 20)))
    assert big.value.status_code == 413
    assert _transcribe(client, clips[1]).text == alone[False][1].text  # still serving


def test_options_refuse_an_open_host_without_a_key(capsys, monkeypatch):
    from pipelines.cli import main
    from pipelines.serve import ServeOptions, ServeOptionsError, is_loopback

    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0"]) == 2  # before any model loads
    assert "--api-key" in capsys.readouterr().err

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    with pytest.raises(ServeOptionsError, match="--api-key"):
        ServeOptions(host="0.0.0.0")
    ServeOptions(host="0.0.0.0", api_key="k")
    with pytest.raises(ServeOptionsError, match="--max-batch"):
        ServeOptions(max_batch=0)


# ----------------------------------------------------------------------------------------------------
# chat completions on a tiny chat pair


CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def _chat_models(root: Path) -> Path:
    import torch
    import yaml
    from local_models import train_tokenizer
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    for role, layers, seed in (("main", 2, 0), ("small", 1, 1)):
        folder = root / role
        tok = train_tokenizer(folder)
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(folder)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256, initializer_range=0.25,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=1)).eval()
        model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=2, pad_token_id=1)
        model.save_pretrained(folder)
    path = root / "models.yaml"
    path.write_text(yaml.safe_dump({"pairs": {"tiny-chat": {
        "task": "summarize", "main": {"local": str(root / "main")}, "assistant": {"local": str(root / "small")}}},
        "defaults": {"summarize": "tiny-chat"}}))
    return path


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    from pipelines.models.registry import load_registry
    from pipelines.serve import ServeOptions, load_served
    from pipelines.serve.app import create_app
    from pipelines.serve.chat import ChatEngine
    from pipelines.text import TextRunner

    models = _chat_models(tmp_path_factory.mktemp("chat-models"))
    engine = ChatEngine(TextRunner(load_registry(models).get("tiny-chat")))
    served = load_served(ServeOptions(models=str(models)), chat=engine)
    s = _Server(create_app(served))
    s.served = served
    yield s, engine
    s.stop()


def test_chat_completion_equals_generate_whole_and_streamed(chat_server):
    import torch

    server, engine = chat_server
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Summarize the project."}]
    ids = engine.prompt(messages)
    with torch.inference_mode():
        out = engine.runner.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    expected = engine.runner.tok.decode(out[0, len(ids):], skip_special_tokens=True).strip()
    got = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=12, temperature=0)
    assert got.choices[0].message.content == expected
    assert got.usage.prompt_tokens == len(ids) and got.model_extra["tandem"]["tokens"] == got.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=12, temperature=0,
                                                 stream=True))
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert "".join(texts) == expected
    assert len(texts) > 1  # token by token as rounds accept them, not one piece at the end
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length") and chunks[-1].usage.completion_tokens > 1
    assert [m.id for m in client.models.list()] == ["tiny-chat"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=messages)
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model="tiny-chat", messages=[{"role": "robot", "content": "hi"}])


def test_chat_rounds_report_tokens_and_a_stopped_row_leaves_the_others_as_they_were(chat_server):
    from pipelines.serve.chat import ChatSettings

    _server, engine = chat_server
    prompts = [engine.prompt([{"role": "user", "content": text}]) for text in ("Summarize it.", "Say more, please.")]
    settings = ChatSettings(max_tokens=16)
    alone = [engine.complete([p], settings)[0] for p in prompts]
    seen: dict[int, list[int]] = {0: [], 1: []}

    def on_tokens(row: int, tokens: list[int]) -> bool:
        seen[row] += tokens
        return row == 0  # row 1 stops after its first round

    both = engine.complete(prompts, settings, on_tokens)
    assert both[0].text == alone[0].text  # the other row is untouched by the stop
    assert engine.runner.tok.decode(seen[0], skip_special_tokens=True).strip() == both[0].text  # rounds add up
    assert 0 < both[1].completion_tokens == len(seen[1]) < alone[1].completion_tokens


def test_a_client_gone_mid_chat_stream_leaves_no_rows_and_the_next_is_served(chat_server):
    server, engine = chat_server
    scheduler = server.served.scheduler
    complete, kept = scheduler.chat, []

    def slow(prompts, settings, on_tokens):  # a round every 50 ms: the client can leave mid-completion
        def paced(row, tokens):
            time.sleep(0.05)
            kept.append(on_tokens(row, tokens))
            return kept[-1]
        return complete(prompts, settings, paced)

    messages = [{"role": "user", "content": "Summarize the project."}]
    expected = server.client().chat.completions.create(model="tiny-chat", messages=messages, max_tokens=40,
                                                       temperature=0).choices[0].message.content
    scheduler.chat = slow
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            with http.stream("POST", "/v1/chat/completions", json={
                    "model": "tiny-chat", "messages": messages, "max_tokens": 200, "temperature": 0,
                    "stream": True}) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")  # the role chunk: decoding has begun
        _settled(server.url)
        assert kept and kept[-1] is False  # the row left the batch at a round boundary, before its 200 tokens
    finally:
        scheduler.chat = complete
    got = server.client().chat.completions.create(model="tiny-chat", messages=messages, max_tokens=40, temperature=0)
    assert got.choices[0].message.content == expected


def test_bench_serve_runs_every_configuration_on_two_files(asr, speech_real, tmp_path, capsys):
    import json

    from pipelines.cli import main
    from pipelines.serve.bench import bench_serve, percentile

    items = sorted(speech_real, key=lambda i: i["duration"])[:2]
    files = [(Path(i["audio_path"]), i["duration"]) for i in items]
    lines: list[str] = []
    rows = bench_serve(None, clients=(1, 2), max_batch=2, json_path=str(tmp_path / "bench.json"), asr=asr,
                       files=files, log=lines.append)
    assert [(r.batching, r.assistant, r.clients) for r in rows] == [
        (b, a, n) for b in ("one-at-a-time", "batched") for a in (False, True) for n in (1, 2)]
    for r in rows:
        assert r.identical and r.requests == 2 and r.audio_seconds == round(sum(d for _, d in files), 2)
        assert 0 < r.p50_seconds <= r.p95_seconds <= r.wall_seconds
        # both figures are rounded from the same unrounded wall time: equal within the rounding
        assert r.requests_per_second == pytest.approx(2 / r.wall_seconds, abs=1e-3)
    assert sum("batching x" in line for line in lines) == 4 and sum("the assistant x" in line for line in lines) == 4
    assert len(json.loads((tmp_path / "bench.json").read_text())["rows"]) == 8
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0 and percentile([3.0, 1.0, 2.0, 4.0], 95) == 4.0

    with pytest.raises(SystemExit) as bad:
        main(["bench", "serve", "--clients", "1,0"])
    assert bad.value.code == 2
    assert "--clients" in capsys.readouterr().err
