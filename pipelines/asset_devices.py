"""Where each asset of a profile ran: the newest materialization's device, GPU, Ray resources, node
and wall time, from the Dagster instance under K3_HOME (issue 42 item 5: "every asset's device
recorded in its metadata, wall time per asset").

    K3_HOME=/tmp/k3 python -m pipelines.asset_devices --profile small --out devices.json

Prints one line per materialized asset (partitions each on their own line) and writes the same as
JSON. Reads only; run it after `k3 run`.
"""

from __future__ import annotations

import argparse
import json

FIELDS = ("device", "gpu", "ray_resources", "node")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = ap.parse_args()

    from pipelines.instance import apply_k3_environ
    apply_k3_environ()
    import dagster as dg

    from assets.profiles import build_profile

    instance = dg.DagsterInstance.get()
    rows = []
    for asset in build_profile(args.profile).assets:
        for key in asset.keys:
            records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=50).records
            seen = set()
            for rec in records:  # newest first: keep the newest of each partition
                part = rec.partition_key
                if part in seen:
                    continue
                seen.add(part)
                mat = rec.event_log_entry.asset_materialization
                meta = {k: v.value for k, v in mat.metadata.items()}
                stats = instance.get_run_step_stats(rec.run_id)
                step = [s for s in stats if s.start_time and s.end_time and key.path[-1] in s.step_key]
                row = {"asset": key.to_user_string(), "partition": part, "run_id": rec.run_id,
                       **{f: meta.get(f) for f in FIELDS},
                       "step_wall_s": round(step[0].end_time - step[0].start_time, 1) if step else None}
                rows.append(row)
                print(f"{row['asset']:<28} {part or '':<20} {str(row['device']):<8} {str(row['gpu'])[:30]:<30} "
                      f"{json.dumps(row['ray_resources'])[:40]:<40} {row['step_wall_s']} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
