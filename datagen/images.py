"""Synthetic images with captions and question/answer pairs, rendered with plain numpy.

Two scene kinds on a `image_size`×`image_size` RGB uint8 canvas with a uniform dark background:
- `shapes`: 1..max_objects objects (square, circle, triangle; palette colors), each in its own cell of a
  `grid`×`grid` layout, jittered in size (50-80% of the cell) and position but kept at least one pixel
  inside its cell, so objects never touch and each is one connected region of its exact palette color.
  Caption: "A red circle at the top left and a blue square at the bottom right."
- `digit`: one digit 0-9 from a 3×5 bitmap font, scaled by the largest integer factor that fits 80% of
  the canvas, in a palette color, at a jittered position. Caption: "The digit 7 in green."

Questions (a seeded subset of the candidates, `questions_per_image` per image) ask for counts ("How many
circles are there?"), colors ("What color is the square?", only when the shape is unique), shapes at
positions ("What shape is at the top left?" → a shape or "nothing"), positions ("Where is the red
circle?", only when unique), the digit shown and its color. Answers are single words or numbers.

Every shape fills an integer s×s box with top-left pixel (top, left); in pixel-center coordinates
(x + ½, y + ½), with cx = left + s/2, cy = top + s/2, r = s/2 and y, x inside the box:
    square    every pixel of the box          circle   (x−cx)² + (y−cy)² ≤ r²
    triangle  apex up, base the bottom row:   |x−cx| ≤ (y − top)/2 + ½
so each shape touches all four sides of its box, and its fill of the box tells it apart: square 1,
circle ≈ π/4, triangle ≈ ½.
The table stores each image as raw HWC bytes (`decode_image` turns a row back into an array); the vision
encoder patchifies `image_size` with its own patch size (see `image_token_count`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from datagen.io import sha256_bytes, with_metadata
from datagen.seeding import rng as make_rng
from datagen.seeding import stable_fraction

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 230),
    "yellow": (235, 215, 40),
    "white": (240, 240, 240),
    "magenta": (210, 60, 200),
    "cyan": (50, 200, 210),
    "orange": (245, 140, 30),
}
SHAPES = ("square", "circle", "triangle")
SCENE_KINDS = ("shapes", "digit")
NUMBER_ANSWERS = tuple(str(i) for i in range(10))
# Background gray levels stay below every palette color's brightest channel.
MAX_BACKGROUND = 48

# 3×5 bitmap font: rows top to bottom, "#" = ink.
DIGIT_FONT: dict[int, tuple[str, ...]] = {
    0: ("###", "#.#", "#.#", "#.#", "###"),
    1: (".#.", "##.", ".#.", ".#.", "###"),
    2: ("###", "..#", "###", "#..", "###"),
    3: ("###", "..#", ".##", "..#", "###"),
    4: ("#.#", "#.#", "###", "..#", "..#"),
    5: ("###", "#..", "###", "..#", "###"),
    6: ("###", "#..", "###", "#.#", "###"),
    7: ("###", "..#", ".#.", ".#.", ".#."),
    8: ("###", "#.#", "###", "#.#", "###"),
    9: ("###", "#.#", "###", "..#", "###"),
}


def digit_bitmap(d: int) -> np.ndarray:
    """The 5×3 boolean glyph of digit d."""
    return np.array([[c == "#" for c in row] for row in DIGIT_FONT[d]], dtype=bool)


@dataclass(frozen=True)
class ImagesConfig:
    seed: int = 0
    image_size: int = 32
    # Objects sit one per cell of a grid×grid layout; grid is 2 or 3 (position names exist for those).
    grid: int = 2
    max_objects: int = 4
    colors: tuple[str, ...] = ("red", "green", "blue", "yellow", "white")
    n_images: int = 4000
    heldout_fraction: float = 0.1
    digit_fraction: float = 0.25
    questions_per_image: int = 3

    def __post_init__(self):
        if self.grid not in (2, 3):
            raise ValueError(f"grid must be 2 or 3, got {self.grid}")
        if self.image_size < 8 * self.grid:
            raise ValueError(
                f"image_size={self.image_size} leaves cells under 8 px; use at least {8 * self.grid}"
            )
        if not 1 <= self.max_objects <= self.grid**2:
            raise ValueError(f"max_objects must be in [1, {self.grid ** 2}], got {self.max_objects}")
        unknown = set(self.colors) - set(PALETTE)
        if len(self.colors) < 2 or unknown:
            raise ValueError(f"colors must be at least two of {tuple(PALETTE)}, got {self.colors}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if not 0.0 <= self.digit_fraction <= 1.0:
            raise ValueError(f"digit_fraction must be in [0, 1], got {self.digit_fraction}")
        if self.n_images < 2 or self.questions_per_image < 1:
            raise ValueError("need n_images >= 2 and questions_per_image >= 1")


def image_token_count(image_size: int, patch_size: int, merge: int = 2) -> int:
    """Vision tokens per image after patchifying and a merge×merge space-to-depth merge."""
    if image_size % (patch_size * merge):
        raise ValueError(
            f"image_size={image_size} must be a multiple of patch_size*merge={patch_size * merge}"
        )
    side = image_size // (patch_size * merge)
    return side * side


def position_names(grid: int) -> tuple[str, ...]:
    """Names of the grid cells in row-major order."""
    if grid == 2:
        return ("top left", "top right", "bottom left", "bottom right")
    rows, cols = ("top", "middle", "bottom"), ("left", "center", "right")
    return tuple("center" if (r, c) == ("middle", "center") else f"{r} {c}" for r in rows for c in cols)


def cell_bounds(image_size: int, grid: int, cell: int) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1) pixel bounds of a cell (end-exclusive)."""
    r, c = divmod(cell, grid)
    edges = [round(i * image_size / grid) for i in range(grid + 1)]
    return edges[r], edges[r + 1], edges[c], edges[c + 1]


