"""datagen.images: pixels agree with captions and answers (counted back from the image), held-out split
disjoint, determinism."""

import re
from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from datagen.images import (
    PALETTE,
    SHAPES,
    ImagesConfig,
    build_images,
    cell_bounds,
    decode_image,
    digit_bitmap,
    images_array,
    position_names,
)
from datagen.io import write_parquet


def components(fg_HW: np.ndarray) -> list[list[tuple[int, int]]]:
    """4-connected components of a boolean mask, as pixel lists."""
    seen = np.zeros_like(fg_HW)
    out = []
    for y0, x0 in zip(*np.nonzero(fg_HW)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue, pixels = deque([(y0, x0)]), []
        while queue:
            y, x = queue.popleft()
            pixels.append((y, x))
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                inside = 0 <= ny < fg_HW.shape[0] and 0 <= nx < fg_HW.shape[1]
                if inside and fg_HW[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        out.append(pixels)
    return out


def shape_from_fill(pixels) -> str:
    """Classify a component by how much of its square bounding box it fills: square 1, circle ≈ π/4,
    triangle ≈ ½ (measured: circles 0.78-0.85, triangles 0.56-0.63 at the sizes drawn)."""
    ys, xs = zip(*pixels)
    height, width = max(ys) - min(ys) + 1, max(xs) - min(xs) + 1
    assert height == width, "every shape fills a square box"
    fill = len(pixels) / (height * width)
    return "triangle" if fill < 0.7 else "circle" if fill < 0.95 else "square"


def read_scene(image_HWC: np.ndarray, background: int, size: int, grid: int):
    """(shape, color, position) of every object, recovered from pixels alone, sorted by cell."""
    fg = np.any(image_HWC != background, axis=-1)
    names = position_names(grid)
    color_of = {rgb: name for name, rgb in PALETTE.items()}
    found = []
    for pixels in components(fg):
        colors = {tuple(int(c) for c in image_HWC[y, x]) for y, x in pixels}
        assert len(colors) == 1, "an object has exactly one color"
        cy, cx = np.mean(pixels, axis=0) + 0.5
        cell = next(c for c in range(grid * grid)
                    if cell_bounds(size, grid, c)[0] <= cy < cell_bounds(size, grid, c)[1]
                    and cell_bounds(size, grid, c)[2] <= cx < cell_bounds(size, grid, c)[3])
        found.append((cell, shape_from_fill(pixels), color_of[colors.pop()], names[cell]))
    return [f[1:] for f in sorted(found)]


CAPTION_OBJECT = re.compile(r"an? (\w+) (\w+) at the ([\w ]+?)(?:,| and |\.)")


@pytest.mark.parametrize("grid_size", [2, 3])
def test_pixels_match_captions_and_answers(cfg, images, grid_size):
    icfg = cfg.images if grid_size == 2 else replace(cfg.images, image_size=48, grid=3, max_objects=6,
                                                     colors=tuple(PALETTE), n_images=120)
    table = images if grid_size == 2 else build_images(icfg)
    pixels = images_array(table)
    for row, img in zip(table.to_pylist(), pixels):
        assert img.shape == (icfg.image_size, icfg.image_size, 3) and img.dtype == np.uint8
        if row["kind"] == "digit":
            d, color = re.fullmatch(r"The digit (\d) in (\w+)\.", row["caption"]).groups()
            fg = np.any(img != row["background"], axis=-1)
            assert {tuple(int(c) for c in img[y, x]) for y, x in zip(*np.nonzero(fg))} == {PALETTE[color]}
            ys, xs = np.nonzero(fg)
            box = fg[ys.min(): ys.max() + 1, xs.min(): xs.max() + 1]
            # Every glyph spans its full 3×5 box, so the ink's bounding box is the glyph scaled up.
            scale = box.shape[0] // 5
            assert box.shape == (5 * scale, 3 * scale)
            assert np.array_equal(box, np.kron(digit_bitmap(int(d)), np.ones((scale, scale), bool)))
            truth = {"What digit is shown?": d, "What color is the digit?": color}
        else:
            seen = read_scene(img, row["background"], icfg.image_size, icfg.grid)
            captioned = [(s, c, p) for c, s, p in CAPTION_OBJECT.findall(row["caption"].lower())]
            assert seen == captioned, row["caption"]
            truth = {"How many shapes are there?": str(len(seen))}
            for shape in SHAPES:
                truth[f"How many {shape}s are there?"] = str(sum(o[0] == shape for o in seen))
            for name in position_names(icfg.grid):
                truth[f"What shape is at the {name}?"] = next((o[0] for o in seen if o[2] == name), "nothing")
            for shape, color, pos in seen:
                truth[f"How many {color} shapes are there?"] = str(sum(o[1] == color for o in seen))
                if sum(o[0] == shape for o in seen) == 1:
                    truth[f"What color is the {shape}?"] = color
                if sum(o[:2] == (shape, color) for o in seen) == 1:
                    truth[f"Where is the {color} {shape}?"] = pos
        assert len(row["questions"]) == min(icfg.questions_per_image, len(truth))
        for q, a in zip(row["questions"], row["answers"]):
            assert truth[q] == a, (q, a, row["caption"])


def test_heldout_disjoint_and_ids(images, cfg):
    rows = images.to_pylist()
    assert [r["image_id"] for r in rows] == list(range(cfg.images.n_images))
    train = {r["image"] for r in rows if r["split"] == "train"}
    heldout = {r["image"] for r in rows if r["split"] == "heldout"}
    assert heldout and train and train.isdisjoint(heldout)
    assert 0.1 < len(heldout) / len(rows) < 0.3
    assert decode_image(rows[0]["image"], rows[0]["height"], rows[0]["width"]).shape == (32, 32, 3)


def test_deterministic_and_seeded(cfg, tmp_path):
    small = replace(cfg.images, n_images=40)
    a = write_parquet(build_images(small), tmp_path / "a.parquet")
    b = write_parquet(build_images(small), tmp_path / "b.parquet")
    c = write_parquet(build_images(replace(small, seed=1)), tmp_path / "c.parquet")
    assert a == b != c


def test_config_errors():
    with pytest.raises(ValueError, match="grid"):
        ImagesConfig(grid=4)
    with pytest.raises(ValueError, match="max_objects"):
        ImagesConfig(max_objects=5)
    with pytest.raises(ValueError, match="colors"):
        ImagesConfig(colors=("red", "teal"))
