"""Dagster assets: thin adapters that read config, call the library, log and return metadata.

`data` (tokenizer, corpus, clue_data, image_data), `pretrain` (pretrain_stage_1 … 4, base_model)
and `evaluation` (checkpoint_evals, re-scored nightly), each built once per profile by
`assets.profiles` under the profile's key prefix (`smoke/corpus`). Resources are reached by key
(`context.resources.<key>`); their classes live in `pipelines.resources`.
"""