def shape_mask(shape: str, size: int, top: int, left: int, side: int) -> np.ndarray:
    """Boolean [size, size] mask of a shape in the side×side box at (top, left) (module docstring)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    in_box = (y >= top) & (y < top + side) & (x >= left) & (x < left + side)
    cy, cx, r = top + side / 2, left + side / 2, side / 2
    if shape == "square":
        return in_box
    if shape == "circle":
        return in_box & ((x - cx) ** 2 + (y - cy) ** 2 <= r * r)
    if shape == "triangle":
        return in_box & (np.abs(x - cx) <= (y - top) / 2 + 0.5)
    raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")


@dataclass(frozen=True)
class Scene:
    kind: str
    background: int
    objects: tuple[tuple[str, str, int], ...]  # (shape, color, cell); for a digit: ("digit", color, -1)
    digit: int  # -1 for shapes scenes
    image: np.ndarray  # uint8 [H, W, 3]


def _render_shapes(cfg: ImagesConfig, rng: np.random.Generator, background: int) -> Scene:
    size = cfg.image_size
    img = np.full((size, size, 3), background, dtype=np.uint8)
    n = int(rng.integers(1, cfg.max_objects + 1))
    cells = np.sort(rng.choice(cfg.grid**2, size=n, replace=False))
    objects = []
    for cell in cells:
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        color = cfg.colors[int(rng.integers(len(cfg.colors)))]
        y0, y1, x0, x1 = cell_bounds(size, cfg.grid, int(cell))
        # Side 50-80% of the cell, box jittered so the object stays at least 1 px inside the cell.
        span = min(y1 - y0, x1 - x0)
        side = int(rng.integers(span // 2, min(int(0.8 * span), span - 2) + 1))
        top = int(rng.integers(y0 + 1, y1 - side))
        left = int(rng.integers(x0 + 1, x1 - side))
        img[shape_mask(shape, size, top, left, side)] = PALETTE[color]
        objects.append((shape, color, int(cell)))
    return Scene("shapes", background, tuple(objects), -1, img)


def _render_digit(cfg: ImagesConfig, rng: np.random.Generator, background: int) -> Scene:
    size = cfg.image_size
    img = np.full((size, size, 3), background, dtype=np.uint8)
    d = int(rng.integers(10))
    color = cfg.colors[int(rng.integers(len(cfg.colors)))]
    scale = max(1, int(0.8 * size) // 5)
    glyph = np.kron(digit_bitmap(d), np.ones((scale, scale), dtype=bool))
    gh, gw = glyph.shape
    top = int(rng.integers(0, size - gh + 1))
    left = int(rng.integers(0, size - gw + 1))
    img[top : top + gh, left : left + gw][glyph] = PALETTE[color]
    return Scene("digit", background, (("digit", color, -1),), d, img)


def _plural(word: str, n: int) -> str:
    return word if n == 1 else word + "s"


def caption(scene: Scene, grid: int) -> str:
    if scene.kind == "digit":
        return f"The digit {scene.digit} in {scene.objects[0][1]}."
    names = position_names(grid)
    parts = [f"{'an' if color[0] in 'aeiou' else 'a'} {color} {shape} at the {names[cell]}"
             for shape, color, cell in scene.objects]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text[0].upper() + text[1:] + "."


def question_candidates(scene: Scene, cfg: ImagesConfig) -> list[tuple[str, str]]:
    """Every question this generator can ask about the scene, with its answer."""
    if scene.kind == "digit":
        return [
            ("What digit is shown?", str(scene.digit)),
            ("What color is the digit?", scene.objects[0][1]),
        ]
    names = position_names(cfg.grid)
    objs = scene.objects
    qa = [("How many shapes are there?", str(len(objs)))]
    for shape in SHAPES:
        qa.append((f"How many {shape}s are there?", str(sum(o[0] == shape for o in objs))))
    for color in cfg.colors:
        if any(o[1] == color for o in objs):
            qa.append((f"How many {color} shapes are there?", str(sum(o[1] == color for o in objs))))
    for shape in SHAPES:
        matching = [o for o in objs if o[0] == shape]
        if len(matching) == 1:
            qa.append((f"What color is the {shape}?", matching[0][1]))
    by_cell = {o[2]: o for o in objs}
    for cell, name in enumerate(names):
        qa.append((f"What shape is at the {name}?", by_cell[cell][0] if cell in by_cell else "nothing"))
    for shape, color, cell in objs:
        if sum(o[0] == shape and o[1] == color for o in objs) == 1:
            qa.append((f"Where is the {color} {shape}?", names[cell]))
    return qa


def render_scene(cfg: ImagesConfig, rng: np.random.Generator) -> Scene:
    background = int(rng.integers(0, MAX_BACKGROUND + 1))
    if rng.random() < cfg.digit_fraction:
        return _render_digit(cfg, rng, background)
    return _render_shapes(cfg, rng, background)


def build_images(cfg: ImagesConfig) -> pa.Table:
    """The image table: image_id, split, kind, height, width, image (raw HWC uint8 bytes), caption,
    questions, answers, objects (shape, color, cell), digit (-1 for shape scenes), background.

    Splits are assigned by a hash of (seed, image_id); the held-out images are drawn first and a train
    image whose bytes equal a held-out image's is redrawn, so no held-out image appears in train.
    """
    splits = [
        "heldout" if stable_fraction(cfg.seed, f"image/{i}") < cfg.heldout_fraction else "train"
        for i in range(cfg.n_images)
    ]
    scenes: list[Scene | None] = [None] * cfg.n_images
    heldout_hashes: set[str] = set()
    for i in (i for i in range(cfg.n_images) if splits[i] == "heldout"):
        scenes[i] = render_scene(cfg, make_rng(cfg.seed, "images", i))
        heldout_hashes.add(sha256_bytes(scenes[i].image.tobytes()))
    for i in (i for i in range(cfg.n_images) if splits[i] == "train"):
        r = make_rng(cfg.seed, "images", i)
        scene = render_scene(cfg, r)
        while sha256_bytes(scene.image.tobytes()) in heldout_hashes:
            scene = render_scene(cfg, r)
        scenes[i] = scene

    questions, answers = [], []
    for i, scene in enumerate(scenes):
        qa = question_candidates(scene, cfg)
        pick = make_rng(cfg.seed, "image-questions", i).permutation(len(qa))[: cfg.questions_per_image]
        questions.append([qa[int(j)][0] for j in pick])
        answers.append([qa[int(j)][1] for j in pick])

    object_type = pa.struct([("shape", pa.string()), ("color", pa.string()), ("cell", pa.int8())])
    table = pa.table(
        {
            "image_id": pa.array(range(cfg.n_images), pa.int32()),
            "split": pa.array(splits, pa.string()),
            "kind": pa.array([s.kind for s in scenes], pa.string()),
            "height": pa.array([cfg.image_size] * cfg.n_images, pa.int16()),
            "width": pa.array([cfg.image_size] * cfg.n_images, pa.int16()),
            "image": pa.array([s.image.tobytes() for s in scenes], pa.binary()),
            "caption": pa.array([caption(s, cfg.grid) for s in scenes], pa.string()),
            "questions": pa.array(questions, pa.list_(pa.string())),
            "answers": pa.array(answers, pa.list_(pa.string())),
            "objects": pa.array(
                [[{"shape": o[0], "color": o[1], "cell": o[2]} for o in s.objects] for s in scenes],
                pa.list_(object_type),
            ),
            "digit": pa.array([s.digit for s in scenes], pa.int8()),
            "background": pa.array([s.background for s in scenes], pa.uint8()),
        }
    )
    return with_metadata(table, {"generator": "images", "config": asdict(cfg)})


def decode_image(data: bytes, height: int, width: int) -> np.ndarray:
    """Raw HWC bytes from the `image` column → uint8 array [height, width, 3]."""
    return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)


def images_array(table: pa.Table) -> np.ndarray:
    """All images of a table as one uint8 array [N, H, W, 3] (all rows must share a size)."""
    heights, widths = set(table.column("height").to_pylist()), set(table.column("width").to_pylist())
    if len(heights) != 1 or len(widths) != 1:
        raise ValueError(f"images differ in size ({heights} × {widths}); decode them one by one")
    h, w = heights.pop(), widths.pop()
    flat = b"".join(table.column("image").to_pylist())
    return np.frombuffer(flat, dtype=np.uint8).reshape(len(table), h, w, 3)
