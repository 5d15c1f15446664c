#!/usr/bin/env bash
# Packs the orchestration layer's Python packages (Ray, Dagster, MLflow and those of their needs that
# the H200 image lacks, ../.library/device/KINDS.md) into one xz tar for a device call: the H200 has
# no package index, and Ray's wheel alone (79 MB) is over one call's 64 MiB. Run here, in the
# repository root; the call unpacks it (`bash benchmarks/h200_calls.sh orch`).
#     bash benchmarks/pack_site.sh DIR      # writes DIR/site.tar.xz (~44 MB; 2026-12-01)
set -euo pipefail
dest=${1:?a folder inside the checkout that .git/info/exclude ignores, e.g. .gpu-orch}
work=$(mktemp -d)
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d "$work/wheels" \
    "dagster==1.13.27" "ray==2.60.0" "mlflow==3.17.2" "pyarrow<26"
# Leave out what the image has (its package list in KINDS.md), so its own builds stay in charge.
python3 - "$work/wheels" > "$work/need.txt" <<'PY'
import os, re, sys
kinds = open(os.path.join(os.path.dirname(os.path.abspath("Makefile")), "..", ".library", "device", "KINDS.md")).read()
have = {re.sub(r"[-_.]+", "-", p.strip().lower()) for p in re.search(r"Packages: (.*?)\.\n", kinds, re.S).group(1).split(",")}
for f in sorted(os.listdir(sys.argv[1])):
    if re.sub(r"[-_.]+", "-", f.split("-")[0].lower()) not in have:
        print(os.path.join(sys.argv[1], f))
PY
python3 -m pip install -q --no-deps --no-compile --target "$work/site" --python-version 3.12 --implementation cp \
    --only-binary=:all: $platforms $(cat "$work/need.txt")
# What `k3 run` never imports: Ray's Java jars and libraries, MLflow's web UI, test folders.
rm -rf "$work/site/ray/"{jars,rllib,llm,serve,tune,train} "$work/site/mlflow/server/js"
find "$work/site" -name tests -type d -prune -exec rm -rf {} +
strip --strip-unneeded "$work/site/ray/_raylet.so" "$work/site/ray/core/src/ray/"*/* 2>/dev/null || true
mkdir -p "$dest"
tar -C "$work/site" -cf - . | xz -T2 -6 > "$dest/site.tar.xz"
rm -rf "$work"
ls -l "$dest/site.tar.xz"
