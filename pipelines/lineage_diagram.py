"""The lineage of one profile as a Mermaid flowchart, drawn from the Definitions' asset graph (the
picture in README.md). One box per asset, grouped as in the UI; a partitioned asset says how many
partitions it has. An edge that another path already implies (corpus → pretrain_stage_2, through
pretrain_stage_1) is left out, so the picture shows the order rather than every dependency.

    python -m pipelines.lineage_diagram [--profile tiny]
"""

import argparse

from pipelines.resources import default_profile


def mermaid(profile: str) -> str:
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    mine = [k for k in graph.toposorted_asset_keys if k.path[0] == profile and graph.get(k).is_materializable]
    groups: dict[str, list] = {}
    for k in mine:
        groups.setdefault(graph.get(k).group_name, []).append(k)
    lines = ["flowchart LR"]
    for name, keys in groups.items():
        lines.append(f"  subgraph {name}")
        for k in keys:
            node = graph.get(k)
            parts = node.partitions_def
            label = k.path[-1] + (f" ×{len(parts.get_partition_keys())}" if parts is not None else "")
            lines.append(f"    {k.path[-1]}[{label}]")
        lines.append("  end")
    ancestors: dict = {}

    def above(k) -> set:
        if k not in ancestors:
            ancestors[k] = set()
            for p in graph.get(k).parent_keys:
                ancestors[k] |= {p} | above(p)
        return ancestors[k]
    for k in mine:
        parents = [p for p in graph.get(k).parent_keys if p in mine]
        # Transitive reduction: drop a parent that another parent already descends from.
        for parent in sorted(parents, key=lambda p: p.to_user_string()):
            if not any(parent in above(q) for q in parents if q != parent):
                lines.append(f"  {parent.path[-1]} --> {k.path[-1]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=default_profile())
    print(mermaid(parser.parse_args().profile))


if __name__ == "__main__":
    main()
