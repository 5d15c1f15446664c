"""Jobs: the data group, the pretraining group, the nightly re-evaluation and everything."""

import dagster as dg

data_job = dg.define_asset_job(
    "data_job", selection=dg.AssetSelection.groups("data"),
    description="Corpus, tokenizer, scattered-clue data and images for the run's profile.")

pretrain_job = dg.define_asset_job(
    "pretrain_job", selection=dg.AssetSelection.groups("pretraining"),
    description="The four context stages and the base model (the data must exist for the profile).")

eval_job = dg.define_asset_job(
    "eval_job", selection=dg.AssetSelection.assets("checkpoint_evals"),
    description="Re-score the newest checkpoint of every stage on the full evaluation set.")

all_job = dg.define_asset_job(
    "all_job", selection=dg.AssetSelection.all(),
    description="Every asset of the pipeline, in lineage order.")

JOBS = [data_job, pretrain_job, eval_job, all_job]
