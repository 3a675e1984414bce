"""Realistic inputs made here, deterministically: real text, pages and strips rendered with Pillow, audio.

Nothing may be downloaded at run time, so the text is the Python standard library's own docstrings
(real English prose, varying with the Python version only) and the images are that text rendered with
Pillow's built-in scalable font. Every function takes a numpy Generator so a seed fixes its output.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
import warnings

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# Modules whose public docstrings make the text pool (a module missing on some Python is skipped).
_DOC_MODULES = (
    "argparse", "base64", "bisect", "builtins", "calendar", "collections", "copy", "csv", "datetime",
    "decimal", "difflib", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "inspect",
    "itertools", "json", "logging", "math", "operator", "os", "os.path", "pathlib", "random", "re",
    "shutil", "socket", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile",
    "textwrap", "threading", "time", "typing", "unittest", "urllib.parse", "uuid", "zipfile", "zlib",
)  # fmt: skip
_WS = re.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def docstrings() -> tuple[str, ...]:
    """First paragraphs of stdlib docstrings: ASCII prose of 40-400 characters, sorted, unique."""
    found: set[str] = set()
    for module_name in _DOC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in sorted(dir(module)):
            if attr.startswith("_"):
                continue
            with warnings.catch_warnings():  # typing.io and friends warn when touched
                warnings.simplefilter("ignore", DeprecationWarning)
                doc = inspect.getdoc(getattr(module, attr, None)) or ""
            para = _WS.sub(" ", doc.split("\n\n")[0]).strip()
            # Signature lines ("sqrt(x)") and non-ASCII text are not the prose we want.
            if 40 <= len(para) <= 400 and para.isascii() and " " in para and not para.endswith(")"):
                found.add(para)
    return tuple(sorted(found))


@functools.lru_cache(maxsize=1)
def word_pool() -> tuple[str, ...]:
    words = {w for text in docstrings() for w in re.findall(r"[A-Za-z][A-Za-z0-9]{1,11}", text)}
    return tuple(sorted(words))


def pick_texts(rng: np.random.Generator, n: int) -> list[str]:
    """n different docstrings (without replacement while the pool lasts)."""
    pool = docstrings()
    order = rng.permutation(len(pool))
    return [pool[int(order[i % len(pool)])] for i in range(n)]


def sentence(rng: np.random.Generator, min_words: int, max_words: int) -> str:
    pool = word_pool()
    k = int(rng.integers(min_words, max_words + 1))
    return " ".join(pool[int(i)] for i in rng.integers(0, len(pool), size=k))


@functools.lru_cache(maxsize=64)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    # Pillow >= 10.1 ships a scalable default font (ASCII glyphs), so no font file is needed.
    return ImageFont.load_default(size=size)


def _pale(rng: np.random.Generator) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(205, 256, size=3))  # type: ignore[return-value]


def _dark(rng: np.random.Generator) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(0, 90, size=3))  # type: ignore[return-value]


def _paper(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A pale background with a soft gradient and sensor-like noise, like a photo or scan."""
    top, bottom = np.array(_pale(rng), np.float32), np.array(_pale(rng), np.float32)
    ramp = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    img = top * (1 - ramp) + bottom * ramp + rng.normal(0, 3, size=(height, width, 3)).astype(np.float32)
    return Image.fromarray(np.broadcast_to(img, (height, width, 3)).clip(0, 255).astype(np.uint8))


def _add_noise(img: Image.Image, rng: np.random.Generator, sigma: float) -> Image.Image:
    arr = np.asarray(img, dtype=np.float32)
    arr = arr + rng.normal(0, sigma, size=arr.shape).astype(np.float32)
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8))


def text_page(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo-like page of text lines in several sizes and colours, with a few non-text marks."""
    img = _paper(rng, width, height)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(1, 4))):  # boxes and rules that are not text
        x0, y0 = int(rng.integers(0, width - 60)), int(rng.integers(0, height - 60))
        x1, y1 = x0 + int(rng.integers(30, 200)), y0 + int(rng.integers(2, 120))
        draw.rectangle((x0, y0, x1, y1), outline=_dark(rng), width=int(rng.integers(1, 3)))
    y = int(rng.integers(8, 40))
    while y < height - 40:
        size = int(rng.integers(16, 42))
        line = sentence(rng, 2, 8)
        x = int(rng.integers(8, max(9, width // 3)))
        draw.text((x, y), line, font=font(size), fill=_dark(rng))
        y += int(size * rng.uniform(1.4, 2.6))
    return _add_noise(img, rng, 2.0)


def text_line(rng: np.random.Generator) -> Image.Image:
    """A cropped text-line image, as a detector hands it to the direction classifier."""
    size = int(rng.integers(22, 44))
    text = sentence(rng, 1, 5)
    f = font(size)
    left, top, right, bottom = f.getbbox(text)
    pad_x, pad_y = int(rng.integers(2, 10)), int(rng.integers(2, 8))
    img = _paper(rng, right - left + 2 * pad_x, bottom - top + 2 * pad_y)
    ImageDraw.Draw(img).text((pad_x - left, pad_y - top), text, font=f, fill=_dark(rng))
    return _add_noise(img, rng, 2.0)


def captcha_strip(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A captcha-like strip: 4-6 characters (or a short word), jittered, with noise strokes."""
    img = _paper(rng, width, height)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        pts = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(2)]
        draw.line(pts, fill=tuple(int(v) for v in rng.integers(100, 200, size=3)), width=1)
    if rng.random() < 0.5:
        alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz23456789"
        chars = [alphabet[int(i)] for i in rng.integers(0, len(alphabet), size=int(rng.integers(4, 7)))]
    else:
        chars = list(sentence(rng, 1, 1)[:8])
    x = int(rng.integers(4, 24))
    for ch in chars:
        size = int(rng.integers(34, 48))
        f = font(size)
        _, top, right, bottom = f.getbbox(ch)
        y = int(rng.integers(0, max(1, height - bottom))) - top // 2
        draw.text((x, y), ch, font=f, fill=_dark(rng))
        x += right + int(rng.integers(0, 8))
        if x > width - 20:
            break
    return _add_noise(img, rng, 4.0).convert("L")


