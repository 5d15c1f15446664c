"""`python -m datagen --profile tiny --out DIR [--seed S]`: build every data artifact, print the manifest."""

from __future__ import annotations

import argparse
import json

from datagen.build import build_all
from datagen.profiles import PROFILES, presets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m datagen", description=__doc__)
    parser.add_argument("--profile", default="tiny", choices=PROFILES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    manifest = build_all(presets(args.profile, args.seed), args.out)
    print(json.dumps(manifest["files"], indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
