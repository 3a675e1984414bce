"""`--data PATH`: the user's real data as model rows, without writing an .npz by hand.

- a folder of images (jpg, png, bmp, webp) for a model with one image input [N, C, H, W] or
  [N, H, W, C]: converted to RGB (or grey for one channel), resized to the pinned H x W and scaled as
  `--preprocess` says (presets: imagenet, unit, signed, raw, yolo; or keys, see PREPROCESS_HELP);
- a text file, one text per line, with `--tokenizer tokenizer.json` (the `tokenizers` library):
  token ids, attention mask and token types padded and truncated to the pinned sequence length;
- a wav file or a folder of them, for a 1-D audio model [N, samples] (or [N, 1, samples]): PCM
  mixed to mono in [-1, 1], cut into consecutive windows of the pinned length; a sample-rate input
  gets the files' rate, recurrent state inputs start at zeros;
- an .npz of rows, read as `--calib-data` reads one.

Every image, line or window is one row; the rows are grouped into samples of the pinned batch and
then split into calibration and judging rows (optimize/data/rows.py). Anything lto cannot
turn into the model's inputs is a one-line error that says what to give instead.
"""

from __future__ import annotations

import tempfile
import wave
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimize.backend import TensorSpec
from optimize.data.npz import load_samples
from optimize.data.rows import RealRows, read_real_rows
from optimize.data.spec import embedding_vocab_sizes
from optimize.errors import InputError, UsageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
AUDIO_SUFFIXES = (".wav",)
TEXT_SUFFIXES = (".txt", ".text", ".tsv", ".lines")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_RATIO = 0.875  # ImageNet evaluation: resize to size / 0.875, then centre-crop to size
LETTERBOX_PAD = 114  # the grey YOLO exporters pad with

PREPROCESS_HELP = (
    "imagenet (RGB, resize and centre-crop, /255, ImageNet mean/std), unit (RGB, stretch, /255), "
    "signed (RGB, stretch, /255, mean 0.5 std 0.5), raw (RGB, stretch, 0-255), yolo (RGB, letterbox "
    "pad 114, /255); then keys to change one: bgr, rgb, resize=stretch|crop|letterbox, scale=255, "
    "mean=R:G:B, std=R:G:B, pad=114; e.g. 'imagenet,bgr'"
)


@dataclass(frozen=True)
class ImagePrep:
    """How an image becomes a tensor."""

    resize: str = "stretch"  # stretch | crop | letterbox
    scale: float = 255.0  # pixel values are divided by this
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    bgr: bool = False
    pad: int = LETTERBOX_PAD


