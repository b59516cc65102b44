"""A phone photo's pass: what the full-size image costs before the model sees 224 × 224 pixels.

7. the app's pass over an uploaded file (`analyze_image` of its path: decode, EXIF turn, RGB, the model's
   resize and crop, the preview, one forward and one backward, top-5), this checkout ÷ another version
   (``--before-tree``), on a 12-MP photo and on a small one
7a. the parts that grow with the photo: decoding alone, one full-size copy (what `Image.convert("RGB")` or
   `ImageOps.exif_transpose` costs an RGB photo that needs neither), the model's resize and crop, the preview
   (`images.preview_rgb`) and the preview as the pass made it before (an RGB copy, then `Image.thumbnail`)

The 12-MP photo is coffee.png resized (bicubic) to 4032 × 3024 and saved as JPEG (quality 90) to a temporary
file: the size of a phone camera's picture (decoding time depends little on what it shows). DeiT-Ti with
random weights (timing does not depend on them), the app's spill folder, candidates interleaved.

    python -m bench.bench_photo --before-tree DIR [--repeats 9] [--threads 2]

    git archive REV vit_inspect | tar -x -C /tmp/before_tree   # REV: the version to compare with
"""
from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

from PIL import Image

from vit_inspect.core.images import load_image, preview_rgb
from vit_inspect.core.load import load_model
from vit_inspect.passes.pipeline import PREVIEW_SIDE, analyze_image
from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder

from .bench_analysis import other_analysis
from .bench_rollout_redraw import load_package
from .common import REPO, THREADS, markdown_table, measure, print_header, set_threads

MODEL = "deit_tiny_patch16_224"
PHOTO_SIZE = (4032, 3024)  # (width, height): 12 MP, a phone camera's picture


def old_preview(picture: Image.Image):
    """The preview as the pass made it before `images.preview_rgb`: a full-size RGB copy, then `thumbnail`."""
    thumb = picture.convert("RGB")
    thumb.thumbnail((PREVIEW_SIDE, PREVIEW_SIDE), Image.Resampling.BILINEAR)
    return thumb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-tree", type=Path, required=True, help="a folder holding another version's vit_inspect")
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats per candidate (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch intra-op threads")
    args = parser.parse_args()
    set_threads(args.threads)
    other = load_package(args.before_tree.resolve())
    import vit_inspect

    with tempfile.TemporaryDirectory() as folder:
        photo = Path(folder) / "photo.jpg"
        big = Image.open(REPO / "assets" / "coffee.png").convert("RGB").resize(PHOTO_SIZE, Image.Resampling.BICUBIC)
        big.save(photo, format="JPEG", quality=90)
        small = REPO / "assets" / "chelsea.png"
        data = photo.read_bytes()
        picture = load_image(photo)
        handle = load_model(MODEL, pretrained=False, device="cpu")
        print_header("A phone photo's pass")
        print(f"{MODEL}, random weights; the photo: {PHOTO_SIZE[0]}×{PHOTO_SIZE[1]} JPEG of {len(data) / 1e6:.2f} MB; "
              f"the small one: assets/chelsea.png ({Image.open(small).size[0]}×{Image.open(small).size[1]}). "
              f"Median of {args.repeats} repeats after 1 warm-up, candidates interleaved.\n")
        spill = SpillFolder(DEFAULT_SPILL_BUDGET)
        times = measure({
            "ours, photo": other_analysis(vit_inspect, MODEL, photo),
            "before, photo": other_analysis(other, MODEL, photo),
            "before, small": other_analysis(other, MODEL, small),  # the other way round: neither always follows the photo
            "ours, small": other_analysis(vit_inspect, MODEL, small),
            "decoding the photo alone": lambda: Image.open(io.BytesIO(data)).load(),
            "one full-size copy of the decoded photo": picture.copy,
            "the model's resize and crop (Preprocess.apply)": lambda: handle.preprocess.apply(picture),
            "the preview (images.preview_rgb)": lambda: preview_rgb(picture, PREVIEW_SIDE),
            "the preview as before (RGB copy + thumbnail)": lambda: old_preview(picture),
            "the pass given the decoded photo (no decoding)": lambda: analyze_image(handle, picture, relevance=False,
                                                                                    spill=spill),
        }, args.repeats)
    print(markdown_table(("candidate", "median ms (min–max)"), [(k, t.ms()) for k, t in times.items()]))
    print()
    rows = [(f"7. the app's pass over an uploaded {kind}, ours ÷ before",
             f"{1e3 * times[f'ours, {kind}'].median:.1f} ms", f"{1e3 * times[f'before, {kind}'].median:.1f} ms",
             f"**{times[f'ours, {kind}'].median / times[f'before, {kind}'].median:.2f}**")
            for kind in ("photo", "small")]
    rows.append(("7a. the preview of the photo, ours ÷ before",
                 f"{1e3 * times['the preview (images.preview_rgb)'].median:.1f} ms",
                 f"{1e3 * times['the preview as before (RGB copy + thumbnail)'].median:.1f} ms",
                 f"{times['the preview (images.preview_rgb)'].median / times['the preview as before (RGB copy + thumbnail)'].median:.2f}"))
    print(markdown_table(("measure", "ours", "before", "ratio"), rows))


if __name__ == "__main__":
    main()