def click_captcha(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A click-captcha-like picture: busy colourful background with a few large scattered characters."""
    base = rng.integers(60, 200, size=(2, 2, 3)).astype(np.uint8)
    img = Image.fromarray(base).resize((width, height), Image.BILINEAR)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(6, 14))):  # background clutter
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(8, 40))
        fill = tuple(int(v) for v in rng.integers(40, 230, size=3))
        draw.ellipse((x0 - r, y0 - r, x0 + r, y0 + r), fill=fill)
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    cells = rng.permutation(8)[: int(rng.integers(3, 6))]  # a 4x2 grid keeps characters apart
    for cell in cells:
        ch = alphabet[int(rng.integers(0, len(alphabet)))]
        size = int(rng.integers(34, 54))
        cx = (int(cell) % 4) * width // 4 + int(rng.integers(4, max(5, width // 4 - size)))
        cy = (int(cell) // 4) * height // 2 + int(rng.integers(2, max(3, height // 2 - size)))
        glyph = Image.new("L", (size * 2, size * 2), 0)
        ImageDraw.Draw(glyph).text((size // 2, size // 4), ch, font=font(size), fill=255)
        glyph = glyph.rotate(float(rng.uniform(-30, 30)), resample=Image.BILINEAR)
        colour = Image.new("RGB", glyph.size, tuple(int(v) for v in rng.integers(0, 256, size=3)))
        img.paste(colour, (cx - size // 2, cy - size // 4), glyph)
    return _add_noise(img, rng, 3.0)


def _paragraph(draw: ImageDraw.ImageDraw, rng: np.random.Generator, box: tuple[int, int, int],
               size: int, lines: int) -> int:  # fmt: skip
    """Justified-looking body lines from x0 to x1 starting at y; returns the y after the block."""
    x0, x1, y = box
    f = font(size)
    for i in range(lines):
        text, last = "", i == lines - 1
        limit = (x1 - x0) * (rng.uniform(0.4, 0.8) if last else 0.97)
        while True:
            word = word_pool()[int(rng.integers(0, len(word_pool())))]
            candidate = f"{text} {word}".strip()
            if f.getlength(candidate) > limit:
                break
            text = candidate
        draw.text((x0 + (size * 2 if i == 0 else 0), y), text, font=f, fill=(20, 20, 20))
        y += int(size * 1.45)
    return y


def document_page(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A rendered document page: header, title, paragraphs, a figure with caption, a table, footer."""
    img = Image.new("RGB", (width, height), _pale(rng))
    draw = ImageDraw.Draw(img)
    margin = int(width * rng.uniform(0.07, 0.11))
    body = int(rng.integers(15, 19))
    draw.text((margin, 18), sentence(rng, 3, 6), font=font(body - 3), fill=(90, 90, 90))  # header
    draw.line((margin, 40, width - margin, 40), fill=(120, 120, 120), width=1)
    title = sentence(rng, 3, 7).title()
    tsize = int(rng.integers(26, 36))
    tw = font(tsize).getlength(title)
    draw.text(((width - tw) / 2, 58), title, font=font(tsize), fill=(0, 0, 0))
    y = 58 + int(tsize * 2.2)
    blocks = ["text", "figure", "text", "table", "text"]
    rng.shuffle(blocks)
    for block in blocks:
        if y > height - 180:
            break
        if block == "text":
            y = _paragraph(draw, rng, (margin, width - margin, y), body, int(rng.integers(3, 7))) + body
        elif block == "figure":
            fw, fh = int((width - 2 * margin) * rng.uniform(0.5, 0.8)), int(rng.integers(120, 200))
            fx = (width - fw) // 2
            draw.rectangle((fx, y, fx + fw, y + fh), outline=(60, 60, 60), width=1)
            bars = int(rng.integers(4, 9))
            for b in range(bars):  # a bar chart
                bh = int(rng.uniform(0.2, 0.9) * (fh - 20))
                bx = fx + 15 + b * (fw - 30) // bars
                fill = tuple(int(v) for v in rng.integers(30, 200, size=3))
                draw.rectangle((bx, y + fh - 10 - bh, bx + (fw - 30) // bars - 8, y + fh - 10), fill=fill)
            y += fh + 8
            cap = f"Figure {int(rng.integers(1, 9))}: {sentence(rng, 4, 9)}"
            draw.text((fx, y), cap, font=font(body - 2), fill=(30, 30, 30))
            y += int(body * 2.4)
        else:
            cap = f"Table {int(rng.integers(1, 9))}: {sentence(rng, 3, 7)}"
            draw.text((margin, y), cap, font=font(body - 2), fill=(30, 30, 30))
            y += int(body * 1.6)
            rows, cols = int(rng.integers(3, 7)), int(rng.integers(3, 6))
            cw, rh = (width - 2 * margin) // cols, int(body * 1.7)
            for r in range(rows + 1):
                draw.line((margin, y + r * rh, margin + cols * cw, y + r * rh), fill=(40, 40, 40))
            for c in range(cols + 1):
                draw.line((margin + c * cw, y, margin + c * cw, y + rows * rh), fill=(40, 40, 40))
            for r in range(rows):
                for c in range(cols):
                    cell = (
                        sentence(rng, 1, 1)
                        if r == 0
                        else f"{rng.uniform(0, 1000):.{int(rng.integers(0, 3))}f}"
                    )
                    draw.text(
                        (margin + c * cw + 5, y + r * rh + 4), cell[:10], font=font(body - 3), fill=(0, 0, 0)
                    )
            y += rows * rh + int(body * 1.8)
    footer = f"{int(rng.integers(1, 300))}"
    draw.text(((width - font(body - 3).getlength(footer)) / 2, height - 34), footer, font=font(body - 3),
              fill=(90, 90, 90))  # fmt: skip
    return _add_noise(img, rng, 1.5)


def letterbox(img: Image.Image, size: int, fill: int = 114) -> Image.Image:
    """Resize keeping the aspect ratio into a size x size canvas at the top-left (YOLOX's preproc)."""
    r = min(size / img.width, size / img.height)
    resized = img.resize((int(img.width * r), int(img.height * r)), Image.BILINEAR)
    canvas = Image.new("RGB", (size, size), (fill, fill, fill))
    canvas.paste(resized, (0, 0))
    return canvas


# ---------------------------------------------------------------- audio

SAMPLE_RATE = 16_000


def voice_like(rng: np.random.Generator, samples: int) -> np.ndarray:
    """A voiced, speech-like signal: a glottal-pulse-rich harmonic series with a wandering pitch,
    shaped by moving formant-like resonances and a syllable-rate (3-6 Hz) loudness envelope."""
    t = np.arange(samples) / SAMPLE_RATE
    f0 = rng.uniform(95, 230) * (1 + 0.08 * np.sin(2 * math.pi * rng.uniform(0.5, 2.0) * t))
    phase = 2 * math.pi * np.cumsum(f0) / SAMPLE_RATE
    formants = rng.uniform([300, 900, 2200], [800, 2200, 3200])
    signal = np.zeros(samples)
    for k in range(1, 40):
        fk = k * f0
        gain = sum(np.exp(-(((fk - f) / 150.0) ** 2)) for f in formants) / k**0.7
        signal += gain * np.sin(k * phase)
    rate = rng.uniform(3, 6)
    envelope = np.clip(np.sin(2 * math.pi * rate * t + rng.uniform(0, math.pi)), 0, None) ** 0.6
    signal = signal * envelope + 0.02 * rng.standard_normal(samples) * envelope
    return _normalize(signal, rng.uniform(0.1, 0.5))


def non_voice(rng: np.random.Generator, samples: int) -> np.ndarray:
    """Background without speech: near-silence, broadband noise, a mains hum, or a clicking machine."""
    kind = int(rng.integers(0, 4))
    t = np.arange(samples) / SAMPLE_RATE
    if kind == 0:
        signal, level = rng.standard_normal(samples), rng.uniform(0.001, 0.01)
    elif kind == 1:
        signal, level = np.cumsum(rng.standard_normal(samples)) * 0.02, rng.uniform(0.05, 0.3)  # brown noise
        signal = signal - np.convolve(signal, np.ones(400) / 400, mode="same")
    elif kind == 2:
        hum = rng.choice([50.0, 60.0])
        signal = sum(np.sin(2 * math.pi * hum * k * t) / k for k in (1, 2, 3))
        signal, level = signal + 0.05 * rng.standard_normal(samples), rng.uniform(0.05, 0.3)
    else:
        signal = np.zeros(samples)
        period = int(rng.integers(800, 4000))
        signal[::period] = 1.0
        signal = np.convolve(signal, np.exp(-np.arange(200) / 30.0), mode="same")
        signal, level = signal + 0.01 * rng.standard_normal(samples), rng.uniform(0.1, 0.4)
    return _normalize(np.asarray(signal, dtype=np.float64), level)


def _normalize(signal: np.ndarray, peak: float) -> np.ndarray:
    top = float(np.max(np.abs(signal))) or 1.0
    return (signal / top * peak).astype(np.float32)