PRESETS: dict[str, ImagePrep] = {
    "imagenet": ImagePrep("crop", 255.0, IMAGENET_MEAN, IMAGENET_STD),
    "unit": ImagePrep("stretch", 255.0),
    "signed": ImagePrep("stretch", 255.0, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "raw": ImagePrep("stretch", 1.0),
    "yolo": ImagePrep("letterbox", 255.0),
}


def _floats(key: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace("/", ":").split(":"))
    except ValueError:
        raise UsageError(f"--preprocess {key}={text!r}: not numbers", "e.g. mean=0.485:0.456:0.406") from None
    if len(values) not in (1, 3):
        raise UsageError(f"--preprocess {key}= takes 1 or 3 values, got {len(values)}")
    return values if len(values) == 3 else values * 3


def parse_preprocess(spec: str | None) -> ImagePrep:
    """`--preprocess imagenet,bgr` as an ImagePrep; a missing or bad spec is a usage error."""
    if not spec:
        raise UsageError("--data with images needs --preprocess", PREPROCESS_HELP)
    items = [item.strip().lower() for item in spec.split(",") if item.strip()]
    if not items or items[0] not in PRESETS:
        raise UsageError(f"--preprocess must start with a preset, got {spec!r}", PREPROCESS_HELP)
    prep = PRESETS[items[0]]
    changes: dict[str, Any] = {}
    for item in items[1:]:
        key, sep, value = item.partition("=")
        if not sep and key in ("bgr", "rgb"):
            changes["bgr"] = key == "bgr"
        elif key == "resize" and value in ("stretch", "crop", "letterbox"):
            changes["resize"] = value
        elif key in ("mean", "std"):
            changes[key] = _floats(key, value)
        elif key == "scale":
            scale = _floats(key, value)[0]
            if scale <= 0:
                raise UsageError("--preprocess scale= must be positive")
            changes["scale"] = scale
        elif key == "pad" and value.isdigit() and int(value) <= 255:
            changes["pad"] = int(value)
        else:
            raise UsageError(f"--preprocess: bad item {item!r}", PREPROCESS_HELP)
    if any(s == 0 for s in changes.get("std", prep.std)):
        raise UsageError("--preprocess std= must not be 0")
    return ImagePrep(**{**prep.__dict__, **changes})


# --- images -------------------------------------------------------------------------------------


def _image_layout(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[bool, int, int, int]:
    """(channels first, channels, height, width) of an image input pinned at `shape`."""
    if len(shape) != 4:
        raise InputError(
            f"--data of images: input {spec.name!r} has shape {list(shape)}, not an image batch "
            "[N, C, H, W] or [N, H, W, C]",
            "give --calib-data FILE.npz for this model",
        )
    if shape[1] in (1, 3):
        return True, shape[1], shape[2], shape[3]
    if shape[3] in (1, 3):
        return False, shape[3], shape[1], shape[2]
    raise InputError(
        f"--data of images: input {spec.name!r} {list(shape)} has {shape[1]} channels on axis 1 and "
        f"{shape[3]} on axis 3; images give 1 (grey) or 3 (RGB)",
        "give --calib-data FILE.npz for this model",
    )


def _resized(img: Any, prep: ImagePrep, height: int, width: int) -> Any:
    from PIL import Image

    if prep.resize == "stretch":
        return img.resize((width, height), Image.BILINEAR)
    if prep.resize == "crop":
        scale = max(height / img.height, width / img.width) / CROP_RATIO
        w, h = max(width, round(img.width * scale)), max(height, round(img.height * scale))
        img = img.resize((w, h), Image.BILINEAR)
        left, top = (w - width) // 2, (h - height) // 2
        return img.crop((left, top, left + width, top + height))
    scale = min(height / img.height, width / img.width)
    w, h = max(1, round(img.width * scale)), max(1, round(img.height * scale))
    fill = prep.pad if img.mode == "L" else (prep.pad,) * 3
    canvas = Image.new(img.mode, (width, height), fill)
    canvas.paste(img.resize((w, h), Image.BILINEAR), ((width - w) // 2, (height - h) // 2))
    return canvas


def image_rows(
    files: Sequence[Path], spec: TensorSpec, shape: tuple[int, ...], prep: ImagePrep
) -> np.ndarray:
    """[images, *shape[1:]] for one image input, each image preprocessed as `prep` says."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise UsageError("--data of images needs Pillow", "pip install 'lto-onnx[data]'") from None
    first, channels, height, width = _image_layout(spec, shape)
    integer = spec.dtype in ("uint8", "int8")
    if integer and (prep.scale != 1.0 or any(prep.mean) or prep.std != (1.0, 1.0, 1.0)):
        raise UsageError(f"input {spec.name!r} is {spec.dtype}: pixels go in as they are", "--preprocess raw")
    rows = []
    for path in files:
        try:
            with Image.open(path) as opened:
                img = opened.convert("L" if channels == 1 else "RGB")
        except (OSError, UnidentifiedImageError) as exc:
            raise InputError(f"--data: cannot read image {path.name}: {exc}") from None
        arr = np.asarray(_resized(img, prep, height, width), dtype=np.float32)
        if channels == 1:
            arr = arr[..., None]
        elif prep.bgr:
            arr = arr[..., ::-1]
        if not integer:
            mean = np.asarray(prep.mean[:channels], np.float32)
            std = np.asarray(prep.std[:channels], np.float32)
            arr = (arr / prep.scale - mean) / std
        rows.append(np.transpose(arr, (2, 0, 1)) if first else arr)
    return np.stack(rows).astype(spec.dtype)


# --- text ---------------------------------------------------------------------------------------


def _text_role(name: str) -> str:
    lowered = name.lower()
    if "type" in lowered or "segment" in lowered:
        return "types"
    if "mask" in lowered:
        return "mask"
    if "position" in lowered:
        return "positions"
    if "ids" in lowered or "token" in lowered or "input" in lowered:
        return "ids"
    return ""


def text_rows(
    lines: Sequence[str],
    tokenizer_path: Path,
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]],
    vocab: Mapping[str, int],
) -> dict[str, np.ndarray]:
    """Token ids, mask and types for every line, padded and truncated to the pinned length."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            "--data of text needs the tokenizers library", "pip install 'lto-onnx[data]'"
        ) from None
    try:
        tok = Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:
        raise InputError(
            f"--tokenizer {tokenizer_path.name} does not load: {str(exc).splitlines()[0]}"
        ) from None
    roles: dict[str, str] = {}
    for spec in specs:
        role = "ids" if spec.name in vocab else _text_role(spec.name)
        shape = shapes[spec.name]
        if not role or len(shape) != 2:
            raise InputError(
                f"--data of text: lto cannot fill input {spec.name!r} {list(shape)} from a tokenizer",
                "give --calib-data FILE.npz for this model",
            )
        roles[spec.name] = role
    ids_name = next((n for n, r in roles.items() if r == "ids"), None)
    if ids_name is None:
        raise InputError("--data of text: the model has no token-id input", "give --calib-data FILE.npz")
    length = shapes[ids_name][1]
    limit = vocab.get(ids_name)
    if limit is not None and tok.get_vocab_size() > limit:
        raise InputError(
            f"--tokenizer {tokenizer_path.name} has {tok.get_vocab_size()} tokens and the model's embedding "
            f"{limit} rows: it is not this model's tokenizer"
        )
    pad_id = tok.token_to_id("[PAD]") or tok.token_to_id("<pad>") or 0
    tok.enable_truncation(length)
    tok.enable_padding(length=length, pad_id=pad_id)
    encodings = tok.encode_batch(list(lines))
    columns = {
        "ids": np.array([e.ids for e in encodings]),
        "mask": np.array([e.attention_mask for e in encodings]),
        "types": np.array([e.type_ids for e in encodings]),
        "positions": np.tile(np.arange(length), (len(encodings), 1)),
    }
    if limit is not None and columns["ids"].size and int(columns["ids"].max()) >= limit:
        raise InputError(
            f"--tokenizer {tokenizer_path.name} gives token id {int(columns['ids'].max())}, outside the "
            f"model's embedding of {limit} rows: it is not this model's tokenizer"
        )
    by_name = {s.name: s for s in specs}
    return {name: columns[role].astype(by_name[name].dtype) for name, role in roles.items()}


# --- audio --------------------------------------------------------------------------------------


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """(mono samples in [-1, 1] as float32, sample rate) of a PCM wav file."""
    try:
        with wave.open(str(path), "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise InputError(f"--data: cannot read {path.name} as a PCM wav file: {exc}") from None
    if width == 1:
        data = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        data = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        data = (np.where(ints >= 1 << 23, ints - (1 << 24), ints)).astype(np.float32) / float(1 << 23)
    else:
        data = np.frombuffer(raw, "<i4").astype(np.float32) / float(1 << 31)
    return data.reshape(-1, channels).mean(axis=1), rate


def audio_rows(
    files: Sequence[Path],
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]],
    axes: Mapping[str, int | None],
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Consecutive windows of the pinned length from every file, one row each; a sample-rate
    input gets the files' rate; state inputs start at zeros (said in the warnings)."""
    signal = [s for s in specs if s.dtype.startswith("float") and len(shapes[s.name]) in (2, 3)
              and not _is_state(s.name)]  # fmt: skip
    if len(signal) != 1:
        raise InputError(
            "--data of audio needs one float input [N, samples] (or [N, 1, samples]); the model has "
            f"{len(signal)}: {', '.join(s.name for s in signal) or 'none'}",
            "give --calib-data FILE.npz for this model",
        )
    audio = signal[0]
    window = shapes[audio.name][-1]
    clips = [read_wav(path) for path in files]
    rates = sorted({rate for _, rate in clips})
    if len(rates) > 1:
        raise InputError(
            f"--data: the wav files have different sample rates {rates}", "lto does not resample"
        )
    rows = [clip[i * window : (i + 1) * window] for clip, _ in clips for i in range(len(clip) // window)]
    if not rows:
        raise InputError(f"--data: no wav file holds a whole window of {window} samples")
    out: dict[str, np.ndarray] = {}
    stack = np.stack(rows).astype(audio.dtype)
    out[audio.name] = stack if len(shapes[audio.name]) == 2 else stack[:, None, :]
    warnings = [
        f"--data: {len(rows)} windows of {window} samples from {len(files)} wav file(s) at {rates[0]} Hz; "
        "lto does not resample, so the model must expect that rate"
    ]
    for spec in specs:
        if spec.name == audio.name:
            continue
        shape, axis = shapes[spec.name], axes.get(spec.name)
        # One value per row, rows on axis 0 (read_data moves them to the input's batch axis).
        per_row = (len(rows), *(d for i, d in enumerate(shape) if i != axis)) if axis is not None else shape
        if not spec.dtype.startswith("float") and int(np.prod(shape)) == 1:
            out[spec.name] = np.full(per_row if shape else (), rates[0], dtype=spec.dtype)  # sample rate
        elif _is_state(spec.name) and spec.dtype.startswith("float"):
            out[spec.name] = np.zeros(per_row, dtype=spec.dtype)
            warnings.append(f"--data: input {spec.name!r} (recurrent state) starts at zeros in every row")
        else:
            raise InputError(
                f"--data of audio: lto cannot fill input {spec.name!r} {list(shape)} from wav files",
                "give --calib-data FILE.npz for this model",
            )
    return out, warnings


def _is_state(name: str) -> bool:
    lowered = name.lower()
    return any(h in lowered for h in ("state", "hidden", "cell", "h0", "c0", "cache"))


# --- the entry point ----------------------------------------------------------------------------


def _files(folder: Path) -> tuple[str, list[Path]]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    audio = [p for p in files if p.suffix.lower() in AUDIO_SUFFIXES]
    if images and audio:
        raise InputError(f"--data {folder} holds both images and wav files", "give a folder of one kind")
    if not images and not audio:
        raise InputError(
            f"--data {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}) and no wav files",
            "give a folder of images or wav files, a text file, or an .npz",
        )
    return ("images", images) if images else ("audio", audio)


def _kind(path: Path) -> tuple[str, list[Path]]:
    if path.is_dir():
        return _files(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return "npz", [path]
    if suffix in AUDIO_SUFFIXES:
        return "audio", [path]
    if suffix in IMAGE_SUFFIXES:
        return "images", [path]
    if suffix in TEXT_SUFFIXES:
        return "text", [path]
    raise InputError(
        f"--data {path.name}: lto reads a folder of images or wav files, a .txt file of lines or an .npz",
        "rename a text file to .txt",
    )


def read_data(
    path: Path,
    model_path: Path,
    specs: Sequence[TensorSpec],
    feeds: Mapping[str, np.ndarray],
    axes: Mapping[str, int | None],
    *,
    preprocess: str | None = None,
    tokenizer: Path | None = None,
) -> RealRows:
    """The rows of `--data PATH`, as samples at the pinned shapes (see the module docstring)."""
    path = Path(path)
    kind, files = _kind(path)
    if kind == "npz":
        rows = read_real_rows("--data", path, specs, feeds, axes)
        rows.restacked = True  # the calibrating stages read --data's rows from lto's own file
        return rows
    if kind != "text" and tokenizer is not None:
        raise UsageError("--tokenizer applies to --data of text only")
    if kind != "images" and preprocess is not None:
        raise UsageError("--preprocess applies to --data of images only")
    shapes = {s.name: tuple(np.asarray(feeds[s.name]).shape) for s in specs}
    warnings: list[str] = []
    if kind == "images":
        if len(specs) != 1:
            raise InputError(
                f"--data of images: the model has {len(specs)} inputs "
                f"({', '.join(s.name for s in specs)}); lto fills a single image input",
                "give --calib-data FILE.npz for this model",
            )
        prep = parse_preprocess(preprocess)
        arrays = {specs[0].name: image_rows(files, specs[0], shapes[specs[0].name], prep)}
        what = f"{len(files)} image(s)"
    elif kind == "text":
        if tokenizer is None:
            raise UsageError("--data of text needs --tokenizer tokenizer.json", "the model's own tokenizer")
        try:
            lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--data: cannot read {path.name} as UTF-8 text: {exc}") from None
        if not lines:
            raise InputError(f"--data {path.name} holds no text")
        arrays = text_rows(lines, Path(tokenizer), specs, shapes, embedding_vocab_sizes(model_path))
        what = f"{len(lines)} line(s) of text"
    else:
        arrays, warnings = audio_rows(files, specs, shapes, axes)
        what = f"{len(files)} wav file(s)"
    # Rows along each input's batch axis: load_samples groups them into samples of the pinned
    # batch and checks them like any data file.
    laid = {name: _on_batch_axis(array, axes.get(name)) for name, array in arrays.items()}
    with tempfile.TemporaryDirectory(prefix="lto-data-") as tmp:
        npz = Path(tmp) / "rows.npz"
        np.savez(npz, **laid)
        samples = load_samples(npz, specs, feeds, "--data", axes)
    warnings += [w.replace(str(npz), str(path)) for w in samples.warnings]
    became = f"rows: --data {path.name}: {what} became {len(samples.samples)} samples"
    return RealRows("--data", path, samples.samples, restacked=True, warnings=warnings, notes=[became])


def _on_batch_axis(rows: np.ndarray, axis: int | None) -> np.ndarray:
    """Rows built on axis 0, moved to the input's batch axis (a shared value stays as it is)."""
    if axis is None or axis == 0 or rows.ndim <= axis:
        return rows
    return np.moveaxis(rows, 0, axis)


__all__ = ["PREPROCESS_HELP", "PRESETS", "ImagePrep", "parse_preprocess", "read_data", "read_wav"]
