"""The one validation every asset config goes through, before any work starts.

Every `dg.Config` of an asset subclasses `AssetConfig`. Its validator runs whenever the config is
built — by `k3 run` on the `--set` values before the run starts (`pipelines/cli.py`), and by
Dagster at the start of the step (a launch from the UI) — and refuses, naming field and value:

    every float field      finite (pydantic's `gt=0` lets `inf` through; `1e999` parses to inf)
    every `lr`, `*_lr`     0 < lr ≤ LR_MAX

Sizes that grow memory get an upper bound derived from the machine (`k3model.limits`), which needs
the profile: `config.check_fits(profile)` — called by `k3 run` before the run and by each
materialization before its first work — raises a ValueError with the numbers:

    rl_specialist    group_size · groups_per_step episodes of the first draw held until the update
    mopd_student     episodes_per_step · samples_per_task episodes held until the update
    rl_tasks         samples · tasks_per_family · |families| ladder episodes held until scored
    sft_policy       batch_size rows of ≥ SFT_ROW_FLOOR_TOKENS: the logits floor of `limits.step_floor_bytes`

A profile's own values are trusted (each was sized for the machine it runs on); only a value that
differs from the profile's (`overridden`) is checked.

The profile's values, shown and used. A field whose value comes from the profile's recipe
(`k3model.train.recipes`, the stage rows of `k3model.config`) takes it from one classmethod,
`profile_values(profile)`, which both sides read:

    the launchpad     `Config.for_profile(profile)`: a subclass whose defaults are those values, the
                      annotation of the asset's config argument, so the Dagster UI's launchpad opens
                      on them and a run that sets nothing runs with them
    the asset body    `config.filled(profile)`: a field set to null (`--set steps=null`, the base
                      class, whose default stays None) takes the profile's value
"""

from __future__ import annotations

import functools
import math
from typing import Any, Self

import dagster as dg
from pydantic import Field, model_validator
from pydantic.fields import FieldInfo

# AdamW moves each weight by about lr per step: above 1 a single step moves every weight of these
# models (initialised at std ≤ 0.02) fifty times its scale, and the run diverges.
LR_MAX = 1.0

# The shortest SFT row is a rendered envs prompt plus its answer: 642 tokens on the smoke tokenizer
# (echo_word, hermes; limits.EPISODE_FLOOR_BYTES), fewer on a larger vocabulary's.
SFT_ROW_FLOOR_TOKENS = 256


class AssetConfig(dg.Config):
    """Base of every asset's config: finite floats and learning rates in range (module docstring)."""

    @model_validator(mode="after")
    def _finite_and_in_range(self):
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
            if (name == "lr" or name.endswith("_lr")) and value is not None and not 0 < value <= LR_MAX:
                raise ValueError(f"{name} must lie in (0, {LR_MAX}] (above it one AdamW step moves every "
                                 f"weight past its scale and the run diverges), got {value}")
        return self

    def check_fits(self, profile: str) -> None:
        """ValueError with the numbers when a size of this config cannot fit the machine (module
        docstring); configs with no size that grows memory have nothing to check."""

    @classmethod
    def profile_values(cls, profile: str, **where: Any) -> dict[str, Any]:
        """field → the value `profile` runs with when the config leaves the field alone, read off the
        profile's recipe; `where` narrows the asset (a pretraining stage). Fields not named here have
        one default for every profile."""
        return {}

    @classmethod
    def for_profile(cls, profile: str, **where: Any) -> type[Self]:
        """This config with `profile_values(profile, **where)` as its defaults (module docstring)."""
        return _with_defaults(cls, profile, tuple(sorted(where.items())))

    def filled(self, profile: str, **where: Any) -> Self:
        """This config with each field left None set to the profile's value."""
        fill = {k: v for k, v in self.profile_values(profile, **where).items()
                if getattr(self, k) is None and v is not None}
        return type(self)(**{**self.model_dump(), **fill}) if fill else self

    def overridden(self, name: str, profile: str, **where: Any) -> bool:
        """Whether field `name` is set to something other than the profile's value."""
        value = getattr(self, name)
        return value is not None and value != self.profile_values(profile, **where).get(name)


class ScaledEpisodes(AssetConfig):
    """A config of an asset that plays episodes (evaluation, the ladder, RL, MOPD): `budget_scale`
    shortens every episode budget and turn cap (`k3model.train.effort.scaled_budgets`), for a quick
    check of a profile's lineage on a new host; the assets record it in their metadata, and
    mopd_student refuses teachers evaluated at another scale."""
    budget_scale: float = Field(default=1.0, gt=0, le=1, description="episode budgets and turn caps × this "
                                "(1: the profile's; e.g. 0.125 for a quick run — its figures are not "
                                "comparable with a full run's)")


@functools.cache
def _with_defaults(cls: type[AssetConfig], profile: str, where: tuple[tuple[str, Any], ...]) -> type[AssetConfig]:
    # Cached: Dagster builds each asset's schema once, and the class is the same for a profile.
    values = cls.profile_values(profile, **dict(where))
    fields = {name: FieldInfo.merge_field_infos(cls.model_fields[name], default=value) for name, value in values.items()}
    namespace = {"__module__": cls.__module__, "__doc__": cls.__doc__,
                 "__annotations__": {name: cls.model_fields[name].annotation for name in fields}, **fields}
    suffix = "".join(f"_{v}" for _, v in where)
    return type(cls)(f"{cls.__name__}_{profile}{suffix}", (cls,), namespace)


def refuse_unfit(context: dg.AssetExecutionContext, config: AssetConfig, profile: str, asset: str) -> None:
    """At a materialization's start: a dg.Failure (no retries) naming the field when
    `config.check_fits(profile)` refuses, before any work."""
    try:
        config.check_fits(profile)
    except ValueError as e:
        raise dg.Failure(description=f"invalid config for {profile}/{asset}: {e}", allow_retries=False) from e


def describe_invalid(name: str, err: Exception) -> str:
    """One line per problem of a pydantic ValidationError (or a ValueError) on asset `name`'s config:
    `name.field: what is wrong (got value)`."""
    from pydantic import ValidationError
    if not isinstance(err, ValidationError):
        return f"{name}: {err}"
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()))
        msg = e["msg"].removeprefix("Value error, ")
        # The model validator's messages start with the field's name: "lr must be a finite number, …".
        lines.append(f"{name}.{loc}: {msg} (got {e['input']!r})" if loc else f"{name}.{msg}")
    return "; ".join(lines)
